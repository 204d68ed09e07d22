"""FedProx non-IID MNIST: 1,000 clients with 2 digits each, MCLR 784 -> 10.

Li et al., "Federated Optimization in Heterogeneous Networks" (FedProx),
Section 5.1; FedGroup (Duan et al.) uses the same data with lr 0.03, batch
10, E = 20 local epochs, 20 clients per round, mu = 1 and m = 3 groups.
Rounds default to FedProx's T = 100 (the FedGroup paper does not state T).

Data, by what `--data_dir` holds:
* train/*.json and test/*.json: the JSON FedProx's `data/mnist/generate_niid.py`
  writes, used as is (its pixels are standardized per pixel, not in [0, 1]);
* the four MNIST idx files: pooled train+test (70,000 images, pixels in
  [0, 1]) partitioned with our re-implementation of FedProx's recipe
  (`partition.fedprox_mnist_noniid`: extra 'classes_per_client', default 2;
  power-law sizes), each client split 90/10;
* nothing: the same from Keras' MNIST (~/.keras/datasets/mnist.npz).
"""

from __future__ import annotations

import os

from tff_cluster import models
from tff_cluster.data import leaf, vision
from tff_cluster.data.federated import DataError, FederatedData
from tff_cluster.data.partition import build_federated_data, fedprox_mnist_noniid
from tff_cluster.hparams import HParam
from tff_cluster.task import DataOptions, TaskSpec, task_arg

CLASSES_PER_CLIENT = HParam("classes_per_client", int, 2, "digits per client", low=1,
                            high=10)

DEFAULTS = dict(rounds=100, clients_per_round=20, local_epochs=20, batch_size=10,
                client_lr=0.03, mu=1.0, num_clients=1000)


def load_mnist(options: DataOptions) -> FederatedData:
  data_dir = options.data_dir
  if data_dir and os.path.isdir(os.path.join(os.path.expanduser(data_dir),
                                             "train")):
    return leaf.sample_clients(
        leaf.load_fedprox_mnist(data_dir, seed=options.seed),
        options.num_clients, options.seed)
  try:
    x, y = vision.load_mnist(data_dir)
  except DataError as e:
    if not data_dir:
      raise
    raise DataError(f"{e} (or FedProx's MNIST JSON: train/*.json and "
                    f"test/*.json; {leaf.FEDPROX_MNIST_HINT})") from e
  num_clients = options.num_clients or DEFAULTS["num_clients"]
  per_client = task_arg(options, CLASSES_PER_CLIENT)
  partition = fedprox_mnist_noniid(y, num_clients, per_client, options.seed)
  return build_federated_data(
      x, y, partition, 10, options.seed,
      f"MNIST ({data_dir or 'Keras cache'}), FedProx non-IID: {num_clients} "
      f"clients x {per_client} digits, power-law sizes, seed {options.seed}")


TASKS = [
    TaskSpec(
        name="mnist",
        description="MNIST, FedProx non-IID (1,000 clients x 2 digits, power-law "
                    "sizes), MCLR 784->10 (--data_dir: idx files or FedProx JSON)",
        load_data=load_mnist, task_args=(CLASSES_PER_CLIENT,), model_fn=lambda: models.mclr(784, 10), model_name="mclr",
        loss=models.SPARSE_CE_LOGITS, defaults=DEFAULTS,
        source="FedProx (Li et al.) MNIST setting; FedGroup (Duan et al.) hyper-"
               "parameters"),
]
