"""Client-side maths shared by every algorithm: batches and local SGD.

Plain TensorFlow. Model weights are a flat list of tensors in the order
`trainable_variables + non_trainable_variables` (non-trainable = BatchNorm
moving statistics, averaged like the rest).

One local step (`sgd_step`: the batch gradient, then the client optimizer's
update, `learning.optimizers`) is written once. Two trainers drive it over a
client's batches, one per runner:

* `DatasetTrainer` iterates a `tf.data.Dataset` with `dataset.reduce`; it runs
  inside TFF computations (the `tff` runner).
* `PaddedTrainer` iterates a `tf.while_loop` over index batches into the
  device-resident training arrays (the `local` runner); it compiles under XLA
  and never returns to the host inside the loop.

Both see the same batches in the same order: `batch_order` is the single
definition of a client's local schedule (`client_dataset` and `padded_batches`
are its two materialisations).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, List, NamedTuple, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_cluster import models
from tff_cluster.learning import optimizers


def model_variables(model: tf.keras.Model) -> List[tf.Variable]:
  """Trainable then non-trainable variables: the order of every weight list.

  Non-trainable variables that are not floating point are not weights: Keras 3
  keeps the random-generator state of its LSTM/dropout layers there (int64
  `seed_generator_state`); tf_keras has none. BatchNorm statistics are floats.
  """
  return list(model.trainable_variables) + [
      v for v in model.non_trainable_variables if tf.as_dtype(v.dtype).is_floating]


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


def has_batch_statistics(model: tf.keras.Model) -> bool:
  """True if a layer's training output depends on the whole batch (BatchNorm).

  Such a model must see each batch at its real size: padded rows would enter
  the batch statistics.
  """
  return any(isinstance(layer, tf.keras.layers.BatchNormalization)
             for layer in _all_layers(model))


def model_family(model: tf.keras.Model) -> str:
  """'cnn' (any convolution), 'rnn' (any recurrent layer) or 'dense'."""
  layers = list(_all_layers(model))
  if any(isinstance(l, tf.keras.layers.RNN) for l in layers):
    return "rnn"
  if any(isinstance(l, (tf.keras.layers.Conv1D, tf.keras.layers.Conv2D,
                        tf.keras.layers.Conv3D)) for l in layers):
    return "cnn"
  return "dense"


def dense_indices(model: tf.keras.Model, last_only: bool = False) -> List[int]:
  """Indices, in the model's weight list (trainable first), of the weights of
  its Dense layers in layer order, each [kernel] or [kernel, bias]; with
  `last_only`, of the last Dense layer alone."""
  variables = model_variables(model)
  dense = [layer for layer in _all_layers(model)
           if isinstance(layer, tf.keras.layers.Dense)]
  if not dense:
    raise ValueError(f"model {model.name!r} has no Dense layer")
  return [weight_index(variables, weight)
          for layer in (dense[-1:] if last_only else dense) for weight in layer.weights]


def weight_index(variables: Sequence[tf.Variable], weight) -> int:
  """The position of the Keras weight `weight` in `variables` (by identity)."""
  for i, var in enumerate(variables):
    if var is weight:
      return i
  raise ValueError(f"weight {weight.name!r} is not among the model's weights")


def last_dense_indices(model: tf.keras.Model) -> List[int]:
  """Indices of the weights of the model's last Dense layer: [kernel] or
  [kernel, bias]."""
  return dense_indices(model, last_only=True)


def last_dense_kernel_index(model: tf.keras.Model) -> int:
  """Index of the kernel of the model's last Dense layer (WeCFL's clustering
  feature in the authors' code)."""
  return last_dense_indices(model)[0]


def _all_layers(model):
  for layer in model.layers:
    yield layer
    if isinstance(layer, tf.keras.Model):
      yield from _all_layers(layer)


# ---------------------------------------------------------------------------
# Models as users write them: built or not, Sequential, functional or subclassed.


def has_weights(model: tf.keras.Model) -> bool:
  """True when the model's weights exist (a model given its input shape, or
  called once); False for a `keras.Sequential` without `keras.Input` or a
  subclassed model that was never called (tf_keras raises on their
  `.weights`)."""
  return bool(model.built) and bool(model.weights)


def build_model(model: tf.keras.Model, example_shape: Sequence[int], dtype="float32"
                ) -> tf.keras.Model:
  """`model` with its weights created for inputs of one example's shape
  `example_shape` (and `dtype`); a model that has weights is returned as it is.

  A `keras.Sequential` is built for a batch of any size (`build((None, ...))`,
  which also gives it the input its layers chain from); any other model (a
  subclassed one) is called once on a batch of zeros.
  """
  if has_weights(model):
    return model
  shape = tuple(int(d) for d in example_shape)
  if isinstance(model, tf.keras.Sequential):
    model.build((None,) + shape)
  else:
    model(tf.zeros((1,) + shape, dtype), training=False)
  return model


def built_model(model_fn, example_shape: Sequence[int], dtype: str = "float32"
                ) -> tf.keras.Model:
  """`model_fn()` built for inputs of `example_shape` (`build_model`).
  `functools.partial(built_model, model_fn, shape, dtype)` is a model function
  whose every model has its weights (and pickles where `model_fn` does)."""
  return build_model(model_fn(), example_shape, dtype)


def is_layer_graph(model: tf.keras.Model) -> bool:
  """True for a `keras.Sequential` or functional model, whose layers are its
  forward pass; False for a subclassed model, whose forward pass is its own
  `call()`."""
  return isinstance(model, tf.keras.Sequential) or any(
      klass.__name__ == "Functional" for klass in type(model).__mro__)


def model_input_spec(model: tf.keras.Model) -> Optional[tf.TensorSpec]:
  """One example's input (shape without the batch, dtype) as the model
  declares it, or None where it declares none (a subclassed model, a
  Sequential not built yet). Read from `model.inputs`, which every
  Sequential and functional model has once built under both Keras versions
  (Keras 3's Sequential has no `model.input`)."""
  try:
    inputs = model.inputs
  except (AttributeError, ValueError):
    return None
  if not inputs or len(inputs) != 1:
    return None
  tensor = inputs[0]
  return tf.TensorSpec(tuple(tensor.shape)[1:], tf.as_dtype(tensor.dtype))


# ---------------------------------------------------------------------------
# A client's local schedule.


def client_seed(seed: int, round_num: int, client_index: int) -> int:
  """Seed of one client's data shuffle in one round (stable, collision-free)."""
  return int(np.random.SeedSequence([seed, round_num, client_index])
             .generate_state(1)[0] & 0x7FFFFFFF)



@dataclasses.dataclass(frozen=True)
class LocalWork:
  """How much local training one client does in a round.

  `epochs` full passes (each pass reshuffled; the last batch of a pass may be
  smaller, batches never cross a pass, as LEAF/FedProx's `batch_data`), or
  `steps` mini-batch steps: the first `steps` batches of that same sequence of
  reshuffled passes, so the cursor restarts every round.
  """
  batch_size: int
  epochs: Optional[int] = None
  steps: Optional[int] = None

  def __post_init__(self):
    if (self.epochs is None) == (self.steps is None):
      raise ValueError("LocalWork takes exactly one of epochs and steps")

  def num_epochs(self, num_samples: int) -> int:
    if self.epochs is not None:
      return self.epochs
    per_epoch = max(math.ceil(num_samples / self.batch_size), 1)
    return math.ceil(self.steps / per_epoch)

  def num_steps(self, num_samples: int) -> int:
    per_epoch = math.ceil(num_samples / self.batch_size)
    if self.epochs is not None:
      return self.epochs * per_epoch
    return self.steps if num_samples else 0


@tf.function(reduce_retracing=True)
def _epoch_orders(num_samples, seeds, epochs, width):
  """Row q: `epoch_order(num_samples[q], seeds[q], epochs[q])`, padded with -1
  to `width` (many clients' and epochs' orders in one call)."""
  def one(args):
    n, seed, epoch = args
    order = epoch_order(n, seed, epoch)
    return tf.pad(order, [[0, width - n]], constant_values=-1)
  return tf.map_fn(one, (num_samples, seeds, epochs), fn_output_signature=tf.int64)


def epoch_order(num_samples: int, seed: int, epoch) -> tf.Tensor:
  """The sample order of pass `epoch`: a stateless shuffle seeded by (seed, epoch).

  It depends on `seed` alone (not on TF's global seed or on what ran before),
  so every runner and every re-run sees the same batches. Computed on the CPU
  (where tf.data runs) so that both runners get the same permutation.
  """
  with tf.device("/CPU:0"):
    return tf.random.experimental.stateless_shuffle(
        tf.range(num_samples, dtype=tf.int64),
        seed=tf.stack([tf.cast(seed, tf.int64), tf.cast(epoch, tf.int64)]))


def client_dataset(x: np.ndarray, y: np.ndarray, batch_size: int, epochs: int,
                   seed: int, steps: Optional[int] = None) -> tf.data.Dataset:
  """A client's batches as a `tf.data.Dataset` (see `LocalWork`).

  `epochs` passes, reshuffled each pass; with `steps`, only the first `steps`
  batches of as many passes as they need.
  """
  n = len(y)
  xs = tf.constant(x)
  ys = tf.constant(y)

  def one_epoch(epoch):
    order = epoch_order(n, seed, epoch)
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
        x=tf.gather(xs, order), y=tf.gather(ys, order))).batch(batch_size)

  if steps is not None:
    epochs = LocalWork(batch_size, steps=steps).num_epochs(n)
  dataset = tf.data.Dataset.range(epochs).flat_map(one_epoch)
  return dataset.take(steps) if steps is not None else dataset


def work_dataset(x: np.ndarray, y: np.ndarray, work: LocalWork, seed: int
                 ) -> tf.data.Dataset:
  return client_dataset(x, y, work.batch_size, work.epochs, seed, steps=work.steps)


class PaddedBatches(NamedTuple):
  """A client's batches as indices into the runner's training arrays.

  indices: int32 [P, B]: row i holds batch i's sample indices (0 where padded).
  sizes: int32 [P]: the real size of batch i (0 for padding rows).
  num_steps: int32 scalar: the number of real batches; the loop stops there.
    The runner pads P to the largest step count of any client, so that one
    compiled shape serves every client (only these small index arrays are
    padded, never the data).
  """
  indices: tf.Tensor
  sizes: tf.Tensor
  num_steps: tf.Tensor


def padded_batches(num_samples: int, offset: int, work: LocalWork, seed: int,
                   total_steps: Optional[int] = None) -> PaddedBatches:
  """The batches of `client_dataset` (same order), as numpy index batches.

  `offset` is the client's first row in the runner's concatenated arrays;
  `total_steps` (>= the client's steps) is P, default the client's steps.
  """
  steps = work.num_steps(num_samples)
  total = steps if total_steps is None else total_steps
  stacked = stacked_padded_batches([num_samples], [offset], work, [seed], total)
  return PaddedBatches(stacked.indices[0], stacked.sizes[0], stacked.num_steps[0])


def stacked_padded_batches(num_samples: Sequence[int], offsets: Sequence[int],
                           work: LocalWork, seeds: Sequence[int], total_steps: int
                           ) -> PaddedBatches:
  """`padded_batches` of several clients stacked: indices [K, P, B], sizes
  [K, P], num_steps [K] (P = `total_steps`, at least every client's steps).
  Every client's and epoch's order comes from one TF call."""
  b = work.batch_size
  epochs = [work.num_epochs(int(n)) for n in num_samples]
  steps = [work.num_steps(int(n)) for n in num_samples]
  if max(steps, default=0) > total_steps:
    raise ValueError(f"total_steps={total_steps} is fewer than a client's "
                     f"{max(steps)} steps")
  width = max(int(n) for n in num_samples)
  pair_n = np.repeat(np.asarray(num_samples, np.int64), epochs)
  pair_seed = np.repeat(np.asarray(seeds, np.int64), epochs)
  pair_epoch = np.concatenate([np.arange(e, dtype=np.int64) for e in epochs])
  orders = _epoch_orders(pair_n, pair_seed, pair_epoch, tf.constant(width, tf.int64)).numpy()
  k = len(num_samples)
  indices = np.zeros((k, total_steps, b), np.int32)
  sizes = np.zeros((k, total_steps), np.int32)
  row = 0
  for c, (n, offset, e, s) in enumerate(zip(num_samples, offsets, epochs, steps)):
    n = int(n)
    per_epoch = math.ceil(n / b)
    # Each epoch's order, cut into batches; a partial last batch's empty slots
    # point at the client's first row (their weight is 0).
    padded = np.full((e, per_epoch * b), offset, np.int64)
    padded[:, :n] = orders[row:row + e, :n] + offset
    row += e
    epoch_sizes = np.full(per_epoch, b, np.int32)
    if n % b:
      epoch_sizes[-1] = n % b
    indices[c, :s] = padded.reshape(e * per_epoch, b)[:s]
    sizes[c, :s] = np.tile(epoch_sizes, e)[:s]
  return PaddedBatches(indices, sizes, np.asarray(steps, np.int32))


# Index batches whose rows are gathered together: one gather of BLOCK batches
# instead of one per step (a small model's step spent about as long gathering
# its 10 rows as computing: benchmarks/client_batching.py --step_cost).
BLOCK = 32


def batch_loop(x, y, data: PaddedBatches, limit, body, init, bound=None):
  """`carry = body(i, x_i, y_i, mask_i, *carry)` for batches i = 0 .. limit-1
  of `data`, in order (x_i: the batch's full B rows, mask_i 1.0/0.0 per row).

  The rows of BLOCK consecutive batches are gathered from `x`, `y` at once
  (the same rows as batch by batch, so the same numbers). With `bound` (a
  scalar shared by every client of a `tf.vectorized_map`), exactly `bound`
  iterations run and those at i >= limit keep the carry (a select).
  Returns the final carry (a tuple).
  """
  indices, sizes = data.indices, data.sizes
  steps, width = indices.shape[0], indices.shape[1]
  block = max(1, min(steps, BLOCK))
  blocks = -(-steps // block)
  if blocks * block != steps:  # padded batches point at row 0 and are never run
    indices = tf.pad(indices, [[0, blocks * block - steps], [0, 0]])
    sizes = tf.pad(sizes, [[0, blocks * block - steps]])
  indices = tf.reshape(indices, [blocks, block, width])
  last = limit if bound is None else bound

  def outer(j, *carry):
    rows = indices[j]
    xb, yb = tf.gather(x, rows), tf.gather(y, rows)
    first = j * block

    def inner(g, *carry):
      i = first + g
      mask = tf.cast(tf.range(width) < sizes[i], tf.float32)
      new = tuple(body(i, xb[g], yb[g], mask, *carry))
      if bound is not None:
        active = i < limit
        new = tuple(tf.nest.map_structure(lambda n, o: tf.where(active, n, o), new, carry))
      return (g + 1,) + new

    out = tf.while_loop(lambda g, *_: tf.logical_and(g < block, first + g < last), inner,
                        (tf.constant(0),) + tuple(carry))
    return (j + 1,) + tuple(out[1:])

  out = tf.while_loop(lambda j, *_: j * block < last, outer, (tf.constant(0),) + tuple(init),
                      maximum_iterations=blocks)
  return tuple(out[1:])


# ---------------------------------------------------------------------------
# Local SGD.


class TrainResult(NamedTuple):
  """delta: w_final - w_start per weight (trainable first); num_examples,
  loss_sum: float32 (loss_sum = sum over batches of the batch's mean loss x
  its size, each taken before that batch's step); opt_state: the client
  optimizer's final state (`optimizers.Chain`'s structure)."""
  delta: List[tf.Tensor]
  num_examples: tf.Tensor
  loss_sum: tf.Tensor
  opt_state: Any

  @property
  def velocity(self) -> Optional[List[tf.Tensor]]:
    """The optimizer state as one flat list (heavy-ball's buffer, Nesterov's
    look-ahead point per trainable weight), or None when it holds nothing."""
    flat = tf.nest.flatten(self.opt_state)
    return flat or None


def sgd_step(model: tf.keras.Model, loss: str, batch, lr, optimizer, opt_state):
  """One local step on the batch `(x, y, mask)` (`mask`: None, or 1.0/0.0 per
  row, the real examples) with the bound client optimizer `optimizer`
  (`optimizers.Chain`, see `optimizers`).

  g = the gradient of the batch's mean loss over its real examples; the
  optimizer's transforms turn it into the new trainable weights (for plain
  SGD w <- w - lr g), which are assigned to the model.

  Returns (batch loss x batch size, batch size, new optimizer state).
  """
  x, y, mask = batch
  trainable = model.trainable_variables
  with tf.GradientTape() as tape:
    predictions = model(x, training=True)
    per_example = models.per_example_loss(loss, y, predictions)
    if mask is None:
      count = tf.cast(tf.shape(per_example)[0], tf.float32)
      batch_loss = tf.reduce_mean(per_example)
    else:
      count = tf.reduce_sum(mask)
      batch_loss = tf.reduce_sum(per_example * mask) / count
  grads = tape.gradient(batch_loss, trainable)
  new_weights, new_state = optimizer.update(
      trainable, grads, opt_state, lr, lambda point: _gradient_at(model, loss, x, y, mask, point))
  for var, value in zip(trainable, new_weights):
    var.assign(value)
  return batch_loss * count, count, new_state


def _gradient_at(model, loss: str, x, y, mask, point):
  """The batch's mean-loss gradient at the trainable weights `point`; the
  model's variables are put back as they were (a model without batch
  statistics: its training-mode call has no side effect)."""
  trainable = model.trainable_variables
  saved = [tf.identity(v) for v in trainable]
  for var, value in zip(trainable, point):
    var.assign(value)
  with tf.GradientTape() as tape:
    per_example = models.per_example_loss(loss, y, model(x, training=True))
    if mask is None:
      batch_loss = tf.reduce_mean(per_example)
    else:
      batch_loss = tf.reduce_sum(per_example * mask) / tf.reduce_sum(mask)
  grads = tape.gradient(batch_loss, trainable)
  for var, value in zip(trainable, saved):
    var.assign(value)
  return grads


def start_optimizer(optimizer, trainable_start, opt_state=None):
  """(the client optimizer bound to the start, its state): `opt_state` as
  given, or the optimizer's initial state. `optimizer` None is plain SGD."""
  opt = optimizers.as_chain(optimizers.sgd() if optimizer is None else optimizer)
  opt = opt.bind(trainable_start)
  state = opt.init(trainable_start) if opt_state is None else opt.canonical(opt_state)
  return opt, state


class _Trainer:
  """`train(start, data, lr, optimizer, opt_state)`: local steps from `start`
  over `data` with a client optimizer (`optimizers`)."""

  def __init__(self, model: tf.keras.Model, loss: str):
    self.model = model
    self.loss_kind = loss
    self._variables = model_variables(model)
    self._num_trainable = len(model.trainable_variables)

  def _start(self, start, optimizer, opt_state):
    for var, value in zip(self._variables, start):
      var.assign(value)
    return start_optimizer(optimizer, start[:self._num_trainable], opt_state)

  def _finish(self, start, num_examples, loss_sum, opt_state) -> TrainResult:
    delta = [var - s for var, s in zip(self._variables, start)]
    return TrainResult(delta, num_examples, loss_sum, opt_state)

  def predict(self, weights, x):
    """The model's outputs (logits) at `weights` on inputs `x` (inference mode)."""
    for var, value in zip(self._variables, weights):
      var.assign(value)
    return self.model(x, training=False)

  def train(self, start, data, lr, optimizer=None, opt_state=None) -> TrainResult:
    """Local steps from the weights `start` over `data` at learning rate `lr`
    with the client optimizer `optimizer` (a chain or transform of
    `optimizers`; None: plain SGD), its state starting at `opt_state` (None:
    the optimizer's `init` at the start)."""
    raise NotImplementedError

  def loss(self, weights, data, max_batches: int = 0):
    """(sum of per-example losses, examples) of `weights` over the first
    `max_batches` batches of `data` (0: all of them), without training
    (inference mode: BatchNorm uses its moving statistics)."""
    raise NotImplementedError

  def gradient(self, weights, data, max_batches: int = 1):
    """(mean gradient over the examples of the first `max_batches` batches of
    `data` (0: all), examples): the gradient of the mean loss at `weights`
    (trainable weights only; training mode, as a local step sees it)."""
    raise NotImplementedError

  def _batch_gradient(self, x, y, mask):
    """(gradient of the batch's summed loss, examples)."""
    trainable = self.model.trainable_variables
    with tf.GradientTape() as tape:
      per_example = models.per_example_loss(self.loss_kind, y, self.model(x, training=True))
      if mask is None:
        total = tf.reduce_sum(per_example)
        count = tf.cast(tf.shape(per_example)[0], tf.float32)
      else:
        total = tf.reduce_sum(per_example * mask)
        count = tf.reduce_sum(mask)
    return tape.gradient(total, trainable), count

  def _batch_loss(self, x, y, mask):
    per_example = models.per_example_loss(self.loss_kind, y, self.model(x, training=False))
    if mask is None:
      return tf.reduce_sum(per_example), tf.cast(tf.shape(per_example)[0], tf.float32)
    return tf.reduce_sum(per_example * mask), tf.reduce_sum(mask)


class DatasetTrainer(_Trainer):
  """Local SGD over a `tf.data.Dataset` of `{'x', 'y'}` batches (TFF runner)."""

  def train(self, start, data, lr, optimizer=None, opt_state=None) -> TrainResult:
    start = list(start)
    lr = tf.cast(lr, tf.float32)
    opt, state = self._start(start, optimizer, opt_state)

    def step(carry, batch):
      num_examples, loss_sum, state = carry
      loss_x_n, n, state = sgd_step(self.model, self.loss_kind, (batch["x"], batch["y"], None),
                                    lr, opt, state)
      return num_examples + n, loss_sum + loss_x_n, state

    num_examples, loss_sum, state = data.reduce(
        (tf.constant(0.0), tf.constant(0.0), state), step)
    return self._finish(start, num_examples, loss_sum, state)

  def loss(self, weights, data, max_batches: int = 0):
    for var, value in zip(self._variables, weights):
      var.assign(value)
    if max_batches:
      data = data.take(max_batches)

    def add(carry, batch):
      loss_sum, count = self._batch_loss(batch["x"], batch["y"], None)
      return carry[0] + loss_sum, carry[1] + count

    return data.reduce((tf.constant(0.0), tf.constant(0.0)), add)

  def gradient(self, weights, data, max_batches: int = 1):
    for var, value in zip(self._variables, weights):
      var.assign(value)
    if max_batches:
      data = data.take(max_batches)
    zeros = tuple(tf.zeros_like(v) for v in self.model.trainable_variables)

    def add(carry, batch):
      grads, count = self._batch_gradient(batch["x"], batch["y"], None)
      return tuple(a + g for a, g in zip(carry[0], grads)), carry[1] + count

    total, count = data.reduce((zeros, tf.constant(0.0)), add)
    return [t / tf.maximum(count, 1.0) for t in total], count


class PaddedTrainer(_Trainer):
  """Local SGD over `PaddedBatches` into the arrays `x`, `y` (local runner).

  With `exact_batches` (models with batch statistics) each batch is sliced to
  its real size (dynamic shapes: not XLA-compilable); otherwise every batch
  has the full size and padded rows get weight 0 in the mean loss, which
  gives the same gradients as the real-size batch.
  """

  def __init__(self, model, loss, x, y, exact_batches: bool = False):
    super().__init__(model, loss)
    self._x = x
    self._y = y
    self._exact = exact_batches

  def _batch(self, data: PaddedBatches, i):
    """(x, y, mask) of batch i: its real rows when `exact_batches`, else the
    full padded batch with 1.0/0.0 row weights."""
    if self._exact:
      rows, mask = data.indices[i, :data.sizes[i]], None
    else:
      rows = data.indices[i]
      mask = tf.cast(tf.range(tf.shape(data.indices)[1]) < data.sizes[i], tf.float32)
    return tf.gather(self._x, rows), tf.gather(self._y, rows), mask

  def train(self, start, data: PaddedBatches, lr, optimizer=None,
            opt_state=None) -> TrainResult:
    start = list(start)
    lr = tf.cast(lr, tf.float32)
    opt, state = self._start(start, optimizer, opt_state)

    def step(x, y, mask, num_examples, loss_sum, state):
      loss_x_n, n, state = sgd_step(self.model, self.loss_kind, (x, y, mask), lr, opt, state)
      return num_examples + n, loss_sum + loss_x_n, state

    num_examples, loss_sum, state = self._batches(
        data, data.num_steps, step, (tf.constant(0.0), tf.constant(0.0), state))
    return self._finish(start, num_examples, loss_sum, state)

  def _batches(self, data: PaddedBatches, limit, step, init):
    """`carry = step(x, y, mask, *carry)` over batches 0..limit-1: their rows
    gathered in blocks (`batch_loop`), or, with `exact_batches`, each batch
    sliced to its real size (mask None)."""
    if not self._exact:
      return batch_loop(self._x, self._y, data, limit,
                        lambda i, x, y, mask, *carry: step(x, y, mask, *carry), init)

    def body(i, *carry):
      x, y, mask = self._batch(data, i)
      return (i + 1,) + tuple(step(x, y, mask, *carry))

    # The padded length bounds the loop: a static bound, so one compiled loop
    # serves every client.
    out = tf.while_loop(lambda i, *_: i < limit, body, (tf.constant(0),) + tuple(init),
                        maximum_iterations=data.indices.shape[0])
    return tuple(out[1:])

  def gradient(self, weights, data: PaddedBatches, max_batches: int = 1):
    for var, value in zip(self._variables, weights):
      var.assign(value)
    limit = data.num_steps if not max_batches else tf.minimum(data.num_steps, max_batches)
    zeros = tuple(tf.zeros_like(v) for v in self.model.trainable_variables)

    def step(x, y, mask, total, count):
      grads, n = self._batch_gradient(x, y, mask)
      return tuple(a + g for a, g in zip(total, grads)), count + n

    total, count = self._batches(data, limit, step, (zeros, tf.constant(0.0)))
    return [t / tf.maximum(count, 1.0) for t in total], count

  def loss(self, weights, data: PaddedBatches, max_batches: int = 0):
    for var, value in zip(self._variables, weights):
      var.assign(value)
    limit = data.num_steps if not max_batches else tf.minimum(data.num_steps, max_batches)

    def step(x, y, mask, loss_sum, count):
      batch_loss, n = self._batch_loss(x, y, mask)
      return loss_sum + batch_loss, count + n

    return self._batches(data, limit, step, (tf.constant(0.0), tf.constant(0.0)))


def build_local_sgd(model: tf.keras.Model, loss: str, momentum: float = 0.0):
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


# ---------------------------------------------------------------------------
# Local SGD as pure functions of the weights (clients side by side).


class UnsupportedModel(ValueError):
  """The model cannot be written as a function of its weights here."""


# The layers a stateless forward pass is written for.
CHAIN_LAYERS = "Dense, Flatten, Reshape and Activation layers"


def chain_problem(model: tf.keras.Model) -> Optional[str]:
  """Why `model` cannot be a `stateless_forward` chain, read from its class
  and its layers' types alone (so also for a model without weights yet), or
  None when it may be one (`stateless_forward` then checks the chain against
  the model's own call)."""
  if not is_layer_graph(model):
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
  of its weight list (`model_variables` order), for a `keras.Sequential` or
  functional model that is a chain of Dense, Flatten, Reshape and Activation
  layers (MCLR, the MLPs); raises `UnsupportedModel` naming why not
  (`chain_problem`: a subclassed model, the first other layer).

  Nothing is read from or written to a Keras variable, so the function can
  be vectorized over clients (`tf.vectorized_map`) with a weight list per
  client. The chain is checked against the model's own call on random
  inputs of one example's `input_spec` (default the model's declared input,
  `model_input_spec`), equal to 1e-5, so a model whose layers are not one
  chain is refused rather than computed wrongly. `forward.activations` is
  the number of floats of one example's activations (its input and every
  layer's output), for the memory estimate of a chunk of clients.
  """
  problem = chain_problem(model)
  if problem is not None:
    raise UnsupportedModel(problem)
  if not has_weights(model):
    raise UnsupportedModel("it has no weights yet (build it for its input shape first)")
  spec = model_input_spec(model) if input_spec is None else input_spec
  if spec is None:
    raise UnsupportedModel("its input shape is unknown")
  if spec.dtype != tf.float32:
    raise UnsupportedModel(f"its input is {spec.dtype.name}, not float32")
  if any(d is None for d in spec.shape):
    raise UnsupportedModel(f"its input shape {tuple(spec.shape)} is not fixed")
  variables = model_variables(model)

  def index_of(weight):
    try:
      return weight_index(variables, weight)
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
  """`PaddedTrainer`'s local SGD with the weights as loop values, not Keras
  variables: the same batches, masks and update rule (`sgd_step`'s, term
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

  def _loop(self, data: PaddedBatches, limit, step, init):
    """`carry = step(x, y, mask, *carry)` over batches 0..limit-1
    (`batch_loop`, with this trainer's `bound`)."""
    return batch_loop(self._x, self._y, data, limit,
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

  def train(self, start, data: PaddedBatches, lr, optimizer=None,
            opt_state=None) -> TrainResult:
    start = [tf.convert_to_tensor(w) for w in start]
    nt = self._num_trainable
    rest = start[nt:]
    lr = tf.cast(lr, tf.float32)
    opt, state0 = start_optimizer(optimizer, start[:nt], opt_state)

    def body(x, y, mask, w, num_examples, loss_sum, state):
      grads, batch_loss, count = self._grad(w, rest, x, y, mask)
      new_w, state = opt.update(w, grads, state, lr,
                                lambda point: self._grad(list(point), rest, x, y, mask)[0])
      return (tuple(new_w), num_examples + count, loss_sum + batch_loss * count, state)

    w, num_examples, loss_sum, state = self._loop(
        data, data.num_steps, body,
        (tuple(start[:nt]), tf.constant(0.0), tf.constant(0.0), state0))
    final = list(w) + rest
    return TrainResult([f - s for f, s in zip(final, start)], num_examples, loss_sum, state)

  def gradient(self, weights, data: PaddedBatches, max_batches: int = 1):
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

  def loss(self, weights, data: PaddedBatches, max_batches: int = 0):
    weights = [tf.convert_to_tensor(w) for w in weights]
    limit = data.num_steps if not max_batches else tf.minimum(data.num_steps, max_batches)

    def body(x, y, mask, loss_sum, count):
      per_example = models.per_example_loss(self.loss_kind, y, self.forward(weights, x))
      return loss_sum + tf.reduce_sum(per_example * mask), count + tf.reduce_sum(mask)

    return self._loop(data, limit, body, (tf.constant(0.0), tf.constant(0.0)))
