"""Test helpers: finding TFF `worker_binary` processes and watching a command's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, Optional, Sequence, Set, Tuple

WORKER_NAME = b"worker_binary"


def _read_stat(pid: int) -> Optional[Tuple[str, int]]:
  """(state, ppid) of a process, or None if it is gone."""
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      raw = f.read().decode("ascii", "replace")
  except OSError:
    return None
  # The command name (field 2) is in parentheses and may hold spaces.
  fields = raw[raw.rindex(")") + 2:].split()
  return fields[0], int(fields[1])


def _is_worker(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      return WORKER_NAME in f.read()
  except OSError:
    return False


def worker_pids() -> Set[int]:
  """Live (not zombie) processes whose command line contains `worker_binary`."""
  found = set()
  for name in os.listdir("/proc"):
    if not name.isdigit():
      continue
    pid = int(name)
    stat = _read_stat(pid)
    if stat is None or stat[0] in ("Z", "X"):
      continue
    if _is_worker(pid):
      found.add(pid)
  return found


def _is_descendant(pid: int, ancestor: int) -> bool:
  for _ in range(64):
    stat = _read_stat(pid)
    if stat is None:
      return False
    pid = stat[1]
    if pid == ancestor:
      return True
    if pid <= 1:
      return False
  return False


def descendant_workers(ancestor: int) -> Set[int]:
  """Live `worker_binary` processes below `ancestor` in the process tree."""
  return {pid for pid in worker_pids() if _is_descendant(pid, ancestor)}


def wait_until_gone(pids: Set[int], timeout: float = 5.0) -> Set[int]:
  """Polls until none of `pids` is a live worker; returns the survivors."""
  deadline = time.monotonic() + timeout
  while True:
    alive = set(pids) & worker_pids()
    if not alive or time.monotonic() > deadline:
      return alive
    time.sleep(0.05)


def _default_sigint():
  # A shell's background job may run pytest with SIGINT ignored, and a Python
  # started with SIGINT ignored never raises KeyboardInterrupt: restore it.
  signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_watching_workers(
    cmd: Sequence[str], *, timeout: float = 120.0,
    send_signal: Optional[int] = None, signal_delay: float = 0.0,
    ready: Optional[Callable[[], bool]] = None,
    cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None,
) -> Tuple[int, str, str, Set[int]]:
  """Runs `cmd` (stdout and stderr piped) and records its worker processes.

  While the command runs, /proc is polled for `worker_binary` processes whose
  parent chain leads to the command. With `send_signal`, that signal goes to
  the command `signal_delay` seconds after its first worker is seen and, if
  given, `ready()` is true (never if no worker is seen).

  Returns (returncode, stdout, stderr, worker pids seen). Raises
  `subprocess.TimeoutExpired` (after killing the command) if the command, or
  anything still holding its stdout/stderr open, outlives `timeout`.
  """
  env = dict(os.environ if env is None else env)
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          stdin=subprocess.DEVNULL, cwd=cwd, env=env, text=True,
                          preexec_fn=_default_sigint)
  seen: Set[int] = set()
  done = threading.Event()

  def watch():
    first_seen = None
    signalled = False
    while not done.is_set() and proc.poll() is None:
      pids = descendant_workers(proc.pid)
      seen.update(pids)
      if pids and first_seen is None:
        first_seen = time.monotonic()
      if (send_signal is not None and not signalled and first_seen is not None
          and time.monotonic() - first_seen >= signal_delay
          and (ready is None or ready())):
        try:
          proc.send_signal(send_signal)
        except ProcessLookupError:
          pass
        signalled = True
      time.sleep(0.02)

  watcher = threading.Thread(target=watch, daemon=True)
  watcher.start()
  try:
    out, err = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    # Kill what this call started (a surviving worker may hold the pipes).
    for pid in [proc.pid, *seen]:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    try:
      proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
      pass
    raise
  finally:
    done.set()
    watcher.join()
  return proc.returncode, out, err, seen


# Small settings for CLI runs: Synthetic(1, 1), 20 clients, a few seconds of training.
SMALL_ARGS = ("--task=synthetic", "--num_clients=20", "--clients_per_round=5",
              "--local_epochs=1", "--progress=false")


def read_metrics_csv(path) -> list:
  """metrics.csv rows as dicts of floats (None for empty cells)."""
  import csv
  with open(path, newline="") as f:
    return [{k: (float(v) if v != "" else None) for k, v in row.items()}
            for row in csv.DictReader(f)]


def metrics_rows_written(path) -> int:
  """Data rows in metrics.csv so far (0 if it does not exist yet)."""
  try:
    with open(path) as f:
      return max(sum(1 for _ in f) - 1, 0)
  except OSError:
    return 0


def assert_workers_gone(seen: Set[int], timeout: float = 0.0) -> None:
  """Asserts no pid of `seen` is a live worker (after up to `timeout` s).

  Survivors are killed before the assertion fails, so a failing test does not
  leave workers behind.
  """
  survivors = wait_until_gone(seen, timeout)
  for pid in survivors:
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  assert not survivors, f"worker_binary processes {sorted(survivors)} outlived their run"


def main_in_process(args, capsys):
  """Runs run_experiment.main in this process; returns (exit code, stdout, stderr)."""
  from tff_cluster import experiment as run_experiment
  try:
    code = run_experiment.main(["run_experiment.py", *args])
  except SystemExit as e:
    code = e.code
  out, err = capsys.readouterr()
  return code, out, err


def assert_one_line_error(code, err, out_dir, *needles, exit_code=2):
  """A rejected run: `exit_code`, one `run_experiment.py: error:` line holding
  every needle, no traceback, no output directory left behind."""
  assert code == exit_code, err
  lines = [l for l in err.splitlines() if l.strip() and not l.startswith("warning:")]
  assert len(lines) == 1 and lines[0].startswith("run_experiment.py: error: "), err
  assert "Traceback" not in err
  for needle in needles:
    assert needle in lines[0], (needle, lines[0])
  assert not os.path.exists(out_dir), "a failed run left an output directory"


def tff_sqlite_schema():
  from tff_cluster.data import tff_sqlite
  return tff_sqlite.SCHEMA


def write_emnist_sqlite(path, clients: dict, pixel=lambda label, i: label / 10.0) -> None:
  """A tiny database in the layout TFF's federated EMNIST reads: `clients` =
  split -> client id -> labels; every pixel of example i with `label` is
  `pixel(label, i)`."""
  import sqlite3

  import tensorflow as tf
  con = sqlite3.connect(str(path))
  # TFF's tables without their NOT NULL constraints: the untrusted-input
  # tests write NULLs into them.
  for statement in tff_sqlite_schema():
    con.execute(statement.replace(" NOT NULL", ""))
  for split, per_client in clients.items():
    for cid, labels in per_client.items():
      for i, label in enumerate(labels):
        example = tf.train.Example(features=tf.train.Features(feature={
            "pixels": tf.train.Feature(float_list=tf.train.FloatList(
                value=[float(pixel(label, i))] * 784)),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}))
        con.execute("INSERT INTO examples VALUES (?, ?, ?)",
                    (split, cid, example.SerializeToString()))
      con.execute("INSERT INTO client_metadata VALUES (?, ?, ?)",
                  (cid, split, len(labels)))
  con.commit()
  con.close()


def namespace_problem():
  """Why a loopback-only network namespace (`unshare -n`) cannot be made
  here, or None."""
  import shutil
  if os.geteuid() != 0:
    return "not root: unshare -n needs CAP_SYS_ADMIN"
  for tool in ("unshare", "ip"):
    if shutil.which(tool) is None:
      return f"no `{tool}` command"
  return None


def rerun_in_loopback_namespace(test_file: str, isolated_env: str, why: str) -> None:
  """The body of a module's "run me in a loopback-only namespace" test:
  skips inside the namespace (the inner run) or where none can be made
  (`why`: what must not reach the network); else re-executes `test_file`
  under `unshare -n` with `isolated_env` set and asserts every test there
  passed."""
  import pytest
  from tests.conftest import REPO_ROOT
  from tff_cluster.runners.ray_setup import loopback_only  # (no TensorFlow)
  if loopback_only():
    pytest.skip("already in a loopback-only namespace (this is the inner run)")
  assert not os.environ.get(isolated_env), "re-executed, yet not in a loopback-only namespace"
  problem = namespace_problem()
  if problem is not None:
    pytest.skip(f"cannot make a loopback-only network namespace ({problem}); {why}")
  reports = ""
  env = dict(os.environ, **{isolated_env: "1"})
  for name in [n for n in env if n.startswith("PYTEST_XDIST_")]:  # (a worker's own)
    env.pop(name)
  outer = os.environ.get("TFF_CLUSTER_TIMING_OUT")
  if outer:  # the inner run's own timings and JUnit file, beside the phase's
    stem = f"{outer[:-len('.kinds.json')] if outer.endswith('.kinds.json') else outer}"
    stem += "." + os.path.basename(test_file)[:-3] + ".inner"
    env["TFF_CLUSTER_TIMING_OUT"] = stem + ".kinds.json"
    reports = f"-p tests.timing --junitxml={stem}.xml "
  inner = (f"ip link set lo up && exec {sys.executable} -m pytest -p no:cacheprovider -q "
           f"{reports}-x {test_file}")
  env.pop("PYTEST_ADDOPTS", None)
  done = subprocess.run(["unshare", "-n", "sh", "-c", inner], cwd=REPO_ROOT, env=env,
                        capture_output=True, text=True, timeout=1500)
  tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
  print(tail)
  assert done.returncode == 0, tail
  assert " passed" in tail and " skipped" in tail, tail  # the inner run ran the tests
