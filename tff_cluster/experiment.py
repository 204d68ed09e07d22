"""The training loop shared by every algorithm: sample, train, evaluate, record.

An algorithm module provides a *runner* (see `Runner`) that wraps its TFF
process(es) and keeps whatever per-client state the driver must hold (e.g. a
client's group). The loop here is algorithm-agnostic.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_cluster import local_training
from tff_cluster.data.federated import FederatedData
from tff_cluster.evaluation import Evaluator
from tff_cluster.results import ResultsWriter, summarize
from tff_cluster.task import TaskSpec

BYTES_PER_PARAMETER = 4  # float32

BASE_COLUMNS = ("round", "train_loss", "test_accuracy", "test_loss",
                "round_seconds", "eval_seconds", "bytes_down", "bytes_up")


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
  """Hyper-parameters every algorithm shares."""
  rounds: int
  clients_per_round: int
  local_epochs: int
  batch_size: int
  client_lr: float
  seed: int = 0
  eval_every: int = 1
  mu: float = 0.0


def client_seed(seed: int, round_num: int, client_index: int) -> int:
  """Seed of one client's data shuffle in one round (stable, collision-free)."""
  return int(np.random.SeedSequence([seed, round_num, client_index])
             .generate_state(1)[0] & 0x7FFFFFFF)


def client_element_spec(data: FederatedData, batch_size: int):
  """Element spec of a client's batched training dataset (the TFF data type)."""
  return local_training.client_dataset(
      *data.train[data.client_ids[0]], batch_size, 1, 0).element_spec


def round_datasets(data: FederatedData, config: TrainingConfig, round_num: int,
                   clients: Sequence[int], epochs: int) -> List[tf.data.Dataset]:
  """The sampled clients' training datasets for one round (seeded shuffles)."""
  return [local_training.client_dataset(
      *data.train[data.client_ids[k]], config.batch_size, epochs,
      client_seed(config.seed, round_num, k)) for k in clients]


def initial_weights(task: TaskSpec, seed: int) -> List[np.ndarray]:
  """The model's seeded initialization (trainable then non-trainable)."""
  tf.keras.utils.set_random_seed(seed)
  return local_training.get_weights(task.model_fn())


class Runner:
  """What the loop needs from an algorithm.

  `setup()` runs once before round 1 (e.g. cold start) and returns summary
  extras; `run_round()` trains one round on the sampled clients and returns the
  round's metrics (at least `train_loss`, `bytes_down`, `bytes_up`);
  `eval_models()` gives the candidate weights and which one each client would
  receive now; `extra_columns` names additional per-round metrics;
  `round_eval_metrics()` adds algorithm metrics computed at evaluation time.
  """
  extra_columns: Sequence[str] = ()

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


def sample_clients(rng: np.random.Generator, num_clients: int,
                   clients_per_round: int) -> np.ndarray:
  return np.sort(rng.choice(num_clients, clients_per_round, replace=False))


def run_training(task: TaskSpec, data: FederatedData, config: TrainingConfig,
                 runner: Runner, writer: Optional[ResultsWriter] = None,
                 progress: bool = True, log=print) -> Dict[str, Any]:
  """Runs `config.rounds` rounds; returns the summary (also written to disk)."""
  evaluator = Evaluator(task.model_fn, task.loss, data)
  start = time.perf_counter()
  setup_start = time.perf_counter()
  extras = runner.setup() or {}
  setup_seconds = time.perf_counter() - setup_start
  rng = np.random.default_rng(np.random.SeedSequence([config.seed, 7]))
  rows: List[Dict[str, Any]] = []
  bar = None
  if progress:
    from tqdm import tqdm
    bar = tqdm(total=config.rounds, desc=f"{task.name}", unit="round",
               dynamic_ncols=True)
  try:
    for round_num in range(1, config.rounds + 1):
      sampled = sample_clients(rng, data.num_clients, config.clients_per_round)
      t0 = time.perf_counter()
      row: Dict[str, Any] = {"round": round_num}
      row.update(runner.run_round(round_num, sampled))
      row["round_seconds"] = time.perf_counter() - t0
      if round_num % config.eval_every == 0 or round_num == config.rounds:
        t1 = time.perf_counter()
        weights, client_model = runner.eval_models()
        result = evaluator.evaluate(weights, client_model)
        row.update(test_accuracy=result.accuracy, test_loss=result.loss)
        row.update(runner.round_eval_metrics(result))
        row["eval_seconds"] = time.perf_counter() - t1
      rows.append(row)
      if writer is not None:
        writer.write_round(row)
      if bar is not None:
        postfix = {"loss": f"{row['train_loss']:.4f}"}
        last = [r for r in rows if "test_accuracy" in r]
        if last:
          postfix["acc"] = f"{last[-1]['test_accuracy']:.4f}"
        bar.set_postfix(postfix)
        bar.update(1)
  finally:
    if bar is not None:
      bar.close()
    summary = summarize(rows, config.rounds)
    summary["completed"] = len(rows) == config.rounds
    summary["total_seconds"] = time.perf_counter() - start
    summary["setup_seconds"] = setup_seconds
    summary["bytes_down"] = int(sum(r.get("bytes_down", 0) for r in rows))
    summary["bytes_up"] = int(sum(r.get("bytes_up", 0) for r in rows))
    summary.update(extras)
    summary.update(runner.summary())
    if writer is not None:
      writer.write_summary(summary)
      writer.plot(f"{task.name}")
  return summary
