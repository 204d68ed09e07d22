"""Keras models of the papers' experiments, and the losses they train with.

Every builder returns a *built* model (an `Input` layer fixes the shapes) so
its variables exist before any TFF computation or tf.function touches them.
"""

from __future__ import annotations

import tensorflow as tf

SPARSE_CE_LOGITS = "sparse_ce_logits"
BINARY_PROBS = "binary_probs"
LOSSES = (SPARSE_CE_LOGITS, BINARY_PROBS)


def mclr(input_dim: int, num_classes: int, name: str = "mclr") -> tf.keras.Model:
  """Multinomial logistic regression: one dense layer, logits out.

  Synthetic 60->10 has 610 parameters; MNIST 784->10 has 7,850.
  """
  inputs = tf.keras.Input(shape=(input_dim,), dtype=tf.float32)
  logits = tf.keras.layers.Dense(num_classes, name="logits")(inputs)
  return tf.keras.Model(inputs, logits, name=name)


def per_example_loss(kind: str, y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
  """Loss of each example, shape [batch]."""
  if kind == SPARSE_CE_LOGITS:
    return tf.keras.losses.sparse_categorical_crossentropy(
        tf.cast(y_true, tf.int32), y_pred, from_logits=True)
  if kind == BINARY_PROBS:
    y = tf.reshape(tf.cast(y_true, y_pred.dtype), [-1, 1])
    return tf.keras.losses.binary_crossentropy(y, y_pred)
  raise ValueError(f"unknown loss {kind!r}; valid: {', '.join(LOSSES)}")


def num_correct(kind: str, y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
  """Number of correctly classified examples in the batch (float32)."""
  if kind == SPARSE_CE_LOGITS:
    pred = tf.argmax(y_pred, axis=-1, output_type=tf.int32)
  elif kind == BINARY_PROBS:
    pred = tf.cast(tf.reshape(y_pred, [-1]) >= 0.5, tf.int32)
  else:
    raise ValueError(f"unknown loss {kind!r}; valid: {', '.join(LOSSES)}")
  return tf.reduce_sum(
      tf.cast(tf.equal(pred, tf.reshape(tf.cast(y_true, tf.int32), [-1])),
              tf.float32))
