"""FL+HC (Briggs, Fan and Andras, "Federated learning with hierarchical
clustering of local updates to improve training on non-IID data", IJCNN
2020), reconstructed.

Only the paper's abstract and the first lines of its method could be read
(no code by the authors exists): FedAvg runs "a set number of communication
rounds", then the clients are separated "by the similarity of their local
updates to the global joint model" with agglomerative clustering ("which
begins with all samples belonging to their own singleton cluster"), and the
clusters are then "trained independently and in parallel on specialised
models". Everything else below is a named choice (docs/algorithms/flhc.md):

  rounds 1 .. n-1 (n = `--flhc_round`): FedAvg (every client in cluster 0;
    weights: training samples);
  round n: every client with training data trains from the global model
    w_n (the round's local work); Delta_i = w_i - w_n (trainable weights,
    flattened); agglomerative clustering of the Delta_i (`--flhc_metric`,
    `--flhc_linkage`), cut at distance `--flhc_threshold` or, unset, into
    `--num_groups` clusters (at most `--num_groups` either way: a threshold
    that leaves more is cut into `--num_groups`, with a warning); every
    cluster model starts at w_n (the round's training only clusters);
  rounds > n: FedAvg within each cluster: the round's sampled clients train
    their cluster's model and each cluster averages its members' models
    (training-sample weights); no re-clustering.
Evaluation: each client is tested with its cluster's model (test-only
clients: their lowest-test-loss model).
"""

from __future__ import annotations

import warnings

import numpy as np

from tff_cluster import clustering
from tff_cluster.host import driver
from tff_cluster.algorithms.wecfl import wecfl


class FLHCDriver(wecfl.FixedClustersDriver):
  """FL+HC's host side (see the module docstring)."""

  individual_updates = (
      "its host clusters the clients by the linkage of their individual updates")

  @classmethod
  def check(cls, context: driver.Context) -> None:
    super().check(context)
    metric, linkage = context.options.flhc_metric, context.options.flhc_linkage
    if linkage == "ward" and metric != "euclidean":
      raise ValueError(f"invalid --flhc_metric={metric} with --flhc_linkage=ward; "
                       "valid: --flhc_metric=euclidean, or another --flhc_linkage")

  def __init__(self, context: driver.Context, definition: wecfl.ClusterModelsDefinition):
    """`definition`: `wecfl.fixed_clusters_definition`'s."""
    super().__init__(context, definition)
    options = self.options
    self.n = int(options.flhc_round)
    self.threshold = options.flhc_threshold
    self.metric, self.linkage = options.flhc_metric, options.flhc_linkage
    self.host.summary.update(flhc_round=self.n, flhc_threshold=self.threshold,
                             flhc_metric=self.metric, flhc_linkage=self.linkage)

  def run_round(self, round_num, sampled):
    if round_num != self.n:
      return super().run_round(round_num, sampled)
    # The clustering round: every client with training data, from w_n.
    clients = self.data.training_clients()
    before = self._models()
    out = self.train_clients("train", self.state, clients, round_num,
                             keys=self.host.assignment[clients])
    trained = [list(new["model"]) for new in out.client_states]
    labels = self.cluster(trained, before[0])
    self.host.assignment[clients] = labels
    self.state = self.runner.put_state(self.definition.initial_state(before[0]))
    row = self.training_row(out.summed, len(clients))
    row["num_changed"] = int((labels != 0).sum())
    row.update(self.round_extras())
    return row

  def cluster(self, trained, start) -> np.ndarray:
    """The clients' clusters from their updates from `start`."""
    t = self.definition.num_trainable
    origin = clustering.flatten_weights(list(start)[:t])
    updates = np.stack([clustering.flatten_weights(w[:t]) - origin for w in trained])
    labels, found = clustering.agglomerative(updates, self.metric, self.linkage,
                                             self.threshold, self.k)
    if found is not None and found > self.k:
      warnings.warn(f"FL+HC: --flhc_threshold={self.threshold:g} leaves {found} clusters, "
                    f"more than --num_groups={self.k}; cut into {self.k}")
    self.host.summary.update(flhc_clusters_at_threshold=found,
                             flhc_num_clusters=int(labels.max() + 1))
    return labels
