"""FedGWC (Licciardi et al., "Interaction-Aware Gaussian Weighting for
Clustered Federated Learning", ICML 2025), as the authors' code runs it
(davedleo/FedGWC at 24d0716: `agents/servers.py` `ServerFedGWC`,
`agents/clients.py` `Client.train`; its `config.py` defaults). The paper's
method section was not read here; docs/algorithms/fedgwc.md lists where
the code's rule may differ from it.

State: up to K = `--num_groups` cluster models (slots; the code's tree has
no bound), slot 0 the root holding every client with training data; per
cluster its running mean squared change mse_c (1 at its start) and its
patience count; an N x N interaction matrix I (1/N^2 everywhere at the
start; a cluster's block is the rows and columns of its members).

Round t; m = `--clients_per_round`; for every cluster c of the round's
start (K_c members):
1. c samples min(m, K_c) of its members (uniformly, without replacement);
   each trains c's model for the round's local work with plain SGD from a
   fresh optimizer (the run's momentum, none kept between rounds) and
   coupled weight decay `--fedgwc_weight_decay`, and sends its update and
   its loss trajectory l_i: each step's batch mean loss, taken before that
   step;
2. c's model <- the sample-weighted mean of the trained models (every
   weight, BatchNorm statistics included; weights n_i, the clients'
   training samples);
3. if K_c > m: per step s (the first steps that every sampled client of c
   takes), w_i = n_i / sum n, mu_s = sum_i w_i l_is, var_s = sum_i w_i
   (l_is - mu_s)^2 + 1e-16; reward r_i = mean_s exp(-(l_is - mu_s)^2 /
   (2 var_s)); with a = m / K_c, every pair (i, j) of the sampled clients
   (i = j included) takes I_ij <- (1 - a) I_ij + a r_i / sum_k r_k; mse_c
   <- (1 - a) mse_c + a * (the block's summed squared change / m^2); the
   patience count goes up by one when mse_c < `--fedgwc_eps`, else to 0;
4. when c's patience count reaches round(K_c / m): X = (c's block of I)
   transposed, min-max normalised; A_ij = exp(-gamma ||X_i - X_j||^2)
   over the coordinates other than i and j (A_ii = 0; gamma
   `--fedgwc_gamma`); for n = 2 .. min(K_c // m, `--fedgwc_max_split`, the
   free slots + 1): labels from scikit-learn's spectral clustering of A
   (precomputed affinity, `cluster_qr`, random_state the run's seed), scored
   by the Davies-Bouldin index of A's spectral embedding in n dimensions;
   the n of the lowest score below 1 splits c (ties: the smaller n): each
   part a cluster with a copy of c's model, mse 1, patience 0 (the first
   part keeps c's slot, the others take the lowest free ones); no such n:
   mse_c <- 1.
A split cluster's parts first train in the next round. Clusters never merge.

Evaluation: each client with training data is tested with its cluster's
model; test-only clients choose their model by their own test loss.
"""

from __future__ import annotations

import collections
import dataclasses
import warnings
from typing import Dict

import numpy as np
import tensorflow as tf

from tff_cluster import seeds
from tff_cluster.core.definition import ClientOutput, HostModelsDefinition, LocalSolver
from tff_cluster.host import driver
from tff_cluster.host.state import HostState
from tff_cluster.learning import optimizers

VARIANCE_JITTER = 1e-16  # added to each step's variance (the code's)
SCALE_GUARD = 1e-8  # the min-max normalisation's smallest range (the code's)
DB_LIMIT = 1.0  # a split needs a Davies-Bouldin index below it (the code's start)
MSE_START = 1.0  # a cluster's running mean squared change at its start


def gaussian_rewards(losses: np.ndarray, sizes: np.ndarray) -> np.ndarray:
  """r_i = mean_s exp(-(l_is - mu_s)^2 / (2 var_s)) of the rows of
  `losses` [m, T] (the clients' trajectories), mu and var the sample-weighted
  (`sizes` [m]) mean and population variance of each step, var + 1e-16."""
  losses = np.asarray(losses, np.float64)
  w = np.asarray(sizes, np.float64)
  w = w / w.sum()
  mu = w @ losses
  var = w @ (losses - mu) ** 2 + VARIANCE_JITTER
  return np.exp(-0.5 * (losses - mu) ** 2 / var).mean(axis=1)


def update_interaction(matrix: np.ndarray, rows: np.ndarray, rewards: np.ndarray,
                       alpha: float) -> float:
  """I_ij <- (1 - alpha) I_ij + alpha r_i / sum r for every i, j of `rows`
  (in place); returns the block's summed squared change / len(rows)^2."""
  block = np.ix_(rows, rows)
  old = matrix[block]
  new = (1.0 - alpha) * old + (alpha * np.asarray(rewards) / np.sum(rewards))[:, None]
  matrix[block] = new
  return float(((new - old) ** 2).sum() / len(rows) ** 2)


def affinity(block: np.ndarray, gamma: float) -> np.ndarray:
  """A_ij = exp(-gamma sum_{k != i, j} (X_ik - X_jk)^2), X = block^T min-max
  normalised over all its entries; A_ii = 0."""
  x = np.asarray(block, np.float64).T
  x = (x - x.min()) / max(x.max() - x.min(), SCALE_GUARD)
  size = len(x)
  d2 = np.empty((size, size))
  every = np.arange(size)
  for i in range(size):
    # Differences taken directly (not through inner products, which cancel
    # where rows are close), coordinates i and j zeroed.
    diff = (x[i][None, :] - x) ** 2
    diff[:, i] = 0.0
    diff[every, every] = 0.0
    d2[i] = diff.sum(axis=1)
  out = np.exp(-gamma * d2)
  np.fill_diagonal(out, 0.0)
  return out


def best_split(a: np.ndarray, candidates, seed: int):
  """(n, labels, Davies-Bouldin index) of the candidate n with the lowest
  index below `DB_LIMIT` (ties: the first), labels renumbered 0..n-1 in
  order of their values; when none is below it (1, None, the lowest index
  seen, None if none). A candidate whose labels are one cluster is passed
  over."""
  from sklearn.cluster import SpectralClustering
  from sklearn.manifold import SpectralEmbedding
  from sklearn.metrics import davies_bouldin_score
  best = (1, None, None)
  limit, lowest = DB_LIMIT, None
  for n in candidates:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", UserWarning)  # (a graph not fully connected)
      embedded = SpectralEmbedding(n_components=n, affinity="precomputed",
                                   random_state=seed).fit_transform(a)
      labels = SpectralClustering(n_clusters=n, n_components=n, affinity="precomputed",
                                  assign_labels="cluster_qr",
                                  random_state=seed).fit_predict(a)
    values = np.unique(labels)
    if len(values) < 2:
      continue
    score = float(davies_bouldin_score(embedded, labels))
    lowest = score if lowest is None else min(lowest, score)
    if score < limit:
      best, limit = (len(values), np.searchsorted(values, labels), score), score
  return best if best[0] > 1 else (1, None, lowest)


class FedGWCDefinition(HostModelsDefinition):
  """The clients' side: each trains its key's row of the K models (its
  cluster) and returns its update (`result["message"]`, every weight) and
  its loss trajectory (`result["step_losses"]`, [T]); the models change
  only on the host (steps 2 and 4 of the module docstring)."""

  sequential_only = "its clients record each step's loss"

  def __init__(self, weights_spec, num_trainable: int, num_clusters: int, trajectory: int,
               weight_decay: float, *, solver: LocalSolver = LocalSolver()):
    super().__init__(weights_spec, num_trainable, num_clusters, solver)
    self.trajectory = int(trajectory)
    self.weight_decay = float(weight_decay)

  def client_state_spec(self, mode):
    return None  # a fresh optimizer every round (the code's)

  def client_work(self, trainer, selected, received, client_state, data, mode, key=None):
    start = list(selected)
    zeros = [tf.zeros_like(w) for w in start[:self.num_trainable]]
    local = optimizers.chain(optimizers.proximal(self.weight_decay, zeros), self.local_step)
    out = trainer.train(start, data, received["lr"], local, None, trajectory=self.trajectory)
    summed = collections.OrderedDict(loss_sum=out.loss_sum, num_examples=out.num_examples,
                                     num_clients=tf.constant(1.0))
    return ClientOutput(summed, collections.OrderedDict(message=list(out.delta),
                                                        step_losses=out.step_losses), None)


@dataclasses.dataclass
class FedGWCHost(HostState):
  """Each client's cluster slot (-1: a test-only client), the slots in use,
  each slot's running mean squared change and patience count, the
  interaction matrix (float64, N x N) and the summary's facts (the splits)."""
  assignment: np.ndarray
  active: np.ndarray
  mse: np.ndarray
  patience: np.ndarray
  interaction: np.ndarray
  summary: Dict[str, object]


class FedGWCDriver(driver.HostModelsDriver):
  """Steps 1-4 of the module docstring: the sampling per cluster, the
  averages, the interaction matrix and the splits on the host, in numpy."""

  individual_updates = ("its host averages each cluster's individual updates and reads "
                        "each client's loss trajectory")

  def __init__(self, context: driver.Context, definition: FedGWCDefinition):
    super().__init__(context, definition)
    options = context.options
    self.gamma, self.eps = float(options.fedgwc_gamma), float(options.fedgwc_eps)
    self.max_split = int(options.fedgwc_max_split)
    self.m = int(self.config.clients_per_round)
    n = self.data.num_clients
    sizes = self.data.num_train_samples()
    assignment = np.where(sizes > 0, 0, -1).astype(np.int64)
    active = np.zeros(self.k, bool)
    active[0] = True
    self.host = FedGWCHost(assignment=assignment, active=active,
                           mse=np.full(self.k, MSE_START), patience=np.zeros(self.k, np.int64),
                           interaction=np.full((n, n), 1.0 / n ** 2),
                           summary={"fedgwc_splits": [], "fedgwc_kept": []})
    self.extra_columns = (["num_clusters", "fedgwc_split", "fedgwc_patience"]
                          + self.group_columns(self.k) + self.score_columns())

  def setup(self):
    self.state = self.runner.put_state(self.definition.initial_state(self.w0))
    return {"num_parameters": self.num_params}

  def group_assignment(self):
    return self.host.assignment

  def _members(self, slot: int) -> np.ndarray:
    return np.flatnonzero(self.host.assignment == slot)

  def _sample(self, round_num: int, slot: int, members: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng(seeds.int_seed(self.config.seed, "fedgwc_sample", round_num,
                                               slot))
    return members[rng.choice(len(members), size=min(self.m, len(members)), replace=False)]

  def run_round(self, round_num, sampled):
    del sampled  # each cluster samples its own members (step 1)
    host = self.host
    slots = [int(s) for s in np.flatnonzero(host.active)]
    chosen = {s: self._sample(round_num, s, self._members(s)) for s in slots}
    clients = np.concatenate([chosen[s] for s in slots])
    keys = np.concatenate([np.full(len(chosen[s]), s, np.int64) for s in slots])
    out = self.train_clients("train", self.state, clients, round_num, keys=keys)
    sizes = self.data.num_train_samples().astype(np.float64)
    models = [np.array(w) for w in self.runner.numpy_state(self.state)["models"]]
    at = 0
    split = 0
    for s in slots:
      results = out.results[at:at + len(chosen[s])]
      rows, at = chosen[s], at + len(chosen[s])
      n = sizes[rows]
      for i in range(len(models)):
        mean = sum(w * np.asarray(r["message"][i], np.float64)
                   for w, r in zip(n / n.sum(), results))
        models[i][s] = (models[i][s] + mean).astype(models[i].dtype)
      members = self._members(s)
      if len(members) > self.m:
        split += self._interact(round_num, s, members, rows, n, results, models)
    self.state = self.runner.put_state(collections.OrderedDict(models=models))
    row = self.training_row(out.summed, len(clients), models_down=1.0, models_up=1.0)
    row["num_clusters"] = int(host.active.sum())
    row["fedgwc_split"] = split
    row["fedgwc_patience"] = int(host.patience[host.active].max())
    return row

  def _interact(self, round_num, s, members, rows, sizes, results, models) -> int:
    """Step 3 for cluster `s` (its sampled clients `rows`, their training
    samples `sizes`) and, when its patience is up, step 4; returns 1 if it
    split."""
    host = self.host
    work = self.config.local_work
    steps = min(work.num_steps(int(n)) for n in sizes)
    losses = np.stack([np.asarray(r["step_losses"], np.float64)[:steps] for r in results])
    rewards = gaussian_rewards(losses, sizes)
    alpha = self.m / len(members)
    change = update_interaction(host.interaction, rows, rewards, alpha)
    host.mse[s] = (1.0 - alpha) * host.mse[s] + alpha * change
    host.patience[s] = host.patience[s] + 1 if host.mse[s] < self.eps else 0
    if host.patience[s] != round(len(members) / self.m):
      return 0
    free = [j for j in range(self.k) if not host.active[j]]
    top = min(len(members) // self.m, self.max_split, len(free) + 1)
    a = affinity(host.interaction[np.ix_(members, members)], self.gamma)
    n, labels, score = best_split(a, range(2, top + 1), int(self.config.seed))
    if n == 1:
      host.mse[s] = MSE_START
      host.summary["fedgwc_kept"].append({"round": int(round_num), "slot": int(s),
                                          "lowest_davies_bouldin": score})
      return 0
    parts = [s] + free[:n - 1]
    for label, slot in enumerate(parts):
      host.assignment[members[labels == label]] = slot
      host.active[slot] = True
      host.mse[slot], host.patience[slot] = MSE_START, 0
      for w in models:
        w[slot] = w[s]
    host.summary["fedgwc_splits"].append(
        {"round": int(round_num), "slot": int(s), "parts": [int(p) for p in parts],
         "sizes": [int((labels == j).sum()) for j in range(n)], "davies_bouldin": score})
    return 1

  def summary(self):
    out = super().summary()
    out["num_clusters"] = int(self.host.active.sum())
    return out


def trajectory_length(context: driver.Context) -> int:
  """T: the most local steps a client takes in a round (`--local_steps`, or
  the epochs' steps of the largest client)."""
  work = context.config.local_work
  if work.steps is not None:
    return int(work.steps)
  return max(int(work.num_steps(int(n))) for n in context.need_data().num_train_samples())


def definition(context: driver.Context) -> FedGWCDefinition:
  """FedGWC's clients for K = `--num_groups` slots."""
  if context.config is None:
    raise ValueError("fedgwc's definition is made from the run's local work; valid: build it "
                     "with a config (tff_cluster.api.build(..., runner='tff'))")
  return FedGWCDefinition(context.weights_spec, context.num_trainable,
                          context.options.num_groups, trajectory_length(context),
                          context.options.fedgwc_weight_decay, solver=context.solver)
