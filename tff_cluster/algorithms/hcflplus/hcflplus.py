"""HCFL+ (Guo, Tang and Lin, "Enhancing Clustered Federated Learning:
Integration of Strategies and Improved Methodologies", arXiv 2310.05397 v2),
as its authors' code runs it: no repository is named HCFL; the authors'
FedRC repository (LINs-lab/FedRC at ce79229) holds the method as "FedIAS"
(`utils/constants.py`: `fedrc_SW` and `FedEM_SW` run the `FedIASAggregator`
of `aggregator.py`; `client.py` `FedRC_SW`; `--split`: one shared feature
extractor and a linear head per cluster, `learners/learners_ensemble.py`
`SplitLearnersEnsemble`). The paper's text was not read here;
docs/algorithms/hcflplus.md lists the code's choices.

State: the model's weights (its last Dense layer, the head, aside) shared by
every cluster, one head per cluster in up to S = `--num_groups` slots (the
code has no bound), K0 = `--hcflplus_init` clusters at the start (each head
its own seeded draw) and, with `--hcflplus_likelihood=fedrc`, the label prior
P [S, C] (uniform at first). Client state: its cluster weights pi [S]
(uniform over the clusters at first), per example omega [n, S] (the same)
and n_k, its training samples.

Round t, each sampled client k (the round's models frozen for steps 1-2):
  1. E-step on each example i the round visits: s_m(i) = -l(head_m; x_i, y_i)
     - log P_m(y_i) (fedem: without the prior); gamma(i, m) = softmax_m(log
     omega_i,m + s_m(i)); gamma~(i, m) = softmax_m(log pi_m + s_m(i));
  2. pi <- mean_i gamma~(i, .); omega_i <- mu gamma(i, .) + (1 - mu) pi (mu
     `--hcflplus_mu`, the code's 0.4; an example the round does not visit
     keeps its omega); the label masses L[m, c] = sum_{i: y_i = c} gamma(i, m);
  3. each cluster's head m alone (the extractor frozen) for the round's local
     work with the loss (1/|b|) sum_i gamma(i, m) l(head_m; x_i, y_i); then
     the extractor alone (every head frozen at its new value) with
     (1/|b|) sum_i sum_m gamma(i, m) l(head_m; x_i, y_i); each phase a fresh
     optimizer;
  4. server: each head <- the n_k-weighted mean of the round's clients'
     heads; the extractor (every weight but the head's, statistics included)
     <- their unweighted mean; the host: P_m(c) = sum over the clients of
     their latest L[m, c], clamped at >= 1e-8, normalised over c.
Then, on the host (`aggregator.py` `FedIASAggregator.mix`):
  5. each sampled client's cluster c_k = argmax_m pi_k,m (first on ties) is
     kept (never cleared); d(k, l) for each pair of the
     round's clients: the largest over rows r of 1 - cos(u_k,r, u_l,r), rows
     whose sum is 0 skipped, the last row excluded (the code's
     `proto_sim_cs`); u = the client's head updates, one row per cluster in
     the clusters' order (`--hcflplus_distance=updates`, what the released
     code returns) or its per-class feature means with the mean over all its
     examples last (`prototypes`, the return the code comments out); the
     pair's entry of the N x N matrix D (zeros at first) is replaced;
  6. the clusters no kept client has as c_k are marked for removal; for each
     other cluster m, D_m = D over its kept members times pi_k,m pi_l,m; m*,
     the cluster of the largest entry, splits when that entry minus the mean
     of D_m* (every entry, the diagonal's zeros included) exceeds
     `--hcflplus_tol` (0.05) and a slot is free: complete-linkage
     agglomerative clustering of D_m* into two parts; head m* <- the
     n_k-weighted mean of part 0's local heads m*, the new cluster's head
     (last in the order) that of part 1's (a member not in the round: its
     local head is the round's head m*); every client's omega_i,m* is halved
     into the new cluster and its pi reset to uniform over the clusters; the
     label masses of m* are halved the same way;
  7. the marked clusters are removed: their weights dropped from every
     client's pi and omega, which are renormalised.
Prediction (`--hcflplus_predict`): soft, sum_m pi_k,m softmax(head_m(z));
hard, the head of the largest pi_k,m (the code's --hard_cluster). A client
never sampled mixes its pi (uniform over the clusters, through the splits
and removals: the code's). ARI and purity: c_k of the clients sampled so
far.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Dict, List

import numpy as np
import tensorflow as tf

from tff_cluster import models as model_lib
from tff_cluster import seeds
from tff_cluster.algorithms.fedem import fedem
from tff_cluster.algorithms.fedrc import fedrc
from tff_cluster.core.definition import ClientOutput, Definition, LocalSolver
from tff_cluster.host import driver
from tff_cluster.host.state import HostState
from tff_cluster.learning import evaluation, optimizers
from tff_cluster.learning import trainers
from tff_cluster.learning.trainers import ExampleWeights, HeadMixture

DEFAULT_INIT = 3  # clusters at the start (the code's --n_learners)


def e_step(prior, score):
  """softmax over the clusters (axis 0) of log prior + score: gamma with each
  example's omega [S, b] as the prior, gamma~ with pi [S, 1] (the code's
  `FedRC_SW.update_sample_weights`); score = -loss (- log P_m(y))."""
  return tf.nn.softmax(tf.math.log(prior) + score, axis=0)


def next_prior(gamma, pi, mu):
  """Each example's next omega, mu gamma + (1 - mu) pi (rows: examples; the
  code's `update_learners_weights`)."""
  return mu * gamma + (1.0 - mu) * pi[None]


def pair_distances(rows: np.ndarray) -> np.ndarray:
  """[m, m]: the code's `proto_sim_cs` of every pair of the m clients' rows
  [m, R, F]: the largest 1 - cos(x_r, y_r) over the rows r but the last, a
  row skipped where either client's sums to 0 (0 if none is left)."""
  rows = np.asarray(rows, np.float64)
  m = len(rows)
  out = np.zeros((m, m))
  for r in range(rows.shape[1] - 1):
    x = rows[:, r]
    usable = x.sum(axis=1) != 0
    norms = np.linalg.norm(x, axis=1)
    unit = np.divide(x, norms[:, None], out=np.zeros_like(x), where=norms[:, None] > 0)
    dist = 1.0 - unit @ unit.T
    both = usable[:, None] & usable[None, :]
    out = np.where(both, np.maximum(out, dist), out)
  return out


def update_rows(d_kernel, d_bias) -> np.ndarray:
  """[S, d * C + C]: each head's update, its kernel's then its bias's (the
  code's `get_param_tensor` rows, in another order within a row: a cosine
  and a sum do not depend on it)."""
  d_kernel = np.asarray(d_kernel, np.float64)
  return np.concatenate([d_kernel.reshape(len(d_kernel), -1),
                         np.asarray(d_bias, np.float64)], axis=1)


def split_choice(distances: np.ndarray, pi: np.ndarray, members: Dict[int, np.ndarray],
                 order: List[int], tol: float):
  """Step 6's choice: (m*, its members, D_m*, split?) over the clusters of
  `order` with kept members (`members[m]`, client indices), D_m = the
  members' block of `distances` times pi[k, m] pi[l, m]; m* the first cluster
  of the largest entry (above 0: the code's start); (None, ...) when no entry
  is above 0."""
  best, best_m, best_rows, best_block = 0.0, None, None, None
  for m in order:
    rows = members.get(m)
    if rows is None or not len(rows):
      continue
    w = pi[rows, m]
    block = distances[np.ix_(rows, rows)] * w[:, None] * w[None, :]
    top = float(block.max())
    if top > best:
      best, best_m, best_rows, best_block = top, m, rows, block
  if best_m is None:
    return None, None, None, False
  return best_m, best_rows, best_block, bool(best - best_block.mean() > tol)


def two_parts(block: np.ndarray) -> np.ndarray:
  """Complete-linkage agglomerative clustering of a precomputed distance
  block into 2 (scikit-learn's, the code's)."""
  from sklearn.cluster import AgglomerativeClustering
  return AgglomerativeClustering(n_clusters=2, metric="precomputed",
                                 linkage="complete").fit(block).labels_


def halve(weights: np.ndarray, old: int, new: int) -> np.ndarray:
  """Weights [..., S] with column `old` halved into column `new`, then
  renormalised over the last axis (the code's `add_learner`)."""
  out = np.array(weights, np.float64, copy=True)
  out[..., new] = out[..., old] / 2.0
  out[..., old] = out[..., old] / 2.0
  return _normalised(out)


def drop(weights: np.ndarray, slot: int) -> np.ndarray:
  """Weights [..., S] without column `slot`, renormalised (`remove_learner`)."""
  out = np.array(weights, np.float64, copy=True)
  out[..., slot] = 0.0
  return _normalised(out)


def _normalised(w):
  total = w.sum(axis=-1, keepdims=True)
  return np.divide(w, total, out=np.zeros_like(w), where=total > 0)


def label_prior(masses: np.ndarray, active: np.ndarray) -> np.ndarray:
  """P [S, C] from the clients' label masses [N, S, C]: FedRC's (summed,
  clamped at >= 1e-8, normalised over the labels), uniform in a slot not in
  use."""
  p = fedrc.label_prior(masses)
  p[~np.asarray(active, bool)] = 1.0 / p.shape[1]
  return p


class HCFLPlusDefinition(Definition):
  """Steps 1-4 of the module docstring on the clients and the server.

  State: `model` (every weight; the head's entries unused), `kernels` [S, d,
  C] and `biases` [S, C] (the heads), `active` [S] (1.0 for a cluster in
  use), `log_prior` [S, C]. Client state: `pi` [S], `omega` [n_max, S] (row
  i: the client's example i), `weight` (n_k)."""

  example_rows = True
  sequential_only = "its clients keep a weight per example and train through several heads"

  def __init__(self, weights_spec, num_trainable: int, num_slots: int, *, head: List[int],
               num_rows: int, num_classes: int, mu: float, likelihood: str,
               distance: str, solver: LocalSolver = LocalSolver()):
    super().__init__(weights_spec, num_trainable, solver)
    self.persist_momentum = False  # each phase a fresh optimizer
    self.s = int(num_slots)
    self.kernel_i, self.bias_i = (int(i) for i in head)
    self.rows = int(num_rows)
    self.c = int(num_classes)
    self.mu = float(mu)
    self.likelihood = likelihood
    self.distance = distance
    flags = np.zeros(self.num_trainable, bool)
    flags[[self.kernel_i, self.bias_i]] = True
    self._head_opt = optimizers.chain(optimizers.mask(flags), self.local_step)
    self._body_opt = optimizers.chain(optimizers.mask(~flags), self.local_step)

  def initial_state(self, initial_weights):
    """`initial_weights`: (the shared weights, kernels [S, d, C], biases [S,
    C], active [S])."""
    weights, kernels, biases, active = initial_weights
    return collections.OrderedDict(
        model=[np.asarray(w) for w in weights], kernels=np.asarray(kernels, np.float32),
        biases=np.asarray(biases, np.float32), active=np.asarray(active, np.float32),
        log_prior=np.full((self.s, self.c), -np.log(self.c), np.float32))

  def state_spec(self):
    zeros = [np.zeros(s.shape, s.dtype.as_numpy_dtype) for s in self.weights_spec]
    d, c = self.weights_spec[self.kernel_i].shape
    state = self.initial_state((zeros, np.zeros((self.s, d, c)), np.zeros((self.s, c)),
                                np.zeros(self.s)))
    return tf.nest.map_structure(lambda a: tf.TensorSpec(np.shape(a), np.asarray(a).dtype),
                                 state)

  def broadcast(self, state, params, mode):
    out = collections.OrderedDict((k, state[k]) for k in
                                  ("model", "kernels", "biases", "active", "log_prior"))
    out["model"] = list(state["model"])
    out["lr"] = params["lr"]
    return out

  def client_state_spec(self, mode):
    return collections.OrderedDict(pi=tf.TensorSpec([self.s], tf.float32),
                                   omega=tf.TensorSpec([self.rows, self.s], tf.float32),
                                   weight=tf.TensorSpec([], tf.float32))

  def initial_client_state(self, mode):
    return collections.OrderedDict(pi=np.full(self.s, 1.0 / self.s, np.float32),
                                   omega=np.full((self.rows, self.s), 1.0 / self.s, np.float32),
                                   weight=np.float32(0.0))

  def _with_head(self, weights, kernel, bias):
    out = list(weights)
    out[self.kernel_i], out[self.bias_i] = kernel, bias
    return out

  def client_work(self, trainer, selected, received, client_state, data, mode, key=None):
    s, c = self.s, self.c
    body = list(received["model"])
    kernels, biases = received["kernels"], received["biases"]
    off = tf.where(received["active"] > 0, 0.0, -np.inf)[:, None]  # [S, 1]
    log_prior = received["log_prior"]
    omega, pi = client_state["omega"], client_state["pi"]
    frozen = [self._with_head(body, kernels[0], biases[0])]
    heads = (kernels, biases)

    def score(losses, y):
      out = -losses + off
      if self.likelihood == "fedrc":
        out -= tf.gather(log_prior, tf.cast(tf.reshape(y, [-1]), tf.int32), axis=1)
      return out

    def gamma(losses, y, rows):  # [S, b]
      return e_step(tf.transpose(tf.gather(omega, rows)), score(losses, y))

    def posterior(losses, y):  # gamma~ [S, b]
      return e_step(pi[:, None], score(losses, y))

    def sums(losses, y, rows):  # [S + S * C, b]: gamma~, then gamma in y's column
      onehot = tf.one_hot(tf.cast(tf.reshape(y, [-1]), tf.int32), c)  # [b, C]
      masses = gamma(losses, y, rows)[:, None, :] * tf.transpose(onehot)[None]
      return tf.concat([posterior(losses, y), tf.reshape(masses, [s * c, -1])], 0)

    totals, count = trainer.example_sums(
        ExampleWeights(frozen, sums, s + s * c, heads=heads, rows=True), data)
    new_pi = totals[:s] / tf.maximum(count, 1.0)
    label_mass = tf.reshape(totals[s:], [s, c])
    table = trainer.example_table(ExampleWeights(frozen, gamma, s, heads=heads, rows=True),
                                  data, self.rows)
    visited = tf.reduce_sum(table, axis=1, keepdims=True) > 0
    new_omega = tf.where(visited, next_prior(table, new_pi, self.mu), omega)
    if self.distance == "prototypes":
      feature, _, counts = trainer.feature_sums(frozen[0], data, c)
      means = feature / tf.maximum(counts, 1.0)[:, None]
      overall = tf.reduce_sum(feature, 0, keepdims=True) / tf.maximum(tf.reduce_sum(counts), 1.)
      prototypes = tf.concat([means, overall], 0)

    # Step 3: each active cluster's head, then the extractor.
    new_kernels, new_biases = [], []
    for m in range(s):
      def train_head(m=m):
        out = trainer.train(self._with_head(body, kernels[m], biases[m]), data, received["lr"],
                            self._head_opt, example_weights=ExampleWeights(
                                frozen, lambda l, y, r, m=m: gamma(l, y, r)[m], heads=heads,
                                rows=True))
        return kernels[m] + out.delta[self.kernel_i], biases[m] + out.delta[self.bias_i]
      k_m, b_m = tf.cond(received["active"][m] > 0, train_head,
                         lambda m=m: (kernels[m], biases[m]))
      new_kernels.append(k_m)
      new_biases.append(b_m)
    new_kernels, new_biases = tf.stack(new_kernels), tf.stack(new_biases)
    out = trainer.train(frozen[0], data, received["lr"], self._body_opt,
                        mixture=HeadMixture(new_kernels, new_biases, ExampleWeights(
                            frozen, gamma, s, heads=heads, rows=True)))
    d_kernels, d_biases = new_kernels - kernels, new_biases - biases
    n = client_state["weight"]
    body_delta = [tf.zeros_like(w) if i in (self.kernel_i, self.bias_i) else w
                  for i, w in enumerate(out.delta)]
    summed = collections.OrderedDict(
        body=body_delta, kernels=n * d_kernels, biases=n * d_biases, weight=n,
        loss_sum=out.loss_sum, num_examples=out.num_examples,
        num_clients=tf.constant(1.0))
    result = collections.OrderedDict(pi=new_pi, label_mass=label_mass, d_kernel=d_kernels,
                                     d_bias=d_biases)
    if self.distance == "prototypes":
      result["prototypes"] = prototypes
    new_state = collections.OrderedDict(pi=new_pi, omega=new_omega, weight=n)
    return ClientOutput(summed, result, new_state)

  def server_update(self, state, summed, mode):
    clients = tf.maximum(summed["num_clients"], 1.0)
    weight = tf.maximum(summed["weight"], 1e-12)
    return collections.OrderedDict(
        model=[w + d / clients for w, d in zip(state["model"], summed["body"])],
        kernels=state["kernels"] + summed["kernels"] / weight,
        biases=state["biases"] + summed["biases"] / weight,
        active=state["active"], log_prior=state["log_prior"])


@dataclasses.dataclass
class HCFLPlusHost(HostState):
  """The host's side (float64): each client's latest pi [N, S] (`sampled`:
  whether it has been), its kept cluster c_k (-1: none), the distance
  matrix D [N, N], each client's latest label masses [N, S, C], the
  clusters in the code's order (slots), the pi and each example's omega of a
  client never sampled (`fresh_pi`, `fresh_omega` [S]) and the summary's
  facts (splits, removals)."""
  pi: np.ndarray
  sampled: np.ndarray
  cluster: np.ndarray
  distances: np.ndarray
  label_mass: np.ndarray
  order: List[int]
  fresh_pi: np.ndarray
  fresh_omega: np.ndarray
  summary: Dict[str, object]


class HCFLPlusDriver(fedem.MixtureReport, driver.Driver):
  """Steps 5-7 of the module docstring on the host, in numpy; the
  clients' weights changed by a split or a removal in the runner's store."""

  label_per_example = ("weighs examples by a per-class label prior and tests each client "
                       "with a mixture of its heads' outputs")
  individual_updates = "its host compares each client's head updates (or feature means)"

  @classmethod
  def check(cls, context: driver.Context) -> None:
    super().check(context)
    driver.check_num_groups(context.options.num_groups, context.data)
    init = context.options.hcflplus_init
    if init is not None and init > context.options.num_groups:
      raise ValueError(f"invalid --hcflplus_init={init}; valid: 1..--num_groups "
                       f"({context.options.num_groups})")

  def __init__(self, context: driver.Context, definition: HCFLPlusDefinition):
    super().__init__(context, definition)
    d = definition
    self.k = d.s
    self.tol = float(self.options.hcflplus_tol)
    self.predict = self.options.hcflplus_predict
    n, k0 = self.data.num_clients, initial_clusters(self.options)
    fresh = np.zeros(self.k)
    fresh[:k0] = 1.0 / k0
    self.host = HCFLPlusHost(
        pi=np.tile(fresh, (n, 1)), sampled=np.zeros(n, bool), cluster=np.full(n, -1, np.int64),
        distances=np.zeros((n, n)), label_mass=np.zeros((n, self.k, d.c)),
        order=list(range(k0)), fresh_pi=fresh, fresh_omega=fresh.copy(),
        summary={"hcflplus_splits": [], "hcflplus_removed": []})
    self.extra_columns = (["num_clusters", "hcflplus_split", "hcflplus_removed"]
                          + self.group_columns(self.k) + self.score_columns())

  def setup(self):
    d = self.definition
    k0 = len(self.host.order)
    kernels = np.zeros((self.k,) + tuple(d.weights_spec[d.kernel_i].shape), np.float32)
    biases = np.zeros((self.k, d.c), np.float32)
    for m in range(k0):  # each head its own draw (the code's K linear layers)
      draw = driver.initial_weights(self.model, seeds.int_seed(self.config.seed,
                                                               "hcflplus_head", m))
      kernels[m], biases[m] = draw[d.kernel_i], draw[d.bias_i]
    active = np.zeros(self.k, np.float32)
    active[:k0] = 1.0
    self.state = self.runner.put_state(d.initial_state((self.w0, kernels, biases, active)))
    return {"num_parameters": self.num_params}

  def fresh_client_state(self, mode, client):
    """A client's first state: pi and every example's omega the weights of a
    client never sampled (uniform over the clusters, through the splits and
    removals so far)."""
    d = self.definition
    return collections.OrderedDict(
        pi=self.host.fresh_pi.astype(np.float32),
        omega=np.tile(self.host.fresh_omega.astype(np.float32), (d.rows, 1)),
        weight=np.float32(self.data.num_train_samples()[client]))

  def run_round(self, round_num, sampled):
    host, d = self.host, self.definition
    sampled = np.asarray(sampled)
    received = self.runner.numpy_state(self.state)
    # Each way a client moves the extractor and the round's heads.
    models = self.moved_models(len(host.order))
    out = self.train_clients("train", self.state, sampled, round_num)
    state = collections.OrderedDict(self.runner.numpy_state(out.state))
    for name in ("kernels", "biases"):
      state[name] = np.array(state[name], copy=True)
    pis = np.stack([np.asarray(r["pi"], np.float64) for r in out.results])
    host.pi[sampled] = pis
    host.sampled[sampled] = True
    host.label_mass[sampled] = np.stack([np.asarray(r["label_mass"], np.float64)
                                         for r in out.results])
    # Step 5: the round's clusters; the distances of the round's pairs.
    host.cluster[sampled] = np.argmax(pis, axis=1)
    host.distances[np.ix_(sampled, sampled)] = pair_distances(
        np.stack([self._rows(r) for r in out.results]))
    # Step 6: the clusters to remove, then the split.
    members = {m: np.flatnonzero(host.sampled & (host.cluster == m)) for m in host.order}
    remove = [m for m in host.order if not len(members[m])]
    split = self._split(round_num, sampled, out.results, members, received, state)
    for m in remove:  # step 7
      self._remove(m)
    host.summary["hcflplus_removed"].extend(
        {"round": int(round_num), "slot": int(m)} for m in remove)
    if split or remove:
      self._reweigh(split, remove)
    state["active"] = np.isin(np.arange(self.k), host.order).astype(np.float32)
    state["log_prior"] = np.log(label_prior(host.label_mass, state["active"] > 0)
                                ).astype(np.float32)
    self.state = self.runner.put_state(state)
    row = self.training_row(out.summed, len(sampled), models_down=models, models_up=models)
    row["num_clusters"] = len(host.order)
    row["hcflplus_split"] = 0 if split is None else 1
    row["hcflplus_removed"] = len(remove)
    return row

  def moved_models(self, clusters: int) -> float:
    """The extractor and `clusters` heads, in models (`training_row`'s unit)."""
    d = self.definition
    head = sum(int(np.prod(d.weights_spec[i].shape)) for i in (d.kernel_i, d.bias_i))
    return (self.num_params + (clusters - 1) * head) / self.num_params

  def _rows(self, result) -> np.ndarray:
    """A client's rows as step 5 compares them: its clusters' head updates
    in the clusters' order, or its feature means."""
    if self.definition.distance == "prototypes":
      return np.asarray(result["prototypes"], np.float64)
    return update_rows(result["d_kernel"], result["d_bias"])[self.host.order]

  def _split(self, round_num, sampled, results, members, received, state):
    """Step 6's split: the new slot, or None."""
    host, d = self.host, self.definition
    free = [s for s in range(self.k) if s not in host.order]
    m, rows, block, go = split_choice(host.distances, host.pi, members, host.order, self.tol)
    if not go or not free:
      return None
    labels = two_parts(block)
    new = free[0]
    sizes = self.data.num_train_samples().astype(np.float64)
    index = {int(k): i for i, k in enumerate(sampled)}
    for part, slot in ((0, m), (1, new)):
      clients = rows[labels == part]
      w = sizes[clients] / sizes[clients].sum()
      kernel = received["kernels"][m].astype(np.float64)
      bias = received["biases"][m].astype(np.float64)
      for weight, k in zip(w, clients):
        if int(k) in index:  # a member not in the round holds the round's head
          r = results[index[int(k)]]
          kernel = kernel + weight * np.asarray(r["d_kernel"], np.float64)[m]
          bias = bias + weight * np.asarray(r["d_bias"], np.float64)[m]
      state["kernels"][slot] = kernel.astype(np.float32)
      state["biases"][slot] = bias.astype(np.float32)
    host.order.append(new)
    host.label_mass[:, new] = host.label_mass[:, m] / 2.0  # the code's samples_weights
    host.label_mass[:, m] = host.label_mass[:, m] / 2.0
    host.summary["hcflplus_splits"].append(
        {"round": int(round_num), "slot": int(m), "new_slot": int(new),
         "sizes": [int((labels == j).sum()) for j in range(2)]})
    return (m, new)

  def _remove(self, m):
    host = self.host
    host.order.remove(m)
    host.label_mass[:, m] = 0.0

  def _reweigh(self, split, remove):
    """Every client's pi and omega after the round's split and removals
    (the code's `add_learner`, `remove_learner`), in the store and on the
    host; and a never-sampled client's."""
    host = self.host
    active = np.isin(np.arange(self.k), host.order)
    uniform = active / active.sum()

    def pi_of(pi):
      if split is not None:  # the code resets pi on a split (--split)
        return uniform.copy()
      for m in remove:
        pi = drop(pi, m)
      return pi

    def omega_of(omega):
      if split is not None:
        omega = halve(omega, *split)
      for m in remove:
        omega = drop(omega, m)
      return omega

    host.fresh_pi = pi_of(host.fresh_pi)
    host.fresh_omega = omega_of(host.fresh_omega[None])[0]
    host.pi = np.stack([pi_of(p) for p in host.pi])
    items = dict(self.client_states.numpy_items(self.client_states.snapshot()).items())
    for key, st in items.items():
      st = collections.OrderedDict(st)
      st["pi"] = pi_of(np.asarray(st["pi"], np.float64)).astype(np.float32)
      st["omega"] = omega_of(np.asarray(st["omega"], np.float64)).astype(np.float32)
      items[key] = st
    self.client_states.restore(items)

  def eval_models(self):
    d = self.definition
    state = self.runner.numpy_state(self.state)
    weights = [d._with_head(state["model"], state["kernels"][m], state["biases"][m])  # noqa: SLF001
               for m in range(self.k)]
    return weights, evaluation.Mixture(self.mixture())

  def mixture(self) -> np.ndarray:
    """[clients, S]: the weights each client predicts with."""
    pi = self.host.pi.copy()
    return fedem.hard_mixture(pi, self.host.sampled) if self.predict == "hard" else pi

  def summary(self):
    out = super().summary()
    out["num_clusters"] = len(self.host.order)
    return out


def _head_is_the_output(model) -> bool:
  """Whether the model's output is its last Dense layer's (on a random
  input): the heads replace that layer."""
  try:
    features = trainers.feature_model(model)
  except ValueError:
    return False
  shape = [2] + [int(d) if d is not None else 3 for d in model.inputs[0].shape[1:]]
  dtype = tf.as_dtype(model.inputs[0].dtype)
  x = tf.random.stateless_normal(shape, [0, 0], dtype=dtype) if dtype.is_floating \
      else tf.zeros(shape, dtype)  # token ids: 0
  out, z = features(x, training=False)
  last = model_lib.last_dense_layer(model)
  logits = tf.matmul(z, last.kernel) + last.bias
  mine = last.activation(logits) if last.activation is not None else logits
  return bool(np.allclose(np.asarray(out), np.asarray(mine), rtol=1e-4, atol=1e-5))


def initial_clusters(options) -> int:
  """K0: `--hcflplus_init`, by default the code's 3 or `--num_groups` if fewer."""
  if options.hcflplus_init is None:
    return min(DEFAULT_INIT, int(options.num_groups))
  return int(options.hcflplus_init)


def definition(context: driver.Context) -> HCFLPlusDefinition:
  """HCFL+'s definition: S = `--num_groups` slots, the model's last Dense
  layer (with a bias) the heads, omega rows for the largest client."""
  options, data = context.options, context.need_data()
  model = context.model.model_fn()
  head = model_lib.last_dense_indices(model)
  if len(head) != 2 or not _head_is_the_output(model):
    raise ValueError("--algo=hcflplus trains a head per cluster: the model's last Dense layer, "
                     "with a bias, giving the model's output; valid: a model that ends in a "
                     "Dense layer with use_bias=True")
  return HCFLPlusDefinition(
      context.weights_spec, context.num_trainable, options.num_groups, head=head,
      num_rows=max(1, int(data.num_train_samples().max())), num_classes=data.num_classes,
      mu=options.hcflplus_mu, likelihood=options.hcflplus_likelihood,
      distance=options.hcflplus_distance, solver=context.solver)
