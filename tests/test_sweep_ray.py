"""Sweeps and the `ray` runner on a Ray cluster of three nodes on this machine
(Ray's own `ray.cluster_utils.Cluster`: a head with no CPUs and two worker
nodes of one CPU each, every node its own raylet, all on 127.0.0.1):

- a `--runner=ray` run with two actors puts one on each worker node
  (config.json's `runner_info`: each actor's `node`, `ray_nodes`) and gives
  the numbers of the same run on the `local` runner;
- a sweep of 8 cells as Ray tasks runs cells on both worker nodes; one worker
  node is removed while it runs a cell that has checkpoints; Ray runs that
  cell's task again on the other node, which resumes the cell; the sweep ends
  with every cell done and results.csv's numbers those of the same cells run
  one after another in one process;
- a sweep on the cluster stopped by SIGINT ends its running cells as
  interrupted runs.

Ray talks over loopback only here, as in tests/test_ray_runner.py: these
tests run inside a network namespace whose only interface is loopback
(`unshare -n`); run elsewhere, the module re-executes itself there
(`test_sweep_ray_tests_run_in_a_loopback_namespace`) and its other tests
skip. The test process never imports TensorFlow: every run is a process of
its own (the cells, the reference runs, the `ray` run's driver and actors).
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="needs the ray extra (today's stack)")

from tests.conftest import REPO_ROOT  # noqa: E402
from tests.helpers import (_is_descendant, read_metrics_csv,  # noqa: E402
                           rerun_in_loopback_namespace)
from tff_cluster.io import checkpoint  # noqa: E402
from tff_cluster.runners import ray_setup  # noqa: E402  (no TensorFlow)
from tff_cluster.sweep import cells, driver, execute, report  # noqa: E402

ISOLATED_ENV = "TFF_CLUSTER_SWEEP_RAY_ISOLATED"
ISOLATED = ray_setup.loopback_only()
needs_isolation = pytest.mark.skipif(
    not ISOLATED, reason="Ray tests run in a loopback-only network namespace: "
    "test_sweep_ray_tests_run_in_a_loopback_namespace runs them there")
LOOPBACK = "127.0.0.1"

# The `ray` runner's case and the local one: tests/test_ray_runner.py's
# tolerance for a command-line run on both (the shards' partial sums are added
# in another order).
RTOL, ATOL = 1e-4, 1e-6

ROUNDS = 6
SPEC = {
    "algos": ["fedavg", "ifca"], "tasks": ["synthetic_clusters", "synthetic"], "seeds": [0, 1],
    # No XLA: compiling costs more than these rounds (and the reference runs
    # choose alike whatever the machine).
    "flags": {"rounds": ROUNDS, "clients_per_round": 10, "num_clients": 30,
              "checkpoint_every": 1, "jit": "off"},
    "when": [{"algo": "ifca", "flags": {"num_groups": 3}}],
}
# results.csv's columns that are the runs' numbers (the timings are not).
NUMBERS = ("status", "final_test_accuracy", "final_test_accuracy_clientavg", "ari", "purity",
           "rounds_completed", "mb_per_round")

# Runs each (output folder, flags) of argv[1] (JSON) in this one process, one
# after another: the reference of the sweep's cells (one TensorFlow import).
_REFERENCE = """
import json, sys
from tff_cluster import experiment
for out, argv in json.loads(sys.argv[1]):
  code = experiment.main(["run_experiment.py", *argv, "--progress=false", "--output_dir=" + out])
  if code not in (0, None):
    sys.exit(f"reference run {out}: exit {code}")
"""


# Over 30 s (about 185 s on 2 cores): every other test of this file, run again
# in one fresh interpreter inside the namespace; its time is theirs. Serial:
# its cells and actors take both cores, and its node is removed in a window of
# a few rounds that a loaded machine moves.
@pytest.mark.slow
@pytest.mark.serial
def test_sweep_ray_tests_run_in_a_loopback_namespace():
  """Re-executes this module inside `unshare -n` (loopback only) and passes
  when every test there passes."""
  if ISOLATED:  # (before the helper, whose import of the ray runner costs TensorFlow's)
    pytest.skip("already in a loopback-only namespace (this is the inner run)")
  rerun_in_loopback_namespace(__file__, ISOLATED_ENV,
                              "Ray must not talk to the machine's network from the tests")


@contextlib.contextmanager
def _node_environment():
  """The environment a node starts in: a `ray start` on another host has no
  PYTHONPATH of the driver's (what its workers import comes from
  `ray_setup.init_kwargs`'s runtime_env); its workers, and so the cells, run
  at niceness 0 (Ray's default is 15; `init_kwargs` makes the same choice)."""
  old = {k: os.environ.get(k) for k in ("PYTHONPATH", "RAY_worker_niceness")}
  os.environ.pop("PYTHONPATH", None)
  os.environ["RAY_worker_niceness"] = "0"
  try:
    yield
  finally:
    for key, value in old.items():
      if value is None:
        os.environ.pop(key, None)
      else:
        os.environ[key] = value


@pytest.fixture(scope="module")
def cluster():
  """A head node (no CPUs: nothing runs there but the drivers' connections)
  and the worker nodes `two_workers` adds; every process stopped at the end."""
  from ray.cluster_utils import Cluster
  assert ray_setup.loopback_only()
  with _node_environment():
    made = Cluster(initialize_head=True, head_node_args=dict(
        num_cpus=0, node_ip_address=LOOPBACK, include_dashboard=False))
  try:
    yield made
  finally:
    if ray.is_initialized():  # (the sweep's driver, this process)
      ray.shutdown()
    made.shutdown()


@pytest.fixture
def two_workers(cluster):
  """The cluster with two live worker nodes of one CPU each (a node a test
  removed is replaced); their Ray node ids."""
  with _node_environment():
    while len(cluster.worker_nodes) < 2:
      cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK)
  cluster.wait_for_nodes()
  return sorted(n.node_id for n in cluster.worker_nodes)


def _node_pid(node) -> int:
  return node.all_processes["raylet"][0].process.pid


def _cmdline(pid: str) -> list:
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      return f.read().decode(errors="replace").split("\0")
  except OSError:
    return []


def _cells_running(out: str) -> dict:
  """pid -> cell folder of every process running a cell of the sweep in `out`."""
  found = {}
  prefix = f"--output_dir={out}{os.sep}"
  for pid in os.listdir("/proc"):
    if pid.isdigit():
      argv = _cmdline(pid)
      if "tff_cluster" in argv:
        for arg in argv:
          if arg.startswith(prefix):
            found[int(pid)] = arg.split("=", 1)[1]
  return found


def _compare_runs(a_dir, b_dir):
  """metrics.csv of two runs: the same rows, every number but the timings
  within the tolerance."""
  a, b = read_metrics_csv(a_dir / "metrics.csv"), read_metrics_csv(b_dir / "metrics.csv")
  assert len(a) == len(b) and a
  assert list(a[0]) == list(b[0])
  for row_a, row_b in zip(a, b):
    for name, x in row_a.items():
      if name.endswith("seconds"):
        continue
      y = row_b[name]
      assert (x is None) == (y is None), name
      if x is not None:
        np.testing.assert_allclose(y, x, rtol=RTOL, atol=ATOL, err_msg=name)


# About 50 s: the `ray` run's driver and its two actors each import
# TensorFlow (the local run alongside).
@pytest.mark.slow
@needs_isolation
def test_ray_runner_puts_an_actor_on_each_node_with_the_local_numbers(cluster, two_workers,
                                                                      tmp_path):
  """`--runner=ray --ray_workers=2` against the cluster: one actor on each
  worker node (SPREAD, one CPU each), the metrics of the same run on
  `local` (run at the same time, in its own process)."""
  flags = ["--algo=ifca", "--num_groups=3", "--task=synthetic_clusters", "--num_clients=20",
           "--clients_per_round=10", "--rounds=3", "--seed=3", "--jit=off", "--progress=false"]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  runs = {}
  for runner, extra in (("ray", ["--runner=ray", f"--ray_address={cluster.address}",
                                 "--ray_workers=2"]),
                        ("local", ["--runner=local"])):
    runs[runner] = subprocess.Popen(
        [sys.executable, "-m", "tff_cluster", *flags, *extra,
         f"--output_dir={tmp_path / runner}"], cwd=REPO_ROOT, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
  for runner, proc in runs.items():
    try:
      _, err = proc.communicate(timeout=400)
    finally:
      if proc.poll() is None:
        proc.kill()
    assert proc.returncode == 0, (runner, err)
  info = json.loads((tmp_path / "ray" / "config.json").read_text())["runner_info"]
  assert info["runner"] == "ray" and info["ray_address"] == cluster.address
  assert [a["clients"] for a in info["actors"]] == [10, 10]
  assert sorted(a["node"] for a in info["actors"]) == two_workers
  assert info["ray_nodes"] == 2
  _compare_runs(tmp_path / "local", tmp_path / "ray")
  summary = json.loads((tmp_path / "ray" / "summary.json").read_text())
  assert summary["completed"] is True and summary["rounds_completed"] == 3


class _NodeRemover(threading.Thread):
  """Watches a sweep's cells; once each worker node has finished a cell and
  every IFCA cell has started, removes (`cluster.remove_node`) the worker
  node running an IFCA cell whose latest checkpoint is of round 1 to
  ROUNDS - 3 (IFCA's rounds are the longer: the cell is still running when
  its node goes). The last IFCA cell to start qualifies, whatever order Ray
  runs the cells in; in the sweep's order it is the last cell, so the node
  left has at most one other cell to run before it resumes the lost one."""

  def __init__(self, cluster, out: str, ifca_cells, outcomes: list):
    super().__init__(daemon=True)
    self.cluster, self.out, self.outcomes = cluster, out, outcomes
    self.ifca = [os.path.join(out, path) for path in ifca_cells]
    self.stop = threading.Event()
    # (node id, cell folder, its checkpoint round, cells ended before)
    self.removed = None
    self.error = None

  def run(self):
    try:
      while not self.stop.is_set() and self.removed is None:
        self._step()
        time.sleep(0.05)
    except Exception as e:  # noqa: BLE001  (reported by the test)
      self.error = e

  def _step(self):
    nodes = {n.node_id: n for n in self.cluster.worker_nodes}
    ended = list(self.outcomes)
    if (not set(nodes) <= {o.node for _, o in ended}
        or not all(os.path.exists(os.path.join(d, cells.LOG)) for d in self.ifca)):
      return
    running = _cells_running(self.out)
    for node_id, node in nodes.items():
      raylet = _node_pid(node)
      for pid, cell_dir in running.items():
        if cell_dir not in self.ifca or not _is_descendant(pid, raylet):
          continue
        saved = checkpoint.rounds(cell_dir)
        if saved and 1 <= saved[-1] <= ROUNDS - 3:
          self.removed = (node_id, cell_dir, saved[-1], len(ended))
          self.cluster.remove_node(node)
          return


def _results(path) -> list:
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


# About 110 s: 8 cells and a resumed one, each a process importing
# TensorFlow, two at a time until the node goes near the end; the reference
# runs in one process alongside.
@pytest.mark.slow
@needs_isolation
def test_a_sweep_on_ray_loses_a_node_and_ends_with_the_local_numbers(cluster, two_workers,
                                                                   tmp_path):
  """Cells on both worker nodes; one node removed while it runs a cell with
  checkpoints; that cell resumed on the other node; every cell done, and
  results.csv's numbers (not the timings) equal to the same cells run one
  after another on this machine."""
  sweep = driver.resolve(SPEC)
  ref_out = tmp_path / "reference"
  jobs = [(str(ref_out / c.path), c.argv()) for c in sweep.cells]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  reference = subprocess.Popen([sys.executable, "-c", _REFERENCE, json.dumps(jobs)],
                               cwd=REPO_ROOT, env=env, text=True, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  out = str(tmp_path / "sweep")
  outcomes = []  # (cell path, Outcome), as each cell ends
  remover = _NodeRemover(cluster, out, [c.path for c in sweep.cells if c.algo == "ifca"],
                         outcomes)
  try:
    # Joined as the sweep joins (it finds Ray initialised): the workers of
    # nodes started without PYTHONPATH get the driver's import path.
    execute.connect_ray(cluster.address)
    paths = ray.get([ray.remote(lambda: os.environ.get("PYTHONPATH", "")).options(
        num_cpus=1).remote() for _ in range(2)])
    assert all(str(REPO_ROOT) in p.split(os.pathsep) for p in paths), paths
    remover.start()
    result = driver.sweep(SPEC, out=out, ray_address=cluster.address, progress=False,
                          plots=False, on_cell=lambda cell, o: outcomes.append((cell.path, o)))
  finally:
    remover.stop.set()
    if remover.is_alive():
      remover.join()
    ray.shutdown()  # this process's connection (the cluster stays for the next test)
    try:
      _, ref_err = reference.communicate(timeout=400)
    finally:
      if reference.poll() is None:
        reference.kill()
  assert remover.error is None, remover.error
  assert remover.removed is not None, f"no node was removed; cells ended: {outcomes}"
  lost, lost_cell, lost_round, ended_before = remover.removed
  survivor, = set(two_workers) - {lost}
  assert reference.returncode == 0, ref_err

  # Every cell done, once; cells ran on both nodes, and after the loss on the
  # other one only.
  assert result.failed == {}
  assert sorted(p for p, _ in outcomes) == sorted(c.path for c in sweep.cells)
  assert all(o.status == cells.DONE and o.ran for _, o in outcomes), outcomes
  assert {o.node for _, o in outcomes} == set(two_workers)
  assert {o.node for _, o in outcomes[ended_before:]} == {survivor}
  lost_path = os.path.relpath(lost_cell, out)
  assert dict(outcomes)[lost_path].node == survivor
  # The lost cell's second attempt resumed it from its checkpoints.
  with open(os.path.join(lost_cell, cells.LOG)) as f:
    starts = [ln for ln in f if ln.startswith("== ")]
  assert len(starts) == 2 and "--resume" not in starts[0] and "--resume" in starts[1], starts
  config = json.loads(open(os.path.join(lost_cell, "config.json")).read())
  assert config["resumed_from_round"] >= lost_round, config.get("resumed_from_round")
  assert not _cells_running(out)  # the lost attempt died with its node
  # ... and its rounds are the reference's, round by round (timings aside).
  rows = read_metrics_csv(os.path.join(lost_cell, "metrics.csv"))
  want_rows = read_metrics_csv(ref_out / lost_path / "metrics.csv")
  assert len(rows) == len(want_rows) == ROUNDS
  for row, want_row in zip(rows, want_rows):
    for name, value in want_row.items():
      if not name.endswith("seconds"):
        np.testing.assert_equal(row[name], value, err_msg=f"round {want_row['round']} {name}")

  # results.csv: the reference's numbers, cell by cell.
  report.write(sweep, str(ref_out), plots=False)
  got = _results(os.path.join(out, report.RESULTS_CSV))
  want = _results(ref_out / report.RESULTS_CSV)
  assert [r["run_dir"] for r in got] == [r["run_dir"] for r in want]
  for row_got, row_want in zip(got, want):
    for name in NUMBERS:
      assert row_got[name] == row_want[name], (row_want["run_dir"], name)
  assert all(r["final_test_accuracy"] for r in got)
  assert any(r["ari"] for r in got)  # (IFCA on the clustered task reports one)


@pytest.mark.slow
@needs_isolation
def test_a_stopped_sweep_on_ray_ends_its_running_cells_as_interrupted(cluster, two_workers,
                                                                     tmp_path):
  """SIGINT to the sweep's driver: each running cell's task is cancelled,
  its run gets SIGTERM and ends as an interrupted run (resumable), no cell
  process is left, and the sweep raises Stopped."""
  import signal
  out = str(tmp_path / "sweep")
  spec = {"algos": ["fedavg", "ifca"], "tasks": ["synthetic_clusters"], "seeds": [0],
          "flags": {"rounds": 500, "clients_per_round": 10, "num_clients": 30,
                    "checkpoint_every": 2, "eval_every": 100, "jit": "off"},
          "when": [{"algo": "ifca", "flags": {"num_groups": 3}}]}
  dirs = [os.path.join(out, "synthetic_clusters", a, "seed0") for a in ("fedavg", "ifca")]
  stop = threading.Event()

  def stopper():
    while not stop.wait(0.2):
      if all(max(checkpoint.rounds(d), default=0) >= 2 for d in dirs):
        os.kill(os.getpid(), signal.SIGINT)
        return

  thread = threading.Thread(target=stopper, daemon=True)
  thread.start()
  try:
    with pytest.raises(execute.Stopped):
      driver.sweep(spec, out=out, ray_address=cluster.address, progress=False, plots=False)
  finally:
    stop.set()
    thread.join()
    ray.shutdown()
  for d in dirs:
    with open(os.path.join(d, "summary.json")) as f:
      summary = json.load(f)
    assert summary["reason"] == "interrupted" and summary["rounds_completed"] < 500, summary
  assert not _cells_running(out)
