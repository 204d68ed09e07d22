"""The FedGroup paper's FEMNIST: FedProx's 10-letter "nist" sample, 26-way models.

Recipe (`tff_cluster.data.fedprox_nist`, which documents it in full): lower-
case letters a-j relabelled 0..9 (at most 4,000 images each, seeded order),
200 devices (`--num_clients`), device u holding letters (u, u+1, u+2) mod 10,
lognormal(4, 1) + 5 samples split evenly over its 3 letters (>= 2 each),
shuffled and split 90/10 per device. Run-out rule: truncate.

`--task_arg=reuse_prefix=true|false`:
  true (default): every device takes the *first* images of each of its
    letters, as FedProx's generator does (its per-letter cursor resets
    whenever there is room), i.e. the data the FedProx and FedGroup numbers
    come from: ~2k distinct images reused ~9.5x, test images shared with
    other devices' training images;
  false: the cursor advances, so no image is used twice while images last.
The data description records the distinct source images, the samples and
`reuse_prefix`.

Data, by what `--data_dir` holds (all images of a-j are pooled first):
* LEAF FEMNIST JSON (train/*.json and test/*.json, or one .json file): every
  writer's train and test images;
* TFF's `emnist_all.sqlite` (the directory holding it, or the file under any
  name): the 62-class `all_train` then `all_test` images, writers in TFF's
  (sorted) order, read without TFF (`tff_cluster.data.emnist`);
* no `--data_dir`: that database, from a cache (`$TFF_CLUSTER_DATA`, ~/.tff,
  ~/.keras/datasets) or fetched on first use (`tff_cluster.data.download`).
Pixels stay as the sources give them, floats in [0, 1] with 1.0 = background:
the convention of LEAF, TFF and FedProx's own sample alike.

Models: MLP 784-512-26 (`--model=mlp`, default; 415,258 parameters) or MCLR
784->26 (`--model=mclr`; 20,410), the 26-way outputs of the FedGroup paper's
Table 2 and FedProx's `nist.mclr: (26,)`; the labels use 0..9. Defaults as
the `femnist` task (FedGroup Section 5.1: lr 0.003, batch 10, E = 20, 20
clients per round, mu = 1, T = 200) with 200 devices.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import numpy as np

from tff_cluster import models
from tff_cluster.data import emnist, fedprox_nist, leaf
from tff_cluster.data.federated import DataError, FederatedData
from tff_cluster.spec.hparams import HParam
from tff_cluster.spec.task import DataOptions, TaskSpec, task_arg

REUSE_PREFIX = HParam(
    "reuse_prefix", bool, True,
    "true: every device takes the first images of its letters (FedProx's "
    "generator, the papers' data); false: each image once while images last")

DEFAULTS = dict(rounds=200, clients_per_round=20, local_epochs=20, batch_size=10,
                client_lr=0.003, mu=1.0, num_clients=None)  # None: the recipe's 200 devices

SOURCE = ("FedGroup (Duan et al.) FEMNIST setting = FedProx (Li et al.) "
          "data/nist/data/my_sample.py sample of EMNIST lower-case a-j")
HIDDEN = 512

_SOURCES_TEXT = (f"LEAF FEMNIST JSON (train/*.json and test/*.json) or TFF's "
                 f"{emnist.EMNIST_DB_FILE}")

Pooled = Tuple[np.ndarray, np.ndarray, str]


def _letters_only(labels: np.ndarray) -> np.ndarray:
  first = fedprox_nist.FIRST_RAW_LABEL
  return (labels >= first) & (labels < first + fedprox_nist.NUM_LETTERS)


def pool_leaf(path: str) -> Pooled:
  """All a-j images of a LEAF FEMNIST directory or file: (x [n, 784], raw y, text).

  Writers' train then test samples, in file order; labels are checked for
  every sample, pixels only for the kept ones.
  """
  train, test = leaf.read_leaf(path, leaf.FEMNIST_HINT)
  parse = leaf.dense_parser(leaf.IMAGE_PIXELS, leaf.FEMNIST_NUM_CLASSES)
  xs, ys = [], []
  for split in (train, test or {}):
    for user, (x, y) in split.items():
      keep = np.flatnonzero(_letters_only(
          leaf._labels(user, y, leaf.FEMNIST_NUM_CLASSES)))
      if len(keep):
        px, py = parse(user, [x[i] for i in keep], [y[i] for i in keep])
        xs.append(px)
        ys.append(py)
  if not xs:
    raise DataError(f"{path}: the LEAF JSON has no lower-case a-j images "
                    f"(labels 36..45); femnist_fedprox needs 62-class FEMNIST "
                    f"with letters a-j")
  return (np.concatenate(xs), np.concatenate(ys),
          f"LEAF FEMNIST JSON {path}, writers' train+test pooled")


def pool_sqlite(db: str) -> Pooled:
  """All a-j images of TFF's federated EMNIST database `db` (62-class train
  then test images, writers in TFF's order)."""
  x, y = emnist.pool_database(db, _letters_only)
  if not len(y):
    raise DataError(f"{db}: no lower-case a-j images (labels 36..45)")
  return x, y, f"TFF EMNIST {db}, train+test pooled"


def pool_source(data_dir: Optional[str]) -> Pooled:
  """Dispatches on what `data_dir` holds (see the module docstring)."""
  if not data_dir:
    return pool_sqlite(emnist.fetch_database())
  path = os.path.expanduser(str(data_dir))
  if os.path.isfile(path):
    if emnist.is_database(path) or os.path.basename(path) == emnist.EMNIST_DB_FILE:
      return pool_sqlite(path)
    if path.endswith(".json"):
      return pool_leaf(path)
    raise DataError(f"{path}: not a LEAF .json file or {emnist.EMNIST_DB_FILE}; "
                    f"expected {_SOURCES_TEXT}")
  if not os.path.isdir(path):
    raise DataError(f"{path} does not exist: expected a directory with "
                    f"{_SOURCES_TEXT}")
  if os.path.isfile(os.path.join(path, emnist.EMNIST_DB_FILE)):
    return pool_sqlite(os.path.join(path, emnist.EMNIST_DB_FILE))
  if any(os.path.isdir(os.path.join(path, s)) for s in ("train", "test")):
    return pool_leaf(path)
  raise DataError(f"{path}: holds neither train/ and test/ LEAF JSON nor "
                  f"{emnist.EMNIST_DB_FILE}: expected {_SOURCES_TEXT}")


def load_femnist_fedprox(options: DataOptions) -> FederatedData:
  reuse = task_arg(options, REUSE_PREFIX)
  num_devices = options.num_clients or fedprox_nist.NUM_DEVICES
  if num_devices < 1:
    raise DataError(f"--num_clients must be >= 1, got {num_devices}")
  x, y, source = pool_source(options.data_dir)
  return fedprox_nist.build_federated(x, y, seed=options.seed, reuse_prefix=reuse,
                                      num_devices=num_devices, source=source)


def _mlp():
  return models.mlp(leaf.IMAGE_PIXELS, HIDDEN, fedprox_nist.OUTPUT_CLASSES)


def _mclr():
  return models.mclr(leaf.IMAGE_PIXELS, fedprox_nist.OUTPUT_CLASSES)


TASKS = [
    TaskSpec(
        name="femnist_fedprox",
        description="FedGroup/FedProx FEMNIST: EMNIST letters a-j, 200 devices x 3 "
                    "consecutive letters, 26-way MLP 784-512-26 (TFF's federated "
                    "EMNIST, fetched on first use; or --data_dir: LEAF FEMNIST JSON "
                    "or emnist_all.sqlite)",
        load_data=load_femnist_fedprox, task_args=(REUSE_PREFIX,),
        model_fn=_mlp, model_name="mlp", other_models={"mclr": _mclr},
        loss=models.SPARSE_CE_LOGITS, defaults=DEFAULTS, source=SOURCE),
]
