"""Federated CelebA as TFF publishes it (`celeba.sqlite`), read without TFF.

The file: what `tff.simulation.datasets.celeba.load_data` fetches
(`tff_cluster.data.download.CELEBA`), in TFF's sqlite layout
(`tff_cluster.data.tff_sqlite`): LEAF's preprocessing of CelebA, one client
per celebrity, celebrities with fewer than 5 images dropped (9,343 left).
Each Example holds `image` (84 x 84 x 3 int64, 0..255) and the 40 CelebA
attributes as int64 0/1 scalars, as TFF's tensorflow_federated/python/
simulation/datasets/celeba.py (google-parfait/tensorflow-federated at
e2cf8871c2ebcec43cd43272725ce91095692152) parses them. The label here is
`smiling` (LEAF's TARGET_NAME 'Smiling', data/celeba/preprocess/
metadata_to_json.py): 0 or 1, two classes.

Two split groups, TFF's (its documentation's sizes):

* `examples` (split_by_examples_train / _test): every celebrity in both,
  about 90 % of its images to train and 10 % to test (9,343 clients,
  177,457 / 22,831 images): LEAF's `-t sample` split, which LEAF's models
  require. The default.
* `clients` (split_by_clients_train / _test): 8,408 celebrities to train on
  (180,429 images, no test data) and 935 others (19,859 images) as test-only
  clients (never sampled; each tested with the model of lowest loss on its own
  images).

Size: 200,288 images of 21,168 bytes are 4.24 GB as uint8 (the float32 the
model reads would be 17 GB). `load_catalogue` therefore reads only
`client_metadata` and returns a `LazyFederatedData`: its loader reads clients
lo..hi-1 from the file when asked (the `ray` runner's actors each read their
own shard; the `local` runner materializes them all, 4.24 GB of uint8), each
split's images in one uint8 array (`tff_sqlite.read_clients`), used as
`compact.CodedArray`s (float32 k/255 when read).
"""

from __future__ import annotations

import functools
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tff_cluster.data import compact, download, tff_sqlite
from tff_cluster.data.federated import DataError, FederatedData, LazyFederatedData

SPLITS = {"examples": ("split_by_examples_train", "split_by_examples_test"),
          "clients": ("split_by_clients_train", "split_by_clients_test")}
IMAGE_SHAPE = (84, 84, 3)
LABEL = "smiling"
NUM_CLASSES = 2

SOURCE = tff_sqlite.Source(
    title="TFF's federated CelebA", name=download.CELEBA.name,
    origin=download.CELEBA.origin, image_shape=IMAGE_SHAPE, labels=(LABEL,),
    splits=SPLITS["examples"] + SPLITS["clients"], max_bytes=40 << 30)


def check_database(path: str) -> None:
  """DataError (one line) unless `path` opens as TFF's federated CelebA."""
  tff_sqlite.check_database(path, SOURCE)


def fetch_database() -> str:
  """The path of `celeba.sqlite`: from a cache, or downloaded (DownloadError)."""
  return download.fetch(download.CELEBA, check_database)


def load_catalogue(path: str, split: str = "examples", num_clients: Optional[int] = None,
                   seed: int = 0) -> LazyFederatedData:
  """TFF's federated CelebA file -> a `LazyFederatedData` of one client per
  celebrity (module docstring); only `client_metadata` is read now.

  Args:
    path: the database (`celeba.sqlite`).
    split: "examples" or "clients" (the split group).
    num_clients: keep a seeded random subset of this many celebrities (None:
      all); with split="clients" the subset is drawn from the training
      celebrities and every test celebrity is kept.
    seed: seed of that subset.
  """
  if split not in SPLITS:
    raise DataError(f"invalid split {split!r}; valid: {', '.join(SPLITS)}")
  check_database(path)
  train_split, test_split = SPLITS[split]
  train_counts = tff_sqlite.client_counts(path, SOURCE, train_split)
  test_counts = tff_sqlite.client_counts(path, SOURCE, test_split)
  if not train_counts:
    raise tff_sqlite.not_source(path, SOURCE, f"no clients under {train_split!r}")
  if split == "examples":
    ids = tff_sqlite.sample_ids(sorted(set(train_counts) | set(test_counts)),
                                num_clients, seed, "celebrities")
  else:
    both = sorted(set(train_counts) & set(test_counts))
    if both:
      raise tff_sqlite.not_source(path, SOURCE, f"celebrity {both[0]!r} is under both "
                                  f"{train_split!r} and {test_split!r}")
    ids = tff_sqlite.sample_ids(list(train_counts), num_clients, seed,
                                "training celebrities") + list(test_counts)
  train_n = np.array([train_counts.get(c, 0) for c in ids], np.int64)
  test_n = np.array([test_counts.get(c, 0) for c in ids], np.int64)
  kind = ("every celebrity's images split about 90/10 (TFF's split_by_examples)"
          if split == "examples" else
          f"{int((train_n > 0).sum())} training and {int((test_n > 0).sum())} test-only "
          "celebrities (TFF's split_by_clients)")
  description = (f"Federated CelebA, label '{LABEL}' (TFF's {path}): {len(ids)} "
                 f"celebrities, {kind}")
  loader = functools.partial(_load_shard, path, split, tuple(ids),
                             tuple(int(n) for n in train_n), tuple(int(n) for n in test_n),
                             description)
  return LazyFederatedData(client_ids=list(ids), train_counts=train_n, test_counts=test_n,
                           num_classes=NUM_CLASSES, loader=loader, description=description)


def _empty():
  return (compact.CodedArray(np.zeros((0, *IMAGE_SHAPE), np.uint8), compact.UNIT),
          np.zeros((0,), np.int64))


def _load_shard(path: str, split: str, ids: Sequence[str], train_n: Sequence[int],
                test_n: Sequence[int], description: str, lo: int, hi: int
                ) -> FederatedData:
  """Celebrities ids[lo:hi], their images read from the file now."""
  shard = list(ids[lo:hi])
  names = SPLITS[split]
  wanted: Dict[str, List[str]] = {name: [] for name in names}
  counts: Dict[str, Dict[str, int]] = {name: {} for name in names}
  for cid, n_train, n_test in zip(shard, train_n[lo:hi], test_n[lo:hi]):
    for name, n in zip(names, (n_train, n_test)):
      if n:
        wanted[name].append(cid)
        counts[name][cid] = n
  blocks = tff_sqlite.read_clients(path, SOURCE, wanted, counts)
  halves: Tuple[Dict, Dict] = ({}, {})
  for name, half in zip(names, halves):
    block = blocks[name]
    y_all = block.labels[LABEL]
    if len(y_all) and (y_all.min() < 0 or y_all.max() > 1):
      bad = int(y_all[(y_all < 0) | (y_all > 1)][0])
      raise tff_sqlite.not_source(path, SOURCE, f"a '{LABEL}' attribute is {bad}; "
                                  "valid: 0 or 1")
    for cid, (a, b) in block.spans.items():
      half[cid] = (compact.CodedArray(block.images[a:b], compact.UNIT), y_all[a:b])
  train, test = halves
  return FederatedData(shard, {c: train.get(c) or _empty() for c in shard},
                       {c: test.get(c) or _empty() for c in shard}, NUM_CLASSES,
                       description=description)
