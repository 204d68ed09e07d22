"""References the tests hold the library's rules to (no library code calls
them): FedGroup's newcomer assignment and inter-group step in numpy, the
flattening of stacked models and the count of trainable scalars they read,
and plain local SGD over a dataset."""

from __future__ import annotations

import collections
from typing import Sequence

import numpy as np
import tensorflow as tf

from tff_cluster import clustering
from tff_cluster.learning import optimizers
from tff_cluster.learning.trainers import DatasetTrainer


def flatten_stacked(stacked: Sequence[np.ndarray]) -> np.ndarray:
  """Per-layer arrays [n, ...] as one float64 matrix [n, d]: row i is
  `clustering.flatten_weights` of the i-th slice of every layer."""
  arrays = [np.asarray(w, dtype=np.float64) for w in stacked]
  n = arrays[0].shape[0]
  assert all(a.shape[0] == n for a in arrays), [a.shape for a in arrays]
  return np.concatenate([a.reshape(n, -1) for a in arrays], axis=1)


def assign_many(updates: np.ndarray, group_updates: np.ndarray) -> np.ndarray:
  """FedGroup's newcomer assignment row by row: g*_i = argmin_j
  (1 - cos(Delta w_j, Delta w_i)) / 2 (Delta w_j: group j's update direction);
  ties go to the lowest group index, so a zero update joins group 0."""
  updates = np.asarray(updates, np.float64)
  group_updates = np.asarray(group_updates, np.float64)
  distance = (1.0 - clustering.cosine_similarity_matrix(updates, group_updates)) / 2.0
  return np.argmin(distance, axis=1).astype(np.int64)


def assign_by_direction(update: np.ndarray, group_updates: np.ndarray) -> int:
  """`assign_many` for one flattened update [d]."""
  return int(assign_many(np.asarray(update, np.float64)[None, :], group_updates)[0])


def inter_group_step_np(flat: np.ndarray, eta: float) -> np.ndarray:
  """FedGroup's inter-group step on flattened models [m, d]:
  w_j <- w_j + eta sum_{l != j} (w_l - w_j) / ||w_l - w_j||."""
  flat = np.asarray(flat, np.float64)
  diff = flat[None, :, :] - flat[:, None, :]  # diff[j, l] = w_l - w_j
  dist = np.linalg.norm(diff, axis=-1)
  inv = np.divide(1.0, dist, out=np.zeros_like(dist), where=dist > 0.0)
  return flat + eta * np.einsum("jl,jld->jd", inv, diff)


def count_trainable(model) -> int:
  """Trainable parameters (scalars) of a built Keras model."""
  return int(sum(int(np.prod(v.shape)) for v in model.trainable_variables))


def build_local_sgd(model, loss: str, momentum: float = 0.0):
  """`local_sgd(initial_weights, dataset, lr, mu)` as a `tf.function`.

  In-process local SGD over a dataset (`DatasetTrainer`) with FedProx's
  proximal term `mu` and heavy-ball `momentum`; returns an OrderedDict with
  `delta`, `num_examples`, `loss_sum`.
  """
  trainer = DatasetTrainer(model, loss)

  @tf.function
  def local_sgd(initial_weights, dataset, lr, mu):
    out = trainer.train(initial_weights, dataset, lr,
                        optimizers.chain(optimizers.proximal(float(mu)),
                                         optimizers.heavy_ball(momentum)))
    return collections.OrderedDict(delta=out.delta, num_examples=out.num_examples,
                                   loss_sum=out.loss_sum)

  return local_sgd
