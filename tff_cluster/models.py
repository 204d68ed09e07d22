"""Keras models of the papers' experiments, and the losses they train with.

TensorFlow is imported when a model is first built, not with this module.

Every builder returns a *built* model (an `Input` layer fixes the shapes) so
its variables exist before any TFF computation or tf.function touches them.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from tff_cluster.data.federated import DataError


class _LazyTensorFlow:
  """`tf`, imported on first use: tasks name these builders (and the CLI lists
  tasks) without importing TensorFlow, so `--help` and flag errors are fast."""

  def __getattr__(self, name):
    import tensorflow
    return getattr(tensorflow, name)


tf = _LazyTensorFlow()

SPARSE_CE_LOGITS = "sparse_ce_logits"
BINARY_PROBS = "binary_probs"
# Next-token prediction: labels [n, T] token ids (0 = padding), logits [n, T, V].
SEQUENCE_CE_LOGITS = "sequence_ce_logits"
LOSSES = (SPARSE_CE_LOGITS, BINARY_PROBS, SEQUENCE_CE_LOGITS)
PAD = 0  # the padding id of SEQUENCE_CE_LOGITS labels


def mclr(input_dim: int, num_classes: int, name: str = "mclr") -> tf.keras.Model:
  """Multinomial logistic regression: one dense layer, logits out.

  Synthetic 60->10 has 610 parameters; MNIST 784->10 has 7,850.
  """
  inputs = tf.keras.Input(shape=(input_dim,), dtype=tf.float32)
  logits = tf.keras.layers.Dense(num_classes, name="logits")(inputs)
  return tf.keras.Model(inputs, logits, name=name)


def per_example_loss(kind: str, y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
  """Loss of each example, shape [batch]. SEQUENCE_CE_LOGITS: the
  cross-entropy averaged over all of a sequence's positions, padding
  included (target PAD, which the model learns to predict after a sequence's
  end). That is TFF's Shakespeare loss: its Keras loss would average over the
  positions the model's mask keeps, but TFF's forward pass takes the model's
  outputs from a `tf.function`, which drops the mask (tested)."""
  if kind == SPARSE_CE_LOGITS:
    return tf.keras.losses.sparse_categorical_crossentropy(
        tf.cast(y_true, tf.int32), y_pred, from_logits=True)
  if kind == BINARY_PROBS:
    y = tf.reshape(tf.cast(y_true, y_pred.dtype), [-1, 1])
    return tf.keras.losses.binary_crossentropy(y, y_pred)
  if kind == SEQUENCE_CE_LOGITS:
    return tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
        tf.cast(y_true, tf.int32), y_pred, from_logits=True), axis=-1)
  raise ValueError(f"unknown loss {kind!r}; valid: {', '.join(LOSSES)}")


def sequence_stats(y_true: tf.Tensor, logits: tf.Tensor):
  """(correct, loss, predicted) at every non-padding target of a
  SEQUENCE_CE_LOGITS batch (labels [n, T], logits [n, T, V]), flattened in
  row-major order: 1.0/0.0 float64 whether the argmax of the logits is the
  target, the cross-entropy there (float64), the argmax (int32). A
  character is what an accuracy counts (TFF's Shakespeare accuracy masks the
  padding targets)."""
  y = tf.cast(y_true, tf.int32)
  real = tf.not_equal(y, PAD)
  predicted = tf.argmax(logits, axis=-1, output_type=tf.int32)
  ce = tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
  correct = tf.cast(tf.equal(predicted, y), tf.float64)
  return (tf.boolean_mask(correct, real), tf.cast(tf.boolean_mask(ce, real), tf.float64),
          tf.boolean_mask(predicted, real))


def scored_targets(kind: str, y: np.ndarray) -> np.ndarray:
  """The labels an evaluation scores, flattened: every label, or for
  SEQUENCE_CE_LOGITS the non-padding targets (row-major, `sequence_stats`'
  order)."""
  y = np.asarray(y)
  if kind == SEQUENCE_CE_LOGITS:
    return y[y != PAD]
  return y.reshape(-1)


def loss_kind(loss) -> str:
  """The library's loss kind for a Keras loss object, name or kind."""
  if isinstance(loss, str):
    if loss in LOSSES:
      return loss
    raise ValueError(f"unsupported loss {loss!r}; valid: {SPARSE_CE_LOGITS!r}, "
                     f"{BINARY_PROBS!r}, {SEQUENCE_CE_LOGITS!r}, or a Keras "
                     "SparseCategoricalCrossentropy"
                     "(from_logits=True) / BinaryCrossentropy(from_logits=False) object")
  config = loss.get_config() if hasattr(loss, "get_config") else {}
  if isinstance(loss, tf.keras.losses.SparseCategoricalCrossentropy) and \
      config.get("from_logits"):
    return SPARSE_CE_LOGITS
  if isinstance(loss, tf.keras.losses.BinaryCrossentropy) and not config.get("from_logits"):
    return BINARY_PROBS
  raise ValueError(f"unsupported loss {type(loss).__name__}({config}); valid: "
                   "SparseCategoricalCrossentropy(from_logits=True) or "
                   "BinaryCrossentropy(from_logits=False) (or their kinds "
                   f"{SPARSE_CE_LOGITS!r}, {BINARY_PROBS!r})")


def mlp(input_dim: int, hidden: int, num_classes: int,
        name: str = "mlp") -> tf.keras.Model:
  """One-hidden-layer perceptron (ReLU), logits out.

  The 2NN-style MLPs of FedAvg/FedGroup/pFedMo: MNIST 784-128-10 has 101,770
  parameters; FEMNIST 784-512-62 has 433,726; EMNIST-letters 784-512-26 has
  415,258.
  """
  inputs = tf.keras.Input(shape=(input_dim,), dtype=tf.float32)
  h = tf.keras.layers.Dense(hidden, activation="relu", name="hidden")(inputs)
  logits = tf.keras.layers.Dense(num_classes, name="logits")(h)
  return tf.keras.Model(inputs, logits, name=name)


def mlp_bn(input_dim: int, hidden: int, num_classes: int,
           name: str = "mlp_bn") -> tf.keras.Model:
  """`mlp` with a BatchNorm layer between the hidden layer and its ReLU (a
  small model with batch statistics, e.g. for FedBN on the synthetic tasks)."""
  inputs = tf.keras.Input(shape=(input_dim,), dtype=tf.float32)
  h = tf.keras.layers.Dense(hidden, name="hidden")(inputs)
  h = tf.keras.layers.BatchNormalization(name="bn")(h)
  h = tf.keras.layers.ReLU(name="relu")(h)
  logits = tf.keras.layers.Dense(num_classes, name="logits")(h)
  return tf.keras.Model(inputs, logits, name=name)


def fmnist_cnn(input_shape: Tuple[int, ...] = (784,), name: str = "fmnist_cnn",
               bn_momentum: float = 0.99, bn_epsilon: float = 1e-3) -> tf.keras.Model:
  """FMNIST CNN: 2 x (conv5x5 'same' + BatchNorm + ReLU + maxpool2), dense 10.

  The small Fashion-MNIST CNN of clustered-FL experiments: 16 then 32 filters, 29,034 trainable parameters (BatchNorm's moving mean and
  variance are not trainable). Images arrive flat (784) and are reshaped to
  28 x 28 x 1; any input_shape with 784 entries works. `bn_momentum` and
  `bn_epsilon` are Keras' BatchNormalization defaults; `fmnist_cnn_torch_bn`
  sets PyTorch's (running statistics updated by 0.1 of the batch's, eps 1e-5),
  those of the WeCFL paper's model.
  """
  inputs = tf.keras.Input(shape=input_shape, dtype=tf.float32)
  h = tf.keras.layers.Reshape((28, 28, 1))(inputs)
  for filters in (16, 32):
    h = tf.keras.layers.Conv2D(filters, 5, padding="same")(h)
    h = tf.keras.layers.BatchNormalization(momentum=bn_momentum, epsilon=bn_epsilon)(h)
    h = tf.keras.layers.ReLU()(h)
    h = tf.keras.layers.MaxPool2D(2)(h)
  h = tf.keras.layers.Flatten()(h)
  logits = tf.keras.layers.Dense(10, name="logits")(h)
  return tf.keras.Model(inputs, logits, name=name)


def fmnist_cnn_torch_bn(input_shape: Tuple[int, ...] = (784,),
                        name: str = "fmnist_cnn") -> tf.keras.Model:
  """`fmnist_cnn` with PyTorch's BatchNorm2d defaults (momentum 0.1 there,
  0.9 in Keras' convention; eps 1e-5): the WeCFL tasks' model."""
  return fmnist_cnn(input_shape, name, bn_momentum=0.9, bn_epsilon=1e-5)


def cifar10_cnn(input_shape: Tuple[int, ...] = (32, 32, 3),
                name: str = "cifar10_cnn") -> tf.keras.Model:
  """The LeNet-style CIFAR-10 CNN many FL papers use (PyTorch tutorial net).

  conv5x5 6 (valid) + ReLU + maxpool2, conv5x5 16 + ReLU + maxpool2, dense
  120 ReLU, 84 ReLU, 10 logits: 62,006 parameters. Inputs may also come flat
  (3,072 entries); they are reshaped to 32 x 32 x 3.
  """
  inputs = tf.keras.Input(shape=input_shape, dtype=tf.float32)
  h = tf.keras.layers.Reshape((32, 32, 3))(inputs)
  h = _lenet_body(h, first_padding="valid")
  logits = tf.keras.layers.Dense(10, name="logits")(h)
  return tf.keras.Model(inputs, logits, name=name)


def cifar_cnn_cflmgd(input_shape: Tuple[int, ...] = (24, 24, 3),
                     name: str = "cifar_cnn_cflmgd") -> tf.keras.Model:
  """The CIFAR-10 CNN of the CFL-MGD and IFCA experiments (the TensorFlow
  CIFAR-10 tutorial's), logits out, 1,068,298 parameters on 24 x 24 x 3:

  conv 5x5 64 'same' ReLU, maxpool 3x3 stride 2 'same', local response
  normalisation; conv 5x5 64 'same' ReLU, LRN, maxpool 3x3 stride 2 'same';
  dense 384 ReLU, 192 ReLU, 10. LRN: depth radius 4, bias 1, alpha 0.001/9,
  beta 0.75. (The reference trains FC384/FC192 with L2 decay 0.004; the
  runners' loss has no weight decay.)
  """
  def lrn(h):
    return tf.nn.local_response_normalization(h, depth_radius=4, bias=1.0,
                                              alpha=0.001 / 9.0, beta=0.75)

  inputs = tf.keras.Input(shape=input_shape, dtype=tf.float32)
  h = tf.keras.layers.Conv2D(64, 5, padding="same", activation="relu")(inputs)
  h = tf.keras.layers.MaxPool2D(3, strides=2, padding="same")(h)
  h = tf.keras.layers.Lambda(lrn, name="lrn1")(h)
  h = tf.keras.layers.Conv2D(64, 5, padding="same", activation="relu")(h)
  h = tf.keras.layers.Lambda(lrn, name="lrn2")(h)
  h = tf.keras.layers.MaxPool2D(3, strides=2, padding="same")(h)
  h = tf.keras.layers.Flatten()(h)
  h = tf.keras.layers.Dense(384, activation="relu")(h)
  h = tf.keras.layers.Dense(192, activation="relu")(h)
  logits = tf.keras.layers.Dense(10, name="logits")(h)
  return tf.keras.Model(inputs, logits, name=name)


def cifar_cnn_small(input_shape: Tuple[int, ...] = (32, 32, 3),
                    name: str = "cifar_cnn_small") -> tf.keras.Model:
  """A small CIFAR-10 CNN (the layout of TensorFlow's Keras CNN tutorial),
  logits out, 'valid' padding throughout:

  conv 3x3 32 ReLU, maxpool 2; conv 3x3 64 ReLU, maxpool 2; conv 3x3 64 ReLU;
  flatten; dense 64 ReLU; dense 10. 122,570 parameters on 32 x 32 x 3, 73,418
  on the 24 x 24 x 3 crops of `rotated_cifar10` (its `--model=cifar_cnn_small`).
  """
  inputs = tf.keras.Input(shape=input_shape, dtype=tf.float32)
  h = tf.keras.layers.Conv2D(32, 3, activation="relu")(inputs)
  h = tf.keras.layers.MaxPool2D(2)(h)
  h = tf.keras.layers.Conv2D(64, 3, activation="relu")(h)
  h = tf.keras.layers.MaxPool2D(2)(h)
  h = tf.keras.layers.Conv2D(64, 3, activation="relu")(h)
  h = tf.keras.layers.Flatten()(h)
  h = tf.keras.layers.Dense(64, activation="relu")(h)
  logits = tf.keras.layers.Dense(10, name="logits")(h)
  return tf.keras.Model(inputs, logits, name=name)


def lenet5(input_shape: Tuple[int, ...] = (784,), num_classes: int = 10,
           name: str = "lenet5") -> tf.keras.Model:
  """LeNet-5 (LeCun et al. 1998) on 28 x 28 x 1 images, logits out.

  conv5x5 6 'same' ReLU, maxpool2, conv5x5 16 valid ReLU, maxpool2, dense 120,
  84, num_classes: 61,706 parameters with 10 classes. Images arrive flat (784)
  and are reshaped to 28 x 28 x 1.
  """
  inputs = tf.keras.Input(shape=input_shape, dtype=tf.float32)
  h = tf.keras.layers.Reshape((28, 28, 1))(inputs)
  h = _lenet_body(h, first_padding="same")
  logits = tf.keras.layers.Dense(num_classes, name="logits")(h)
  return tf.keras.Model(inputs, logits, name=name)


def _lenet_body(h: tf.Tensor, first_padding: str) -> tf.Tensor:
  # Shared by LeNet-5 and the CIFAR-10 CNN: they differ only in the input and
  # the first convolution's padding.
  h = tf.keras.layers.Conv2D(6, 5, padding=first_padding, activation="relu")(h)
  h = tf.keras.layers.MaxPool2D(2)(h)
  h = tf.keras.layers.Conv2D(16, 5, padding="valid", activation="relu")(h)
  h = tf.keras.layers.MaxPool2D(2)(h)
  h = tf.keras.layers.Flatten()(h)
  h = tf.keras.layers.Dense(120, activation="relu")(h)
  return tf.keras.layers.Dense(84, activation="relu")(h)


def sent140_lstm(embedding_matrix: np.ndarray, seq_len: int = 25,
                 name: str = "sent140_lstm", unroll: Optional[bool] = None) -> tf.keras.Model:
  """Sent140 stacked LSTM of LEAF / FedGroup, sigmoid probability out.

  Token ids [seq_len] -> frozen Embedding (the given [vocab, 300] matrix, e.g.
  GloVe) -> LSTM 100 (sequences) -> LSTM 100 -> dense 30 ReLU -> dense 1
  sigmoid. Train with loss kind BINARY_PROBS. 243,861 trainable parameters
  (FedGroup's count); the embedding adds vocab * 300 frozen ones.

  `unroll`: build the LSTMs' time loop unrolled (the same arithmetic in the
  same order, so the same numbers; a larger graph). None (the default) unrolls
  unless a GPU is visible: on a CPU the unrolled step is faster (measured in
  docs/runners.md), while on a GPU Keras's fused cuDNN kernel needs the loop
  rolled.
  """
  if unroll is None:
    unroll = not tf.config.list_physical_devices("GPU")
  embedding_matrix = np.asarray(embedding_matrix, dtype=np.float32)
  if embedding_matrix.ndim != 2:
    raise DataError(
        f"embedding_matrix must be 2-D [vocab, dim], got shape "
        f"{embedding_matrix.shape}; pass the GloVe matrix")
  vocab, dim = embedding_matrix.shape
  inputs = tf.keras.Input(shape=(seq_len,), dtype=tf.int32)
  # A Constant initializer (not set_weights) so the matrix is also there when
  # the model is built inside a graph (TFF computations).
  h = tf.keras.layers.Embedding(
      vocab, dim,
      embeddings_initializer=tf.keras.initializers.Constant(embedding_matrix),
      trainable=False, name="embedding")(inputs)
  h = tf.keras.layers.LSTM(100, return_sequences=True, unroll=bool(unroll),
                           **_keras3_lstm_seed(1))(h)
  h = tf.keras.layers.LSTM(100, unroll=bool(unroll), **_keras3_lstm_seed(2))(h)
  h = tf.keras.layers.Dense(30, activation="relu")(h)
  probs = tf.keras.layers.Dense(1, activation="sigmoid", name="probs")(h)
  return tf.keras.Model(inputs, probs, name=name)


def _keras3_lstm_seed(seed: int) -> dict:
  """`seed=` for a Keras 3 LSTM, {} for tf_keras (which has no such argument).

  Keras 3 gives each LSTM a random generator for dropout (unused here: no
  dropout); without a seed of its own it takes one from the global seed
  stream, which shifts every later layer's initial weights away from what
  tf_keras draws from the same `set_random_seed`. With it, both Keras draw the
  same initial weights, so runs on either stack start alike.
  """
  import inspect
  if "seed" in inspect.signature(tf.keras.layers.LSTM.__init__).parameters:
    return {"seed": seed}
  return {}


def char_lstm(vocab_size: int = 90, seq_len: int = 80, embedding_dim: int = 8,
              units: int = 256, mask_zero: bool = True, name: str = "char_lstm"
              ) -> tf.keras.Model:
  """The character LSTM of FedAvg's and TFF's Shakespeare experiments, logits
  out: token ids [seq_len] -> Embedding(vocab_size, 8) -> LSTM 256 -> LSTM 256
  (both returning sequences, kernels He-normal) -> Dense vocab_size, a
  logit vector per position ([seq_len, vocab_size]). Train with loss kind
  SEQUENCE_CE_LOGITS.

  The layout of TFF's `create_recurrent_model` (tensorflow_federated
  v0.87.0, `simulation/baselines/shakespeare/char_prediction_models.py`);
  820,522 parameters with 90 ids. Its embedding masks id 0 (padding), as
  TFF's does by default: the LSTMs skip the padding that trails a sequence,
  so the logits at those positions repeat the last real position's (both
  Keras versions). The loss counts them (`per_example_loss`), so
  `mask_zero=False` (the LSTMs run on over the padding) trains another model.
  """
  if vocab_size < 2 or seq_len < 1 or embedding_dim < 1 or units < 1:
    raise ValueError(f"char_lstm needs vocab_size >= 2 and positive sizes, got "
                     f"vocab_size={vocab_size}, seq_len={seq_len}, "
                     f"embedding_dim={embedding_dim}, units={units}")
  inputs = tf.keras.Input(shape=(seq_len,), dtype=tf.int32)
  h = tf.keras.layers.Embedding(vocab_size, embedding_dim, mask_zero=mask_zero,
                                name="embedding")(inputs)
  for i in (1, 2):
    h = tf.keras.layers.LSTM(units, return_sequences=True, kernel_initializer="he_normal",
                             name=f"lstm{i}", **_keras3_lstm_seed(i))(h)
  logits = tf.keras.layers.Dense(vocab_size, name="logits")(h)
  return tf.keras.Model(inputs, logits, name=name)


def cnn_dropout(input_shape: Tuple[int, ...] = (784,), num_classes: int = 62,
                rates: Tuple[float, float] = (0.25, 0.5),
                name: str = "cnn_dropout") -> tf.keras.Model:
  """The EMNIST CNN of Reddi et al. ("Adaptive Federated Optimization", 2021),
  FedML's `CNN_DropOut` and FLUTE's FEMNIST model, logits out.

  conv 3x3 32 'valid' ReLU; conv 3x3 64 'valid' ReLU; maxpool 2; Dropout
  `rates[0]` (0.25); flatten; dense 128 ReLU; Dropout `rates[1]` (0.5); dense
  `num_classes`. 1,206,590 parameters with 62 classes. Images arrive flat (784)
  and are reshaped to 28 x 28 x 1. `rates=(0, 0)` gives the same network
  without dropout (the dropout layers are then identities).
  """
  inputs = tf.keras.Input(shape=input_shape, dtype=tf.float32)
  h = tf.keras.layers.Reshape((28, 28, 1))(inputs)
  return tf.keras.Model(inputs, _two_convs_two_dropouts(h, num_classes, rates, (3, 4)),
                        name=name)


def _two_convs_two_dropouts(h, num_classes: int, rates, seeds):
  """conv 3x3 32 ReLU; conv 3x3 64 ReLU; maxpool 2; Dropout; flatten; dense
  128 ReLU; Dropout; dense `num_classes` logits (`cnn_dropout`, `simple_cnn`)."""
  h = tf.keras.layers.Conv2D(32, 3, activation="relu")(h)
  h = tf.keras.layers.Conv2D(64, 3, activation="relu")(h)
  h = tf.keras.layers.MaxPool2D(2)(h)
  h = tf.keras.layers.Dropout(rates[0], **_keras3_lstm_seed(seeds[0]))(h)
  h = tf.keras.layers.Flatten()(h)
  h = tf.keras.layers.Dense(128, activation="relu")(h)
  h = tf.keras.layers.Dropout(rates[1], **_keras3_lstm_seed(seeds[1]))(h)
  return tf.keras.layers.Dense(num_classes, name="logits")(h)


def simple_cnn(input_shape: Tuple[int, ...] = (32, 32, 3), num_classes: int = 10,
               rates: Tuple[float, float] = (0.25, 0.5), name: str = "simple_cnn"
               ) -> tf.keras.Model:
  """pfl-research's CIFAR-10 CNN (`simple_cnn` in apple/pfl-research
  `benchmarks/model/tf2/cnn.py`, commit 058b537769c17089c1c26a825bda7c9bf3d69fb1),
  logits out: conv 3x3 32 'valid' ReLU; conv 3x3 64 'valid' ReLU; maxpool 2;
  Dropout `rates[0]`; flatten; dense 128 ReLU; Dropout `rates[1]`; dense
  `num_classes`. 1,626,442 parameters on 32 x 32 x 3 images and 10 classes
  (`cnn_dropout`'s layers on colour images)."""
  inputs = tf.keras.Input(shape=input_shape, dtype=tf.float32)
  return tf.keras.Model(inputs, _two_convs_two_dropouts(inputs, num_classes, rates, (5, 6)),
                        name=name)


# -- Keras model introspection ----------------------------------------

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


def num_dense_layers(model: tf.keras.Model) -> int:
  """How many Dense layers `model` has (nested models' too)."""
  return sum(isinstance(l, tf.keras.layers.Dense) for l in _all_layers(model))


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


def fan_in_uniform_weights(model: tf.keras.Model, rng: np.random.Generator
                           ) -> List[np.ndarray]:
  """`model`'s weight list (trainable first) with every Dense and Conv2D
  kernel and bias drawn from U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = the
  layer's inputs per output (a Conv2D's kh * kw * in_channels): the
  distribution of PyTorch's default `nn.Linear` / `nn.Conv2d` initialization.
  BatchNormalization keeps its start (gamma 1, beta 0, statistics 0 and 1, as
  PyTorch's); a model with any other layer holding weights is refused.
  Layers are drawn in layer order, kernel then bias."""
  variables = model_variables(model)
  out = [v.numpy() for v in variables]
  for layer in _all_layers(model):
    if isinstance(layer, tf.keras.Model) or not layer.weights:
      continue
    if isinstance(layer, tf.keras.layers.BatchNormalization):
      continue
    if not isinstance(layer, (tf.keras.layers.Dense, tf.keras.layers.Conv2D)):
      raise ValueError(f"a fan-in uniform start covers Dense, Conv2D and BatchNormalization "
                       f"layers; model {model.name!r} has {type(layer).__name__} layer "
                       f"{layer.name!r}")
    shape = tuple(layer.kernel.shape)
    bound = 1.0 / np.sqrt(float(np.prod(shape[:-1])))
    for weight in layer.weights:
      i = weight_index(variables, weight)
      out[i] = rng.uniform(-bound, bound, size=out[i].shape).astype(out[i].dtype)
  return out


def last_dense_indices(model: tf.keras.Model) -> List[int]:
  """Indices of the weights of the model's last Dense layer: [kernel] or
  [kernel, bias]."""
  return dense_indices(model, last_only=True)


def last_dense_layer(model: tf.keras.Model) -> tf.keras.layers.Layer:
  """The model's last Dense layer (nested models' included)."""
  dense = [layer for layer in _all_layers(model) if isinstance(layer, tf.keras.layers.Dense)]
  if not dense:
    raise ValueError(f"model {model.name!r} has no Dense layer")
  return dense[-1]


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
