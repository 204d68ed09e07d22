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

import contextlib
from typing import Any, Callable, List, NamedTuple, Optional, Sequence

import tensorflow as tf

from tff_cluster import models
from tff_cluster.learning import layer_forms
from tff_cluster.learning import optimizers
from tff_cluster.learning import schedule


class TrainResult(NamedTuple):
  """delta: w_final - w_start per weight (trainable first); num_examples,
  loss_sum: float32 (loss_sum = sum over batches of the batch's mean loss x
  its size, each taken before that batch's step); opt_state: the client
  optimizer's final state (`optimizers.Chain`'s structure); step_losses:
  with `train(..., trajectory=T)`, [T] float32, step t's batch mean loss
  (before its step; 0 for steps the client does not take: it takes
  `LocalWork.num_steps` of its data), else None."""
  delta: List[tf.Tensor]
  num_examples: tf.Tensor
  loss_sum: tf.Tensor
  opt_state: Any
  step_losses: Any = None

  @property
  def velocity(self) -> Optional[List[tf.Tensor]]:
    """The optimizer state as one flat list (heavy-ball's buffer, Nesterov's
    look-ahead point per trainable weight), or None when it holds nothing."""
    flat = tf.nest.flatten(self.opt_state)
    return flat or None


class ExampleWeights(NamedTuple):
  """Per-example weights of the local loss, computed from each batch (FedEM's
  responsibilities, FedRC's robust weights): `frozen` is a list of F fixed
  models (weight lists, trainable then non-trainable); `fn(losses, y)` maps
  their per-example losses on the batch, [F, b] (inference mode), and the
  labels [b] to the weights [b] (for `example_sums`: [width, b]). A weighted
  step's loss is sum_i w_i l_i / (real examples): the weights are not
  normalised."""
  frozen: Sequence[Sequence[tf.Tensor]]
  fn: Callable
  width: int = 1
  # `heads` (kernels [F, d, C], biases [F, C]): the F losses are those of one
  # model, `frozen`'s single weight list, through F heads in place of its last
  # Dense layer (HCFL+'s shared extractor and cluster heads). `rows`: `fn`
  # also takes each example's row in the client's training data, int32 [b]
  # (per-example state kept between rounds); the trainers' data must carry
  # them (a definition's `example_rows`).
  heads: Any = None
  rows: bool = False


class HeadMixture(NamedTuple):
  """A local step's loss through F heads at once (HCFL+'s extractor phase):
  each example's loss is sum_f w_f l(head_f(z)), z the input of the model's
  last Dense layer, head_f that layer with `kernels[f]` [d, C] and
  `biases[f]` [C] (its activation kept); the weights w [F, b] are
  `weights`' (an `ExampleWeights`, `fn` of the frozen losses)."""
  kernels: tf.Tensor
  biases: tf.Tensor
  weights: ExampleWeights


class FeatureAlignment(NamedTuple):
  """A pull of each example's features toward its class's target: `coef`
  times the mean over the feature dimension of (z - targets[y])^2 is added
  to each example's loss, z the input of the model's last Dense layer
  (FedPAC's alignment: `nn.MSELoss` over the batch's B x d entries).
  `targets` [classes, d]; `coef` a scalar (a tensor: per client)."""
  targets: tf.Tensor
  coef: tf.Tensor


def feature_model(model: tf.keras.Model) -> tf.keras.Model:
  """A model of the same layers (the same variables) returning (outputs,
  the input of the last Dense layer); a subclassed model is refused."""
  if not models.is_layer_graph(model):
    raise ValueError(f"features need a functional or Sequential model; {type(model).__name__} "
                     "is subclassed")
  last = models.last_dense_layer(model)
  return tf.keras.Model(model.inputs, [model.outputs[0], last.input])


def head_losses(features: tf.keras.Model, loss: str, x, y, kernels, biases,
                training: bool) -> tf.Tensor:
  """[F, b]: each example's loss through each head (`HeadMixture`):
  `features` is the model's `feature_model`."""
  z = features(x, training=training)[1]
  last = models.last_dense_layer(features)
  logits = tf.einsum("bd,fdc->fbc", z, kernels) + biases[:, None, :]
  outputs = last.activation(logits) if last.activation is not None else logits
  return tf.stack([models.per_example_loss(loss, y, outputs[f])
                   for f in range(outputs.shape[0])])


def sgd_step(model: tf.keras.Model, loss: str, batch, lr, optimizer, opt_state,
             weight_fn=None, alignment=None, mixture=None):
  """One local step on the batch `(x, y, mask)` (`mask`: None, or 1.0/0.0 per
  row, the real examples) with the bound client optimizer `optimizer`
  (`optimizers.Chain`, see `optimizers`).

  g = the gradient of the batch's mean loss over its real examples; the
  optimizer's transforms turn it into the new trainable weights (for plain
  SGD w <- w - lr g), which are assigned to the model. `weight_fn(x, y)`
  (None: 1) weighs each example's loss (`ExampleWeights`); `alignment`
  (None, or (the model's `feature_model`, a `FeatureAlignment`)) adds its
  feature term to each example's loss; `mixture` (None, or (the model's
  `feature_model`, a `HeadMixture`)) takes each example's loss through its
  heads, weighted by `weight_fn`'s [F, b].

  Returns (batch loss x batch size, batch size, new optimizer state).
  """
  x, y, mask = batch
  trainable = model.trainable_variables
  weights = None if weight_fn is None else tf.stop_gradient(weight_fn(x, y))
  with tf.GradientTape() as tape:
    if mixture is not None:
      heads = mixture[1]
      per_example = tf.reduce_sum(weights * head_losses(
          mixture[0], loss, x, y, heads.kernels, heads.biases, training=True), axis=0)
    else:
      if alignment is None:
        predictions = model(x, training=True)
      else:
        predictions, z = alignment[0](x, training=True)
      per_example = models.per_example_loss(loss, y, predictions)
    if weights is not None and mixture is None:
      per_example = per_example * weights
    if alignment is not None:
      term = alignment[1]
      per_example = per_example + term.coef * tf.reduce_mean(
          tf.square(z - tf.gather(term.targets, tf.cast(y, tf.int32))), axis=-1)
    if mask is None:
      count = tf.cast(tf.shape(per_example)[0], tf.float32)
      batch_loss = tf.reduce_mean(per_example)
    else:
      count = tf.reduce_sum(mask)
      batch_loss = tf.reduce_sum(per_example * mask) / count
  if mixture is None:
    grads = dense(tape.gradient(batch_loss, trainable))
  else:  # the model's own head is not in the loss: a zero gradient
    grads = [tf.zeros(v.shape, v.dtype) if g is None else g
             for g, v in zip(dense(tape.gradient(batch_loss, trainable)), trainable)]
  if mixture is None:
    gradient_at = optimizers.GradientAt(
        lambda point: _gradient_at(model, loss, x, y, mask, point, weights),
        lambda point, other, alpha: _mixed_gradient_at(model, loss, x, y, mask, point,
                                                       other, alpha))
  else:
    gradient_at = optimizers.GradientAt(_no_gradient_at, _no_gradient_at)
  new_weights, new_state = optimizer.update(grads, opt_state, trainable, lr, gradient_at)
  _assign(trainable, new_weights)
  return batch_loss * count, count, new_state


def _no_gradient_at(*_):
  raise ValueError("a local step that takes gradients at other points (pFedMe's, APFL's, "
                   "Per-FedAvg's) does not run with losses through several heads; valid: "
                   "SGD or heavy-ball momentum")


def _gradient_at(model, loss: str, x, y, mask, point, weights=None):
  """The batch's mean-loss gradient at the trainable weights `point`; the
  model's variables are put back as they were (a model without batch
  statistics: its training-mode call has no side effect)."""
  trainable = model.trainable_variables
  with _put_back(trainable):
    _assign(trainable, point)
    with tf.GradientTape() as tape:
      per_example = models.per_example_loss(loss, y, model(x, training=True))
      if weights is not None:
        per_example = per_example * weights
      if mask is None:
        batch_loss = tf.reduce_mean(per_example)
      else:
        batch_loss = tf.reduce_sum(per_example * mask) / tf.reduce_sum(mask)
    return dense(tape.gradient(batch_loss, trainable))


def dense(grads):
  """`grads` with every `tf.IndexedSlices` (a trainable embedding's gradient,
  the rows looked up) as a dense tensor, the form the optimizers' and the
  algorithms' arithmetic takes; other gradients as they are."""
  return [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]


@contextlib.contextmanager
def _put_back(variables):
  """Inside, `variables` may be assigned other values; on leaving they hold
  the values they had on entering."""
  saved = [tf.identity(v) for v in variables]
  yield
  _assign(variables, saved)


def _assign(variables, values) -> None:
  for var, value in zip(variables, values):
    var.assign(value)


def _mixed_gradient_at(model, loss: str, x, y, mask, point, other, alpha):
  """The batch's mean-loss gradients at the trainable weights `point` and
  `other` of the mixed outputs alpha f(point; x) + (1 - alpha) f(other; x)
  (APFL's personal prediction); the variables are put back as they were."""
  trainable = model.trainable_variables
  with _put_back(trainable):
    tapes, outputs = [], []
    for values in (point, other):
      _assign(trainable, values)
      with tf.GradientTape() as tape:
        outputs.append(model(x, training=True))
      tapes.append(tape)
    with tf.GradientTape() as tape:
      tape.watch(outputs)
      mixed = alpha * outputs[0] + (1.0 - alpha) * outputs[1]
      per_example = models.per_example_loss(loss, y, mixed)
      if mask is None:
        batch_loss = tf.reduce_mean(per_example)
      else:
        batch_loss = tf.reduce_sum(per_example * mask) / tf.reduce_sum(mask)
    upstream = tape.gradient(batch_loss, outputs)
    grads = [dense(t.gradient(o, trainable, output_gradients=u))
             for t, o, u in zip(tapes, outputs, upstream)]
  return grads[0], grads[1]


def empty_trajectory(length: int) -> tf.Tensor:
  """[length] zeros: a trajectory before its steps (`TrainResult.step_losses`)."""
  return tf.zeros([int(length)], tf.float32)


def record_step(losses: tf.Tensor, k, batch_loss) -> tf.Tensor:
  """`losses` with step k's batch mean loss at index k (none past its end)."""
  if losses.shape[0] == 0:
    return losses
  return tf.where(tf.range(tf.shape(losses)[0]) == k, tf.cast(batch_loss, tf.float32), losses)


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
    self._variables = models.model_variables(model)
    self._num_trainable = len(model.trainable_variables)

  def _start(self, start, optimizer, opt_state):
    _assign(self._variables, start)
    return start_optimizer(optimizer, start[:self._num_trainable], opt_state)

  def _features(self):
    """The model's `feature_model`, made when first needed."""
    if getattr(self, "_feature_model", None) is None:
      self._feature_model = feature_model(self.model)
    return self._feature_model

  def _alignment(self, alignment: Optional[FeatureAlignment]):
    return None if alignment is None else (self._features(), alignment)

  def _feature_batch(self, x, y, mask, num_classes: int):
    """(per-class sums of the features [C, d], of their squared norms [C],
    counts [C]) of the batch's real examples (inference mode)."""
    z = self._features()(x, training=False)[1]
    onehot = tf.one_hot(tf.cast(y, tf.int32), num_classes, dtype=z.dtype)
    if mask is not None:
      onehot = onehot * mask[:, None]
    return (tf.matmul(onehot, z, transpose_a=True),
            tf.linalg.matvec(onehot, tf.reduce_sum(tf.square(z), axis=-1), transpose_a=True),
            tf.reduce_sum(onehot, axis=0))

  def feature_sums(self, weights, data, num_classes: int, max_batches: int = 0):
    """(per-class sums of the features (the last Dense layer's input) [C, d],
    of their squared norms [C], counts [C]) at `weights` over the real
    examples of the first `max_batches` batches of `data` (0: all),
    inference mode."""
    raise NotImplementedError

  def _finish(self, start, num_examples, loss_sum, opt_state, step_losses=None) -> TrainResult:
    delta = [var - s for var, s in zip(self._variables, start)]
    return TrainResult(delta, num_examples, loss_sum, opt_state, step_losses)

  def predict(self, weights, x):
    """The model's outputs (logits) at `weights` on inputs `x` (inference mode)."""
    _assign(self._variables, weights)
    return self.model(x, training=False)

  def frozen_losses(self, frozen, x, y, heads=None):
    """[F, b]: the per-example losses of the F weight lists `frozen` on the
    batch (inference mode), or with `heads` of `frozen`'s one weight list
    through each head (`ExampleWeights.heads`); the model's variables are put
    back as they were."""
    out = []
    with _put_back(self._variables):
      if heads is not None:
        _assign(self._variables, frozen[0])
        return head_losses(self._features(), self.loss_kind, x, y, heads[0], heads[1],
                           training=False)
      for weights in frozen:
        _assign(self._variables, weights)
        out.append(models.per_example_loss(self.loss_kind, y, self.model(x, training=False)))
    return tf.stack(out)

  def _weight_fn(self, example_weights: Optional[ExampleWeights], rows=None):
    """(x, y) -> the batch's example weights; `rows` the batch's rows in the
    client's data where `example_weights.rows` asks for them."""
    if example_weights is None:
      return None
    if example_weights.rows and rows is None:
      raise ValueError("these example weights read each example's row; the client's "
                       "data carries none (the definition's example_rows is not set)")

    def fn(x, y):
      losses = self.frozen_losses(example_weights.frozen, x, y, example_weights.heads)
      if example_weights.rows:
        return example_weights.fn(losses, y, rows)
      return example_weights.fn(losses, y)
    return fn

  def _mixture(self, mixture: Optional[HeadMixture]):
    return None if mixture is None else (self._features(), mixture)

  def train(self, start, data, lr, optimizer=None, opt_state=None,
            example_weights: Optional[ExampleWeights] = None,
            alignment: Optional[FeatureAlignment] = None,
            trajectory: int = 0, mixture: Optional[HeadMixture] = None) -> TrainResult:
    """Local steps from the weights `start` over `data` at learning rate `lr`
    with the client optimizer `optimizer` (a chain or transform of
    `optimizers`; None: plain SGD), its state starting at `opt_state` (None:
    the optimizer's `init` at the start); `example_weights` weighs each
    example's loss; `alignment` adds a feature term to it; `trajectory` > 0
    records the first that many steps' batch losses (`TrainResult`);
    `mixture` takes each example's loss through several heads (its weights
    then `mixture.weights`, not `example_weights`)."""
    raise NotImplementedError

  def example_table(self, example_weights: ExampleWeights, data, num_rows: int):
    """[num_rows, width]: row r holds `example_weights.fn(losses, y, rows)`'s
    column of the example in row r of the client's data, for every example
    the round's batches visit (the frozen models give each the same value
    on every visit), zeros for the others; `example_weights.rows` must be
    set."""
    raise NotImplementedError

  def example_sums(self, example_weights: ExampleWeights, data, max_batches: int = 0):
    """(sum over the real examples of the first `max_batches` batches of
    `data` (0: all) of `example_weights.fn(losses, y)` [K, b] -> [K],
    examples)."""
    raise NotImplementedError

  def _sum_batch(self, example_weights: ExampleWeights, x, y, mask, rows=None):
    values = self._weight_fn(example_weights, rows)(x, y)
    if mask is None:
      return tf.reduce_sum(values, axis=-1), tf.cast(tf.shape(y)[0], tf.float32)
    return tf.reduce_sum(values * mask, axis=-1), tf.reduce_sum(mask)

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
    return dense(tape.gradient(total, trainable)), count

  def _batch_loss(self, x, y, mask):
    per_example = models.per_example_loss(self.loss_kind, y, self.model(x, training=False))
    if mask is None:
      return tf.reduce_sum(per_example), tf.cast(tf.shape(per_example)[0], tf.float32)
    return tf.reduce_sum(per_example * mask), tf.reduce_sum(mask)


class DatasetTrainer(_Trainer):
  """Local SGD over a `tf.data.Dataset` of `{'x', 'y'}` batches (TFF runner)."""

  def train(self, start, data, lr, optimizer=None, opt_state=None,
            example_weights=None, alignment=None, trajectory: int = 0,
            mixture=None) -> TrainResult:
    start = list(start)
    lr = tf.cast(lr, tf.float32)
    opt, state = self._start(start, optimizer, opt_state)
    weighting = example_weights if mixture is None else mixture.weights
    align = self._alignment(alignment)
    mix = self._mixture(mixture)

    def step(carry, batch):
      num_examples, loss_sum, state, k, losses = carry
      weight_fn = self._weight_fn(weighting, batch.get("i"))
      loss_x_n, n, state = sgd_step(self.model, self.loss_kind, (batch["x"], batch["y"], None),
                                    lr, opt, state, weight_fn, align, mix)
      return (num_examples + n, loss_sum + loss_x_n, state, k + 1,
              record_step(losses, k, loss_x_n / n))

    num_examples, loss_sum, state, _, losses = data.reduce(
        (tf.constant(0.0), tf.constant(0.0), state, tf.constant(0), empty_trajectory(trajectory)),
        step)
    return self._finish(start, num_examples, loss_sum, state, losses if trajectory else None)

  def example_sums(self, example_weights, data, max_batches: int = 0):
    if max_batches:
      data = data.take(max_batches)

    def add(carry, batch):
      sums, count = self._sum_batch(example_weights, batch["x"], batch["y"], None,
                                    batch.get("i"))
      return carry[0] + sums, carry[1] + count

    return data.reduce((tf.zeros([example_weights.width]), tf.constant(0.0)), add)

  def example_table(self, example_weights, data, num_rows: int):
    def add(table, batch):
      rows = tf.cast(batch["i"], tf.int32)
      values = self._weight_fn(example_weights, rows)(batch["x"], batch["y"])
      return tf.tensor_scatter_nd_update(table, rows[:, None], tf.transpose(values))

    return data.reduce(tf.zeros([int(num_rows), example_weights.width]), add)

  def loss(self, weights, data, max_batches: int = 0):
    _assign(self._variables, weights)
    if max_batches:
      data = data.take(max_batches)

    def add(carry, batch):
      loss_sum, count = self._batch_loss(batch["x"], batch["y"], None)
      return carry[0] + loss_sum, carry[1] + count

    return data.reduce((tf.constant(0.0), tf.constant(0.0)), add)

  def feature_sums(self, weights, data, num_classes: int, max_batches: int = 0):
    _assign(self._variables, weights)
    if max_batches:
      data = data.take(max_batches)
    d = self._features().outputs[1].shape[-1]

    def add(carry, batch):
      out = self._feature_batch(batch["x"], batch["y"], None, num_classes)
      return tuple(a + b for a, b in zip(carry, out))

    return data.reduce((tf.zeros([num_classes, d]), tf.zeros([num_classes]),
                        tf.zeros([num_classes])), add)

  def gradient(self, weights, data, max_batches: int = 1):
    _assign(self._variables, weights)
    if max_batches:
      data = data.take(max_batches)
    zeros = tuple(tf.zeros_like(v) for v in self.model.trainable_variables)

    def add(carry, batch):
      grads, count = self._batch_gradient(batch["x"], batch["y"], None)
      return tuple(a + g for a, g in zip(carry[0], grads)), carry[1] + count

    total, count = data.reduce((zeros, tf.constant(0.0)), add)
    return [t / tf.maximum(count, 1.0) for t in total], count


class PaddedTrainer(_Trainer):
  """Local SGD over `schedule.PaddedBatches` into the arrays `x`, `y` (local runner).

  With `exact_batches` (models with batch statistics) each batch is sliced to
  its real size (dynamic shapes: not XLA-compilable); otherwise every batch
  has the full size and padded rows get weight 0 in the mean loss, which
  gives the same gradients as the real-size batch.

  A Keras 3 model's Dropout layers draw from `layer_forms`' per-client hash,
  their seed states set to the client's round seed (`data.seed`) when
  training or taking a gradient starts: the masks `FunctionalTrainer` draws
  side by side.
  """

  def __init__(self, model, loss, x, y, exact_batches: bool = False):
    super().__init__(model, loss)
    self._x = x
    self._y = y
    self._exact = exact_batches
    self._dropout = layer_forms.install_dropout(model)

  def _seed(self, data: schedule.PaddedBatches) -> None:
    if self._dropout and getattr(data, "seed", None) is not None:
      layer_forms.reset_dropout_seeds(self.model, data.seed)

  def _batch(self, data: schedule.PaddedBatches, i):
    """(x, y, mask) of batch i: its real rows when `exact_batches`, else the
    full padded batch with 1.0/0.0 row weights."""
    if self._exact:
      rows, mask = data.indices[i, :data.sizes[i]], None
    else:
      rows = data.indices[i]
      mask = tf.cast(tf.range(tf.shape(data.indices)[1]) < data.sizes[i], tf.float32)
    return schedule.gather_rows(self._x, rows), tf.gather(self._y, rows), mask

  def train(self, start, data: schedule.PaddedBatches, lr, optimizer=None,
            opt_state=None, example_weights=None, alignment=None,
            trajectory: int = 0, mixture=None) -> TrainResult:
    start = list(start)
    lr = tf.cast(lr, tf.float32)
    opt, state = self._start(start, optimizer, opt_state)
    self._seed(data)
    weighting = example_weights if mixture is None else mixture.weights
    align = self._alignment(alignment)
    mix = self._mixture(mixture)

    def step(i, x, y, mask, num_examples, loss_sum, state, k, losses):
      weight_fn = self._weight_fn(weighting, self._rows(data, i, weighting))
      loss_x_n, n, state = sgd_step(self.model, self.loss_kind, (x, y, mask), lr, opt, state,
                                    weight_fn, align, mix)
      return (num_examples + n, loss_sum + loss_x_n, state, k + 1,
              record_step(losses, k, loss_x_n / n))

    num_examples, loss_sum, state, _, losses = self._batches(
        data, data.num_steps, step,
        (tf.constant(0.0), tf.constant(0.0), state, tf.constant(0),
         empty_trajectory(trajectory)), with_index=True)
    return self._finish(start, num_examples, loss_sum, state, losses if trajectory else None)

  def _rows(self, data: schedule.PaddedBatches, i, example_weights):
    """Batch i's rows in the client's data (`ExampleWeights.rows`), or None."""
    if example_weights is None or not example_weights.rows:
      return None
    if data.offset is None:
      raise ValueError("these example weights read each example's row; the batches carry "
                       "no offset")
    rows = data.indices[i] - tf.cast(data.offset, data.indices.dtype)
    if self._exact:
      rows = rows[:data.sizes[i]]
    return tf.cast(rows, tf.int32)

  def _batches(self, data: schedule.PaddedBatches, limit, step, init, with_index=False):
    """`carry = step(x, y, mask, *carry)` (with `with_index`: `step(i, x, y,
    mask, *carry)`) over batches 0..limit-1: their rows gathered in blocks
    (`schedule.batch_loop`), or, with `exact_batches`, each batch sliced to
    its real size (mask None)."""
    call = step if with_index else (lambda i, x, y, mask, *carry: step(x, y, mask, *carry))
    if not self._exact:
      return schedule.batch_loop(self._x, self._y, data, limit, call, init)

    def body(i, *carry):
      x, y, mask = self._batch(data, i)
      return (i + 1,) + tuple(call(i, x, y, mask, *carry))

    # The padded length bounds the loop: a static bound, so one compiled loop
    # serves every client.
    out = tf.while_loop(lambda i, *_: i < limit, body, (tf.constant(0),) + tuple(init),
                        maximum_iterations=data.indices.shape[0])
    return tuple(out[1:])

  def gradient(self, weights, data: schedule.PaddedBatches, max_batches: int = 1):
    _assign(self._variables, weights)
    self._seed(data)
    limit = data.num_steps if not max_batches else tf.minimum(data.num_steps, max_batches)
    zeros = tuple(tf.zeros_like(v) for v in self.model.trainable_variables)

    def step(x, y, mask, total, count):
      grads, n = self._batch_gradient(x, y, mask)
      return tuple(a + g for a, g in zip(total, grads)), count + n

    total, count = self._batches(data, limit, step, (zeros, tf.constant(0.0)))
    return [t / tf.maximum(count, 1.0) for t in total], count

  def loss(self, weights, data: schedule.PaddedBatches, max_batches: int = 0):
    _assign(self._variables, weights)
    limit = data.num_steps if not max_batches else tf.minimum(data.num_steps, max_batches)

    def step(x, y, mask, loss_sum, count):
      batch_loss, n = self._batch_loss(x, y, mask)
      return loss_sum + batch_loss, count + n

    return self._batches(data, limit, step, (tf.constant(0.0), tf.constant(0.0)))

  def feature_sums(self, weights, data: schedule.PaddedBatches, num_classes: int,
                   max_batches: int = 0):
    _assign(self._variables, weights)
    limit = data.num_steps if not max_batches else tf.minimum(data.num_steps, max_batches)
    d = self._features().outputs[1].shape[-1]

    def step(x, y, mask, *carry):
      out = self._feature_batch(x, y, mask, num_classes)
      return tuple(a + b for a, b in zip(carry, out))

    return self._batches(data, limit, step, (tf.zeros([num_classes, d]),
                                             tf.zeros([num_classes]), tf.zeros([num_classes])))

  def example_sums(self, example_weights, data: schedule.PaddedBatches, max_batches: int = 0):
    limit = data.num_steps if not max_batches else tf.minimum(data.num_steps, max_batches)

    def step(i, x, y, mask, sums, count):
      s, n = self._sum_batch(example_weights, x, y, mask,
                             self._rows(data, i, example_weights))
      return sums + s, count + n

    return self._batches(data, limit, step,
                         (tf.zeros([example_weights.width]), tf.constant(0.0)),
                         with_index=True)

  def example_table(self, example_weights, data: schedule.PaddedBatches, num_rows: int):
    def step(i, x, y, mask, table):
      rows = self._rows(data, i, example_weights)
      values = tf.transpose(self._weight_fn(example_weights, rows)(x, y))  # [b, width]
      if mask is not None:  # padded slots (row 0 again) write to the spare last row
        rows = tf.where(mask > 0, rows, tf.fill(tf.shape(rows), int(num_rows)))
      return (tf.tensor_scatter_nd_update(table, rows[:, None], values),)

    table = self._batches(data, data.num_steps, step,
                          (tf.zeros([int(num_rows) + 1, example_weights.width]),),
                          with_index=True)[0]
    return table[:int(num_rows)]


# ---------------------------------------------------------------------------
# Local SGD as pure functions of the weights (clients side by side).
