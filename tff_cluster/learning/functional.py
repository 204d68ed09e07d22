"""A Keras model as a pure function of its weights (`stateless_forward`)
and local SGD on it with the weights as loop values
(`FunctionalTrainer`): what the side-by-side cohort round vectorizes."""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf

from tff_cluster import models
from tff_cluster.learning import schedule
from tff_cluster.learning import trainers


class UnsupportedModel(ValueError):
  """The model cannot be written as a function of its weights here."""


# The layers a stateless forward pass is written for.
CHAIN_LAYERS = "Dense, Flatten, Reshape and Activation layers"


def chain_problem(model: tf.keras.Model) -> Optional[str]:
  """Why `model` cannot be a `stateless_forward` chain, read from its class
  and its layers' types alone (so also for a model without weights yet), or
  None when it may be one (`stateless_forward` then checks the chain against
  the model's own call)."""
  if not models.is_layer_graph(model):
    return (f"{type(model).__name__} is a subclassed model (its forward pass is its own "
            "call(), not a chain of layers)")
  for layer in model.layers:
    kind = type(layer).__name__
    if kind == "InputLayer":
      continue
    if isinstance(layer, tf.keras.layers.BatchNormalization):
      return f"layer {layer.name!r} (BatchNormalization) normalizes by its batch"
    if not isinstance(layer, (tf.keras.layers.Dense, tf.keras.layers.Flatten,
                              tf.keras.layers.Reshape, tf.keras.layers.Activation)):
      return f"layer {layer.name!r} ({kind})"
  return None


def stateless_forward(model: tf.keras.Model, input_spec: Optional[tf.TensorSpec] = None):
  """`forward(weights, x) -> outputs`: the model's inference as a pure function
  of its weight list (`models.model_variables` order), for a `keras.Sequential` or
  functional model that is a chain of Dense, Flatten, Reshape and Activation
  layers (MCLR, the MLPs); raises `UnsupportedModel` naming why not
  (`chain_problem`: a subclassed model, the first other layer).

  Nothing is read from or written to a Keras variable, so the function can
  be vectorized over clients (`tf.vectorized_map`) with a weight list per
  client. The chain is checked against the model's own call on random
  inputs of one example's `input_spec` (default the model's declared input,
  `models.model_input_spec`), equal to 1e-5, so a model whose layers are not one
  chain is refused rather than computed wrongly. `forward.activations` is
  the number of floats of one example's activations (its input and every
  layer's output), for the memory estimate of a chunk of clients.
  """
  problem = chain_problem(model)
  if problem is not None:
    raise UnsupportedModel(problem)
  if not models.has_weights(model):
    raise UnsupportedModel("it has no weights yet (build it for its input shape first)")
  spec = models.model_input_spec(model) if input_spec is None else input_spec
  if spec is None:
    raise UnsupportedModel("its input shape is unknown")
  if spec.dtype != tf.float32:
    raise UnsupportedModel(f"its input is {spec.dtype.name}, not float32")
  if any(d is None for d in spec.shape):
    raise UnsupportedModel(f"its input shape {tuple(spec.shape)} is not fixed")
  variables = models.model_variables(model)

  def index_of(weight):
    try:
      return models.weight_index(variables, weight)
    except ValueError as e:
      raise UnsupportedModel(str(e)) from None

  ops = []
  for layer in model.layers:
    if type(layer).__name__ == "InputLayer":
      continue
    if isinstance(layer, tf.keras.layers.Dense):
      bias = index_of(layer.bias) if layer.use_bias else None
      ops.append(("dense", index_of(layer.kernel), bias, layer.activation))
    elif isinstance(layer, tf.keras.layers.Flatten):
      ops.append(("reshape", (-1,), None, None))
    elif isinstance(layer, tf.keras.layers.Reshape):
      ops.append(("reshape", tuple(layer.target_shape), None, None))
    else:  # Activation (chain_problem let no other layer through)
      ops.append(("activation", None, None, layer.activation))

  def run(weights, x, sizes=None):
    h = x
    for op, a, b, activation in ops:
      if op == "dense":
        h = tf.matmul(h, weights[a])
        if b is not None:
          h = tf.nn.bias_add(h, weights[b])
        if activation is not None:
          h = activation(h)
      elif op == "reshape":
        h = tf.reshape(h, tf.concat([tf.shape(h)[:1], a], 0))
      else:
        h = activation(h)
      if sizes is not None:
        sizes.append(int(np.prod(h.shape[1:])))
    return h

  def forward(weights, x):
    return run(weights, x)

  rng = np.random.default_rng(0)
  shape = [2] + [int(d) for d in spec.shape]
  probe = tf.constant(rng.normal(size=shape).astype(np.float32))
  weights = [tf.convert_to_tensor(v) for v in variables]
  sizes = [int(np.prod(shape[1:]))]
  try:
    same = np.allclose(run(weights, probe, sizes).numpy(),
                       model(probe, training=False).numpy(), rtol=1e-5, atol=1e-5)
  except (ValueError, tf.errors.InvalidArgumentError):  # shapes that do not chain
    same = False
  if not same:
    raise UnsupportedModel("its layers are not one chain")
  forward.activations = int(sum(sizes))
  return forward


class FunctionalTrainer:
  """`trainers.PaddedTrainer`'s local SGD with the weights as loop values, not Keras
  variables: the same batches, masks and update rule (`trainers.sgd_step`'s, term
  for term), on a `stateless_forward` model.

  `bound` (None, or a scalar tensor shared by every client of a
  `tf.vectorized_map`): the loops run exactly `bound` iterations and
  iterations at or past a client's own count leave its values unchanged
  (a select, not a multiply, so they cannot turn a finite value into NaN).
  A loop whose length is the same for every vectorized client is what
  `tf.vectorized_map` compiles under XLA; a per-client length is not.
  """

  def __init__(self, forward, num_weights: int, num_trainable: int, loss: str, x, y,
               bound=None):
    self.forward = forward
    self.loss_kind = loss
    self._num_weights = num_weights
    self._num_trainable = num_trainable
    self._x, self._y = x, y
    self._bound = bound

  # -- the loop ----------------------------------------------------------------

  def _loop(self, data: schedule.PaddedBatches, limit, step, init):
    """`carry = step(x, y, mask, *carry)` over batches 0..limit-1
    (`schedule.batch_loop`, with this trainer's `bound`)."""
    return schedule.batch_loop(self._x, self._y, data, limit,
                      lambda i, x, y, mask, *carry: step(x, y, mask, *carry), init,
                      bound=self._bound)

  def _mean_loss(self, trainable, rest, x, y, mask):
    per_example = models.per_example_loss(self.loss_kind, y,
                                          self.forward(list(trainable) + list(rest), x))
    count = tf.reduce_sum(mask)
    return tf.reduce_sum(per_example * mask) / count, count

  def _grad(self, trainable, rest, x, y, mask):
    trainable = [tf.convert_to_tensor(t) for t in trainable]
    with tf.GradientTape() as tape:
      tape.watch(trainable)
      batch_loss, count = self._mean_loss(trainable, rest, x, y, mask)
    return tape.gradient(batch_loss, trainable), batch_loss, count

  # -- the trainer interface ---------------------------------------------------

  def predict(self, weights, x):
    return self.forward(list(weights), x)

  def train(self, start, data: schedule.PaddedBatches, lr, optimizer=None,
            opt_state=None) -> trainers.TrainResult:
    start = [tf.convert_to_tensor(w) for w in start]
    nt = self._num_trainable
    rest = start[nt:]
    lr = tf.cast(lr, tf.float32)
    opt, state0 = trainers.start_optimizer(optimizer, start[:nt], opt_state)

    def body(x, y, mask, w, num_examples, loss_sum, state):
      grads, batch_loss, count = self._grad(w, rest, x, y, mask)
      new_w, state = opt.update(w, grads, state, lr,
                                lambda point: self._grad(list(point), rest, x, y, mask)[0])
      return (tuple(new_w), num_examples + count, loss_sum + batch_loss * count, state)

    w, num_examples, loss_sum, state = self._loop(
        data, data.num_steps, body,
        (tuple(start[:nt]), tf.constant(0.0), tf.constant(0.0), state0))
    final = list(w) + rest
    return trainers.TrainResult([f - s for f, s in zip(final, start)], num_examples, loss_sum, state)

  def gradient(self, weights, data: schedule.PaddedBatches, max_batches: int = 1):
    weights = [tf.convert_to_tensor(w) for w in weights]
    nt = self._num_trainable
    limit = data.num_steps if not max_batches else tf.minimum(data.num_steps, max_batches)

    def body(x, y, mask, total, count):
      trainable = list(weights[:nt])
      with tf.GradientTape() as tape:
        tape.watch(trainable)
        per_example = models.per_example_loss(
            self.loss_kind, y, self.forward(trainable + weights[nt:], x))
        summed = tf.reduce_sum(per_example * mask)
      grads = tape.gradient(summed, trainable)
      return tuple(a + g for a, g in zip(total, grads)), count + tf.reduce_sum(mask)

    total, count = self._loop(data, limit, body, (tuple(tf.zeros_like(w) for w in weights[:nt]),
                                                  tf.constant(0.0)))
    return [t / tf.maximum(count, 1.0) for t in total], count

  def loss(self, weights, data: schedule.PaddedBatches, max_batches: int = 0):
    weights = [tf.convert_to_tensor(w) for w in weights]
    limit = data.num_steps if not max_batches else tf.minimum(data.num_steps, max_batches)

    def body(x, y, mask, loss_sum, count):
      per_example = models.per_example_loss(self.loss_kind, y, self.forward(weights, x))
      return loss_sum + tf.reduce_sum(per_example * mask), count + tf.reduce_sum(mask)

    return self._loop(data, limit, body, (tf.constant(0.0), tf.constant(0.0)))
