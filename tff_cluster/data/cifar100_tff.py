"""Federated CIFAR-100 as TFF publishes it (`cifar100.sqlite`), read without TFF.

The file: what `tff.simulation.datasets.cifar100.load_data` fetches
(`tff_cluster.data.download.CIFAR100`), TFF's sqlite layout
(`tff_cluster.data.tff_sqlite`) with the splits `train` (500 clients, ids
"0".."499", 100 images each: a partition of CIFAR-100's 50,000 training
images) and `test` (100 clients, ids "0".."99": a partition of its 10,000 test
images). TFF drew each client's images by Pachinko allocation (coarse labels
~ Dir(0.1), fine labels within a coarse one ~ Dir(10)). Each Example holds
`image` (32 x 32 x 3 int64, 0..255), `label` (fine, 0..99) and
`coarse_label` (0..19), as TFF's tensorflow_federated/python/simulation/
datasets/cifar100.py (google-parfait/tensorflow-federated at
95bc1383b59323c2447c3c6ef2fe35269836560f) parses them.

`load_database` makes one `FederatedData`: the 500 training clients, ids
"train_<TFF id>", then the 100 test clients, ids "test_<TFF id>" (TFF's two
id ranges overlap: "7" is a training client and a test client), each range
in TFF's order (sorted ids). The test clients have no training data: they are
test-only (never sampled; each is tested with the model of lowest loss on its
own test images). The training clients have no test data in TFF's file, and
by default get none: the test accuracy is then over CIFAR-100's 10,000 test
images, Reddi et al.'s evaluation (TFF's baseline evaluates the same test
split). `holdout` > 0 instead moves that share of each training client's
images (seeded) into its own test set, for protocols that score clients on
their own data. Images are kept as their 8-bit codes (`compact.CodedArray`,
float32 k/255 when read).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from tff_cluster.data import compact, download, tff_sqlite
from tff_cluster.data.federated import DataError, FederatedData, split_counts

SPLITS = ("train", "test")
IMAGE_SHAPE = (32, 32, 3)
LABELS = {"fine": ("label", 100), "coarse": ("coarse_label", 20)}
TRAIN_PREFIX, TEST_PREFIX = "train_", "test_"

SOURCE = tff_sqlite.Source(
    title="TFF's federated CIFAR-100", name=download.CIFAR100.name,
    origin=download.CIFAR100.origin, image_shape=IMAGE_SHAPE,
    labels=("label", "coarse_label"), splits=SPLITS, max_bytes=4 << 30)


def check_database(path: str) -> None:
  """DataError (one line) unless `path` opens as TFF's federated CIFAR-100."""
  tff_sqlite.check_database(path, SOURCE)


def fetch_database() -> str:
  """The path of `cifar100.sqlite`: from a cache, or downloaded (DownloadError)."""
  return download.fetch(download.CIFAR100, check_database)


def _empty():
  return (compact.CodedArray(np.zeros((0, *IMAGE_SHAPE), np.uint8), compact.UNIT),
          np.zeros((0,), np.int64))


def load_database(path: str, labels: str = "fine", num_clients: Optional[int] = None,
                  seed: int = 0, holdout: float = 0.0) -> FederatedData:
  """TFF's federated CIFAR-100 file -> FederatedData (module docstring).

  Args:
    path: the database (`cifar100.sqlite`).
    labels: "fine" (100 classes, TFF's `label`) or "coarse" (20, `coarse_label`).
    num_clients: keep a seeded random subset of this many training clients
      (None: all 500); the 100 test clients are always kept.
    seed: seed of that subset and of the holdout.
    holdout: the share of each training client's images moved into its own
      test set (0: none, the training clients have no test data).
  """
  if labels not in LABELS:
    raise DataError(f"invalid labels {labels!r}; valid: {', '.join(LABELS)}")
  if not 0.0 <= holdout < 1.0:
    raise DataError(f"invalid holdout {holdout!r}; valid: a number in [0, 1)")
  check_database(path)
  counts = {split: tff_sqlite.client_counts(path, SOURCE, split) for split in SPLITS}
  if not counts["train"]:
    raise tff_sqlite.not_source(path, SOURCE, "no clients under the split name 'train'")
  train_ids = tff_sqlite.sample_ids(list(counts["train"]), num_clients, seed,
                                    "training clients")
  test_ids = list(counts["test"])
  blocks = tff_sqlite.read_clients(path, SOURCE, {"train": train_ids, "test": test_ids},
                                   counts)
  field, num_classes = LABELS[labels]
  rng = np.random.default_rng(seed)
  ids, train, test = [], {}, {}
  for split, tff_ids, prefix in (("train", train_ids, TRAIN_PREFIX),
                                 ("test", test_ids, TEST_PREFIX)):
    block = blocks[split]
    y_all = block.labels[field]
    if len(y_all) and (y_all.min() < 0 or y_all.max() >= num_classes):
      bad = int(y_all[(y_all < 0) | (y_all >= num_classes)][0])
      raise tff_sqlite.not_source(path, SOURCE, f"a {field} is {bad}; valid: "
                                  f"0..{num_classes - 1}")
    for cid in tff_ids:
      lo, hi = block.spans[cid]
      x = compact.CodedArray(block.images[lo:hi], compact.UNIT)
      y = y_all[lo:hi]
      name = prefix + cid
      ids.append(name)
      if split == "test":
        train[name], test[name] = _empty(), (x, y)
      elif holdout > 0 and hi - lo >= 2:
        keep, _ = split_counts(hi - lo, 1.0 - holdout)
        order = rng.permutation(hi - lo)
        train[name] = (x[order[:keep]], y[order[:keep]])
        test[name] = (x[order[keep:]], y[order[keep:]])
      else:
        train[name], test[name] = (x, y), _empty()
  held = (f", {holdout:g} of each training client's images held out as its test set"
          if holdout > 0 else "")
  return FederatedData(ids, train, test, num_classes, description=(
      f"Federated CIFAR-100 ({labels} labels, {num_classes} classes; TFF's {path}): "
      f"{len(train_ids)} training clients and {len(test_ids)} test-only clients{held}"))
