"""How the clients' outputs are combined, written once: `Sum`, `Mean`,
`ClusterSum` and `ClusterMean`.

The runners combine a round's `ClientOutput.summed` with one sum (TFF's
`federated_sum`; `Sum.add` in-process). A per-cluster weighted mean rides on
that sum as TFF's `kmeans_clustering` does it: each client contributes its
(weight x value, weight) in its cluster's row of [K, ...] stacks, zeros
elsewhere (`ClusterMean.client`); after the sum, `ClusterMean.mean` divides
each row by its summed weight, and a cluster without weight keeps its old
value. `ClusterSum` is the sum alone (a value per key, e.g. pFedMo's score
per worker). The key is the one the runner passes to `client_work` (or one
the client chose itself, as IFCA's estimate). Plain TensorFlow: every runner
runs these.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import tensorflow as tf

from tff_cluster.core import cluster_ops


class Sum:
  """The plain sum over the round's clients."""

  @staticmethod
  def add(total, value):
    """`total` + one client's `value`, leaf by leaf."""
    return tf.nest.map_structure(tf.add, total, value)


class Mean:
  """The weighted mean over the round's clients (one cluster): each client
  sends (weight x value, weight), summed; the server divides."""

  @staticmethod
  def mean(sums: Sequence[tf.Tensor], weight: tf.Tensor) -> List[tf.Tensor]:
    """sums / weight per tensor; zeros where no client had weight (`weight`
    0: the sums are zeros, divided by 1)."""
    safe = tf.where(weight > 0, weight, 1.0)
    return [s / safe for s in sums]


class ClusterSum:
  """A sum per cluster over K clusters (keys 0..K-1): each client's values in
  its key's row of [K, ...] stacks, zeros elsewhere."""

  def __init__(self, k: int):
    self.k = int(k)

  def client(self, key, values: Sequence[tf.Tensor]) -> List[tf.Tensor]:
    """One client's contribution: each of `values` in row `key` of a [K, ...]
    stack."""
    return _place(tf.one_hot(key, self.k, dtype=tf.float32), values)


class ClusterMean:
  """A weighted mean per cluster over K clusters (keys 0..K-1)."""

  def __init__(self, k: int):
    self.k = int(k)

  def client(self, key, values: Sequence[tf.Tensor], weight: Optional[tf.Tensor] = None
             ) -> Tuple[List[tf.Tensor], tf.Tensor]:
    """One client's contribution to the sum: (weight x value in row `key` of
    a [K, ...] stack per value, weight in row `key` of a [K] vector). Without
    `weight` the values go in as they are and the weight is 1."""
    onehot = tf.one_hot(key, self.k, dtype=tf.float32)
    if weight is None:
      return _place(onehot, values), onehot
    return _place(onehot, [weight * v for v in values]), onehot * weight

  @staticmethod
  def mean(sums: Sequence[tf.Tensor], weights: tf.Tensor, old: Sequence[tf.Tensor],
           has: Optional[tf.Tensor] = None) -> List[tf.Tensor]:
    """Per stack: sums / weights in the rows where `has` (default weights > 0),
    `old` in the others (a cluster without members keeps its value). A zero
    weight in a row that `has` divides by 1."""
    has = weights > 0 if has is None else has
    safe = tf.where(weights > 0, weights, 1.0)
    k = tf.shape(weights)[0]
    return [tf.where(tf.reshape(has, cluster_ops.row_shape(k, o)),
                     s / tf.reshape(safe, cluster_ops.row_shape(k, o)), o)
            for s, o in zip(sums, old)]


def _place(onehot: tf.Tensor, values: Sequence[tf.Tensor]) -> List[tf.Tensor]:
  """Each value in the row of `onehot` ([K]) of a [K, ...] stack, zeros elsewhere."""
  return [tf.tensordot(onehot, v, axes=0) for v in values]
