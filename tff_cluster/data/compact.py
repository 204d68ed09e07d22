"""Images kept as 8-bit codes: a quarter of float32's memory, the same values.

The federated image data sets are 8-bit in origin: LEAF's FEMNIST and TFF's
`emnist_all.sqlite` hold each pixel as k/255 (k = 0..255) in [0, 1], CIFAR's
and CelebA's pixels are bytes. A `CodedArray` keeps such an array as its codes
(uint8, one byte a value) and a table of 256 float32 values; its value is
`table[codes]`, looked up (never recomputed), so it equals, bit for bit, the
float32 array it was encoded from. `encode` keeps only what round-trips
exactly (compared as bits) and gives None otherwise, so a data set whose
values are not on the table stays float32 and nothing changes.

Who reads the codes: the `local` runner keeps one uint8 pool of every
client's training images on the device and looks rows up in the table inside
its compiled round (`learning.schedule.gather_rows`); the `Evaluator` decodes
a batch at a time. Everything else sees float32: `np.asarray(coded)` (and
`coded.decode()`) is the decoded array, and indexing (`coded[rows]`) stays
coded. A `CodedArray` pickles as its codes and table (what the `ray` runner's
actors receive).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

# k / 255 for k = 0..255 as float32, by way of float64: what LEAF's
# preprocessing writes (an 8-bit pixel divided by 255 in double precision,
# kept as a decimal JSON number) and what a float32 reader of it, or of TFF's
# file (float32 values of the same numbers), produces. For every k it is also
# float32(k) / float32(255) (division is correctly rounded; tests check it).
UNIT = (np.arange(256, dtype=np.float64) / 255.0).astype(np.float32)


class CodedArray:
  """An array of float32 values kept as uint8 codes into a 256-entry table.

  Attributes:
    codes: uint8 array; the array's shape.
    table: float32 [256]; the value of code k.
  """

  __slots__ = ("codes", "table")

  def __init__(self, codes: np.ndarray, table: np.ndarray = UNIT):
    codes = np.asarray(codes)
    table = np.asarray(table)
    if codes.dtype != np.uint8:
      raise TypeError(f"codes must be uint8, got {codes.dtype}")
    if table.shape != (256,) or table.dtype != np.float32:
      raise TypeError(f"table must be float32 [256], got {table.dtype} {table.shape}")
    self.codes = codes
    self.table = table

  shape = property(lambda self: self.codes.shape)
  ndim = property(lambda self: self.codes.ndim)
  size = property(lambda self: self.codes.size)
  dtype = property(lambda self: self.table.dtype)
  nbytes = property(lambda self: self.codes.nbytes)  # the table is shared

  def __len__(self) -> int:
    return len(self.codes)

  def __getitem__(self, key):
    part = self.codes[key]
    if isinstance(part, np.ndarray) and part.ndim:
      return CodedArray(part, self.table)
    return self.table[part]

  def decode(self) -> np.ndarray:
    """The float32 array (a new array: the table's values at the codes)."""
    return self.table[self.codes]

  def __array__(self, dtype=None, copy=None):
    out = self.decode()
    return out if dtype is None else out.astype(dtype, copy=False)

  def reshape(self, *shape) -> "CodedArray":
    return CodedArray(self.codes.reshape(*shape), self.table)

  def copy(self) -> "CodedArray":
    return CodedArray(self.codes.copy(), self.table)

  @property
  def base(self):
    """What `codes` views (numpy's `base`)."""
    return self.codes.base

  def __tf_tensor__(self, dtype=None, name=None):
    import tensorflow as tf  # deferred: this module is TF-free at import
    return tf.convert_to_tensor(self.decode(), dtype=dtype, name=name)

  def __repr__(self) -> str:
    return f"CodedArray(shape={self.shape}, float32 from uint8 codes)"

  def __reduce__(self):
    return CodedArray, (self.codes, self.table)


def encode(values, table: np.ndarray = UNIT) -> Optional[CodedArray]:
  """`values` (float32) as codes into `table` (sorted ascending), or None
  unless every value is one of the table's, bit for bit (so -0.0, NaN and
  any value off the table keep the array float32)."""
  x = np.asarray(values)
  if x.dtype != np.float32:
    return None
  codes = np.searchsorted(table, x).clip(0, 255).astype(np.uint8)
  if not np.array_equal(table[codes].view(np.uint32), x.view(np.uint32)):
    return None
  return CodedArray(codes, table)


def compact(values):
  """`values` as a `CodedArray` when it encodes exactly (`encode`), else as is."""
  coded = encode(values)
  return values if coded is None else coded


def is_coded(values) -> bool:
  return isinstance(values, CodedArray)


ALIGNMENT = 64  # bytes: what TensorFlow asks of a buffer it takes without a copy


def aligned_empty(shape, dtype) -> np.ndarray:
  """An uninitialised array whose data starts on an ALIGNMENT-byte boundary."""
  dtype = np.dtype(dtype)
  nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  raw = np.empty(nbytes + ALIGNMENT, np.uint8)
  skip = -raw.ctypes.data % ALIGNMENT
  return raw[skip:skip + nbytes].view(dtype).reshape(shape)


def concatenate(arrays: Sequence, aligned: bool = False,
                own: bool = False) -> "np.ndarray | CodedArray":
  """Rows of `arrays` one after the other: coded when all are coded on one
  table (no float32 copy is made), else a numpy concatenation. Adjoining
  views of one buffer (`pack`'s) come back as one view, not copied.
  `aligned`: the result's buffer starts on an ALIGNMENT-byte boundary;
  `own`: the result is its buffer's whole (a part of a larger one is copied,
  so that the rest can be freed)."""
  arrays = list(arrays)
  coded = bool(arrays) and all(isinstance(a, CodedArray) for a in arrays) and all(
      a.table is arrays[0].table or np.array_equal(a.table, arrays[0].table) for a in arrays)
  parts = [a.codes for a in arrays] if coded else [np.asarray(a) for a in arrays]
  adjoining = _adjoining(parts)
  if adjoining is not None and (not aligned or adjoining.ctypes.data % ALIGNMENT == 0) and (
      not own or _root(adjoining).nbytes - adjoining.nbytes <= ALIGNMENT):
    joined = adjoining  # already one buffer (`pack`): no copy
  elif aligned and parts:
    out = aligned_empty((sum(len(p) for p in parts),) + parts[0].shape[1:],
                        np.result_type(*parts))
    joined = np.concatenate(parts, out=out)
  else:
    joined = np.concatenate(parts)
  return CodedArray(joined, arrays[0].table) if coded else joined


def _root(array: np.ndarray) -> np.ndarray:
  while isinstance(array.base, np.ndarray):
    array = array.base
  return array


def _adjoining(parts: Sequence[np.ndarray]) -> Optional[np.ndarray]:
  """The one array whose rows `parts` are, in order, when they are adjoining
  C-contiguous views of one buffer (as `pack` leaves them); else None."""
  full = [p for p in parts if p.size]
  if not full or len({(p.dtype, p.shape[1:]) for p in parts}) != 1:
    return None
  root = _root(full[0])
  end = full[0].ctypes.data
  for p in full:
    if not p.flags.c_contiguous or _root(p) is not root or p.ctypes.data != end:
      return None
    end += p.nbytes
  start = full[0].ctypes.data - root.ctypes.data
  rows = sum(len(p) for p in parts)
  return np.ndarray((rows,) + parts[0].shape[1:], parts[0].dtype, buffer=root, offset=start)


def pack(arrays: Sequence) -> list:
  """`arrays` (numpy arrays or `CodedArray`s of one row shape) as views of
  one aligned buffer, in order: what `concatenate` then returns without a
  copy (the `local` runner's pool of every client's rows)."""
  arrays = list(arrays)
  if not arrays:
    return arrays
  joined = concatenate(arrays, aligned=True, own=True)
  bounds = np.cumsum([0] + [len(a) for a in arrays])
  return [joined[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])]


def decode(values) -> np.ndarray:
  """`values` as a numpy array (a `CodedArray` decoded)."""
  return values.decode() if isinstance(values, CodedArray) else np.asarray(values)
