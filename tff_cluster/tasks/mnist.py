"""FedProx non-IID MNIST: 1,000 clients with 2 digits each, MCLR 784 -> 10
(or FedGroup's MLP 784-128-10, `--model=mlp`: 101,770 parameters).

Li et al., "Federated Optimization in Heterogeneous Networks" (FedProx),
Section 5.1; FedGroup (Duan et al.) uses the same data with lr 0.03, batch
10, E = 20 local epochs, 20 clients per round, mu = 1 and m = 3 groups.
Rounds default to FedProx's T = 100 (the FedGroup paper does not state T).
The MLP takes the same settings: the paper gives the MCLR's and the MLP's
hyper-parameters as one set (FedProx's recommended ones for the dataset).

Data, by what `--data_dir` holds:
* train/*.json and test/*.json: the JSON FedProx's `data/mnist/generate_niid.py`
  writes, used as is;
* the four MNIST idx files: the same recipe as that generator, done here
  (`partition.fedprox_mnist`): all 70,000 images pooled (train then test, in
  file order), pixels standardised per pixel over the pooled set as
  (x - mean) / (std + 0.001) on the raw 0-255 values, 1,000 devices holding
  digits (u + j) mod 10 (task arg 'classes_per_client', default 2), 5 images
  per digit and then lognormal(0, 2) shares, each device shuffled and split
  train = int(0.9 n), test = the rest. `--num_clients` changes the number of
  devices (the recipe then runs with that N);
* nothing: the same from Keras' MNIST (~/.keras/datasets/mnist.npz), or from
  TensorFlow Datasets by `--data_source` (tff_cluster.data.vision: the same
  arrays in the same order).
In both cases the pixels are standardised, not in [0, 1].
"""

from __future__ import annotations

import os

import numpy as np

from tff_cluster import models
from tff_cluster.data import leaf, vision
from tff_cluster.data.federated import DataError, FederatedData
from tff_cluster.data.partition import build_federated_data, fedprox_mnist
from tff_cluster.spec.hparams import HParam
from tff_cluster.spec.task import DataOptions, TaskSpec, task_arg

CLASSES_PER_CLIENT = HParam("classes_per_client", int, 2, "digits per client", low=1,
                            high=10)

# FedGroup Section 5.1 / Table 2: "one hidden layer with 128 hidden units".
MLP_HIDDEN = 128

DEFAULTS = dict(rounds=100, clients_per_round=20, local_epochs=20, batch_size=10,
                client_lr=0.03, mu=1.0, num_clients=1000)

# FedProx's generator divides by (std + 0.001), std of the raw 0-255 pixels.
STD_EPSILON = 0.001
_CHUNK = 10000  # rows per step of the exact pixel sums


def standardize_pixels(x: np.ndarray) -> np.ndarray:
  """FedProx's per-pixel standardisation of the pooled images (a new array).

  `x` is float32 [n, 784] in [0, 1] (as `vision.load_mnist` returns it); the
  raw 0-255 values are restored (x * 255, rounded), then each pixel becomes
  (x - mean) / (std + 0.001) with the mean and the population std of that
  pixel over all n images. The sums are exact (integer pixel values, float64
  sums below 2**53), so mean and std are exact up to the final rounding;
  the result is float32, like FedProx's.
  """
  if x.ndim != 2 or x.dtype != np.float32:
    raise DataError(f"expected float32 images [n, pixels], got {x.dtype} "
                    f"{x.shape}")
  n = len(x)
  x = np.rint(x * np.float32(255.0))
  s1 = np.zeros(x.shape[1])
  s2 = np.zeros(x.shape[1])
  for start in range(0, n, _CHUNK):
    chunk = x[start:start + _CHUNK].astype(np.float64)
    s1 += chunk.sum(axis=0)
    s2 += np.square(chunk).sum(axis=0)
  mean = s1 / n
  std = np.sqrt(np.maximum(n * s2 - s1 * s1, 0.0)) / n
  x -= mean.astype(np.float32)
  x /= std.astype(np.float32) + np.float32(STD_EPSILON)
  return x


def load_mnist(options: DataOptions) -> FederatedData:
  data_dir = options.data_dir
  if data_dir and os.path.isdir(os.path.join(os.path.expanduser(data_dir),
                                             "train")):
    return leaf.sample_clients(
        leaf.load_fedprox_mnist(data_dir, seed=options.seed),
        options.num_clients, options.seed)
  try:
    x, y = vision.load_mnist(data_dir, options.data_source)
  except DataError as e:
    if not data_dir or options.data_source == "tfds":
      raise
    raise DataError(f"{e} (or FedProx's MNIST JSON: train/*.json and "
                    f"test/*.json; {leaf.FEDPROX_MNIST_HINT})") from e
  num_clients = options.num_clients or DEFAULTS["num_clients"]
  per_client = task_arg(options, CLASSES_PER_CLIENT)
  partition = fedprox_mnist(y, num_clients, per_client, options.seed)
  x = standardize_pixels(x)
  used = partition.cluster_info["samples_used"]
  return build_federated_data(
      x, y, partition, 10, options.seed,
      f"MNIST ({vision.source_label('mnist', data_dir, options.data_source)}) by "
      f"FedProx's generate_niid recipe: "
      f"{num_clients} devices, digits (u+j) mod 10 for j < {per_client}, 5 "
      f"images per digit then lognormal(0, 2) shares; {used:,} of {len(y):,} "
      f"pooled images used; pixels standardised per pixel over the pooled set "
      f"((x - mean) / (std + {STD_EPSILON})); train int(0.9 n) per device; "
      f"seed {options.seed}")


def _mclr():
  return models.mclr(784, 10)


def _mlp():
  """FedGroup's MNIST-MLP: one hidden layer of 128 ReLU units (101,770 parameters)."""
  return models.mlp(784, MLP_HIDDEN, 10)


TASKS = [
    TaskSpec(
        name="mnist",
        description="MNIST, FedProx non-IID (FedProx's generator: 1,000 devices x "
                    "2 digits, lognormal sizes, standardised pixels), MCLR "
                    "784->10 or MLP 784-128-10 (--data_dir: idx files or FedProx JSON)",
        load_data=load_mnist, task_args=(CLASSES_PER_CLIENT,), model_fn=_mclr, model_name="mclr",
        other_models={"mlp": _mlp},
        loss=models.SPARSE_CE_LOGITS, defaults=DEFAULTS,
        source="FedProx (Li et al.) MNIST setting; FedGroup (Duan et al.) hyper-"
               "parameters"),
]
