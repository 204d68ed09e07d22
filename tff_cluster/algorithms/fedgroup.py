"""FedGroup / FedGrouProx (Duan et al., "FedGroup: Efficient Clustered Federated
Learning via Decomposed Data-Driven Measure", 2021).

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
from typing import Callable, Dict, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_cluster import clustering, experiment, local_training
from tff_cluster.algorithms.definition import ClientOutput, Definition, flat_norm

COLD_STARTS = ("default", "rcc", "rac")
MEASURES = ("edc", "madc")


# ----------------------------------------------------------------------------
# Plain TF maths.
# ----------------------------------------------------------------------------


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
# The definition (both runners) and its TFF computations.


class FedGroupDefinition(Definition):
  """FedGroup's round as plain TF functions (see the module docstring).

  State: `group_models` and `group_updates` (each weight stacked [m, ...]) and
  `aux_model`. Modes:
    pretrain: every client receives the auxiliary model (w_0 before the cold
      start) and returns its update to the host (group cold start);
    warm: each client selects its group's model by key 0..m-1;
    cold: key m selects the auxiliary model for a client not yet in a group,
      and every client also receives the m directions Delta w_j.
  """

  modes = ("pretrain", "warm", "cold")

  def __init__(self, weights_spec, num_trainable: int, num_groups: int, mu: float = 0.0,
               group_agg_lr: float = 0.0, **solver):
    super().__init__(weights_spec, num_trainable, **solver)
    if num_groups < 1:
      raise ValueError(f"invalid --num_groups={num_groups}; valid: an integer >= 1")
    self.m = int(num_groups)
    self.mu = float(mu)
    self.group_agg_lr = float(group_agg_lr)

  def initial_state(self, initial_weights):
    """Every group and the auxiliary model at w_0 (before the cold start)."""
    w0 = [np.asarray(w) for w in initial_weights]
    return collections.OrderedDict(
        group_models=[np.stack([w] * self.m) for w in w0],
        group_updates=[np.zeros((self.m, *w.shape), w.dtype) for w in w0],
        aux_model=w0)

  def num_keys(self, mode):
    return {"pretrain": 0, "warm": self.m, "cold": self.m + 1}[mode]

  def database(self, state, mode):
    # Rows 0..m-1: the group models; row m: the auxiliary model (cold clients).
    # Each row carries its key, so a client knows which group it was given.
    # (Fields in sorted order: TFF's federated_select orders them so.)
    return collections.OrderedDict(
        key=tf.range(self.m + 1, dtype=tf.int32),
        model=[tf.concat([g, a[tf.newaxis]], 0)
               for g, a in zip(state["group_models"], state["aux_model"])])

  def broadcast(self, state, params, mode):
    out = collections.OrderedDict(lr=params["lr"])
    if mode == "pretrain":
      out["model"] = list(state["aux_model"])
    if mode == "cold":
      out["directions"] = list(state["group_updates"])
    return out

  def client_state_spec(self, mode):
    return None if mode == "pretrain" else super().client_state_spec(mode)

  def client_work(self, trainer, selected, received, client_state, data, mode):
    if mode == "pretrain":
      out, _ = self.local_update(trainer, received["model"], data, received["lr"], None)
      summed = collections.OrderedDict(loss_sum=out.loss_sum,
                                       num_examples=out.num_examples)
      return ClientOutput(summed, collections.OrderedDict(delta=out.delta,
                                                          loss_sum=out.loss_sum))
    out, new_state = self.local_update(trainer, list(selected["model"]), data,
                                       received["lr"], client_state, mu=self.mu)
    group = selected["key"]
    if mode == "cold":
      group = tf.where(group >= self.m,
                       direction_choice(out.delta, list(received["directions"])), group)
    sums, weights = scatter_to_group(out.delta, out.num_examples, group, self.m)
    summed = collections.OrderedDict(
        update_sums=sums, weight_sums=weights, loss_sum=out.loss_sum,
        num_examples=out.num_examples, update_norm_sum=flat_norm(out.delta),
        num_clients=tf.constant(1.0))
    return ClientOutput(summed, collections.OrderedDict(group=group, loss_sum=out.loss_sum),
                        new_state)

  def server_update(self, state, summed, mode):
    if mode == "pretrain":
      return state
    models, updates, aux = group_server_update(
        list(state["group_models"]), list(state["group_updates"]),
        list(summed["update_sums"]), summed["weight_sums"], self.group_agg_lr)
    return collections.OrderedDict(group_models=models, group_updates=updates,
                                   aux_model=aux)


FedGroupComputations = collections.namedtuple(
    "FedGroupComputations", ["definition", "pretrain", "warm", "cold"])


def build_fedgroup(model_fn: Callable[[], tf.keras.Model], loss: str, element_spec,
                   num_groups: int, mu: float = 0.0, group_agg_lr: float = 0.0,
                   client_momentum: float = 0.0) -> FedGroupComputations:
  """FedGroup's TFF computations (the `tff` runner's), for research pipelines.

  Args:
    model_fn: builds a fresh, built Keras model.
    loss: `tff_cluster.models` loss kind.
    element_spec: element spec of a client's batched dataset.
    num_groups: m.
    mu: FedGrouProx proximal coefficient (0 = FedGroup).
    group_agg_lr: inter-group aggregation rate eta_g (0 = off).
    client_momentum: heavy-ball beta of local SGD (buffer reset every round).

  Returns `FedGroupComputations(definition, pretrain, warm, cold)`; each is a
  federated computation `(state, params, datasets[, keys]) -> (state, summed,
  per-client results)` (see `tff_runner.build_round`), with
  `params = tff_cluster.algorithms.definition.round_params(lr)`:
    pretrain: one local update per client from the auxiliary model; results
      hold each client's update (group cold start, `cold_start_state`);
    warm: keys are `int32[1]` groups 0..m-1; results hold each client's group;
    cold: keys may also be m (a client not yet in a group: it trains from the
      auxiliary model and joins the group its update points to).
  The initial state is `definition.initial_state(w0)`, replaced after the
  pre-training by `cold_start_state(...)`.
  """
  from tff_cluster.runners import tff_runner

  model = model_fn()
  definition = FedGroupDefinition(local_training.weights_type_spec(model),
                                  len(model.trainable_variables), num_groups, mu=mu,
                                  group_agg_lr=group_agg_lr, momentum=client_momentum)
  comps = {mode: tff_runner.build_round(definition, mode, model_fn, loss, element_spec)
           for mode in definition.modes}
  return FedGroupComputations(definition, **comps)


def cold_start_state(w0: Sequence[np.ndarray], member_updates: Sequence[Sequence[np.ndarray]],
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
# The host side: cold start, assignments, newcomers, metrics.
# ----------------------------------------------------------------------------


class FedGroupDriver(experiment.Driver):
  """Group cold start, then FedGroup rounds; holds each client's group."""

  checkpoint_attrs = ("assignment", "newcomers", "_rng", "_summary")

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
    super().__init__(task, data, config,
                     lambda specs, num_trainable, **solver: FedGroupDefinition(
                         specs, num_trainable, num_groups, mu=mu,
                         group_agg_lr=group_agg_lr, **solver))
    self.m = num_groups
    self.measure = measure
    self.pretrain_scale = pretrain_scale
    # The cold start's pre-training does the round's local work unless
    # --pretrain_epochs says otherwise.
    self.pretrain_work = (config.local_work if pretrain_epochs is None else
                          local_training.LocalWork(config.batch_size, epochs=pretrain_epochs))
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
    if len(pool) < num_groups:
      raise ValueError(
          f"invalid --newcomer_fraction={newcomer_fraction}: leaves {len(pool)} clients "
          f"to pre-train, fewer than --num_groups={num_groups}; valid: at most "
          f"{(n - num_groups) / n:g}")
    if self.num_pretrain < num_groups:
      raise ValueError(
          f"invalid --pretrain_scale={pretrain_scale:g}: pre-trains round({pretrain_scale:g}"
          f" x {num_groups}) = {self.num_pretrain} clients, fewer than --num_groups="
          f"{num_groups}; valid: a number >= 1")
    if config.clients_per_round > n - num_newcomers and self.newcomer_rounds:
      raise ValueError(
          f"invalid --newcomer_fraction={newcomer_fraction}: leaves {n - num_newcomers} "
          f"clients for the first rounds, fewer than --clients_per_round="
          f"{config.clients_per_round}")
    self.assignment = np.full(n, -1, np.int64)
    self.state = None
    self._summary: Dict[str, object] = {}
    self.extra_columns = (
        ["discrepancy", "num_cold_clients", "num_assigned"]
        + [f"group_{j}_accuracy" for j in range(num_groups)]
        + [f"group_{j}_size" for j in range(num_groups)]
        + (["ari", "purity"] if data.true_clusters is not None else []))

  def setup(self):
    t0 = time.perf_counter()
    pool = np.flatnonzero(~self.newcomers)
    chosen = np.sort(self._rng.choice(pool, self.num_pretrain, replace=False))
    out = self.train_clients("pretrain", self.definition.initial_state(self.w0), chosen,
                             0, work=self.pretrain_work, persist=False)
    deltas = [list(r["delta"]) for r in out.results]
    if self.cold_start == "rcc":
      labels = np.arange(self.m)  # each pre-trained client is one group's centre
    else:
      labels = clustering.cluster_updates(
          np.stack([clustering.flatten_weights(d) for d in deltas]), self.m,
          self.measure, seed=self.config.seed)
    self.assignment[chosen] = labels
    self.state = self.runner.put_state(cold_start_state(self.w0, deltas, labels, self.m))
    seconds = time.perf_counter() - t0
    model_bytes = self.num_params * experiment.BYTES_PER_PARAMETER
    self._summary.update(
        cold_start_seconds=seconds,
        cold_start_clients=int(len(chosen)),
        cold_start_train_loss=float(out.summed["loss_sum"] /
                                    max(out.summed["num_examples"], 1.0)),
        cold_start_bytes_down=int(len(chosen) * model_bytes),
        cold_start_bytes_up=int(len(chosen) * model_bytes),
        num_parameters=self.num_params)
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
    keys = [int(g) if g >= 0 else self.m for g in self.assignment[sampled]]
    out = self.train_clients("cold" if cold.any() else "warm", self.state, sampled,
                             round_num, keys=keys)
    self.state = out.state
    self.assignment[sampled] = [int(r["group"]) for r in out.results]
    s = out.summed
    model_bytes = self.num_params * experiment.BYTES_PER_PARAMETER
    return {
        "train_loss": float(s["loss_sum"] / max(s["num_examples"], 1.0)),
        "discrepancy": float(s["update_norm_sum"] / s["num_clients"]),
        "num_cold_clients": int(cold.sum()),
        "num_assigned": int((self.assignment >= 0).sum()),
        "bytes_down": int(len(sampled) * model_bytes + cold.sum() * self.m * model_bytes),
        "bytes_up": int(len(sampled) * model_bytes),
    }

  def _models(self):
    state = self.runner.numpy_state(self.state)
    groups = [[layer[j] for layer in state["group_models"]] for j in range(self.m)]
    return groups + [list(state["aux_model"])]

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
    truth = self.data.true_clusters
    assigned = self.assignment >= 0
    if truth is None or not assigned.any():
      return {}
    return {"ari": clustering.adjusted_rand_index(truth[assigned], self.assignment[assigned]),
            "purity": clustering.purity(truth[assigned], self.assignment[assigned])}

  def summary(self):
    out = dict(self._summary)
    out["final_assignment"] = {cid: int(g) for cid, g in
                               zip(self.data.client_ids, self.assignment)}
    out["group_sizes"] = [int((self.assignment == j).sum()) for j in range(self.m)]
    out["num_groups"] = self.m
    out.update(self._cluster_scores())
    return out


def make_driver(task, data, config: experiment.TrainingConfig, **options):
  """FedGroup (no proximal term); options are the `--num_groups` etc. flags."""
  return FedGroupDriver(task, data, config, mu=0.0, **options)
