"""The TFF worker process never outlives the run that started it.

Each subprocess test asserts it saw a `worker_binary` started by that process
(so a run that never started one cannot pass vacuously), then that none of
those workers is alive once the run is over.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap

import numpy as np
import pytest

pytestmark = pytest.mark.tff
tff = pytest.importorskip("tensorflow_federated", reason="needs the TFF stack")

import tensorflow as tf  # noqa: E402

from tests.conftest import REPO_ROOT, tiered  # noqa: E402
from tests.helpers import (SMALL_ARGS, assert_workers_gone, metrics_rows_written,  # noqa: E402
                           read_metrics_csv, run_watching_workers, worker_pids)
from tff_cluster.runners.tff import runtime  # noqa: E402

SCRIPT = str(REPO_ROOT / "run_experiment.py")


# ---------------------------------------------------------------------------
# In-process: the worker's stdio, process group and stop().


def test_worker_is_detached_from_our_stdio_and_process_group():
  active = runtime.start()
  pid = active.pid
  assert pid in worker_pids()
  with open(f"/proc/{pid}/stat") as f:
    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
  assert ppid == os.getpid()
  assert os.getpgid(pid) == pid != os.getpgid(os.getpid())
  for fd in (0, 1, 2):
    assert os.readlink(f"/proc/{pid}/fd/{fd}") == "/dev/null"


def test_context_manager_stops_worker_on_exception_and_restarts_lazily():
  with pytest.raises(RuntimeError, match="boom"):
    with runtime.tff_runtime() as active:
      pid = active.pid
      assert pid in worker_pids()
      raise RuntimeError("boom")
  assert pid not in worker_pids()

  @tff.tensorflow.computation(tff.TensorType(np.int32))
  def add_one(x):
    return x + tf.constant(1, tf.int32)

  assert add_one(41) == 42  # a fresh worker started on demand
  fresh = runtime.start().pid
  assert fresh != pid and fresh in worker_pids()


# ---------------------------------------------------------------------------
# Real CLI processes.


def _cli(out_dir, rounds):
  return [sys.executable, SCRIPT, *SMALL_ARGS, "--runner=tff", f"--rounds={rounds}",
          f"--output_dir={out_dir}"]


def _summary(out_dir):
  return json.loads((out_dir / "summary.json").read_text())


def test_failing_run_stops_its_worker(tmp_path):
  out_dir = tmp_path / "out"
  # The real main(), with round 2 of the FedAvg runner raising.
  code = textwrap.dedent(f"""
      import sys
      from tff_cluster import experiment as run_experiment
      from tff_cluster.algorithms.fedavg import fedavg
      original = fedavg.FedAvgDriver.run_round
      def run_round(self, round_num, sampled):
        if round_num == 2:
          raise RuntimeError("injected failure in round 2")
        return original(self, round_num, sampled)
      fedavg.FedAvgDriver.run_round = run_round
      sys.argv = {_cli(out_dir, 5)[1:]!r}
      sys.exit(run_experiment.main(sys.argv))
      """)
  rc, _, err, seen = run_watching_workers([sys.executable, "-c", code],
                                          cwd=str(REPO_ROOT), timeout=180)
  assert rc != 0
  assert "injected failure in round 2" in err
  assert seen, "the run should have started a TFF worker"
  assert_workers_gone(seen)
  # Partial results: round 1 only, marked incomplete.
  assert [r["round"] for r in read_metrics_csv(out_dir / "metrics.csv")] == [1.0]
  summary = _summary(out_dir)
  assert summary["completed"] is False and summary["rounds_completed"] == 1


@pytest.mark.parametrize("sig, expected_rc", [(signal.SIGINT, 130),
                                              (signal.SIGTERM, 128 + signal.SIGTERM)])
def test_interrupted_run_stops_its_worker(tmp_path, sig, expected_rc):
  out_dir = tmp_path / "out"
  rc, _, err, seen = run_watching_workers(
      _cli(out_dir, 1000), cwd=str(tmp_path), timeout=180, send_signal=sig,
      ready=lambda: metrics_rows_written(out_dir / "metrics.csv") >= 1)
  assert seen, "the run should have started a TFF worker"
  assert rc == expected_rc, err
  assert "Traceback" not in err
  assert_workers_gone(seen)
  summary = _summary(out_dir)
  assert summary["completed"] is False
  assert 1 <= summary["rounds_completed"] < 1000
  if sig == signal.SIGINT:
    last = err.strip().splitlines()[-1]
    assert last.startswith("run_experiment.py: error: interrupted") and str(out_dir) in last


def test_killed_run_takes_its_worker_down(tmp_path):
  # SIGKILL runs no cleanup at all: only PR_SET_PDEATHSIG can stop the worker.
  out_dir = tmp_path / "out"
  rc, _, _, seen = run_watching_workers(
      _cli(out_dir, 1000), cwd=str(tmp_path), timeout=180, send_signal=signal.SIGKILL,
      ready=lambda: metrics_rows_written(out_dir / "metrics.csv") >= 1)
  assert seen, "the run should have started a TFF worker"
  assert rc == -signal.SIGKILL
  assert_workers_gone(seen, timeout=5.0)


def test_the_runtime_signal_handler_runs_the_handler_installed_before():
  """A SIGTERM inside `tff_runtime()` also reaches the handler installed before
  it (the CLI's records the signal, so the training loop stops at its next
  check even when the handler's exception is swallowed, as one raised inside a
  garbage-collection callback is): the run cannot go on to its last round."""
  from tff_cluster.runners.tff import runtime
  calls = []

  def caller(signum, frame):
    calls.append(signum)
    raise SystemExit(128 + signum)

  old = signal.signal(signal.SIGTERM, caller)
  try:
    with pytest.raises(SystemExit) as raised:
      with runtime.tff_runtime():
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
  finally:
    signal.signal(signal.SIGTERM, old)
  assert calls == [signal.SIGTERM]
  assert raised.value.code == 128 + signal.SIGTERM


# ---------------------------------------------------------------------------
# tff.program drives our computations (scripts/tff_program_example.py).


# The script's three ways: its own loop (FedAvg), TFF's train_model (IFCA)
# and train_program (FedGroup). CI runs the first (each way is three programs
# in fresh processes, 68-110 s on a 2-core machine); the run and resume of the
# other two are also tests/test_tff_programs.py's
# test_train_model_runs_ifca_and_resumes_exactly and
# test_the_fedgroup_program_resumes_exactly_and_equals_the_tff_runner, in
# process. The other two are exhaustive-only (CI runs a slice).
PROGRAM_WAYS = [("fedavg", -1), ("ifca", 1), ("fedgroup", None)]


@pytest.mark.parametrize("algo,loss_column",
                         tiered(PROGRAM_WAYS, lambda w: w[0] == "fedavg"))
def test_a_tff_program_runs_and_resumes_from_its_program_state(algo, loss_column, tmp_path):
  """The example program runs FedAvg's round under
  tff.program.NativeFederatedContext (server-placed outputs) in a loop of its
  own, IFCA under TFF's train_model, or FedGroup under train_program, saves its state with a
  FileProgramStateManager and releases metrics to CSV; stopped after 2
  rounds and run again to 3, it gives the rows of an uninterrupted 3-round
  program; its worker is gone when it ends."""
  script = str(REPO_ROOT / "scripts" / "tff_program_example.py")

  def program(root, rounds):
    code, _, err, seen = run_watching_workers(
        [sys.executable, script, f"--root_dir={root}", f"--rounds={rounds}", f"--algo={algo}"],
        timeout=600)
    assert code == 0, err[-2000:]
    assert_workers_gone(seen, timeout=5.0)

  program(tmp_path / "a", 2)
  program(tmp_path / "a", 3)
  program(tmp_path / "b", 3)
  def rows(root):  # train_model releases its rounds' metrics concurrently: in any order
    header, *lines = (root / "metrics.csv").read_text().splitlines()
    return [header, *sorted(lines, key=lambda line: int(line.split(",")[0]))]

  a, b = rows(tmp_path / "a"), rows(tmp_path / "b")
  assert a == b and len(a) == 4, (a, b)  # a header and rounds 1..3
  assert sorted(os.listdir(tmp_path / "a" / "state"))[-1] == "program_state_3"
  if loss_column is None:  # train_program's rows: the CLI's metrics, train_loss among them
    loss_column = a[0].split(",").index("train_loss")
  losses = [float(line.split(",")[loss_column]) for line in a[1:]]
  assert all(np.isfinite(losses)) and len(set(losses)) == 3
