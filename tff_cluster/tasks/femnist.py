"""LEAF FEMNIST (per-writer handwriting) and label-subset / rotated views.

Data, each writer one client with its own train/test split; pixels in LEAF's
convention (floats in [0, 1], 1.0 = background), the same in both sources:
* no `--data_dir`: TFF's federated EMNIST (`emnist_all.sqlite`, all 3,400
  writers of LEAF's FEMNIST), fetched on first use into `$TFF_CLUSTER_DATA`
  (`tff_cluster.data.download`) and read without TFF
  (`tff_cluster.data.emnist`); the digit views read its `digits_only_*`
  splits (3,383 writers), the others its 62-class `all_*` splits;
* `--data_dir` naming such a database (any file name), or a folder holding
  `emnist_all.sqlite`: that file;
* otherwise `--data_dir` is LEAF's FEMNIST JSON (train/*.json and
  test/*.json, made by LEAF's `./preprocess.sh -s niid --sf 0.05 -k 0 -t
  sample`, a 5 % sample of the writers).

Model: the MLP 784-512-<classes> FedGroup uses for FEMNIST (`--model=mlp`, the
default), or MCLR 784-><classes> (`--model=mclr`). Defaults follow
FedGroup (Duan et al., "FedGroup: Efficient Clustered Federated Learning via
Decomposed Data-Driven Measure", Section 5.1): lr 0.003, batch 10, E = 20
local epochs, 20 clients per round, FedProx's mu = 1 and T = 200 rounds (the
FedGroup paper does not state T; 200 is FedProx's). These are LEAF's 62-class
writers; the paper's "FEMNIST" is FedProx's 10-letter sample, `femnist_fedprox`.

Views (same writers, relabelled; a writer left without train or test samples
in a view is dropped):
  femnist_digits   labels 0-9 only (10 classes)
  femnist_upper    labels 10-35 -> 0-25 (upper-case letters)
  femnist_lower    labels 36-61 -> 0-25 (lower-case letters)
  rotated_femnist_digits  digits view; writers dealt evenly to m clusters
                   (DataOptions.extra['num_clusters'], default 4) and cluster
                   k's images rotated by 90*k degrees (IFCA-style rotations on
                   real writers); true_clusters = the rotation cluster.
`DataOptions.num_clients` keeps a seeded random subset of the writers.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import numpy as np

from tff_cluster import models
from tff_cluster.data import emnist, leaf
from tff_cluster.data.federated import DataError, FederatedData
from tff_cluster.data.partition import ROTATIONS, rotate_images
from tff_cluster.spec.hparams import HParam
from tff_cluster.spec.task import DataOptions, TaskSpec, task_arg

DEFAULTS = dict(rounds=200, clients_per_round=20, local_epochs=20, batch_size=10,
                client_lr=0.003, mu=1.0, num_clients=None)  # None: all writers

SOURCE = "FedGroup (Duan et al.) FEMNIST setting; LEAF FEMNIST data"
HIDDEN = 512

# name -> (first raw label, number of classes) of the label-range views.
NUM_CLUSTERS = HParam("num_clusters", int, 4, "rotation clusters", low=1,
                      high=len(ROTATIONS))

VIEWS = {"femnist_digits": (0, 10), "femnist_upper": (10, 26),
         "femnist_lower": (36, 26)}

DATA_TEXT = ("TFF's federated EMNIST, all writers, fetched on first use; or --data_dir: "
             "LEAF JSON train/ and test/, or emnist_all.sqlite")


def find_source(data_dir: Optional[str]) -> Tuple[str, str]:
  """("sqlite" | "leaf", path) for `--data_dir` (module docstring); no
  `data_dir`: TFF's database, fetched when no cache holds it."""
  if not data_dir:
    return "sqlite", emnist.fetch_database()
  path = os.path.expanduser(str(data_dir))
  if os.path.isfile(path) and emnist.is_database(path):
    return "sqlite", path
  if os.path.isdir(path) and os.path.isfile(os.path.join(path, emnist.EMNIST_DB_FILE)):
    return "sqlite", os.path.join(path, emnist.EMNIST_DB_FILE)
  return "leaf", path


def _load(options: DataOptions, only_digits: bool = False) -> FederatedData:
  # The database's digits_only_* splits serve the digit views; LEAF JSON has
  # only the 62-class data, which the views relabel.
  kind, path = find_source(options.data_dir)
  if kind == "sqlite":
    return emnist.load_database(path, only_digits=only_digits,
                                num_clients=options.num_clients, seed=options.seed)
  return leaf.sample_clients(leaf.load_femnist(path, seed=options.seed),
                             options.num_clients, options.seed)


def load_femnist(options: DataOptions) -> FederatedData:
  """All 62 classes, one client per writer."""
  return _load(options)


def label_view(data: FederatedData, first: int, num_classes: int,
               name: str) -> FederatedData:
  """Keeps labels first..first+num_classes-1, relabelled to 0..num_classes-1.

  Writers without train or test samples in the range are dropped (they could
  be neither trained nor evaluated).
  """
  def select(x, y):
    keep = (y >= first) & (y < first + num_classes)
    return x[keep], (y[keep] - first).astype(y.dtype)

  ids, train, test = [], {}, {}
  for cid in data.client_ids:
    tr, te = select(*data.train[cid]), select(*data.test[cid])
    if len(tr[1]) and len(te[1]):
      ids.append(cid)
      train[cid], test[cid] = tr, te
  if not ids:
    raise DataError(f"{name}: no writer has train and test samples with labels "
                    f"{first}..{first + num_classes - 1}")
  return FederatedData(ids, train, test, num_classes, description=(
      f"{data.description}; view {name}: labels {first}-{first + num_classes - 1}"
      f" -> 0-{num_classes - 1}, {len(ids)} writers"))


def _load_view(options: DataOptions, name: str) -> FederatedData:
  first, num_classes = VIEWS[name]
  return label_view(_load(options, only_digits=name == "femnist_digits"), first,
                    num_classes, name)


def rotate_writers(data: FederatedData, num_clusters: int, seed: int
                   ) -> FederatedData:
  """Deals writers evenly to `num_clusters` clusters (seeded) and rotates
  cluster k's train and test images by ROTATIONS[k] = 90*k degrees."""
  if not 1 <= num_clusters <= len(ROTATIONS):
    raise DataError(f"num_clusters must be 1..{len(ROTATIONS)} for rotation "
                    f"clusters, got {num_clusters}")
  rng = np.random.default_rng(seed)
  # Shuffled round-robin: cluster sizes differ by at most one.
  clusters = rng.permutation(data.num_clients) % num_clusters
  train, test = {}, {}
  for cid, k in zip(data.client_ids, clusters):
    for split, src in ((train, data.train), (test, data.test)):
      x, y = src[cid]
      split[cid] = (rotate_images(x, ROTATIONS[k]), y)
  return FederatedData(list(data.client_ids), train, test, data.num_classes,
                       true_clusters=clusters, description=(
                           f"{data.description}; writers in {num_clusters} "
                           f"rotation clusters {list(ROTATIONS[:num_clusters])}"))


def load_rotated_digits(options: DataOptions) -> FederatedData:
  m = task_arg(options, NUM_CLUSTERS)
  return rotate_writers(_load_view(options, "femnist_digits"), m, options.seed)


def _mlp(num_classes: int):
  return lambda: models.mlp(leaf.IMAGE_PIXELS, HIDDEN, num_classes)


def _mclr(num_classes: int):
  return lambda: models.mclr(leaf.IMAGE_PIXELS, num_classes)


def _cnn_dropout():
  """FLUTE's FEMNIST model (`models.cnn_dropout`, 62 classes)."""
  return models.cnn_dropout(num_classes=leaf.FEMNIST_NUM_CLASSES)


def _view_spec(name: str, what: str) -> TaskSpec:
  return TaskSpec(
      name=name,
      description=f"LEAF FEMNIST writers, {what} only, MLP 784-512-"
                  f"{VIEWS[name][1]} ({DATA_TEXT})",
      load_data=lambda options: _load_view(options, name),
      model_fn=_mlp(VIEWS[name][1]), model_name="mlp",
      other_models={"mclr": _mclr(VIEWS[name][1])}, loss=models.SPARSE_CE_LOGITS,
      defaults=DEFAULTS, source=SOURCE)


TASKS = [
    TaskSpec(
        name="femnist",
        description="LEAF FEMNIST, one client per writer, 62 classes, MLP "
                    f"784-512-62 ({DATA_TEXT})",
        load_data=load_femnist, model_fn=_mlp(leaf.FEMNIST_NUM_CLASSES), model_name="mlp",
        other_models={"mclr": _mclr(leaf.FEMNIST_NUM_CLASSES), "cnn_dropout": _cnn_dropout},
        loss=models.SPARSE_CE_LOGITS, defaults=DEFAULTS, source=SOURCE),
    _view_spec("femnist_digits", "digits 0-9"),
    _view_spec("femnist_upper", "upper-case letters (10-35 -> 0-25)"),
    _view_spec("femnist_lower", "lower-case letters (36-61 -> 0-25)"),
    TaskSpec(
        name="rotated_femnist_digits",
        description="LEAF FEMNIST digit writers in m rotation clusters (extra "
                    "num_clusters, default 4; 0/90/180/270 deg), MLP 784-512-10",
        load_data=load_rotated_digits, task_args=(NUM_CLUSTERS,), model_fn=_mlp(10), model_name="mlp",
        other_models={"mclr": _mclr(10)},
        loss=models.SPARSE_CE_LOGITS, defaults=DEFAULTS,
        source=SOURCE + "; rotations as in Ghosh et al. (IFCA)"),
]
