"""The cluster maths every clustered algorithm shares, written once.

A clustered `Definition` keeps K models stacked per layer ([K, ...] arrays,
`stack_models`) and scores a client's data under each (`cluster_losses`).
Per-cluster means over the clients are `aggregators.ClusterMean`'s. Plain
TensorFlow: every runner runs these.
"""

from __future__ import annotations

from typing import List, Sequence

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


def unstack_models(stacked, k: int) -> List[list]:
  """One [K, ...] array per layer -> K models' weight lists (`stack_models`'
  inverse)."""
  return [[layer[j] for layer in stacked] for j in range(k)]


def row_shape(k, w: tf.Tensor) -> tf.Tensor:
  """The shape that broadcasts a [K] vector against a [K, ...] stack like `w`."""
  return tf.concat([tf.reshape(k, [1]), tf.ones([tf.rank(w) - 1], tf.int32)], 0)


def cluster_losses(trainer, models: Sequence[tf.Tensor], data, k: int,
                   batches: int = 0) -> tf.Tensor:
  """[K]: a client's mean loss under each cluster model (`trainer.loss` on
  its first `batches` batches of the round's schedule; 0 = all)."""
  means = []
  for j in range(k):
    loss_sum, count = trainer.loss([w[j] for w in models], data, batches)
    means.append(tf.math.divide_no_nan(loss_sum, count))
  return tf.stack(means)
