"""Federated EMNIST as TFF publishes it (`emnist_all.sqlite`), read without TFF.

The file: TFF's `tff.simulation.datasets.emnist.load_data` fetches
`emnist_all.sqlite.lzma` and reads its decompressed database, LEAF's per-writer
EMNIST (`tff_cluster.data.download.EMNIST` fetches the same file). Its layout
(TFF's `SqlClientData`):

* table `examples` (split_name TEXT, client_id TEXT, serialized_example_proto
  BLOB): one row per image, a serialized `tf.train.Example` with the features
  `pixels` (784 floats, 28 x 28 row-major) and `label` (one int64);
* table `client_metadata` (client_id, split_name, num_examples): the writers
  of each split.

Split names: `all_train` / `all_test` (62 classes, 3,400 writers, 671,585 /
77,483 images by TFF's documentation) and `digits_only_train` /
`digits_only_test` (10 classes, 3,383 writers, 341,873 / 40,832). Every writer
has images in both halves of a split pair (TFF's own per-writer split).

This module reads it with Python's `sqlite3` and TensorFlow's Example parser
(`tf.io.parse_example`); writers come in TFF's order (sorted ids), each
writer's images in row order. Conventions kept as TFF gives them: pixels
float32 in [0, 1] with 1.0 = background and 0.0 = ink (LEAF FEMNIST's too,
the inverse of Keras MNIST), flattened to 784; labels 0-9 digits, 10-35 upper
case, 36-61 lower case.

`load_emnist` is the TFF route kept for TFF pipelines: TFF's own reader and
`ClientData`, converted by `client_data_to_federated`; it needs TFF.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from tff_cluster import stack
from tff_cluster.data import compact, download, tff_sqlite
from tff_cluster.data.federated import MAX_FILE_BYTES, DataError, FederatedData, packed

EMNIST_URL = download.EMNIST.origin
EMNIST_DB_FILE = download.EMNIST.name
DEFAULT_CACHE_DIR = download.TFF_CACHE  # TFF's own cache (load_emnist)

SPLITS = {False: ("all_train", "all_test"), True: ("digits_only_train", "digits_only_test")}
NUM_CLASSES = {False: 62, True: 10}
TABLES = {"examples": ("split_name", "client_id", "serialized_example_proto"),
          "client_metadata": ("client_id", "split_name")}
IMAGE_PIXELS = 784
_BATCH = 4096  # examples parsed at once

Arrays = Tuple[np.ndarray, np.ndarray]


SOURCE = tff_sqlite.Source(title="TFF's federated EMNIST", name=EMNIST_DB_FILE,
                           origin=EMNIST_URL, image_shape=(), labels=(), splits=SPLITS[False],
                           max_bytes=MAX_FILE_BYTES, tables=TABLES, unit="writers")
is_database = tff_sqlite.is_database  # by its header, whatever its name


def _not_emnist(path: str, why: str) -> DataError:
  return tff_sqlite.not_source(path, SOURCE, why)


def check_database(path: str) -> None:
  """Raises a DataError (one line) unless `path` opens as TFF's federated
  EMNIST: both tables with their columns, and the 62-class split names."""
  tff_sqlite.check_database(path, SOURCE)


def writer_ids(path: str, only_digits: bool = False) -> List[str]:
  """The writers with images in both halves of the split, sorted (TFF's order)."""
  return tff_sqlite.ids_in_both(path, SOURCE, *SPLITS[only_digits])


def _parse(protos: Sequence[bytes], path: str) -> Arrays:
  """Serialized Examples -> (pixels [n, 784] float32, labels [n] int64)."""
  tf = stack.import_tensorflow()
  features = {"pixels": tf.io.FixedLenFeature((IMAGE_PIXELS,), tf.float32),
              "label": tf.io.FixedLenFeature((), tf.int64)}
  try:
    parsed = tf.io.parse_example(tf.constant(list(protos), tf.string), features)
  except (tf.errors.InvalidArgumentError, ValueError) as e:
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise _not_emnist(path, f"an example does not parse: {reason[:200]}") from None
  return parsed["pixels"].numpy(), parsed["label"].numpy().astype(np.int64)


def read_examples(path: str, splits: Sequence[str],
                  writers: Optional[Iterable[str]] = None,
                  keep: Optional[Callable[[np.ndarray], np.ndarray]] = None
                  ) -> Dict[str, Dict[str, Arrays]]:
  """split name -> writer -> (x [n, 784], y [n]) of the named splits, in one
  pass over the table; `writers` limits the writers read, `keep` (labels ->
  bool mask) the images kept. Writers without kept images are absent.
  Images whose pixels are all k/255 (TFF's are) come as `compact.CodedArray`s
  (their 8-bit codes; the same float32 values when read)."""
  wanted = None if writers is None else set(writers)
  chunks: Dict[Tuple[str, str], Tuple[List[np.ndarray], List[np.ndarray]]] = {}
  for rows in tff_sqlite.example_rows(path, SOURCE, splits, wanted, _BATCH):
    x, y = _parse([r[2] for r in rows], path)
    x = compact.compact(x)  # k/255 pixels: kept as their 8-bit codes
    mask = np.ones(len(y), bool) if keep is None else np.asarray(keep(y), bool)
    start = 0
    for i in range(1, len(rows) + 1):  # runs of one writer's rows
      if i < len(rows) and rows[i][:2] == rows[start][:2]:
        continue
      sel = np.flatnonzero(mask[start:i]) + start
      if len(sel):
        xs, ys = chunks.setdefault(rows[start][:2], ([], []))
        xs.append(x[sel])  # a copy: the batch's arrays are freed
        ys.append(y[sel])
      start = i
  out: Dict[str, Dict[str, Arrays]] = {s: {} for s in splits}
  for (split, writer), (xs, ys) in chunks.items():
    out[split][writer] = ((xs[0], ys[0]) if len(xs) == 1 else
                          (compact.concatenate(xs), np.concatenate(ys)))
  return out


def load_database(path: str, only_digits: bool = False,
                  num_clients: Optional[int] = None, seed: int = 0) -> FederatedData:
  """TFF's federated EMNIST file -> FederatedData, one client per writer.

  Args:
    path: the database (`emnist_all.sqlite`).
    only_digits: the `digits_only_*` splits (10 classes) instead of `all_*` (62).
    num_clients: keep a seeded random subset of this many writers (None: all),
      drawn like `leaf.sample_clients` from TFF's writer order; only those are read.
    seed: seed of that subset.
  """
  check_database(path)
  ids = writer_ids(path, only_digits)
  if not ids:
    raise _not_emnist(path, f"no writer in both {' and '.join(SPLITS[only_digits])}")
  if num_clients is not None and num_clients < len(ids):
    if num_clients < 1:
      raise DataError(f"--num_clients must be >= 1, got {num_clients}")
    pick = np.sort(np.random.default_rng(seed).choice(len(ids), num_clients, replace=False))
    ids = [ids[i] for i in pick]
  train_split, test_split = SPLITS[only_digits]
  num_classes = NUM_CLASSES[only_digits]
  read = read_examples(path, (train_split, test_split), writers=ids)
  empty = (np.zeros((0, IMAGE_PIXELS), np.float32), np.zeros((0,), np.int64))
  train, test = {}, {}
  for cid in ids:
    train[cid] = read[train_split].get(cid, empty)
    test[cid] = read[test_split].get(cid, empty)
    for _, y in (train[cid], test[cid]):
      if len(y) and (y.min() < 0 or y.max() >= num_classes):
        raise DataError(f"{path}: writer {cid!r}: label outside 0..{num_classes - 1}")
  kind = "digits" if only_digits else "62 classes"
  return packed(FederatedData(ids, train, test, num_classes, description=(
      f"Federated EMNIST ({kind}, TFF's {path}), {len(ids)} writers")))


def pool_database(path: str, keep: Callable[[np.ndarray], np.ndarray]
                  ) -> Arrays:
  """The 62-class images whose labels `keep` selects: every writer's train
  images, then every writer's test images, writers in TFF's order."""
  check_database(path)
  ids = writer_ids(path)
  read = read_examples(path, SPLITS[False], writers=ids, keep=keep)
  xs, ys = [], []
  for split in SPLITS[False]:
    for cid in ids:
      if cid in read[split]:
        xs.append(read[split][cid][0])
        ys.append(read[split][cid][1])
  if not xs:
    return np.zeros((0, IMAGE_PIXELS), np.float32), np.zeros((0,), np.int64)
  return compact.decode(compact.concatenate(xs)), np.concatenate(ys)


def fetch_database() -> str:
  """The path of `emnist_all.sqlite`: from a cache, or downloaded (DownloadError)."""
  return download.fetch(download.EMNIST, check_database)


# ---------------------------------------------------------------------------
# The TFF route: TFF's own reader and ClientData.


def _client_arrays(client_data, client_id: str):
  # One writer's examples as arrays; TFF yields {'label', 'pixels'} dicts.
  xs, ys = [], []
  for batch in client_data.create_tf_dataset_for_client(client_id).batch(4096):
    xs.append(np.asarray(batch["pixels"], np.float32).reshape(
        len(batch["label"]), -1))
    ys.append(np.asarray(batch["label"]).reshape(-1).astype(np.int64))
  if not xs:
    return np.zeros((0, 784), np.float32), np.zeros((0,), np.int64)
  return np.concatenate(xs), np.concatenate(ys)


def client_data_to_federated(train_cd, test_cd, num_classes: int,
                             client_ids: Optional[Sequence[str]] = None,
                             description: str = "") -> FederatedData:
  """TFF train/test `ClientData` ({'pixels', 'label'}) -> FederatedData.

  Keeps writers present in both splits, in the train ClientData's order (or
  `client_ids`' order when given).
  """
  test_ids = set(test_cd.client_ids)
  ids = list(client_ids) if client_ids is not None else [
      c for c in train_cd.client_ids if c in test_ids]
  train, test = {}, {}
  for cid in ids:
    train[cid] = _client_arrays(train_cd, cid)
    test[cid] = _client_arrays(test_cd, cid)
    for x, y in (train[cid], test[cid]):
      if len(y) and (y.min() < 0 or y.max() >= num_classes):
        raise DataError(f"EMNIST client {cid!r}: label outside "
                        f"0..{num_classes - 1}")
  return FederatedData(ids, train, test, num_classes, description=description)


def require_tff_reader(what: str) -> None:
  """A `DataError` (one line) where TFF, whose reader these files need, is missing."""
  problem = stack.tff_problem()
  if problem is not None:
    raise DataError(f"reading TFF's {what} needs TensorFlow Federated, which this stack "
                    "lacks: use the TFF stack (`uv sync --extra tff` on Python "
                    "3.10/3.11), or give LEAF FEMNIST JSON as --data_dir")


def load_emnist(only_digits: bool = True, cache_dir: Optional[str] = None,
                num_clients: Optional[int] = None, seed: int = 0
                ) -> FederatedData:
  """Federated EMNIST through TFF's reader -> FederatedData (needs TFF; the
  tasks use `load_database`, which does not).

  Args:
    only_digits: 10 digit classes (3,383 writers) or all 62 (3,400 writers).
    cache_dir: the folder of `emnist_all.sqlite`, fetched into it when
      absent (default: the caches `download.fetch` searches, then a download
      into `$TFF_CLUSTER_DATA`).
    num_clients: keep a random subset of this many writers (None: all).
      Converting all 3,400 writers to numpy takes minutes.
    seed: seed of that subset.
  """
  require_tff_reader(EMNIST_DB_FILE)
  db = download.fetch(download.EMNIST, check_database, root=cache_dir,
                      other=cache_dir is None)
  import tensorflow_federated as tff  # deferred: heavy import.
  try:
    train_cd, test_cd = tff.simulation.datasets.emnist.load_data(
        only_digits=only_digits, cache_dir=os.path.dirname(db))
  except Exception as e:  # sqlite / proto errors: one line naming the file.
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise _not_emnist(db, f"{type(e).__name__}: {reason}") from e
  num_classes = 10 if only_digits else 62
  test_ids = set(test_cd.client_ids)
  ids = [c for c in train_cd.client_ids if c in test_ids]
  if num_clients is not None and num_clients < len(ids):
    rng = np.random.default_rng(seed)
    ids = [ids[i] for i in sorted(rng.choice(len(ids), num_clients,
                                             replace=False))]
  kind = "digits" if only_digits else "62 classes"
  return client_data_to_federated(
      train_cd, test_cd, num_classes, ids,
      description=f"Federated EMNIST ({kind}, TFF {EMNIST_DB_FILE}), {len(ids)} writers")
