"""StoCFL (Zeng, Hu, Liu, Yu, Wang and Xu, "Stochastic Clustered Federated
Learning", arXiv:2303.00897, 2023), as the authors' code runs it: the code is
the only source that could be read (dunzeng/StoCFL at bd6d031:
`StoCFL-FCC+CFL.py` `StandaloneServer.main`, `inter_cluster_union`, `unite`,
`bucket`; `trainer.py` `ob_train`, `train_alone_prox`, `train`;
`functional.py` `dt_matrix`, `parse_matrix`).

State: a fixed anchor omega_a (the initial model, never updated), the global
model w_g, every client in its own cluster (a cluster's id is its smallest
member), each cluster's model made when it is first trained.

Round t, on the sampled clients:
  (a) representation, once per client (cached): a client never seen trains a
      copy of omega_a for `--stocfl_obep` epochs (batch `--stocfl_obbs`,
      default its whole set; plain SGD at the round's rate);
      psi_i = omega_a - trained (trainable weights, flattened);
  (b) clustering: the sampled clients grouped by their cluster; a cluster's
      direction is the mean psi of its sampled members; the pairs of sampled
      clusters sorted by the cosine similarity of their directions, highest
      first (ties in row-major order); pairs with cosine >= `--stocfl_tau`
      are united, stopping at the first below it (no recomputation after a
      merge). Uniting i < j (each resolved to its client's cluster now):
      the merged cluster keeps id i and i's model, or j's model when i has
      fewer members (all members counted) and j has one; j's model is
      dropped;
  (c) a sampled cluster without a model gets a copy of w_g; each sampled
      client trains its cluster's model with (mu/2)||w - w_g||^2 added
      (`--stocfl_mu`, w_g the round's start), and the global model: chain
      (the code's `train`: each client, in ascending order, starts from the
      previous one's trained model) or parallel (each from w_g);
  (d) each sampled cluster's model becomes the plain mean of its sampled
      members' trained models; w_g the plain mean of the global trainings
      (chain: of the chain's models).
Local steps are plain SGD (the code's). Evaluation: a client is tested with
its cluster's model, or w_g while its cluster has none (a client never
sampled); clients without training data take their lowest-test-loss model.
ARI and purity: the clusters of the clients sampled so far.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Dict, List

import numpy as np
import tensorflow as tf

from tff_cluster import clustering
from tff_cluster.host import driver
from tff_cluster.host.state import HostState
from tff_cluster.core import cluster_ops
from tff_cluster.core.aggregators import ClusterMean
from tff_cluster.core.definition import ClientOutput, Definition, LocalSolver, flat_norm
from tff_cluster.learning import optimizers, schedule


class StoCFLDefinition(Definition):
  """StoCFL's calls (see the module docstring). State: `anchor`, `global`
  (weight lists) and `slots` ([P, ...]: the round's sampled clusters'
  models, P = the round's size). Modes: represent (psi from the anchor),
  train (keys: the client's cluster's slot), chain (one client's global
  training from `global`)."""

  modes = ("represent", "train", "chain")

  def __init__(self, weights_spec, num_trainable: int, slots: int, *, mu: float,
               global_rule: str, solver: LocalSolver = LocalSolver()):
    super().__init__(weights_spec, num_trainable, solver)
    self.slots = int(slots)
    self.mu = float(mu)
    self.global_rule = global_rule

  def initial_state(self, initial_weights):
    w = [np.asarray(a) for a in initial_weights]
    return collections.OrderedDict(anchor=w, **{"global": list(w)},
                                   slots=cluster_ops.stack_models(w, self.slots))

  def num_keys(self, mode):
    return self.slots if mode == "train" else 0

  def database(self, state, mode):
    return list(state["slots"]) if mode == "train" else None

  def broadcast(self, state, params, mode):
    start = "anchor" if mode == "represent" else "global"
    return collections.OrderedDict(start=list(state[start]), lr=params["lr"])

  def client_work(self, trainer, selected, received, client_state, data, mode, key=None):
    start, lr = list(received["start"]), received["lr"]
    one = tf.constant(1.0)
    if mode != "train":
      out = trainer.train(start, data, lr, self.client_optimizer)
      summed = collections.OrderedDict(
          global_sums=[s + d for s, d in zip(start, out.delta)], count=one,
          loss_sum=out.loss_sum, num_examples=out.num_examples)
      result = collections.OrderedDict(loss_sum=out.loss_sum)
      if mode == "represent":  # psi = anchor - trained
        result["psi"] = [-d for d in out.delta[:self.num_trainable]]
      return ClientOutput(summed, result, None)
    opt = optimizers.chain(optimizers.proximal(self.mu, start[:self.num_trainable]),
                           self.local_step)
    cluster_start = list(selected)
    out = trainer.train(cluster_start, data, lr, opt)
    model_sums, counts = ClusterMean(self.slots).client(
        key, [s + d for s, d in zip(cluster_start, out.delta)])
    summed = collections.OrderedDict(
        model_sums=model_sums, counts=counts, loss_sum=out.loss_sum,
        num_examples=out.num_examples, update_norm_sum=flat_norm(out.delta),
        num_clients=one)
    if self.global_rule == "parallel":
      g = trainer.train(start, data, lr, self.client_optimizer)
      summed["global_sums"] = [s + d for s, d in zip(start, g.delta)]
    return ClientOutput(summed, collections.OrderedDict(loss_sum=out.loss_sum), None)

  def server_update(self, state, summed, mode):
    new = collections.OrderedDict(state)
    if mode == "represent":
      return new
    if "global_sums" in summed:
      count = summed["count"] if mode == "chain" else summed["num_clients"]
      safe = tf.maximum(count, 1.0)
      new["global"] = [tf.where(count > 0, s / safe, w)
                       for s, w in zip(summed["global_sums"], state["global"])]
    if mode == "train":
      new["slots"] = ClusterMean.mean(summed["model_sums"], summed["counts"],
                                      list(state["slots"]))
    return new


@dataclasses.dataclass
class StoCFLHost(HostState):
  """Each client's cluster (`cluster_of`: the cluster's smallest member),
  the cached representations (`psi`, by client), the clusters' models (by
  cluster id) and the merges so far."""
  cluster_of: np.ndarray
  summary: Dict[str, object]
  psi: Dict[int, np.ndarray] = dataclasses.field(default_factory=dict)
  models: Dict[int, List[np.ndarray]] = dataclasses.field(default_factory=dict)
  merges: int = 0


def cosine(a: np.ndarray, b: np.ndarray) -> float:
  """a.b / max(|a||b|, 1e-6) (the code's torch CosineSimilarity, eps 1e-6)."""
  return float(np.dot(a, b) / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-6))


class StoCFLDriver(driver.Driver):
  """StoCFL's host side (see the module docstring)."""

  individual_updates = (
      "its host merges clusters by the distances between the clients' individual updates")

  host: StoCFLHost

  def __init__(self, context: driver.Context, definition: StoCFLDefinition):
    super().__init__(context, definition)
    options, data = self.options, self.data
    self.tau = float(options.stocfl_tau)
    batch = options.stocfl_obbs or max(int(data.num_train_samples().max()), 1)
    self.represent_work = schedule.LocalWork(int(batch), epochs=int(options.stocfl_obep))
    self.host = StoCFLHost(cluster_of=np.arange(data.num_clients), summary={})
    self.extra_columns = ["mean_update_norm", "num_clusters", "stocfl_merges",
                          *self.score_columns()]

  def setup(self):
    self.state = self.runner.put_state(self.definition.initial_state(self.w0))
    self.host.summary.update(num_parameters=self.num_params, **{
        k: self.options[k] for k in ("stocfl_tau", "stocfl_mu", "stocfl_obep",
                                     "stocfl_obbs", "stocfl_global")})
    return {}

  # -- (a), (b): representations and merges ------------------------------------

  def represent(self, clients, round_num) -> int:
    new = [int(k) for k in clients if int(k) not in self.host.psi]
    if new:
      out = self.train_clients("represent", self.state, new, round_num,
                               work=self.represent_work, persist=False)
      for k, r in zip(new, out.results):
        self.host.psi[k] = clustering.flatten_weights(list(r["psi"])).astype(np.float32)
    return len(new)

  def merge(self, sampled) -> None:
    cluster_of = self.host.cluster_of
    clusters = sorted(set(int(c) for c in cluster_of[sampled]))
    if len(clusters) <= 1:
      return
    directions = [np.mean([self.host.psi[int(k)] for k in sampled if cluster_of[k] == c],
                          axis=0) for c in clusters]
    pairs = [(cosine(directions[a], directions[b]), clusters[a], clusters[b])
             for a in range(len(clusters)) for b in range(a + 1, len(clusters))]
    for sim, i, j in sorted(pairs, key=lambda p: -p[0]):  # stable: row-major on ties
      if sim < self.tau:
        break
      self.unite(i, j)

  def unite(self, i: int, j: int) -> None:
    cluster_of, models = self.host.cluster_of, self.host.models
    i, j = int(cluster_of[i]), int(cluster_of[j])  # clusters merged earlier: their client's
    if i == j:
      return
    i, j = min(i, j), max(i, j)
    if (cluster_of == i).sum() < (cluster_of == j).sum() and j in models:
      models[i] = models[j]
    models.pop(j, None)
    cluster_of[cluster_of == j] = i
    self.host.merges += 1

  # -- (c), (d): the round --------------------------------------------------------

  def run_round(self, round_num, sampled):
    sampled = np.sort(np.asarray(sampled))
    new = self.represent(sampled, round_num)
    self.merge(sampled)
    state = self.runner.numpy_state(self.state)
    g = [np.asarray(w) for w in state["global"]]
    clusters = sorted(set(int(c) for c in self.host.cluster_of[sampled]))
    for c in clusters:
      self.host.models.setdefault(c, [np.array(w, copy=True) for w in g])
    slot = {c: s for s, c in enumerate(clusters)}
    rows = [self.host.models[c] for c in clusters] + [g] * (self.definition.slots - len(clusters))
    state["slots"] = [np.stack([m[layer] for m in rows]) for layer in range(len(g))]
    out = self.train_clients("train", state, sampled, round_num,
                             keys=[slot[int(self.host.cluster_of[k])] for k in sampled])
    trained = self.runner.numpy_state(out.state)
    for c, s in slot.items():
      self.host.models[c] = [np.asarray(layer[s]) for layer in trained["slots"]]
    if self.definition.global_rule == "chain":
      trained["global"] = self.chain(trained, sampled, round_num)
    self.state = self.runner.put_state(trained)
    row = self.training_row(out.summed, len(sampled), models_down=2, models_up=2)
    extra = new * self.num_params * driver.BYTES_PER_PARAMETER
    row["bytes_down"] += extra
    row["bytes_up"] += extra
    seen = self.seen()
    row["num_clusters"] = int(len(np.unique(self.host.cluster_of[seen])))
    row["stocfl_merges"] = self.host.merges
    return row

  def chain(self, state, sampled, round_num):
    """The code's global training: client by client (ascending), each from
    the previous one's trained model; the mean of the chain's models."""
    current = collections.OrderedDict(state)
    models = []
    for k in sampled:
      out = self.train_clients("chain", current, [int(k)], round_num, persist=False)
      current = self.runner.numpy_state(out.state)
      models.append([np.asarray(w) for w in current["global"]])
    return [np.mean([m[layer] for m in models], axis=0).astype(models[0][layer].dtype)
            for layer in range(len(models[0]))]

  # -- evaluation -------------------------------------------------------------------

  def seen(self) -> np.ndarray:
    return np.array(sorted(self.host.psi), np.int64)

  def eval_models(self):
    g = [np.asarray(w) for w in self.runner.numpy_state(self.state)["global"]]
    ids = sorted(self.host.models)
    index = {c: 1 + n for n, c in enumerate(ids)}
    client_model = np.array([index.get(int(c), 0) for c in self.host.cluster_of], np.int64)
    return [g] + [self.host.models[c] for c in ids], client_model

  def round_eval_metrics(self, result):
    labels = np.full(self.data.num_clients, -1, np.int64)
    seen = self.seen()
    labels[seen] = self.host.cluster_of[seen]
    return self.cluster_scores(labels)

  def summary(self):
    out = dict(self.host.summary)
    out["final_clusters"] = self.by_client(self.host.cluster_of)
    out["stocfl_merges"] = self.host.merges
    return out


def definition(context: driver.Context) -> StoCFLDefinition:
  """StoCFL's definition: one slot per client of a round (`--clients_per_round`;
  without the run's settings, every client of the data)."""
  options = context.options
  slots = (context.config.clients_per_round if context.config is not None
           else context.need_data().num_clients)
  return StoCFLDefinition(context.weights_spec, context.num_trainable, slots,
                          mu=options.stocfl_mu, global_rule=options.stocfl_global,
                          solver=context.solver)
