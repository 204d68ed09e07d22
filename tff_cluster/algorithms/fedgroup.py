"""FedGroup / FedGrouProx (Duan et al., "FedGroup: Efficient Clustered Federated
Learning via Decomposed Data-Driven Measure", 2021) as TFF computations.

Server state: m group models w_j (stacked, leading dimension m), each group's
latest update Delta w_j, and the auxiliary global model w.

Group cold start (Algorithm 3): min(alpha*m, N) clients each run one local
update from w_0; their updates Delta W (rows = clients) are clustered into m
groups by EDC (cosine similarity to the top-m right singular vectors of
Delta W, then K-Means++) or MADC (complete linkage on the mean absolute
difference of pairwise cosine similarities). Group j starts at the mean of its
members' trained models; Delta w_j = mean of their updates.

Round (Algorithm 2): each sampled client receives only its group's model
(`tff.federated_select` keyed by group id; key m selects the auxiliary model
for a client not yet in a group), runs `local_epochs` of mini-batch SGD
(FedGrouProx adds (mu/2)||w - w_group||^2) and returns its update. A client
not yet in a group (client cold start) trains from w and joins
g* = argmin_j (1 - cos(Delta w_j, Delta w_i)) / 2; its update counts toward g*.
Each group averages its members' updates weighted by examples (a group with
no sampled member keeps its model); then the optional inter-group step
w_j <- w_j + eta_g sum_{l != j} (w_l - w_j) / ||w_l - w_j||; then
w = mean_j w_j and Delta w_j = change of w_j this round (groups without
sampled members keep their previous Delta w_j).

Where the cold client's choice is made: the paper's server compares the
client's update with the Delta w_j. TFF never exposes one client's update to
the server, so the cold client receives the m directions Delta w_j and picks
g* itself (same rule, same result). In rounds that sample a cold client the
simulation broadcasts the directions to all sampled clients; `bytes_down`
counts them for the cold clients only, since only they need them.
"""

from __future__ import annotations

import collections
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_cluster import clustering, experiment, local_training, tff_types

COLD_STARTS = ("default", "rcc", "rac")
MEASURES = ("edc", "madc")


# ----------------------------------------------------------------------------
# Plain TF maths (used inside the TFF computations below).
# ----------------------------------------------------------------------------


def select_model(stacked: Sequence[tf.Tensor], key: tf.Tensor) -> List[tf.Tensor]:
  """Row `key` of each stacked weight: one model out of a cluster-indexed list."""
  return [tf.gather(t, key) for t in stacked]


def direction_choice(delta: Sequence[tf.Tensor],
                     directions: Sequence[tf.Tensor]) -> tf.Tensor:
  """g* = argmin_j (1 - cos(Delta w_j, delta)) / 2 (FedGroup client cold start)."""
  num_groups = tf.shape(directions[0])[0]
  flat_delta = tf.concat([tf.reshape(d, [-1]) for d in delta], 0)
  flat_dirs = tf.concat([tf.reshape(d, [num_groups, -1]) for d in directions], 1)
  dots = tf.linalg.matvec(flat_dirs, flat_delta)
  norms = tf.norm(flat_dirs, axis=1) * tf.norm(flat_delta)
  cos = tf.math.divide_no_nan(dots, norms)
  return tf.argmin((1.0 - cos) / 2.0, output_type=tf.int32)


def scatter_to_group(delta: Sequence[tf.Tensor], weight: tf.Tensor,
                     group: tf.Tensor, num_groups: int):
  """A client's weighted update placed in row `group` of m-row stacks.

  Summing these over clients gives, per group, sum_k n_k Delta_k and sum_k n_k:
  group-wise weighted aggregation with one federated sum.
  """
  onehot = tf.one_hot(group, num_groups, dtype=tf.float32)
  sums = [tf.tensordot(onehot, weight * d, axes=0) for d in delta]
  return sums, onehot * weight


def group_server_update(group_models: Sequence[tf.Tensor],
                        group_updates: Sequence[tf.Tensor],
                        update_sums: Sequence[tf.Tensor], weight_sums: tf.Tensor,
                        group_agg_lr: float):
  """Per-group weighted mean update, inter-group step, auxiliary model.

  Returns (new group models, new Delta w_j, new auxiliary model).
  """
  has_members = weight_sums > 0
  new_models = []
  for w, s in zip(group_models, update_sums):
    shape = tf.concat([tf.shape(weight_sums), tf.ones([tf.rank(w) - 1], tf.int32)], 0)
    denom = tf.reshape(tf.where(has_members, weight_sums, 1.0), shape)
    new_models.append(w + s / denom)  # s is zero where the group had no member
  if group_agg_lr > 0:
    new_models = clustering.inter_group_step(new_models, group_agg_lr)
  new_updates = []
  for new, old, previous in zip(new_models, group_models, group_updates):
    shape = tf.concat([tf.shape(weight_sums), tf.ones([tf.rank(new) - 1], tf.int32)], 0)
    mask = tf.reshape(has_members, shape)
    new_updates.append(tf.where(mask, new - old, previous))
  aux = [tf.reduce_mean(w, axis=0) for w in new_models]
  return new_models, new_updates, aux


# ----------------------------------------------------------------------------
# TFF wiring.
# ----------------------------------------------------------------------------


def _state_type(weights_type, num_groups):
  stacked = [tff.TensorType(t.dtype, [num_groups, *t.shape]) for t in weights_type]
  return tff.types.to_type(collections.OrderedDict(
      group_models=stacked, group_updates=stacked, aux_model=list(weights_type)))


def build_fedgroup(model_fn: Callable[[], tf.keras.Model], loss: str, element_spec,
                   num_groups: int, client_lr: float, mu: float = 0.0,
                   group_agg_lr: float = 0.0):
  """Builds FedGroup's TFF computations.

  Args:
    model_fn: builds a fresh, built Keras model.
    loss: `tff_cluster.models` loss kind.
    element_spec: element spec of a client's batched dataset.
    num_groups: m.
    client_lr: local SGD learning rate.
    mu: FedGrouProx proximal coefficient (0 = FedGroup).
    group_agg_lr: inter-group aggregation rate eta_g (0 = off).

  Returns a namespace with:
    `pretrain(model@SERVER, data@CLIENTS) -> (updates@CLIENTS, loss_sum, n)`:
      one local update per client from the broadcast model (group cold start).
    `process`: a `tff.templates.IterativeProcess` whose `next(state, data, keys)`
      runs one round; `keys` is `int32[1]` per client: its group, or m for a
      client not yet in a group (it then joins the group its update points to).
      Outputs `(state, metrics, client_groups@CLIENTS)`.
    `process_cold`: same, for rounds that sample clients not yet in a group
      (also broadcasts the m group directions).
  """
  if num_groups < 1:
    raise ValueError(f"num_groups must be >= 1, got {num_groups}")
  model = model_fn()
  variables = local_training.model_variables(model)
  weights_type = [tff.TensorType(v.dtype.as_numpy_dtype, v.shape.as_list())
                  for v in variables]
  weights_type_struct = tff.types.to_type(list(weights_type))
  state_type = _state_type(weights_type, num_groups)
  data_type = tff_types.sequence_type(element_spec)
  stacked_type = state_type.group_models
  m = num_groups

  @tff.tensorflow.computation(weights_type_struct, data_type)
  def pretrain_client(weights, dataset):
    local_sgd = local_training.build_local_sgd(model_fn(), loss)
    out = local_sgd(list(weights), dataset, client_lr, 0.0)
    return out["delta"], out["loss_sum"], out["num_examples"]

  @tff.federated_computation(tff.FederatedType(weights_type_struct, tff.SERVER),
                             tff.FederatedType(data_type, tff.CLIENTS))
  def pretrain(weights, data):
    deltas, loss_sum, num_examples = tff.federated_map(
        pretrain_client, (tff.federated_broadcast(weights), data))
    return deltas, tff.federated_sum(loss_sum), tff.federated_sum(num_examples)

  @tff.tensorflow.computation(state_type)
  def make_database(state):
    # Rows 0..m-1: group models; row m: the auxiliary model (cold clients).
    return [tf.concat([g, a[tf.newaxis]], 0)
            for g, a in zip(state["group_models"], state["aux_model"])]

  database_type = make_database.type_signature.result

  @tff.tensorflow.computation(database_type, tff.TensorType(np.int32))
  def select_fn(database, key):
    return select_model(database, key)

  def client_update(selected, dataset, key, directions):
    """Local training from the selected model; the update goes to its group."""
    start = list(selected.get_single_element())
    local_sgd = local_training.build_local_sgd(model_fn(), loss)
    out = local_sgd(start, dataset, client_lr, mu)
    group = key[0]
    if directions is not None:
      group = tf.where(group >= m, direction_choice(out["delta"], directions), group)
    sums, weights = scatter_to_group(out["delta"], out["num_examples"], group, m)
    drift = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(d)) for d in out["delta"]]))
    return (sums, weights, out["loss_sum"], out["num_examples"], drift,
            tf.reshape(group, [1]))

  client_arg_types = (tff.SequenceType(weights_type_struct), data_type,
                      tff.TensorType(np.int32, [1]))

  @tff.tensorflow.computation(*client_arg_types)
  def client_update_warm(selected, dataset, key):
    return client_update(selected, dataset, key, None)

  @tff.tensorflow.computation(*client_arg_types, stacked_type)
  def client_update_cold(selected, dataset, key, directions):
    return client_update(selected, dataset, key, list(directions))

  @tff.tensorflow.computation(state_type, stacked_type,
                              tff.TensorType(np.float32, [m]))
  def server_update(state, update_sums, weight_sums):
    models, updates, aux = group_server_update(
        list(state["group_models"]), list(state["group_updates"]),
        list(update_sums), weight_sums, group_agg_lr)
    return collections.OrderedDict(group_models=models, group_updates=updates,
                                   aux_model=aux)

  @tff.tensorflow.computation
  def dummy_state():
    return collections.OrderedDict(
        group_models=[tf.zeros(t.shape, t.dtype) for t in stacked_type],
        group_updates=[tf.zeros(t.shape, t.dtype) for t in stacked_type],
        aux_model=[tf.zeros(t.shape, t.dtype) for t in weights_type])

  @tff.federated_computation
  def initialize():
    # Real initial state comes from the group cold start (`initial_state`).
    return tff.federated_eval(dummy_state, tff.SERVER)

  @tff.tensorflow.computation(state_type)
  def group_directions(state):
    return state["group_updates"]

  def build_next(with_directions: bool):
    client_work = client_update_cold if with_directions else client_update_warm

    @tff.federated_computation(
        tff.FederatedType(state_type, tff.SERVER),
        tff.FederatedType(data_type, tff.CLIENTS),
        tff.FederatedType(tff.TensorType(np.int32, [1]), tff.CLIENTS))
    def next_fn(state, data, keys):
      database = tff.federated_map(make_database, state)
      selected = tff.federated_select(
          keys, tff.federated_value(np.int32(m), tff.SERVER), database, select_fn)
      args = [selected, data, keys]
      if with_directions:
        directions = tff.federated_map(group_directions, state)
        args.append(tff.federated_broadcast(directions))
      sums, weights, loss_sum, num_examples, drift, groups = tff.federated_map(
          client_work, tuple(args))
      new_state = tff.federated_map(
          server_update, (state, tff.federated_sum(sums), tff.federated_sum(weights)))
      metrics = tff.federated_zip(collections.OrderedDict(
          loss_sum=tff.federated_sum(loss_sum),
          num_examples=tff.federated_sum(num_examples),
          discrepancy=tff.federated_mean(drift),
          group_weights=tff.federated_sum(weights)))
      return new_state, metrics, groups

    return tff.templates.IterativeProcess(initialize, next_fn)

  return FedGroupComputations(pretrain=pretrain, process=build_next(False),
                              process_cold=build_next(True), state_type=state_type)


FedGroupComputations = collections.namedtuple(
    "FedGroupComputations", ["pretrain", "process", "process_cold", "state_type"])


def initial_state(w0: Sequence[np.ndarray], member_updates: Sequence[Sequence[np.ndarray]],
                  labels: np.ndarray, num_groups: int) -> Dict[str, list]:
  """Group j = mean of its members' trained models; Delta w_j = mean update.

  `member_updates[i]` is client i's update (list of arrays), `labels[i]` its
  group. The auxiliary model is the mean of the m group models.
  """
  labels = np.asarray(labels)
  models, updates = [], []
  for layer, w in enumerate(w0):
    layer_updates = np.stack([u[layer] for u in member_updates])
    mean_updates = np.stack([
        layer_updates[labels == j].mean(axis=0) if np.any(labels == j)
        else np.zeros_like(w) for j in range(num_groups)])
    updates.append(mean_updates.astype(w.dtype))
    models.append((w[np.newaxis] + mean_updates).astype(w.dtype))
  aux = [g.mean(axis=0) for g in models]
  return collections.OrderedDict(group_models=models, group_updates=updates,
                                 aux_model=aux)


# ----------------------------------------------------------------------------
# Runner used by the CLI.
# ----------------------------------------------------------------------------


class FedGroupRunner(experiment.Runner):
  """Group cold start, then FedGroup rounds; holds each client's group."""

  def __init__(self, task, data, config: experiment.TrainingConfig, *,
               num_groups: int = 5, measure: str = "edc", pretrain_scale: float = 20.0,
               pretrain_epochs: Optional[int] = None, group_agg_lr: float = 0.0,
               cold_start: str = "default", newcomer_fraction: float = 0.0,
               mu: float = 0.0):
    if measure not in MEASURES:
      raise ValueError(f"invalid --measure={measure}; valid: {', '.join(MEASURES)}")
    if cold_start not in COLD_STARTS:
      raise ValueError(f"invalid --cold_start={cold_start}; valid: {', '.join(COLD_STARTS)}")
    if not 1 <= num_groups <= data.num_clients:
      raise ValueError(f"invalid --num_groups={num_groups}; valid: 1..{data.num_clients} "
                       "(at most the number of clients)")
    if not 0 <= newcomer_fraction < 1:
      raise ValueError(f"invalid --newcomer_fraction={newcomer_fraction}; valid: [0, 1)")
    self._data = data
    self._config = config
    self.m = num_groups
    self.measure = measure
    self.pretrain_scale = pretrain_scale
    self.pretrain_epochs = pretrain_epochs or config.local_epochs
    self.cold_start = cold_start
    self._rng = np.random.default_rng(np.random.SeedSequence([config.seed, 11]))
    n = data.num_clients
    self.newcomers = np.zeros(n, bool)
    num_newcomers = int(round(newcomer_fraction * n))
    if num_newcomers:
      self.newcomers[self._rng.choice(n, num_newcomers, replace=False)] = True
    self.newcomer_rounds = int(np.ceil(0.1 * config.rounds)) if num_newcomers else 0
    pool = np.flatnonzero(~self.newcomers)
    if cold_start == "rcc":
      self.num_pretrain = min(num_groups, len(pool))
    else:
      self.num_pretrain = min(int(round(pretrain_scale * num_groups)), len(pool))
    if self.num_pretrain < num_groups:
      raise ValueError(
          f"invalid --num_groups={num_groups}: only {self.num_pretrain} clients can "
          f"be pre-trained; valid: 1..{self.num_pretrain}")
    if config.clients_per_round > n - num_newcomers and self.newcomer_rounds:
      raise ValueError(
          f"invalid --newcomer_fraction={newcomer_fraction}: leaves {n - num_newcomers} "
          f"clients for the first rounds, fewer than --clients_per_round="
          f"{config.clients_per_round}")
    element_spec = experiment.client_element_spec(data, config.batch_size)
    self._w0 = experiment.initial_weights(task, config.seed)
    self._num_params = int(sum(np.size(w) for w in self._w0))
    self.comps = build_fedgroup(task.model_fn, task.loss, element_spec, num_groups,
                                config.client_lr, mu=mu, group_agg_lr=group_agg_lr)
    self.assignment = np.full(n, -1, np.int64)
    self.state = None
    self._summary: Dict[str, object] = {}
    self.extra_columns = (
        ["discrepancy", "num_cold_clients", "num_assigned"]
        + [f"group_{j}_accuracy" for j in range(num_groups)]
        + [f"group_{j}_size" for j in range(num_groups)]
        + (["ari", "purity"] if data.true_clusters is not None else []))

  def _datasets(self, round_num, clients, epochs):
    return experiment.round_datasets(self._data, self._config, round_num, clients, epochs)

  def setup(self):
    t0 = time.perf_counter()
    pool = np.flatnonzero(~self.newcomers)
    chosen = np.sort(self._rng.choice(pool, self.num_pretrain, replace=False))
    deltas, loss_sum, num_examples = self.comps.pretrain(
        self._w0, self._datasets(0, chosen, self.pretrain_epochs))
    deltas = [[np.asarray(t) for t in d] for d in deltas]
    if self.cold_start == "rcc":
      labels = np.arange(self.m)  # each pre-trained client is one group's centre
    else:
      labels = clustering.cluster_updates(
          np.stack([clustering.flatten_weights(d) for d in deltas]), self.m,
          self.measure, seed=self._config.seed)
    self.assignment[chosen] = labels
    self.state = initial_state(self._w0, deltas, labels, self.m)
    seconds = time.perf_counter() - t0
    model_bytes = self._num_params * experiment.BYTES_PER_PARAMETER
    self._summary.update(
        cold_start_seconds=seconds,
        cold_start_clients=int(len(chosen)),
        cold_start_train_loss=float(loss_sum / max(num_examples, 1.0)),
        cold_start_bytes_down=int(len(chosen) * model_bytes),
        cold_start_bytes_up=int(len(chosen) * model_bytes),
        num_parameters=self._num_params)
    return {}

  def run_round(self, round_num, sampled):
    if round_num <= self.newcomer_rounds and self.newcomers[sampled].any():
      # Newcomers arrive after the first 10% of rounds: resample without them.
      eligible = np.flatnonzero(~self.newcomers)
      sampled = np.sort(self._rng.choice(eligible, len(sampled), replace=False))
    cold = self.assignment[sampled] < 0
    if self.cold_start == "rac" and cold.any():
      # Random assignment of cold clients: they join a uniformly random group.
      self.assignment[sampled[cold]] = self._rng.integers(0, self.m, cold.sum())
      cold = self.assignment[sampled] < 0
    keys = [np.array([g if g >= 0 else self.m], np.int32)
            for g in self.assignment[sampled]]
    process = self.comps.process_cold if cold.any() else self.comps.process
    state, metrics, groups = process.next(
        self.state, self._datasets(round_num, sampled, self._config.local_epochs), keys)
    self.state = state
    self.assignment[sampled] = np.array([int(np.asarray(g)[0]) for g in groups])
    model_bytes = self._num_params * experiment.BYTES_PER_PARAMETER
    return {
        "train_loss": float(metrics["loss_sum"] / max(metrics["num_examples"], 1.0)),
        "discrepancy": float(metrics["discrepancy"]),
        "num_cold_clients": int(cold.sum()),
        "num_assigned": int((self.assignment >= 0).sum()),
        "bytes_down": int(len(sampled) * model_bytes + cold.sum() * self.m * model_bytes),
        "bytes_up": int(len(sampled) * model_bytes),
    }

  def _models(self):
    groups = [[np.asarray(layer[j]) for layer in self.state["group_models"]]
              for j in range(self.m)]
    return groups + [[np.asarray(w) for w in self.state["aux_model"]]]

  def eval_models(self):
    client_model = np.where(self.assignment >= 0, self.assignment, self.m)
    return self._models(), client_model

  def round_eval_metrics(self, result):
    out = {}
    for j in range(self.m):
      out[f"group_{j}_accuracy"] = result.group_accuracy(self.assignment, j)
      out[f"group_{j}_size"] = int((self.assignment == j).sum())
    out.update(self._cluster_scores())
    return out

  def _cluster_scores(self):
    truth = self._data.true_clusters
    assigned = self.assignment >= 0
    if truth is None or not assigned.any():
      return {}
    return {"ari": clustering.adjusted_rand_index(truth[assigned], self.assignment[assigned]),
            "purity": clustering.purity(truth[assigned], self.assignment[assigned])}

  def summary(self):
    out = dict(self._summary)
    out["final_assignment"] = {cid: int(g) for cid, g in
                               zip(self._data.client_ids, self.assignment)}
    out["group_sizes"] = [int((self.assignment == j).sum()) for j in range(self.m)]
    out["num_groups"] = self.m
    out.update(self._cluster_scores())
    return out


def make_runner(task, data, config: experiment.TrainingConfig, **options):
  """FedGroup (no proximal term); options are the `--num_groups` etc. flags."""
  return FedGroupRunner(task, data, config, mu=0.0, **options)
