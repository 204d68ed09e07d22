"""The `ray` runner: the same numbers as `local` for every algorithm, a lost
actor as one line and exit 4, a stop signal as `local` closes it, its flags.

Ray talks over loopback only here: these tests run inside a network namespace
whose only interface is loopback (`unshare -n`). Run elsewhere, the module
re-executes itself there (`test_ray_tests_run_in_a_loopback_namespace`) and
its other tests skip; where no namespace can be made (not root, no
`unshare`), they all skip with the reason. One Ray instance (2 CPUs) serves
the module; the runners share its actors.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="needs the ray extra (today's stack)")

from tff_cluster import tasks  # noqa: E402
from tff_cluster.host.driver import TrainingConfig
from tff_cluster.runners.config import RunnerConfig
from tests.conftest import REPO_ROOT, tiered  # noqa: E402
from tests.helpers import (_is_descendant, metrics_rows_written,  # noqa: E402
                           rerun_in_loopback_namespace)
from tests.test_runners import (PARITY_CASES, RTOL, ATOL, SOLVER_CASES,  # noqa: E402
                                _run, assert_same_run)
from tff_cluster import interrupts  # noqa: E402
from tff_cluster.runners import ray_runner  # noqa: E402
from tff_cluster.spec.task import DataOptions  # noqa: E402

ISOLATED_ENV = "TFF_CLUSTER_RAY_ISOLATED"
SCRIPT = str(REPO_ROOT / "run_experiment.py")


ISOLATED = ray_runner.loopback_only()
needs_isolation = pytest.mark.skipif(
    not ISOLATED, reason="Ray tests run in a loopback-only network namespace: "
    "test_ray_tests_run_in_a_loopback_namespace runs them there")


# Over 30 s (about 300 s on 2 cores in CI): it is every other test of this
# file, run again in one fresh interpreter inside the namespace with one Ray
# cluster for them all; its time is theirs (the inner ones over 30 s say why).
@pytest.mark.slow
def test_ray_tests_run_in_a_loopback_namespace():
  """Re-executes this module inside `unshare -n` (loopback only) and passes
  when every test there passes."""
  rerun_in_loopback_namespace(__file__, ISOLATED_ENV,
                              "Ray must not talk to the machine's network from the tests")


@pytest.fixture(scope="module")
def ray_instance():
  """One Ray instance (2 CPUs) for the module; the runners' actors are pooled."""
  assert ray_runner.loopback_only()
  ray.init(**ray_runner.init_kwargs(num_cpus=2))
  yield
  ray_runner.shutdown()
  ray.shutdown()


@pytest.fixture(scope="module")
def uneven_data():
  """25 clients: 2 workers get shards of 13 and 12."""
  task = tasks.get_task("synthetic_clusters")
  data = task.load_data(DataOptions(seed=2, num_clients=25, extra={"num_clusters": 3}))
  return task, data


def test_shards_are_contiguous_and_differ_by_at_most_one():
  assert ray_runner.shard_bounds(25, 2) == [0, 13, 25]
  assert ray_runner.shard_bounds(10, 4) == [0, 3, 6, 8, 10]
  assert ray_runner.shard_bounds(3, 8) == [0, 1, 2, 3]  # one client per actor at most
  with pytest.raises(ValueError, match="valid: >= 1"):
    ray_runner.shard_bounds(3, 0)


# Client states (momentum persisted between rounds) travel to the actors and
# back; algorithms with their own momentum run the rest of the case.
SOLVER = "steps_momentum_persist_decay"
# One algorithm for each kind of what the actors hold or send back: plain
# updates (FedAvg), per-client losses over K models (IFCA), host-driven modes
# and update vectors (FedGroup), a mixture kept per client and per-example
# weights (FedEM), a personal model (Ditto), a mask with a personal head
# (FedRep), every client every round (pFedMo), a gradient exchange before the
# local steps (Mime), and one-shot summaries computed where the data lives
# (PACFL). The others
# run one of these client functions and states in the actors: exhaustive-only
# (CI runs a slice of them); APFL's (a personal model, as Ditto's, with its
# own mixing weight in the client state) among them, the slowest (about 40 s).
RAY_KINDS = ("fedavg", "ifca", "fedgroup", "fedem", "ditto", "fedrep", "pfedmo", "mime",
             "pacfl")
RAY_CASES = tiered(sorted(PARITY_CASES), lambda a: a in RAY_KINDS)


def test_the_ray_kinds_name_registered_algorithms():
  assert set(RAY_KINDS) <= set(PARITY_CASES)


# APFL's case takes about 40 s (two models per client on the actors, and the
# local runner's run to compare; exhaustive-only); the others 5-20 s.
@needs_isolation
@pytest.mark.parametrize("algo", RAY_CASES)
def test_ray_gives_the_local_runners_numbers(algo, ray_instance, uneven_data, tmp_path):
  """Both runners without XLA (the compilation was most of each case's time;
  the other tests here run the actors with XLA where `auto` picks it)."""
  task, data = uneven_data
  options = dict(PARITY_CASES[algo][0])
  options["_config"] = {**options.get("_config", {}), "jit": "off"}
  with_workers = dict(options, _config={**options["_config"], "ray_workers": 2})
  assert_same_run(_run(task, data, algo, options, "local", tmp_path, SOLVER_CASES[SOLVER]),
                  _run(task, data, algo, with_workers, "ray", tmp_path, SOLVER_CASES[SOLVER]),
                  options.get("_weights_atol", ATOL))


# About 10 s: the order statistics' host step reads every client's delta,
# which the actors send back with their results (docs/privacy.md).
@needs_isolation
def test_ray_gives_the_local_runners_median_of_the_clients_deltas(ray_instance, uneven_data,
                                                                   tmp_path):
  task, data = uneven_data
  options = {"num_groups": 2, "_config": {"jit": "off", "aggregator": "median"}}
  with_workers = dict(options, _config={**options["_config"], "ray_workers": 2})
  assert_same_run(_run(task, data, "ifca", dict(options), "local", tmp_path, SOLVER_CASES[SOLVER], rounds=2),
                  _run(task, data, "ifca", with_workers, "ray", tmp_path, SOLVER_CASES[SOLVER],
                       rounds=2))


# About 35 s: the only test of the actors' side-by-side clients (each actor
# traces the stacked round of K models); one algorithm.
@needs_isolation
@pytest.mark.parametrize("algo", ["ifca"])
def test_actors_train_their_clients_side_by_side(algo, ray_instance, uneven_data, tmp_path):
  """--client_batching=parallel in the actors (each shard's share of a round
  padded to the same count, the padding never trained): local's sequential
  numbers."""
  task, data = uneven_data
  options = PARITY_CASES[algo][0]
  parallel = dict(options, _config={**options.get("_config", {}), "ray_workers": 2,
                                    "client_batching": "parallel", "client_chunk": 2})
  sequential = _run(task, data, algo, options, "local", tmp_path, SOLVER_CASES[SOLVER])
  on_ray = _run(task, data, algo, parallel, "ray", tmp_path, SOLVER_CASES[SOLVER])
  assert_same_run(sequential, on_ray)


def _train(task, data, runner, rounds, tmp_path, name, workers=None, resume=None,
           checkpoint_dir=None):
  """FedAvg with persisted client momentum for `rounds` rounds: (rows, driver)."""
  from tff_cluster import registry
  from tff_cluster.host import loop
  from tff_cluster.io.results import ResultsWriter
  config = TrainingConfig(
      rounds=rounds, clients_per_round=8, batch_size=10, client_lr=0.02, seed=1,
      runner=RunnerConfig(runner, ray_workers=workers), **SOLVER_CASES[SOLVER])
  driver = registry.build_driver("fedavg", task, data, config)
  os.makedirs(tmp_path / name, exist_ok=True)
  writer = ResultsWriter(str(tmp_path / name), [*loop.BASE_COLUMNS], tensorboard=False,
                         figures=False,
                         resume_rows=None if resume is None else resume["rows"])
  loop.run_training(task, data, config, driver, writer, progress=False,
                          checkpoint_dir=checkpoint_dir, checkpoint_every=1, resume=resume)
  writer.close()
  return writer.rows, driver


def _same_rows(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    for key in ("train_loss", "test_loss", "loss_ratio", "test_accuracy_clientavg",
                "test_macro_f1"):
      np.testing.assert_allclose(x[key], y[key], rtol=RTOL, atol=ATOL, err_msg=key)
    assert x["test_accuracy"] == y["test_accuracy"]


@needs_isolation
def test_actors_make_their_clients_and_keep_their_states(ray_instance, tmp_path):
  """`samples_per_client` data: the driver holds only the catalogue, the
  actors make their own clients, evaluate them and keep their momentum
  buffers; the rows and each client's buffer equal the local runner's on
  the same (materialized) data."""
  from tff_cluster.data.federated import LazyFederatedData
  task = tasks.get_task("synthetic")
  lazy = task.load_data(DataOptions(seed=2, num_clients=25, extra={"samples_per_client": 30}))
  rows_ray, on_ray = _train(task, lazy, "ray", 3, tmp_path, "ray", workers=2)
  rows_local, local = _train(task, lazy, "local", 3, tmp_path, "local")
  assert isinstance(on_ray.data, LazyFederatedData)  # never materialized on the driver
  assert not isinstance(local.data, LazyFederatedData)
  assert isinstance(on_ray.client_states, ray_runner.ActorClientStates)
  _same_rows(rows_ray, rows_local)
  assert sorted(on_ray.client_states) == sorted(local.client_states)
  assert 8 < len(local.client_states) < 25  # some clients trained, not all
  for key, theirs in on_ray.client_states.items():
    for a, b in zip(theirs["velocity"], local.client_states[key]["velocity"]):
      np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)
  # The actors hold the arrays: the driver's runner has none of its own.
  assert not hasattr(on_ray.runner, "_x")


@needs_isolation
def test_a_file_backed_task_is_read_by_the_actors(ray_instance, tmp_path):
  """LEAF FEMNIST through the CLI's loader with --runner=ray: the driver
  keeps the catalogue, each actor reads the files and keeps its shard; the
  rows and buffers equal the local runner's on the whole data."""
  from tff_cluster import experiment as run_experiment
  from tff_cluster.data.federated import LazyFederatedData
  from tff_cluster.cli import load_task_data
  from tests.conftest import SHARED_DATA
  femnist = SHARED_DATA / "femnist_leaf"
  if not femnist.exists():
    pytest.skip(f"needs {femnist}")
  run_experiment.FLAGS.unparse_flags()
  run_experiment.FLAGS(["run_experiment.py", "--algo=fedavg", "--task=femnist",
                        f"--data_dir={femnist}", "--num_clients=13", "--clients_per_round=8",
                        "--runner=ray", "--ray_workers=2"])
  settings = run_experiment.resolve_settings(run_experiment._flag_values())  # noqa: SLF001
  task = tasks.get_task("femnist")
  data = load_task_data(settings, task)
  assert isinstance(data, LazyFederatedData)
  rows_ray, on_ray = _train(task, data, "ray", 2, tmp_path, "ray", workers=2)
  rows_local, local = _train(task, load_task_data(dict(settings, runner="local"), task),
                             "local", 2, tmp_path, "local")
  assert isinstance(on_ray.data, LazyFederatedData)
  _same_rows(rows_ray, rows_local)
  for key, theirs in on_ray.client_states.items():
    for a, b in zip(theirs["velocity"], local.client_states[key]["velocity"]):
      np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


@needs_isolation
def test_a_checkpoint_resumes_on_another_sharding(ray_instance, tmp_path):
  """Rounds 1-2 on 2 actors, checkpointed (per-client states written by
  client), rounds 3-4 resumed on 1 actor, and on the local runner: both
  equal 4 uninterrupted local rounds, momentum buffers included."""
  from tff_cluster.io import checkpoint
  task = tasks.get_task("synthetic")
  lazy = task.load_data(DataOptions(seed=5, num_clients=19, extra={"samples_per_client": 24}))
  run = tmp_path / "ckpt"
  _train(task, lazy, "ray", 2, tmp_path, "first", workers=2, checkpoint_dir=str(run))
  assert os.listdir(checkpoint.clients_dir(str(run), 2))  # the states beside the archive
  whole, reference = _train(task, lazy, "local", 4, tmp_path, "whole")
  for runner, workers in (("ray", 1), ("local", None)):
    _, payload = checkpoint.load_latest(str(run))
    rows, resumed = _train(task, lazy, runner, 4, tmp_path, f"again-{runner}", workers=workers,
                           resume=payload)
    _same_rows(rows, whole)
    assert sorted(resumed.client_states) == sorted(reference.client_states)
    for key, theirs in resumed.client_states.items():
      for a, b in zip(theirs["velocity"], reference.client_states[key]["velocity"]):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


@needs_isolation
def test_local_to_ray_to_local_resume_gives_the_uninterrupted_runs_metrics(ray_instance, tmp_path,
                                                                           capsys):
  """From the command line, in this process (the module's Ray instance):
  round 1 on local, round 2 resumed on ray (local -> ray), round 3 resumed on
  local (ray -> local, whose config.json names --ray_workers): the metrics of
  one local run of 3 rounds."""
  from tests.helpers import SMALL_ARGS, main_in_process, read_metrics_csv
  flags = ["--algo=fedavg", *SMALL_ARGS, "--num_clients=6", "--clients_per_round=3",
           "--checkpoint_every=1", "--jit=off"]

  def main(args):
    code, _, err = main_in_process(args, capsys)
    assert code in (0, None), err

  whole, run = tmp_path / "whole", tmp_path / "run"
  main([*flags, "--rounds=3", f"--output_dir={whole}"])
  main([*flags, "--rounds=1", f"--output_dir={run}"])
  main(["--resume", f"--output_dir={run}", "--rounds=2", "--runner=ray", "--ray_workers=1"])
  assert json.loads((run / "config.json").read_text())["runner"] == "ray"
  main(["--resume", f"--output_dir={run}", "--rounds=3", "--runner=local"])
  config = json.loads((run / "config.json").read_text())
  assert config["runner"] == "local" and config["resumed_from"]["runner"] == "ray"
  a, b = read_metrics_csv(whole / "metrics.csv"), read_metrics_csv(run / "metrics.csv")
  assert len(a) == len(b) == 3
  for row_a, row_b in zip(a, b):
    for name, x in row_a.items():
      if name.endswith("seconds") or x is None:
        continue
      # The ray runner adds the shards' partial sums in another order.
      np.testing.assert_allclose(row_b[name], x, rtol=1e-4, atol=1e-6, err_msg=name)


def _cli(*flags, timeout=600):
  return subprocess.run([sys.executable, SCRIPT, "--task=synthetic", "--progress=false",
                         *flags], cwd=REPO_ROOT, capture_output=True, text=True,
                        timeout=timeout)


# Over 30 s (about 95 s): two command-line processes (a TensorFlow import and
# a Ray start each), an actor killed mid-run, then the resume to the end; the
# process, Ray's failure and the exit status are what it tests.
@needs_isolation
def test_a_killed_actor_ends_the_run_and_resume_finishes_it(tmp_path):
  """An actor killed by PID mid-run: one line naming it, exit 4 within 10 s,
  summary `worker_lost` with its checkpoint; --resume (on another number of
  actors) then gives the metrics of a run never interrupted."""
  # Rounds of about 0.1 s: enough of them that the kill lands mid-run.
  rounds = 40
  flags = ["--algo=fedavg", "--num_clients=20", "--clients_per_round=6", f"--rounds={rounds}",
           "--local_epochs=1", "--checkpoint_every=1"]
  whole = tmp_path / "whole"  # (the uninterrupted run in this process)
  from tff_cluster import experiment as run_experiment
  assert run_experiment.main(["run_experiment.py", "--task=synthetic", "--progress=false",
                              *flags, "--runner=local", f"--output_dir={whole}"]) == 0
  run = tmp_path / "run"
  proc = subprocess.Popen([sys.executable, SCRIPT, "--task=synthetic", "--progress=false",
                           *flags, "--runner=ray", "--ray_workers=2", f"--output_dir={run}"],
                          cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  config = run / "config.json"
  deadline = time.monotonic() + 300
  pid = None
  while time.monotonic() < deadline and pid is None:
    rows = (run / "metrics.csv").read_text().count("\n") if (run / "metrics.csv").exists() else 0
    if config.exists() and rows >= 3:  # header + 2 rounds done
      pid = json.loads(config.read_text())["runner_info"]["actors"][1]["pid"]
    time.sleep(0.2)
  assert pid is not None, "the run did not reach round 2"
  os.kill(pid, signal.SIGKILL)
  killed = time.monotonic()
  out, err = proc.communicate(timeout=120)
  assert time.monotonic() - killed < 10 + 5  # + the interpreter's exit
  assert proc.returncode == 4, err
  last = err.strip().splitlines()[-1]
  assert "Ray worker 1" in last and f"pid {pid}" in last and "worker_lost" in last, err
  assert "Traceback" not in err
  summary = json.loads((run / "summary.json").read_text())
  assert summary["reason"] == "worker_lost" and summary["completed"] is False
  assert 2 <= summary["checkpoint_round"] < rounds
  # Resumed on 3 actors: the clients are cut into other shards, the rounds are
  # the same.
  done = _cli(*flags, "--runner=ray", "--ray_workers=3", f"--output_dir={run}", "--resume")
  assert done.returncode == 0, done.stderr
  assert [a["clients"] for a in json.loads(config.read_text())["runner_info"]["actors"]] \
      == [7, 7, 6]
  a = (whole / "metrics.csv").read_text().splitlines()
  b = (run / "metrics.csv").read_text().splitlines()
  assert len(a) == len(b) == rounds + 1
  cols = a[0].split(",")
  for la, lb in zip(a[1:], b[1:]):
    for name, x, y in zip(cols, la.split(","), lb.split(",")):
      if name.endswith("seconds") or x == y:
        continue
      np.testing.assert_allclose(float(x), float(y), rtol=RTOL, atol=ATOL, err_msg=name)


def _start_time(pid: int):
  """A live process's start time (clock ticks since boot), or None: with its
  pid it names the process, whatever later reuses the pid."""
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      raw = f.read().decode("ascii", "replace")
  except OSError:
    return None
  fields = raw[raw.rindex(")") + 2:].split()  # from field 3 (the state) on
  return None if fields[0] in ("Z", "X") else int(fields[19])


def _descendants(ancestor: int) -> dict:
  """Live processes below `ancestor` in the process tree: pid -> start time."""
  found = {}
  for name in os.listdir("/proc"):
    if name.isdigit() and _is_descendant(int(name), ancestor):
      started = _start_time(int(name))
      if started is not None:
        found[int(name)] = started
  return found


def _alive(processes: dict) -> set:
  return {pid for pid, started in processes.items() if _start_time(pid) == started}


# About 34 s: a command-line run with its Ray cluster, signalled mid-run; the
# signal and how the process closes are what it tests.
@needs_isolation
def test_sigterm_closes_a_ray_run_like_a_local_one(tmp_path):
  """SIGTERM mid-run (ray.init puts Ray's handlers over the run's; they aborted
  it, exit 134): the round's records and checkpoint finished, one line, exit
  143, and no process the run started (Ray's among them) left running. Rounds
  of 10 clients x 20 epochs: the signal mostly lands while the driver waits on
  the actor."""
  run = tmp_path / "run"
  proc = subprocess.Popen(
      [sys.executable, SCRIPT, "--task=synthetic", "--progress=false", "--algo=fedavg",
       "--num_clients=20", "--clients_per_round=10", "--local_epochs=20", "--rounds=100",
       "--checkpoint_every=1", "--runner=ray", "--ray_workers=1", f"--output_dir={run}"],
      cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      stdin=subprocess.DEVNULL)
  started = {}
  try:
    deadline = time.monotonic() + 300
    while metrics_rows_written(run / "metrics.csv") < 1:
      assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
      time.sleep(0.05)
    started = _descendants(proc.pid)
    assert started, "the run started no Ray process"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      proc.kill()
    deadline = time.monotonic() + 15
    while _alive(started) and time.monotonic() < deadline:
      time.sleep(0.1)
    left = _alive(started)
    for pid in left:
      os.kill(pid, signal.SIGKILL)
  assert not left, f"processes {sorted(left)} of the run outlived it"
  assert proc.returncode == 128 + signal.SIGTERM, err
  lines = [l for l in err.splitlines() if l.startswith("run_experiment.py")]
  assert len(lines) == 1 and "interrupted; partial results" in lines[0], err
  assert "Traceback" not in err and "logging.cc" not in err
  summary = json.loads((run / "summary.json").read_text())
  assert summary["completed"] is False and summary["reason"] == "interrupted"
  assert summary["checkpoint_round"] == summary["rounds_completed"] >= 1
  assert metrics_rows_written(run / "metrics.csv") == summary["rounds_completed"]


class _FakeRay:
  """`ray` as `connect` sees it, whose `init` puts its own handlers over the
  stop signals' (as `ray.init` does SIGTERM's), or exits as Ray's SIGTERM
  handler does (`exit_code`), or receives `signum` while it starts."""

  def __init__(self, exit_code=None, signum=None):
    self.exit_code = exit_code
    self.signum = signum
    self.initialized = False
    self.stopped = False

  def is_initialized(self):
    return self.initialized

  def init(self, **kwargs):
    self.kwargs = kwargs
    if self.signum is not None:
      os.kill(os.getpid(), self.signum)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
      signal.signal(sig, signal.SIG_DFL)
    if self.exit_code is not None:
      sys.exit(self.exit_code)
    self.initialized = True

  def shutdown(self):
    self.initialized, self.stopped = False, True

  def get(self, refs):
    """Receives `signum` while it waits; a SystemExit its handler raises
    comes out as SystemExit(1), as it does out of `ray.get`."""
    del refs
    try:
      os.kill(os.getpid(), self.signum)
      time.sleep(5)
    except SystemExit:
      raise SystemExit(1) from None
    raise AssertionError("the signal's handler did not raise")


@pytest.fixture
def fake_ray(monkeypatch):
  """Installs a handler like the CLI's on the stop signals (notes the signal;
  raises SystemExit(128 + signum) unless deferred); yields it and a function
  that makes `ray_runner` use a `_FakeRay`."""
  monkeypatch.setattr(ray_runner, "_POOL", None)
  before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}

  def run_handler(signum, frame):
    del frame
    interrupts.note(signum)
    if not interrupts.are_deferred():
      raise SystemExit(128 + signum)

  for sig in before:
    signal.signal(sig, run_handler)
  interrupts.note(None)
  yield run_handler, lambda fake: monkeypatch.setattr(ray_runner, "import_ray", lambda: fake)
  for sig, old in before.items():
    signal.signal(sig, old)
  interrupts.note(None)


def test_starting_ray_keeps_the_runs_stop_signal_handlers(fake_ray):
  run_handler, use = fake_ray
  use(_FakeRay())
  ray_runner.connect(1, None)
  for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    assert signal.getsignal(sig) is run_handler, sig


def test_without_an_address_a_run_starts_its_own_ray_not_one_left_on_the_machine(
    fake_ray, monkeypatch):
  """`ray.init()` with no address joins the cluster named in Ray's address
  file (a `ray start --head`'s, or a test cluster's that was killed before
  it removed the file; CI met one and refused our num_cpus); the run's
  arguments make Ray start a new instance, as Ray itself resolves them."""
  from ray._private import services
  _, use = fake_ray
  monkeypatch.delenv("RAY_ADDRESS", raising=False)
  monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir: "127.0.0.1:9")
  assert services.get_ray_address_from_environment(None, None) == "127.0.0.1:9"
  fake = _FakeRay()
  use(fake)
  ray_runner.connect(2, None)
  assert fake.kwargs["num_cpus"] == 2
  assert services.canonicalize_bootstrap_address(fake.kwargs["address"]) is None


def test_ray_address_in_the_environment_is_joined_and_named_when_it_fails(fake_ray, monkeypatch):
  """Without --ray_address, Ray's RAY_ADDRESS (a Ray job's) is the cluster to
  join: checked first, and the one line names where the address came from."""
  _, use = fake_ray
  fake = _FakeRay()
  use(fake)
  monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:9")
  with pytest.raises(ray_runner.RayUnavailable,
                     match=r"^RAY_ADDRESS=127\.0\.0\.1:9: no Ray cluster answers there"):
    ray_runner.connect(2, None)
  assert not fake.initialized
  with pytest.raises(ray_runner.RayUnavailable, match=r"^--ray_address=127\.0\.0\.1:8: "):
    ray_runner.connect(2, "127.0.0.1:8")  # the flag over the environment


def test_a_sigterm_rays_handler_takes_closes_the_run_as_interrupted(fake_ray):
  """Ray's own SIGTERM handler, where it is in force inside ray.init, exits
  with 1 (or 15): the run sees SIGTERM's SystemExit(143), its handlers back."""
  run_handler, use = fake_ray
  for code in (1, 15):
    use(_FakeRay(exit_code=code))
    with pytest.raises(SystemExit) as raised:
      ray_runner.connect(1, None)
    assert raised.value.code == 128 + signal.SIGTERM
    assert interrupts.received() == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is run_handler


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_ray_starts_stops_ray_then_the_run(fake_ray, sig):
  """Noted while Ray starts (raising inside ray.init left Ray's agents
  running), then Ray is stopped and the run closes: SystemExit(128 + sig)."""
  _, use = fake_ray
  fake = _FakeRay(signum=sig)
  use(fake)
  with pytest.raises(SystemExit) as raised:
    ray_runner.connect(1, None)
  assert raised.value.code == 128 + sig
  assert fake.stopped and ray_runner._POOL is None  # noqa: SLF001


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_the_driver_waits_on_ray_keeps_its_exit_status(fake_ray, sig):
  """Ray turns a handler's SystemExit(128 + sig) inside `ray.get` into
  SystemExit(1) (measured), which ended the run with no line and exit 1."""
  runner = ray_runner.RayRunner.__new__(ray_runner.RayRunner)
  runner._ray = _FakeRay(signum=sig)  # noqa: SLF001
  with pytest.raises(SystemExit) as raised:
    runner._get([])  # noqa: SLF001
  assert raised.value.code == 128 + sig


@needs_isolation
def test_unreachable_ray_address_is_one_line_exit_2(tmp_path):
  start = time.monotonic()
  done = _cli("--algo=fedavg", "--rounds=1", "--runner=ray", "--ray_address=127.0.0.1:9",
              f"--output_dir={tmp_path / 'r'}", timeout=120)
  assert time.monotonic() - start < 30 + 30  # the check's 30 s + start-up
  assert done.returncode == 2, done.stderr
  lines = done.stderr.strip().splitlines()
  assert "--ray_address=127.0.0.1:9" in lines[-1] and "Traceback" not in done.stderr
  assert not (tmp_path / "r").exists()  # nothing half-written


def test_ray_flags_without_the_ray_runner_are_a_usage_error(tmp_path):
  for flag in ("--ray_workers=2", "--ray_address=127.0.0.1:6379"):
    done = _cli("--algo=fedavg", "--rounds=1", flag, f"--output_dir={tmp_path / 'r'}",
                timeout=120)
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert flag.split("=")[0] in last and "--runner=ray" in last
    assert not (tmp_path / "r").exists()


def test_api_refuses_ray_settings_without_the_ray_runner():
  from tff_cluster import api, models
  with pytest.raises(ValueError, match="^ray_workers given with runner=local; valid: "
                     "runner=ray with them, or neither$"):
    api.build("fedavg", lambda: models.mclr(60, 10), "sparse_categorical_crossentropy",
              client_lr=0.01, batch_size=10, local_epochs=1, ray_workers=2)


def _listening_addresses():
  """The local addresses of this network namespace's listening TCP sockets
  (/proc/net/tcp and tcp6, state 0A), as hex."""
  out = []
  for name in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
      with open(name) as f:
        lines = f.readlines()[1:]
    except OSError:
      continue
    out += [line.split()[1].rsplit(":", 1)[0] for line in lines if line.split()[3] == "0A"]
  return out


@needs_isolation
def test_a_local_cluster_listens_on_loopback_and_never_looks_outside(ray_instance):
  """The cluster a run starts (no --ray_address) binds 127.0.0.1, and none of
  its processes connects towards an outside address to learn this machine's
  (in a namespace with loopback only, Ray's logs would say "Failed to
  determine local IP via external connectivity to: 8.8.8.8:53")."""
  @ray.remote(num_cpus=0)  # (the pooled actors hold every CPU)
  def node_ip():
    return ray.util.get_node_ip_address()

  assert ray.util.get_node_ip_address() == "127.0.0.1"
  assert {node["NodeManagerAddress"] for node in ray.nodes()} == {"127.0.0.1"}
  assert ray.get(node_ip.remote()) == "127.0.0.1"
  loopback = ("0100007F", "0000000000000000FFFF00000100007F",
              "00000000000000000000000001000000")  # 127.0.0.1, ::ffff:127.0.0.1, ::1
  addresses = _listening_addresses()
  assert addresses and set(addresses) <= set(loopback), addresses
  logs = os.path.join(ray._private.worker._global_node.get_session_dir_path(), "logs")  # noqa: SLF001
  read = 0
  for root, _, files in os.walk(logs):
    for name in files:
      with open(os.path.join(root, name), errors="replace") as f:
        text = f.read()
      read += 1
      assert "external connectivity" not in text and "8.8.8.8" not in text, name
  assert read > 0
