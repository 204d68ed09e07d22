"""Fashion-MNIST partitions of the clustered-FL literature, FMNIST CNN.

Data: the pooled 70,000 Fashion-MNIST images (pixels in [0, 1], 0 =
background), from `--data_dir` holding the four original idx files
(train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz,
t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz; .gz or not, any
re-gzipped copy) or, without `--data_dir`, from Keras' cache
(~/.keras/datasets/fashion-mnist/). Each client's samples are split 90/10.

Tasks (settings from `DataOptions.extra`, defaults in brackets):
  fmnist                    pathological non-IID (McMahan et al.):
                            'classes_per_client' [2] classes per client.
  rotated_fmnist            IID split, 'num_clusters' [4] rotation clusters
                            (0/90/180/270 degrees; Ghosh et al., IFCA).
  fmnist_clusterwise_dir    WeCFL's Dir(c_cluster, c_client) partition:
                            'cluster_concentration' [0.1],
                            'client_concentration' [10], 'num_clusters' [5].
  fmnist_clusterwise_class  WeCFL's (n_cluster, n_client)-class partition:
                            'classes_per_cluster' [3], 'classes_per_client'
                            [2], 'num_clusters' [5].
Models: the FMNIST CNN with BatchNorm (default) or LeNet-5 (`--model=lenet5`).
All default to 200 clients (WeCFL: Ma et al., "On the Convergence of Clustered
Federated Learning"). The optimization defaults (lr 0.01, batch 10, 10 local
epochs, 20 clients per round, mu 0.01) are this project's choice in FedGroup's
style, not numbers from WeCFL.
"""

from __future__ import annotations

from tff_cluster import models
from tff_cluster.data import partition as part
from tff_cluster.data import vision
from tff_cluster.data.federated import FederatedData
from tff_cluster.hparams import HParam
from tff_cluster.task import DataOptions, TaskSpec, task_arg

DEFAULTS = dict(rounds=200, clients_per_round=20, local_epochs=10, batch_size=10,
                client_lr=0.01, mu=0.01, num_clients=200)

NUM_CLASSES = 10
SOURCE = ("partitions: WeCFL (Ma et al.), IFCA (Ghosh et al.), FedAvg (McMahan "
          "et al.); optimization defaults: this project (FedGroup-style)")


CLASSES_PER_CLIENT = HParam("classes_per_client", int, 2, "classes per client", low=1,
                            high=NUM_CLASSES)
ROTATION_CLUSTERS = HParam("num_clusters", int, 4, "rotation clusters", low=1, high=4)
NUM_CLUSTERS = HParam("num_clusters", int, 5, "true clusters", low=1)
CLUSTER_CONCENTRATION = HParam("cluster_concentration", float, 0.1, "Dirichlet over clusters",
                               low=0, low_open=True)
CLIENT_CONCENTRATION = HParam("client_concentration", float, 10.0,
                              "Dirichlet over a cluster's clients", low=0, low_open=True)
CLASSES_PER_CLUSTER = HParam("classes_per_cluster", int, 3, "classes per cluster", low=1,
                             high=NUM_CLASSES)


def _pooled(options: DataOptions):
  return vision.load_fashion_mnist(options.data_dir)


def _where(options: DataOptions) -> str:
  return f"Fashion-MNIST ({options.data_dir or 'Keras cache'})"


def _num_clients(options: DataOptions) -> int:
  return options.num_clients or DEFAULTS["num_clients"]


def load_fmnist(options: DataOptions) -> FederatedData:
  x, y = _pooled(options)
  n, c = _num_clients(options), task_arg(options, CLASSES_PER_CLIENT)
  p = part.n_class_pathological(y, n, c, options.seed)
  return part.build_federated_data(
      x, y, p, NUM_CLASSES, options.seed,
      f"{_where(options)}, {n} clients x {c} classes (pathological), "
      f"seed {options.seed}")


def load_rotated(options: DataOptions) -> FederatedData:
  x, y = _pooled(options)
  n, m = _num_clients(options), task_arg(options, ROTATION_CLUSTERS)
  p = part.rotation_clusters(len(y), n, m, options.seed)
  return part.build_federated_data(
      x, y, p, NUM_CLASSES, options.seed,
      f"{_where(options)}, {n} IID clients in {m} rotation clusters "
      f"{p.cluster_info['rotations']}, seed {options.seed}",
      transform=part.rotation_transform(p))


def load_clusterwise_dir(options: DataOptions) -> FederatedData:
  x, y = _pooled(options)
  n, m = _num_clients(options), task_arg(options, NUM_CLUSTERS)
  a = task_arg(options, CLUSTER_CONCENTRATION)
  b = task_arg(options, CLIENT_CONCENTRATION)
  p = part.clusterwise_dirichlet(y, m, n, a, b, options.seed)
  return part.build_federated_data(
      x, y, p, NUM_CLASSES, options.seed,
      f"{_where(options)}, {n} clients in {m} clusters, cluster-wise "
      f"Dir({a:g}, {b:g}), seed {options.seed}")


def load_clusterwise_class(options: DataOptions) -> FederatedData:
  x, y = _pooled(options)
  n, m = _num_clients(options), task_arg(options, NUM_CLUSTERS)
  a = task_arg(options, CLASSES_PER_CLUSTER)
  b = task_arg(options, CLASSES_PER_CLIENT)
  p = part.clusterwise_classes(y, m, n, a, b, options.seed)
  return part.build_federated_data(
      x, y, p, NUM_CLASSES, options.seed,
      f"{_where(options)}, {n} clients in {m} clusters, ({a}, {b})-class, "
      f"seed {options.seed}")


def _spec(name, description, load_data, *task_args):
  return TaskSpec(name=name, description=description, load_data=load_data,
                  model_fn=models.fmnist_cnn, model_name="fmnist_cnn",
                  other_models={"lenet5": models.lenet5},
                  loss=models.SPARSE_CE_LOGITS, defaults=DEFAULTS, source=SOURCE,
                  task_args=task_args)


TASKS = [
    _spec("fmnist", "Fashion-MNIST, 200 clients x 2 classes (pathological), "
          "FMNIST CNN (--data_dir: idx files)", load_fmnist, CLASSES_PER_CLIENT),
    _spec("rotated_fmnist", "Fashion-MNIST, 200 IID clients in 4 rotation "
          "clusters (0/90/180/270 deg), FMNIST CNN", load_rotated, ROTATION_CLUSTERS),
    _spec("fmnist_clusterwise_dir", "Fashion-MNIST, 200 clients, m=5 clusters, "
          "WeCFL cluster-wise Dir(0.1, 10), FMNIST CNN", load_clusterwise_dir,
          NUM_CLUSTERS, CLUSTER_CONCENTRATION, CLIENT_CONCENTRATION),
    _spec("fmnist_clusterwise_class", "Fashion-MNIST, 200 clients, m=5 clusters, "
          "WeCFL (3, 2)-class, FMNIST CNN", load_clusterwise_class,
          NUM_CLUSTERS, CLASSES_PER_CLUSTER, CLASSES_PER_CLIENT),
]
