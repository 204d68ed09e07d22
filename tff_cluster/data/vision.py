"""Centralized image datasets: MNIST, Fashion-MNIST, CIFAR-10 (pooled arrays).

The tasks partition the pooled train+test images over clients themselves and
split each client 90/10 (LEAF-style), so these loaders return one (x, y) pair:

* MNIST / Fashion-MNIST: x float32 [70000, 784] in [0, 1] (0 = background,
  the Keras/idx convention, unlike LEAF FEMNIST), y int64 0-9.
* CIFAR-10: x float32 [60000, 32, 32, 3] in [0, 1] (channels last), y 0-9.

Sources, in order:
1. `data_dir` given: MNIST/Fashion-MNIST read the original idx files (LeCun's
   / Zalando's names, `.gz` or uncompressed). No checksums are checked:
   redistributed copies (e.g. Debian's dataset-fashion-mnist) are re-gzipped
   and differ byte-wise from upstream. The idx magic numbers, dimensions and
   counts are validated instead. CIFAR-10 reads the python-pickle batches
   (`cifar-10-batches-py/data_batch_1..5`, `test_batch`) with an unpickler
   that admits only the numpy arrays, lists and bytes the format holds: a
   file that asks for anything else (a crafted file's payload) is refused in
   one line before any of it runs.
2. No `data_dir`: `tf.keras.datasets.<name>.load_data()`, which uses the
   Keras cache (~/.keras/datasets) and downloads when it is empty; a failed
   download becomes one DataError line saying what to do offline.
3. TensorFlow Datasets (`data_source="tfds"`, the `tfds` extra): the same
   arrays, in the original files' order, from a TFDS copy
   (`tff_cluster.data.tfds_source`); `data_dir` then names TFDS's data
   directory.

`data_source` (`--data_source`, `DataOptions.data_source`) picks among them
(`resolve_source`): "keras" is 1 and 2 as above; "tfds" is 3; "auto" (the
tasks' default) is 1 when `data_dir` is given, else 2 when the Keras cache
holds the data set's files, else 3 when TFDS is installed and a prepared copy
is in TFDS's data directory (read as it is: `auto` never downloads through
TFDS), else 2 (Keras' download).
"""

from __future__ import annotations

import gzip
import os
import pickle
from typing import Optional, Tuple

import numpy as np

from tff_cluster.data import tfds_source
from tff_cluster.data.federated import DataError, open_data_file

IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
CIFAR10_DIR = "cifar-10-batches-py"
CIFAR10_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)

# idx magic: 0x00 0x00 <type 0x08 = uint8> <number of dimensions>.
_IDX_IMAGES_MAGIC = 0x00000803
_IDX_LABELS_MAGIC = 0x00000801

DATA_SOURCES = ("auto", "keras", "tfds")

# The Keras cache locations (keras/src/datasets/*.py, TF 2.14).
_KERAS_CACHE = {
    "mnist": "~/.keras/datasets/mnist.npz",
    "fashion_mnist": "~/.keras/datasets/fashion-mnist/ (the four idx .gz files)",
    "cifar10": "~/.keras/datasets/cifar-10-batches-py/ (the extracted "
               "cifar-10-python.tar.gz)",
}


# ---------------------------------------------------------------------------
# idx files (MNIST, Fashion-MNIST).


def _find_idx(data_dir: str, stem: str) -> Optional[str]:
  # Upstream names are `<stem>.gz`; some mirrors ship them uncompressed, and
  # the raw MNIST tarballs use `<stem with the last '-' as '.'>`.
  for name in (stem + ".gz", stem, stem.replace("-idx", ".idx") + ".gz",
               stem.replace("-idx", ".idx")):
    path = os.path.join(data_dir, name)
    if os.path.isfile(path):
      return path
  return None


def _read_bytes(path: str) -> bytes:
  with open_data_file(path, "rb") as f:
    head = f.read(2)
  try:
    if head == b"\x1f\x8b":  # gzip magic: decide by content, not by name.
      with open_data_file(path, "rb") as raw, gzip.GzipFile(fileobj=raw) as f:
        return f.read()
    with open_data_file(path, "rb") as f:
      return f.read()
  except (OSError, EOFError) as e:
    raise DataError(f"{path}: cannot read ({e})") from e


def read_idx(path: str) -> np.ndarray:
  """Reads one idx file (uint8 data, 1 or 3 dimensions) into a uint8 array.

  Validates the magic number and that the file holds exactly the number of
  bytes its header announces.
  """
  raw = _read_bytes(path)
  if len(raw) < 8:
    raise DataError(f"{path}: too short for an idx file ({len(raw)} bytes)")
  magic = int.from_bytes(raw[:4], "big")
  if magic not in (_IDX_IMAGES_MAGIC, _IDX_LABELS_MAGIC):
    raise DataError(f"{path}: bad idx magic number 0x{magic:08x} (expected "
                    f"0x{_IDX_IMAGES_MAGIC:08x} for images or "
                    f"0x{_IDX_LABELS_MAGIC:08x} for labels)")
  ndim = magic & 0xFF
  header = 4 + 4 * ndim
  dims = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big")
               for i in range(ndim))
  expected = int(np.prod(dims))
  if len(raw) - header != expected:
    raise DataError(f"{path}: header says {dims} ({expected} bytes of data) "
                    f"but the file has {len(raw) - header}")
  return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def read_idx_dir(data_dir: str) -> Tuple[Tuple[np.ndarray, np.ndarray],
                                         Tuple[np.ndarray, np.ndarray]]:
  """Reads the four MNIST-style idx files of `data_dir`.

  Returns ((x_train, y_train), (x_test, y_test)) as uint8 arrays, images
  [n, 28, 28] (whatever rows x cols the header gives).
  """
  expected = ", ".join(f"{s}.gz" for s in IDX_FILES)
  if not os.path.isdir(data_dir):
    raise DataError(f"{data_dir} does not exist: expected a directory with "
                    f"{expected} (.gz or uncompressed)")
  paths = {stem: _find_idx(data_dir, stem) for stem in IDX_FILES}
  missing = [f"{s}.gz" for s, p in paths.items() if p is None]
  if missing:
    raise DataError(f"{data_dir}: missing {', '.join(missing)}: expected "
                    f"{expected} (.gz or uncompressed)")
  arrays = {}
  for stem, path in paths.items():
    arr = read_idx(path)
    want = 3 if "images" in stem else 1
    if arr.ndim != want:
      raise DataError(f"{path}: expected a {want}-d idx file "
                      f"({'images' if want == 3 else 'labels'}), got shape "
                      f"{arr.shape}")
    arrays[stem] = arr
  out = []
  for split in ("train", "t10k"):
    x = arrays[f"{split}-images-idx3-ubyte"]
    y = arrays[f"{split}-labels-idx1-ubyte"]
    if len(x) != len(y):
      raise DataError(f"{data_dir}: {split} has {len(x)} images but {len(y)} "
                      f"labels")
    out.append((x, y))
  return out[0], out[1]


# ---------------------------------------------------------------------------
# CIFAR-10 pickles.

try:  # numpy 2
  from numpy._core import multiarray as _multiarray, numeric as _numeric
except ImportError:  # numpy 1
  from numpy.core import multiarray as _multiarray, numeric as _numeric


def _latin1_bytes(text: str, encoding: str = "latin1") -> bytes:
  """`_codecs.encode` as a pickle of protocol 2 written by Python 3 uses it
  (bytes as their latin-1 text), refusing every other codec."""
  if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
    raise pickle.UnpicklingError(f"it asks _codecs.encode for {encoding!r}; a CIFAR-10 "
                                 "batch uses latin-1 only (refused, not run)")
  return text.encode("latin1")


# What a CIFAR-10 batch may name (a dict of bytes keys, a uint8 array, a list
# of int labels, a list of bytes file names): numpy's array and scalar
# reconstruction under numpy 1's and numpy 2's module names, and bytes as
# Python 3 writes them at protocol 2. Nothing here runs code a file chooses.
_CIFAR10_GLOBALS = {
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    **{(f"numpy.{core}.multiarray", name): getattr(_multiarray, name)
       for core in ("core", "_core") for name in ("_reconstruct", "scalar")},
    **{(f"numpy.{core}.numeric", "_frombuffer"): _numeric._frombuffer
       for core in ("core", "_core")},
    ("_codecs", "encode"): _latin1_bytes,
}


class _Cifar10Unpickler(pickle.Unpickler):
  """An unpickler that resolves only `_CIFAR10_GLOBALS`: any other global a
  file names (`os.system`, `builtins.eval`, ...) is refused before it is
  imported or called."""

  def find_class(self, module: str, name: str):
    try:
      return _CIFAR10_GLOBALS[(module, name)]
    except KeyError:
      raise pickle.UnpicklingError(
          f"it names {module}.{name}, which no CIFAR-10 batch holds (refused, not "
          "run)") from None


def read_cifar10_dir(data_dir: str) -> Tuple[Tuple[np.ndarray, np.ndarray],
                                             Tuple[np.ndarray, np.ndarray]]:
  """Reads CIFAR-10's python batches from `data_dir` or its
  `cifar-10-batches-py/` subfolder. Images uint8 [n, 32, 32, 3]."""
  folder = data_dir
  if not os.path.isfile(os.path.join(folder, CIFAR10_FILES[0])):
    folder = os.path.join(data_dir, CIFAR10_DIR)
  expected = (f"{CIFAR10_DIR}/{{{','.join(CIFAR10_FILES)}}} (the extracted "
              f"https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz)")
  missing = [f for f in CIFAR10_FILES
             if not os.path.isfile(os.path.join(folder, f))]
  if missing:
    raise DataError(f"{data_dir}: missing CIFAR-10 batches "
                    f"{', '.join(missing)}: expected {expected}")
  xs, ys = [], []
  for name in CIFAR10_FILES:
    path = os.path.join(folder, name)
    try:
      with open_data_file(path, "rb", expected="a CIFAR-10 python batch") as f:
        batch = _Cifar10Unpickler(f, encoding="bytes").load()
      data, labels = batch[b"data"], batch[b"labels"]
    except pickle.UnpicklingError as e:
      raise DataError(f"{path}: not a CIFAR-10 python batch: {e}") from None
    except (OSError, EOFError, KeyError, TypeError, ValueError, AttributeError,
            IndexError) as e:
      raise DataError(f"{path}: not a CIFAR-10 python batch ({e!r})") from None
    data = np.asarray(data, dtype=np.uint8)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(data) != len(labels):
      raise DataError(f"{path}: expected [n, 3072] images and n labels, got "
                      f"{data.shape} and {len(labels)}")
    # Stored channel-major (3, 32, 32): Keras models want channels last.
    xs.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
    ys.append(np.asarray(labels, dtype=np.uint8))
  return ((np.concatenate(xs[:-1]), np.concatenate(ys[:-1])), (xs[-1], ys[-1]))


# ---------------------------------------------------------------------------
# Public loaders.


# The files Keras reads without downloading, under its cache's datasets/
# (keras/src/datasets/*.py and get_file: Keras 2 keeps CIFAR-10's archive as
# cifar-10-batches-py.tar.gz, Keras 3 as cifar-10-batches-py-target_archive).
_KERAS_FILES = {
    "mnist": (("mnist.npz",),),
    "fashion_mnist": (tuple(f"fashion-mnist/{s}.gz" for s in IDX_FILES),),
    "cifar10": (("cifar-10-batches-py.tar.gz",), ("cifar-10-batches-py-target_archive",)),
}


def keras_cached(name: str) -> bool:
  """Whether Keras' cache ($KERAS_HOME or ~/.keras, and /tmp/.keras where
  Keras falls back to it) holds `name`'s files, so that `load_data()` reads
  them without a download."""
  home = os.path.expanduser(os.environ.get("KERAS_HOME") or os.path.join("~", ".keras"))
  homes = [home] if os.access(home, os.W_OK) else [home, os.path.join("/tmp", ".keras")]
  return any(all(os.path.isfile(os.path.join(h, "datasets", f)) for f in files)
             for h in homes for files in _KERAS_FILES[name])


def resolve_source(name: str, data_dir: Optional[str] = None,
                   data_source: str = "keras") -> str:
  """Where `name` is read from: "files" (`data_dir`), "keras" or "tfds", by
  the module docstring's rule. No import, no network."""
  if data_source not in DATA_SOURCES:
    raise DataError(f"invalid --data_source={data_source}; valid: "
                    f"{', '.join(DATA_SOURCES)}")
  if data_source == "tfds":
    return "tfds"
  if data_dir:
    return "files"
  if data_source == "keras" or keras_cached(name):
    return "keras"
  if tfds_source.prepared(name) and tfds_source.installed():
    return "tfds"
  return "keras"


def source_label(name: str, data_dir: Optional[str] = None,
                 data_source: str = "keras") -> str:
  """The source in a task's description: `data_dir`, "Keras cache" or
  "TensorFlow Datasets <directory>"."""
  source = resolve_source(name, data_dir, data_source)
  if source == "tfds":
    return f"TensorFlow Datasets {tfds_source.data_dir(data_dir)}"
  return data_dir if source == "files" else "Keras cache"


def official_arrays(name: str, data_dir: Optional[str] = None,
                    data_source: str = "keras"):
  """`name`'s own training and test sets as its source holds them:
  (((x_train, y_train), (x_test, y_test)), where), uint8 images in Keras'
  shapes and the text that names the source in errors."""
  source = resolve_source(name, data_dir, data_source)
  if source == "tfds":  # `auto` reads a copy that is there, never downloads one
    return (tfds_source.load(name, data_dir, download=data_source == "tfds"),
            f"TFDS {name}")
  if source == "files":
    read = read_cifar10_dir if name == "cifar10" else read_idx_dir
    return read(os.path.expanduser(data_dir)), data_dir
  return _keras_load(name), f"Keras {name}"


def _keras_load(name: str):
  import tensorflow as tf  # deferred: only this path needs Keras.
  module = {"mnist": tf.keras.datasets.mnist,
            "fashion_mnist": tf.keras.datasets.fashion_mnist,
            "cifar10": tf.keras.datasets.cifar10}[name]
  try:
    return module.load_data()
  except Exception as e:  # Keras raises a bare Exception on URL failures.
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    if name == "cifar10":
      offline = f"pass --data_dir with {CIFAR10_DIR}/ (data_batch_1..5, test_batch)"
    else:
      offline = f"pass --data_dir with the four idx files ({', '.join(IDX_FILES)}, .gz)"
    raise DataError(f"could not load {name} through Keras ({reason}): {offline}, "
                    f"or pre-place the Keras cache {_KERAS_CACHE[name]}, or use "
                    "--data_source=tfds with a TensorFlow Datasets copy") from e


def _pool(train, test, num_classes: int, where: str):
  x = np.concatenate([train[0], test[0]])
  y = np.concatenate([np.asarray(train[1]).reshape(-1),
                      np.asarray(test[1]).reshape(-1)]).astype(np.int64)
  if len(y) and (y.min() < 0 or y.max() >= num_classes):
    raise DataError(f"{where}: labels outside 0..{num_classes - 1}")
  return x, y


def load_mnist_like(name: str, data_dir: Optional[str] = None,
                    data_source: str = "keras") -> Tuple[np.ndarray, np.ndarray]:
  """MNIST or Fashion-MNIST, train+test pooled, from `data_source` (module
  docstring).

  Returns x float32 [70000, 784] in [0, 1] (0 = background), y int64 0-9.
  """
  if name not in ("mnist", "fashion_mnist"):
    raise ValueError(f"unknown dataset {name!r}")
  (train, test), where = official_arrays(name, data_dir, data_source)
  x, y = _pool(train, test, 10, where)
  if x.ndim != 3 or x.shape[1:] != (28, 28):
    raise DataError(f"{where}: expected 28x28 images, got {x.shape[1:]}")
  return _unit_float32(x.reshape(len(x), -1)), y


def _unit_float32(x: np.ndarray) -> np.ndarray:
  """uint8 pixels as float32 in [0, 1]: `x.astype(np.float32) / 255.0`'s
  numbers, divided in place (one array of the size instead of two: CIFAR-10's
  took seconds of a run's start)."""
  out = x.astype(np.float32)
  np.divide(out, np.float32(255.0), out=out)
  return out


def load_mnist(data_dir: Optional[str] = None, data_source: str = "keras"):
  """MNIST pooled: x float32 [70000, 784] in [0, 1], y int64 0-9."""
  return load_mnist_like("mnist", data_dir, data_source)


def load_fashion_mnist(data_dir: Optional[str] = None, data_source: str = "keras"):
  """Fashion-MNIST pooled: x float32 [70000, 784] in [0, 1], y int64 0-9."""
  return load_mnist_like("fashion_mnist", data_dir, data_source)


def load_cifar10(data_dir: Optional[str] = None, data_source: str = "keras"):
  """CIFAR-10 pooled: x float32 [60000, 32, 32, 3] in [0, 1], y int64 0-9."""
  (x_train, y_train), (x_test, y_test) = load_cifar10_split(data_dir, data_source)
  return np.concatenate([x_train, x_test]), np.concatenate([y_train, y_test])


def load_cifar10_split(data_dir: Optional[str] = None, data_source: str = "keras"):
  """CIFAR-10's own training and test images, ((x, y), (x, y)): x float32
  [n, 32, 32, 3] in [0, 1], y int64 0-9."""
  (train, test), where = official_arrays("cifar10", data_dir, data_source)
  x, y = _pool(train, test, 10, where)
  if x.shape[1:] != (32, 32, 3):
    raise DataError(f"{where}: expected 32x32x3 images, got {x.shape[1:]}")
  n = len(train[0])
  x = _unit_float32(x)
  return (x[:n], y[:n]), (x[n:], y[n:])
