"""Client-side maths shared by every algorithm: datasets and local (proximal) SGD.

Plain TensorFlow: the same functions run inside TFF `tff.tensorflow.computation`s
and in-process. Model weights are handled as a flat list of tensors in the order
`trainable_variables + non_trainable_variables` (non-trainable = BatchNorm
moving statistics, averaged like the rest).
"""

from __future__ import annotations

import collections
from typing import List, Sequence

import numpy as np
import tensorflow as tf

from tff_cluster import models


def model_variables(model: tf.keras.Model) -> List[tf.Variable]:
  """Trainable then non-trainable variables: the order of every weight list."""
  return list(model.trainable_variables) + list(model.non_trainable_variables)


def get_weights(model: tf.keras.Model) -> List[np.ndarray]:
  return [v.numpy() for v in model_variables(model)]


def set_weights(model: tf.keras.Model, weights: Sequence) -> None:
  for var, value in zip(model_variables(model), weights):
    var.assign(value)


def weights_type_spec(model: tf.keras.Model) -> List[tf.TensorSpec]:
  return [tf.TensorSpec(v.shape, v.dtype) for v in model_variables(model)]


def num_parameters(model: tf.keras.Model) -> int:
  """Number of scalars a client downloads/uploads for one model."""
  return int(sum(np.prod(v.shape) for v in model_variables(model)))


def client_dataset(x: np.ndarray, y: np.ndarray, batch_size: int, epochs: int,
                   seed: int) -> tf.data.Dataset:
  """`epochs` passes over a client's samples, reshuffled each pass.

  Mini-batches never cross an epoch boundary (the last one of each pass may be
  smaller), as in LEAF/FedProx's `batch_data`. Epoch e visits the samples in
  the order of a stateless shuffle seeded by (seed, e): the batches depend on
  `seed` alone (not on TF's global seed or on what ran before), so a round is
  reproducible and TFF and in-process runs see the same batches.
  """
  n = len(y)
  xs = tf.constant(x)
  ys = tf.constant(y)

  def one_epoch(epoch):
    order = tf.random.experimental.stateless_shuffle(
        tf.range(n, dtype=tf.int64),
        seed=tf.stack([tf.constant(seed, tf.int64), epoch]))
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
        x=tf.gather(xs, order), y=tf.gather(ys, order))).batch(batch_size)

  return tf.data.Dataset.range(epochs).flat_map(one_epoch)


def build_local_sgd(model: tf.keras.Model, loss: str):
  """Returns `local_sgd(initial_weights, dataset, lr, mu)` for this model.

  Mini-batch SGD on the local objective
      F_k(w) + (mu / 2) ||w - w0||^2        (FedProx, Li et al. 2020, eq. 2)
  starting from w0 = `initial_weights`; mu = 0 gives FedAvg's client update.
  The step is w <- w - lr (grad F_k(w) + mu (w - w0)) on trainable weights.

  Returns an OrderedDict:
    delta: list of (w_final - w0), one tensor per weight (trainable first).
    num_examples: float32, examples processed (epochs x samples).
    loss_sum: float32, sum over batches of (batch mean loss x batch size),
      each loss taken before that batch's step.
  """
  variables = model_variables(model)
  trainable = list(model.trainable_variables)
  num_trainable = len(trainable)

  @tf.function
  def local_sgd(initial_weights, dataset, lr, mu):
    for var, value in zip(variables, initial_weights):
      var.assign(value)
    lr = tf.cast(lr, tf.float32)
    mu = tf.cast(mu, tf.float32)

    def step(carry, batch):
      num_examples, loss_sum = carry
      with tf.GradientTape() as tape:
        predictions = model(batch["x"], training=True)
        batch_loss = tf.reduce_mean(
            models.per_example_loss(loss, batch["y"], predictions))
      grads = tape.gradient(batch_loss, trainable)
      for var, grad, start in zip(trainable, grads,
                                  initial_weights[:num_trainable]):
        var.assign_sub(lr * (grad + mu * (var - start)))
      batch_size = tf.cast(tf.shape(batch["y"])[0], tf.float32)
      return num_examples + batch_size, loss_sum + batch_loss * batch_size

    num_examples, loss_sum = dataset.reduce(
        (tf.constant(0.0), tf.constant(0.0)), step)
    delta = [var - start for var, start in zip(variables, initial_weights)]
    return collections.OrderedDict(
        delta=delta, num_examples=num_examples, loss_sum=loss_sum)

  return local_sgd
