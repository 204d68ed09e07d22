"""mnist_workers: the pFedMo paper's MNIST settings, N cross-silo workers.

The official MNIST train (60,000) and test (10,000) sets from `--data_dir`
(the four idx files) or Keras' cache; pixels in [0, 1]. First a public i.i.d.
set of `--task_arg=public_size` training images (default 6,000, seeded) is
set aside for the server (pFedMo's representation model; the paper does not
say where its public set comes from); the workers share the rest, and the
test set, by `--task_arg=split`:

  iid        shuffled and dealt equally (the paper's Table 2: "randomly
             shuffled and distributed among workers");
  label      each worker draws `classes_per_worker` (3, 6 or 9 in the paper)
             classes; each class's images are dealt equally (disjointly) to
             the workers that drew it, and every worker keeps the same number
             m of images of each of its classes (m = the smallest such share),
             so all workers hold the same number of samples (the paper states
             neither the count nor how overlapping draws are handled);
  quantity   worker i gets the share f_i of every class, f = (5,000, 12,500,
             17,500, 25,000) / 60,000 (the paper's sizes, for N = 4 only);
             the paper aggregates with fixed weights 0.25 here: run with
             `--agg_weights=uniform`;
  dirichlet  per class, worker shares ~ Dir(`dirichlet_alpha` 1_N) (xi =
             0.05, 0.1 or 1.0 in the paper; redrawn, seeded, until every
             worker has at least one training batch of 64).

A worker's test data follows its training data's rule on the test set (the
same classes or shares). N = `--num_clients` (default 4). Models:
`--model=lenet5` (default; the paper: tau = 40, T = 1,000, so 25 rounds of
40 local steps) or `--model=logistic` (multinomial logistic regression,
784 -> 10; the paper: tau = 20, 50 rounds: give `--local_steps=20
--rounds=50`). Defaults: eta = 0.01, batch 64, every worker every round;
FedProx's mu = 0.01 is ours (the paper states none).
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

from tff_cluster import seeds
from tff_cluster.tasks import fmnist
from tff_cluster import models
from tff_cluster.data import vision
from tff_cluster.data.federated import DataError, FederatedData
from tff_cluster.spec.hparams import HParam
from tff_cluster.spec.task import DataOptions, TaskSpec, task_arg

SPLITS = ("iid", "label", "quantity", "dirichlet")
QUANTITY_SIZES = (5000, 12500, 17500, 25000)
MIN_TRAIN = 64  # a Dirichlet draw must give every worker one batch

SPLIT = HParam("split", str, "iid", "how the workers' data differ", choices=SPLITS)
CLASSES_PER_WORKER = HParam("classes_per_worker", int, 3, "split=label: classes per "
                            "worker", low=1, high=10)
DIRICHLET_ALPHA = HParam("dirichlet_alpha", float, 0.1, "split=dirichlet: xi", low=0,
                         low_open=True)
PUBLIC_SIZE = HParam("public_size", int, 6000, "training images set aside as the "
                     "server's public i.i.d. set (0: none)", low=0, high=30000)

# FedProx's mu is ours (the pFedMo paper gives no baseline's settings).
DEFAULTS = dict(rounds=25, clients_per_round=4, local_steps=40, batch_size=64,
                client_lr=0.01, num_clients=4, mu=0.01)


def _by_class(y: np.ndarray, rng: np.random.Generator) -> List[np.ndarray]:
  """Each class's indices, shuffled."""
  return [rng.permutation(np.flatnonzero(y == c)) for c in range(10)]


def _cut(indices: np.ndarray, shares: Sequence[float]) -> List[np.ndarray]:
  """`indices` cut into consecutive pieces of the given shares (floors of the
  cumulative shares, so the pieces are disjoint and cover all but rounding)."""
  bounds = np.floor(np.cumsum([0.0, *shares]) * len(indices) + 1e-9).astype(int)
  bounds[-1] = min(bounds[-1], len(indices))
  return [indices[bounds[i]:bounds[i + 1]] for i in range(len(shares))]


def _share_rows(y: np.ndarray, shares: np.ndarray, rng) -> List[np.ndarray]:
  """shares [10, N]: worker i gets the share shares[c, i] of class c."""
  n = shares.shape[1]
  rows: List[List[np.ndarray]] = [[] for _ in range(n)]
  for c, idx in enumerate(_by_class(y, rng)):
    for i, piece in enumerate(_cut(idx, shares[c])):
      rows[i].append(piece)
  return [np.sort(np.concatenate(r)) for r in rows]


def _label_rows(y: np.ndarray, classes: List[np.ndarray], rng) -> List[np.ndarray]:
  """Each class dealt equally to the workers that drew it; every worker keeps
  m images of each of its classes, m the smallest such share over workers."""
  n = len(classes)
  pieces = {}
  for c, idx in enumerate(_by_class(y, rng)):
    holders = [i for i in range(n) if c in classes[i]]
    for i, piece in zip(holders, _cut(idx, [1.0 / len(holders)] * len(holders)) if holders
                        else []):
      pieces[(i, c)] = piece
  m = min(len(p) for p in pieces.values())
  return [np.sort(np.concatenate([pieces[(i, c)][:m] for c in classes[i]]))
          for i in range(n)]


def split_workers(y_train: np.ndarray, y_test: np.ndarray, num_workers: int, split: str,
                  seed: int, classes_per_worker: int = 3, dirichlet_alpha: float = 0.1
                  ) -> Tuple[List[np.ndarray], List[np.ndarray], str]:
  """(train rows, test rows, description) of each worker (see the module docstring)."""
  rng = seeds.generator(seed, "mnist_workers_split")
  n = num_workers
  if split == "iid":
    return ([np.sort(p) for p in np.array_split(rng.permutation(len(y_train)), n)],
            [np.sort(p) for p in np.array_split(rng.permutation(len(y_test)), n)],
            "IID, dealt equally")
  if split == "label":
    classes = [np.sort(rng.choice(10, classes_per_worker, replace=False)) for _ in range(n)]
    train = _label_rows(y_train, classes, rng)
    test = _label_rows(y_test, classes, rng)
    drawn = "; ".join(f"worker {i}: {list(map(int, c))}" for i, c in enumerate(classes))
    return train, test, (f"label skew, {classes_per_worker} classes per worker ({drawn}), "
                         f"{len(train[0]):,} training images each")
  if split == "quantity":
    if n != len(QUANTITY_SIZES):
      raise DataError(f"invalid --num_clients={n} for --task_arg=split=quantity; valid: "
                      f"{len(QUANTITY_SIZES)} (the paper's sizes "
                      f"{', '.join(map(str, QUANTITY_SIZES))})")
    f = np.asarray(QUANTITY_SIZES, np.float64) / sum(QUANTITY_SIZES)
    shares = np.tile(f, (10, 1))
    return (_share_rows(y_train, shares, rng), _share_rows(y_test, shares, rng),
            "quantity skew, shares " + "/".join(str(s) for s in QUANTITY_SIZES) + " of 60,000"
            " of every class")
  if split == "dirichlet":
    for _ in range(100):
      shares = rng.dirichlet(np.full(n, dirichlet_alpha), size=10)
      train = _share_rows(y_train, shares, rng)
      if min(len(r) for r in train) >= MIN_TRAIN:
        return (train, _share_rows(y_test, shares, rng),
                f"Dirichlet(xi = {dirichlet_alpha}) class shares per worker")
    raise DataError(f"invalid --task_arg=dirichlet_alpha={dirichlet_alpha}: 100 draws left "
                    f"a worker with fewer than {MIN_TRAIN} training images; valid: a "
                    "larger xi or fewer workers")
  raise DataError(f"invalid --task_arg=split={split}; valid: {', '.join(SPLITS)}")


def load(options: DataOptions) -> FederatedData:
  (x_train, y_train), (x_test, y_test) = fmnist.official_split(
      "mnist", options.data_dir, options.data_source)
  n = options.num_clients or DEFAULTS["num_clients"]
  split = task_arg(options, SPLIT)
  public_size = task_arg(options, PUBLIC_SIZE)
  rng = seeds.generator(options.seed, "mnist_workers_public")
  order = rng.permutation(len(y_train))
  public_rows, rest = np.sort(order[:public_size]), np.sort(order[public_size:])
  train_rows, test_rows, how = split_workers(
      y_train[rest], y_test, n, split, options.seed,
      classes_per_worker=task_arg(options, CLASSES_PER_WORKER),
      dirichlet_alpha=task_arg(options, DIRICHLET_ALPHA))
  ids = [f"worker_{i}" for i in range(n)]
  train = {c: (x_train[rest[r]], y_train[rest[r]]) for c, r in zip(ids, train_rows)}
  test = {c: (x_test[r], y_test[r]) for c, r in zip(ids, test_rows)}
  public = (x_train[public_rows], y_train[public_rows]) if public_size else None
  where = vision.source_label("mnist", options.data_dir, options.data_source)
  return FederatedData(
      ids, train, test, 10, public=public,
      description=(f"MNIST ({where}), {n} workers: {how}; public set {public_size:,} "
                   f"training images (disjoint); pixels in [0, 1]; seed {options.seed}"))


TASKS = [
    TaskSpec(
        name="mnist_workers",
        description="MNIST over N = 4 cross-silo workers (pFedMo's settings: "
                    "--task_arg=split=iid|label|quantity|dirichlet), LeNet-5 or "
                    "logistic regression, a public set for the server",
        load_data=load, model_fn=models.lenet5, model_name="lenet5",
        other_models={"logistic": lambda: models.mclr(784, 10, name="logistic")},
        loss=models.SPARSE_CE_LOGITS, defaults=DEFAULTS,
        task_args=(SPLIT, CLASSES_PER_WORKER, DIRICHLET_ALPHA, PUBLIC_SIZE),
        source="pFedMo (its Table 2 and non-IID studies; eta 0.01, batch 64, "
               "gamma 0.5, tau 40 for LeNet-5)"),
]
