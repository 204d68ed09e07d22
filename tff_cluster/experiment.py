"""The training loop shared by every algorithm: sample, train, evaluate, record.

An algorithm module provides a *driver* (`tff_cluster.driver.Driver`): the
host-side logic around its `Definition`, executed by a runner
(`tff_cluster.runners`). The loop here is algorithm- and runner-agnostic. The
driver module's names are re-exported here for callers of the loop.
"""

from __future__ import annotations

import copy
import io
import os
import signal
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_cluster import checkpoint, interrupts, local_training, results
from tff_cluster.data.federated import FederatedData
from tff_cluster.driver import (BYTES_PER_PARAMETER, Diverged, Driver,  # noqa: F401
                                LossRatio, TrainingConfig, _all_finite, check_num_groups,
                                client_groups, initial_weights, model_layout,
                                sample_clients)
from tff_cluster.evaluation import CHOOSE_BY_TEST_LOSS, Evaluator, is_rule  # noqa: F401
from tff_cluster.results import ResultsWriter, summarize
from tff_cluster.runners.base import WorkerLost
from tff_cluster.task import TaskSpec

BASE_COLUMNS = ("round", "train_loss", "loss_ratio", "test_accuracy", "test_loss",
                "test_accuracy_clientavg", "test_macro_f1", "round_seconds",
                "eval_seconds", "bytes_down", "bytes_up")


def _stop_if_signalled() -> None:
  """Raises what a stop signal recorded by `interrupts.note` (the CLI's
  handlers record every one) stands for (KeyboardInterrupt for
  SIGINT, SystemExit(128 + signum) otherwise), in case code it interrupted (for
  instance TFF's asyncio execution) swallowed that exception and carried on."""
  signum = interrupts.received()
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

  trainable = data.training_clients()
  if config.clients_per_round > len(trainable):
    raise ValueError(f"invalid --clients_per_round={config.clients_per_round}: "
                     f"{len(trainable)} clients have training data; valid: "
                     f"1..{len(trainable)}")
  evaluator = driver.make_evaluator()
  data = driver.data  # materialized by the driver unless its runner makes the clients
  start = time.perf_counter()
  rng = np.random.default_rng(np.random.SeedSequence([config.seed, 7]))
  rows: List[Dict[str, Any]] = []
  extras: Dict[str, Any] = {}
  best: Optional[Dict[str, Any]] = None
  first_round = 1
  setup_seconds = 0.0
  last_choice = None
  status: Dict[str, Any] = {"completed": False, "reason": "interrupted"}
  write_failed = False
  loss_ratio = LossRatio(task, data, driver.w0, config.divergence_ratio,
                         evaluator=driver.make_evaluator("train"))

  # The rows are on disk already where the writer writes the run's metrics
  # files: the checkpoint names them (count and SHA-256) instead of holding
  # them, so that writing it does not grow with the rounds.
  rows_on_disk = (writer is not None and checkpoint_dir is not None and
                  os.path.realpath(writer.path) == os.path.realpath(checkpoint_dir))

  def save_checkpoint(round_num, snapshot, sampling_rng):
    if checkpoint_dir is None:
      return
    state = driver.snapshot_numpy(snapshot)
    client_states = state.pop("client_states")
    digest = writer.records_digest() if rows_on_disk else None
    records = ({"rows_file": digest} if digest and digest["count"] == len(rows)
               else {"rows": rows})
    checkpoint.save(checkpoint_dir, round_num, {
        "driver": state, "sampling_rng": sampling_rng, **records,
        "extras": extras, "best": best, "setup_seconds": setup_seconds},
        client_states=client_states)
    if writer is not None:  # a killed run's summary says so
      writer.write_summary(dict(summarize(rows, config.rounds), completed=False,
                                reason="running", checkpoint_round=round_num))

  if resume is not None:
    try:
      driver.restore(resume["driver"])
      rng = resume["sampling_rng"]
      rows = list(resume["rows"])
      extras = dict(resume["extras"])
      best = resume["best"]
      setup_seconds = float(resume["setup_seconds"])
      first_round = int(resume["round"]) + 1
      if not isinstance(rng, np.random.Generator) or len(rows) > first_round - 1:
        raise ValueError("its sampling generator or rows are malformed")
    except checkpoint.WriteFailed:
      raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OSError,
            EOFError) as e:  # contents edited by hand, or another algorithm's
      detail = str(e).splitlines()[0] if str(e) else ""
      raise checkpoint.CheckpointError(
          f"the checkpoint of round {resume.get('round')} in "
          f"{checkpoint.directory(checkpoint_dir or '.')} does not fit this run "
          f"({type(e).__name__}: {detail}); valid: a checkpoint this run wrote") from None
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
      # The round's records (TensorBoard's summary ops among them): a stop signal
      # is recorded here and raised just after, never inside them.
      with interrupts.deferred():
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
      if is_rule(client_model) or data.test_only().any():
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
  except WorkerLost as e:
    status = {"completed": False, "reason": "worker_lost", "error": str(e)}
    raise
  except (KeyboardInterrupt, SystemExit):
    status = {"completed": False, "reason": "interrupted"}
    raise
  except checkpoint.WriteFailed as e:  # e.g. a full disk: one line says which file
    status = {"completed": False, "reason": "error", "error": str(e)}
    write_failed = True
    raise
  except BaseException as e:  # noqa: B036 - recorded, then re-raised
    if interrupts.received() is not None:
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
      with interrupts.deferred():  # (a signal now: the run is closing anyway)
        try:
          writer.write_summary(summary)
        except checkpoint.WriteFailed:
          if status["completed"]:
            raise
          # The run is failing already (the disk may be full): summary.json
          # keeps what the last checkpoint wrote there.
        if not write_failed:  # (no figures on a full disk)
          writer.plot(f"{task.name}")
  return summary


def save_models(task: TaskSpec, directory: str, weights, client_model,
                client_ids: Sequence[str], round_num: int) -> None:
  """Each model as `model_<j>.npz` (its weights `w0, w1, ...` in the order of
  `local_training.model_variables`: trainable, then non-trainable; read on any
  stack) and `model_<j>.keras` (Keras' own format, readable only by the Keras
  that wrote it), and `clients.json`:
  {"round": r, "num_models": K, "client_model": {client id: j}}."""
  try:
    os.makedirs(directory, exist_ok=True)
  except OSError as e:
    raise checkpoint.write_failed(directory, e) from None
  model = task.model_fn()
  for j, w in enumerate(weights):
    path = os.path.join(directory, f"model_{j}")
    buffer = io.BytesIO()
    np.savez(buffer, **{f"w{i}": np.asarray(a) for i, a in enumerate(w)})
    checkpoint.atomic_write_bytes(path + ".npz", buffer.getvalue())
    local_training.set_weights(model, w)
    try:
      model.save(path + ".tmp.keras")
      os.replace(path + ".tmp.keras", path + ".keras")
    except BaseException as e:  # noqa: B036 - no half-written model is left
      if os.path.exists(path + ".tmp.keras"):
        os.remove(path + ".tmp.keras")
      if isinstance(e, OSError):
        raise checkpoint.write_failed(path + ".keras", e) from None
      raise
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


