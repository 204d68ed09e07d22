"""A Keras model as a pure function of its weights (`stateless_model`) and
local SGD on it with the weights as loop values (`FunctionalTrainer`): what
the side-by-side cohort round vectorizes.

Two routes to the function:

* Keras 3 (any model: Sequential, functional or subclassed): the model's own
  `stateless_call` (weights in; outputs and the updated non-trainable state
  out), with the layers that need it in their side-by-side forms
  (`layer_forms`: convolutions as patches times a matrix, BatchNormalization
  over each client's real rows, recurrent layers unrolled, Dropout from a
  per-client hash).
* tf_keras (no `stateless_call`): a chain of Dense, Flatten, Reshape and
  Activation layers written out (`stateless_forward`).

Either way the function is checked when it is made: against the model's own
inference on random inputs, and by tracing two clients' gradients under
`tf.vectorized_map(..., fallback_to_while_loop=False)`, so a model that
would not run side by side without a loop over its clients is refused with
the op and layer that stop it.
"""

from __future__ import annotations

from typing import List, Optional

import logging
import re

import numpy as np
import tensorflow as tf

from tff_cluster import models
from tff_cluster.learning import layer_forms
from tff_cluster.learning import optimizers
from tff_cluster.learning import schedule
from tff_cluster.learning import trainers


# Why a feature term is refused here (the model as a function of its weights
# returns its outputs only).
ALIGNMENT_SIDE_BY_SIDE = ("a feature-alignment term runs one client after another; valid: "
                          "--client_batching=sequential")

# Why a recorded loss trajectory is refused here (FedGWC's clients).
TRAJECTORY_SIDE_BY_SIDE = ("per-step loss trajectories run one client after another; valid: "
                           "--client_batching=sequential")

# Why per-example state and losses through several heads are refused here
# (HCFL+'s clients).
HEADS_SIDE_BY_SIDE = ("per-example weights kept between rounds and losses through several "
                      "heads run one client after another; valid: --client_batching=sequential")


def _refuse_heads(example_weights=None, mixture=None) -> None:
  if mixture is not None or (example_weights is not None and (
      getattr(example_weights, "rows", False) or getattr(example_weights, "heads", None)
      is not None)):
    raise ValueError(HEADS_SIDE_BY_SIDE)


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


class StatelessModel:
  """A model as a pure function (see the module docstring).

  `model(weights, x, training=False, mask=None, states=())` ->
  `(outputs, rest, states)`: `weights` the full weight list
  (`models.model_variables` order: trainable, then the floating non-trainable
  ones such as BatchNorm's moving statistics); `mask` the batch's 1.0/0.0
  real rows (training: batch statistics over them); `states` the model's
  integer states (Keras 3's random-generator states, `start_states`); `rest`
  the floating non-trainable weights after the call (BatchNorm's moving
  statistics updated in training), `states` advanced.

  `activations`: floats of one example's activations (its input, every
  layer's output and a convolution's patches), for a chunk's memory estimate.
  """

  def __init__(self, call, num_trainable: int, activations: int, start_states=None):
    self._call = call
    self.num_trainable = num_trainable
    self.activations = int(activations)
    self._start_states = start_states

  def __call__(self, weights, x, training=False, mask=None, states=()):
    return self._call(list(weights), x, training, mask, tuple(states))

  def start_states(self, seed=None) -> tuple:
    """The integer states at a client's start: Dropout's seed states at
    [`seed`, 0] (`layer_forms.client_seed_state`; `seed` None: as the model
    holds them), the others as the model holds them."""
    return () if self._start_states is None else self._start_states(seed)


def stateless_model(model: tf.keras.Model, input_spec: Optional[tf.TensorSpec] = None,
                    probe: bool = True) -> StatelessModel:
  """`model` as a `StatelessModel` (module docstring), checked against its
  own inference (and, with `probe`, traced side by side); raises
  `UnsupportedModel` with one phrase naming why not. A Keras 3 model gets the
  per-client Dropout of `layer_forms` for good (`install_dropout`)."""
  if not models.has_weights(model):
    raise UnsupportedModel("it has no weights yet (build it for its input shape first)")
  if not hasattr(model, "stateless_call"):
    forward = stateless_forward(model, input_spec)
    nt = len(model.trainable_variables)
    return StatelessModel(lambda w, x, training, mask, states: (forward(w, x), w[nt:], states),
                          nt, forward.activations)
  problem = layer_forms.side_by_side_problem(model)
  if problem is not None:
    raise UnsupportedModel(problem)
  spec = models.model_input_spec(model) if input_spec is None else input_spec
  if spec is None or any(d is None for d in spec.shape):
    raise UnsupportedModel("its input shape is unknown or not fixed")
  layer_forms.install_dropout(model)
  result = _keras3_model(model, spec)
  _check(model, result, spec, probe)
  return result


def _keras3_model(model, spec) -> StatelessModel:
  trainable = list(model.trainable_variables)
  others = list(model.non_trainable_variables)
  floating = [i for i, v in enumerate(others) if tf.as_dtype(v.dtype).is_floating]
  integer = [i for i, v in enumerate(others) if not tf.as_dtype(v.dtype).is_floating]
  dropout_states = {id(l.seed_generator.state) for l in layer_forms.dropout_layers(model)}
  nt = len(trainable)

  def call(weights, x, training, mask, states):
    values: List = [None] * len(others)
    for i, w in zip(floating, weights[nt:]):
      values[i] = w
    for i, s in zip(integer, states if states else start_states(None)):
      values[i] = s
    with layer_forms.side_by_side(model), layer_forms.row_mask(mask if training else None):
      out, new = model.stateless_call(weights[:nt], values, x, training=bool(training))
    return out, [new[i] for i in floating], tuple(new[i] for i in integer)

  def start_states(seed):
    return tuple(layer_forms.client_seed_state(seed, others[i].dtype)
                 if seed is not None and id(others[i]) in dropout_states
                 else tf.convert_to_tensor(others[i]) for i in integer)

  return StatelessModel(call, nt, _activations(model, spec), start_states)


def _activations(model, spec) -> int:
  """Floats of one example's activations: the input, each layer's output
  (where the model has a layer graph to read them from) and each
  convolution's patches."""
  total = int(np.prod(spec.shape))
  for layer in layer_forms.all_layers(model):
    try:
      shape = layer.output.shape
    except (AttributeError, ValueError):
      continue
    size = int(np.prod([d for d in shape[1:] if d is not None]))
    total += size
    kernel = getattr(layer, "kernel_size", None)
    if kernel is not None and hasattr(layer, "convolution_op"):
      in_channels = int(layer.input.shape[-1])
      total += size // int(layer.filters) * int(np.prod(kernel)) * in_channels
  return total


def _probe_input(spec, n: int):
  rng = np.random.default_rng(0)
  shape = [n] + [int(d) for d in spec.shape]
  if spec.dtype.is_floating:
    return tf.constant(rng.normal(size=shape).astype(spec.dtype.as_numpy_dtype))
  return tf.zeros(shape, spec.dtype)


def _check(model, result: StatelessModel, spec, probe: bool) -> None:
  """The function's inference equals the model's own (1e-4 relative: a
  convolution's patches add in another order); with `probe`, two clients'
  training gradients trace side by side with no loop over them."""
  x = _probe_input(spec, 2)
  weights = [tf.convert_to_tensor(v) for v in models.model_variables(model)]
  out = result(weights, x)[0]
  expected = model(x, training=False)
  if not np.allclose(np.asarray(out), np.asarray(expected), rtol=1e-4, atol=1e-5):
    raise UnsupportedModel("its side-by-side forward pass differs from its own call")
  if not probe:
    return
  nt = result.num_trainable

  def client(c):
    w = [t + tf.cast(c, t.dtype) * 0 for t in weights]
    states = result.start_states(c)
    with tf.GradientTape() as tape:
      tape.watch(w[:nt])
      outputs, _, _ = result(w, x, training=True, mask=tf.ones([2]), states=states)
      total = tf.reduce_sum(tf.cast(outputs, tf.float32))
    return tape.gradient(total, w[:nt])

  # The vectorizer logs the failing op's name (not in its exception): kept
  # here, not printed.
  logger, records = tf.get_logger(), []
  handler = logging.Handler()
  handler.emit = lambda record: records.append(record.getMessage())
  saved = logger.handlers[:], logger.propagate
  logger.handlers, logger.propagate = [handler], False
  try:
    tf.function(lambda: tf.vectorized_map(client, tf.range(2), fallback_to_while_loop=False)
                ).get_concrete_function()
  except (ValueError, TypeError, NotImplementedError) as e:
    raise UnsupportedModel(_vectorizer_problem(model, "\n".join([str(e)] + records))) from None
  finally:
    logger.handlers, logger.propagate = saved


def _vectorizer_problem(model, message: str) -> str:
  """One phrase from TF's vectorizer error: the op it has no rule for (or
  none with that input per client), and the layer whose name scope its op
  name carries (Keras may suffix the scope with _1, _2, ...)."""
  op = (re.search(r"No pfor vectorization defined for (\w+)", message)
        or re.search(r"of op '(\w+)' expected to be loop invariant", message))
  what = f"op {op.group(1)}" if op else message.strip().splitlines()[0][:120]
  layers = {l.name: type(l).__name__ for l in layer_forms.all_layers(model)}
  for scope in re.findall(r'name: "loop_body/([^/"]+)/', message):
    for name in (scope, re.sub(r"_\d+$", "", scope)):
      if name in layers:
        return f"layer {name!r} ({layers[name]}): {what} has no side-by-side form"
  return f"{what} has no side-by-side form"


class FunctionalTrainer:
  """`trainers.PaddedTrainer`'s local SGD with the weights as loop values, not Keras
  variables: the same batches, masks and update rule (`trainers.sgd_step`'s, term
  for term), on a `StatelessModel`.

  Training-mode calls carry the model's floating non-trainable weights
  (BatchNorm's moving statistics, updated each step as the Keras model's
  variables are) and its integer states (Dropout's seeds, from the client's
  round seed `data.seed`) through the loop, as the Keras variables of the
  sequential trainer are.

  `bound` (None, or a scalar tensor shared by every client of a
  `tf.vectorized_map`): the loops run exactly `bound` iterations and
  iterations at or past a client's own count leave its values unchanged
  (a select, not a multiply, so they cannot turn a finite value into NaN).
  A loop whose length is the same for every vectorized client is what
  `tf.vectorized_map` compiles under XLA; a per-client length is not.
  """

  def __init__(self, model: StatelessModel, loss: str, x, y, bound=None):
    self.model = model
    self.loss_kind = loss
    self._x, self._y = x, y
    self._bound = bound

  # -- the loop ----------------------------------------------------------------

  def _loop(self, data: schedule.PaddedBatches, limit, step, init):
    """`carry = step(x, y, mask, *carry)` over batches 0..limit-1
    (`schedule.batch_loop`, with this trainer's `bound`)."""
    return schedule.batch_loop(self._x, self._y, data, limit,
                      lambda i, x, y, mask, *carry: step(x, y, mask, *carry), init,
                      bound=self._bound)

  def _states(self, data):
    return self.model.start_states(getattr(data, "seed", None))

  def _grad(self, trainable, rest, states, x, y, mask, summed=False, weights=None):
    """(gradient of the batch's mean loss (or `summed` loss) at `trainable`,
    that loss, the real rows, the non-trainable weights and states after the
    training call); `weights`: per-example loss weights (None: 1)."""
    trainable = [tf.convert_to_tensor(t) for t in trainable]
    with tf.GradientTape() as tape:
      tape.watch(trainable)
      outputs, rest, states = self.model(list(trainable) + list(rest), x, training=True,
                                         mask=mask, states=states)
      per_example = models.per_example_loss(self.loss_kind, y, outputs)
      if weights is not None:
        per_example = per_example * weights
      count = tf.reduce_sum(mask)
      total = tf.reduce_sum(per_example * mask)
      batch_loss = total if summed else total / count
    return tape.gradient(batch_loss, trainable), batch_loss, count, rest, states

  def _mixed_grad(self, point, other, alpha, rest, states, x, y, mask):
    """((gradients at `point`, at `other`) of the batch's mean loss of the
    mixed outputs alpha f(point) + (1 - alpha) f(other), the non-trainable
    weights and states after the two training calls)."""
    point = [tf.convert_to_tensor(t) for t in point]
    other = [tf.convert_to_tensor(t) for t in other]
    with tf.GradientTape() as tape:
      tape.watch(point + other)
      out_p, rest, states = self.model(point + list(rest), x, training=True, mask=mask,
                                       states=states)
      out_o, rest, states = self.model(other + list(rest), x, training=True, mask=mask,
                                       states=states)
      per_example = models.per_example_loss(self.loss_kind, y,
                                            alpha * out_p + (1.0 - alpha) * out_o)
      batch_loss = tf.reduce_sum(per_example * mask) / tf.reduce_sum(mask)
    grads = tape.gradient(batch_loss, point + other)
    return (grads[:len(point)], grads[len(point):]), rest, states

  # -- the trainer interface ---------------------------------------------------

  def predict(self, weights, x):
    return self.model(weights, x)[0]

  def frozen_losses(self, frozen, x, y):
    """[F, b]: `trainers._Trainer.frozen_losses` (inference mode)."""
    return tf.stack([models.per_example_loss(self.loss_kind, y, self.model(list(w), x)[0])
                     for w in frozen])

  def _example_weights(self, example_weights, x, y):
    if example_weights is None:
      return None
    return tf.stop_gradient(example_weights.fn(
        self.frozen_losses(example_weights.frozen, x, y), y))

  def example_table(self, example_weights, data, num_rows: int):
    raise ValueError(HEADS_SIDE_BY_SIDE)

  def example_sums(self, example_weights, data: schedule.PaddedBatches, max_batches: int = 0):
    _refuse_heads(example_weights)
    limit = data.num_steps if not max_batches else tf.minimum(data.num_steps, max_batches)

    def body(x, y, mask, sums, count):
      values = example_weights.fn(self.frozen_losses(example_weights.frozen, x, y), y)
      return sums + tf.reduce_sum(values * mask, axis=-1), count + tf.reduce_sum(mask)

    return self._loop(data, limit, body, (tf.zeros([example_weights.width]), tf.constant(0.0)))

  def train(self, start, data: schedule.PaddedBatches, lr, optimizer=None,
            opt_state=None, example_weights=None, alignment=None,
            trajectory: int = 0, mixture=None) -> trainers.TrainResult:
    if alignment is not None:
      raise ValueError(ALIGNMENT_SIDE_BY_SIDE)
    if trajectory:
      raise ValueError(TRAJECTORY_SIDE_BY_SIDE)
    _refuse_heads(example_weights, mixture)
    start = [tf.convert_to_tensor(w) for w in start]
    nt = self.model.num_trainable
    lr = tf.cast(lr, tf.float32)
    opt, state0 = trainers.start_optimizer(optimizer, start[:nt], opt_state)

    def body(x, y, mask, w, rest, states, num_examples, loss_sum, state):
      weights = self._example_weights(example_weights, x, y)
      grads, batch_loss, count, rest, states = self._grad(w, rest, states, x, y, mask,
                                                          weights=weights)
      # A control variate's second gradient is another training call, as the
      # sequential trainer's (`trainers._gradient_at`): it advances the
      # states and moving statistics too.
      after = [rest, states]

      def gradient_at(point):
        g, _, _, after[0], after[1] = self._grad(list(point), after[0], after[1], x, y, mask,
                                                 weights=weights)
        return g

      def mixed_gradient_at(point, other, alpha):
        g, after[0], after[1] = self._mixed_grad(list(point), list(other), alpha, after[0],
                                                 after[1], x, y, mask)
        return g

      new_w, state = opt.update(grads, state, w, lr,
                                optimizers.GradientAt(gradient_at, mixed_gradient_at))
      return (tuple(new_w), tuple(after[0]), tuple(after[1]), num_examples + count,
              loss_sum + batch_loss * count, state)

    w, rest, _, num_examples, loss_sum, state = self._loop(
        data, data.num_steps, body,
        (tuple(start[:nt]), tuple(start[nt:]), self._states(data), tf.constant(0.0),
         tf.constant(0.0), state0))
    final = list(w) + list(rest)
    return trainers.TrainResult([f - s for f, s in zip(final, start)], num_examples, loss_sum, state)

  def gradient(self, weights, data: schedule.PaddedBatches, max_batches: int = 1):
    weights = [tf.convert_to_tensor(w) for w in weights]
    nt = self.model.num_trainable
    limit = data.num_steps if not max_batches else tf.minimum(data.num_steps, max_batches)

    def body(x, y, mask, total, count, rest, states):
      grads, _, n, rest, states = self._grad(weights[:nt], rest, states, x, y, mask,
                                             summed=True)
      return (tuple(a + g for a, g in zip(total, grads)), count + n, tuple(rest),
              tuple(states))

    total, count, _, _ = self._loop(
        data, limit, body, (tuple(tf.zeros_like(w) for w in weights[:nt]), tf.constant(0.0),
                            tuple(weights[nt:]), self._states(data)))
    return [t / tf.maximum(count, 1.0) for t in total], count

  def loss(self, weights, data: schedule.PaddedBatches, max_batches: int = 0):
    weights = [tf.convert_to_tensor(w) for w in weights]
    limit = data.num_steps if not max_batches else tf.minimum(data.num_steps, max_batches)

    def body(x, y, mask, loss_sum, count):
      per_example = models.per_example_loss(self.loss_kind, y, self.model(weights, x)[0])
      return loss_sum + tf.reduce_sum(per_example * mask), count + tf.reduce_sum(mask)

    return self._loop(data, limit, body, (tf.constant(0.0), tf.constant(0.0)))
