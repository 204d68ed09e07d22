"""HypCluster (Mansour, Mohri, Ro and Suresh, "Three Approaches for
Personalization with Applications to Federated Learning", 2020), as FedJAX's
reference runs it (google/fedjax, `fedjax/algorithms/hyp_cluster.py` at
c57ee19; a co-author of the paper is one of FedJAX's).

IFCA's round (`tff_cluster.algorithms.ifca`), with FedJAX's choices as options
of IFCA's module rather than a copy of it:
  * assignment: each sampled client takes the cluster of lowest mean loss on
    its training data (`--ifca_loss_batches`, 0 = every batch; ties to the
    lowest index);
  * update: it trains that cluster's model; per cluster, the clients'
    updates are averaged with weights n_i (their training samples:
    FedJAX's `len(dataset)`), and each cluster's own server optimizer takes
    the negative mean update as its gradient (`--server_lr`,
    `--hypcluster_server_momentum`; state per cluster; FedJAX's default
    server SGD at rate 1.0 is FedAvg's mean); a cluster no client chose keeps
    its model and its optimizer state;
  * start (`--hypcluster_init`): kmeans_loss (FedJAX's `kmeans_init`, the
    default here: IFCA's `--ifca_init=kmeans_loss`) or random;
  * evaluation (`--hypcluster_eval`): train_loss (FedJAX's evaluator: each
    client's cluster chosen on its training split at evaluation, scored on
    its test split) or assigned.
The paper's own algorithm section and settings could not be read; the rule
is FedJAX's.
"""

from __future__ import annotations

from tff_cluster.host import driver
from tff_cluster.algorithms import ifca
from tff_cluster.learning import optimizers
from tff_cluster.spec.options import HYPCLUSTER_HPARAMS, IFCA_HPARAMS, Options, options_of


def ifca_options(options: Options) -> Options:
  """HypCluster's options as IFCA's."""
  return options_of(IFCA_HPARAMS, None, num_groups=options.num_groups,
                    ifca_init=options.hypcluster_init,
                    ifca_init_clients=options.ifca_init_clients,
                    ifca_agg="samples", ifca_loss_batches=options.ifca_loss_batches,
                    ifca_eval=options.hypcluster_eval)


def server_optimizer(options: Options) -> optimizers.ServerOptimizer:
  beta = float(options.hypcluster_server_momentum)
  if beta:
    return optimizers.server_heavy_ball(options.server_lr, beta)
  return optimizers.server_sgd(options.server_lr)


def make_definition(weights_spec, num_trainable: int, options: Options,
                    **solver) -> ifca.IFCADefinition:
  return ifca.IFCADefinition(weights_spec, num_trainable, options.num_groups,
                             aggregation="samples", loss_batches=options.ifca_loss_batches,
                             server_optimizer=server_optimizer(options), **solver)


class HypClusterDriver(ifca.IFCADriver):
  """IFCA's host side with HypCluster's definition (its server optimizers)."""

  def __init__(self, task, data, config: driver.TrainingConfig, options: Options):
    self.hypcluster_options = options
    super().__init__(task, data, config, ifca_options(options))
    self.host.summary.update(server_lr=options.server_lr,
                             hypcluster_server_momentum=options.hypcluster_server_momentum)

  def make_definition(self, specs, num_trainable, **solver):
    return make_definition(specs, num_trainable, self.hypcluster_options, **solver)


def make_driver(task, data, config: driver.TrainingConfig, options=None, **values):
  return HypClusterDriver(task, data, config, options_of(HYPCLUSTER_HPARAMS, options, **values))
