"""FedGroup / FedGrouProx (Duan et al., "FedGroup: Efficient Clustered Federated
Learning via Decomposed Data-Driven Measure", 2021).

FedGrouProx (`--algo=fedgrouprox`, Section 3.2: Algorithm 2 line 15, Eq. (3))
is FedGroup whose clients add the FedProx proximal term (mu/2)||w - w_group||^2,
anchored at the client's group model, to the warm rounds' local steps; mu = 1
for synthetic, MNIST and FEMNIST and 0.01 for Sent140 (FedProx's
recommendations). Its `--mu` must be > 0 (`hparams.MU_POSITIVE`): mu = 0 is
FedGroup.

Server state: m group models w_j (stacked, leading dimension m), each group's
latest update Delta w_j, which groups have had members, and the auxiliary
global model w (the mean of the groups that have had members).

Group cold start (Algorithm 3): min(alpha*m, N) clients each pre-train from
w_0; their updates Delta W (rows = clients) are clustered into m groups by EDC
(cosine similarity to the top-m right singular vectors of Delta W, then
K-Means++) or MADC (complete linkage on the mean absolute difference of
pairwise cosine similarities). Group j starts at the mean of its members'
pre-trained models; Delta w_j = the mean of their updates.

Pre-training length (`--pretrain_iters` / `--pretrain_epochs`): the paper's
Algorithm 3 calls the full ClientUpdate (E epochs), but its Section 3.4 says a
pre-trained client "continues to train E - 1 epochs", i.e. pre-training is one
epoch. Both authors' codes pre-train 50 mini-batch steps, cycling through the
client's reshuffled data as needed; that is the default (`--pretrain_iters=50`).
`--pretrain_epochs=1` is the paper's text.

Round (Algorithm 2): each sampled client receives only its group's model
(`tff.federated_select` keyed by group id), runs the round's local work
(FedGrouProx adds (mu/2)||w - w_group||^2) and returns its update. Each group
averages its members' updates weighted by examples (a group with no sampled
member keeps its model); then the optional inter-group step (below); then the
auxiliary model and Delta w_j (the change of w_j this round; groups without
sampled members keep their previous Delta w_j).

Client cold start, for a sampled client not yet in a group
(`--newcomer_rule`):
  paper (default): Section 3.4, Eq. (9): the client pre-trains from the
    auxiliary model w (same length as the group cold start) and joins
    g* = argmin_j (1 - cos(Delta w_j, Delta w_pre)) / 2 against the groups'
    latest updates Delta w_j;
  flexcfl: as the authors' TF2 code runs it: the client pre-trains from w_0
    and is compared with each group's fixed cold-start direction (the mean
    cold-start update of its members).
Under both rules the client then does the round's local training from
w_{g*}, and that update counts toward g*: an update is only ever added to the
model it was computed from. The choice is made on the client (it receives the
m directions), since a TFF server never sees one client's update; `bytes_down`
counts the start model and the m directions for those clients.

Cold-start ablations (`--cold_start`): rcc pre-trains m random clients, each
one group's centre (the rest join by the newcomer rule); rac gives every
client that was not pre-trained in the group cold start a new uniformly random
group each round it is sampled, and tests it with the last group it drew (the
authors' original TF1 code, whose per-round re-grouping is what the paper's
RAC ablation measures); rac_once assigns such a client a random group once, at
its first participation (the authors' TF2 code).

Inter-group aggregation (`--group_agg_lr` eta_g > 0, `--group_agg_rule`); the
paper is inconsistent between Algorithm 2 and Eq. (20):
  alg2 (default): Algorithm 2 line 19 as printed, for all m groups:
    w_j <- w_j + eta_g sum_{l != j} (w_l - w_j) / ||w_l - w_j||;
  authors: Eq. (20) normalised as both authors' codes run it, for the groups
    with sampled members this round (l and j range over them):
    w_j <- (w_j + sum_{l != j} (eta_g/||w_l||) w_l) / (1 + sum_{l != j} eta_g/||w_l||).
eta_g values are not interchangeable between the two rules. The paper's
Table 3 runs with eta_g = 0 (inter-group aggregation disabled), the default.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Dict, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_cluster import seeds
from tff_cluster import clustering
from tff_cluster.host import driver
from tff_cluster.host.state import HostState
from tff_cluster.learning import schedule
from tff_cluster.core import cluster_ops
from tff_cluster.core.aggregators import ClusterMean
from tff_cluster.core.definition import ClientOutput, Definition, LocalSolver, flat_norm
from tff_cluster.learning import optimizers
from tff_cluster.spec.options import given

DEFAULT_PRETRAIN_ITERS = 50
# Newcomer pre-training shuffles are seeded by this + the round number, apart
# from the round's own local training (seeded by the round number).
NEWCOMER_SHUFFLE_BASE = 1 << 30


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


def _row_shape(rows: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
  """Shape broadcasting an [m] vector against an [m, ...] stack."""
  return cluster_ops.row_shape(tf.shape(rows)[0], w)


def authors_inter_group_step(group_models: Sequence[tf.Tensor], eta: float,
                             active: tf.Tensor):
  """Eq. (20) as both FedGroup authors' codes run it, for the `active` groups.

  For each active j: w_j <- (w_j + sum_{l != j} a_l w_l) / (1 + sum_{l != j} a_l)
  with a_l = eta / ||w_l|| over the active l (||.|| over all layers jointly);
  inactive groups are unchanged and do not contribute. All from the old models.
  """
  m = tf.shape(active)[0]
  sq = tf.add_n([tf.reduce_sum(tf.square(tf.reshape(tf.cast(w, tf.float64), [m, -1])), 1)
                 for w in group_models])
  coef = tf.math.divide_no_nan(tf.constant(eta, tf.float64) * tf.cast(active, tf.float64),
                               tf.sqrt(sq))
  total = tf.reduce_sum(coef)
  out = []
  for w in group_models:
    w64 = tf.cast(w, tf.float64)
    mixed = tf.tensordot(coef, w64, axes=1)[tf.newaxis]  # sum_l a_l w_l
    c = tf.reshape(coef, _row_shape(coef, w))
    new = (w64 + mixed - c * w64) / (1.0 + total - c)
    out.append(tf.where(tf.reshape(active, _row_shape(active, w)), tf.cast(new, w.dtype), w))
  return out


def group_server_update(group_models: Sequence[tf.Tensor],
                        group_updates: Sequence[tf.Tensor],
                        update_sums: Sequence[tf.Tensor], weight_sums: tf.Tensor,
                        group_agg_lr: float, group_active: Optional[tf.Tensor],
                        group_agg_rule: str):
  """Per-group weighted mean update, inter-group step, auxiliary model.

  Returns (new group models, new Delta w_j, new auxiliary model, new
  group_active). The auxiliary model is the mean of the groups that have had
  members (sampled members this round or `group_active`); all groups if none.
  """
  has_members = weight_sums > 0
  means = ClusterMean.mean(update_sums, weight_sums, [tf.zeros_like(w) for w in group_models])
  new_models = [w + m for w, m in zip(group_models, means)]
  if group_agg_lr > 0:
    if group_agg_rule == "alg2":
      new_models = clustering.inter_group_step(new_models, group_agg_lr)
    elif group_agg_rule == "authors":
      new_models = authors_inter_group_step(new_models, group_agg_lr, has_members)
    else:
      raise ValueError(f"unknown group_agg_rule {group_agg_rule!r}")
  new_updates = []
  for new, old, previous in zip(new_models, group_models, group_updates):
    mask = tf.reshape(has_members, _row_shape(weight_sums, new))
    new_updates.append(tf.where(mask, new - old, previous))
  active = tf.cast(has_members, tf.float32)
  if group_active is not None:
    active = tf.maximum(active, tf.cast(group_active, tf.float32))
  return new_models, new_updates, auxiliary_model(new_models, active), active


def auxiliary_model(group_models: Sequence[tf.Tensor], active: tf.Tensor):
  """The mean of the active groups' models (of all groups if none is active)."""
  active = tf.cast(active, tf.float32)
  weights = tf.where(tf.reduce_sum(active) > 0, active, tf.ones_like(active))
  weights = weights / tf.reduce_sum(weights)
  return [tf.tensordot(tf.cast(weights, w.dtype), w, axes=1) for w in group_models]


# ----------------------------------------------------------------------------
# The definition (both runners) and its TFF computations.


class FedGroupDefinition(Definition):
  """FedGroup's round as plain TF functions (see the module docstring).

  State: `group_models` and `group_updates` (each weight stacked [m, ...]),
  `group_active` ([m], 1 for a group that has had members), `aux_model`; with
  the flexcfl newcomer rule also `init_model` (w_0) and `init_updates` (the
  groups' cold-start directions). Modes:
    pretrain: every client receives the auxiliary model (w_0 before the cold
      start), pre-trains and returns its update to the host (group cold start);
    newcomer: a client not yet in a group pre-trains from the rule's start
      model and picks g* against the rule's m directions; returns g* only;
    warm: each client selects its group's model by key 0..m-1, trains, and
      its update counts toward that group.
  """

  modes = ("pretrain", "newcomer", "warm")

  def __init__(self, weights_spec, num_trainable: int, num_groups: int, *, mu: float,
               group_agg_lr: float, group_agg_rule: str, newcomer_rule: str,
               solver: LocalSolver = LocalSolver()):
    """`mu`: FedGrouProx's proximal coefficient (FedGroup: 0); the others are
    the `--group_agg_lr`, `--group_agg_rule` and `--newcomer_rule` options."""
    super().__init__(weights_spec, num_trainable, solver)
    self.m = int(num_groups)
    self.mu = float(mu)
    # The warm rounds' local steps; the cold start's have no proximal term.
    self.client_optimizer = optimizers.chain(optimizers.proximal(self.mu), self.local_step)
    self.group_agg_lr = float(group_agg_lr)
    self.group_agg_rule = group_agg_rule
    self.newcomer_rule = newcomer_rule

  def initial_state(self, initial_weights):
    """Every group and the auxiliary model at w_0 (before the cold start)."""
    w0 = [np.asarray(w) for w in initial_weights]
    zeros = [np.zeros((self.m, *w.shape), w.dtype) for w in w0]
    return self._with_rule_fields(collections.OrderedDict(
        group_models=[np.stack([w] * self.m) for w in w0],
        group_updates=zeros, group_active=np.zeros(self.m, np.float32),
        aux_model=w0), w0, zeros)

  def _with_rule_fields(self, state, w0, directions):
    if self.newcomer_rule == "flexcfl":
      state["init_model"] = [np.asarray(w) for w in w0]
      state["init_updates"] = [np.asarray(d) for d in directions]
    return state

  def cold_start_state(self, w0, member_updates, labels):
    """The state after the group cold start (`cold_start_state`), with the
    fixed cold-start directions the flexcfl newcomer rule compares with."""
    state = cold_start_state(w0, member_updates, labels, self.m)
    return self._with_rule_fields(state, w0, state["group_updates"])

  def num_keys(self, mode):
    return {"pretrain": 0, "newcomer": 0, "warm": self.m}[mode]

  def database(self, state, mode):
    return list(state["group_models"])  # row j: group j's model

  def broadcast(self, state, params, mode):
    out = collections.OrderedDict(lr=params["lr"])
    if mode == "pretrain":
      out["model"] = list(state["aux_model"])
    elif mode == "newcomer":
      if self.newcomer_rule == "paper":
        out["model"] = list(state["aux_model"])
        out["directions"] = list(state["group_updates"])
      else:
        out["model"] = list(state["init_model"])
        out["directions"] = list(state["init_updates"])
    return out

  def client_state_spec(self, mode):
    return None if mode != "warm" else super().client_state_spec(mode)

  def client_work(self, trainer, selected, received, client_state, data, mode, key=None):
    if mode in ("pretrain", "newcomer"):
      out, _ = self.local_update(trainer, received["model"], data, received["lr"], None,
                                 self.local_step)
      summed = collections.OrderedDict(loss_sum=out.loss_sum,
                                       num_examples=out.num_examples)
      if mode == "pretrain":
        result = collections.OrderedDict(delta=out.delta, loss_sum=out.loss_sum)
      else:
        result = collections.OrderedDict(
            group=direction_choice(out.delta, list(received["directions"])),
            loss_sum=out.loss_sum)
      return ClientOutput(summed, result)
    out, new_state = self.local_update(trainer, list(selected), data, received["lr"],
                                       client_state)
    group = key
    sums, weights = ClusterMean(self.m).client(group, out.delta, out.num_examples)
    summed = collections.OrderedDict(
        update_sums=sums, weight_sums=weights, loss_sum=out.loss_sum,
        num_examples=out.num_examples, update_norm_sum=flat_norm(out.delta),
        num_clients=tf.constant(1.0))
    result = collections.OrderedDict(group=group, delta=out.delta, loss_sum=out.loss_sum)
    return ClientOutput(summed, result, new_state)

  def server_update(self, state, summed, mode):
    if mode != "warm":
      return state
    models, updates, aux, active = group_server_update(
        list(state["group_models"]), list(state["group_updates"]),
        list(summed["update_sums"]), summed["weight_sums"], self.group_agg_lr,
        state["group_active"], self.group_agg_rule)
    new = collections.OrderedDict(group_models=models, group_updates=updates,
                                  group_active=active, aux_model=aux)
    for name in ("init_model", "init_updates"):
      if name in state:
        new[name] = state[name]
    return new


def cold_start_state(w0: Sequence[np.ndarray], member_updates: Sequence[Sequence[np.ndarray]],
                     labels: np.ndarray, num_groups: int) -> Dict[str, list]:
  """Group j = mean of its members' trained models; Delta w_j = mean update.

  `member_updates[i]` is client i's update (list of arrays), `labels[i]` its
  group. A group without members stays at w_0. The auxiliary model is the
  mean of the groups with members.
  """
  labels = np.asarray(labels)
  models, updates = [], []
  active = np.array([np.any(labels == j) for j in range(num_groups)], np.float32)
  for layer, w in enumerate(w0):
    layer_updates = np.stack([u[layer] for u in member_updates])
    mean_updates = np.stack([
        layer_updates[labels == j].mean(axis=0) if np.any(labels == j)
        else np.zeros_like(w) for j in range(num_groups)])
    updates.append(mean_updates.astype(w.dtype))
    models.append((w[np.newaxis] + mean_updates).astype(w.dtype))
  weights = active if active.any() else np.ones(num_groups, np.float32)
  aux = [np.tensordot(weights / weights.sum(), g, axes=1).astype(g.dtype) for g in models]
  return collections.OrderedDict(group_models=models, group_updates=updates,
                                 group_active=active, aux_model=aux)


# ----------------------------------------------------------------------------
# The host side: cold start, assignments, newcomers, metrics.
# ----------------------------------------------------------------------------


def pretrain_work(batch_size: int, pretrain_iters: Optional[int],
                  pretrain_epochs: Optional[int]) -> schedule.LocalWork:
  """The cold-start pre-training: `pretrain_iters` steps (default 50) or
  `pretrain_epochs` epochs; giving both is an error."""
  if pretrain_iters is not None and pretrain_epochs is not None:
    raise ValueError(f"invalid --pretrain_iters={pretrain_iters} with --pretrain_epochs="
                     f"{pretrain_epochs}; valid: give at most one of them")
  if pretrain_epochs is not None:
    return schedule.LocalWork(batch_size, epochs=pretrain_epochs)
  return schedule.LocalWork(batch_size, steps=pretrain_iters or DEFAULT_PRETRAIN_ITERS)


@dataclasses.dataclass
class FedGroupHost(HostState):
  """FedGroup's host state: each client's group (`assignment`, -1: none
  yet), which clients were pre-trained in the group cold start and which
  arrive late (`newcomers`), the generator of its draws and its summary facts."""
  assignment: np.ndarray
  pretrained: np.ndarray
  newcomers: np.ndarray
  rng: np.random.Generator
  summary: Dict[str, object]


class FedGroupDriver(driver.Driver):
  """Group cold start, then FedGroup rounds; holds each client's group."""

  individual_updates = (
      "its host groups the clients by the directions of their individual updates (FedGroup's EDC cold start and each newcomer's assignment)")

  @classmethod
  def check(cls, context: driver.Context) -> None:
    """The sizes the cold start and the newcomers need (the draws of
    `__init__` do not change them)."""
    super().check(context)
    options, data, config = context.options, context.data, context.config
    num_groups = options.num_groups
    newcomer_fraction, pretrain_scale = options.newcomer_fraction, options.pretrain_scale
    driver.check_num_groups(num_groups, data)
    pretrain_work(config.batch_size, options.pretrain_iters, options.pretrain_epochs)
    training = data.num_training_clients
    num_newcomers = int(round(newcomer_fraction * training))
    newcomer_rounds = int(np.ceil(0.1 * config.rounds)) if num_newcomers else 0
    pool = training - num_newcomers  # neither newcomers nor test-only
    if options.cold_start == "rcc":
      num_pretrain = min(num_groups, pool)
    else:
      num_pretrain = min(int(round(pretrain_scale * num_groups)), pool)
    if pool < num_groups:
      raise ValueError(
          f"invalid --newcomer_fraction={newcomer_fraction}: leaves {pool} clients "
          f"to pre-train, fewer than --num_groups={num_groups}; valid: at most "
          f"{(training - num_groups) / training:g}")
    if num_pretrain < num_groups:
      raise ValueError(
          f"invalid --pretrain_scale={pretrain_scale:g}: pre-trains round({pretrain_scale:g}"
          f" x {num_groups}) = {num_pretrain} clients, fewer than --num_groups="
          f"{num_groups}; valid: a number >= 1")
    if config.clients_per_round > training - num_newcomers and newcomer_rounds:
      raise ValueError(
          f"invalid --newcomer_fraction={newcomer_fraction}: leaves "
          f"{training - num_newcomers} clients for the first rounds, fewer than "
          f"--clients_per_round="
          f"{config.clients_per_round}")

  def __init__(self, context: driver.Context, definition: FedGroupDefinition):
    """`context.options`: FedGroup's, or FedGrouProx's (with `mu`)."""
    super().__init__(context, definition)
    options, data, config = self.options, self.data, self.config
    num_groups = options.num_groups
    newcomer_fraction = options.newcomer_fraction
    pretrain_scale = options.pretrain_scale
    self.pretrain_work = pretrain_work(config.batch_size, options.pretrain_iters,
                                       options.pretrain_epochs)
    self.m = num_groups
    self.measure = options.measure
    self.pretrain_scale = pretrain_scale
    self.cold_start = cold_start = options.cold_start
    n = data.num_clients
    # Test-only clients are never trained: not newcomers, never pre-trained,
    # never assigned (the evaluator tests them with their lowest-test-loss model).
    self.host = host = FedGroupHost(
        assignment=np.full(n, -1, np.int64), pretrained=np.zeros(n, bool),
        newcomers=np.zeros(n, bool),
        rng=seeds.generator(config.seed, "fedgroup_host"), summary={})
    training = data.training_clients()
    num_newcomers = int(round(newcomer_fraction * len(training)))
    if num_newcomers:  # (all clients training: the same draw as from range(n))
      host.newcomers[host.rng.choice(training, num_newcomers, replace=False)] = True
    self.newcomer_rounds = int(np.ceil(0.1 * config.rounds)) if num_newcomers else 0
    pool = np.flatnonzero(~host.newcomers & ~self.data.test_only())
    if cold_start == "rcc":
      self.num_pretrain = min(num_groups, len(pool))
    else:
      self.num_pretrain = min(int(round(pretrain_scale * num_groups)), len(pool))
    self.state = None
    self.extra_columns = (
        ["test_accuracy_assigned", "mean_update_norm", "group_discrepancy",
         "num_cold_clients", "num_assigned"]
        + self.group_columns(num_groups) + self.score_columns())

  def _describe_pretrain(self) -> str:
    w = self.pretrain_work
    return f"{w.steps} steps" if w.steps is not None else f"{w.epochs} epochs"

  def group_assignment(self):
    return self.host.assignment

  def setup(self):
    t0 = time.perf_counter()
    host = self.host
    pool = np.flatnonzero(~host.newcomers & ~self.data.test_only())
    chosen = np.sort(host.rng.choice(pool, self.num_pretrain, replace=False))
    out = self.train_clients("pretrain", self.definition.initial_state(self.w0), chosen,
                             0, work=self.pretrain_work, persist=False)
    deltas = [list(r["delta"]) for r in out.results]
    if self.cold_start == "rcc":
      labels = np.arange(self.m)  # each pre-trained client is one group's centre
    else:
      labels = canonical_labels(clustering.cluster_updates(
          clustering.flatten_rows(deltas), self.m,
          self.measure, seed=self.config.seed))
    host.assignment[chosen] = labels
    host.pretrained[chosen] = True
    self.state = self.runner.put_state(self.definition.cold_start_state(self.w0, deltas,
                                                                        labels))
    seconds = time.perf_counter() - t0
    model_bytes = self.num_params * driver.BYTES_PER_PARAMETER
    host.summary.update(
        cold_start_seconds=seconds,
        cold_start_clients=int(len(chosen)),
        cold_start_pretraining=self._describe_pretrain(),
        cold_start_train_loss=float(out.summed["loss_sum"] /
                                    max(out.summed["num_examples"], 1.0)),
        cold_start_bytes_down=int(len(chosen) * model_bytes),
        cold_start_bytes_up=int(len(chosen) * model_bytes),
        num_parameters=self.num_params)
    return {}

  def run_round(self, round_num, sampled):
    host = self.host
    assignment = host.assignment
    if round_num <= self.newcomer_rounds and host.newcomers[sampled].any():
      # Newcomers arrive after the first 10% of rounds: resample without them.
      eligible = np.flatnonzero(~host.newcomers & ~self.data.test_only())
      sampled = np.sort(host.rng.choice(eligible, len(sampled), replace=False))
    if self.cold_start == "rac":
      # Every client not pre-trained in the group cold start draws a new group.
      redraw = sampled[~host.pretrained[sampled]]
      assignment[redraw] = host.rng.integers(0, self.m, len(redraw))
    elif self.cold_start == "rac_once":
      cold = sampled[assignment[sampled] < 0]
      assignment[cold] = host.rng.integers(0, self.m, len(cold))
    cold = sampled[assignment[sampled] < 0]
    if len(cold):
      # Client cold start: pre-train, pick g* (the newcomer rule), then train
      # this round from w_{g*} like every other member.
      joined = self.train_clients("newcomer", self.state, cold, round_num,
                                  work=self.pretrain_work, persist=False,
                                  shuffle_round=NEWCOMER_SHUFFLE_BASE + round_num)
      assignment[cold] = [int(r["group"]) for r in joined.results]
    before = self.runner.numpy_state(self.state)["group_models"]
    out = self.train_clients("warm", self.state, sampled, round_num,
                             keys=[int(g) for g in assignment[sampled]])
    self.state = out.state
    after = self.runner.numpy_state(self.state)["group_models"]
    # Each cold client also downloaded the auxiliary model and the m directions.
    row = self.training_row(out.summed, len(sampled))
    row["bytes_down"] += int(len(cold) * (1 + self.m) * self.num_params
                             * driver.BYTES_PER_PARAMETER)
    row.update(group_discrepancy=group_discrepancy(before, after, out.results),
               num_cold_clients=int(len(cold)),
               num_assigned=int((assignment >= 0).sum()))
    return row

  def _models(self):
    state = self.runner.numpy_state(self.state)
    groups = cluster_ops.unstack_models(state["group_models"], self.m)
    return groups + [list(state["aux_model"])]

  def eval_models(self):
    assignment = self.host.assignment
    client_model = np.where(assignment >= 0, assignment, self.m)
    return self._models(), client_model

  def round_eval_metrics(self, result):
    assignment = self.host.assignment
    return {"test_accuracy_assigned": assigned_accuracy(result, assignment),
            **self.group_metrics(result, self.m, assignment, assignment),
            **self.cluster_scores(assignment)}

  def summary(self):
    assignment = self.host.assignment
    out = dict(self.host.summary)
    out["final_assignment"] = self.by_client(assignment)
    out["group_sizes"] = [int((assignment == j).sum()) for j in range(self.m)]
    out["num_groups"] = self.m
    # The final ARI and purity: summary.json's `ari`, `purity`, from the rows
    # (`results.summarize`), as for every clustered algorithm.
    return out


def canonical_labels(labels: np.ndarray) -> np.ndarray:
  """Group ids renumbered in order of first appearance (client order).

  A clustering's ids are arbitrary; this makes them a function of the
  partition alone, so two runs that find the same groups number them alike.
  """
  labels = np.asarray(labels)
  order = {}
  for g in labels:
    order.setdefault(int(g), len(order))
  return np.array([order[int(g)] for g in labels], labels.dtype)


def assigned_accuracy(result, assignment: np.ndarray) -> float:
  """The paper's score: correct / test examples over the clients assigned to
  a group (clients never assigned are left out); NaN if there are none."""
  mask = np.asarray(assignment) >= 0
  count = result.per_client_count[mask].sum()
  return float(result.per_client_correct[mask].sum() / count) if count else float("nan")


def group_discrepancy(before, after, results) -> float:
  """sum_j (c_j / sum c) mean_{k in group j} ||w_k - w_{g_j}^{t+1}||, which is
  the mean over the round's clients of the distance from a client's trained
  model w_k = w_{g_j}^t + Delta_k to its group's model after aggregation.

  `before`/`after`: the stacked group models [m, ...] per layer; `results`:
  per-client results with `group` and `delta`.
  """
  if not results:
    return float("nan")
  distances = []
  for r in results:
    g = int(r["group"])
    sq = sum(float(np.sum(np.square(np.asarray(b[g], np.float64) + np.asarray(d, np.float64)
                                    - np.asarray(a[g], np.float64))))
             for b, a, d in zip(before, after, r["delta"]))
    distances.append(np.sqrt(sq))
  return float(np.mean(distances))


def definition(context: driver.Context) -> FedGroupDefinition:
  """FedGroup's definition, or FedGrouProx's when the options have `mu`. Modes:
  `pretrain` (one pre-training per client from the auxiliary model; results
  hold each client's update: the group cold start,
  `definition.cold_start_state`), `newcomer` (clients not yet in a group
  pre-train and pick their group; the state is unchanged) and `warm` (keys:
  `int32[1]` groups 0..m-1; results hold each client's group and update)."""
  options = context.options
  return FedGroupDefinition(context.weights_spec, context.num_trainable, options.num_groups,
                            mu=given(options, "mu") if "mu" in options else 0.0,
                            group_agg_lr=options.group_agg_lr,
                            group_agg_rule=options.group_agg_rule,
                            newcomer_rule=options.newcomer_rule, solver=context.solver)
