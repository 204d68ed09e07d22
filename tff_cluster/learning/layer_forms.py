"""Forms of Keras 3 layers that TensorFlow's vectorizer can run with
different weights per client (clients side by side), and the reproducible
per-client Dropout that both the sequential and the side-by-side trainers use.

`tf.vectorized_map` rewrites each op of one client's step into one op over
the chunk's clients. Four layer kinds have no such rewrite with per-client
weights, or none without a loop over the clients; inside `side_by_side(model)`
the model's own layers take these forms (Keras' documented extension points,
set on the layer instances and removed on exit):

* Convolutions (`Conv1D`, `Conv2D`, `Conv3D`): TF's vectorizer converts a
  convolution only when all clients share its filter. `patch_conv` writes it
  as the input's patches (one strided slice per kernel position, concatenated
  on the channel axis) times the kernel reshaped to a matrix: slices and a
  matrix product, which vectorize with a kernel per client. Same values as the
  convolution up to float summation order.
* `BatchNormalization` in training: each client normalizes by the statistics
  of its own batch's real rows (`masked_moments`, the row mask of the current
  step; `tf.nn.moments`' formula restricted to them), as the sequential
  trainer does by slicing the batch to its real size.
* Recurrent layers: their time loop is unrolled (the same arithmetic step by
  step; a `tf.while_loop` over time has no gradient under the vectorizer).
* `Dropout`: Keras draws its masks with TF's stateless random ops, which the
  vectorizer runs one client after another. The form here (`hash_uniform`) draws them from a
  counter-based hash of (the layer's seed state, the layer, the element):
  integer arithmetic, the same numbers side by side or not. It is installed
  for good on the runner's model (`install_dropout`), so that sequential and
  side-by-side rounds drop the same units; each client's seed state starts
  at [its round seed, 0] (`client_seed_state`), so a client's masks depend on
  the run's seed, the round and the client only.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import List, Optional

import numpy as np
import tensorflow as tf


def _keras():
  import keras  # Keras 3 (only reached for models that have `stateless_call`)
  return keras


def all_layers(model) -> List:
  """Every layer inside `model` (nested ones too), each once."""
  if hasattr(model, "_flatten_layers"):
    return list(model._flatten_layers(include_self=False, recursive=True))
  return list(model.layers)


# -- convolutions ----------------------------------------------------------------

def conv_geometry(spatial, kernel, strides, padding: str, dilation):
  """(output sizes, [[before, after]] padding per spatial axis) of a
  convolution, by TF's rules for 'valid' and 'same'."""
  outs, pads = [], []
  for size, k, s, d in zip(spatial, kernel, strides, dilation):
    span = (k - 1) * d + 1
    if padding == "same":
      out = -(-size // s)
      total = max((out - 1) * s + span - size, 0)
      pads.append([total // 2, total - total // 2])
    else:
      out = (size - span) // s + 1
      pads.append([0, 0])
    outs.append(out)
  return outs, pads


def patch_conv(x, kernel, strides, padding: str, dilation):
  """The convolution of channels-last `x` [batch, *spatial, c_in] with
  `kernel` [*k, c_in, c_out] as patches times a matrix (see the module
  docstring). `padding` 'valid' or 'same'."""
  rank = len(strides)
  ks = [int(k) for k in kernel.shape[:rank]]
  spatial = [int(d) for d in x.shape[1:1 + rank]]
  outs, pads = conv_geometry(spatial, ks, strides, padding, dilation)
  if any(p != [0, 0] for p in pads):
    x = tf.pad(x, [[0, 0]] + pads + [[0, 0]])
  ends = 1 | (1 << (rank + 1))  # the batch and channel axes are taken whole
  pieces = []
  for pos in itertools.product(*[range(k) for k in ks]):
    begin = [0] + [p * d for p, d in zip(pos, dilation)] + [0]
    end = [0] + [p * d + (o - 1) * s + 1
                 for p, d, o, s in zip(pos, dilation, outs, strides)] + [0]
    pieces.append(tf.strided_slice(x, begin, end, [1] + list(strides) + [1],
                                   begin_mask=ends, end_mask=ends))
  patches = pieces[0] if len(pieces) == 1 else tf.concat(pieces, axis=-1)
  depth = int(np.prod(kernel.shape[:-1]))
  out = tf.matmul(tf.reshape(patches, [-1, depth]),
                  tf.reshape(kernel, [depth, kernel.shape[-1]]))
  return tf.reshape(out, tf.concat([tf.shape(x)[:1], outs, [kernel.shape[-1]]], 0))


def _conv_op(layer):
  def convolution_op(inputs, kernel):
    return patch_conv(inputs, kernel, list(layer.strides), layer.padding,
                      list(layer.dilation_rate))
  return convolution_op


# -- BatchNormalization ---------------------------------------------------------------

# The row mask (1.0 real row, 0.0 padding) of the batch being traced side by
# side; set by `row_mask` around a training call.
_ROW_MASKS: List = []


@contextlib.contextmanager
def row_mask(mask):
  """Batch statistics inside this block are over the rows where `mask` is 1."""
  _ROW_MASKS.append(mask)
  try:
    yield
  finally:
    _ROW_MASKS.pop()


def masked_moments(inputs, axes, mask):
  """`tf.nn.moments(inputs, axes)` over the rows (axis 0) where `mask` is 1:
  the mean, then the mean squared difference from it (the mean's gradient
  stopped there, as `tf.nn.moments` does)."""
  rows = tf.reshape(tf.cast(mask, inputs.dtype), [-1] + [1] * (len(inputs.shape) - 1))
  per_row = float(np.prod([int(inputs.shape[a]) for a in axes if a != 0]))
  count = tf.reduce_sum(rows) * per_row
  mean = tf.reduce_sum(inputs * rows, axes, keepdims=True) / count
  variance = tf.reduce_sum(tf.math.squared_difference(inputs, tf.stop_gradient(mean)) * rows,
                           axes, keepdims=True) / count
  return tf.squeeze(mean, axes), tf.squeeze(variance, axes)


def _moments(layer):
  original = type(layer)._moments

  def moments(inputs, mask):
    if not _ROW_MASKS or _ROW_MASKS[-1] is None:
      return original(layer, inputs, mask)
    return masked_moments(inputs, list(layer._reduction_axes), _ROW_MASKS[-1])
  return moments


# -- Dropout --------------------------------------------------------------------------

_MASK32 = 0xFFFFFFFF


def _mix(x, shift, multiplier):
  x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(shift, tf.int64)))
  return tf.bitwise.bitwise_and(x * multiplier, _MASK32)


def hash_uniform(state, salt: int, shape, shape_of=None):
  """Uniform floats in [0, 1) of `shape`, a function of the seed state
  (two integers), `salt` and each element's position alone: a multiplicative
  key of the three, then the 32-bit finalizer of MurmurHash3 per element;
  the top 24 bits scaled to [0, 1). `shape_of`: the tensor whose dynamic
  shape stands for `shape`'s unknown sizes."""
  state = tf.bitwise.bitwise_and(tf.cast(state, tf.int64), _MASK32)
  key = tf.bitwise.bitwise_and(state[0] * 0x85EBCA77 + state[1] * 0xC2B2AE3D
                               + (salt & _MASK32) * 0x27D4EB2F, _MASK32)
  if any(d is None for d in shape):  # a batch sliced to its real size
    shape = tf.shape(shape_of)
  count = tf.reduce_prod(tf.cast(shape, tf.int64))
  x = tf.bitwise.bitwise_and(tf.range(count, dtype=tf.int64) * 0x9E3779B1 + key, _MASK32)
  x = _mix(_mix(x, 16, 0x85EBCA6B), 13, 0xC2B2AE35)
  x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(16, tf.int64)))
  bits = tf.bitwise.right_shift(x, tf.constant(8, tf.int64))
  return tf.reshape(tf.cast(bits, tf.float32) * (1.0 / (1 << 24)), shape)


def _dropout_call(layer, salt: int):
  def call(inputs, training=False):
    if not training or layer.rate == 0:
      return inputs
    state = layer.seed_generator.next()  # Keras' own seed state, advanced by one
    keep = tf.cast(hash_uniform(state, salt, inputs.shape, inputs) >= layer.rate, inputs.dtype)
    return inputs * keep / (1.0 - layer.rate)
  return call


def dropout_layers(model) -> List:
  """The Keras 3 `Dropout` layers of `model` that drop units (rate > 0)."""
  if not hasattr(model, "stateless_call"):
    return []
  keras = _keras()
  return [l for l in all_layers(model)
          if isinstance(l, keras.layers.Dropout) and float(l.rate) > 0]


def install_dropout(model) -> bool:
  """Gives `model`'s Dropout layers masks from `hash_uniform` (the k-th layer salted
  with k) for good; True when it has any."""
  layers = dropout_layers(model)
  for k, layer in enumerate(layers):
    if getattr(layer, "_tff_cluster_salt", None) is None:
      layer.call = _dropout_call(layer, k)
      layer._tff_cluster_salt = k
  return bool(layers)


def client_seed_state(seed, dtype) -> tf.Tensor:
  """A Dropout layer's seed state at the start of a client's training:
  [the client's round seed, 0]."""
  seed = tf.cast(seed, dtype)
  return tf.stack([seed, tf.zeros_like(seed)])


def reset_dropout_seeds(model, seed) -> None:
  """Sets `model`'s Dropout seed states to `client_seed_state(seed)`."""
  for layer in dropout_layers(model):
    state = layer.seed_generator.state
    state.assign(client_seed_state(seed, state.dtype))


# -- the side-by-side context -------------------------------------------------------------

def side_by_side_problem(model) -> Optional[str]:
  """Why a layer of the Keras 3 model `model` has no side-by-side form here
  (one phrase naming it), or None."""
  keras = _keras()
  for layer in all_layers(model):
    kind = type(layer).__name__
    name = f"layer {layer.name!r} ({kind})"
    if isinstance(layer, (keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D)):
      if getattr(layer, "groups", 1) != 1:
        return f"{name}: grouped convolutions (groups > 1)"
      if layer.data_format != "channels_last":
        return f"{name}: data_format {layer.data_format!r} (channels_last is written)"
      if str(layer.padding).lower() not in ("valid", "same"):
        return f"{name}: padding {layer.padding!r}"
    if isinstance(layer, keras.layers.BatchNormalization):
      if getattr(layer, "renorm", False):
        return f"{name}: batch renormalization"
      if not hasattr(type(layer), "_moments"):
        return f"{name}: this Keras has no BatchNormalization._moments"
    if isinstance(layer, keras.layers.RNN):
      cell = getattr(layer, "cell", None)
      if float(getattr(cell, "dropout", 0) or 0) or float(getattr(cell, "recurrent_dropout", 0)
                                                          or 0):
        return f"{name}: recurrent layers with dropout"
    if isinstance(layer, keras.layers.Dropout) and layer.noise_shape is not None:
      return f"{name}: Dropout with a noise_shape"
  return None


@contextlib.contextmanager
def side_by_side(model):
  """Inside this block `model`'s convolutions, BatchNormalizations and
  recurrent layers take their side-by-side forms (module docstring)."""
  keras = _keras()
  undo = []
  for layer in all_layers(model):
    if isinstance(layer, (keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D)):
      layer.convolution_op = _conv_op(layer)
      undo.append((layer, "convolution_op", None))
    elif isinstance(layer, keras.layers.BatchNormalization):
      layer._moments = _moments(layer)
      undo.append((layer, "_moments", None))
    elif isinstance(layer, keras.layers.RNN) and not layer.unroll:
      layer.unroll = True
      undo.append((layer, "unroll", False))
  try:
    yield
  finally:
    for layer, attribute, value in undo:
      if value is None:
        delattr(layer, attribute)
      else:
        setattr(layer, attribute, value)
