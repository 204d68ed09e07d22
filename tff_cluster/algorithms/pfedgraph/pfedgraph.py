"""pFedGraph (Ye, Ni, Wu, Chen, Wang, "Personalized Federated Learning with
Inferred Collaboration Graphs", ICML 2023): every client keeps its own model;
after each round the server infers a collaboration graph from the clients'
models and gives each client the graph-weighted sum of its neighbours'.

The rule is the authors' `pfedgraph_cosine` (MediaBrain-SJTU/pFedGraph at
4f5f17c, `pytorch/pfedgraph_cosine.py` and `pytorch/pfedgraph_cosine/utils.py`:
`update_graph_matrix_neighbor`, `optimizing_graph_matrix_neighbor`,
`aggregation_by_graph`; its TensorFlow port `tensorflow/pfedgraph_cosine/`
computes the same numbers). Round t, clients S_t (each holding w_k, at t = 1
the common start w_0):

1. Client k trains w_k with the local term s lambda <c_k, w> / ||w|| added to
   its loss (w and c_k flattened over the trainable weights; c_k is the
   vector the server sent it after its last round, none before it has one),
   s = +1 (`--pfedgraph_sign=code`, every port of the code) or -1 (`pull`),
   coupled weight decay `--pfedgraph_weight_decay` and the run's local
   steps, its optimizer state fresh every round (the code builds a new SGD
   each round).
2. The server takes each participant's change since the start,
   d_k = w_k - w_0 (over every trainable weight, `--pfedgraph_measure=all`,
   or the Dense kernels only, `fc`, the TensorFlow port's), and
   M_ab = -cos(d_a, d_b), set to -1 where cos > 0.9 (0 for a zero vector).
3. Row a of the graph over S_t solves min_x alpha ||x||^2 + (M_a - 2 alpha
   p)^T x on the simplex (x >= 0, sum x = 1), p_k = n_k / sum n the
   participants' shares of training samples: the Euclidean projection of
   p - M_a / (2 alpha) onto the simplex, computed exactly here (the code
   solves it with cvxpy; its default solver agrees to 1e-5).
4. Client a's new model is sum_b A_ab w_b (every weight) and its vector
   c_a = sum_b A_ab w_b / ||w_b|| (trainable weights); both replace the
   client's own. Clients not in S_t keep theirs.

Each client is tested with its own model (w_0 until it first trains).

Where this differs from the code: a client whose last round gave it no c_k
(the code stops with a KeyError when a client joins a round after missing
the one before) keeps the c_k of the last round it took part in; p counts
a client's training samples (the code's partition also holds the 20 % it
validates on); the code reports, per client, the test accuracy at its best
validation score over rounds, we report the final models.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import List, Sequence

import numpy as np
import tensorflow as tf

from tff_cluster.algorithms import personal
from tff_cluster.core.definition import ClientOutput, LocalSolver
from tff_cluster.host import driver
from tff_cluster.host.state import HostState
from tff_cluster.learning import optimizers

# A pair of clients whose changes have a cosine above this counts as one
# (difference -1), the code's constant.
SAME_DIRECTION = 0.9


def project_to_simplex(v: np.ndarray) -> np.ndarray:
  """The Euclidean projection of `v` onto {x >= 0, sum x = 1}: sort v
  descending (u), rho the largest j with u_j - (sum_{r<=j} u_r - 1) / j > 0,
  theta = (sum_{r<=rho} u_r - 1) / rho, x = max(v - theta, 0)."""
  v = np.asarray(v, np.float64)
  u = np.sort(v)[::-1]
  cumulative = np.cumsum(u) - 1.0
  j = np.arange(1, len(v) + 1)
  rho = int(np.nonzero(u - cumulative / j > 0)[0][-1]) + 1
  return np.maximum(v - cumulative[rho - 1] / rho, 0.0)


def difference_matrix(changes: np.ndarray) -> np.ndarray:
  """M_ab = -cos(changes_a, changes_b) ([n, d] rows), -1 where the cosine
  exceeds `SAME_DIRECTION`; a zero row has cosine 0 with every row."""
  changes = np.asarray(changes, np.float64)
  norms = np.linalg.norm(changes, axis=1)
  unit = changes / np.where(norms > 0, norms, 1.0)[:, None]
  m = -(unit @ unit.T)
  m[m < -SAME_DIRECTION] = -1.0
  return m


def collaboration_graph(changes: np.ndarray, sizes: Sequence[float], alpha: float) -> np.ndarray:
  """The round's graph over its participants ([n, n], rows on the simplex):
  row a = the projection of p - M_a / (2 alpha), p the shares of `sizes`."""
  sizes = np.asarray(sizes, np.float64)
  p = sizes / sizes.sum()
  m = difference_matrix(changes)
  return np.stack([project_to_simplex(p - row / (2.0 * alpha)) for row in m])


def flat(weights) -> np.ndarray:
  return np.concatenate([np.asarray(w, np.float64).ravel() for w in weights])


def aggregate(graph: np.ndarray, models: Sequence[Sequence[np.ndarray]], num_trainable: int):
  """(new models, vectors): model a = sum_b A_ab w_b (every weight), vector
  a = sum_b A_ab w_b / ||w_b|| (the trainable weights; a zero model adds
  nothing), both as weight lists in the models' dtypes."""
  norms = [np.linalg.norm(flat(m[:num_trainable])) for m in models]
  out_models, vectors = [], []
  for row in graph:
    out_models.append([np.sum([a * np.asarray(m[i], np.float64) for a, m in zip(row, models)],
                              axis=0).astype(np.asarray(models[0][i]).dtype)
                       for i in range(len(models[0]))])
    vectors.append([np.sum([a / n * np.asarray(m[i], np.float64) if n > 0 else
                            np.zeros(np.shape(m[i])) for a, m, n in zip(row, models, norms)],
                           axis=0).astype(np.float32)
                    for i in range(num_trainable)])
  return out_models, vectors


class PFedGraphDefinition(personal.PersonalStateDefinition):
  """The clients' side: client state `personal` (w_k, every weight),
  `direction` (c_k, the trainable weights) and `pull` (the local term's
  coefficient: s lambda once the client has a c_k, else 0). Broadcast: the
  round's lr. Result per client: its trained model."""

  def __init__(self, weights_spec, num_trainable: int, *, initial_weights,
               weight_decay: float, solver: LocalSolver = LocalSolver()):
    super().__init__(weights_spec, num_trainable, solver)
    self.persist_momentum = False  # a fresh optimizer every round, as the code's
    self.weighting = "processed"
    self.weight_decay = float(weight_decay)
    self.initial_personal = [np.asarray(w) for w in initial_weights]

  def personal_spec(self):
    return list(self.weights_spec)

  def client_state_spec(self, mode):
    spec = super().client_state_spec(mode)
    spec["direction"] = list(self.trainable_spec)
    spec["pull"] = tf.TensorSpec([], tf.float32)
    return spec

  def initial_client_state(self, mode):
    state = super().initial_client_state(mode)
    state["direction"] = [np.zeros(s.shape, s.dtype.as_numpy_dtype) for s in self.trainable_spec]
    state["pull"] = np.float32(0.0)
    return state

  def broadcast(self, state, params, mode):
    return collections.OrderedDict(lr=params["lr"])

  def client_work(self, trainer, selected, received, client_state, data, mode, key=None):
    start = list(client_state["personal"])
    zeros = [tf.zeros_like(w) for w in start[:self.num_trainable]]
    local = optimizers.chain(
        optimizers.cosine_pull(client_state["pull"], client_state["direction"]),
        optimizers.proximal(self.weight_decay, zeros), self.local_step)
    out, new_state = self.local_update(trainer, start, data, received["lr"], client_state,
                                       optimizer=local)
    trained = [w + d for w, d in zip(start, out.delta)]
    new_state["personal"] = trained
    new_state["direction"] = list(client_state["direction"])
    new_state["pull"] = client_state["pull"]
    summed = collections.OrderedDict(loss_sum=out.loss_sum, num_examples=out.num_examples)
    result = collections.OrderedDict(model=trained, loss_sum=out.loss_sum)
    return ClientOutput(summed, result, new_state)

  def server_update(self, state, summed, mode):
    return collections.OrderedDict(model=list(state["model"]))

  def client_model(self, global_model, client_state) -> list:
    del global_model
    return [np.asarray(w) for w in client_state["personal"]]

  def unseen_model(self, global_model, unseen: str) -> list:
    del global_model, unseen
    return [np.asarray(w) for w in self.initial_personal]


@dataclasses.dataclass
class PFedGraphHost(HostState):
  """The facts of the latest graph for the summary."""
  summary: dict


class PFedGraphDriver(personal.PersonalDriver):
  """The graph step between rounds (steps 2-4 of the module docstring) on
  the host, in numpy: the code's QP and weighted sums are host-side too."""

  individual_updates = ("its host weighs each client's model by its similarity to the "
                        "others' and sends each client a sum of them")

  def __init__(self, context: driver.Context, definition: PFedGraphDefinition):
    super().__init__(context, definition)
    options = context.options
    self.alpha = float(options.pfedgraph_alpha)
    self.pull = float(options.pfedgraph_lam) * (1.0 if options.pfedgraph_sign == "code" else -1.0)
    self.measure = options.pfedgraph_measure
    self.host = PFedGraphHost(summary={})
    self.extra_columns = ["pfedgraph_self_weight", "pfedgraph_neighbours"]
    self._compared = self._compared_indices()

  def _compared_indices(self) -> List[int]:
    """The trainable weights the graph's cosines compare (`fc`: the rank-2
    ones, the Dense kernels)."""
    n = self.definition.num_trainable
    if self.measure == "all":
      return list(range(n))
    return [i for i in range(n) if len(self.definition.weights_spec[i].shape) == 2]

  def run_round(self, round_num, sampled):
    out = self.train_clients("train", self.state, sampled, round_num)
    models = [[np.asarray(w) for w in r["model"]] for r in out.results]
    changes = np.stack([flat([m[i] - self.w0[i] for i in self._compared]) for m in models])
    sizes = self.data.num_train_samples()[np.asarray(sampled)]
    graph = collaboration_graph(changes, sizes, self.alpha)
    new_models, vectors = aggregate(graph, models, self.definition.num_trainable)
    offset = self.state_key_offset
    self.client_states.update({
        offset + int(c): collections.OrderedDict(
            personal=m, direction=v, pull=np.float32(self.pull))
        for c, m, v in zip(sampled, new_models, vectors)})
    row = self.training_row(out.summed, len(sampled), models_down=2.0, models_up=1.0)
    row["pfedgraph_self_weight"] = float(np.mean(np.diag(graph)))
    row["pfedgraph_neighbours"] = float(np.mean((graph > 0).sum(axis=1)))
    self.host.summary = {"pfedgraph_last_graph_clients": [self.data.client_ids[int(c)]
                                                          for c in sampled]}
    return row

  def summary(self):
    return dict(self.host.summary)


def definition(context: driver.Context) -> PFedGraphDefinition:
  """pFedGraph's clients from its options."""
  return PFedGraphDefinition(context.weights_spec, context.num_trainable,
                             initial_weights=context.w0,
                             weight_decay=context.options.pfedgraph_weight_decay,
                             solver=context.solver)
