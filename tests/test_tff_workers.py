"""The `tff` runner on several TFF workers (`--tff_workers`): the same numbers
as one worker, one line when a worker cannot be reached.

The workers listen on every interface, so these tests run inside a network
namespace whose only interface is loopback (`unshare -n`): run elsewhere, the
module re-executes itself there and its other tests skip (all skip, with the
reason, where no namespace can be made).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

pytestmark = pytest.mark.tff
pytest.importorskip("tensorflow_federated", reason="needs the TFF stack")

from tff_cluster import tasks  # noqa: E402
from tests.conftest import REPO_ROOT  # noqa: E402
from tests.helpers import (assert_one_line_error, descendant_workers,  # noqa: E402
                           main_in_process, rerun_in_loopback_namespace)
from tff_cluster import registry
from tff_cluster.host import loop
from tff_cluster.host.driver import TrainingConfig
from tff_cluster.runners.config import RunnerConfig
from tff_cluster.runners.tff import runtime
from tff_cluster.runners.tff import workers  # noqa: E402
from tff_cluster.runners.ray_runner import loopback_only  # noqa: E402
from tff_cluster.spec.task import DataOptions  # noqa: E402

ISOLATED_ENV = "TFF_CLUSTER_TFF_ISOLATED"
ISOLATED = loopback_only()
SCRIPT = str(REPO_ROOT / "run_experiment.py")
needs_isolation = pytest.mark.skipif(
    not ISOLATED, reason="TFF workers run in a loopback-only network namespace: "
    "test_tff_worker_tests_run_in_a_loopback_namespace runs them there")


# Over 30 s (about 77 s on 2 cores in CI): it is every other test of this
# file, run again in one fresh interpreter inside the namespace; its time is
# theirs (three workers started once for the file).
def test_tff_worker_tests_run_in_a_loopback_namespace():
  rerun_in_loopback_namespace(__file__, ISOLATED_ENV,
                              "TFF workers listen on every interface")


@pytest.fixture(scope="module")
def three_workers():
  # This process's own workers only: another test process (pytest-xdist's
  # other worker) may start and stop its own meanwhile.
  before = descendant_workers(os.getpid())
  with workers.local_workers(3) as addresses:
    yield addresses
  time.sleep(0.5)
  assert not (descendant_workers(os.getpid()) - before), "a worker outlived local_workers"


def _run(algo, options, addresses):
  """3 rounds of `algo` on the tff runner: one worker (the runtime's own) or
  `addresses`; persisted client momentum (per-client state)."""
  task = tasks.get_task("synthetic_clusters")
  data = task.load_data(DataOptions(seed=2, num_clients=16, extra={"num_clusters": 3}))
  config = TrainingConfig(
      rounds=3, clients_per_round=8, local_epochs=1, batch_size=10, client_lr=0.02, seed=1,
      runner=RunnerConfig("tff",
                          tff_workers=None if addresses is None else ",".join(addresses),
                          tff_worker_grace=10), client_momentum=0.5, client_state="persist")
  driver = registry.build_driver(algo, task, data, config, **options)
  try:
    summary = loop.run_training(task, data, config, driver, None, progress=False)
  finally:
    runtime.use_own_worker()
  weights, client_model = driver.eval_models()
  return summary, weights, np.asarray(client_model), driver


@needs_isolation
@pytest.mark.parametrize("algo,options", [("fedavg", {}),
                                          ("fedgroup", dict(num_groups=3, pretrain_scale=2))])
def test_two_and_three_workers_equal_one(algo, options, three_workers):
  """Uneven chunks (8 clients over 3 workers: 3/3/2): the same group
  assignments and accuracies, weights within 1e-6; FedGroup's per-client
  outputs (its groups) come back in the clients' order."""
  one = _run(algo, options, None)
  for k in (2, 3):
    got = _run(algo, options, three_workers[:k])
    assert got[0]["final_test_accuracy"] == one[0]["final_test_accuracy"]
    np.testing.assert_array_equal(got[2], one[2])
    for wa, wb in zip(got[1], one[1]):
      for a, b in zip(wa, wb):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert got[3].describe()["workers"] == three_workers[:k]


@needs_isolation
def test_an_unreachable_worker_is_one_line_and_exit_2(tmp_path, three_workers, capsys):
  """One address answers, one does not: exit 2 within the grace + 5 s, one
  error line, no run directory left. (The CLI in this process: its exit
  code, stderr and files are a process's; the killed worker's case below
  runs it as one.)"""
  import portpicker
  dead = f"127.0.0.1:{portpicker.pick_unused_port()}"
  start = time.monotonic()
  code, _, err = main_in_process(
      ["--runner=tff", f"--tff_workers={three_workers[0]},{dead}", "--tff_worker_grace=3",
       "--rounds=1", "--progress=false", f"--output_dir={tmp_path / 'run'}"], capsys)
  elapsed = time.monotonic() - start
  assert_one_line_error(code, err, tmp_path / "run", dead)
  assert elapsed < 3 + 5 + 30  # the grace, 5 s, and tracing the round's TFF computations


def test_tff_worker_flags_need_the_tff_runner(tmp_path, capsys):
  """(The CLI in this process: a usage error's exit code and line.)"""
  code, _, err = main_in_process(["--tff_workers=127.0.0.1:5", "--rounds=1",
                                  "--progress=false", f"--output_dir={tmp_path / 'run'}"],
                                 capsys)
  assert_one_line_error(code, err, tmp_path / "run", "valid: --runner=tff with them")
  code, _, err = main_in_process(["--runner=tff", "--tff_workers=nohost", "--rounds=1",
                                  "--progress=false", f"--output_dir={tmp_path / 'r2'}"], capsys)
  assert_one_line_error(code, err, tmp_path / "r2", "valid: HOST:PORT[,HOST:PORT...]")


# About 35 s: a run whose TFF worker is killed mid-run, then its resume on
# new workers; the workers are processes, which is what it tests.
@needs_isolation
def test_a_killed_worker_ends_the_run_and_resume_finishes_it(tmp_path, capsys):
  """A worker SIGKILLed after a checkpoint: one error line naming it, exit 4,
  summary `worker_lost` with the checkpoint round; `--resume` on two fresh
  workers (other ports) finishes with the final models of an uninterrupted
  run on the process's own worker."""
  import signal
  rounds, run = 12, tmp_path / "run"
  common = ["--runner=tff", "--algo=fedavg", "--task=synthetic", "--clients_per_round=8",
            "--local_epochs=1", f"--rounds={rounds}", "--progress=false"]
  with workers.local_workers(2) as addresses:
    process = subprocess.Popen(
        [sys.executable, SCRIPT, *common, f"--tff_workers={','.join(addresses)}",
         "--tff_worker_grace=3", "--checkpoint_every=1", f"--output_dir={run}"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (run / "checkpoints" / "round-000002.npz").exists():
      assert process.poll() is None and time.monotonic() < deadline, "no checkpoint"
      time.sleep(0.2)
    port = addresses[1].rpartition(":")[2]
    listening = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True,
                               text=True).stdout
    pid = int(listening.split("pid=")[1].split(",")[0])
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    _, err = process.communicate(timeout=300)
    assert process.returncode == 4, err[-2000:]
    assert time.monotonic() - killed < 3 + 10
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and addresses[1] in errors[0] and "Traceback" not in err, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["reason"] == "worker_lost" and summary["checkpoint_round"] >= 2
  # The resume and the uninterrupted run in this process (a TensorFlow
  # import less each).
  with workers.local_workers(2) as fresh:
    code, _, err = main_in_process(["--resume", f"--output_dir={run}",
                                    f"--tff_workers={','.join(fresh)}"], capsys)
    assert code == 0, err[-2000:]
  code, _, err = main_in_process([*common, f"--output_dir={tmp_path / 'whole'}"], capsys)
  assert code == 0, err[-2000:]
  for name in ("model_0.npz",):
    with np.load(run / "models" / "final" / name) as a, \
         np.load(tmp_path / "whole" / "models" / "final" / name) as b:
      for key in a.files:
        np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-6)
  assert json.loads((run / "summary.json").read_text())["completed"] is True
