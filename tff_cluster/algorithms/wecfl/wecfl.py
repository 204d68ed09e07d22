"""WeCFL (weighted clustered FL, the WeCFL paper) and FeSEM (Xie et al.), as
the WeCFL paper runs them.

Server state: K cluster models Omega_k (every weight stacked [K, ...],
BatchNorm statistics included; K = `--num_groups`). Every client starts on
one random model (all K rows equal, every client in cluster 0).

Round t, on the sampled clients (the paper: all of them):
  1. local update: client i trains its cluster's model Omega_{k(i)} for the
     local work (the paper: 10 steps of SGD with momentum 0.9, the buffer
     kept by the client between rounds) and keeps the trained model omega_i
     (`train` mode; the model stays with the client as its state);
  2. clustering, on the host: the features g_i of the trained models,
     `--wecfl_features=last_layer` (the kernel of the last Dense layer, the
     authors' code), `fc` (the kernels and biases of every Dense layer: "the
     flattened parameters of the fully-connected layers", the paper's App.
     B.1; on the FMNIST CNN, whose only Dense layer is the classifier, the
     last layer's kernel plus its bias) or `all` (every trainable weight,
     convolutions and BatchNorm's scale and offset included: a project
     variant), are
     clustered by K-Means with client weights lambda_i = n_i / sum_j n_j
     (n_i: training samples), minimising sum_i lambda_i ||g_i - G_k(i)||^2.
     `--wecfl_kmeans=refit`: K-Means refitted from scratch every round (the
     authors' code; k-means++ and 10 restarts, seeded); `one_step`: one E-step
     k(i) = argmin_k ||g_i - G_k|| against the features of the current cluster
     models (Algorithm 1; the first round, where every cluster model is the
     same, is refitted). Refitted labels are renamed to match the previous
     cluster models (least total distance between the new centres and the
     old models' features), so a cluster keeps its index across rounds;
  3. M-step (`aggregate` mode, keyed by the new clusters: a `ClusterMean`):
     Omega_k = sum_{i in k} a_i omega_i / sum_{i in k} a_i over every weight,
     BatchNorm statistics included; a cluster without members keeps its model;
  4. each member receives Omega_k (its next round's start; momentum buffers
     are kept).

WeCFL: K-Means weights lambda_i (`--kmeans_weights=data`, default;
`uniform` gives FeSEM's clustering) and a_i = lambda_i.
FeSEM (Xie et al., multi-center FL; `--algo=fesem`, as the WeCFL paper
compares with it): uniform K-Means weights (the clustering minimises
sum_i ||g_i - G_k(i)||^2, the WeCFL paper's eq. (2)), and
`--fesem_center=uniform` (a_i = 1, the WeCFL paper's eq. (2) for FeSEM,
default) or `data` (a_i = lambda_i, the authors' code behind the WeCFL
paper's FeSEM rows, whose aggregation keeps its data-size default).
Both are `WeCFLDriver` (its spec's `kmeans_weights`: FeSEM's fixed
`uniform`).

`--wecfl_mu` > 0 adds (mu/2)||w - w_bar||^2 to each local step, w_bar the
data-weighted mean of the clients' current models (each cluster model
weighted by the data of the members of its last M-step); the paper has no
such term (its authors' last driver uses mu = 0.95). Default 0.

Evaluation: each client is tested with its cluster's model.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_cluster import seeds
from tff_cluster import clustering
from tff_cluster.host import driver
from tff_cluster.host.state import HostState
from tff_cluster import models
from tff_cluster.core import cluster_ops
from tff_cluster.core.aggregators import ClusterMean
from tff_cluster.core.definition import ClientOutput, Definition, LocalSolver, flat_norm
from tff_cluster.learning import optimizers
from tff_cluster.algorithms.fedavg.fedavg import SERVER_OPT_STATE, per_cluster_server_optimizer


class ClusterModelsDefinition(Definition):
  """K cluster models; clients train theirs and keep the trained model; the
  host then assigns clusters and an `aggregate` call averages the kept models
  into the clusters they were assigned (WeCFL, FeSEM and CFL).

  State: `models` (every weight stacked [K, ...]) and `cluster_weight` [K]
  (the sum of a_i of each cluster's last M-step). Client state: `model` (the
  trained weights), `weight` (a_i, set by the host), `velocity` (with
  persistent momentum). Modes:
    train: key = the client's cluster; trains from its model (the proximal
      centre, with mu > 0, is the cluster-weight mean of the models);
    aggregate: key = the client's new cluster; its kept model goes into
      that cluster's mean with weight a_i (no database: the key alone).
  """

  modes = ("train", "aggregate")

  def __init__(self, weights_spec, num_trainable: int, num_clusters: int, *, mu: float,
               solver: LocalSolver = LocalSolver(),
               server_optimizer: Optional[optimizers.Chain] = None):
    """`mu`: the proximal coefficient toward the data-weighted mean of the
    cluster models (`--wecfl_mu`; CFL: 0). `server_optimizer`: an
    `optimizers` chain applied per cluster, in the M-step, to the
    pseudo-gradient Omega_k - (the members' mean) of the trainable weights,
    its state stacked [K, ...] (`server_opt_state`); None: Omega_k = the
    mean."""
    super().__init__(weights_spec, num_trainable, solver)
    self.k = int(num_clusters)
    self.mu = float(mu)
    self.server_optimizer = server_optimizer
    self._check_server_optimizer(server_optimizer)

  @staticmethod
  def _check_server_optimizer(optimizer):
    if optimizer is not None and optimizer.uses_client_lr:
      raise ValueError("a server optimizer that reads the round's client lr (SlowMo's) per "
                       "cluster; valid: sgd, heavy ball, adam, yogi, adagrad")

  def with_server_optimizer(self, optimizer):
    self._check_server_optimizer(optimizer)
    return super().with_server_optimizer(optimizer)

  def initial_state(self, initial_weights):
    """`initial_weights`: one model (every cluster starts there) or K models."""
    state = collections.OrderedDict(
        models=cluster_ops.stack_models(initial_weights, self.k),
        cluster_weight=np.zeros(self.k, np.float32))
    if self.server_optimizer is not None:
      opt = self.server_optimizer
      flat = opt.flat_state(opt.init(state["models"][:self.num_trainable]))
      if flat:
        state[SERVER_OPT_STATE] = [np.asarray(x) for x in flat]
    return state

  def num_keys(self, mode):
    return self.k

  def database(self, state, mode):
    if mode == "train":
      return list(state["models"])
    return None

  def broadcast(self, state, params, mode):
    out = collections.OrderedDict(lr=params["lr"])
    if mode == "train" and self.mu:
      cw = state["cluster_weight"]
      total = tf.reduce_sum(cw)
      share = tf.where(total > 0, cw / tf.where(total > 0, total, 1.0),
                       tf.one_hot(0, self.k, dtype=tf.float32))
      out["anchor"] = [tf.tensordot(share, w, axes=1)
                       for w in list(state["models"])[:self.num_trainable]]
    return out

  def client_state_spec(self, mode):
    spec = collections.OrderedDict(model=list(self.weights_spec),
                                   weight=tf.TensorSpec([], tf.float32))
    spec.update(super().client_state_spec(mode) or {})
    return spec

  def client_work(self, trainer, selected, received, client_state, data, mode, key=None):
    if mode == "aggregate":
      model_sums, weight_sums = ClusterMean(self.k).client(key, client_state["model"],
                                                           client_state["weight"])
      summed = collections.OrderedDict(model_sums=model_sums, weight_sums=weight_sums)
      result = collections.OrderedDict(cluster=key)
      return ClientOutput(summed, result, client_state)
    start = list(selected)
    optimizer = optimizers.chain(optimizers.proximal(self.mu, received.get("anchor")),
                                 self.local_step)
    out, new_state = self.local_update(trainer, start, data, received["lr"], client_state,
                                       optimizer)
    new_state["model"] = [s + d for s, d in zip(start, out.delta)]
    summed = collections.OrderedDict(
        loss_sum=out.loss_sum, num_examples=out.num_examples,
        update_norm_sum=flat_norm(out.delta), num_clients=tf.constant(1.0))
    return ClientOutput(summed, collections.OrderedDict(loss_sum=out.loss_sum), new_state)

  def server_update(self, state, summed, mode):
    if mode == "train":
      return state
    weights = summed["weight_sums"]
    has = weights > 0
    old_models = list(state["models"])
    models = ClusterMean.mean(summed["model_sums"], weights, old_models)
    out = collections.OrderedDict(
        models=models, cluster_weight=tf.where(has, weights, state["cluster_weight"]))
    if self.server_optimizer is None:
      return out
    # Each cluster's optimizer on Omega_k - mean_k (elementwise, so one
    # update of the stacks); a cluster without members keeps its model and
    # its optimizer state; BatchNorm statistics take the mean.
    n, opt = self.num_trainable, self.server_optimizer
    old = list(state.get(SERVER_OPT_STATE, []))
    trainable, opt_state = opt.update([w - m for w, m in zip(old_models[:n], models[:n])],
                                      opt.state_like(old, old_models[:n]), old_models[:n])
    keep = lambda new, was: tf.where(tf.reshape(has, cluster_ops.row_shape(self.k, was)),
                                     new, was)
    out["models"] = [keep(t, w) for t, w in zip(trainable, old_models[:n])] + models[n:]
    if old:
      out[SERVER_OPT_STATE] = [keep(b, o) for b, o in zip(opt.flat_state(opt_state), old)]
    return out


def match_labels(labels: np.ndarray, centres: np.ndarray, previous: np.ndarray) -> np.ndarray:
  """Renames K-Means labels so that new centre k sits where previous cluster
  k was: the permutation with the least total distance between `centres`
  [K, d] and `previous` [K, d] (the old cluster models' features)."""
  from scipy.optimize import linear_sum_assignment
  cost = np.linalg.norm(centres[:, None, :] - previous[None, :, :], axis=2)
  rows, cols = linear_sum_assignment(cost)
  rename = np.empty(len(centres), np.int64)
  rename[rows] = cols
  return rename[np.asarray(labels, np.int64)]


@dataclasses.dataclass
class ClusterModelsHost(HostState):
  """The host state of WeCFL, FeSEM and CFL: each client's cluster
  (`assignment`; -1: a test-only client, never assigned) and the summary facts."""
  assignment: np.ndarray
  summary: Dict[str, object]


class ClusterModelsDriver(driver.Driver):
  """Host side shared by WeCFL, FeSEM and CFL: cluster models, each client's
  cluster (`host.assignment`), the two calls per round. Subclasses choose the new
  clusters (`choose`) and the averaging weights (`aggregation_weights`).

  The definition is a `ClusterModelsDefinition` of `--num_groups` clusters.
  `min_round_clients`: the fewest clients a round may sample (None: as many
  as the clusters, which the round's clients are clustered into)."""

  host: ClusterModelsHost
  min_round_clients: Optional[int] = None

  @classmethod
  def check(cls, context: driver.Context) -> None:
    super().check(context)
    data, config = context.data, context.config
    num_groups = context.options.num_groups
    driver.check_num_groups(num_groups, data)
    need = num_groups if cls.min_round_clients is None else cls.min_round_clients
    if config.clients_per_round < need:
      raise ValueError(f"invalid --clients_per_round={config.clients_per_round}: the "
                       f"round's clients are clustered into --num_groups={num_groups}; "
                       f"valid: {need}..{data.num_training_clients}")

  def __init__(self, context: driver.Context, definition: ClusterModelsDefinition):
    super().__init__(context, definition)
    data = self.data
    num_groups = self.options.num_groups
    self.mu = float(definition.mu)
    self.k = num_groups
    # Every client starts in cluster 0, except test-only clients: -1, never
    # assigned (the evaluator tests them with their lowest-test-loss model).
    self.host = self.make_host(np.where(data.test_only(), -1, 0).astype(np.int64))
    sizes = np.asarray(data.num_train_samples(), np.float64)
    self.data_weight = sizes / sizes.sum()
    self.extra_columns = (["mean_update_norm", "num_changed"]
                          + self.group_columns(num_groups) + self.score_columns())

  # -- to override -----------------------------------------------------------

  def make_host(self, assignment: np.ndarray) -> ClusterModelsHost:
    """The host state at the start, every client in `assignment`'s cluster."""
    return ClusterModelsHost(assignment=assignment, summary={})

  def aggregation_weights(self) -> np.ndarray:
    """a_i of the M-step for every client."""
    return self.data_weight

  def choose(self, round_num: int, sampled: np.ndarray, trained: List[List[np.ndarray]],
             models: List[List[np.ndarray]]) -> np.ndarray:
    """The sampled clients' new clusters, from their trained models and the
    cluster models they started from."""
    raise NotImplementedError

  def round_extras(self) -> Dict[str, object]:
    return {}

  # -- the round ---------------------------------------------------------------

  def setup(self):
    self.state = self.runner.put_state(self.definition.initial_state(self.w0))
    self.host.summary["num_parameters"] = self.num_params
    return {}

  def group_assignment(self):
    return self.host.assignment

  def fresh_client_state(self, mode, client):
    state = collections.OrderedDict(self.definition.initial_client_state(mode))
    state["weight"] = np.float32(self.aggregation_weights()[client])
    return state

  def _models(self, state=None) -> List[List[np.ndarray]]:
    state = self.runner.numpy_state(self.state if state is None else state)
    return cluster_ops.unstack_models(state["models"], self.k)

  def run_round(self, round_num, sampled):
    sampled = np.asarray(sampled)
    assignment = self.host.assignment
    before = self._models()
    out = self.train_clients("train", self.state, sampled, round_num,
                             keys=assignment[sampled])
    trained = [list(new["model"]) for new in out.client_states]
    new = np.asarray(self.choose(round_num, sampled, trained, before), np.int64)
    changed = int((new != assignment[sampled]).sum())
    agg = self.train_clients("aggregate", out.state, sampled, round_num, keys=new)
    self.state = agg.state
    assignment[sampled] = new
    row = self.training_row(out.summed, len(sampled))
    row["num_changed"] = changed
    row.update(self.round_extras())
    return row

  def eval_models(self):
    return self._models(), self.host.assignment.copy()

  def round_eval_metrics(self, result):
    # Group accuracy: the clients tested with model j (test-only clients by
    # their own choice); sizes and the scores against the true clusters: the
    # clients with an assignment (test-only clients have none).
    assignment = self.host.assignment
    return {**self.group_metrics(result, self.k, result.client_model, assignment),
            **self.cluster_scores(assignment)}

  def summary(self):
    out = dict(self.host.summary)
    out["final_assignment"] = self.by_client(self.host.assignment)
    out["num_groups"] = self.k
    return out


class FixedClustersDriver(ClusterModelsDriver):
  """Cluster models whose clusters a host step sets once (FL+HC, PACFL): the
  rounds keep every client's cluster; `num_clusters` counts those in use.
  Its definition: `fixed_clusters_definition`."""

  min_round_clients = 1

  def __init__(self, context: driver.Context, definition: ClusterModelsDefinition):
    super().__init__(context, definition)
    self.extra_columns = [*self.extra_columns, "num_clusters"]

  def choose(self, round_num, sampled, trained, models):
    return self.host.assignment[sampled]

  def round_extras(self):
    assignment = self.host.assignment
    return {"num_clusters": int(len(np.unique(assignment[assignment >= 0])))}


def fixed_clusters_definition(context: driver.Context) -> ClusterModelsDefinition:
  """CFL's, FL+HC's and PACFL's definition: `--num_groups` cluster models, no
  proximal term."""
  return ClusterModelsDefinition(context.weights_spec, context.num_trainable,
                                 context.options.num_groups, mu=0.0, solver=context.solver,
                                 server_optimizer=per_cluster_server_optimizer(context.options))


class WeCFLDriver(ClusterModelsDriver):
  """WeCFL / FeSEM (see the module docstring)."""

  individual_updates = (
      "its host assigns clusters by K-Means over the clients' individual trained models")

  def __init__(self, context: driver.Context, definition: ClusterModelsDefinition):
    """The K-Means weights `kmeans_weights` and the M-step's a_i, data or
    uniform: WeCFL's `--kmeans_weights` and data; FeSEM's uniform (fixed by
    its spec) and its `--fesem_center`."""
    super().__init__(context, definition)
    options = self.options
    self.features = options.wecfl_features
    self.kmeans = options.wecfl_kmeans
    self.kmeans_weights = kmeans_weights = options.kmeans_weights
    self.center_weights = center_weights = options.get("fesem_center", "data")
    if self.features == "last_layer":
      self._feature_indices = [models.last_dense_kernel_index(self.model.model_fn())]
    elif self.features == "fc":
      self._feature_indices = models.dense_indices(self.model.model_fn())
    self.host.summary.update(wecfl_features=self.features, wecfl_kmeans=self.kmeans,
                         kmeans_weights=kmeans_weights, center_weights=center_weights)
    self._inertia = float("nan")
    self.extra_columns = [*self.extra_columns, "kmeans_objective"]

  def aggregation_weights(self):
    if self.center_weights == "uniform":
      return np.ones(self.data.num_clients)
    return self.data_weight

  def feature(self, weights: Sequence[np.ndarray]) -> np.ndarray:
    if self.features in ("last_layer", "fc"):
      return np.concatenate([np.asarray(weights[i], np.float64).ravel()
                             for i in self._feature_indices])
    return clustering.flatten_weights(list(weights)[:self.definition.num_trainable])

  def choose(self, round_num, sampled, trained, models):
    g = np.stack([self.feature(w) for w in trained])
    centres_before = np.stack([self.feature(m) for m in models])
    lam = self.data_weight[sampled] if self.kmeans_weights == "data" else None
    degenerate = np.allclose(centres_before, centres_before[0])
    if self.kmeans == "one_step" and not degenerate:
      labels = clustering.nearest_centre(g, centres_before)
      centres = clustering.weighted_centres(g, labels, self.k, lam, previous=centres_before)
    else:
      seed = seeds.int_seed(self.config.seed, "wecfl_kmeans", round_num)
      labels, centres = clustering.weighted_kmeans(g, self.k, lam, seed=seed)
      labels = match_labels(labels, centres, centres_before)
      centres = clustering.weighted_centres(g, labels, self.k, lam, previous=centres_before)
    w = np.ones(len(labels)) if lam is None else lam
    self._inertia = float(np.sum(w * np.sum((g - centres[labels]) ** 2, axis=1)) / w.sum())
    return labels

  def round_extras(self):
    return {"kmeans_objective": self._inertia}


def definition(context: driver.Context) -> ClusterModelsDefinition:
  """WeCFL's and FeSEM's definition: `--num_groups` cluster models, the
  proximal term `--wecfl_mu` (CFL's: `fixed_clusters_definition`)."""
  options = context.options
  return ClusterModelsDefinition(context.weights_spec, context.num_trainable,
                                 options.num_groups, mu=options.wecfl_mu,
                                 solver=context.solver,
                                 server_optimizer=per_cluster_server_optimizer(options))
