"""FedSoft (Ruan and Joe-Wong, "FedSoft: Soft Clustered Federated Learning
with Proximal Local Updating", AAAI 2022): the rule of the authors' code
(ycruan/FedSoft at e71a4ab: `servers.py` `Server._run_fedsoft`,
`_aggregate_fedsoft`; `clients.py` `Client.estimate_importance_weights`,
`_local_train`; `solvers.py`), without its defects (it does not run as
released: docs/algorithms/fedsoft.md).

Server state: S = `--num_groups` cluster models c_1..c_S, each its own random
draw. Each client keeps a local model w_k (all start at one shared draw, w0;
never reset to a cluster model) and its Adam state, both between rounds.

Round t:
  * every tau rounds from round 1 (`--fedsoft_tau`), every client with
    training data estimates its importance weights with the current cluster
    models: each of its samples picks the cluster of lowest loss (ties to the
    lowest index); u_ks = (samples picking s) / n_k, or sigma
    (`--fedsoft_sigma`) where none does (not renormalised);
  * v_sk = u_ks n_k / sum_k' u_k's n_k' (per cluster, over the clients);
  * selection (`--fedsoft_selection=clusters`): each cluster s draws K
    (`--fedsoft_k`) clients without replacement with probabilities v_s (the
    host's seeded generator); the union trains, each client once; `all`:
    every client trains;
  * a training client runs the local work on its w_k with Adam (its state
    kept) on CE + sum_s (lambda/2) u_ks ||w - c_s||^2 (`--fedsoft_lambda`;
    the code's MSELoss(reduction='sum') is the squared norm), the c_s fixed
    during the round;
  * server: with selection c_s = (1/K) sum_{k selected by s} w_k (a client
    selected by several clusters counts in each); `all`: c_s = sum_k v_sk w_k.
Evaluation (`--fedsoft_eval`): cluster, the cluster model of the client's
largest u_ks; local, its own w_k (w0 until it first trains). ARI and
purity: argmax_s u_ks.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Dict

import numpy as np
import tensorflow as tf

from tff_cluster import seeds
from tff_cluster.host import driver
from tff_cluster.host.state import HostState
from tff_cluster.core import cluster_ops
from tff_cluster.core.aggregators import ClusterMean
from tff_cluster.core.definition import ClientOutput, Definition, LocalSolver, flat_norm
from tff_cluster.learning import optimizers, schedule
from tff_cluster.learning.trainers import ExampleWeights


def lowest_loss_counts(num_clusters: int):
  """(losses [S, b], y) -> [S, b]: 1 in the row of each example's lowest loss
  (ties to the lowest index)."""
  def fn(losses, y):
    del y
    index = tf.range(num_clusters)[:, None]
    first = tf.reduce_min(tf.where(losses <= tf.reduce_min(losses, axis=0), index,
                                   num_clusters), axis=0)
    return tf.cast(tf.equal(index, first[None]), tf.float32)
  return fn


DEFAULT_K = 30  # the code's ServerSolver default


class FedSoftDefinition(Definition):
  """FedSoft's calls (see the module docstring). State: `models` [S, ...],
  and the round's rows of importance weights `u_rows` and aggregation
  weights `agg_rows` ([R, S], one per participant: the key of a client is
  its row). Client state: `model` (w_k) and `opt` (Adam's state, flat).
  Modes: estimate (per-sample lowest-loss counts, no training), train."""

  modes = ("estimate", "train")

  def __init__(self, weights_spec, num_trainable: int, num_clusters: int, *, rows: int,
               lam: float, solver: LocalSolver = LocalSolver()):
    super().__init__(weights_spec, num_trainable, solver)
    self.s = int(num_clusters)
    self.rows = int(rows)
    self.lam = float(lam)
    self.adam = optimizers.chain(optimizers.adam())

  def initial_state(self, initial_weights):
    return collections.OrderedDict(
        models=cluster_ops.stack_models(initial_weights, self.s),
        u_rows=np.zeros((self.rows, self.s), np.float32),
        agg_rows=np.zeros((self.rows, self.s), np.float32))

  def num_keys(self, mode):
    return self.rows if mode == "train" else 0

  def database(self, state, mode):
    return [state["u_rows"], state["agg_rows"]] if mode == "train" else None

  def broadcast(self, state, params, mode):
    return collections.OrderedDict(models=list(state["models"]), lr=params["lr"])

  def client_state_spec(self, mode):
    if mode != "train":
      return None
    return collections.OrderedDict(
        model=list(self.weights_spec),
        opt=tf.nest.flatten(self.adam.state_spec(self.trainable_spec)))

  def client_work(self, trainer, selected, received, client_state, data, mode, key=None):
    if mode == "estimate":
      models = [[w[s] for w in received["models"]] for s in range(self.s)]
      counts, n = trainer.example_sums(
          ExampleWeights(models, lowest_loss_counts(self.s), self.s), data)
      return ClientOutput(collections.OrderedDict(num_clients=tf.constant(1.0)),
                          collections.OrderedDict(counts=counts, n=n))
    u, agg = selected
    nt = self.num_trainable
    opt = optimizers.chain(
        optimizers.proximal_mix(self.lam * u, list(received["models"])[:nt]), self.adam)
    start = list(client_state["model"])
    out = trainer.train(start, data, received["lr"], opt,
                        opt.unflat_state(list(client_state["opt"]), self.trainable_spec))
    model = [s + d for s, d in zip(start, out.delta)]
    summed = collections.OrderedDict(
        model_sums=[tf.tensordot(agg, w, axes=0) for w in model],
        agg=agg, loss_sum=out.loss_sum, num_examples=out.num_examples,
        update_norm_sum=flat_norm(out.delta), num_clients=tf.constant(1.0))
    new_state = collections.OrderedDict(model=model, opt=opt.flat_state(out.opt_state))
    return ClientOutput(summed, collections.OrderedDict(loss_sum=out.loss_sum), new_state)

  def server_update(self, state, summed, mode):
    if mode == "estimate":
      return state
    new = collections.OrderedDict(state)
    new["models"] = ClusterMean.mean(summed["model_sums"], summed["agg"], list(state["models"]))
    return new


@dataclasses.dataclass
class FedSoftHost(HostState):
  """Each client's importance weights (`u` [N, S], 0 before the first
  estimate), whether it has trained, and the selection generator."""
  u: np.ndarray
  trained: np.ndarray
  rng: np.random.Generator
  summary: Dict[str, object]


class FedSoftDriver(driver.Driver):
  """FedSoft's host side (see the module docstring). It chooses its own
  participants: the loop's sample is not used."""

  individual_updates = (
      "its host weighs each cluster's aggregation by the importance estimates each client sends")

  def __init__(self, context: driver.Context, definition: FedSoftDefinition):
    super().__init__(context, definition)
    options, data, config = self.options, self.data, self.config
    self.training = data.training_clients()
    self.k_sel = selected_per_cluster(options, len(self.training))
    self.s = int(options.num_groups)
    n = data.num_clients
    self.host = FedSoftHost(u=np.zeros((n, self.s)), trained=np.zeros(n, bool),
                            rng=seeds.generator(config.seed, "fedsoft_host"),
                            summary={})
    batch = max(int(data.num_train_samples().max()), 1)
    self.estimate_work = schedule.LocalWork(batch, epochs=1)
    self.extra_columns = (["mean_update_norm", "num_selected"] + self.group_columns(self.s)
                          + self.score_columns())

  def setup(self):
    draws = [driver.initial_weights(self.model, seeds.int_seed(self.config.seed, "fedsoft_init", s)) for s in range(self.s)]
    self.state = self.runner.put_state(self.definition.initial_state(draws))
    self.host.summary.update(fedsoft_k=self.k_sel, **{k: self.options[k] for k in (
        "fedsoft_tau", "fedsoft_lambda", "fedsoft_sigma", "fedsoft_selection",
        "fedsoft_eval")}, num_parameters=self.num_params)
    return {}

  def fresh_client_state(self, mode, client):
    spec = self.definition.client_state_spec(mode)
    return collections.OrderedDict(
        model=list(self.w0),
        opt=[np.zeros(s.shape, s.dtype.as_numpy_dtype) for s in spec["opt"]])

  def estimate(self, round_num) -> None:
    out = self.train_clients("estimate", self.state, self.training, round_num,
                             work=self.estimate_work, persist=False)
    sigma = float(self.options.fedsoft_sigma)
    for k, r in zip(self.training, out.results):
      counts, n = np.asarray(r["counts"], np.float64), float(r["n"])
      self.host.u[k] = np.where(counts > 0, counts / max(n, 1.0), sigma)

  def participants(self):
    """(the round's clients, their aggregation rows [R, S])."""
    n_k = self.data.num_train_samples()[self.training].astype(np.float64)
    v = self.host.u[self.training] * n_k[:, None]
    v = v / v.sum(axis=0, keepdims=True)
    if self.options.fedsoft_selection == "all":
      return self.training, v
    picks = [self.host.rng.choice(len(self.training), self.k_sel, replace=False, p=v[:, s])
             for s in range(self.s)]
    chosen = np.unique(np.concatenate(picks))
    agg = np.zeros((len(chosen), self.s))
    for s, pick in enumerate(picks):
      agg[np.searchsorted(chosen, pick), s] = 1.0
    return self.training[chosen], agg

  def run_round(self, round_num, sampled):
    estimated = (round_num - 1) % int(self.options.fedsoft_tau) == 0
    if estimated:
      self.estimate(round_num)
    clients, agg = self.participants()
    state = self.runner.numpy_state(self.state)
    rows = self.definition.rows
    u_rows = np.zeros((rows, self.s), np.float32)
    agg_rows = np.zeros((rows, self.s), np.float32)
    u_rows[:len(clients)] = self.host.u[clients]
    agg_rows[:len(clients)] = agg
    state["u_rows"], state["agg_rows"] = u_rows, agg_rows
    out = self.train_clients("train", state, clients, round_num, keys=np.arange(len(clients)))
    self.state = out.state
    self.host.trained[clients] = True
    row = self.training_row(out.summed, len(clients), models_down=self.s)
    if estimated:
      row["bytes_down"] += len(self.training) * self.s * self.num_params * driver.BYTES_PER_PARAMETER
    row["num_selected"] = len(clients)
    return row

  def _models(self):
    state = self.runner.numpy_state(self.state)
    return cluster_ops.unstack_models(state["models"], self.s)

  def choice(self) -> np.ndarray:
    """argmax_s u_ks of the clients with training data, -1 for the others."""
    out = np.full(self.data.num_clients, -1, np.int64)
    out[self.training] = np.argmax(self.host.u[self.training], axis=1)
    return out

  def eval_models(self):
    models, choice = self._models(), self.choice()
    if self.options.fedsoft_eval == "cluster":
      return models, choice
    local = [int(k) for k in np.flatnonzero(self.host.trained)]
    weights = models + [list(self.w0)] + [
        [np.asarray(w) for w in self.client_states[k]["model"]] for k in local]
    index = np.full(self.data.num_clients, self.s, np.int64)  # w0 until it trains
    index[local] = self.s + 1 + np.arange(len(local))
    index[self.data.test_only()] = -1
    return weights, index

  def round_eval_metrics(self, result):
    choice = self.choice()
    return {**self.group_metrics(result, self.s, choice, choice),
            **self.cluster_scores(choice)}

  def summary(self):
    out = dict(self.host.summary)
    out["final_importance"] = {cid: [float(x) for x in u]
                               for cid, u in zip(self.data.client_ids, self.host.u)}
    out["num_groups"] = self.s
    return out


def selected_per_cluster(options, num_training: int) -> int:
  """K (`--fedsoft_k`; default 30, the code's, or every client with training
  data when fewer); with cluster-wise selection at most `num_training`."""
  k = (int(options.fedsoft_k) if options.fedsoft_k is not None
       else min(DEFAULT_K, num_training))
  if options.fedsoft_selection == "clusters" and k > num_training:
    raise ValueError(f"invalid --fedsoft_k={k}; valid: 1..{num_training} "
                     "(each cluster draws K distinct clients with training data)")
  return k


def definition(context: driver.Context) -> FedSoftDefinition:
  """FedSoft's definition: S = `--num_groups` clusters (at most the clients
  with training data); one row per client of a round (S x K with selection,
  else every client with training data)."""
  options, data = context.options, context.need_data()
  driver.check_num_groups(options.num_groups, data)
  training = len(data.training_clients())
  k_sel = selected_per_cluster(options, training)
  rows = (training if options.fedsoft_selection == "all"
          else min(int(options.num_groups) * k_sel, training))
  return FedSoftDefinition(context.weights_spec, context.num_trainable, options.num_groups,
                           rows=rows, lam=options.fedsoft_lambda, solver=context.solver)
