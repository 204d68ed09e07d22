"""The host side of an algorithm (`Driver`) and the settings every algorithm
shares (`TrainingConfig`).

A driver owns its algorithm's `Definition`, the runner that executes it, and
whatever the host keeps between rounds (its typed `HostState`);
`tff_cluster.host.loop.run_training` and `tff_cluster.api` call it round by
round (`tff_cluster.host.round`). Algorithm modules build on this module (never on the
training loop above it).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_cluster import clustering
from tff_cluster.learning import schedule
from tff_cluster import models
from tff_cluster.data.federated import FederatedData, materialize
from tff_cluster.learning.evaluation import Evaluator, deployment
from tff_cluster.host.model_spec import ModelSpec
from tff_cluster.core import cluster_ops
from tff_cluster.core.definition import LocalSolver
from tff_cluster.spec.options import Options
from tff_cluster.host import privacy
from tff_cluster.host.state import HostState
from tff_cluster.runners.config import RunnerConfig
from tff_cluster.runners.factory import make_runner
from tff_cluster.spec import hparams as hp

BYTES_PER_PARAMETER = 4  # float32
# A run's settings by their flag names: the training settings every algorithm
# shares, then the runner's (the CLI's `--flags`; `TrainingConfig.checked`).
SETTINGS = tuple(d.name for d in (*hp.TRAINING, *hp.RUNNER_HPARAMS))
# The training settings without a default.
REQUIRED = ("rounds", "batch_size", "client_lr")


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
  """Hyper-parameters every algorithm shares (see `tff_cluster.spec.hparams.TRAINING`),
  and the runner that executes the run (`runner`, a `RunnerConfig`).

  Local work is `local_epochs` passes or `local_steps` mini-batch steps
  (exactly one of them). Round t's client learning rate is
  client_lr * lr_decay^(t-1). `clients_per_round` None: every client with
  training data (the API's, whose `next` is given its clients).
  """
  rounds: int
  clients_per_round: Optional[int]
  local_epochs: Optional[int]
  batch_size: int
  client_lr: float
  seed: int = 0
  eval_every: int = 1
  local_steps: Optional[int] = None
  lr_decay: float = 1.0
  client_momentum: float = 0.0
  client_state: str = "persist"
  divergence_ratio: float = 100.0
  aggregator: str = "mean"
  clip: float = 1.0
  noise_multiplier: float = 1.0
  dp_epsilon: float = 0.0
  dp_delta: float = 0.0
  clip_quantile: float = 0.5
  clip_lr: float = 0.2
  clip_count_stddev: float = 0.0
  trim_fraction: float = 0.1
  runner: RunnerConfig = RunnerConfig()

  def __post_init__(self):
    if (self.local_epochs is None) == (self.local_steps is None):
      raise ValueError("give exactly one of local_epochs and local_steps, got "
                       f"local_epochs={self.local_epochs}, local_steps={self.local_steps}")

  @classmethod
  def checked(cls, **values) -> "TrainingConfig":
    """The config of `values`, settings by their flag names (`SETTINGS`; None
    or absent: the declaration's default; `REQUIRED` ones must be given),
    each checked by its declaration, the runner's by `RunnerConfig.checked`.
    What the CLI and the API build a run's config with. Raises
    `hp.HParamError` (one line, in flag words), or ValueError when not
    exactly one of local_epochs and local_steps is given."""
    unknown = sorted(set(values) - set(SETTINGS))
    if unknown:
      raise hp.HParamError(f"unknown setting {unknown[0]!r}; valid: {', '.join(SETTINGS)}")
    training = {}
    for decl in hp.TRAINING:
      value = values.get(decl.name)
      if value is None and decl.name in REQUIRED:
        raise hp.HParamError(f"invalid --{decl.name}=None; valid: {decl.valid_text()}",
                             decl.valid_text(), decl, None)
      training[decl.name] = decl.check(decl.default if value is None else value)
    return cls(**training, runner=RunnerConfig.of_flags(values))

  @property
  def local_work(self) -> schedule.LocalWork:
    return schedule.LocalWork(self.batch_size, epochs=self.local_epochs,
                                    steps=self.local_steps)

  def lr_at(self, round_num: int) -> float:
    """The client learning rate of round `round_num` (1-based; 0 = set-up)."""
    return self.client_lr * self.lr_decay ** max(round_num - 1, 0)

  @property
  def persist_momentum(self) -> bool:
    return self.client_momentum > 0 and self.client_state == "persist"

  @property
  def solver(self) -> LocalSolver:
    """The clients' local solver (`--client_momentum`, `--client_state`)."""
    return LocalSolver(self.client_momentum, self.persist_momentum)


def initial_weights(model: ModelSpec, seed: int) -> List[np.ndarray]:
  """The seeded initialization (trainable then non-trainable) of `model`'s
  model (a `ModelSpec`, or a `TaskSpec`)."""
  tf.keras.utils.set_random_seed(seed)
  return models.get_weights(model.model_fn())


def model_layout(model: ModelSpec):
  """(weight specs, number of trainable weights) of `model`'s model (a
  `ModelSpec`, or a `TaskSpec`)."""
  built = model.model_fn()
  return models.weights_type_spec(built), len(built.trainable_variables)


@dataclasses.dataclass(frozen=True)
class Context:
  """What an algorithm is built from: its definition function reads it to
  make the `Definition`, and its driver is constructed with it.

  `model` the `ModelSpec` trained; `data` the clients (None where a
  definition is made without data: `tff_cluster.api.computations`); `config`
  the shared settings; `options` the algorithm's checked `Options`;
  `weights_spec` / `num_trainable` the model's weights (trainable first);
  `w0` the seeded initial weights; `solver` the clients' local solver.
  """
  model: ModelSpec
  data: Optional[FederatedData]
  config: Optional[TrainingConfig]
  options: Options
  weights_spec: Sequence[tf.TensorSpec]
  num_trainable: int
  w0: Sequence[np.ndarray]
  solver: LocalSolver = LocalSolver()

  @classmethod
  def of(cls, model, data, config: TrainingConfig, options: Options,
         w0: Optional[Sequence[np.ndarray]] = None) -> "Context":
    """The context of `model` (a `ModelSpec` or a `TaskSpec`) on `data`:
    the model built once for its layout, and once under `config.seed` for
    `w0` unless given; the data materialized where the runner holds it in this process
    (the ray runner's actors make their own clients)."""
    model = ModelSpec.of(model)
    if config.runner.name != "ray":
      data = materialize(data)
    specs, num_trainable = model_layout(model)
    if w0 is None:
      w0 = initial_weights(model, config.seed)
    return cls(model, data, config, options, specs, num_trainable,
               [np.array(w) for w in w0], config.solver)

  @functools.cached_property
  def materialized(self) -> FederatedData:
    """`need_data()` held in this process, read once whoever asks first (a
    definition and its driver that both read every client's data on the host
    share the one read; the ray runner's `data` stays lazy)."""
    return materialize(self.need_data())

  def need_data(self) -> FederatedData:
    """`data`, or a one-line refusal where the definition is made without."""
    if self.data is None:
      raise ValueError(f"{self.options.algo}'s definition is made from the data; valid: "
                       "build it with data (tff_cluster.api.build(..., runner='tff'))")
    return self.data


class Driver:
  """The host side of an algorithm: what happens between the runner's calls.

  A driver owns its algorithm's `Definition`, the runner that executes it
  (`config.runner`), what the host keeps between rounds (`host`, a
  `HostState`: e.g. each client's group) and the clients' states
  (`client_states`, the runner's `ClientStateStore`). The loop calls:

  `setup()` once before round 1 (e.g. cold start; returns summary extras);
  `run_round()` per round on the sampled clients (returns at least
  `train_loss`, `bytes_down`, `bytes_up`); `eval_models()` for the candidate
  weights and which one each client would receive now (`round_models()`
  after a round that is not evaluated); `round_eval_metrics()`
  for algorithm metrics at evaluation time; `summary()` at the end.
  `extra_columns` names its additional per-round metrics.

  A checkpoint keeps `state`, `client_states` and `host` whole.
  """
  extra_columns: Sequence[str] = ()
  state: Any = None
  # What of this algorithm needs one label per example (a phrase, e.g.
  # "tests each client with several models' outputs combined"), or "": a
  # sequence loss (a label per position) is refused where it is set.
  label_per_example: str = ""
  # What of this algorithm's host reads each client's update (or data
  # summary) and lets it shape other clients' models (a phrase), or "": such
  # an algorithm refuses every `--aggregator` but mean (docs/privacy.md).
  individual_updates: str = ""
  # Why this algorithm's rounds are not one release each of the mechanism
  # the privacy account counts (a phrase), or "": refuses a private
  # `--aggregator` (dp_fixed, dp_adaptive) only.
  not_one_release: str = ""

  @classmethod
  def check(cls, context: Context) -> None:
    """Refuses, with a `ValueError` of one line, options this driver cannot
    run on the context's data and settings. The registry calls it before
    the definition and the runner are made (a refused run starts no TFF
    worker and no Ray); a subclass extends it (`super().check(context)`)."""
    if cls.label_per_example and context.model.loss == models.SEQUENCE_CE_LOGITS:
      raise ValueError(
          f"--algo={context.options.algo} {cls.label_per_example}, which needs one label "
          f"per example; loss {models.SEQUENCE_CE_LOGITS!r} has a label per sequence "
          "position; valid: an algorithm that tests each client with one model and reads "
          "no per-class statistics (e.g. fedavg, fedprox, ifca, fedgroup)")

  def __init__(self, context: Context, definition):
    """`context`: the model, data, settings, options and initial weights
    (`Context.of`); `definition`: the algorithm's `Definition`, made from the
    same context. The driver keeps the seeded initial weights `w0` and the
    model's size `num_params`; its host state starts empty (a subclass sets
    its own)."""
    self.host = HostState()
    self.model, self.data, self.config = context.model, context.data, context.config
    self.options = context.options
    model, data, config = self.model, self.data, self.config
    self.definition = definition
    self.w0 = [np.asarray(w) for w in context.w0]
    self.num_params = int(sum(np.size(w) for w in self.w0))
    self.runner = make_runner(config.runner, definition, model, data, config.seed)
    # Per-client states, keyed by `state_key_offset + client index`, where
    # the runner keeps them (in memory, or with the ray runner's actors).
    self.client_states = self.runner.client_store()
    self.state_key_offset = 0
    self._fresh_client_states: Dict[str, Any] = {}

  def make_evaluator(self, split: str = "test") -> Evaluator:
    """An evaluator of every client's `split`: the runner's (in this process,
    or in the ray runner's actors)."""
    return self.runner.make_evaluator(split)

  def group_assignment(self) -> Optional[np.ndarray]:
    """Each client's group for groups.csv to mask: its clients with a group
    < 0 (in no group yet, e.g. FedGroup's, tested with the auxiliary model)
    show -1; None: no mask (the default)."""
    return None

  # -- shared helpers for the rows of clustered algorithms -----------------------

  def group_columns(self, k: int) -> List[str]:
    """`group_<j>_accuracy` then `group_<j>_size` for j < k."""
    return ([f"group_{j}_accuracy" for j in range(k)]
            + [f"group_{j}_size" for j in range(k)])

  def score_columns(self) -> List[str]:
    """`ari` and `purity` when the task knows its true clusters."""
    return ["ari", "purity"] if self.data.true_clusters is not None else []

  def cluster_scores(self, chosen: np.ndarray) -> Dict[str, float]:
    """ARI and purity of `chosen` (a group per client) against the true
    clusters, over the clients with a group (>= 0); {} when there is none."""
    truth = self.data.true_clusters
    known = np.asarray(chosen) >= 0
    if truth is None or not known.any():
      return {}
    chosen = np.asarray(chosen)
    return {"ari": clustering.adjusted_rand_index(truth[known], chosen[known]),
            "purity": clustering.purity(truth[known], chosen[known])}

  def group_metrics(self, result, k: int, tested, members) -> Dict[str, float]:
    """Per group j: the accuracy of the clients `tested` with model j and the
    size, the clients whose entry of `members` is j."""
    members = np.asarray(members)
    out = {}
    for j in range(k):
      out[f"group_{j}_accuracy"] = result.group_accuracy(tested, j)
      out[f"group_{j}_size"] = int((members == j).sum())
    return out

  def training_row(self, summed, num_sampled: int, models_down: float = 1,
                   models_up: float = 1, weight_key: str = "num_examples") -> Dict[str, Any]:
    """`train_loss` (summed loss / summed `weight_key`), `mean_update_norm`
    (when the definition sums `update_norm_sum`) and the bytes a round moves:
    each sampled client receives `models_down` and sends `models_up` models."""
    model_bytes = self.num_params * BYTES_PER_PARAMETER
    row: Dict[str, Any] = {
        "train_loss": float(summed["loss_sum"] / max(summed[weight_key], 1.0))}
    if "update_norm_sum" in summed:
      row["mean_update_norm"] = float(summed["update_norm_sum"] / summed["num_clients"])
    row["bytes_down"] = int(num_sampled * models_down * model_bytes)
    row["bytes_up"] = int(num_sampled * models_up * model_bytes)
    return row

  def describe(self) -> Dict[str, Any]:
    """Runner facts for `config.json` (runner, device, jit)."""
    return self.runner.describe()

  def train_clients(self, mode: str, state, clients: Sequence[int], round_num: int,
                    keys: Optional[Sequence[int]] = None,
                    work: Optional[schedule.LocalWork] = None,
                    persist: bool = True, shuffle_round: Optional[int] = None):
    """One runner call; threads the clients' persistent states.

    `persist=False` runs with fresh client states and keeps none (e.g. a
    cold start's pre-training). The clients' data shuffles are seeded by
    `shuffle_round` (default `round_num`), the learning rate is round_num's.
    """
    states, store_args = None, {}
    if self.definition.client_state_spec(mode) is not None:
      skeys = [self.state_key_offset + int(k) for k in clients]

      def fresh(i):  # the i-th client's state before it has one
        return self.fresh_client_state(mode, int(clients[i]))
      if persist:
        states, store_args = self.client_states.lend(skeys, fresh)
      else:
        states = [fresh(i) for i in range(len(skeys))]
    out = self.runner.run(mode, state, clients,
                          round_num if shuffle_round is None else shuffle_round,
                          work or self.config.local_work,
                          self.config.lr_at(round_num), keys=keys, client_states=states,
                          **store_args)
    bad = [self.data.client_ids[int(k)] for k, r in zip(clients, out.results)
           if not _all_finite(r)]
    if bad or not _all_finite(out.summed):
      raise Diverged(round_num, bad or None)
    if states is not None and persist:
      self.client_states.keep(skeys, out.client_states)
    return out

  def fresh_client_state(self, mode: str, client: int):
    """Client `client`'s state before it has one of its own: the definition's
    initial client state, with the client's number of training samples as
    `weight` where the definition's client state has one."""
    # One set of initial arrays per mode, shared by every new client (states
    # are never changed in place), so a runner stacks them once.
    fresh = self._fresh_client_states
    if mode not in fresh:
      fresh[mode] = self.definition.initial_client_state(mode)
    state = tf.nest.map_structure(lambda a: a, fresh[mode])
    if isinstance(state, dict) and "weight" in state:
      state = collections.OrderedDict(state)
      state["weight"] = np.float32(self.data.num_train_samples()[client])
    return state

  def snapshot(self) -> Dict[str, Any]:
    """The driver's state now, cheaply: server and client states are never
    changed in place (each round makes new ones), so references suffice
    (where the workers hold the client states, they keep the references);
    the host state is copied."""
    return {"state": self.state, "client_states": self.client_states.snapshot(),
            "host": self.host.copy()}

  def snapshot_numpy(self, snapshot: Dict[str, Any]) -> Dict[str, Any]:
    """`snapshot` as a checkpoint stores it: every tensor a numpy array, the
    host state a dict by checkpoint key. Its `client_states` has `items()`
    and `len()`: a dict, or (the workers' states) one that reads them back
    in chunks."""
    return {"state": None if snapshot["state"] is None else
            self.runner.numpy_state(snapshot["state"]),
            "client_states": self.client_states.numpy_items(snapshot["client_states"]),
            "host": snapshot["host"].to_dict()}

  def restore(self, snapshot: Dict[str, Any]) -> None:
    """Puts the driver back into a `snapshot_numpy` state (no set-up runs);
    its client states may be a snapshot of the driver's store, or any (key,
    state) pairs with `items()` (a checkpoint's, read client by client)."""
    self.state = self.runner.put_state(snapshot["state"])
    self.client_states.restore(snapshot["client_states"])
    self.host = self.host.restored(snapshot["host"])

  def setup(self) -> Dict[str, Any]:
    return {}

  def run_round(self, round_num: int, sampled: np.ndarray) -> Dict[str, Any]:
    raise NotImplementedError

  def eval_models(self):
    raise NotImplementedError

  def round_models(self):
    """The models and each client's model after a round that is not
    evaluated (the divergence check and groups.csv read them): by default
    `eval_models()`. A driver whose `eval_models` computes a choice for every
    client not yet assigned (IFCA's argmin over the candidates) returns -1 for
    those here, so that a round without evaluation does not pay for it."""
    return self.eval_models()

  def round_eval_metrics(self, result) -> Dict[str, Any]:
    del result
    return {}

  def summary(self) -> Dict[str, Any]:
    return {}

  def by_client(self, groups) -> Dict[str, int]:
    """summary.json's form of a per-client group (or cluster) array:
    {client id: group}, in the data's client order."""
    return {cid: int(g) for cid, g in zip(self.data.client_ids, groups)}


class HostModelsDriver(Driver):
  """The driver of a `core.definition.HostModelsDefinition`: K =
  `--num_groups` models whose rounds the host computes (CFL-GP, FedGWC); its
  host state holds each client's cluster (`assignment`, -1: none) and the
  summary's facts (`summary`). Each client is tested with its cluster's model
  (`eval_models`: a test-only client, -1, chooses by its own test loss)."""

  @classmethod
  def check(cls, context: Context) -> None:
    super().check(context)
    check_num_groups(context.options.num_groups, context.data)

  def __init__(self, context: Context, definition):
    super().__init__(context, definition)
    self.k = int(context.options.num_groups)

  def host_models(self) -> List[List[np.ndarray]]:
    """The K models, a weight list each."""
    return cluster_ops.unstack_models(self.runner.numpy_state(self.state)["models"], self.k)

  def eval_models(self):
    return self.host_models(), self.host.assignment.copy()

  def round_eval_metrics(self, result):
    assigned = self.host.assignment
    return {**self.group_metrics(result, self.k, np.asarray(result.client_model), assigned),
            **self.cluster_scores(assigned)}

  def summary(self):
    out = dict(self.host.summary)
    out["final_assignment"] = self.by_client(self.host.assignment)
    out["num_groups"] = self.k
    return out


class Diverged(RuntimeError):
  """A non-finite loss, update or model in round `round_num` (0 = set-up), or
  (`detail`) a training loss past the `--divergence_ratio` limit."""

  def __init__(self, round_num: int, clients: Optional[Sequence[str]] = None,
               what: str = "a client update or loss", detail: Optional[str] = None):
    self.round_num = round_num
    self.clients = list(clients) if clients else []
    where = f" (clients {', '.join(map(str, self.clients[:10]))}" + \
        (f" and {len(self.clients) - 10} more)" if len(self.clients) > 10 else ")") \
        if self.clients else ""
    stage = "the set-up (cold start)" if round_num == 0 else f"round {round_num}"
    super().__init__(f"diverged in {stage}: " +
                     (detail if detail is not None else f"{what} is NaN or infinite{where}"))


class LossRatio:
  """The divergence rule: a round's training loss over the initial model's
  loss on the round's clients.

  The initial model (`w0`, the run's seeded start) is evaluated on a
  client's training data the first time the client is in a round (each
  client alone, so its loss does not depend on which clients came with it);
  a round's reference is the mean of those losses over the round's clients,
  weighted by their training samples. `check` returns the ratio and raises
  `Diverged` above `limit` (0: never). `seconds`: the time its evaluations
  took so far.
  """

  def __init__(self, model: ModelSpec, data: FederatedData, w0, limit: float,
               evaluator: Optional[Evaluator] = None):
    self.limit = limit
    self._sizes = data.num_train_samples().astype(np.float64)
    if evaluator is None:
      evaluator = Evaluator(model.model_fn, model.loss, data, split="train")
    self._evaluator, self._w0 = evaluator, w0
    self._initial = np.full(len(self._sizes), np.nan)
    self._known = np.zeros(len(self._sizes), bool)
    self.seconds = 0.0

  def reference(self, clients) -> float:
    clients = np.asarray(clients)
    new = np.unique(clients[~self._known[clients]])
    if len(new):
      start = time.perf_counter()
      self._initial[new] = self._evaluator.mean_losses(self._w0, clients=new)
      self._known[new] = True
      self.seconds += time.perf_counter() - start
    sizes = self._sizes[clients]
    return float(np.dot(sizes, self._initial[clients]) / sizes.sum())

  def check(self, round_num: int, train_loss: float, clients) -> float:
    reference = self.reference(clients)
    ratio = float(train_loss) / reference
    if self.limit > 0 and ratio > self.limit:
      raise Diverged(round_num, detail=(
          f"the training loss {float(train_loss):.4g} is {ratio:.4g} times the initial "
          f"model's loss on the round's clients ({reference:.4g}), above "
          f"--divergence_ratio={self.limit:g}"))
    return ratio


def _all_finite(structure) -> bool:
  for leaf in tf.nest.flatten(structure):
    value = np.asarray(leaf)
    if value.dtype.kind == "f" and not np.isfinite(value).all():
      return False
  return True


def with_mechanism(definition, host, context: Context):
  """`definition` with the aggregator the run's `--aggregator` names
  (`privacy.mechanism_for`; itself for mean)."""
  return privacy.mechanism_for(definition, host, context.config, context.data,
                               context.options.algo)


def sample_clients(rng: np.random.Generator, num_clients, clients_per_round: int
                   ) -> np.ndarray:
  """`clients_per_round` distinct clients, sorted: drawn from range(num_clients),
  or from `num_clients` itself when it is an array of candidate indices (the
  clients with training data)."""
  if np.ndim(num_clients) == 0:
    return np.sort(rng.choice(num_clients, clients_per_round, replace=False))
  # (With every client a candidate this is the same draw as from range(n).)
  candidates = np.asarray(num_clients)
  return np.sort(candidates[rng.choice(len(candidates), clients_per_round, replace=False)])


def check_num_groups(num_groups: int, data: FederatedData) -> None:
  """Refuses a `--num_groups` outside 1..(clients with training data): test-only
  clients are never trained or clustered."""
  training = data.num_training_clients
  if not 1 <= num_groups <= training:
    raise ValueError(f"invalid --num_groups={num_groups}; valid: 1..{training} "
                     "(at most the number of clients with training data)")


def client_groups(client_model, chosen, assignment, num_clients: int
                  ) -> Optional[np.ndarray]:
  """Each client's group/model index this round, for groups.csv; -1: none.

  `client_model` is what `Driver.eval_models` returned: indices, where a
  driver that keeps an `assignment` with -1 for clients in no group yet (e.g.
  FedGroup, whose eval_models tests them with the auxiliary model) gives -1
  for those; a rule: what its `Deployment.groups` says (`CHOOSE_BY_TEST_LOSS`:
  `chosen`, the evaluation's choice, None on a round without evaluation: not
  known; an ensemble or a mixture: -1 for everyone).
  """
  return deployment(client_model).groups(chosen, assignment, num_clients)
