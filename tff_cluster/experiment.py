"""The training loop shared by every algorithm: sample, train, evaluate, record.

An algorithm module provides a *driver* (see `Driver`): the host-side logic
around its `Definition`, executed by a runner (`tff_cluster.runners`). The
loop here is algorithm- and runner-agnostic.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import io
import os
import signal
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_cluster import local_training
from tff_cluster.data.federated import FederatedData
from tff_cluster.evaluation import CHOOSE_BY_TEST_LOSS, Evaluator  # noqa: F401 (re-exported)
from tff_cluster.results import ResultsWriter, summarize
from tff_cluster.task import TaskSpec

BYTES_PER_PARAMETER = 4  # float32

BASE_COLUMNS = ("round", "train_loss", "loss_ratio", "test_accuracy", "test_loss",
                "test_accuracy_clientavg", "test_macro_f1", "round_seconds",
                "eval_seconds", "bytes_down", "bytes_up")


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
  """Hyper-parameters every algorithm shares (see `tff_cluster.hparams.TRAINING`).

  Local work is `local_epochs` passes or `local_steps` mini-batch steps
  (exactly one of them). Round t's client learning rate is
  client_lr * lr_decay^(t-1). `runner` is 'local' or 'tff'; `jit` applies to
  the local runner.
  """
  rounds: int
  clients_per_round: int
  local_epochs: Optional[int]
  batch_size: int
  client_lr: float
  seed: int = 0
  eval_every: int = 1
  local_steps: Optional[int] = None
  lr_decay: float = 1.0
  client_momentum: float = 0.0
  client_state: str = "persist"
  runner: str = "local"
  jit: str = "auto"
  divergence_ratio: float = 100.0

  def __post_init__(self):
    if (self.local_epochs is None) == (self.local_steps is None):
      raise ValueError("give exactly one of local_epochs and local_steps, got "
                       f"local_epochs={self.local_epochs}, local_steps={self.local_steps}")

  @property
  def local_work(self) -> local_training.LocalWork:
    return local_training.LocalWork(self.batch_size, epochs=self.local_epochs,
                                    steps=self.local_steps)

  def lr_at(self, round_num: int) -> float:
    """The client learning rate of round `round_num` (1-based; 0 = set-up)."""
    return self.client_lr * self.lr_decay ** max(round_num - 1, 0)

  @property
  def persist_momentum(self) -> bool:
    return self.client_momentum > 0 and self.client_state == "persist"


def client_seed(seed: int, round_num: int, client_index: int) -> int:
  """Seed of one client's data shuffle in one round (stable, collision-free)."""
  return int(np.random.SeedSequence([seed, round_num, client_index])
             .generate_state(1)[0] & 0x7FFFFFFF)


def initial_weights(task: TaskSpec, seed: int) -> List[np.ndarray]:
  """The model's seeded initialization (trainable then non-trainable)."""
  tf.keras.utils.set_random_seed(seed)
  return local_training.get_weights(task.model_fn())


def model_layout(task: TaskSpec):
  """(weight specs, number of trainable weights) of the task's model."""
  model = task.model_fn()
  return local_training.weights_type_spec(model), len(model.trainable_variables)


class Driver:
  """The host side of an algorithm: what happens between the runner's calls.

  A driver owns its algorithm's `Definition`, the runner that executes it
  (`config.runner`), and whatever the host keeps between rounds (e.g. each
  client's group, its per-client state). The loop calls:

  `setup()` once before round 1 (e.g. cold start; returns summary extras);
  `run_round()` per round on the sampled clients (returns at least
  `train_loss`, `bytes_down`, `bytes_up`); `eval_models()` for the candidate
  weights and which one each client would receive now; `round_eval_metrics()`
  for algorithm metrics at evaluation time; `summary()` at the end.
  `extra_columns` names its additional per-round metrics.
  """
  extra_columns: Sequence[str] = ()
  # groups.csv: -1 for clients whose `assignment` is < 0 (e.g. FedGroup's
  # clients in no group yet, tested with the auxiliary model).
  groups_mask_unassigned = True
  # Host attributes a checkpoint keeps besides `state` and `client_states`
  # (e.g. assignments, random generators): whatever cannot be recomputed.
  checkpoint_attrs: Sequence[str] = ()
  state: Any = None

  def __init__(self, task: TaskSpec, data: FederatedData, config: TrainingConfig,
               make_definition):
    """`make_definition(weight_specs, num_trainable, momentum=..., persist_momentum=...)`
    builds the algorithm's `Definition` for the task's model and the config's
    local solver. The driver keeps the seeded initial weights `w0` and the
    model's size `num_params`."""
    from tff_cluster import runners
    self.task = task
    self.data = data
    self.config = config
    specs, num_trainable = model_layout(task)
    definition = make_definition(specs, num_trainable, momentum=config.client_momentum,
                                 persist_momentum=config.persist_momentum)
    self.definition = definition
    self.w0 = initial_weights(task, config.seed)
    self.num_params = int(sum(np.size(w) for w in self.w0))
    self.runner = runners.make_runner(config.runner, definition, task.model_fn,
                                      task.loss, data, config.seed, config.jit)
    self.client_states: Dict[int, Any] = {}
    self._fresh_client_states: Dict[str, Any] = {}

  def describe(self) -> Dict[str, Any]:
    """Runner facts for `config.json` (runner, device, jit)."""
    return self.runner.describe()

  def train_clients(self, mode: str, state, clients: Sequence[int], round_num: int,
                    keys: Optional[Sequence[int]] = None,
                    work: Optional[local_training.LocalWork] = None,
                    persist: bool = True, shuffle_round: Optional[int] = None):
    """One runner call; threads the clients' persistent states.

    `persist=False` runs with fresh client states and keeps none (e.g. a
    cold start's pre-training). The clients' data shuffles are seeded by
    `shuffle_round` (default `round_num`), the learning rate is round_num's.
    """
    states = None
    if self.definition.client_state_spec(mode) is not None:
      states = [self.client_states[int(k)] if persist and int(k) in self.client_states
                else self.fresh_client_state(mode, int(k)) for k in clients]
    out = self.runner.run(mode, state, clients,
                          round_num if shuffle_round is None else shuffle_round,
                          work or self.config.local_work,
                          self.config.lr_at(round_num), keys=keys, client_states=states)
    bad = [self.data.client_ids[int(k)] for k, r in zip(clients, out.results)
           if not _all_finite(r)]
    if bad or not _all_finite(out.summed):
      raise Diverged(round_num, bad or None)
    if states is not None and persist:
      for k, new in zip(clients, out.client_states):
        self.client_states[int(k)] = new
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
    changed in place (each round makes new ones), so references suffice;
    mutable host attributes are copied."""
    return {"state": self.state, "client_states": dict(self.client_states),
            "host": {name: copy.deepcopy(getattr(self, name))
                     for name in self.checkpoint_attrs}}

  def snapshot_numpy(self, snapshot: Dict[str, Any]) -> Dict[str, Any]:
    """`snapshot` with every tensor as a numpy array (what a checkpoint stores)."""
    from tff_cluster.runners import to_numpy
    return {"state": None if snapshot["state"] is None else
            self.runner.numpy_state(snapshot["state"]),
            "client_states": {k: to_numpy(v) for k, v in snapshot["client_states"].items()},
            "host": snapshot["host"]}

  def restore(self, snapshot: Dict[str, Any]) -> None:
    """Puts the driver back into a `snapshot_numpy` state (no set-up runs)."""
    self.state = self.runner.put_state(snapshot["state"])
    self.client_states = dict(snapshot["client_states"])
    for name, value in snapshot["host"].items():
      setattr(self, name, copy.deepcopy(value))

  def setup(self) -> Dict[str, Any]:
    return {}

  def run_round(self, round_num: int, sampled: np.ndarray) -> Dict[str, Any]:
    raise NotImplementedError

  def eval_models(self):
    raise NotImplementedError

  def round_eval_metrics(self, result) -> Dict[str, Any]:
    del result
    return {}

  def summary(self) -> Dict[str, Any]:
    return {}


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

  The initial model (`w0`, the run's seeded start) is evaluated once on every
  client's training data; a round's reference is the mean of those losses over
  the round's clients, weighted by their training samples. `check` returns the
  ratio and raises `Diverged` above `limit` (0: never).
  """

  def __init__(self, task: TaskSpec, data: FederatedData, w0, limit: float):
    self.limit = limit
    self._sizes = data.num_train_samples().astype(np.float64)
    self._initial = Evaluator(task.model_fn, task.loss, data, split="train").mean_losses(w0)

  def reference(self, clients) -> float:
    clients = np.asarray(clients)
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


_STOP_SIGNAL = {"signum": None}


def note_stop_signal(signum: Optional[int]) -> None:
  """Records that a stop signal arrived (the CLI's handlers call this; None
  clears it): a run
  that then fails with any exception is summarised as interrupted, since the
  handler's exception may surface transformed by the code it interrupted."""
  _STOP_SIGNAL["signum"] = signum


def _stop_if_signalled() -> None:
  """Raises what a recorded stop signal's handler raised (KeyboardInterrupt for
  SIGINT, SystemExit(128 + signum) otherwise), in case code it interrupted (for
  instance TFF's asyncio execution) swallowed that exception and carried on."""
  signum = _STOP_SIGNAL["signum"]
  if signum is None:
    return
  if signum == signal.SIGINT:
    raise KeyboardInterrupt
  raise SystemExit(128 + signum)


def run_training(task: TaskSpec, data: FederatedData, config: TrainingConfig,
                 driver: Driver, writer: Optional[ResultsWriter] = None,
                 progress: bool = True, checkpoint_dir: Optional[str] = None,
                 checkpoint_every: int = 10, resume: Optional[Dict[str, Any]] = None,
                 models_dir: Optional[str] = None) -> Dict[str, Any]:
  """Runs rounds up to `config.rounds`; returns the summary (also written to disk).

  Args:
    task, data, config, driver: what to run.
    writer: where rows, summary and plots go (None: nowhere).
    progress: show a progress bar.
    checkpoint_dir: the run directory whose `checkpoints/` receive the run
      state after the set-up, every `checkpoint_every` rounds and at the end
      (None: no checkpoints).
    resume: a checkpoint payload (`checkpoint.load_latest`) to continue from:
      the driver, the sampling generator, the rows and the best models are
      restored and the set-up is not run again.
    models_dir: where the final and best-round models are saved (None: not).

  A NaN or infinite loss, update or model raises `Diverged` after the last
  good state is checkpointed and the summary says `"reason": "diverged"`.
  """
  from tff_cluster import checkpoint

  evaluator = Evaluator(task.model_fn, task.loss, data)
  loss_ratio = LossRatio(task, data, driver.w0, config.divergence_ratio)
  trainable = data.training_clients()
  if config.clients_per_round > len(trainable):
    raise ValueError(f"invalid --clients_per_round={config.clients_per_round}: "
                     f"{len(trainable)} clients have training data; valid: "
                     f"1..{len(trainable)}")
  start = time.perf_counter()
  rng = np.random.default_rng(np.random.SeedSequence([config.seed, 7]))
  rows: List[Dict[str, Any]] = []
  extras: Dict[str, Any] = {}
  best: Optional[Dict[str, Any]] = None
  first_round = 1
  setup_seconds = 0.0
  last_choice = None
  status: Dict[str, Any] = {"completed": False, "reason": "interrupted"}

  def save_checkpoint(round_num, snapshot, sampling_rng):
    if checkpoint_dir is None:
      return
    checkpoint.save(checkpoint_dir, round_num, {
        "driver": driver.snapshot_numpy(snapshot), "sampling_rng": sampling_rng,
        "rows": rows, "extras": extras, "best": best, "setup_seconds": setup_seconds})
    if writer is not None:  # a killed run's summary says so
      writer.write_summary(dict(summarize(rows, config.rounds), completed=False,
                                reason="running", checkpoint_round=round_num))

  if resume is not None:
    driver.restore(resume["driver"])
    rng = resume["sampling_rng"]
    rows = list(resume["rows"])
    extras = dict(resume["extras"])
    best = resume["best"]
    setup_seconds = resume["setup_seconds"]
    first_round = resume["round"] + 1
  bar = None
  if progress:
    from tqdm import tqdm
    bar = tqdm(total=config.rounds, initial=first_round - 1, desc=f"{task.name}",
               unit="round", dynamic_ncols=True)
  try:
    if resume is None:
      setup_start = time.perf_counter()
      extras = driver.setup() or {}
      setup_seconds = time.perf_counter() - setup_start
      save_checkpoint(0, driver.snapshot(), rng)
    for round_num in range(first_round, config.rounds + 1):
      good, good_rng = driver.snapshot(), copy.deepcopy(rng)
      sampled = sample_clients(rng, trainable, config.clients_per_round)
      t0 = time.perf_counter()
      row: Dict[str, Any] = {"round": round_num}
      try:
        row.update(driver.run_round(round_num, sampled))
        row["round_seconds"] = time.perf_counter() - t0
        weights, client_model = driver.eval_models()
        if not np.isfinite(row["train_loss"]):
          raise Diverged(round_num, what="the training loss")
        row["loss_ratio"] = loss_ratio.check(round_num, row["train_loss"], sampled)
        if not _all_finite(weights):
          raise Diverged(round_num, what="a model")
      except Diverged:
        save_checkpoint(round_num - 1, good, good_rng)
        raise
      if round_num % config.eval_every == 0 or round_num == config.rounds:
        t1 = time.perf_counter()
        result = evaluator.evaluate(weights, client_model)
        row.update(test_accuracy=result.accuracy, test_loss=result.loss,
                   test_accuracy_clientavg=result.accuracy_clientavg,
                   test_macro_f1=result.macro_f1)
        row.update(driver.round_eval_metrics(result))
        row["eval_seconds"] = time.perf_counter() - t1
        last_choice = result.client_model
        if best is None or result.accuracy > best["accuracy"]:
          best = {"round": round_num, "accuracy": result.accuracy,
                  "weights": [[np.asarray(w) for w in m] for m in weights],
                  "client_model": np.asarray(result.client_model)}
      rows.append(row)
      if writer is not None:
        writer.write_round(row)
        writer.write_groups(round_num, data.client_ids, client_groups(
            client_model, last_choice if "test_accuracy" in row else None,
            getattr(driver, "assignment", None) if driver.groups_mask_unassigned else None,
            data.num_clients))
      if checkpoint_dir is not None and (round_num % checkpoint_every == 0
                                         or round_num == config.rounds):
        save_checkpoint(round_num, driver.snapshot(), rng)
      if bar is not None:
        postfix = {"loss": f"{row['train_loss']:.4f}"}
        last = [r for r in rows if r.get("test_accuracy") is not None]
        if last:
          postfix["acc"] = f"{last[-1]['test_accuracy']:.4f}"
        bar.set_postfix(postfix)
        bar.update(1)
      _stop_if_signalled()
    if models_dir is not None:
      weights, client_model = driver.eval_models()
      if isinstance(client_model, str) or data.test_only().any():
        # Chosen at evaluation (test-only clients always are): the last round's.
        client_model = (last_choice if last_choice is not None else
                        evaluator.evaluate(weights, client_model).client_model)
      save_models(task, os.path.join(models_dir, "final"), weights, client_model,
                  data.client_ids, config.rounds)
      if best is not None:
        save_models(task, os.path.join(models_dir, "best"), best["weights"],
                    best["client_model"], data.client_ids, best["round"])
    status = {"completed": True}
  except Diverged as e:
    status = {"completed": False, "reason": "diverged", "diverged_round": e.round_num,
              "diverged_clients": e.clients, "error": str(e)}
    raise
  except (KeyboardInterrupt, SystemExit):
    status = {"completed": False, "reason": "interrupted"}
    raise
  except BaseException as e:  # noqa: B036 - recorded, then re-raised
    if _STOP_SIGNAL["signum"] is not None:
      status = {"completed": False, "reason": "interrupted"}
    else:
      status = {"completed": False, "reason": "error", "error": f"{type(e).__name__}: {e}"}
    raise
  finally:
    if bar is not None:
      bar.close()
    summary = summarize(rows, config.rounds)
    summary.update(status)
    saved = ([] if checkpoint_dir is None or status["completed"]
             else checkpoint.rounds(checkpoint_dir))
    if saved:  # an unfinished run names the checkpoint a resume continues from
      summary["checkpoint_round"] = saved[-1]
    summary["total_seconds"] = time.perf_counter() - start
    summary["setup_seconds"] = setup_seconds
    summary["bytes_down"] = int(sum(r.get("bytes_down", 0) for r in rows))
    summary["bytes_up"] = int(sum(r.get("bytes_up", 0) for r in rows))
    summary.update(extras)
    summary.update(driver.summary())
    if writer is not None:
      writer.write_summary(summary)
      writer.plot(f"{task.name}")
  return summary


def save_models(task: TaskSpec, directory: str, weights, client_model,
                client_ids: Sequence[str], round_num: int) -> None:
  """Each model as `model_<j>.npz` (its weights `w0, w1, ...` in the order of
  `local_training.model_variables`: trainable, then non-trainable; read on any
  stack) and `model_<j>.keras` (Keras' own format, readable only by the Keras
  that wrote it), and `clients.json`:
  {"round": r, "num_models": K, "client_model": {client id: j}}."""
  from tff_cluster import checkpoint, results
  os.makedirs(directory, exist_ok=True)
  model = task.model_fn()
  for j, w in enumerate(weights):
    path = os.path.join(directory, f"model_{j}")
    buffer = io.BytesIO()
    np.savez(buffer, **{f"w{i}": np.asarray(a) for i, a in enumerate(w)})
    checkpoint.atomic_write_bytes(path + ".npz", buffer.getvalue())
    local_training.set_weights(model, w)
    model.save(path + ".tmp.keras")
    os.replace(path + ".tmp.keras", path + ".keras")
  results.write_json(os.path.join(directory, "clients.json"), {
      "round": int(round_num), "num_models": len(weights),
      "client_model": {c: int(j) for c, j in zip(client_ids, client_model)}})


class WeightsMismatch(ValueError):
  """Saved weights that do not fit the task's model (one line)."""


def load_model_weights(task: TaskSpec, directory: str, j: int) -> List[np.ndarray]:
  """Model `j` saved by `save_models` in `directory`: from `model_<j>.npz`
  (any stack), else from `model_<j>.keras` (runs saved before the `.npz`
  files; only the Keras that wrote it reads it). Raises `WeightsMismatch`
  (one line) when the weights do not fit the task's model."""
  path = os.path.join(directory, f"model_{j}")
  expected = [tuple(s.shape) for s in local_training.weights_type_spec(task.model_fn())]
  if os.path.isfile(path + ".npz"):
    with np.load(path + ".npz", allow_pickle=False) as archive:
      weights = [np.asarray(archive[f"w{i}"]) for i in range(len(archive.files))]
  else:
    weights = local_training.get_weights(
        tf.keras.models.load_model(path + ".keras", compile=False))
  shapes = [tuple(w.shape) for w in weights]
  if shapes != expected:
    raise WeightsMismatch(f"{path}: weights of shapes {shapes} do not fit --task={task.name} "
                     f"--model={task.model_name} ({expected}); valid: the run's model")
  return weights


def check_num_groups(num_groups: int, data: FederatedData) -> None:
  """Refuses a `--num_groups` outside 1..(clients with training data): test-only
  clients are never trained or clustered."""
  training = data.num_training_clients
  if not 1 <= num_groups <= training:
    raise ValueError(f"invalid --num_groups={num_groups}; valid: 1..{training} "
                     "(at most the number of clients with training data)")


def client_groups(client_model, chosen, assignment, num_clients: int) -> Optional[np.ndarray]:
  """Each client's group/model index this round, for groups.csv; -1: none.

  `client_model` is what `Driver.eval_models` returned: indices, where a
  driver that keeps an `assignment` with -1 for clients in no group yet (e.g.
  FedGroup, whose eval_models tests them with the auxiliary model) gives -1
  for those; `CHOOSE_BY_TEST_LOSS`: `chosen`, the evaluation's choice (None
  on a round without evaluation: not known); an ensemble: -1 for everyone.
  """
  if isinstance(client_model, str):
    if client_model == CHOOSE_BY_TEST_LOSS:
      return None if chosen is None else np.asarray(chosen, np.int64)
    return np.full(num_clients, -1, np.int64)
  groups = np.array(client_model, np.int64)
  if assignment is not None and np.shape(assignment) == groups.shape:
    groups[np.asarray(assignment) < 0] = -1
  return groups
