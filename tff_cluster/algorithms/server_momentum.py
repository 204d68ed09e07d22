"""Server-momentum baselines: FedAvgM, FedMom and SlowMo.

Every client runs FedAvg's local work from the global model w_t (plain local
SGD, or with `--client_momentum`, whose buffer `--client_state` keeps or
resets); the server forms the weighted mean of the clients' models
w_bar = w_t + sum_k n_k Delta_k / sum_k n_k (weights as FedAvg's,
`--client_weighting`) and the pseudo-gradient d_t = w_t - w_bar. Then, with
eta_s = `--server_lr` and beta = `--server_momentum`:

FedAvgM (Hsu et al., 2019), heavy-ball server momentum:
    m <- beta m + d_t;  w_{t+1} = w_t - eta_s m          (m_0 = 0)
  TFF's `build_weighted_fed_avg` with `build_sgdm(eta_s, momentum=beta)`.
FedMom (Huo et al., 2020), Nesterov server momentum:
    v_{t+1} = w_t - eta_s d_t;  w_{t+1} = v_{t+1} + beta (v_{t+1} - v_t)   (v_0 = w_0)
  The rule is the one the project's spec gives from memory; the paper could
  not be consulted here. eta_s = 1, beta = 0 is FedAvg (tested).
SlowMo (Wang et al., ICLR 2020):
    u <- beta u + d_t / gamma_t;  w_{t+1} = w_t - eta_s gamma_t u   (u_0 = 0)
  gamma_t the round's client learning rate (the base optimizer's), eta_s the
  slow learning rate alpha. The paper averages the workers exactly (equal
  weights): use `--client_weighting=samples` on equal-size clients, or
  equal local work, for that. Local momentum buffers follow
  `--client_state` (kept or reset; not averaged).
The momentum acts on the trainable weights; BatchNorm statistics take the
plain weighted mean. The defaults (eta_s = 1, beta = 0.9) are ours: the pFedMo
paper, which compares with these methods, gives none of their settings.
"""

from __future__ import annotations

from tff_cluster.host import driver
from tff_cluster.algorithms import fedavg
from tff_cluster.algorithms.fedavg import FedAvgDriver
from tff_cluster.learning import optimizers
from tff_cluster.spec.options import SERVER_MOMENTUM_HPARAMS, Options, options_of

# Each algorithm's server optimizer, from (eta_s, beta). The server state's
# `buffer` is the optimizer's state: FedAvgM's m, FedMom's v, SlowMo's u.
SERVER_OPTIMIZERS = {
    "fedavgm": optimizers.server_heavy_ball,
    "fedmom": optimizers.server_nesterov,
    "slowmo": optimizers.server_slowmo,
}


class ServerMomentumDriver(FedAvgDriver):
  """FedAvg's host side over FedAvg's definition with a momentum server optimizer."""

  def __init__(self, task, data, config: driver.TrainingConfig, kind: str, options: Options):
    driver.Driver.__init__(self, task, data, config, lambda specs, num_trainable, **solver:
                           make_definition(kind)(specs, num_trainable, options, **solver))
    self.state = None


def make_definition(kind: str):
  """`make_definition(weights_spec, num_trainable, options, **solver)` of
  `kind` (fedavgm, fedmom or slowmo): FedAvg's definition (no proximal term)
  with that server optimizer."""
  def make(weights_spec, num_trainable: int, options: Options, **solver):
    server = SERVER_OPTIMIZERS[kind](options.server_lr, options.server_momentum)
    return fedavg.FedAvgDefinition(weights_spec, num_trainable, mu=0.0,
                                   weighting=options.client_weighting,
                                   server_optimizer=server, **solver)
  return make


def driver_factory(kind: str):
  """`make_driver(task, data, config, options=None, **values)` of `kind`."""
  def make_driver(task, data, config: driver.TrainingConfig, options=None, **values):
    return ServerMomentumDriver(task, data, config, kind,
                                options_of(SERVER_MOMENTUM_HPARAMS, options, **values))
  return make_driver
