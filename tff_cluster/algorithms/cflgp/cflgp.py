"""CFL-GP (Kim, Kim, de Veciana, "Clustered Federated Learning via
Gradient-based Partitioning", ICML 2024), as the authors' code runs it
(Heasung-Kim/clustered-federated-learning-via-gradient-based-partitioning at
0b1b4dd: `learning_agent/central_unit.py` `run_CFLGP`,
`learning_agent/utils.py` `spectral_clustering_and_matching`,
`learning_agent/client.py` `compute_gradient`; their defaults). The paper's
method section was not read here; docs/algorithms/cflgp.md lists where the
code's rule may differ from it.

State: K = `--num_groups` cluster models theta_k (independent draws of the
model's initializer), each client's cluster c_i (none before round 1) and
its gradient profile v_i (zero). Every client takes part in every round.
Round t (from 0; T = `--cflgp_period`, tau = `--cflgp_stop`):

1. Client i takes theta_{c_i} (theta_0 before its first cluster) and sends
   its message m_i: one minibatch gradient of its mean loss there, the first
   batch of the round's schedule (`--cflgp_protocol=gradient`, the code's
   default), or its update after the round's local work (`model`).
2. In a round with t mod T = 0 and t < tau:
   - profile: v_i <- (1 - b) v_i + b p_i, b = 1 / (floor((t + 1) / (K T)) + 1),
     p_i the trainable part of a message computed on a batch of its own at
     theta_{c_i} (`--cflgp_profile_at=own`: the code computes it there,
     before the round's message; for a client of cluster 0 the two are one
     computation) or at theta_0 for every client (`criterion`: the model the
     code's query list names, index 0, and then ignores);
   - clustering: the clients' profiles as rows V (N x d), V = U S W^T; each
     client's point is its row of U_K S_K (the code's P_K^T G); k-means
     (k-means++, random_state 42, scikit-learn's other defaults) into K
     labels; from round 1 on, the labels are renamed by the permutation of
     0..K-1 that keeps the most clients in their old cluster (the first such
     permutation in lexicographic order; the code tries every one).
3. Each cluster k with members (by the new clusters) takes, on the trainable
   weights, theta_k <- theta_k - eta mean_{i: c_i = k} m_i (gradient; eta
   the round's client learning rate, the code's one learning rate), or on
   every weight theta_k <- theta_k + mean m_i (model). A cluster without
   members keeps its model. (A client that moved contributes a message
   computed at its old cluster's model, as in the code.)

Under partial participation (a `--clients_per_round` below every client;
the code takes every client every round) a profile is kept for each client
that has taken part in a partition round, and the partition is of those
clients; the others train theta_0 until they have one.

Evaluation: each client with training data is tested with its cluster's
model (theta_0 before it has a cluster); test-only clients choose their
model by their own test loss (IFCA's protocol for test machines).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from typing import Dict, Optional

import numpy as np
import tensorflow as tf

from tff_cluster import clustering, seeds
from tff_cluster.core.definition import ClientOutput, HostModelsDefinition
from tff_cluster.host import driver
from tff_cluster.host.state import HostState

# Shuffle seeds of the profile's own batches (apart from the run's rounds).
PROFILE_SHUFFLE_BASE = 4_000_000
KMEANS_RANDOM_STATE = 42  # the code's, whatever --seed
MAX_PERMUTED_K = 8  # above it, the optimal assignment (the same best count)


def profile_weight(t: int, k: int, period: int) -> float:
  """b of round t (from 0): 1 / (floor((t + 1) / (K T)) + 1)."""
  return 1.0 / ((t + 1) // (k * period) + 1)


def match_labels(labels: np.ndarray, old: np.ndarray, k: int) -> np.ndarray:
  """`labels` renamed by the permutation pi of 0..k-1 that maximises
  #{i: pi(labels_i) = old_i}, the first in lexicographic order among the
  best (identity first); unchanged when no permutation keeps any client."""
  labels, old = np.asarray(labels), np.asarray(old)
  if k > MAX_PERMUTED_K:
    from scipy.optimize import linear_sum_assignment
    counts = np.zeros((k, k))
    np.add.at(counts, (labels, old), 1)
    rows, cols = linear_sum_assignment(-counts)
    pi = np.empty(k, np.int64)
    pi[rows] = cols
    return pi[labels]
  best, best_score = None, 0
  for pi in itertools.permutations(range(k)):
    score = int((np.asarray(pi)[labels] == old).sum())
    if score > best_score:
      best, best_score = np.asarray(pi), score
  return labels if best is None else best[labels]


def spectral_labels(profiles: np.ndarray, k: int, old: Optional[np.ndarray]) -> np.ndarray:
  """k-means labels of the rows of U_K S_K (the SVD of the profiles, rows
  the clients), matched to `old` (None: as k-means gives them)."""
  u, s, _ = np.linalg.svd(np.asarray(profiles, np.float64), full_matrices=False)
  points = u[:, :k] * s[:k]
  labels = clustering._sk_cluster().KMeans(
      n_clusters=k, init="k-means++", random_state=KMEANS_RANDOM_STATE).fit(points).labels_
  labels = np.asarray(labels, np.int64)
  return labels if old is None else match_labels(labels, old, k)


class CFLGPDefinition(HostModelsDefinition):
  """The clients' side: each receives its key's row of the K models (its
  cluster) and returns its message (`result["message"]`); the server state
  changes only on the host (step 3 of the module docstring)."""

  modes = ("gradient", "model")

  def client_state_spec(self, mode):
    return super().client_state_spec(mode) if mode == "model" else None

  def client_work(self, trainer, selected, received, client_state, data, mode, key=None):
    start = list(selected)
    if mode == "gradient":
      grads, _ = trainer.gradient(start, data, 1)
      loss_sum, count = trainer.loss(start, data, 1)
      summed = collections.OrderedDict(loss_sum=loss_sum, num_examples=count,
                                       num_clients=tf.constant(1.0))
      return ClientOutput(summed, collections.OrderedDict(message=list(grads)), None)
    out, new_state = self.local_update(trainer, start, data, received["lr"], client_state)
    summed = collections.OrderedDict(loss_sum=out.loss_sum, num_examples=out.num_examples,
                                     num_clients=tf.constant(1.0))
    return ClientOutput(summed, collections.OrderedDict(message=list(out.delta)), new_state)


@dataclasses.dataclass
class CFLGPHost(HostState):
  """Each client's cluster (-1: none yet), its gradient profile (float64,
  a row per client), whether it has one (it took part in a partition
  round) and the summary's facts."""
  assignment: np.ndarray
  profile: np.ndarray
  profiled: np.ndarray
  summary: Dict[str, object]


class CFLGPDriver(driver.HostModelsDriver):
  """Steps 2-3 of the module docstring on the host, in numpy."""

  individual_updates = ("its host partitions the clients by their individual gradients and "
                        "averages each cluster's")

  def __init__(self, context: driver.Context, definition: CFLGPDefinition):
    super().__init__(context, definition)
    options = context.options
    self.period, self.stop = int(options.cflgp_period), int(options.cflgp_stop)
    self.mode = options.cflgp_protocol
    self.profile_at = options.cflgp_profile_at
    size = sum(int(np.prod(s.shape)) for s in definition.trainable_spec)
    self.host = CFLGPHost(assignment=np.full(self.data.num_clients, -1, np.int64),
                          profile=np.zeros((self.data.num_clients, size), np.float64),
                          profiled=np.zeros(self.data.num_clients, bool), summary={})
    self.extra_columns = (["cflgp_reclustered", "cflgp_moved"] + self.group_columns(self.k)
                          + self.score_columns())

  def setup(self):
    draws = [driver.initial_weights(self.model, seeds.int_seed(self.config.seed, "ifca_init", 0, j))
             for j in range(self.k)]
    self.state = self.runner.put_state(self.definition.initial_state(draws))
    return {"num_parameters": self.num_params}

  def _messages(self, out, trainable_only: bool):
    n = self.definition.num_trainable
    return [[np.asarray(w) for w in (r["message"][:n] if trainable_only else r["message"])]
            for r in out.results]

  def run_round(self, round_num, sampled):
    t = round_num - 1
    sampled = np.asarray(sampled)
    before = self.host.assignment[sampled].copy()
    keys = np.maximum(before, 0)
    out = self.train_clients(self.mode, self.state, sampled, round_num, keys=keys)
    messages = self._messages(out, trainable_only=False)
    cluster_now = t % self.period == 0 and t < self.stop
    extra_down = 0
    if cluster_now:
      extra_down = self._update_profiles(t, sampled, keys, messages, round_num)
      self.host.profiled[sampled] = True
      clients = np.flatnonzero(self.host.profiled)
      old = self.host.assignment[clients]
      labels = spectral_labels(self.host.profile[clients], self.k,
                               None if (old < 0).all() else old)
      self.host.assignment[clients] = labels
    self._update_models(sampled, messages, round_num)
    row = self.training_row(out.summed, len(sampled), models_down=1.0, models_up=1.0)
    row["bytes_down"] += extra_down * self.training_row(out.summed, 1)["bytes_down"]
    after = self.host.assignment[sampled]
    row["cflgp_reclustered"] = int(cluster_now)
    row["cflgp_moved"] = int(((before >= 0) & (before != after)).sum())
    return row

  def _update_profiles(self, t, sampled, keys, messages, round_num) -> int:
    """v_i <- (1 - b) v_i + b p_i: p_i the round's message of a client of
    cluster 0 (one computation in the code), else one of its own batch at
    its own model (`own`) or at theta_0 (`criterion`). Returns the models
    sent for it (criterion: theta_0 to the clients of other clusters)."""
    n = self.definition.num_trainable
    vectors = [np.concatenate([np.ravel(w) for w in m[:n]]) for m in messages]
    others = np.flatnonzero(keys != 0)
    at = keys[others] if self.profile_at == "own" else np.zeros(len(others), np.int64)
    if len(others):
      extra = self.train_clients(self.mode, self.state, sampled[others], round_num,
                                 keys=at, persist=False,
                                 shuffle_round=PROFILE_SHUFFLE_BASE + round_num)
      for pos, m in zip(others, self._messages(extra, trainable_only=True)):
        vectors[pos] = np.concatenate([np.ravel(w) for w in m])
    b = profile_weight(t, self.k, self.period)
    self.host.profile[sampled] = (1.0 - b) * self.host.profile[sampled] + b * np.stack(vectors)
    return len(others) if self.profile_at == "criterion" else 0

  def _update_models(self, sampled, messages, round_num):
    models = [np.array(w) for w in self.runner.numpy_state(self.state)["models"]]
    clusters = self.host.assignment[sampled]
    n = self.definition.num_trainable
    lr = float(self.config.lr_at(round_num))
    for j in range(self.k):
      members = np.flatnonzero(clusters == j)
      if not len(members):
        continue
      for i in range(n if self.mode == "gradient" else len(models)):
        mean = np.mean([np.asarray(messages[m][i], np.float64) for m in members], axis=0)
        step = -lr * mean if self.mode == "gradient" else mean
        models[i][j] = (models[i][j] + step).astype(models[i].dtype)
    self.state = self.runner.put_state(collections.OrderedDict(models=models))

  def eval_models(self):
    """The K models; a client with training data is tested with its
    cluster's (theta_0, the model it would train, before it has one), a
    test-only client chooses by its test loss (-1)."""
    models, index = super().eval_models()
    index[(index < 0) & (self.data.num_train_samples() > 0)] = 0
    return models, index


def definition(context: driver.Context) -> CFLGPDefinition:
  """CFL-GP's clients for K = `--num_groups`."""
  return CFLGPDefinition(context.weights_spec, context.num_trainable,
                         context.options.num_groups, solver=context.solver)
