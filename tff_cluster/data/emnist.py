"""Federated EMNIST as TFF publishes it, converted to a FederatedData.

Source: `tff.simulation.datasets.emnist.load_data(only_digits, cache_dir)`
(TFF 0.87), LEAF's per-writer EMNIST. TFF downloads
`https://storage.googleapis.com/tff-datasets-public/emnist_all.sqlite.lzma`,
decompresses it on the fly into `<cache_dir>/emnist_all.sqlite` (default
cache_dir: ~/.tff) and opens that file when it exists; the digits-only and
the 62-class data are tables of that one database (`digits_only_train/test`,
`all_train/test`). So an offline machine works once `emnist_all.sqlite`
(the decompressed .lzma) is placed in the cache directory.

Conventions kept as TFF gives them: pixels float32 in [0, 1] with 1.0 =
background and 0.0 = ink (same as LEAF FEMNIST, inverse of Keras MNIST),
flattened to 784; labels 0-9 digits, 10-35 upper case, 36-61 lower case.
Every writer has train and test examples (TFF's own per-writer split).
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

import numpy as np

from tff_cluster import stack
from tff_cluster.data.federated import DataError, FederatedData

EMNIST_URL = ("https://storage.googleapis.com/tff-datasets-public/"
              "emnist_all.sqlite.lzma")
EMNIST_DB_FILE = "emnist_all.sqlite"
DEFAULT_CACHE_DIR = "~/.tff"


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
  """Federated EMNIST (TFF) -> FederatedData.

  Args:
    only_digits: 10 digit classes (3,383 writers) or all 62 (3,400 writers).
    cache_dir: where TFF keeps `emnist_all.sqlite` (default ~/.tff).
    num_clients: keep a random subset of this many writers (None: all).
      Converting all 3,400 writers to numpy takes minutes.
    seed: seed of that subset.
  """
  require_tff_reader(EMNIST_DB_FILE)
  import tensorflow_federated as tff  # deferred: heavy import.
  where = os.path.expanduser(cache_dir or DEFAULT_CACHE_DIR)
  try:
    train_cd, test_cd = tff.simulation.datasets.emnist.load_data(
        only_digits=only_digits, cache_dir=cache_dir)
  except Exception as e:  # urllib / sqlite / lzma errors: say what to do.
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise DataError(
        f"could not load federated EMNIST ({type(e).__name__}: {reason}): "
        f"offline, download {EMNIST_URL}, decompress it (xz -d) and place "
        f"{EMNIST_DB_FILE} in {where} (or pass that folder as the cache "
        f"directory); delete a partial {EMNIST_DB_FILE} there first") from e
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
      description=f"Federated EMNIST ({kind}, TFF {EMNIST_DB_FILE}), "
                  f"{len(ids)} writers")
