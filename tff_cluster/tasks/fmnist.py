"""Fashion-MNIST partitions of the clustered-FL literature, FMNIST CNN.

Data: Fashion-MNIST from `--data_dir` holding the four original idx files
(train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz,
t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz; .gz or not, any
re-gzipped copy) or, without `--data_dir`, from Keras' cache
(~/.keras/datasets/fashion-mnist/), or from TensorFlow Datasets by
`--data_source` (tff_cluster.data.vision: the same arrays in the same order).
Pixels in [0, 1], 0 = background.

Tasks on the pooled 70,000 images, each client's samples split 90/10
(settings from `DataOptions.extra`, defaults in brackets):
  fmnist                    pathological non-IID (McMahan et al.):
                            'classes_per_client' [2] classes per client.
  rotated_fmnist_iid        IID split, 'num_clusters' [4] rotation clusters
                            (0/90/180/270 degrees; Ghosh et al., IFCA).
These two default to 200 clients; their optimization defaults (lr 0.01,
batch 10, 10 local epochs, 20 clients per round, mu 0.01) are this project's
choice in FedGroup's style.

The WeCFL paper's settings (Ma et al., "On the Convergence of Clustered
Federated Learning", Table 2 and Table 5), built as the authors' FedBase code
does (`partition.fedbase_groupwise` / `partition.fedbase_split`): the
official 60,000 train and 10,000 test images are cut with the same
proportion matrix; a client is kept only with more than 5 test samples.
  fmnist_clusterwise_dir    Dir(0.1) of each class over 'num_clusters' [10]
                            clusters, then Dir(10) over each cluster's
                            clients ('cluster_concentration' [0.1],
                            'client_concentration' [10]).
  fmnist_clusterwise_class  each cluster picks 'classes_per_cluster' [3]
                            classes, each client of a cluster
                            'classes_per_client' [2] of the cluster's classes
                            (independent uniform picks).
  fmnist_clientwise_dir     Dir('concentration' [0.1]) over 200 clients, no
                            clusters.
  fmnist_clientwise_class   'classes_per_client' [2] picks per client, no
                            clusters.
Cluster-wise tasks: --num_clients [200] must be a multiple of num_clusters
(20 clients per cluster by default); true_clusters = each client's cluster.
'fedbase_quirks' [true]: FedBase's behaviour: while at most half the nodes
of a split keep > 5 test samples, a fresh draw of the same data is APPENDED
(its nodes overlap the earlier ones'), and missing nodes are filled with
duplicates of kept ones (random picks with replacement, one copy per
distinct pick, until the count is reached). false: a draw is accepted only
when every node has > 5 test samples (exactly N disjoint clients; raises a
DataError where that is hopeless, e.g. clientwise Dir(0.1) x 200).
'recipe' [fedbase] (cluster-wise tasks only): 'ours' is this project's earlier
variant instead (pooled train+test, each class shuffled, clients topped up to
one sample, classes dealt evenly, 90/10 split per client).
Optimization defaults of these four tasks follow the paper (App. B.1): 200
clients, all per round, 100 rounds, batch 32, lr 0.001, client momentum 0.9
(persisted per client), mu 0.95 (FedProx's lambda), 10 local steps (a
user's --local_epochs replaces them).
These four tasks, as the paper's code: pixels mapped to [-1, 1]
(Normalize(0.5, 0.5)) and the CNN's BatchNorm with PyTorch's defaults
(running statistics moved by 0.1 of each batch's, eps 1e-5;
`models.fmnist_cnn_torch_bn`). Tested in inference mode (the moving
statistics, averaged with the model; the authors' code tests with batch
statistics).
Models: the FMNIST CNN with BatchNorm (default) or LeNet-5 (`--model=lenet5`).
"""

from __future__ import annotations

from typing import Callable, List, Tuple

import numpy as np

from tff_cluster import models
from tff_cluster.data import partition as part
from tff_cluster.data import vision
from tff_cluster.data.federated import DataError, FederatedData
from tff_cluster.spec.hparams import HParam
from tff_cluster.spec.task import DataOptions, TaskSpec, task_arg

DEFAULTS = dict(rounds=200, clients_per_round=20, local_epochs=10, batch_size=10,
                client_lr=0.01, mu=0.01, num_clients=200)
# The WeCFL paper's Table 2 / Table 5 setting (App. B.1).
WECFL_DEFAULTS = dict(rounds=100, clients_per_round=200, local_steps=10,
                      batch_size=32, client_lr=0.001, client_momentum=0.9,
                      client_state="persist", mu=0.95, num_clients=200)

NUM_CLASSES = 10
SOURCE = ("partitions: IFCA (Ghosh et al.), FedAvg (McMahan et al.); optimization "
          "defaults: this project (FedGroup-style)")
WECFL_SOURCE = ("WeCFL (Ma et al., 'On the Convergence of Clustered Federated "
                "Learning'): partition as the authors' FedBase code builds it, "
                "optimization defaults from the paper's App. B.1")

CLASSES_PER_CLIENT = HParam("classes_per_client", int, 2, "classes per client", low=1,
                            high=NUM_CLASSES)
ROTATION_CLUSTERS = HParam("num_clusters", int, 4, "rotation clusters", low=1, high=4)
NUM_CLUSTERS = HParam("num_clusters", int, 10, "true clusters (clients per cluster = "
                      "--num_clients / num_clusters)", low=1)
CLUSTER_CONCENTRATION = HParam("cluster_concentration", float, 0.1, "Dirichlet over clusters",
                               low=0, low_open=True)
CLIENT_CONCENTRATION = HParam("client_concentration", float, 10.0,
                              "Dirichlet over a cluster's clients", low=0, low_open=True)
CLASSES_PER_CLUSTER = HParam("classes_per_cluster", int, 3, "classes per cluster", low=1,
                             high=NUM_CLASSES)
CONCENTRATION = HParam("concentration", float, 0.1, "Dirichlet of each class over the "
                       "clients", low=0, low_open=True)
FEDBASE_QUIRKS = HParam("fedbase_quirks", bool, True, "FedBase's overlapping redraws and "
                        "duplicate clients (true) or only draws where every client keeps "
                        "> 5 test samples (false)")
RECIPE = HParam("recipe", str, "fedbase", "fedbase (the authors' split of train and "
                "test) or ours (pooled, 90/10 per client)", choices=("fedbase", "ours"))


def _pooled(options: DataOptions):
  return vision.load_fashion_mnist(options.data_dir, options.data_source)


def _where(options: DataOptions) -> str:
  label = vision.source_label("fashion_mnist", options.data_dir, options.data_source)
  return f"Fashion-MNIST ({label})"


def _num_clients(options: DataOptions) -> int:
  return options.num_clients or DEFAULTS["num_clients"]


def official_split(name: str, data_dir, data_source: str = "keras"
                   ) -> Tuple[Tuple[np.ndarray, np.ndarray], Tuple[np.ndarray, np.ndarray]]:
  """The official train and test sets of MNIST or Fashion-MNIST, not pooled:
  ((x_train, y_train), (x_test, y_test)), x float32 [n, 784] in [0, 1],
  y int64 0-9, in file order; from `data_source` (vision's module docstring)."""
  (train, test), where = vision.official_arrays(name, data_dir, data_source)
  out = []
  for x, y in (train, test):
    x = np.asarray(x)
    y = np.asarray(y).reshape(-1).astype(np.int64)
    if x.ndim != 3 or x.shape[1:] != (28, 28):
      raise DataError(f"{where}: expected 28x28 images, got {x.shape[1:]}")
    if len(y) and (y.min() < 0 or y.max() >= NUM_CLASSES):
      raise DataError(f"{where}: labels outside 0..{NUM_CLASSES - 1}")
    out.append((x.reshape(len(x), -1).astype(np.float32) / 255.0, y))
  return out[0], out[1]


def _official(options: DataOptions):
  return official_split("fashion_mnist", options.data_dir, options.data_source)


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


# ---------------------------------------------------------------------------
# The WeCFL paper's settings, shared with the MNIST twins
# (tasks/mnist_clusterwise.py).


def _clusters_and_size(options: DataOptions) -> Tuple[int, int, int]:
  n = options.num_clients or WECFL_DEFAULTS["num_clients"]
  m = task_arg(options, NUM_CLUSTERS)
  if n % m:
    raise DataError(
        f"--num_clients={n} is not a multiple of --task_arg=num_clusters={m}; "
        f"every cluster has the same number of clients (e.g. {m * max(1, n // m)})")
  return n, m, n // m


def _quirk_text(quirks: bool, p: part.SplitPartition) -> str:
  return (f"fedbase_quirks={'true' if quirks else 'false'}: "
          f"{p.info.get('dropped', 0)} clients dropped (<= 5 test samples), "
          f"{p.info.get('duplicated', 0)} duplicates")


def _materialize(split, p: part.SplitPartition, what: str, quirks: bool,
                 options: DataOptions) -> FederatedData:
  train, test = split
  return part.build_split_federated_data(
      train, test, p, NUM_CLASSES,
      f"{what}, {p.num_clients} clients, official train/test cut with one "
      f"proportion matrix (FedBase), {_quirk_text(quirks, p)}, seed {options.seed}")


def clusterwise_loader(source: Callable, label: str, method: str) -> Callable:
  """The loader of a cluster-wise task: `source(options)` gives the official
  split, `label` names the data, method 'dirichlet' or 'class'."""
  def load(options: DataOptions) -> FederatedData:
    n, m, per = _clusters_and_size(options)
    quirks = task_arg(options, FEDBASE_QUIRKS)
    if method == "dirichlet":
      a, b = task_arg(options, CLUSTER_CONCENTRATION), task_arg(options, CLIENT_CONCENTRATION)
      setting = f"cluster-wise Dir({a:g}, {b:g})"
    else:
      a, b = task_arg(options, CLASSES_PER_CLUSTER), task_arg(options, CLASSES_PER_CLIENT)
      if b > a:
        raise DataError(
            f"--task_arg=classes_per_client={b} exceeds classes_per_cluster={a}; a "
            "client picks among its cluster's classes")
      setting = f"cluster-wise ({a}, {b})-class"
    (x_tr, y_tr), (x_te, y_te) = split = source(options)
    if task_arg(options, RECIPE) == "ours":
      x, y = np.concatenate([x_tr, x_te]), np.concatenate([y_tr, y_te])
      if method == "dirichlet":
        p = part.clusterwise_dirichlet(y, m, n, a, b, options.seed)
      else:
        p = part.clusterwise_classes(y, m, n, a, b, options.seed)
      return part.build_federated_data(
          x, y, p, NUM_CLASSES, options.seed,
          f"{label}, {n} clients in {m} clusters, {setting}, recipe=ours (pooled, "
          f"90/10 per client), seed {options.seed}")
    p = part.fedbase_groupwise(y_tr, y_te, m, a, method, per, b, method,
                               options.seed, quirks)
    return _materialize(split, p, f"{label}, {m} clusters x {per} clients, {setting}",
                        quirks, options)
  return load


def clientwise_loader(source: Callable, label: str, method: str) -> Callable:
  """The loader of a client-wise task (no clusters)."""
  def load(options: DataOptions) -> FederatedData:
    n = options.num_clients or WECFL_DEFAULTS["num_clients"]
    quirks = task_arg(options, FEDBASE_QUIRKS)
    if method == "dirichlet":
      a = task_arg(options, CONCENTRATION)
      setting = f"client-wise Dir({a:g})"
    else:
      a = task_arg(options, CLASSES_PER_CLIENT)
      setting = f"client-wise {a}-class"
    split = source(options)
    p = part.fedbase_split(split[0][1], split[1][1], n, a, method, options.seed,
                           quirks)
    return _materialize(split, p, f"{label}, {setting}", quirks, options)
  return load


def _spec(name, description, load_data, *task_args, defaults=DEFAULTS, source=SOURCE,
          model_fn=models.fmnist_cnn):
  return TaskSpec(name=name, description=description, load_data=load_data,
                  model_fn=model_fn, model_name="fmnist_cnn",
                  other_models={"lenet5": models.lenet5},
                  loss=models.SPARSE_CE_LOGITS, defaults=defaults, source=source,
                  task_args=task_args)


def _centred(source: Callable) -> Callable:
  """The official split with pixels mapped to [-1, 1] (FedBase's
  Normalize(0.5, 0.5))."""
  def load(options: DataOptions):
    return tuple((x * 2.0 - 1.0, y) for x, y in source(options))
  return load


def wecfl_tasks(prefix: str, label: str, source: Callable) -> List[TaskSpec]:
  """The four WeCFL-paper tasks on one dataset: {prefix}_clusterwise_dir,
  {prefix}_clusterwise_class, {prefix}_clientwise_dir, {prefix}_clientwise_class."""
  common = dict(defaults=WECFL_DEFAULTS, source=WECFL_SOURCE,
                model_fn=models.fmnist_cnn_torch_bn)
  source = _centred(source)
  return [
      _spec(f"{prefix}_clusterwise_dir", f"{label}, WeCFL cluster-wise Dir(0.1, 10), "
            "10 clusters x 20 clients, official test split alike, FMNIST CNN",
            clusterwise_loader(source, label, "dirichlet"), NUM_CLUSTERS,
            CLUSTER_CONCENTRATION, CLIENT_CONCENTRATION, FEDBASE_QUIRKS, RECIPE,
            **common),
      _spec(f"{prefix}_clusterwise_class", f"{label}, WeCFL cluster-wise (3, 2)-class, "
            "10 clusters x 20 clients, official test split alike, FMNIST CNN",
            clusterwise_loader(source, label, "class"), NUM_CLUSTERS,
            CLASSES_PER_CLUSTER, CLASSES_PER_CLIENT, FEDBASE_QUIRKS, RECIPE, **common),
      _spec(f"{prefix}_clientwise_dir", f"{label}, WeCFL client-wise Dir(0.1), 200 "
            "clients, official test split alike, FMNIST CNN",
            clientwise_loader(source, label, "dirichlet"), CONCENTRATION,
            FEDBASE_QUIRKS, **common),
      _spec(f"{prefix}_clientwise_class", f"{label}, WeCFL client-wise 2-class, 200 "
            "clients, official test split alike, FMNIST CNN",
            clientwise_loader(source, label, "class"), CLASSES_PER_CLIENT,
            FEDBASE_QUIRKS, **common),
  ]


TASKS = [
    _spec("fmnist", "Fashion-MNIST, 200 clients x 2 classes (pathological), "
          "FMNIST CNN (--data_dir: idx files)", load_fmnist, CLASSES_PER_CLIENT),
    _spec("rotated_fmnist_iid", "Fashion-MNIST, 200 IID clients in 4 rotation "
          "clusters (0/90/180/270 deg), 90/10 split, FMNIST CNN (rotated_fmnist is the "
          "IFCA/CFL-MGD construction)", load_rotated, ROTATION_CLUSTERS),
    *wecfl_tasks("fmnist", "Fashion-MNIST", lambda options: _official(options)),
]
