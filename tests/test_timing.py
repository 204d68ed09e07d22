"""Where a run's seconds go: summary.json's `process_time` adds up to the
process's wall time, the first round's compilation is reported apart from
the rounds' mean, the divergence baseline evaluates only the clients the
rounds use, the writer thread keeps its order and its errors, and
config.json names the checkout's commit."""

from __future__ import annotations

import csv
import json
import os
import pathlib
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tff_cluster import timing
from tff_cluster.io import background

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_parts_add_up_and_compile_is_the_first_calls_excess():
  ledger = timing.Ledger(origin=time.time() - 10.0)
  ledger.add("data", 1.5)
  # Training 3.0 then 1.0, 1.2, 0.8 (mean 1.0); evaluations 0.5 then 0.1, 0.1.
  for train, evaluation in [(3.0, 0.5), (1.0, None), (1.2, 0.1), (0.8, 0.1)]:
    ledger.round(train, evaluation)
  out = ledger.breakdown()
  assert list(out) == [*timing.PARTS, "unaccounted", "process"]
  assert ledger.compile_seconds() == pytest.approx((3.0 - 1.0) + (0.5 - 0.1))
  assert out["compile"] == pytest.approx(2.4)
  assert out["training"] == pytest.approx(6.0 - 2.0)
  assert out["evaluation"] == pytest.approx(0.7 - 0.4)
  assert ledger.mean_round_seconds() == pytest.approx(1.0)
  assert out["data"] == 1.5
  assert sum(v for k, v in out.items() if k != "process") == pytest.approx(out["process"], abs=1e-9)
  assert 10.0 <= out["process"] < 20.0
  one = timing.Ledger()
  one.round(2.0, 0.3)  # a single round: nothing to tell its compilation by
  assert one.compile_seconds() == 0.0 and one.breakdown()["training"] == 2.0


def test_an_open_part_counts_its_seconds_so_far_and_a_wrong_name_is_refused():
  ledger = timing.Ledger()
  with ledger.part("closing"):
    time.sleep(0.05)
    inside = ledger.breakdown()
  assert inside["closing"] >= 0.05 and inside["unaccounted"] < 0.05
  assert ledger.breakdown()["closing"] >= 0.05
  with pytest.raises(KeyError, match="valid: start"):
    ledger.add("nap", 1.0)
  with pytest.raises(KeyError, match="valid: start"):
    with ledger.part("nap"):
      pass


def test_the_process_start_is_before_this_module_and_not_long_before():
  started = timing.process_start()
  assert started <= timing._IMPORTED + 0.02  # noqa: SLF001
  assert time.time() - started < 24 * 3600


def test_the_writer_thread_keeps_the_order_and_raises_a_failed_call_later():
  writer = background.Background(maxsize=2)
  seen = []
  for i in range(50):
    writer.submit(seen.append, i)
  writer.drain()
  assert seen == list(range(50))

  def fail():
    raise OSError("disk full")

  writer.submit(fail)
  writer.submit(seen.append, "after")  # dropped: the thread stopped working
  with pytest.raises(OSError, match="disk full"):
    writer.drain()
  assert seen[-1] == 49
  writer.close()
  with pytest.raises(RuntimeError, match="closed"):
    writer.submit(seen.append, 1)


def test_a_full_queue_makes_the_loop_wait_for_the_disk():
  writer = background.Background(maxsize=1)
  gate = threading.Event()
  writer.submit(gate.wait)  # the thread is busy until the gate opens
  writer.submit(lambda: None)  # fills the queue
  blocked = threading.Thread(target=writer.submit, args=(lambda: None,))
  blocked.start()
  blocked.join(0.2)
  assert blocked.is_alive()  # the third call waits for room
  gate.set()
  blocked.join(5)
  assert not blocked.is_alive()
  writer.close()


def test_the_divergence_baseline_evaluates_each_client_once_and_alone():
  """The initial model's loss of a client is computed when a round first
  holds it, from its own data alone: the same numbers as evaluating every
  client at once, and the reference of a round is their sample-weighted mean."""
  from tff_cluster import tasks
  from tff_cluster.host.driver import LossRatio
  from tff_cluster.learning.evaluation import Evaluator
  from tff_cluster.spec.task import DataOptions
  from tff_cluster import models
  task = tasks.get_task("synthetic")
  data = task.load_data(DataOptions(seed=3, num_clients=8))
  model = task.model_fn()
  w0 = models.get_weights(model)
  evaluator = Evaluator(task.model_fn, task.loss, data, split="train", batch_size=64)
  every = evaluator.mean_losses(w0)
  calls = []

  class Counting:
    def mean_losses(self, weights, clients=None):
      calls.append(list(clients))
      return evaluator.mean_losses(weights, clients=clients)

  ratio = LossRatio(task, data, w0, limit=100.0, evaluator=Counting())
  sizes = data.num_train_samples().astype(np.float64)
  for clients in ([1, 4, 6], [4, 6, 7], [1, 7]):
    want = np.dot(sizes[clients], every[clients]) / sizes[clients].sum()
    # (float32 losses: batches cut across clients round differently)
    np.testing.assert_allclose(ratio.reference(clients), want, rtol=1e-6)
  assert calls == [[1, 4, 6], [7]]  # each client evaluated once, when first used
  assert ratio.seconds > 0
  # Alone: a client's loss does not depend on the clients evaluated with it.
  together = evaluator.mean_losses(w0, clients=[5, 0, 3])
  alone = [evaluator.mean_losses(w0, clients=[k])[0] for k in (5, 0, 3)]
  assert together.tolist() == alone
  np.testing.assert_allclose(together, every[[5, 0, 3]], rtol=1e-6)


def _git_head():
  try:
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--show-toplevel", "HEAD"],
                         capture_output=True, text=True, timeout=20)
  except OSError:
    return None
  lines = out.stdout.split()
  if out.returncode or len(lines) != 2 or pathlib.Path(lines[0]).resolve() != ROOT:
    return None
  return lines[1]


def test_a_runs_seconds_add_up_to_its_process_and_config_names_the_commit(tmp_path):
  """The command run as a process: summary.json's parts add up to its wall
  time measured from outside (within 2 %), --profile prints them, the mean
  round leaves the first round's compilation out, config.json holds HEAD."""
  out = tmp_path / "run"
  command = [sys.executable, "run_experiment.py", "--algo=fedavg", "--task=synthetic",
             "--num_clients=20", "--rounds=4", "--clients_per_round=5", "--noprogress",
             "--profile", f"--output_dir={out}"]
  env = {k: v for k, v in os.environ.items() if k != "TFF_CLUSTER_NO_FAST_EXIT"}
  start = time.time()
  done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                        env=env)
  wall = time.time() - start
  assert done.returncode == 0, done.stderr[-3000:]
  summary = json.loads((out / "summary.json").read_text())
  parts = summary["process_time"]
  assert set(parts) == {*timing.PARTS, "unaccounted", "process"}  # (JSON keys sorted)
  assert sum(parts[p] for p in timing.PARTS) + parts["unaccounted"] == pytest.approx(
      parts["process"], abs=1e-6)
  assert abs(parts["unaccounted"]) <= 0.02 * parts["process"], parts
  assert 0.98 * wall <= parts["process"] <= wall, (parts["process"], wall)
  for part in ("start", "tensorflow_import", "library_import", "data", "build",
               "results_setup", "divergence_baseline", "compile", "training", "evaluation",
               "host", "closing"):
    assert parts[part] > 0, part
  for part in (*timing.PARTS, "unaccounted", "process"):
    assert re.search(rf"^{part} +-?\d+\.\d{{3}}", done.stderr, re.M), part
  with open(out / "metrics.csv", newline="") as f:
    rows = list(csv.DictReader(f))
  seconds = [float(r["round_seconds"]) for r in rows]
  assert summary["mean_round_seconds"] == pytest.approx(np.mean(seconds[1:]), rel=1e-12)
  assert summary["compile_seconds"] == pytest.approx(parts["compile"], rel=1e-9)
  config = json.loads((out / "config.json").read_text())
  head = _git_head()
  if head is None:
    pytest.skip("not run from a git checkout of the project: no commit to compare")
  assert config["git_commit"] == head
  assert isinstance(config["git_dirty"], bool)
