"""The training loop shared by every algorithm: sample, train, evaluate, record.

An algorithm module provides a *driver* (`tff_cluster.host.driver.Driver`): the
host-side logic around its `Definition`, executed by a runner
(`tff_cluster.runners`). The loop here is algorithm- and runner-agnostic; the
settings it runs with are `tff_cluster.host.driver.TrainingConfig`.
"""

from __future__ import annotations

import copy
import io
import os
import time
import zipfile
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_cluster import seeds
from tff_cluster import interrupts
from tff_cluster import timing
from tff_cluster.progress import progress_bar
from tff_cluster.io import checkpoint
from tff_cluster import models
from tff_cluster.io import results
from tff_cluster.io import rundir
from tff_cluster.data.federated import FederatedData
from tff_cluster.host.driver import (Diverged, Driver, LossRatio, TrainingConfig, client_groups,
                                sample_clients)
from tff_cluster.learning.evaluation import deployment
from tff_cluster.host import privacy
from tff_cluster.host import round as host_round
from tff_cluster.io.results import ResultsWriter, summarize
from tff_cluster.runners.base import WorkerLost
from tff_cluster.spec.task import TaskSpec

BASE_COLUMNS = ("round", "train_loss", "loss_ratio", *host_round.EVAL_METRICS,
                "round_seconds", "eval_seconds", "bytes_down", "bytes_up")


def columns(driver: Driver) -> List[str]:
  """A run's metric columns: `BASE_COLUMNS`, the driver's own and its
  aggregator's (`privacy.columns`)."""
  return [*BASE_COLUMNS, *getattr(driver, "extra_columns", ()), *privacy.columns(driver)]


def check_clients_per_round(config: TrainingConfig, data: FederatedData) -> None:
  """Refuses a `--clients_per_round` above the clients with training data."""
  trainable = data.training_clients()
  if config.clients_per_round > len(trainable):
    raise ValueError(f"invalid --clients_per_round={config.clients_per_round}: "
                     f"{len(trainable)} clients have training data; valid: "
                     f"1..{len(trainable)}")


def run_status(error: BaseException) -> Dict[str, Any]:
  """summary.json's status of a run that `error` ended."""
  if isinstance(error, Diverged):
    return {"completed": False, "reason": "diverged", "diverged_round": error.round_num,
            "diverged_clients": error.clients, "error": str(error)}
  if isinstance(error, WorkerLost):
    return {"completed": False, "reason": "worker_lost", "error": str(error)}
  if isinstance(error, (KeyboardInterrupt, SystemExit)):
    return {"completed": False, "reason": "interrupted"}
  if isinstance(error, checkpoint.WriteFailed):  # e.g. a full disk: one line says which file
    return {"completed": False, "reason": "error", "error": str(error)}
  if interrupts.received() is not None:
    return {"completed": False, "reason": "interrupted"}
  return {"completed": False, "reason": "error", "error": f"{type(error).__name__}: {error}"}


def _progress_bar(name: str, config: TrainingConfig, first_round: int):
  return progress_bar(total=config.rounds, initial=first_round - 1, desc=f"{name}",
                      unit="round", dynamic_ncols=True)


def _show_progress(bar, rows: List[Dict[str, Any]]) -> None:
  """Advances the bar by a round: the latest training loss and accuracy."""
  postfix = {"loss": f"{rows[-1]['train_loss']:.4f}"}
  last = [r for r in rows if r.get("test_accuracy") is not None]
  if last:
    postfix["acc"] = f"{last[-1]['test_accuracy']:.4f}"
  bar.set_postfix(postfix)
  bar.update(1)


class TrainingRun:
  """The records of one `run_training` call: the rows, the set-up's extras
  and time, the best round's models and the sampling generator; it restores
  them from a checkpoint, writes checkpoints, records each round and writes
  the summary."""

  def __init__(self, task: TaskSpec, config: TrainingConfig, driver: Driver,
               writer: Optional[ResultsWriter], checkpoint_dir: Optional[str],
               checkpoint_every: int, ledger: Optional[timing.Ledger] = None):
    self.task, self.config, self.driver = task, config, driver
    self.writer, self.checkpoint_dir = writer, checkpoint_dir
    self.checkpoint_every = checkpoint_every
    self.start = time.perf_counter()
    self.ledger = ledger if ledger is not None else timing.Ledger()
    with self.ledger.part("build"):
      self.evaluator = driver.make_evaluator()
      train_evaluator = driver.make_evaluator("train")
    self.data = driver.data  # materialized by the driver unless its runner makes the clients
    self.rng = seeds.generator(config.seed, "client_sampling")
    self.rows: List[Dict[str, Any]] = []
    self.extras: Dict[str, Any] = {}
    self.best: Optional[Dict[str, Any]] = None
    self.first_round = 1
    self.setup_seconds = 0.0
    self.last_choice = None
    # The first round of each process (this one's is added when it runs): its
    # compilation is left out of mean_round_seconds.
    self.first_rounds: List[int] = []
    self.loss_ratio = LossRatio(task, self.data, driver.w0, config.divergence_ratio,
                                evaluator=train_evaluator)
    # The rows are on disk already where the writer writes the run's metrics
    # files: the checkpoint names them (count and SHA-256) instead of holding
    # them, so that writing it does not grow with the rounds.
    self.rows_on_disk = (writer is not None and checkpoint_dir is not None and
                         os.path.realpath(writer.path) == os.path.realpath(checkpoint_dir))

  def save_checkpoint(self, round_num: int, snapshot, sampling_rng) -> None:
    """The run state after round `round_num` (`snapshot` of the driver then
    and the sampling generator), and a summary saying the run is not done."""
    if self.checkpoint_dir is None:
      return
    state = self.driver.snapshot_numpy(snapshot)
    client_states = state.pop("client_states")
    digest = self.writer.records_digest() if self.rows_on_disk else None
    records = ({"rows_file": digest} if digest and digest["count"] == len(self.rows)
               else {"rows": self.rows})
    checkpoint.save(self.checkpoint_dir, round_num, {
        "driver": state, "sampling_rng": sampling_rng, **records,
        "extras": self.extras, "best": self.best, "setup_seconds": self.setup_seconds,
        "first_rounds": [r for r in self.first_rounds if r <= round_num]},
        client_states=client_states)
    if self.writer is not None:  # a killed run's summary says so
      self.writer.write_summary(dict(summarize(self.rows, self.config.rounds,
                                               self.first_rounds),
                                     completed=False, reason="running",
                                     checkpoint_round=round_num))

  def resume(self, payload: Dict[str, Any]) -> None:
    """Continues from a checkpoint payload (`checkpoint.load_latest`): the
    driver, the sampling generator, the rows and the best models; refuses one
    that does not fit this run in one line (`CheckpointError`)."""
    try:
      self.driver.restore(payload["driver"])
      self.rng = payload["sampling_rng"]
      self.rows = list(payload["rows"])
      self.extras = dict(payload["extras"])
      self.best = payload["best"]
      self.setup_seconds = float(payload["setup_seconds"])
      self.first_round = int(payload["round"]) + 1
      # (checkpoints written before the first rounds were kept: round 1's)
      self.first_rounds = [int(r) for r in payload.get("first_rounds", [1] if self.rows else [])]
      if not isinstance(self.rng, np.random.Generator) or len(self.rows) > self.first_round - 1:
        raise ValueError("its sampling generator or rows are malformed")
    except checkpoint.WriteFailed:
      raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OSError,
            EOFError) as e:  # contents edited by hand, or another algorithm's
      detail = str(e).splitlines()[0] if str(e) else ""
      raise checkpoint.CheckpointError(
          f"the checkpoint of round {payload.get('round')} in "
          f"{checkpoint.directory(self.checkpoint_dir or '.')} does not fit this run "
          f"({type(e).__name__}: {detail}); valid: a checkpoint this run wrote") from None

  def set_up(self) -> None:
    """The driver's set-up (e.g. a cold start), timed and checkpointed as round 0."""
    with self.ledger.part("setup"):
      setup_start = time.perf_counter()
      self.extras = self.driver.setup() or {}
      self.setup_seconds = time.perf_counter() - setup_start
      self.save_checkpoint(0, self.driver.snapshot(), self.rng)

  def run_rounds(self, trainable: np.ndarray, bar) -> None:
    """Rounds `first_round`..`config.rounds`, each on clients sampled from
    `trainable`; a diverged round checkpoints the state before it."""
    config, driver = self.config, self.driver
    for round_num in range(self.first_round, config.rounds + 1):
      started, baseline = time.perf_counter(), self.loss_ratio.seconds
      if round_num == self.first_round:
        self.first_rounds.append(round_num)
      good, good_rng = driver.snapshot(), copy.deepcopy(self.rng)
      sampled = sample_clients(self.rng, trainable, config.clients_per_round)
      evaluate = round_num % config.eval_every == 0 or round_num == config.rounds
      try:
        outcome = host_round.run_round(driver, round_num, sampled,
                                       self.evaluator if evaluate else None, self.loss_ratio)
      except Diverged:
        self.save_checkpoint(round_num - 1, good, good_rng)
        raise
      if outcome.result is not None:
        self.keep_best(round_num, outcome)
      # The round's records (TensorBoard's summary ops among them): a stop signal
      # is recorded here and raised just after, never inside them.
      with interrupts.deferred():
        self.record(round_num, outcome, bar)
      self.account_round(outcome.row, time.perf_counter() - started,
                         self.loss_ratio.seconds - baseline)
      interrupts.raise_if_received()

  def account_round(self, row: Dict[str, Any], seconds: float, baseline: float) -> None:
    """The round's `seconds` in the ledger: training, evaluation, the
    divergence baseline's evaluations (`baseline`) and the host side (the
    rest)."""
    train, evaluation = row["round_seconds"], row.get("eval_seconds")
    self.ledger.round(train, evaluation)
    self.ledger.add("divergence_baseline", baseline)
    self.ledger.add("host", seconds - train - (evaluation or 0.0) - baseline)

  def keep_best(self, round_num: int, outcome: host_round.RoundOutcome) -> None:
    """Notes an evaluated round's choice; keeps its models if the most accurate."""
    result = outcome.result
    self.last_choice = result.client_model
    if self.best is None or result.accuracy > self.best["accuracy"]:
      self.best = {"round": round_num, "accuracy": result.accuracy,
                   "weights": [[np.asarray(w) for w in m] for m in outcome.weights],
                   "client_model": np.asarray(result.client_model)}

  def record(self, round_num: int, outcome: host_round.RoundOutcome, bar) -> None:
    """Round `round_num`'s row and groups, its checkpoint when one is due,
    the progress bar."""
    row, data = outcome.row, self.data
    self.rows.append(row)
    if self.writer is not None:
      self.writer.write_round(row)
      self.writer.write_groups(round_num, data.client_ids, client_groups(
          outcome.client_model, self.last_choice if "test_accuracy" in row else None,
          self.driver.group_assignment(), data.num_clients))
    if self.checkpoint_dir is not None and (round_num % self.checkpoint_every == 0
                                            or round_num == self.config.rounds):
      self.save_checkpoint(round_num, self.driver.snapshot(), self.rng)
    if bar is not None:
      _show_progress(bar, self.rows)

  def save_final_models(self, models_dir: str) -> None:
    """The final models and the best round's (`save_models`), in `models_dir`."""
    data = self.data
    weights, client_model = self.driver.eval_models()
    if deployment(client_model).rule or data.test_only().any():
      # Chosen at evaluation (test-only clients always are): the last round's.
      client_model = (self.last_choice if self.last_choice is not None else
                      self.evaluator.evaluate(weights, client_model).client_model)
    save_models(self.task, os.path.join(models_dir, "final"), weights, client_model,
                data.client_ids, self.config.rounds)
    if self.best is not None:
      save_models(self.task, os.path.join(models_dir, "best"), self.best["weights"],
                  self.best["client_model"], data.client_ids, self.best["round"])

  def close(self, status: Dict[str, Any], write_failed: bool) -> Dict[str, Any]:
    """The run's summary with `status`, written with the plots (none after a
    failed write: the disk may be full)."""
    rows = self.rows
    summary = summarize(rows, self.config.rounds, self.first_rounds)
    summary.update(status)
    saved = ([] if self.checkpoint_dir is None or status["completed"]
             else checkpoint.rounds(self.checkpoint_dir))
    if saved:  # an unfinished run names the checkpoint a resume continues from
      summary["checkpoint_round"] = saved[-1]
    summary["total_seconds"] = time.perf_counter() - self.start
    summary["setup_seconds"] = self.setup_seconds
    summary["bytes_down"] = int(sum(r.get("bytes_down", 0) for r in rows))
    summary["bytes_up"] = int(sum(r.get("bytes_up", 0) for r in rows))
    summary.update(self.extras)
    summary.update(self.driver.summary())
    summary.update(privacy.summary(self.driver))
    summary["compile_seconds"] = self.ledger.compile_seconds()
    if self.writer is not None:
      with interrupts.deferred():  # (a signal now: the run is closing anyway)
        try:  # (the plots wait for the rows queued for the writer thread)
          if not write_failed:  # (no figures on a full disk)
            self.writer.plot(f"{self.task.name}")
        except checkpoint.WriteFailed:  # a queued row that could not be written
          if status["completed"]:
            raise
        summary["process_time"] = self.ledger.breakdown()
        try:
          self.writer.write_summary(summary)
        except checkpoint.WriteFailed:
          if status["completed"]:
            raise
          # The run is failing already (the disk may be full): summary.json
          # keeps what the last checkpoint wrote there.
    else:
      summary["process_time"] = self.ledger.breakdown()
    return summary


def run_training(task: TaskSpec, data: FederatedData, config: TrainingConfig,
                 driver: Driver, writer: Optional[ResultsWriter] = None,
                 progress: bool = True, checkpoint_dir: Optional[str] = None,
                 checkpoint_every: int = 10, resume: Optional[Dict[str, Any]] = None,
                 models_dir: Optional[str] = None,
                 ledger: Optional[timing.Ledger] = None) -> Dict[str, Any]:
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
    ledger: where the run's seconds are added up (`timing.Ledger`; None: a
      new one from now); summary.json's `process_time` is its breakdown.

  A NaN or infinite loss, update or model raises `Diverged` after the last
  good state is checkpointed and the summary says `"reason": "diverged"`.
  """
  check_clients_per_round(config, data)
  run = TrainingRun(task, config, driver, writer, checkpoint_dir, checkpoint_every, ledger)
  if resume is not None:
    with run.ledger.part("setup"):
      run.resume(resume)
  bar = _progress_bar(task.name, config, run.first_round) if progress else None
  status: Dict[str, Any] = {"completed": False, "reason": "interrupted"}
  write_failed = False
  closing = None
  try:
    if resume is None:
      run.set_up()
    run.run_rounds(data.training_clients(), bar)
    closing = time.perf_counter()
    if models_dir is not None:
      run.save_final_models(models_dir)
    status = {"completed": True}
  except BaseException as e:  # noqa: B036 - recorded, then re-raised
    status = run_status(e)
    write_failed = isinstance(e, checkpoint.WriteFailed)
    closing = time.perf_counter() if closing is None else closing
    raise
  finally:
    if bar is not None:
      bar.close()
    run.ledger.add("closing", time.perf_counter() - closing)
    with run.ledger.part("closing"):
      summary = run.close(status, write_failed)
  return summary


def save_models(task: TaskSpec, directory: str, weights, client_model,
                client_ids: Sequence[str], round_num: int) -> None:
  """Each model as `model_<j>.npz` (its weights `w0, w1, ...` in the order of
  `models.model_variables`: trainable, then non-trainable; read on any
  stack) and `model_<j>.keras` (Keras' own format, readable only by the Keras
  that wrote it), and `clients.json`:
  {"round": r, "num_models": K, "client_model": {client id: j}}."""
  try:
    os.makedirs(directory, exist_ok=True)
  except OSError as e:
    raise checkpoint.write_failed(directory, e) from None
  model = task.model_fn()
  for j, w in enumerate(weights):
    path = rundir.model_stem(directory, j)
    buffer = io.BytesIO()
    np.savez(buffer, **{f"w{i}": np.asarray(a) for i, a in enumerate(w)})
    checkpoint.atomic_write_bytes(path + ".npz", buffer.getvalue())
    models.set_weights(model, w)
    try:
      model.save(path + ".tmp.keras")
      os.replace(path + ".tmp.keras", path + ".keras")
    except BaseException as e:  # noqa: B036 - no half-written model is left
      if os.path.exists(path + ".tmp.keras"):
        os.remove(path + ".tmp.keras")
      if isinstance(e, OSError):
        raise checkpoint.write_failed(path + ".keras", e) from None
      raise
  results.write_json(rundir.path_of(directory, rundir.CLIENTS_JSON), {
      "round": int(round_num), "num_models": len(weights),
      "client_model": {c: int(j) for c, j in zip(client_ids, client_model)}})


class WeightsMismatch(ValueError):
  """Saved weights that do not fit the task's model (one line)."""


def load_model_weights(task: TaskSpec, directory: str, j: int) -> List[np.ndarray]:
  """Model `j` saved by `save_models` in `directory`: from `model_<j>.npz`
  (any stack), else the weights only of `model_<j>.keras` (runs saved before
  the `.npz` files), read into the task's own model: a run folder can come
  from anyone, and loading a whole Keras model from it could run the code it
  stores (a `Lambda` layer under Keras 2). Raises `WeightsMismatch` (one
  line) when the weights do not fit the task's model or the file is not a
  Keras zip archive."""
  path = rundir.model_stem(directory, j)
  model = task.model_fn()
  expected = [tuple(s.shape) for s in models.weights_type_spec(model)]
  weights = rundir.read_model_npz(directory, j)
  if weights is None:
    keras_path = path + ".keras"
    if not zipfile.is_zipfile(keras_path):
      raise WeightsMismatch(
          f"{keras_path} is not a Keras zip archive (a run writes model_{j}.npz and a "
          f"zipped model_{j}.keras); refusing to read it: other formats can hold code "
          "that loading runs")
    try:
      model.load_weights(keras_path)  # the archive's weights file only
    except (ValueError, KeyError, OSError) as e:
      raise WeightsMismatch(f"{keras_path}: its weights do not fit --task={task.name} "
                            f"--model={task.model_name} ({str(e).splitlines()[0][:200]}); "
                            "valid: the run's model") from None
    weights = models.get_weights(model)
  shapes = [tuple(w.shape) for w in weights]
  if shapes != expected:
    raise WeightsMismatch(f"{path}: weights of shapes {shapes} do not fit --task={task.name} "
                     f"--model={task.model_name} ({expected}); valid: the run's model")
  return weights


