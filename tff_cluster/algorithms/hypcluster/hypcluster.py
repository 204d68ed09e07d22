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
    server SGD at rate 1.0 is FedAvg's mean; or `--server_optimizer=adam|
    yogi|adagrad`, FedOpt's steps with `--server_beta1`, `--server_beta2`,
    `--server_tau`); a cluster no client chose keeps its model and its
    optimizer state;
  * start (`--hypcluster_init`): kmeans_loss (FedJAX's `kmeans_init`, the
    default here: IFCA's `--ifca_init=kmeans_loss`) or random;
  * evaluation (`--hypcluster_eval`): train_loss (FedJAX's evaluator: each
    client's cluster chosen on its training split at evaluation, scored on
    its test split) or assigned.
The paper's own algorithm section and settings could not be read; the rule
is FedJAX's.
"""

from __future__ import annotations

import dataclasses

from tff_cluster.host import driver
from tff_cluster.algorithms.fedavg import fedavg
from tff_cluster.algorithms.ifca import ifca
from tff_cluster.learning import optimizers
from tff_cluster.algorithms.ifca import IFCA_OPTIONS
from tff_cluster.spec.options import Options


def ifca_options(options: Options) -> Options:
  """HypCluster's options as IFCA's (what IFCA's host side reads)."""
  return Options(IFCA_OPTIONS, dict(
      num_groups=options.num_groups, ifca_init=options.hypcluster_init,
      ifca_init_clients=options.ifca_init_clients, ifca_agg="samples",
      ifca_loss_batches=options.ifca_loss_batches, ifca_eval=options.hypcluster_eval),
      algo=options.algo)


def server_optimizer(options: Options) -> optimizers.Chain:
  """Each cluster's server optimizer: heavy ball at (`--server_lr`,
  `--hypcluster_server_momentum`) or SGD at `--server_lr` under
  `--server_optimizer=sgd`; FedOpt's adam, yogi, adagrad otherwise (a
  momentum given with one of those is refused: theirs is --server_beta1)."""
  beta = float(options.hypcluster_server_momentum)
  kind = options.get("server_optimizer", "sgd")
  if kind != "sgd":
    if beta:
      raise ValueError(f"invalid --hypcluster_server_momentum={beta:g} with "
                       f"--server_optimizer={kind}; valid: 0 (its momentum is --server_beta1)")
    return fedavg.server_optimizer(options)
  if beta:
    return optimizers.server_heavy_ball(options.server_lr, beta)
  return optimizers.server_sgd(options.server_lr)


def definition(context: driver.Context) -> ifca.IFCADefinition:
  """IFCA's definition with training-sample weights and a server optimizer
  per cluster."""
  options = context.options
  return ifca.IFCADefinition(context.weights_spec, context.num_trainable, options.num_groups,
                             aggregation="samples", loss_batches=options.ifca_loss_batches,
                             server_optimizer=server_optimizer(options), solver=context.solver)


class HypClusterDriver(ifca.IFCADriver):
  """IFCA's host side (with HypCluster's options as IFCA's) over HypCluster's
  definition (its server optimizers)."""

  def __init__(self, context: driver.Context, definition: ifca.IFCADefinition):
    options = context.options
    super().__init__(dataclasses.replace(context, options=ifca_options(options)), definition)
    self.host.summary.update(server_lr=options.server_lr,
                             hypcluster_server_momentum=options.hypcluster_server_momentum,
                             server_optimizer=options.server_optimizer)
