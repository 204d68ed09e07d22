"""FedPAC (Xu, Tong, Huang, "Personalized Federated Learning with Feature
Alignment and Classifier Collaboration", ICLR 2023), as the authors' code
runs it (JianXu95/FedPAC at 5770f4f: `methods/fedpac.py`
`LocalUpdate_FedPAC` (`statistics_extraction`, `get_local_protos`,
`local_training`), `tools.py` (`protos_aggregation`,
`average_weights_weighted`, `get_head_agg_weight`,
`agg_classifier_weighted_p`) and `running.py` `train_round_fedpac`).

The model: a feature extractor f (every weight but the last Dense layer's;
z = f(x), the last Dense layer's input, d features) shared by all clients,
and a classifier g (the last Dense layer) kept by each client. Server state:
the shared weights and the global prototypes c_k (per class; none at first).
Round t, sampled clients S_t, each client i starting from the shared f and
its own g_i:

1. Statistics, before training (mode `head`, at the round's f): per class k
   with n_ik > 0 of the client's training samples, mu_ik = the mean of z;
   h_i [C, d] with row k = p_ik mu_ik (0 for an absent class),
   p_ik = n_ik / n_i; V_i = (sum_k p_ik E_k||z||^2 - sum_k p_ik^2 ||mu_ik||^2)
   / n_i (inference mode; the code's models have no BatchNorm or Dropout).
2. The classifier alone for `--fedpac_head_epochs` epochs at
   `--fedpac_head_lr`, then (mode `body`) the feature extractor alone for the
   run's local work at the round's lr, each example's loss plus
   lambda * mean_d (z - c_y)^2 (`--fedpac_lambda`; from the round after the
   first prototypes; c_y the global prototype of its class, or where there
   is none this round the client's own class mean before the body's
   training). Both phases: a fresh optimizer (the run's momentum) with
   coupled weight decay `--fedpac_weight_decay`, the other part frozen.
3. The server: f <- the participants' mean (weights n_i, their training
   samples); c_k <- sum_i n_ik chat_ik / sum_i n_ik over the participants
   holding class k, chat_ik the class mean of z after the body's training
   (a class no participant holds has no prototype for the next round).
4. Classifier collaboration (the host, `--fedpac_collaborate`): for each
   participant i, P = diag(V_j) + [<h_i - h_j1, h_i - h_j2>]_{j1, j2 in S_t}
   (float32); if an eigenvalue of P is negative, P keeps only its eigen-
   components of eigenvalue >= 0.01, and if one is still negative client i
   keeps its own classifier; else alpha_i = argmin alpha^T P alpha on the
   simplex (solved here by scipy's SLSQP; the code uses cvxpy's default
   solver, OSQP at 1e-5), alpha_ij <- alpha_ij 1{alpha_ij
   > 1e-3}, g_i <- sum_j alpha_ij g_j / sum_j alpha_ij (the trained g_j).

Clients not sampled keep their classifier and take the new f (the code
sends f to every client). Each client is tested with f and its g_i. The
row's `train_loss` is the classifier epochs' mean loss (the feature
extractor's adds the alignment term).
"""

from __future__ import annotations

import collections
from typing import List, Optional

import numpy as np
import tensorflow as tf

from tff_cluster import models
from tff_cluster.algorithms import personal
from tff_cluster.algorithms.pfedgraph.pfedgraph import project_to_simplex
from tff_cluster.core import personal as parts
from tff_cluster.core.definition import ClientOutput, LocalSolver
from tff_cluster.core.weighting import add_mean_update
from tff_cluster.host import driver
from tff_cluster.learning import optimizers, schedule, trainers

EIGEN_CUT = 0.01  # the code's cut of a non-PSD P
ALPHA_FLOOR = 1e-3  # weights at or below it are dropped (the code's)


def statistics(sums: np.ndarray, squares: np.ndarray, counts: np.ndarray, samples: float):
  """(V, h [C, d]) of step 1 from the per-class feature sums [C, d], squared
  norm sums [C] and counts [C] over passes of the client's data, and its
  training samples n_i."""
  counts = np.asarray(counts, np.float64)
  has = counts > 0
  safe = np.where(has, counts, 1.0)
  mu = np.asarray(sums, np.float64) / safe[:, None]
  second = np.asarray(squares, np.float64) / safe
  p = counts / max(counts.sum(), 1.0)
  h = np.where(has[:, None], p[:, None] * mu, 0.0)
  v = (np.sum(np.where(has, p * second, 0.0))
       - np.sum(np.where(has, p * p * np.sum(mu * mu, axis=1), 0.0))) / float(samples)
  return float(v), h


def solve_simplex_qp(p: np.ndarray) -> np.ndarray:
  """argmin_x x^T P x over {x >= 0, sum x = 1} (P symmetric PSD): sequential
  least squares (scipy's SLSQP, from the uniform point, to 1e-15 in the
  objective), projected onto the simplex."""
  from scipy.optimize import minimize
  p = np.asarray(p, np.float64)
  p = (p + p.T) / 2.0
  m = len(p)
  result = minimize(lambda x: x @ p @ x, np.full(m, 1.0 / m), jac=lambda x: 2.0 * (p @ x),
                    method="SLSQP", bounds=[(0.0, 1.0)] * m,
                    constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1.0,
                                  "jac": lambda x: np.ones_like(x)}],
                    options={"ftol": 1e-15, "maxiter": 1000})
  return _polished(p, project_to_simplex(result.x))


def _polished(p: np.ndarray, x: np.ndarray) -> np.ndarray:
  """`x` made exact on its support S (entries > 1e-9): the solution of the
  optimality conditions 2 P_SS x_S = nu 1, sum x_S = 1 (least squares), kept
  where it stays non-negative and no worse; so the weights follow P smoothly
  rather than the solver's stopping point."""
  support = np.flatnonzero(x > 1e-9)
  k = len(support)
  a = np.zeros((k + 1, k + 1))
  a[:k, :k] = 2.0 * p[np.ix_(support, support)]
  a[:k, k] = -1.0
  a[k, :k] = 1.0
  b = np.zeros(k + 1)
  b[k] = 1.0
  solved = np.linalg.lstsq(a, b, rcond=None)[0][:k]
  if (solved < 0).any():
    return x
  exact = np.zeros_like(x)
  exact[support] = solved / solved.sum()
  return exact if exact @ p @ exact <= x @ p @ x + 1e-15 else x


def combination_weights(v: np.ndarray, h: np.ndarray, i: int) -> Optional[np.ndarray]:
  """Client i's weights over the round's participants (step 4), thresholded
  and not renormalised; None where P stays indefinite (its own classifier)."""
  flat = np.asarray(h, np.float32).reshape(len(h), -1)
  diffs = flat[i] - flat
  p = (np.diag(np.asarray(v, np.float32)) + diffs @ diffs.T).astype(np.float32)
  if not np.all(np.real(np.linalg.eigvals(p)) >= 0.0):
    w, u = np.linalg.eigh(p.astype(np.float64))
    keep = w >= EIGEN_CUT
    p = ((u[:, keep] * w[keep]) @ u[:, keep].T).astype(np.float32)
    if not np.all(np.real(np.linalg.eigvals(p)) >= 0.0):
      return None
  alpha = solve_simplex_qp(p)
  return alpha * (alpha > ALPHA_FLOOR)


def combine_heads(alpha: Optional[np.ndarray], heads: List[List[np.ndarray]], i: int):
  """sum_j alpha_j g_j / sum_j alpha_j; client i's own head for None."""
  if alpha is None:
    return [np.array(w) for w in heads[i]]
  total = alpha.sum()
  return [(np.sum([a * np.asarray(g[n], np.float64) for a, g in zip(alpha, heads)], axis=0)
           / total).astype(np.asarray(heads[i][n]).dtype) for n in range(len(heads[i]))]


class FedPACDefinition(personal.SplitDefinition):
  """FedRep's split (the last Dense layer personal) with FedPAC's two modes:
  `head` (statistics, then the classifier) and `body` (the aligned feature
  extractor, then the class sums of its features). Server state adds
  `prototypes` [C, d] and `proto_counts` [C] (0: no prototype)."""

  sequential_only = "its local steps align the model's features"

  def __init__(self, weights_spec, num_trainable: int, *, indices, initial_weights,
               num_classes: int, feature_dim: int, lam: float, head_lr: float,
               weight_decay: float, solver: LocalSolver = LocalSolver()):
    super().__init__(weights_spec, num_trainable, indices=indices,
                     initial_weights=initial_weights, weighting="samples",
                     modes=("head", "body"), solver=solver)
    self.num_classes, self.feature_dim = int(num_classes), int(feature_dim)
    self.lam, self.head_lr = float(lam), float(head_lr)
    self.weight_decay = float(weight_decay)

  def initial_state(self, initial_weights):
    state = super().initial_state(initial_weights)
    state["prototypes"] = np.zeros((self.num_classes, self.feature_dim), np.float32)
    state["proto_counts"] = np.zeros(self.num_classes, np.float32)
    return state

  def broadcast(self, state, params, mode):
    out = super().broadcast(state, params, mode)
    if mode == "body":
      out["prototypes"] = state["prototypes"]
      out["proto_counts"] = state["proto_counts"]
    return out

  def _optimizer(self, mode, start):
    zeros = [tf.zeros_like(w) for w in start[:self.num_trainable]]
    return optimizers.chain(optimizers.proximal(self.weight_decay, zeros),
                            self._optimizers[mode])

  def client_work(self, trainer, selected, received, client_state, data, mode, key=None):
    start = parts.merge(received["shared"], client_state["personal"], self.indices)
    sums, squares, counts = trainer.feature_sums(start, data, self.num_classes)
    if mode == "head":
      out, new_state = self.local_update(trainer, start, data, self.head_lr, client_state,
                                         optimizer=self._optimizer("head", start))
      new_state["personal"] = [start[i] + out.delta[i] for i in self.indices]
      summed = collections.OrderedDict(loss_sum=out.loss_sum, num_examples=out.num_examples)
      result = collections.OrderedDict(sums=sums, squares=squares, counts=counts,
                                       samples=client_state["weight"])
      return ClientOutput(summed, result, new_state)
    have = received["proto_counts"] > 0
    own = sums / tf.maximum(counts, 1.0)[:, None]
    targets = tf.where(have[:, None], received["prototypes"], own)
    coef = tf.where(tf.reduce_any(have), self.lam, 0.0)
    opt = self._optimizer("body", start)
    # (local_update with the alignment: the trainer's train, the optimizer's
    # state fresh as every masked phase's)
    out = trainer.train(start, data, received["lr"], opt,
                        alignment=trainers.FeatureAlignment(targets, coef))
    trained = [w + d for w, d in zip(start, out.delta)]
    post_sums, _, post_counts = trainer.feature_sums(trained, data, self.num_classes)
    n = client_state["weight"]
    new_state = collections.OrderedDict(client_state)
    new_state["personal"] = [trained[i] for i in self.indices]
    summed = collections.OrderedDict(
        loss_sum=out.loss_sum, num_examples=out.num_examples,
        update=[n * out.delta[i] for i in self.shared], weight=n,
        proto_sums=post_sums, proto_counts=post_counts)
    result = collections.OrderedDict(head=[trained[i] for i in self.indices])
    return ClientOutput(summed, result, new_state)

  def server_update(self, state, summed, mode):
    if mode == "head":
      return collections.OrderedDict(state)
    model = list(state["model"])
    moved = add_mean_update([model[i] for i in self.shared], summed["update"], summed["weight"])
    for i, w in zip(self.shared, moved):
      model[i] = w
    counts = summed["proto_counts"]
    protos = summed["proto_sums"] / tf.maximum(counts, 1.0)[:, None]
    return collections.OrderedDict(model=model, prototypes=protos, proto_counts=counts)


class FedPACDriver(personal.PersonalDriver):
  """Each round: mode `head` (statistics and `--fedpac_head_epochs` epochs of
  the classifier), mode `body` (the run's local work of the aligned feature
  extractor), then the classifiers' combination on the host (step 4)."""

  individual_updates = ("its host combines each client's classifier with the others' by "
                        "weights read from each client's feature statistics")

  @classmethod
  def check(cls, context: driver.Context) -> None:
    super().check(context)
    runner = context.config.runner
    if getattr(runner, "client_batching", "sequential") == "parallel":
      raise ValueError("--algo=fedpac's feature alignment runs one client after another; "
                       "valid: --client_batching=sequential or auto")

  def __init__(self, context: driver.Context, definition: FedPACDefinition):
    super().__init__(context, definition)
    head_work = schedule.LocalWork(self.config.batch_size,
                                   epochs=self.options.fedpac_head_epochs)
    self.phases = [("head", head_work), ("body", None)]
    self.collaborate = bool(self.options.fedpac_collaborate)
    self.extra_columns = ["fedpac_own_weight", "fedpac_partners"]

  def run_round(self, round_num, sampled):
    head, work = self.phases[0]
    stats = self.train_clients(head, self.state, sampled, round_num, work=work)
    self.state = stats.state
    out = self.train_clients("body", self.state, sampled, round_num)
    self.state = out.state
    # train_loss: the classifier epochs' loss (the body's adds the alignment).
    row = self.training_row(stats.summed, len(sampled))
    own, partners = self._combine(sampled, stats.results, out.results)
    row["fedpac_own_weight"] = own
    row["fedpac_partners"] = partners
    return row

  def _combine(self, sampled, stats, trained):
    """Step 4: each participant's classifier from the QP's weights; returns
    (mean own weight, mean number of classifiers combined)."""
    heads = [[np.asarray(w) for w in r["head"]] for r in trained]
    if not self.collaborate:
      return 1.0, 1.0
    vh = [statistics(r["sums"], r["squares"], r["counts"], float(r["samples"])) for r in stats]
    v = np.array([x[0] for x in vh])
    h = np.stack([x[1] for x in vh])
    offset, own, partners, new = self.state_key_offset, [], [], {}
    for i, c in enumerate(sampled):
      alpha = combination_weights(v, h, i)
      weights = np.eye(len(sampled))[i] if alpha is None else alpha / alpha.sum()
      own.append(float(weights[i]))
      partners.append(int((weights > 0).sum()))
      state = collections.OrderedDict(self.client_states[offset + int(c)])
      state["personal"] = combine_heads(alpha, heads, i)
      new[offset + int(c)] = state
    self.client_states.update(new)
    return float(np.mean(own)), float(np.mean(partners))


def definition(context: driver.Context) -> FedPACDefinition:
  """FedPAC's split: the last Dense layer (kernel, bias) personal."""
  options, data = context.options, context.need_data()
  built = context.model.model_fn()
  return FedPACDefinition(
      context.weights_spec, context.num_trainable,
      indices=models.last_dense_indices(built), initial_weights=context.w0,
      num_classes=data.num_classes,
      feature_dim=int(models.last_dense_layer(built).kernel.shape[0]),
      lam=options.fedpac_lambda, head_lr=options.fedpac_head_lr,
      weight_decay=options.fedpac_weight_decay, solver=context.solver)
