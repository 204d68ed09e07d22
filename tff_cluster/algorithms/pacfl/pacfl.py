"""PACFL (Vahidian et al., "Efficient Distribution Similarity Identification
in Clustered Federated Learning via Principal Angles Between Client Data
Subspaces", AAAI 2023), as the authors' code runs it (MMorafah/PACFL at
7ef000d: `main_pacfl.py`, `src/clustering/hierarchical_clustering.py`).

One-shot clustering before round 1, on the clients' data (computed where
the data lives: `Runner.client_summaries`):
  * each client with training data, for each label c it holds: X_c = its
    training inputs of label c as columns (flattened, as the task gives them:
    the code takes MNIST's raw 0..255 pixels, our tasks [0, 1] or
    standardised ones; a positive scale leaves the singular vectors as they
    are), U_c = the first p left singular vectors (`--pacfl_basis`; fewer
    when the label has fewer examples); its signature U = [U_c1, U_c2, ...];
  * proximity A_ij in degrees (`--pacfl_proximity`): code = min over the
    entries of arccos(clip(U_i^T U_j, -1, 1)) (the smallest angle between two
    basis vectors, signs included, no absolute value), or principal = the
    smallest principal angle between the spans, arccos of the largest
    singular value of Q_i^T Q_j (Q: orthonormal bases of the U's);
  * the code's agglomerative loop (`clustering.merge_below`): merge the
    closest pair while its proximity is <= beta (`--pacfl_beta`), the merged
    row the mean (`--pacfl_linkage=average`), max or min of the two; at most
    `--num_groups` clusters (merging goes on past beta to reach it, with a
    warning).
Training: FedAvg within each cluster (the round's uniformly sampled clients
train their cluster's model; each cluster averages its members' models
weighted by training samples; a cluster without members keeps its model);
every cluster starts at the same initial model; no re-clustering. The code's
local solver (SGD, momentum 0.5 restarted every round) is
`--client_momentum=0.5 --client_state=reset`.
Evaluation: each client with its cluster's model (the code reports each
client's own model after its last local training: not done here).
Not implemented: the code's basis budget for Dirichlet partitions (20
vectors shared out by label share); p per label is its `#label` path.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np

from tff_cluster import clustering
from tff_cluster.host import driver
from tff_cluster.algorithms.wecfl import wecfl


def signature(x, y, basis: int) -> np.ndarray:
  """A client's data subspaces: per label (ascending), the first `basis` left
  singular vectors of its inputs of that label as columns [D, n_c],
  side by side: [D, sum of the kept vectors]."""
  x = np.asarray(x, np.float64).reshape(len(x), -1)
  y = np.asarray(y).reshape(-1)
  blocks = []
  for c in np.unique(y):
    u = np.linalg.svd(x[y == c].T, full_matrices=False)[0]
    blocks.append(u[:, :basis])
  return np.concatenate(blocks, axis=1)


def proximity(signatures, form: str) -> np.ndarray:
  """[n, n] angles in degrees between the clients' signatures (see the module
  docstring). Both forms are symmetric, so the upper triangle is computed and
  mirrored; the code's form as one product of each client's signature with all
  later ones (max of the cosines = min of the angles, arccos decreasing)."""
  n = len(signatures)
  a = np.zeros((n, n))
  if form == "principal":
    signatures = [np.linalg.qr(u)[0] for u in signatures]
    for i in range(n):
      for j in range(i, n):
        m = signatures[i].T @ signatures[j]
        a[i, j] = np.degrees(np.arccos(min(np.linalg.svd(m, compute_uv=False)[0], 1.0)))
  else:
    widths = np.array([u.shape[1] for u in signatures])
    starts = np.concatenate([[0], np.cumsum(widths)[:-1]])
    stacked = np.concatenate(signatures, axis=1)
    for i in range(n):
      m = signatures[i].T @ stacked[:, starts[i]:]  # [w_i, columns of clients i..n-1]
      best = np.maximum.reduceat(m.max(axis=0), starts[i:] - starts[i])
      a[i, i:] = np.degrees(np.arccos(np.clip(best, -1.0, 1.0)))
  return a + np.triu(a, 1).T  # (a holds the upper triangle only)


class PACFLDriver(wecfl.FixedClustersDriver):
  """PACFL's host side (see the module docstring)."""

  individual_updates = (
      "its host clusters the clients by the principal angles between the subspaces each client sends of its data")
  label_per_example = "clusters clients by the subspaces of their data per class"

  def __init__(self, context: driver.Context, definition: wecfl.ClusterModelsDefinition):
    """`definition`: `wecfl.fixed_clusters_definition`'s."""
    super().__init__(context, definition)
    options = self.options
    self.host.summary.update({k: options[k] for k in (
        "pacfl_basis", "pacfl_beta", "pacfl_linkage", "pacfl_proximity")})

  def setup(self):
    out = super().setup()
    o = self.options
    clients = self.data.training_clients()
    signatures = self.runner.client_summaries(
        functools.partial(signature, basis=int(o.pacfl_basis)), clients)
    a = proximity(signatures, o.pacfl_proximity)
    labels, found = clustering.merge_below(a, float(o.pacfl_beta), o.pacfl_linkage, self.k)
    if found > self.k:
      warnings.warn(f"PACFL: --pacfl_beta={o.pacfl_beta:g} leaves {found} clusters, more "
                    f"than --num_groups={self.k}; merged on to {self.k}")
    self.host.assignment[clients] = labels
    self.host.summary.update(pacfl_clusters_at_beta=int(found),
                             pacfl_num_clusters=int(labels.max() + 1))
    return out
