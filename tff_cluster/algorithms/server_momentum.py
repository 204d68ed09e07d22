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

import collections

import numpy as np
import tensorflow as tf

from tff_cluster import driver
from tff_cluster.core.definition import ClientOutput
from tff_cluster.algorithms.fedavg import FedAvgDefinition, FedAvgDriver
from tff_cluster.options import SERVER_MOMENTUM_HPARAMS, Options, options_of

class ServerMomentumDefinition(FedAvgDefinition):
  """FedAvg's client work with a momentum server update (see the module docstring).

  State: `model` (every weight) and `buffer` (trainable weights: FedAvgM's m,
  FedMom's v, SlowMo's u)."""

  def __init__(self, weights_spec, num_trainable: int, kind: str, *, server_lr: float,
               server_momentum: float, weighting: str, **solver):
    """`kind`: fedavgm, fedmom or slowmo."""
    super().__init__(weights_spec, num_trainable, mu=0.0, weighting=weighting, **solver)
    self.kind = kind
    self.server_lr = float(server_lr)
    self.beta = float(server_momentum)

  def initial_state(self, initial_weights):
    model = [np.asarray(w) for w in initial_weights]
    trainable = model[:self.num_trainable]
    buffer = ([np.array(w, copy=True) for w in trainable] if self.kind == "fedmom"
              else [np.zeros_like(w) for w in trainable])
    return collections.OrderedDict(model=model, buffer=buffer)

  def client_work(self, trainer, selected, received, client_state, data, mode):
    out = super().client_work(trainer, selected, received, client_state, data, mode)
    summed = collections.OrderedDict(out.summed)
    # The round's learning rate reaches the server as a sum over the clients.
    summed["lr_sum"] = tf.cast(received["lr"], tf.float32)
    summed["num_clients"] = tf.constant(1.0)
    return ClientOutput(summed, out.result, out.state)

  def server_update(self, state, summed, mode):
    model = list(state["model"])
    n = self.num_trainable
    weight = summed["weight"]
    safe = tf.where(weight > 0, weight, 1.0)
    mean_delta = [s / safe for s in summed["update"]]
    d = [-x for x in mean_delta[:n]]  # pseudo-gradient w_t - w_bar
    eta, beta = self.server_lr, self.beta
    buffer = list(state["buffer"])
    if self.kind == "fedavgm":
      buffer = [beta * m + g for m, g in zip(buffer, d)]
      trainable = [w - eta * m for w, m in zip(model[:n], buffer)]
    elif self.kind == "fedmom":
      v_new = [w - eta * g for w, g in zip(model[:n], d)]
      trainable = [v + beta * (v - v_old) for v, v_old in zip(v_new, buffer)]
      buffer = v_new
    else:  # slowmo
      gamma = summed["lr_sum"] / tf.maximum(summed["num_clients"], 1.0)
      buffer = [beta * u + g / gamma for u, g in zip(buffer, d)]
      trainable = [w - eta * gamma * u for w, u in zip(model[:n], buffer)]
    has = weight > 0
    trainable = [tf.where(has, t, w) for t, w in zip(trainable, model[:n])]
    buffer = [tf.where(has, b, old) for b, old in zip(buffer, state["buffer"])]
    rest = [w + x for w, x in zip(model[n:], mean_delta[n:])]
    return collections.OrderedDict(model=trainable + rest, buffer=buffer)


class ServerMomentumDriver(FedAvgDriver):
  """FedAvg's host side over a server-momentum definition."""

  def __init__(self, task, data, config: driver.TrainingConfig, kind: str, options: Options):
    driver.Driver.__init__(self, task, data, config, lambda specs, num_trainable, **solver:
                           make_definition(kind)(specs, num_trainable, options, **solver))
    self.state = None


def make_definition(kind: str):
  """`make_definition(weights_spec, num_trainable, options, **solver)` of `kind`."""
  def make(weights_spec, num_trainable: int, options: Options, **solver):
    return ServerMomentumDefinition(weights_spec, num_trainable, kind,
                                    server_lr=options.server_lr,
                                    server_momentum=options.server_momentum,
                                    weighting=options.client_weighting, **solver)
  return make


def driver_factory(kind: str):
  def make_driver(task, data, config: driver.TrainingConfig, options=None, **values):
    return ServerMomentumDriver(task, data, config, kind,
                                options_of(SERVER_MOMENTUM_HPARAMS, options, **values))
  return make_driver
