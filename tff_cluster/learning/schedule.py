"""A client's local schedule: its epochs' example orders and the batches
that materialise them (a `tf.data.Dataset` for the `tff` runner, padded
index batches for the in-process runners), and the loop over them."""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import NamedTuple, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_cluster import seeds
from tff_cluster.data import compact


class Coded(NamedTuple):
  """A device copy of inputs kept as 8-bit codes (`tff_cluster.data.compact`):
  row i's values are `table[codes[i]]`."""
  codes: tf.Tensor  # uint8
  table: tf.Tensor  # float32 [256]


def device_rows(parts, device: str):
  """The rows of `parts` (numpy arrays or `CodedArray`s, one after the other)
  as what `gather_rows` reads on `device`: a tensor, or a `Coded` pair of
  tensors that stays a quarter of the size. On a CPU the tensor is the
  concatenation's own memory (`host_tensor`): no second copy."""
  joined = compact.concatenate(parts, aligned=True)
  rows = joined.codes if compact.is_coded(joined) else joined
  with tf.device(device):
    if tf.DeviceSpec.from_string(device).device_type in (None, "CPU"):
      tensor = host_tensor(rows)
    else:
      tensor = tf.constant(rows)
    if compact.is_coded(joined):
      return Coded(tensor, tf.constant(joined.table))
    return tensor


def host_tensor(array: np.ndarray) -> tf.Tensor:
  """A CPU tensor on `array`'s memory (DLPack: no copy; `tf.constant` keeps a
  copy and a freed second one in the process's memory, 2x the array), where
  the array is C-contiguous and aligned as TensorFlow asks (else a copy).
  The array must not change afterwards."""
  aligned = array.ctypes.data % compact.ALIGNMENT == 0 and array.flags.c_contiguous
  if aligned and array.size and array.dtype.kind in "biuf":
    try:
      return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
    except (AttributeError, TypeError, ValueError, tf.errors.InvalidArgumentError):
      pass  # an older numpy or TensorFlow: copy
  return tf.constant(array)


def gather_rows(x, rows):
  """Rows `rows` of `x` (a tensor or a `Coded` pair), as float values: the
  table's entries, looked up, so bit for bit the decoded array's."""
  if isinstance(x, Coded):
    return tf.gather(x.table, tf.cast(tf.gather(x.codes, rows), tf.int32))
  return tf.gather(x, rows)


def client_seed(seed: int, round_num: int, client_index: int) -> int:
  """Seed of one client's data shuffle in one round (stable; `tff_cluster.seeds`
  says how these sequences meet the named streams)."""
  return seeds.int31(np.random.SeedSequence([seed, round_num, client_index]))


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


@tf.function(reduce_retracing=True, autograph=False)
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
                   seed: int, steps: Optional[int] = None,
                   rows: bool = False) -> tf.data.Dataset:
  """A client's batches as a `tf.data.Dataset` (see `LocalWork`).

  `epochs` passes, reshuffled each pass; with `steps`, only the first `steps`
  batches of as many passes as they need. `rows`: each batch also carries
  `i`, its examples' rows in `x` (int64).
  """
  n = len(y)
  xs = tf.constant(compact.decode(x))
  ys = tf.constant(y)

  def one_epoch(epoch):
    order = epoch_order(n, seed, epoch)
    items = collections.OrderedDict(x=tf.gather(xs, order), y=tf.gather(ys, order))
    if rows:
      items["i"] = order
    return tf.data.Dataset.from_tensor_slices(items).batch(batch_size)

  if steps is not None:
    epochs = LocalWork(batch_size, steps=steps).num_epochs(n)
  dataset = tf.data.Dataset.range(epochs).flat_map(one_epoch)
  return dataset.take(steps) if steps is not None else dataset


def work_dataset(x: np.ndarray, y: np.ndarray, work: LocalWork, seed: int,
                 rows: bool = False) -> tf.data.Dataset:
  return client_dataset(x, y, work.batch_size, work.epochs, seed, steps=work.steps, rows=rows)


class PaddedBatches(NamedTuple):
  """A client's batches as indices into the runner's training arrays.

  indices: int32 [P, B]: row i holds batch i's sample indices (0 where padded).
  sizes: int32 [P]: the real size of batch i (0 for padding rows).
  num_steps: int32 scalar: the number of real batches; the loop stops there.
    The runner pads P to the largest step count of any client, so that one
    compiled shape serves every client (only these small index arrays are
    padded, never the data).
  seed: int64 scalar, the client's round seed (`client_seed`: the one its
    shuffles come from), which also seeds its Dropout masks; None where not
    given.
  offset: int64 scalar, the client's first row in the runner's arrays
    (`indices` - offset: the rows in the client's data); None where not
    given.
  """
  indices: tf.Tensor
  sizes: tf.Tensor
  num_steps: tf.Tensor
  seed: Optional[tf.Tensor] = None
  offset: Optional[tf.Tensor] = None


def padded_batches(num_samples: int, offset: int, work: LocalWork, seed: int,
                   total_steps: Optional[int] = None) -> PaddedBatches:
  """The batches of `client_dataset` (same order), as numpy index batches.

  `offset` is the client's first row in the runner's concatenated arrays;
  `total_steps` (>= the client's steps) is P, default the client's steps.
  """
  steps = work.num_steps(num_samples)
  total = steps if total_steps is None else total_steps
  stacked = stacked_padded_batches([num_samples], [offset], work, [seed], total)
  return PaddedBatches(stacked.indices[0], stacked.sizes[0], stacked.num_steps[0],
                       stacked.seed[0], stacked.offset[0])


def stacked_padded_batches(num_samples: Sequence[int], offsets: Sequence[int],
                           work: LocalWork, seeds: Sequence[int], total_steps: int
                           ) -> PaddedBatches:
  """`padded_batches` of several clients stacked: indices [K, P, B], sizes
  [K, P], num_steps [K], seed [K] (P = `total_steps`, at least every client's
  steps).
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
  return PaddedBatches(indices, sizes, np.asarray(steps, np.int32),
                       np.asarray(seeds, np.int64), np.asarray(offsets, np.int64))


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
  if bound is not None:
    init = per_client(init, limit)

  def outer(j, *carry):
    rows = indices[j]
    xb, yb = gather_rows(x, rows), tf.gather(y, rows)
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


def per_client(values, like):
  """`values` unchanged (a select of each onto itself), made to depend on
  `like`, a client's own value inside a `tf.vectorized_map`.

  A loop value that enters a vectorized loop the same for every client and
  leaves it each client's own (the model a round starts from, a zero
  count) makes the vectorizer convert the loop's body again and again:
  once per value it finds to differ, then the whole loop once more with
  those values stacked (each nested loop inside, too). Entering stacked,
  every loop is converted once: a one-round side-by-side run of FedAvg
  with a CNN + LSTM created 6,653 ops (6.0 s), against 14,679 (12.7 s).
  TensorLists (variant) are left as they are: a select has no variant form.
  """
  same = tf.equal(like, like)
  return tf.nest.map_structure(
      lambda v: v if v.dtype == tf.variant else tf.where(same, v, v), values)


# ---------------------------------------------------------------------------
# Local SGD.
