"""Honest test metrics: every client, each with the model it would receive now.

Accuracy = total correct / total test examples over all clients (a fraction in
[0, 1]); `per_client_correct`/`per_client_count` let callers report per-group
numbers. Plain TensorFlow: one Keras model, weights swapped per distinct model.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_cluster import local_training, models
from tff_cluster.data.federated import FederatedData


# `client_model` value asking each client to take its lowest-test-loss model.
CHOOSE_BY_TEST_LOSS = "min_test_loss"


@dataclasses.dataclass
class EvalResult:
  accuracy: float
  loss: float
  per_client_correct: np.ndarray
  per_client_count: np.ndarray
  per_client_loss_sum: np.ndarray
  client_model: Optional[np.ndarray] = None  # the model index each client was tested with

  def group_accuracy(self, assignment: np.ndarray, group: int) -> float:
    mask = assignment == group
    count = self.per_client_count[mask].sum()
    return float(self.per_client_correct[mask].sum() / count) if count else float("nan")


class Evaluator:
  """Evaluates per-client model choices on every client's test split."""

  def __init__(self, model_fn: Callable[[], tf.keras.Model], loss: str,
               data: FederatedData, batch_size: int = 2048):
    self._model = model_fn()
    self._loss = loss
    self._batch_size = batch_size
    self._x = [data.test[c][0] for c in data.client_ids]
    self._y = [data.test[c][1] for c in data.client_ids]
    self._counts = np.array([len(y) for y in self._y], np.int64)

    @tf.function(reduce_retracing=True)
    def batch_stats(x, y):
      pred = self._model(x, training=False)
      per_example = models.per_example_loss(loss, y, pred)
      if loss == models.SPARSE_CE_LOGITS:
        label = tf.argmax(pred, axis=-1, output_type=tf.int32)
      else:
        label = tf.cast(tf.reshape(pred, [-1]) >= 0.5, tf.int32)
      correct = tf.cast(tf.equal(label, tf.reshape(tf.cast(y, tf.int32), [-1])),
                        tf.float64)
      return correct, tf.cast(per_example, tf.float64)

    self._batch_stats = batch_stats

  def _stats(self, x: np.ndarray, y: np.ndarray):
    correct, losses = [], []
    for start in range(0, len(y), self._batch_size):
      c, l = self._batch_stats(x[start:start + self._batch_size],
                               y[start:start + self._batch_size])
      correct.append(c.numpy())
      losses.append(l.numpy())
    return np.concatenate(correct), np.concatenate(losses)

  def evaluate(self, weights: Sequence[Sequence[np.ndarray]],
               client_model) -> EvalResult:
    """Client k is tested with `weights[client_model[k]]`; with
    `client_model=CHOOSE_BY_TEST_LOSS` each client takes the model of lowest
    mean loss on its own test data (ties: the lowest index), as IFCA's test
    clients do. `result.client_model` is the choice either way."""
    if isinstance(client_model, str):
      if client_model != CHOOSE_BY_TEST_LOSS:
        raise ValueError(f"client_model must be indices or {CHOOSE_BY_TEST_LOSS!r}")
      every = [self.evaluate(weights, np.full(len(self._y), j)) for j in range(len(weights))]
      mean_loss = np.stack([np.where(r.per_client_count > 0,
                                     r.per_client_loss_sum / np.maximum(r.per_client_count, 1),
                                     0.0) for r in every])
      choice = np.argmin(mean_loss, axis=0)
      pick = lambda field: np.choose(choice, [getattr(r, field) for r in every])  # noqa: E731
      correct, loss_sum = pick("per_client_correct"), pick("per_client_loss_sum")
      total = self._counts.sum()
      return EvalResult(float(correct.sum() / total), float(loss_sum.sum() / total),
                        correct, self._counts.copy(), loss_sum, client_model=choice)
    client_model = np.asarray(client_model)
    n = len(self._y)
    correct = np.zeros(n)
    loss_sum = np.zeros(n)
    for index in np.unique(client_model):
      members = np.flatnonzero(client_model == index)
      members = members[self._counts[members] > 0]
      if len(members) == 0:
        continue
      local_training.set_weights(self._model, weights[index])
      c, l = self._stats(np.concatenate([self._x[k] for k in members]),
                         np.concatenate([self._y[k] for k in members]))
      bounds = np.cumsum(self._counts[members])[:-1]
      correct[members] = [s.sum() for s in np.split(c, bounds)]
      loss_sum[members] = [s.sum() for s in np.split(l, bounds)]
    total = self._counts.sum()
    return EvalResult(float(correct.sum() / total), float(loss_sum.sum() / total),
                      correct, self._counts.copy(), loss_sum, client_model=client_model)
