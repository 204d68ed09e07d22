"""pFedMo (the pFedMo paper, Algorithms 1-2) and FedNAG, its pi = 0 case.

N workers, all of them at every aggregation; every `--local_steps` (tau)
local iterations they aggregate (a round = one aggregation interval k). With
eta the round's learning rate, gamma = `--nag_momentum`, pi = `--pfedmo_pi`:

worker i, every local iteration (eqs. 6-7; NAG's two-sequence form, y being
  the look-ahead point, not a velocity; `optimizers.nesterov`):
    y_i <- x_i - eta grad F_i(x_i; batch);  x_i <- y_i + gamma (y_i - y_i_prev)
  starting interval k from its personalised (x_{i+}, y_{i+}) of the previous
  aggregation (at k = 1: x_i = y_i = x^0).
representation model (x_r, y_r), at the aggregator: the same steps, as many
  per interval, on a public i.i.d. set (`FederatedData.public` when the task
  defines one; else a seeded i.i.d. `--public_fraction` of the pooled
  training data, which then overlaps the workers' data). It is never replaced
  by the aggregate.
score (eqs. 8-10, Algorithm 2), on a fixed batch B of `--score_batch` samples
  drawn once (seeded) from the pooled test data (the paper takes B from the
  testing data and gives neither its size nor whether it is redrawn):
    l_i = mean_b [ - sum_c softmax(f(x_r; b))_c log softmax(f(x_i; b))_c ]
    u_i <- max(u_i, l_i) (u_i = l_i at k = 1);  s_i = 1 - l_i / u_i
aggregation, with a_i = D_i / D (`--agg_weights=data`) or 1/N (`uniform`, the
  paper's quantity-skew experiment):
    x_bar = sum_i a_i x_i,  y_bar = sum_i a_i y_i
    y_{i+} = (1 - pi s_i) y_bar + pi s_i y_r                            (eq. 11)
    x_{i+} = (1 - pi s_i) x_bar + pi s_i x_r + y_bar - y_{i+}           (eq. 12)
           = x_bar + pi s_i [(x_r - x_bar) - (y_r - y_bar)]
    x_+ = sum_i a_i x_{i+}   (the global model, the paper's output; it does
          not feed back into training)

Eq. 12 (`--pfedmo_model`): with y the look-ahead point of eqs. 6-7, the
term y_bar - y_{i+} = pi s_i (y_bar - y_r) cancels the mix to first order:
x_{i+} - x_bar = pi s_i [(x_r - y_r) - (x_bar - y_bar)], a difference of last
NAG steps, so ||x_+ - x_bar|| is of order eta, which is what the paper's
Theorem 2 bounds (2 mu eta rho q^k pi). The next local steps, whose momentum
starts from y_{i+}, then carry each worker a further ~ pi s_i gamma /
(1 - gamma) (y_bar - y_r) *away* from the representation model, and where the
two trajectories differ that distance grows every aggregation. On
mnist_workers (IID, LeNet-5, the paper's Table 2 settings, seed 0) `eq12`
keeps ||x_+ - x_bar|| at 0.0006-0.0182 while ||x_r - x_bar|| grows from
0.066 (round 1) to 0.86 (5), 7.8 (9), 63 (14) and 201 (24); accuracy peaks at
0.9186 (round 9) and is 0.1135 at round 25 (FedNAG: 0.9596). Every quantity
of eqs. 6-12 and Algorithm 2 was checked against an independent numpy
implementation of the printed equations over four aggregations (a test):
no misreading was found, the collapse is the printed rule's (the trace is in
the README). `eq12` (the default) is the equation as printed; `mix`,
x_{i+} = (1 - pi s_i) x_bar + pi s_i x_r with y_{i+} by eq. 11, is a project
variant after the paper's prose ("a higher weight to the representation
model"): its ||x_+ - x_bar|| = pi q ||x_r - x_bar|| does not shrink with eta,
against Theorem 2 (0.13-0.15 in the same run, ||x_r - x_bar|| 0.15-0.34;
0.9546 at round 25).

With gamma = 0 (x = y at aggregation time) eq. 12 gives x_{i+} = x_bar whatever
s_i, and a gamma = 0 step ignores y: the representation model then has no
effect at all. (The project's spec lists "x_{i+} = y_{i+} = (1 - pi s_i) x_bar +
pi s_i x_r" for gamma = 0; that contradicts eq. 12, which is implemented as
printed, and a test checks the consequence above.)

pi = 0 (and every aggregation where all s_i = 0, such as k = 1) is FedNAG:
local NAG, then the a_i-weighted means of x and y sent back to every worker.
`--algo=fednag` is this definition with pi = 0 and no representation model
(neither changes x or y; tested).

Where each piece runs: the workers' per-worker starts (x_{i+}, y_{i+}) are
stacked [N, ...] in the server state and each worker selects its row by its
index (`federated_select`). The scores are computed by the workers (they
receive x_r and B, and return l_i), the same numbers as the paper's server
computing them from the uploaded x_i. The representation model's steps run
as the definition's `represent` mode over the public set (a one-participant
call: a TFF simulation places datasets at clients), before the workers' call
of the same round. BatchNorm statistics (non-trainable weights) have no y:
they take x_bar.

Evaluation: each worker with its personalised model x_{i+} on its own test
data (`test_accuracy`, ...), and the global model x_+ on the pooled test data
(`global_test_accuracy`, `global_test_loss`).
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf

from tff_cluster import seeds
from tff_cluster.host import driver
from tff_cluster.runners.config import RunnerConfig
from tff_cluster.runners.factory import make_runner
from tff_cluster.core.aggregators import ClusterSum, Mean
from tff_cluster.core.definition import ClientOutput, Definition, LocalSolver
from tff_cluster.data.federated import FederatedData
from tff_cluster.learning import optimizers



def soft_cross_entropy(teacher_logits: tf.Tensor, student_logits: tf.Tensor) -> tf.Tensor:
  """Eqs. 8-10: the mean over the batch of -sum_c softmax(p)_c log softmax(q)_c."""
  w = tf.nn.softmax(teacher_logits, axis=-1)
  return tf.reduce_mean(-tf.reduce_sum(w * tf.nn.log_softmax(student_logits, axis=-1),
                                       axis=-1))


def running_max_scores(u: tf.Tensor, losses: tf.Tensor):
  """Algorithm 2: (new u, s) with u <- max(u, l) (u = 0 before the first
  aggregation, so u = l there since l > 0) and s = 1 - l / u."""
  u = tf.maximum(u, losses)
  s = tf.where(u > 0, 1.0 - losses / tf.where(u > 0, u, 1.0), 0.0)
  return u, s


def personalise(c, x_bar, y_bar, x_r, y_r, rule: str):
  """Eqs. 11-12 for one trainable weight with c = pi s_i (scalar or [N] with
  a leading worker axis broadcast): (x_{i+}, y_{i+}). `rule='mix'` drops
  eq. 12's momentum term: x_{i+} = (1 - c) x_bar + c x_r."""
  y_plus = (1.0 - c) * y_bar + c * y_r
  x_plus = (1.0 - c) * x_bar + c * x_r
  if rule == "eq12":
    x_plus = x_plus + y_bar - y_plus
  return x_plus, y_plus


class PFedMoDefinition(Definition):
  """pFedMo's round as plain TF functions (see the module docstring).

  State: `model` (x_+, every weight), `x_bar` (the aggregate before
  personalisation, every weight: Theorem 2's x^{k tau}, kept for the trace),
  `rep_x` / `rep_y` (representation model, its look-ahead point on trainable
  weights), `x` / `y` (each worker's start, [N, ...]), `u` and `s` (scores,
  [N]), `agg_weight` ([N], a_i).
  Modes: `train` (the workers; key = worker index) and `represent` (the
  representation model's steps on the public set).
  """

  def __init__(self, weights_spec, num_trainable: int, num_workers: int,
               agg_weights, score_x: np.ndarray, *, nag_momentum: float, pi: float,
               representation: bool, model_rule: str, solver: LocalSolver = LocalSolver()):
    self.model_rule = model_rule
    super().__init__(weights_spec, num_trainable, solver)
    # Local steps are Nesterov's (x, y) form, the look-ahead point y given.
    self.client_optimizer = optimizers.chain(optimizers.nesterov(nag_momentum))
    self.num_workers = int(num_workers)
    self.agg_weights = np.asarray(agg_weights, np.float32)
    if self.agg_weights.shape != (self.num_workers,):
      raise ValueError(f"need one aggregation weight per worker ({self.num_workers})")
    self.score_x = np.asarray(score_x, np.float32)
    self.pi = float(pi)
    self.representation = bool(representation)
    self.modes = ("train", "represent") if representation else ("train",)

  # -- server --------------------------------------------------------------

  def initial_state(self, initial_weights):
    model = [np.asarray(w) for w in initial_weights]
    trainable = model[:self.num_trainable]
    n = self.num_workers
    return collections.OrderedDict(
        model=model,
        x_bar=[np.array(w) for w in model],
        rep_x=[np.array(w) for w in model],
        rep_y=[np.array(w) for w in trainable],
        x=[np.repeat(w[None], n, axis=0) for w in model],
        y=[np.repeat(w[None], n, axis=0) for w in trainable],
        u=np.zeros(n, np.float32), s=np.zeros(n, np.float32),
        agg_weight=self.agg_weights.copy())

  def num_keys(self, mode):
    return self.num_workers if mode == "train" else 0

  def database(self, state, mode):
    # A flat list (TFF's select keeps a list's order, not a dict's):
    # x_{i+} per weight, y_{i+} per trainable weight, a_i.
    return [*state["x"], *state["y"], state["agg_weight"]]

  def _unpack(self, selected):
    """(x_{i+}, y_{i+}, a_i) from a worker's database row."""
    selected = list(selected)
    m, n = len(self.weights_spec), self.num_trainable
    return selected[:m], selected[m:m + n], selected[m + n]

  def broadcast(self, state, params, mode):
    if mode == "represent":
      return collections.OrderedDict(x=list(state["rep_x"]), y=list(state["rep_y"]),
                                     lr=params["lr"])
    return collections.OrderedDict(rep_x=list(state["rep_x"]), lr=params["lr"])

  def client_work(self, trainer, selected, received, client_state, data, mode, key=None):
    if mode == "represent":
      out = trainer.train(received["x"], data, received["lr"], self.client_optimizer,
                          (received["y"],))
      x_new = [s + d for s, d in zip(received["x"], out.delta)]
      summed = collections.OrderedDict(x=x_new, y=self._look_ahead(out),
                                       loss_sum=out.loss_sum, weight=out.num_examples)
      return ClientOutput(summed, collections.OrderedDict(loss_sum=out.loss_sum,
                                                          num_examples=out.num_examples))
    start, y_start, a = self._unpack(selected)
    if self.representation:
      teacher = trainer.predict(received["rep_x"], self.score_x)
    out = trainer.train(start, data, received["lr"], self.client_optimizer, (y_start,))
    x_new = [s + d for s, d in zip(start, out.delta)]
    y_new = self._look_ahead(out)
    if self.representation:
      score_loss = soft_cross_entropy(teacher, trainer.predict(x_new, self.score_x))
    else:
      score_loss = tf.constant(0.0)
    summed = collections.OrderedDict(
        x=[a * w for w in x_new], y=[a * w for w in y_new], weight=a,
        score_loss=ClusterSum(self.num_workers).client(key, [score_loss])[0],
        loss_sum=out.loss_sum,
        num_examples=out.num_examples)
    result = collections.OrderedDict(loss_sum=out.loss_sum, num_examples=out.num_examples,
                                     score_loss=score_loss)
    return ClientOutput(summed, result)

  def _look_ahead(self, out):
    """y after the local steps: the Nesterov step's state (with gamma = 0
    NAG is SGD and y = x)."""
    return list(out.opt_state[-1])

  def server_update(self, state, summed, mode):
    new = collections.OrderedDict(state)
    if mode == "represent":
      new["rep_x"], new["rep_y"] = list(summed["x"]), list(summed["y"])
      return new
    n = self.num_trainable
    x_bar = Mean.mean(summed["x"], summed["weight"])
    y_bar = Mean.mean(summed["y"], summed["weight"])
    if self.representation:
      u, s = running_max_scores(state["u"], summed["score_loss"])
    else:
      u, s = state["u"], tf.zeros_like(state["s"])
    c = self.pi * s  # [N]
    xs, ys = [], []
    for j in range(n):
      shape = [-1] + [1] * len(x_bar[j].shape)
      cj = tf.reshape(c, shape)
      x_plus, y_plus = personalise(cj, x_bar[j][None], y_bar[j][None],
                                   state["rep_x"][j][None], state["rep_y"][j][None],
                                   self.model_rule)
      xs.append(x_plus)
      ys.append(y_plus)
    for j in range(n, len(x_bar)):  # BatchNorm statistics: x_bar for everyone
      xs.append(tf.repeat(x_bar[j][None], self.num_workers, axis=0))
    a = state["agg_weight"] / tf.reduce_sum(state["agg_weight"])
    model = [tf.tensordot(a, w, axes=1) for w in xs]
    new.update(model=model, x_bar=x_bar, x=xs, y=ys, u=u, s=s)
    return new


def public_data(data: FederatedData, fraction: float, seed: int):
  """(x, y, description) of the representation model's public set."""
  if data.public is not None:
    x, y = data.public
    return x, y, f"the task's public set ({len(y):,} samples, disjoint from the workers')"
  xs = np.concatenate([data.train[c][0] for c in data.client_ids])
  ys = np.concatenate([data.train[c][1] for c in data.client_ids])
  rng = seeds.generator(seed, "pfedmo_draws", 1)
  size = max(1, int(round(fraction * len(ys))))
  rows = np.sort(rng.choice(len(ys), size, replace=False))
  return xs[rows], ys[rows], (f"{size:,} samples drawn i.i.d. from the pooled training "
                              f"data (--public_fraction={fraction}; the task has no "
                              "public set, so it overlaps the workers' data)")


def scoring_inputs(data: FederatedData, size: int, seed: int) -> np.ndarray:
  """The scoring batch B: `size` inputs drawn once from the pooled test data."""
  xs = np.concatenate([data.test[c][0] for c in data.client_ids])
  if len(xs) == 0:
    raise ValueError("pfedmo needs test data for its scoring batch; the clients have none")
  rng = seeds.generator(seed, "pfedmo_draws", 2)
  rows = np.sort(rng.choice(len(xs), min(size, len(xs)), replace=False))
  return xs[rows]


class PFedMoDriver(driver.Driver):
  """pFedMo / FedNAG host side: every worker every round, keyed by its index.

  Per-round trace (trainable weights): `personalisation_gap` = ||x_+ - x_bar||,
  the quantity Theorem 2 bounds by 2 mu eta rho q^k pi; `rep_distance` =
  ||x_r - x_bar||, how far the workers' aggregate is from the representation
  model."""

  extra_columns = ("global_test_accuracy", "global_test_loss", "mean_score",
                   "personalisation_gap", "rep_distance")

  def __init__(self, context: driver.Context, definition: PFedMoDefinition):
    """pFedMo, or with a definition without representation model FedNAG (pi =
    0: every worker takes the plain aggregate)."""
    super().__init__(context, definition)
    options, data, config = self.options, self.data, self.config
    self.representation = definition.representation
    self.public_description = None
    self.rep_runner = None
    if self.representation:
      # The public set is drawn from every client's data on the host (with the
      # ray runner too, whose actors make their own shards).
      pooled = context.materialized  # the definition's read (its scoring batch)
      x, y, self.public_description = public_data(pooled, options.public_fraction, config.seed)
      public = FederatedData(["public"], {"public": (x, y)},
                             {"public": (x[:0], y[:0])}, data.num_classes,
                             description="public set")
      seed = seeds.int_seed(config.seed, "pfedmo_runner")
      # The representation model trains on the server's public set: on the
      # driver (the local runner) when the clients are on Ray actors.
      runner = config.runner
      rep = RunnerConfig("local" if runner.name == "ray" else runner.name, runner.jit,
                         runner.client_batching, runner.client_chunk)
      self.rep_runner = make_runner(rep, self.definition, self.model, public, seed,
                                    modes=("represent",))
    self._evaluator = None

  def describe(self):
    out = dict(self.runner.describe())
    if self.public_description:
      out["public_data"] = self.public_description
    return out

  def setup(self):
    self.state = self.runner.put_state(self.definition.initial_state(self.w0))
    return {"num_parameters": self.num_params}

  def run_round(self, round_num, sampled):
    if self.rep_runner is not None:
      rep = self.rep_runner.run("represent", self.state, [0], round_num,
                                self.config.local_work, self.config.lr_at(round_num))
      self.state = rep.state  # runners of one kind share the state's form
      if not np.isfinite(rep.summed["loss_sum"]):
        raise driver.Diverged(round_num, what="the representation model's loss")
    out = self.train_clients("train", self.state, sampled, round_num,
                             keys=[int(k) for k in sampled])
    self.state = out.state
    model_bytes = self.num_params * driver.BYTES_PER_PARAMETER
    trainable = int(sum(np.size(w) for w in self.w0[:self.definition.num_trainable]))
    n = len(sampled)
    # Down: x_{i+} and y_{i+} (and x_r and B for the score); up: x_i, y_i (and l_i).
    down = n * (model_bytes + trainable * driver.BYTES_PER_PARAMETER)
    up = n * (model_bytes + trainable * driver.BYTES_PER_PARAMETER)
    if self.representation:
      down += n * (model_bytes + self.definition.score_x.nbytes)
      up += n * driver.BYTES_PER_PARAMETER
    state = self._numpy()
    n_train = self.definition.num_trainable
    gap = _norm([a - b for a, b in zip(state["model"][:n_train], state["x_bar"][:n_train])])
    rep = _norm([a - b for a, b in zip(state["rep_x"][:n_train], state["x_bar"][:n_train])])
    return {"train_loss": float(out.summed["loss_sum"] / max(out.summed["num_examples"], 1.0)),
            "bytes_down": down, "bytes_up": up, "personalisation_gap": gap,
            "rep_distance": rep}

  def _numpy(self):
    return self.runner.numpy_state(self.state)

  def global_model(self):
    return list(self._numpy()["model"])

  def eval_models(self):
    state = self._numpy()
    models = [[w[i] for w in state["x"]] for i in range(self.data.num_clients)]
    return models, np.arange(self.data.num_clients)

  def round_eval_metrics(self, result):
    if self._evaluator is None:
      self._evaluator = self.make_evaluator()
    glob = self._evaluator.evaluate([self.global_model()],
                                    np.zeros(self.data.num_clients, np.int64))
    s = self._numpy()["s"]
    return {"global_test_accuracy": glob.accuracy, "global_test_loss": glob.loss,
            "mean_score": float(np.mean(s))}

  def summary(self):
    return {"public_data": self.public_description} if self.public_description else {}


def _norm(tensors) -> float:
  return float(np.sqrt(sum(float(np.sum(np.square(np.asarray(t, np.float64))))
                           for t in tensors)))


def definition(context: driver.Context) -> PFedMoDefinition:
  """pFedMo's definition, or FedNAG's where the options fix `representation`
  False (pi = 0, no representation model). Every client must hold training
  data and take part in every round."""
  options, config = context.options, context.config
  representation = bool(options.get("representation", True))
  name = "pfedmo" if representation else "fednag"
  data = context.need_data()
  if data.test_only().any():
    raise ValueError(f"{name} trains every client every round, but this task has "
                     f"{int(data.test_only().sum())} test-only clients; valid: a task "
                     "whose clients all hold training data")
  if config is not None and config.clients_per_round != data.num_clients:
    raise ValueError(f"invalid --clients_per_round={config.clients_per_round} for "
                     f"{name}: every worker takes part in every aggregation; valid: "
                     f"{data.num_clients} (the number of clients)")
  # The scoring batch is drawn from every client's data on the host (with the
  # ray runner too, whose actors make their own shards).
  pooled = context.materialized
  sizes = data.num_train_samples().astype(np.float64)
  weights = (sizes / sizes.sum() if options.agg_weights == "data"
             else np.full(data.num_clients, 1.0 / data.num_clients))
  seed = 0 if config is None else config.seed
  score_x = (scoring_inputs(pooled, options.score_batch, seed) if representation
             else np.zeros((1,) + pooled.train[data.client_ids[0]][0].shape[1:], np.float32))
  return PFedMoDefinition(context.weights_spec, context.num_trainable, data.num_clients,
                          weights, score_x, nag_momentum=options.nag_momentum,
                          pi=options.pfedmo_pi if representation else 0.0,
                          representation=representation,
                          model_rule=options.pfedmo_model if representation else "eq12",
                          solver=context.solver)
