"""The training loop shared by every algorithm: sample, train, evaluate, record.

An algorithm module provides a *driver* (see `Driver`): the host-side logic
around its `Definition`, executed by a runner (`tff_cluster.runners`). The
loop here is algorithm- and runner-agnostic.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, List, Optional, Sequence

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
  """Hyper-parameters every algorithm shares (see `tff_cluster.hparams.TRAINING`).

  Local work is `local_epochs` passes or `local_steps` mini-batch steps
  (exactly one of them). Round t's client learning rate is
  client_lr * lr_decay^(t-1). `runner` is 'tff' or 'local'; `jit` applies to
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
  runner: str = "tff"
  jit: str = "auto"

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

  def __init__(self, task: TaskSpec, data: FederatedData, config: TrainingConfig,
               definition):
    from tff_cluster import runners
    self.task = task
    self.data = data
    self.config = config
    self.definition = definition
    self.runner = runners.make_runner(config.runner, definition, task.model_fn,
                                      task.loss, data, config.seed, config.jit)
    self.client_states: Dict[int, Any] = {}

  def describe(self) -> Dict[str, Any]:
    """Runner facts for `config.json` (runner, device, jit)."""
    return self.runner.describe()

  def train_clients(self, mode: str, state, clients: Sequence[int], round_num: int,
                    keys: Optional[Sequence[int]] = None,
                    work: Optional[local_training.LocalWork] = None,
                    persist: bool = True):
    """One runner call; threads the clients' persistent states.

    `persist=False` runs with fresh client states and keeps none (e.g. a
    cold start's pre-training).
    """
    states = None
    if self.definition.client_state_spec(mode) is not None:
      fresh = self.definition.initial_client_state(mode)
      states = [self.client_states.get(int(k), fresh) if persist else fresh
                for k in clients]
    out = self.runner.run(mode, state, clients, round_num, work or self.config.local_work,
                          self.config.lr_at(round_num), keys=keys, client_states=states)
    if states is not None and persist:
      for k, new in zip(clients, out.client_states):
        self.client_states[int(k)] = new
    return out

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
                 runner: Driver, writer: Optional[ResultsWriter] = None,
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
