"""CIFAR-10 with Dirichlet label skew, CIFAR-10 LeNet-style CNN.

Data: the pooled 60,000 CIFAR-10 images (float32 [32, 32, 3] in [0, 1]) from
`--data_dir` holding `cifar-10-batches-py/` (data_batch_1..5, test_batch; the
extracted cifar-10-python.tar.gz) or, without `--data_dir`, Keras' cache
(~/.keras/datasets/cifar-10-batches-py/), or TensorFlow Datasets by
`--data_source` (tff_cluster.data.vision: the same arrays in the same order).
Partition: per class, proportions over clients ~ Dir(alpha) (Hsu et al. 2019);
alpha = DataOptions.extra['concentration'] (default 0.5); each client split
90/10. The optimization defaults are this project's choice (FedGroup-style
20 clients per round, 10 local epochs, batch 10), not from a paper.
"""

from __future__ import annotations

import numpy as np

from tff_cluster import models
from tff_cluster.data import partition as part
from tff_cluster.data import vision
from tff_cluster.data.federated import FederatedData
from tff_cluster.spec.hparams import HParam
from tff_cluster.spec.task import DataOptions, TaskSpec, task_arg

CONCENTRATION = HParam("concentration", float, 0.5, "Dirichlet alpha", low=0,
                       low_open=True)

DEFAULTS = dict(rounds=200, clients_per_round=20, local_epochs=10, batch_size=10,
                client_lr=0.01, mu=0.01, num_clients=100)


def _where(options: DataOptions) -> str:
  return vision.source_label("cifar10", options.data_dir, options.data_source)


def load_cifar10(options: DataOptions) -> FederatedData:
  x, y = vision.load_cifar10(options.data_dir, options.data_source)
  n = options.num_clients or DEFAULTS["num_clients"]
  alpha = task_arg(options, CONCENTRATION)
  p = part.dirichlet_label_skew(y, n, alpha, options.seed)
  return part.build_federated_data(
      x, y, p, 10, options.seed,
      f"CIFAR-10 ({_where(options)}), {n} clients, Dirichlet "
      f"label skew alpha={alpha:g}, seed {options.seed}")


# pfl-research's CIFAR-10 benchmark (apple/pfl-research,
# benchmarks/dataset/cifar10/numpy.py at 51e7307df128f56468cbcbe6e774ac8e043a59b4
# and benchmarks/image_classification/configs/baseline.yaml at
# 22e88081c20975243a457416c5b0f678ae0bcaa6): FedAvg, 1,000 users x 50 IID
# images, cohort 50, 1,500 central iterations, one local epoch, batch 10, local
# lr 0.1, central lr 1.0, every user weighted alike, evaluation every 10.
PFL_IMAGES_PER_USER = 50
PFL_DEFAULTS = dict(rounds=1500, clients_per_round=50, local_epochs=1, batch_size=10,
                    client_lr=0.1, mu=0.0, num_clients=1000)


def pfl_iid_users(x_train, y_train, x_test, y_test, users: int, seed: int,
                  per_user: int = PFL_IMAGES_PER_USER) -> FederatedData:
  """pfl-research's IID users: every channel standardised by the training
  images' mean and standard deviation (the test images by the same); the
  training images shuffled once and cut into `users` consecutive blocks of
  `per_user`. pfl-research evaluates centrally on the whole test set; here the
  test images are dealt out to the users in equal blocks, so the pooled test
  accuracy of one model is that central accuracy."""
  if users * per_user > len(y_train):
    raise ValueError(f"num_clients={users} x {per_user} images needs {users * per_user} "
                     f"training images; valid: at most {len(y_train) // per_user} users")
  mean = x_train.mean(axis=(0, 1, 2), dtype=np.float64)
  std = x_train.std(axis=(0, 1, 2), dtype=np.float64)
  scale = lambda x: ((x - mean) / std).astype(np.float32)  # noqa: E731
  order = np.random.default_rng(seed).permutation(len(y_train))[:users * per_user]
  test_blocks = np.array_split(np.arange(len(y_test)), users)
  ids = [f"user_{u:04d}" for u in range(users)]
  train, test = {}, {}
  for u, cid in enumerate(ids):
    rows = order[u * per_user:(u + 1) * per_user]
    train[cid] = (scale(x_train[rows]), y_train[rows].astype(np.int32))
    test[cid] = (scale(x_test[test_blocks[u]]), y_test[test_blocks[u]].astype(np.int32))
  return FederatedData(ids, train, test, 10, description=(
      f"{users} users x {per_user} IID CIFAR-10 images (pfl-research's split), seed {seed}"))


def load_cifar10_pfl(options: DataOptions) -> FederatedData:
  (x_train, y_train), (x_test, y_test) = vision.load_cifar10_split(
      options.data_dir, options.data_source)
  users = options.num_clients or PFL_DEFAULTS["num_clients"]
  data = pfl_iid_users(x_train, y_train, x_test, y_test, users, options.seed)
  data.description = f"CIFAR-10 ({_where(options)}): {data.description}"
  return data


TASKS = [
    TaskSpec(
        name="cifar10",
        description="CIFAR-10, 100 clients, Dirichlet(0.5) label skew, LeNet-style "
                    "CNN (--data_dir: cifar-10-batches-py/)",
        load_data=load_cifar10, task_args=(CONCENTRATION,), model_fn=models.cifar10_cnn, model_name="cifar10_cnn",
        loss=models.SPARSE_CE_LOGITS, defaults=DEFAULTS,
        source="partition: Hsu et al. 2019 (Dirichlet label skew); defaults: "
               "this project"),
    TaskSpec(
        name="cifar10_pfl",
        description="pfl-research's CIFAR-10 setting: 1,000 users x 50 IID images, "
                    "its simple CNN (--data_dir: cifar-10-batches-py/)",
        load_data=load_cifar10_pfl, model_fn=models.simple_cnn, model_name="simple_cnn",
        loss=models.SPARSE_CE_LOGITS, defaults=PFL_DEFAULTS,
        source="pfl-research (Granqvist et al., NeurIPS 2024 D&B) CIFAR-10 benchmark: "
               "benchmarks/dataset/cifar10 and image_classification/configs/baseline.yaml"),
]
