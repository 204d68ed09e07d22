"""IFCA (Ghosh et al., "An Efficient Framework for Clustered Federated Learning", 2020).

Server state: K cluster models theta_j (stacked, leading dimension K = `--num_groups`).

Round: the server broadcasts all K models. Each sampled client i
  * estimates its cluster j_i = argmin_j F_i(theta_j), its mean loss on its own
    training batches (`--ifca_loss_batches`: the first B batches of the round's
    local schedule, 0 = all of them; with E local epochs every pass covers all
    of the client's data, so 0 gives the loss on its whole training set, as
    the authors' MNIST/CIFAR code; FedBase uses the first 3 batches);
    ties go to the lowest index;
  * runs its local work from theta_{j_i} and returns the update as its
    `ClusterMean` contribution in row j_i, so one federated sum gives every
    cluster's sums;
  * model averaging (IFCA's option II) per cluster: theta_j <- theta_j +
    sum_{i: j_i = j} a_i Delta_i / sum a_i, with a_i = 1 (`--ifca_agg=uniform`,
    the authors' MNIST/CIFAR code), the examples the client processed this
    round (`num_examples`, their FEMNIST code, which trains epochs) or its
    training samples (`samples`, FedBase's IFCA behind the WeCFL paper's rows;
    the two differ under `--local_steps`). A cluster no client chose keeps
    its model.

Initialisation (`--ifca_init`):
  random: K independent draws of the model's initializer (seeds derived from
    --seed); with `--ifca_init_dist=torch` each Dense and Conv2D kernel and
    bias is drawn from U(-1/sqrt(fan_in), 1/sqrt(fan_in)) instead, PyTorch's
    default `nn.Linear` start, which the authors' rotated-MNIST code
    (jichan3751/ifca 61e44b8, mnist/train_cluster_mnist.py `setup_models`)
    draws K times in a row from one seed (Keras's default MLP: Glorot
    kernels, about 2.2-2.4 times wider there, and zero biases);
  good_init: the authors' CIFAR `find_good_initializer`: redraw all K until
    every cluster is chosen by at least a fraction th of a client sample of
    the round's size (`--ifca_good_init_threshold`; the code's th is 0.35 for
    K = 2 and 0.1 for K = 4; for other K we use 0.4 / K), at most 100 draws
    (then the best draw, with a warning). The sample is drawn once for the
    check (the code draws a fresh sample for each attempt, and another for
    round 1).
  fedavg_warm: the authors' FEMNIST start: `--ifca_warm_rounds` rounds of
    FedAvg-style training of one model before round 1 (sampled clients, IFCA's
    averaging rule, fresh momentum buffers); every cluster model copies it
    except the last Dense layer (kernel and bias), which keeps cluster j's
    own random draw; then the first `--ifca_forced_rounds` rounds put the
    round's clients into K random groups of equal size (as equal as the count
    allows) instead of the argmin (`forced` mode), then IFCA proper. (Equal
    models would make every argmin tie and every client pick cluster 0.)
  kmeans_loss: FedJAX's HypCluster initialiser (`kmeans_init`): clients
    (`--ifca_init_clients`, default the round's size) each train the seeded
    start alone; a uniformly drawn one's model is the first centre, then the
    model of the client whose lowest loss over the centres so far is the
    largest, until K (a client may be chosen twice, as FedJAX's).

Evaluation (`--ifca_eval`):
  assigned (default): a client with training data is tested with the cluster
    model its training loss chose when it was last sampled; a client not
    sampled yet takes, at evaluation, the argmin of its mean loss on its whole
    training set over the K models (ties to the lowest index), untrained.
    FedBase, behind the WeCFL paper's IFCA rows, scores IFCA this way, and it
    is how WeCFL, FeSEM and CFL are scored (on their assignments).
  test_loss: every client takes the model of lowest loss on its own test data
    (the authors' protocol for their separate test machines; on clients that
    also train it chooses with the labels it is scored on).
  train_loss: every client with training data takes, at each evaluation, the
    argmin of its mean training loss over the K models (FedJAX's
    HypClusterEvaluator: assigned on the training split, scored on the test
    split).
  Test-only clients (no training data) always take their lowest-test-loss
  model. ARI and purity count the assigned choices of the clients with
  training data under either option; the group sizes count what groups.csv
  shows: those assigned choices (assigned), or every client's evaluated model
  (test_loss).

Server optimizer (`--server_optimizer`, not in the IFCA paper): each
cluster's own optimizer on its pseudo-gradient -(mean update of cluster j):
sgd at `--server_lr` (the default, 1.0, is the plain mean above) or FedOpt's
adam, yogi, adagrad (`--server_beta1`, `--server_beta2`, `--server_tau`;
`tff_cluster.algorithms.fedavg`), its state stacked per cluster
([K, ...], the server state's `server_opt_state`); a cluster no client chose
keeps its model and its optimizer state.
"""

from __future__ import annotations

import collections
import dataclasses
import time
import warnings
from typing import Dict, Optional

import numpy as np
import tensorflow as tf

from tff_cluster import seeds
from tff_cluster.host import driver
from tff_cluster.learning import evaluation
from tff_cluster.host.state import HostState
from tff_cluster import models
from tff_cluster.core import cluster_ops
from tff_cluster.core.aggregators import ClusterMean
from tff_cluster.core.definition import (ClientOutput, Definition, LocalSolver, UpdateParts,
                                         flat_norm)
from tff_cluster.learning import optimizers
from tff_cluster.algorithms.fedavg import fedavg
from tff_cluster.algorithms.fedavg.fedavg import SERVER_OPT_STATE
from tff_cluster.core.weighting import client_weight, with_weight_spec

# Shuffle seeds of the fedavg_warm pre-training rounds (apart from the run's rounds).
WARM_SHUFFLE_BASE = 2_000_000
KMEANS_SHUFFLE_BASE = 3_000_000  # kmeans_loss's training and losses (one schedule)
GOOD_INIT_ATTEMPTS = 100


def good_init_threshold(num_clusters: int, given: Optional[float]) -> float:
  """th of `good_init`: `given`, or when None (`--ifca_good_init_threshold`
  unset) the authors' 0.35 (K = 2) and 0.1 (K = 4); for other K 0.4 / K
  (ours: K = 4's share of a uniform split)."""
  if given is not None:
    return float(given)
  return {2: 0.35, 4: 0.1}.get(num_clusters, 0.4 / num_clusters)


def argmin_cluster(losses: tf.Tensor) -> tf.Tensor:
  """The cluster estimate: the lowest mean loss, ties to the lowest index."""
  return tf.argmin(losses, output_type=tf.int32)


def estimate_cluster(trainer, models, data, k: int, loss_batches: int):
  """IFCA's cluster estimate of a client: (argmin cluster, [K] mean losses)."""
  losses = cluster_ops.cluster_losses(trainer, models, data, k, loss_batches)
  return argmin_cluster(losses), losses


def select_cluster(trainer, selected, received, data, mode: str, k: int,
                   loss_batches: int, stacks=("models",), key=None):
  """A client's cluster and its start: (cluster, [K] losses, the cluster's
  row of each of `received`'s `stacks`, concatenated).

  forced: the cluster is the client's `key` and `selected` the database's
  row of it (losses 0); otherwise the argmin estimate over
  `received["models"]`, and in `assign` mode no rows.
  """
  if mode == "forced":
    return key, tf.zeros([k], tf.float32), list(selected)
  cluster, losses = estimate_cluster(trainer, list(received["models"]), data, k, loss_batches)
  if mode == "assign":
    return cluster, losses, []
  return cluster, losses, [tf.gather(w, cluster) for name in stacks for w in received[name]]


def assign_output(cluster, losses) -> ClientOutput:
  """The `assign` mode's client output: the choice, no training."""
  return ClientOutput(collections.OrderedDict(num_clients=tf.constant(1.0)),
                      collections.OrderedDict(cluster=cluster, losses=losses))


def _check_per_cluster(server_optimizer) -> None:
  """Refuses a server optimizer that reads the round's client lr (the round
  here has no one client lr per cluster)."""
  if server_optimizer is not None and server_optimizer.uses_client_lr:
    raise ValueError("a server optimizer that reads the round's client lr (SlowMo's) per "
                     "cluster; valid: sgd, heavy ball, adam, yogi, adagrad")


class IFCADefinition(Definition):
  """IFCA's round as plain TF functions (see the module docstring).

  State: `models`, each weight stacked [K, ...]. Modes:
    train: every client receives the K models, picks its cluster and trains it;
    assign: the same choice without training (the good_init check);
    forced: the client's key is its cluster (fedavg_warm's forced rounds).
  """

  modes = ("train", "assign", "forced")
  aggregation_slot = True

  def __init__(self, weights_spec, num_trainable: int, num_clusters: int, *,
               aggregation: str, loss_batches: int,
               server_optimizer: Optional[optimizers.Chain] = None,
               solver: LocalSolver = LocalSolver()):
    """`aggregation`: `--ifca_agg`; `loss_batches`: `--ifca_loss_batches`;
    `server_optimizer`: an `optimizers` chain applied per cluster to the
    pseudo-gradient -mean update of its trainable weights, with a state per
    cluster ([K, ...] stacks: HypCluster's, `--server_optimizer`'s); None:
    the mean update is added (model averaging)."""
    super().__init__(weights_spec, num_trainable, solver)
    _check_per_cluster(server_optimizer)
    self.k = int(num_clusters)
    self.aggregation = aggregation
    self.loss_batches = int(loss_batches)
    self.server_optimizer = server_optimizer

  def update_parts(self, mode):
    return None if mode == "assign" else UpdateParts(("update_sums",), "weight_sums")

  def with_server_optimizer(self, optimizer):
    _check_per_cluster(optimizer)
    return super().with_server_optimizer(optimizer)

  def initial_state(self, initial_weights):
    """`initial_weights`: one weight list per cluster (K lists of arrays), or
    one model's weight list (every cluster starts there: all argmins tie)."""
    models = cluster_ops.stack_models(initial_weights, self.k)
    state = collections.OrderedDict(models=models)
    if self.server_optimizer is not None:
      opt = self.server_optimizer
      flat = opt.flat_state(opt.init(models[:self.num_trainable]))
      if flat:
        state[SERVER_OPT_STATE] = [np.asarray(x) for x in flat]
    return state

  def num_keys(self, mode):
    return self.k if mode == "forced" else 0

  def database(self, state, mode):
    if mode != "forced":
      return None
    return list(state["models"])  # a list: TFF's select keeps a list's order

  def broadcast(self, state, params, mode):
    if mode == "forced":
      return collections.OrderedDict(lr=params["lr"])
    return collections.OrderedDict(models=list(state["models"]), lr=params["lr"])

  def client_state_spec(self, mode):
    if mode == "assign":
      return None
    return with_weight_spec(super().client_state_spec(mode),
                            "samples" if self.aggregation == "samples" else "processed")

  def client_work(self, trainer, selected, received, client_state, data, mode, key=None):
    cluster, losses, start = select_cluster(trainer, selected, received, data, mode, self.k,
                                            self.loss_batches, key=key)
    if mode == "assign":
      return assign_output(cluster, losses)
    out, new_state = self.local_update(trainer, start, data, received["lr"], client_state)
    if self.aggregation == "uniform":
      weight = tf.constant(1.0)
    else:
      weight = client_weight(out, client_state,
                             "samples" if self.aggregation == "samples" else "processed")
    update_sums, weight_sums = ClusterMean(self.k).client(cluster, out.delta, weight)
    summed = collections.OrderedDict(
        update_sums=update_sums,
        weight_sums=weight_sums, loss_sum=out.loss_sum, num_examples=out.num_examples,
        update_norm_sum=flat_norm(out.delta), num_clients=tf.constant(1.0))
    result = collections.OrderedDict(cluster=cluster, losses=losses, loss_sum=out.loss_sum)
    return ClientOutput(summed, result, new_state)

  def server_update(self, state, summed, mode):
    if mode == "assign":
      return state
    models = list(state["models"])
    means = ClusterMean.mean(summed["update_sums"], summed["weight_sums"],
                             [tf.zeros_like(w) for w in models])
    if self.server_optimizer is None:
      return collections.OrderedDict(models=[w + m for w, m in zip(models, means)])
    # Every optimizer here acts element by element, so one update of the
    # [K, ...] stacks is K clusters' updates; a cluster without clients keeps
    # its model and its optimizer state.
    n = self.num_trainable
    opt = self.server_optimizer
    old = list(state.get(SERVER_OPT_STATE, []))
    trainable, opt_state = opt.update([-m for m in means[:n]],
                                      opt.state_like(old, models[:n]), models[:n])
    has = summed["weight_sums"] > 0
    keep = lambda new, was: tf.where(tf.reshape(has, cluster_ops.row_shape(self.k, was)),
                                     new, was)
    out = collections.OrderedDict(models=[keep(t, w) for t, w in zip(trainable, models[:n])]
                                  + [w + m for w, m in zip(models[n:], means[n:])])
    if old:
      out[SERVER_OPT_STATE] = [keep(b, o) for b, o in zip(opt.flat_state(opt_state), old)]
    return out


@dataclasses.dataclass
class IFCAHost(HostState):
  """IFCA's host state: the cluster each client last trained (`assignment`,
  -1: never sampled), the generators of its set-up draws (`rng`) and of the
  forced rounds' groups (`forced_rng`), and its summary facts."""
  assignment: np.ndarray
  rng: np.random.Generator
  summary: Dict[str, object]
  forced_rng: np.random.Generator


class IFCADriver(driver.Driver):
  """K cluster models; each round's clients estimate their cluster and train it.

  groups.csv shows the model each client is scored with, a never-sampled
  client's argmin included (no -1 for "no assignment yet": the default
  `group_assignment`); in a round without evaluation a never-sampled client
  shows -1 (`round_models`)."""

  @classmethod
  def check(cls, context: driver.Context) -> None:
    super().check(context)
    driver.check_num_groups(context.options.num_groups, context.data)

  def __init__(self, context: driver.Context, definition: Definition):
    """`context.options`: IFCA's (a driver on IFCA's host side with options of
    its own maps them onto IFCA's, as HypCluster's does)."""
    super().__init__(context, definition)
    options, data, config = context.options, self.data, self.config
    num_groups = options.num_groups
    self.k = num_groups
    self.eval_mode = options.ifca_eval
    warm = options.ifca_init == "fedavg_warm"
    self.warm_rounds = int(options.ifca_warm_rounds) if warm else 0
    self.forced_rounds = int(options.ifca_forced_rounds) if warm else 0
    self.init = options.ifca_init
    self.threshold = good_init_threshold(num_groups, options.ifca_good_init_threshold)
    self.host = IFCAHost(
        assignment=np.full(data.num_clients, -1, np.int64),
        rng=seeds.generator(config.seed, "ifca_host"), summary={},
        forced_rng=seeds.generator(config.seed, "ifca_forced"))
    self._train_losses = None  # an Evaluator on the training data, made when needed
    self._scored = None  # the assigned choices of the latest evaluation
    self.extra_columns = (
        ["mean_update_norm", "num_assigned"] + self.group_columns(num_groups)
        + [f"group_{j}_round_clients" for j in range(num_groups)] + self.score_columns())

  def _draw(self, attempt: int):
    """K independent initializations, seeded by (--seed, attempt, cluster):
    the model's Keras initializers, or (`--ifca_init_dist=torch`) every Dense
    and Conv2D kernel and bias uniform in +-1/sqrt(fan_in)."""
    if self.options.get("ifca_init_dist", "keras") == "torch":
      built = self.model.model_fn()
      return [models.fan_in_uniform_weights(
          built, seeds.generator(self.config.seed, "ifca_init_torch", attempt, j))
          for j in range(self.k)]
    return [driver.initial_weights(
        self.model, seeds.int_seed(self.config.seed, "ifca_init", attempt, j)) for j in range(self.k)]

  def setup(self):
    t0 = time.perf_counter()
    state = self.definition.initial_state(self._draw(0))
    attempts = 1
    if self.init == "good_init" and self.k > 1:
      clients = driver.sample_clients(self.host.rng, self.data.training_clients(),
                                      self.config.clients_per_round)
      best, best_share = state, -1.0
      for attempt in range(GOOD_INIT_ATTEMPTS):
        if attempt:
          state = self.definition.initial_state(self._draw(attempt))
        out = self.train_clients("assign", state, clients, 0, persist=False)
        counts = np.bincount([int(r["cluster"]) for r in out.results], minlength=self.k)
        share = counts.min() / len(clients)
        attempts = attempt + 1
        if share > best_share:
          best, best_share = state, share
        if share >= self.threshold:
          break
      else:
        warnings.warn(f"IFCA good_init: no draw in {GOOD_INIT_ATTEMPTS} gave every cluster "
                      f">= {self.threshold:g} of the clients; using the best "
                      f"(smallest share {best_share:g})")
      state = best
      self.host.summary["good_init_smallest_share"] = float(best_share)
    if self.init == "fedavg_warm":
      state = self._warm_start(state)
    if self.init == "kmeans_loss":
      state = self._kmeans_loss_start()
    self.state = self.runner.put_state(state)
    self.host.summary.update(init=self.init, init_attempts=attempts,
                         init_seconds=time.perf_counter() - t0,
                         num_parameters=self.num_params)
    return {}

  def _warm_start(self, state):
    """fedavg_warm: `warm_rounds` rounds of one model (every client in cluster
    0 of a state whose clusters all hold w0), then every cluster copies it
    except the last Dense layer, which keeps its own draw."""
    single = self.definition.initial_state(self.w0)
    for i in range(self.warm_rounds):
      clients = driver.sample_clients(self.host.rng, self.data.training_clients(),
                                      self.config.clients_per_round)
      out = self.train_clients("forced", single, clients, 1, keys=np.zeros(len(clients)),
                               persist=False, shuffle_round=WARM_SHUFFLE_BASE + i)
      single = self.runner.numpy_state(out.state)
    keep = set(models.last_dense_indices(self.model.model_fn()))  # kernel, bias
    stacked = [np.asarray(w) for w in self.runner.numpy_state(state)["models"]]
    warm = [np.asarray(w)[0] for w in single["models"]]
    self.host.summary["warm_rounds"] = self.warm_rounds
    self.host.summary["forced_rounds"] = self.forced_rounds
    # The definition's own initial state of these K models (CFL-MGD's also
    # holds zero momentum buffers).
    return self.definition.initial_state(
        [[stacked[layer][j] if layer in keep else warm[layer] for layer in range(len(stacked))]
         for j in range(self.k)])

  def _kmeans_loss_start(self):
    """kmeans_loss (FedJAX's `kmeans_init`): `--ifca_init_clients` clients
    (default the round's size), drawn from the set-up generator, each train
    the seeded start w0 alone (the round's local work, fresh client states);
    centre 1 is the model of one of them drawn uniformly; each next centre is
    the model of the client whose lowest mean loss (on its training batches)
    over the centres so far is the largest (ties to the lowest client index;
    a client already chosen may be chosen again, as FedJAX's)."""
    count = min(int(self.options.ifca_init_clients or self.config.clients_per_round),
                self.data.num_training_clients)
    clients = driver.sample_clients(self.host.rng, self.data.training_clients(), count)
    single = self.definition.initial_state(self.w0)
    trained = []
    for i, c in enumerate(clients):  # one call per client: its model is the mean of one
      out = self.train_clients("forced", single, [c], 1, keys=[0], persist=False,
                               shuffle_round=KMEANS_SHUFFLE_BASE)
      trained.append([np.asarray(w)[0] for w in self.runner.numpy_state(out.state)["models"]])
    centres = [int(self.host.rng.integers(count))]
    while len(centres) < self.k:
      padded = [trained[c] for c in centres] + [trained[centres[0]]] * (self.k - len(centres))
      out = self.train_clients("assign", self.definition.initial_state(padded), clients, 1,
                               persist=False, shuffle_round=KMEANS_SHUFFLE_BASE)
      losses = np.stack([np.asarray(r["losses"]) for r in out.results])[:, :len(centres)]
      centres.append(int(np.argmax(losses.min(axis=1))))
    self.host.summary["kmeans_init_candidates"] = [self.data.client_ids[int(c)]
                                                   for c in clients]
    self.host.summary["kmeans_init_clients"] = [self.data.client_ids[int(clients[c])]
                                                for c in centres]
    return self.definition.initial_state([trained[c] for c in centres])

  def run_round(self, round_num, sampled):
    if round_num <= self.forced_rounds:
      groups = np.empty(len(sampled), np.int64)
      groups[self.host.forced_rng.permutation(len(sampled))] = np.arange(len(sampled)) % self.k
      out = self.train_clients("forced", self.state, sampled, round_num, keys=groups)
    else:
      out = self.train_clients("train", self.state, sampled, round_num)
    self.state = out.state
    clusters = np.array([int(r["cluster"]) for r in out.results])
    self.host.assignment[sampled] = clusters
    row = self.training_row(out.summed, len(sampled), models_down=self.k)
    row["num_assigned"] = int((self.host.assignment >= 0).sum())
    counts = np.bincount(clusters, minlength=self.k)
    row.update({f"group_{j}_round_clients": int(counts[j]) for j in range(self.k)})
    return row

  def _models(self):
    state = self.runner.numpy_state(self.state)
    return cluster_ops.unstack_models(state["models"], self.k)

  def eval_models(self):
    models = self._models()
    self._scored = self.assigned_models(models)
    if self.eval_mode == "test_loss":
      return models, evaluation.CHOOSE_BY_TEST_LOSS
    return models, self._scored

  def round_models(self):
    """After a round without evaluation: the cluster each client last trained,
    -1 for a client never sampled (its argmin over all clients is the
    evaluation's work: on a task of thousands of clients it costs more than
    the round)."""
    return self._models(), self.host.assignment.copy()

  def assigned_models(self, models) -> np.ndarray:
    """Each client's assigned model now: the cluster it last trained, or for a
    client with training data never sampled, the argmin of its mean training
    loss over `models` (ties to the lowest index); -1 for test-only clients
    (the evaluation lets them choose by test loss)."""
    out = self.host.assignment.copy()
    fresh = np.flatnonzero((out < 0) & (self.data.num_train_samples() > 0))
    if self.eval_mode == "train_loss":  # every client chooses now
      fresh = np.flatnonzero(self.data.num_train_samples() > 0)
    if len(fresh):
      if self._train_losses is None:
        self._train_losses = self.make_evaluator("train")
      losses = np.stack([self._train_losses.mean_losses(w)[fresh] for w in models])
      out[fresh] = np.argmin(losses, axis=0)
    return out

  def round_eval_metrics(self, result):
    tested = np.asarray(result.client_model)  # the model each client was tested with
    scored = self._scored if self._scored is not None else self.host.assignment
    # Group sizes count what groups.csv shows: the assigned choices, or under
    # test_loss the evaluation's.
    shown = tested if self.eval_mode == "test_loss" else scored
    # ARI and purity: the clients with an assigned model (never the test-only
    # clients' test-loss choices).
    return {**self.group_metrics(result, self.k, tested, shown),
            **self.cluster_scores(scored)}

  def summary(self):
    out = dict(self.host.summary)
    out["last_training_cluster"] = self.by_client(self.host.assignment)
    out["num_groups"] = self.k
    return out


def server_optimizer(options) -> Optional[optimizers.Chain]:
  """The per-cluster server optimizer `--server_optimizer` names (None: sgd
  at 1.0, the plain mean)."""
  return fedavg.per_cluster_server_optimizer(options)


def definition(context: driver.Context) -> IFCADefinition:
  """IFCA's definition from its options."""
  options = context.options
  return IFCADefinition(context.weights_spec, context.num_trainable, options.num_groups,
                        aggregation=options.ifca_agg, loss_batches=options.ifca_loss_batches,
                        server_optimizer=server_optimizer(options), solver=context.solver)
