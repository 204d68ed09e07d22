"""TensorFlow Datasets (TFDS) as a source of the vision tasks' arrays.

`load(name)` reads MNIST, Fashion-MNIST or CIFAR-10 from a TFDS copy (the
`tfds` extra: `pip install 'tff-cluster[tfds]'`) and returns what
`tf.keras.datasets.<name>.load_data()` returns: ((x_train, y_train),
(x_test, y_test)), uint8 images in Keras' shapes ([n, 28, 28] or
[n, 32, 32, 3]) and uint8 labels ([n] for MNIST and Fashion-MNIST, [n, 1] for
CIFAR-10), in the original files' order. The vision loaders
(`tff_cluster.data.vision`) then scale, pool and partition them exactly as
they do Keras' arrays, so both sources give the same clients.

The order. TFDS does not store a split in the order of its source files: when
it prepares a copy, every example has a key (for these three data sets, its
position in the source files: 0, 1, 2, ...) and the examples are written
sorted by the 128-bit md5 hash of the split's name followed by the key's
decimal text (`train` + `17`), then read back in that order. That order is
part of a TFDS data set's version (the hash may not change without a new major
version), so it is restored here:

* CIFAR-10 (version 3.0.2) stores each image's position in its `id` feature
  (`train_00017`): the images are put back by it, and a copy whose ids are not
  exactly train_00000.. / test_00000.. is refused.
* MNIST and Fashion-MNIST (version 3.0.1) store no id: the position of key i
  is recomputed from the hash rule above (`stored_keys`). A copy prepared with
  `disable_shuffling` holds the files' order already; one prepared with
  `nondeterministic_order` has no known order and is refused.

tests/test_tfds.py checks the rule against TFDS's own writer (a copy prepared
by TFDS's MNIST and CIFAR-10 builders from small files made in the test) and
that one array set read through TFDS and through Keras gives the same clients.

Nothing here imports TensorFlow or TFDS until `load` runs; `prepared` only
looks for the copy's files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
from typing import Optional, Tuple

import numpy as np

from tff_cluster.data.federated import DataError

INSTALL = "pip install 'tff-cluster[tfds]'"


@dataclasses.dataclass(frozen=True)
class _Copy:
  """A TFDS data set as this project reads it."""
  tfds_name: str
  version: str            # the TFDS version whose order `load` restores
  image_shape: Tuple[int, ...]  # one image as Keras gives it
  label_column: bool      # Keras' labels are [n, 1] (CIFAR-10), else [n]
  by_id: bool             # the positions are in the `id` feature


DATASETS = {
    "mnist": _Copy("mnist", "3.0.1", (28, 28), False, False),
    "fashion_mnist": _Copy("fashion_mnist", "3.0.1", (28, 28), False, False),
    "cifar10": _Copy("cifar10", "3.0.2", (32, 32, 3), True, True),
}
SPLITS = ("train", "test")
_BATCH = 4096  # examples per step when reading a split


def installed() -> bool:
  """Whether tensorflow_datasets can be imported (without importing it)."""
  try:
    return importlib.util.find_spec("tensorflow_datasets") is not None
  except (ImportError, ValueError):
    return False


def missing_message() -> str:
  """The one line for `--data_source=tfds` without TFDS installed."""
  return ("--data_source=tfds needs TensorFlow Datasets, which is not installed; valid: "
          f"{INSTALL} (Python 3.11+), or --data_source=keras")


def data_dir(given: Optional[str] = None) -> str:
  """TFDS's data directory: `given` (--data_dir with --data_source=tfds), else
  $TFDS_DATA_DIR, else ~/tensorflow_datasets (TFDS's own default)."""
  return os.path.expanduser(given or os.environ.get("TFDS_DATA_DIR")
                            or os.path.join("~", "tensorflow_datasets"))


def copy_path(name: str, given_dir: Optional[str] = None) -> str:
  """Where a prepared copy of `name` lives: <data_dir>/<name>/<version>."""
  spec = DATASETS[name]
  return os.path.join(data_dir(given_dir), spec.tfds_name, spec.version)


def prepared(name: str, given_dir: Optional[str] = None) -> bool:
  """Whether a prepared copy of `name` (its dataset_info.json) is on this
  machine's disk; no import, no network."""
  return os.path.isfile(os.path.join(copy_path(name, given_dir), "dataset_info.json"))


def stored_keys(split: str, n: int) -> np.ndarray:
  """The keys of a split of n examples in the order TFDS stores them: key i
  (the example's position in the source files) sorted by
  md5(split name + decimal i) as a 128-bit integer."""
  salt = hashlib.md5(split.encode("utf-8"))
  def digest(i: int) -> bytes:
    h = salt.copy()
    h.update(str(i).encode("ascii"))
    return h.digest()
  # Big-endian digests sort as the integers they spell.
  return np.asarray(sorted(range(n), key=digest), dtype=np.int64)


def _import_tfds():
  try:
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise DataError(missing_message()) from None
  return tfds


def _first_line(error: BaseException) -> str:
  text = str(error).strip()
  return text.splitlines()[0] if text else type(error).__name__


def load(name: str, given_dir: Optional[str] = None, download: bool = True):
  """((x_train, y_train), (x_test, y_test)) of `name` from TFDS in Keras'
  dtypes, shapes and order (module docstring). A copy missing from the data
  directory is prepared by TFDS first (its download) when `download`, else
  refused; every failure is one DataError line."""
  spec = DATASETS[name]
  tfds = _import_tfds()
  root = data_dir(given_dir)
  full = f"{spec.tfds_name}:{spec.version}"
  try:
    builder = tfds.builder(full, data_dir=root)
  except Exception as e:  # noqa: BLE001 - TFDS raises many kinds; one line each
    raise DataError(f"TensorFlow Datasets cannot open {full} ({_first_line(e)}); valid: "
                    "tensorflow-datasets>=4.9.10, or --data_source=keras") from None
  if not builder.is_prepared():
    if not download:
      raise DataError(f"TensorFlow Datasets has no complete copy of {full} in {root}; "
                      "valid: --data_source=tfds (which prepares it) or --data_source=keras")
    try:
      builder.download_and_prepare()
    except Exception as e:  # noqa: BLE001
      raise DataError(
          f"TensorFlow Datasets could not prepare {full} in {root} ({_first_line(e)}); "
          f"offline: prepare it where there is network (`tfds build {spec.tfds_name}`) and "
          f"copy {spec.tfds_name}/{spec.version}/ into {root}, or use "
          "--data_source=keras") from None
  return tuple(_read_split(tfds, builder, spec, split, f"TFDS {full} {split}")
               for split in SPLITS)


def _read_split(tfds, builder, spec: _Copy, split: str, where: str):
  read_config = tfds.ReadConfig(interleave_cycle_length=1)  # the files in order
  try:
    ds = builder.as_dataset(split=split, shuffle_files=False, read_config=read_config)
    images, labels, ids = [], [], []
    for batch in tfds.as_numpy(ds.batch(_BATCH)):
      images.append(np.asarray(batch["image"]))
      labels.append(np.asarray(batch["label"]).reshape(-1))
      if spec.by_id:
        ids.extend(batch["id"].tolist())
  except DataError:
    raise
  except Exception as e:  # noqa: BLE001 - a damaged copy: one line
    raise DataError(f"{where}: cannot read it ({_first_line(e)})") from None
  if not images:
    raise DataError(f"{where}: no examples")
  x, y = np.concatenate(images), np.concatenate(labels)
  n = len(x)
  if x.dtype != np.uint8 or x.size != n * int(np.prod(spec.image_shape)):
    raise DataError(f"{where}: expected uint8 images of {spec.image_shape}, got "
                    f"{x.dtype} {x.shape[1:]}")
  if len(y) != n:
    raise DataError(f"{where}: {n} images but {len(y)} labels")
  if n and (y.min() < 0 or y.max() > 9):
    raise DataError(f"{where}: labels outside 0..9")
  expected = _expected_count(builder, split)
  if expected and expected != n:
    raise DataError(f"{where}: read {n} examples, its dataset_info.json says {expected} "
                    "(an incomplete copy: prepare it again)")
  keys = _keys(builder, spec, split, n, ids, where)
  x = x.reshape((n, *spec.image_shape))
  y = y.astype(np.uint8)
  original_x, original_y = np.empty_like(x), np.empty_like(y)
  original_x[keys], original_y[keys] = x, y  # stored example j is original keys[j]
  return original_x, (original_y.reshape(-1, 1) if spec.label_column else original_y)


def _expected_count(builder, split: str) -> int:
  """The split's number of examples by the copy's metadata (0: unknown)."""
  try:
    return int(builder.info.splits[split].num_examples)
  except Exception:  # noqa: BLE001 - no metadata for the split (e.g. TFDS mocked)
    return 0


def _keys(builder, spec: _Copy, split: str, n: int, ids, where: str) -> np.ndarray:
  """Each stored example's position in the source files."""
  if spec.by_id:
    prefix = f"{split}_"
    try:
      keys = np.asarray([int(i.decode("utf-8")[len(prefix):]) for i in ids
                         if i.decode("utf-8").startswith(prefix)], dtype=np.int64)
    except ValueError:
      keys = np.zeros(0, np.int64)
    if len(keys) != n or not np.array_equal(np.sort(keys), np.arange(n)):
      raise DataError(f"{where}: its ids are not {prefix}00000..{prefix}{n - 1:05d}, so "
                      "the original order cannot be restored; valid: a copy prepared by "
                      "TFDS's cifar10 builder, or --data_source=keras")
    return keys
  info = builder.info
  if getattr(info, "disable_shuffling", False):
    return np.arange(n)
  if getattr(info, "nondeterministic_order", False):
    raise DataError(f"{where}: prepared with nondeterministic_order, so the original order "
                    "cannot be restored; valid: a copy prepared by TFDS's default writer, "
                    "or --data_source=keras")
  return stored_keys(split, n)
