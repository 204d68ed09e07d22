"""Rotated clusters as IFCA and CFL-MGD build them: rotated_mnist,
rotated_fmnist and rotated_cifar10.

Training clients: for each rotation cluster p, a fresh seeded permutation of
the *whole* official training set is cut into `clients_per_cluster` clients
of `samples_per_client` images (by default all of it: MNIST and
Fashion-MNIST 600 x 100, CIFAR-10 100 x 500), rotated by the cluster's angle.
Every cluster therefore holds a full rotated copy of the training set: 2,400
clients x 100 images for MNIST with P = 4. The clusters' permutations are
independent, as in IFCA's code (`--task_arg=permutation=per_cluster`, the
default); `permutation=shared` cuts one permutation for all clusters, so that
client j of cluster p holds cluster 0's client j's images turned by p's angle.

Test clients are test-only (no training data): for each cluster, the official
test set *in file order* is cut into `test_clients_per_cluster` clients of
`samples_per_client` images (MNIST: 100 per cluster, 400 in all) and rotated
alike. They are never trained. Each picks the model of lowest loss on its own
test data, IFCA's protocol. `true_clusters` is the rotation cluster of every
client, training and test alike.

Rotations: P = 4 turns by p x 90 degrees (`--task_arg=num_clusters`, 1..4;
P = 2 is 0 and 180 degrees, as in IFCA's code, P = 3 is 0, 90 and 180);
rotated_cifar10 has P = 2, at 0 and 180 degrees (the CFL-MGD paper's setting).

Models and defaults (IFCA's configuration for the MNIST setting, which the
CFL-MGD paper leaves unstated: every client every round, 10 local full-batch
steps, lr 0.1, 300 rounds):
  rotated_mnist    MLP 784-200-10 (159,010 parameters), pixels in [0, 1];
  rotated_fmnist   the same on Fashion-MNIST (not in the papers: its numbers are
                   not comparable to Table 2);
  rotated_cifar10  the CFL-MGD/IFCA CIFAR-10 CNN on 24 x 24 x 3 crops
                   (`models.cifar_cnn_cflmgd`, 1,068,298 parameters), 20 of
                   the 200 clients per round, 5 local epochs of batch 50, lr
                   0.01, 300 rounds. The images are centre-cropped to 24 x 24
                   and standardised per image. IFCA's code also augments the
                   training batches (random crops, flips, brightness and
                   contrast); that augmentation and the CNN's L2 weight decay
                   (0.004) are left out here. `--model=cifar_cnn_small` is a
                   smaller CNN (`models.cifar_cnn_small`: three 3x3 convs
                   32-64-64, dense 64; 73,418 parameters on the crops).
"""

from __future__ import annotations

from typing import Callable, Sequence, Tuple

import numpy as np

from tff_cluster import seeds
from tff_cluster.tasks import fmnist
from tff_cluster import models
from tff_cluster.data import vision
from tff_cluster.data.federated import DataError, FederatedData
from tff_cluster.data.partition import rotate_images
from tff_cluster.spec.hparams import HParam
from tff_cluster.spec.task import DataOptions, TaskSpec, task_arg

SOURCE = ("CFL-MGD (its Table 2 setting) and IFCA (Ghosh et al.): rotated clusters; "
          "defaults from IFCA's configuration for the same setting")


PERMUTATIONS = ("per_cluster", "shared")


def _args(clusters: int, per_cluster: int, samples: int, test_per_cluster: int):
  return (
      HParam("num_clusters", int, clusters, "rotation clusters P", low=1, high=clusters),
      HParam("clients_per_cluster", int, per_cluster, "training clients per cluster",
             low=1, high=per_cluster),
      HParam("samples_per_client", int, samples, "images per client", low=1),
      HParam("test_clients_per_cluster", int, test_per_cluster, "test-only clients per "
             "cluster", low=0, high=test_per_cluster),
      HParam("permutation", str, "per_cluster", "per_cluster: each cluster cuts its own "
             "seeded permutation of the training set (IFCA's code); shared: one "
             "permutation for all, so client j of every cluster holds the same images",
             choices=PERMUTATIONS))


def rotated_clients(train: Tuple[np.ndarray, np.ndarray], test: Tuple[np.ndarray, np.ndarray],
                    angles: Sequence[int], clients_per_cluster: int, samples_per_client: int,
                    test_clients_per_cluster: int, seed: int, num_classes: int,
                    description: str, prepare: Callable = lambda x: x,
                    permutation: str = "per_cluster") -> FederatedData:
  """The rotated-cluster clients (see the module docstring). `prepare` maps
  rotated images to model inputs (e.g. crop and standardise).

  Cluster p's permutation is seeded by (seed, 4040, p), or by (seed, 4040, 0)
  for every cluster with `permutation='shared'` (cluster 0 is the same under
  both). Each cluster's images are gathered and rotated in one copy; the
  clients' arrays are views into it."""
  (x_train, y_train), (x_test, y_test) = train, test
  n = samples_per_client
  if clients_per_cluster * n > len(y_train):
    raise DataError(f"invalid --task_arg=clients_per_cluster={clients_per_cluster} with "
                    f"samples_per_client={n}: needs {clients_per_cluster * n:,} images, the "
                    f"training set has {len(y_train):,}; valid: at most "
                    f"{len(y_train) // n} clients per cluster")
  if test_clients_per_cluster * n > len(y_test):
    raise DataError(f"invalid --task_arg=test_clients_per_cluster={test_clients_per_cluster}"
                    f" with samples_per_client={n}: the test set has {len(y_test):,} "
                    f"images; valid: at most {len(y_test) // n}")
  ids, train_split, test_split, clusters = [], {}, {}, []
  empty_x = prepare(rotate_images(x_train[:0], 0))
  empty_y = y_train[:0].astype(np.int64)
  if permutation not in PERMUTATIONS:
    raise DataError(f"invalid --task_arg=permutation={permutation}; valid: "
                    f"{', '.join(PERMUTATIONS)}")
  for p, angle in enumerate(angles):
    stream = p if permutation == "per_cluster" else 0
    order = seeds.generator(seed, "rotated_order", stream).permutation(
        len(y_train))
    rows = order[:clients_per_cluster * n]
    images = prepare(rotate_images(x_train, angle, index=rows))
    labels = y_train[rows].astype(np.int64)
    for j in range(clients_per_cluster):
      cid = f"r{angle:03d}_train_{j:04d}"
      ids.append(cid)
      train_split[cid] = (images[j * n:(j + 1) * n], labels[j * n:(j + 1) * n])
      test_split[cid] = (empty_x, empty_y)
      clusters.append(p)
    test_images = prepare(rotate_images(x_test[:test_clients_per_cluster * n], angle))
    test_labels = y_test[:test_clients_per_cluster * n].astype(np.int64)
    for j in range(test_clients_per_cluster):
      cid = f"r{angle:03d}_test_{j:04d}"
      ids.append(cid)
      train_split[cid] = (empty_x, empty_y)
      test_split[cid] = (test_images[j * n:(j + 1) * n], test_labels[j * n:(j + 1) * n])
      clusters.append(p)
  return FederatedData(ids, train_split, test_split, num_classes, np.asarray(clusters),
                       description)


def _load(name: str, label: str, full_angles: Sequence[int]):
  def load(options: DataOptions) -> FederatedData:
    args = ARGS[name]
    p, per_cluster, n, test_per_cluster, permutation = (task_arg(options, a) for a in args)
    if name == "rotated_cifar10":
      train, test = cifar10_split(options.data_dir, options.data_source)
      prepare = crop_and_standardise
    else:
      train, test = fmnist.official_split(
          "mnist" if name == "rotated_mnist" else "fashion_mnist", options.data_dir,
          options.data_source)
      prepare = lambda images: images  # noqa: E731 (pixels in [0, 1], flat 784)
    angles = rotation_angles(full_angles, p)
    where = vision.source_label(
        {"rotated_mnist": "mnist", "rotated_fmnist": "fashion_mnist"}.get(name, "cifar10"),
        options.data_dir, options.data_source)
    split = ("a fresh permutation of the whole training set each" if
             permutation == "per_cluster" else "one permutation shared by the clusters")
    return rotated_clients(
        train, test, angles, per_cluster, n, test_per_cluster, options.seed, 10,
        f"{label} ({where}) in {p} rotation clusters {angles} deg: {per_cluster} training "
        f"clients x {n} images per cluster ({split}), {test_per_cluster} test-only "
        f"clients per cluster (the test set in order); seed {options.seed}", prepare,
        permutation)
  return load


def rotation_angles(full_angles: Sequence[int], p: int) -> list:
  """The angles of P clusters: the first P of `full_angles`, except that P = 2
  of the four quarter turns is 0 and 180 degrees (IFCA's code)."""
  if p == 2 and len(full_angles) == 4:
    return [full_angles[0], full_angles[2]]
  return list(full_angles[:p])


def cifar10_split(data_dir, data_source: str = "keras"):
  """CIFAR-10's official train and test sets, x float32 [n, 32, 32, 3] in [0, 1]."""
  (train, test), _ = vision.official_arrays("cifar10", data_dir, data_source)
  return tuple((np.asarray(x, np.float32) / 255.0, np.asarray(y).reshape(-1).astype(np.int64))
               for x, y in (train, test))


def crop_and_standardise(x: np.ndarray) -> np.ndarray:
  """CIFAR-10 [n, 32, 32, 3] in [0, 1] -> the central 24 x 24 crop, each image
  standardised to mean 0 and std 1 (std floored at 1/sqrt(pixels))."""
  x = np.asarray(x, np.float32)[:, 4:28, 4:28, :]
  if not len(x):
    return x
  flat = x.reshape(len(x), -1)
  mean = flat.mean(axis=1, keepdims=True)
  std = np.maximum(flat.std(axis=1, keepdims=True), 1.0 / np.sqrt(flat.shape[1]))
  return ((flat - mean) / std).reshape(x.shape).astype(np.float32)


ARGS = {"rotated_mnist": _args(4, 600, 100, 100),
        "rotated_fmnist": _args(4, 600, 100, 100),
        "rotated_cifar10": _args(2, 100, 500, 20)}
# ifca_loss_batches=1: a client's batch of 100 is its whole training set, so
# the cluster estimate's loss on one batch is its loss on all its data (0,
# every batch of the 10-step schedule, gives the same mean 10 times over).
MNIST_DEFAULTS = dict(rounds=300, clients_per_round=2400, local_steps=10, batch_size=100,
                      client_lr=0.1, mu=0.01, num_clients=None, num_groups=4,
                      ifca_loss_batches=1)
# lr_decay 0.99: the CFL-MGD paper's CIFAR-10 setting ("step size decay 0.99").
CIFAR_DEFAULTS = dict(rounds=300, clients_per_round=20, local_epochs=5, batch_size=50,
                      client_lr=0.01, lr_decay=0.99, mu=0.01, num_clients=None,
                      num_groups=2)

TASKS = [
    TaskSpec(name="rotated_mnist",
             description="MNIST in 4 rotation clusters (IFCA/CFL-MGD): 2,400 clients x 100 "
                         "images, 400 test-only clients, MLP 784-200-10",
             load_data=_load("rotated_mnist", "MNIST", (0, 90, 180, 270)),
             model_fn=lambda: models.mlp(784, 200, 10), model_name="mlp",
             loss=models.SPARSE_CE_LOGITS, defaults=MNIST_DEFAULTS,
             task_args=ARGS["rotated_mnist"], source=SOURCE),
    TaskSpec(name="rotated_fmnist",
             description="Fashion-MNIST in 4 rotation clusters, built as rotated_mnist: "
                         "2,400 clients x 100 images, 400 test-only clients, MLP 784-200-10",
             load_data=_load("rotated_fmnist", "Fashion-MNIST", (0, 90, 180, 270)),
             model_fn=lambda: models.mlp(784, 200, 10), model_name="mlp",
             loss=models.SPARSE_CE_LOGITS, defaults=MNIST_DEFAULTS,
             task_args=ARGS["rotated_fmnist"],
             source=SOURCE + " (Fashion-MNIST is this project's variant)"),
    TaskSpec(name="rotated_cifar10",
             description="CIFAR-10 in 2 rotation clusters (0/180 deg, CFL-MGD): 200 clients "
                         "x 500 images, 40 test-only clients, CNN 64-64-384-192 on 24x24 crops",
             load_data=_load("rotated_cifar10", "CIFAR-10", (0, 180)),
             model_fn=lambda: models.cifar_cnn_cflmgd(), model_name="cifar_cnn_cflmgd",
             other_models={"cifar_cnn_small": lambda: models.cifar_cnn_small((24, 24, 3))},
             loss=models.SPARSE_CE_LOGITS, defaults=CIFAR_DEFAULTS,
             task_args=ARGS["rotated_cifar10"], source=SOURCE),
]
