"""The cluster maths every clustered algorithm shares, written once.

A clustered `Definition` keeps K models stacked per layer ([K, ...] arrays).
The aggregator is a plain federated sum, so a per-cluster weighted mean is a
one-hot scatter on the client (`scatter`: the client's value in its
cluster's row, zeros elsewhere) and a masked divide on the server
(`per_cluster_mean`). Plain TensorFlow: both runners run these.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np
import tensorflow as tf


def stack_models(initial_weights, k: int) -> List[np.ndarray]:
  """K models' weight lists -> one [K, ...] array per layer.

  `initial_weights` is K weight lists, or one model's list (then every cluster
  starts there).
  """
  if not isinstance(initial_weights[0], (list, tuple)):
    initial_weights = [initial_weights] * k
  if len(initial_weights) != k:
    raise ValueError(f"need {k} initial models, got {len(initial_weights)}")
  return [np.stack([np.asarray(m[layer]) for m in initial_weights])
          for layer in range(len(initial_weights[0]))]


def row_shape(k, w: tf.Tensor) -> tf.Tensor:
  """The shape that broadcasts a [K] vector against a [K, ...] stack like `w`."""
  return tf.concat([tf.reshape(k, [1]), tf.ones([tf.rank(w) - 1], tf.int32)], 0)


def scatter(onehot: tf.Tensor, t: tf.Tensor) -> tf.Tensor:
  """`t` placed in the row of `onehot` ([K]) of a [K, ...] stack, zeros elsewhere."""
  return tf.tensordot(onehot, t, axes=0)


def per_cluster_mean(sums: Sequence[tf.Tensor], divisor: tf.Tensor,
                     old: Sequence[tf.Tensor],
                     has: Optional[tf.Tensor] = None) -> List[tf.Tensor]:
  """Per layer: sums / divisor in the rows where `has` (default divisor > 0),
  `old` in the others (a cluster without members keeps its value).

  A zero divisor in a row that `has` divides by 1.
  """
  has = divisor > 0 if has is None else has
  safe = tf.where(divisor > 0, divisor, 1.0)
  k = tf.shape(divisor)[0]
  return [tf.where(tf.reshape(has, row_shape(k, o)), s / tf.reshape(safe, row_shape(k, o)), o)
          for s, o in zip(sums, old)]


def cluster_losses(trainer, models: Sequence[tf.Tensor], data, k: int,
                   batches: int = 0) -> tf.Tensor:
  """[K]: a client's mean loss under each cluster model (`trainer.loss` on
  its first `batches` batches of the round's schedule; 0 = all)."""
  means = []
  for j in range(k):
    loss_sum, count = trainer.loss([w[j] for w in models], data, batches)
    means.append(tf.math.divide_no_nan(loss_sum, count))
  return tf.stack(means)
