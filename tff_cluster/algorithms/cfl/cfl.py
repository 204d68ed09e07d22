"""CFL (Sattler et al., "Clustered Federated Learning", 2020): a tree of clusters
grown by bipartitions of clusters whose members' updates disagree.

State: cluster models in K = `--num_groups` slots (the most clusters the tree
may reach; a TFF state has a fixed size); every client starts in slot 0.

Round t, on the sampled clients (the reference code: all of them):
  1. each client trains its cluster's model (the local work) and keeps the
     trained model; its update dW_i = trained - start (trainable weights);
  2. host, per cluster c with sampled members (the reference code's rule):
       mean_norm = ||mean_{i in c} dW_i||   (the norm of the mean update;
                   unweighted as the authors' code, `--cfl_weighting=uniform`,
                   or weighted by the clients' data, `data`)
       max_norm  = max_{i in c} ||dW_i||
     c splits in two when t > `--cfl_warmup_rounds` (20), mean_norm <
     `--cfl_eps1` (0.4), max_norm > `--cfl_eps2` (1.6) and |c| > 2: complete
     linkage on the members' pairwise cosine similarities of dW, two clusters
     (`clustering.cfl_bipartition`). Members keep their *global* indices (a
     public implementation stores the positions inside the sub-matrix, a
     known bug). One child keeps the slot, the other takes the lowest free
     slot; with no free slot the split is refused (counted in `cfl_refused`).
     At most one split per cluster per round; the tree grows over rounds;
  3. aggregation (`aggregate` mode): each cluster's model becomes the mean of
     its members' trained models, i.e. start + mean dW (uniform or data
     weights as above); a cluster without sampled members keeps its model.

Not implemented: the paper's acceptance check of a split (its gamma_max bound
on the cross-cluster similarity), which the authors' code does not run either;
its exact form could not be checked against the paper here, so it is left out
rather than guessed.

The reference setting (the authors' notebook): all clients every round, 1 local
epoch of SGD (lr 0.1, momentum 0.9, the optimizer kept by each client, lr x 0.99
per local call), batch 128; those are local-solver flags (`--local_epochs`,
`--client_momentum`, `--client_state=persist`, `--lr_decay`).
Evaluation: each client is tested with its cluster's model.
"""

from __future__ import annotations

import dataclasses
from typing import Dict

import numpy as np

from tff_cluster import clustering
from tff_cluster.host import driver
from tff_cluster.algorithms.wecfl import wecfl

MIN_SPLIT_SIZE = 3  # |c| > 2


@dataclasses.dataclass
class CFLHost(wecfl.ClusterModelsHost):
  """CFL's host state: the clusters', and how many splits were made and how
  many refused for want of a free slot."""
  splits: int = 0
  refused: int = 0


class CFLDriver(wecfl.ClusterModelsDriver):
  """CFL's host side: the cluster tree over the slots (see the module docstring)."""

  individual_updates = (
      "its host splits clusters by the cosine similarities of the clients' individual updates")

  host: CFLHost
  min_round_clients = 1

  def __init__(self, context: driver.Context, definition: wecfl.ClusterModelsDefinition):
    """`definition`: `wecfl.fixed_clusters_definition`'s (no proximal term)."""
    super().__init__(context, definition)
    options = self.options
    self.eps1, self.eps2 = float(options.cfl_eps1), float(options.cfl_eps2)
    self.warmup = int(options.cfl_warmup_rounds)
    self.weighting = options.cfl_weighting
    self._norms: Dict[str, float] = {}
    self.host.summary.update(cfl_eps1=self.eps1, cfl_eps2=self.eps2,
                         cfl_warmup_rounds=self.warmup, cfl_weighting=self.weighting)
    self.extra_columns = [*self.extra_columns, "num_clusters", "cfl_splits", "cfl_refused",
                          "cfl_max_mean_norm", "cfl_max_update_norm"]

  def make_host(self, assignment):
    return CFLHost(assignment=assignment, summary={})

  def aggregation_weights(self):
    if self.weighting == "data":
      return self.data_weight
    return np.ones(self.data.num_clients)

  def choose(self, round_num, sampled, trained, models):
    n = self.definition.num_trainable
    host = self.host
    current = host.assignment[sampled]
    updates = np.stack([
        clustering.flatten_weights(list(w)[:n])
        - clustering.flatten_weights(list(models[int(c)])[:n])
        for w, c in zip(trained, current)])
    weights = self.data_weight[sampled] if self.weighting == "data" else None
    new = current.copy()
    occupied = set(int(c) for c in host.assignment if c >= 0)
    max_mean = 0.0
    for c in sorted(set(int(c) for c in current)):
      pos = np.flatnonzero(current == c)
      w = None if weights is None else weights[pos]
      ww = np.ones(len(pos)) if w is None else w
      max_mean = max(max_mean, float(np.linalg.norm(
          (ww[:, None] * updates[pos]).sum(0) / ww.sum())))
      if round_num <= self.warmup or not clustering.cfl_should_split(
          updates[pos], self.eps1, self.eps2, w, MIN_SPLIT_SIZE):
        continue
      free = [s for s in range(self.k) if s not in occupied]
      if not free:
        host.refused += 1
        continue
      # cfl_step maps the bipartition back to global indices (here: positions
      # into this round's sampled clients).
      _, second = clustering.cfl_step([pos.tolist()], updates, self.eps1, self.eps2,
                                      weights, MIN_SPLIT_SIZE)
      new[np.asarray(second, np.int64)] = free[0]
      occupied.add(free[0])
      host.splits += 1
    self._norms = {"cfl_max_mean_norm": max_mean,
                   "cfl_max_update_norm": float(np.max(np.linalg.norm(updates, axis=1)))}
    return new

  def round_extras(self):
    assignment = self.host.assignment
    return {"num_clusters": int(len(np.unique(assignment[assignment >= 0]))),
            "cfl_splits": self.host.splits,
            "cfl_refused": self.host.refused, **self._norms}

