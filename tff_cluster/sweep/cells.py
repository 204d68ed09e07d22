"""One cell of a sweep: its run, started, resumed or left as it is.

`start(cell_dir, argv)` looks at the cell's run directory and starts what it
still needs, as its own process (`python -m tff_cluster`, so TensorFlow's
state and the XLA map limit stay per cell): nothing for a run that has
completed or that the divergence guard stopped, `--resume` for one with a
checkpoint (an interrupted run, or a cell whose node was lost), a fresh run
otherwise. The process's output goes to the cell's `output.log`, each
attempt after a header line. On Linux the process is killed if the process
that started it dies (`PR_SET_PDEATHSIG`): a killed sweep driver, or a Ray
worker on a lost node, leaves no run writing behind it; its checkpoints let
the next attempt resume. `run(cell_dir, argv)` is the same, waited for (a Ray
task's body). Nothing here imports TensorFlow.
"""

from __future__ import annotations

import ctypes
import dataclasses
import datetime
import os
import signal
import socket
import subprocess
import sys
import time
from typing import List, Optional, Sequence

import tff_cluster
from tff_cluster.io import checkpoint, lock, rundir

LOG = rundir.LOG
DONE, DIVERGED, FAILED = "done", "diverged", "failed"
# How long a cell waits for a previous attempt's process (one whose starter
# died) to let go of the run's lock before it resumes the run.
LOCK_WAIT_S = 120.0
STOP_GRACE_S = 60.0  # how long a stopped run gets to write its interrupted state


@dataclasses.dataclass
class Outcome:
  """How a cell ended: DONE, DIVERGED (a result: the table says so) or
  FAILED (`message`: one line, the run's last line of output)."""
  status: str
  message: str = ""
  host: str = ""
  ran: bool = False  # whether this attempt ran anything (False: finished before)
  seconds: float = 0.0  # the attempt's process, start to end (0: none ran)
  node: str = ""  # the Ray node that ran this attempt (`execute._ray_cell`); "" off Ray


def package_root() -> str:
  """The folder holding the `tff_cluster` package (a checkout's root, or
  site-packages): put on the cell's import path."""
  return os.path.dirname(os.path.dirname(os.path.abspath(tff_cluster.__file__)))


def finished(cell_dir: str) -> Optional[Outcome]:
  """The outcome of a cell whose run has ended for good (completed, or
  stopped by the divergence guard); None otherwise."""
  summary = rundir.read_summary(cell_dir) if os.path.isdir(cell_dir) else None
  if summary is None:
    return None
  if summary.get("completed"):
    return Outcome(DONE)
  if summary.get("reason") == "diverged":
    return Outcome(DIVERGED, f"diverged at round {summary.get('rounds_completed')}")
  return None


def command(cell_dir: str, argv: Sequence[str]) -> List[str]:
  """The cell's next process: resume where a checkpoint is, else a fresh run."""
  base = [sys.executable, "-m", "tff_cluster"]
  if os.path.isdir(os.path.join(cell_dir, rundir.CHECKPOINTS)) and checkpoint.rounds(cell_dir):
    return [*base, "--resume", "--progress=false", f"--output_dir={cell_dir}"]
  return [*base, *argv, "--progress=false", "--overwrite", f"--output_dir={cell_dir}"]


def _die_with_parent() -> None:
  """(In the child, before exec.) SIGKILL when the parent dies (Linux)."""
  try:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):  # not glibc Linux: the child may outlive its parent
    pass


def _wait_for_lock(cell_dir: str, timeout: float = LOCK_WAIT_S) -> None:
  """Waits while another process holds the run's lock (a previous attempt
  on its way out)."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    try:
      lock.check(cell_dir)
      return
    except lock.LockHeld:
      time.sleep(0.5)


def start(cell_dir: str, argv: Sequence[str]):
  """The cell's process (a Popen) with its log file, or the Outcome of a
  cell that needs none."""
  done = finished(cell_dir)
  if done is not None:
    return done
  os.makedirs(cell_dir, exist_ok=True)
  _wait_for_lock(cell_dir)
  cmd = command(cell_dir, argv)
  log = open(os.path.join(cell_dir, LOG), "a")
  stamp = datetime.datetime.now().isoformat(timespec="seconds")
  log.write(f"== {stamp} on {socket.gethostname()}: {' '.join(cmd[1:])}\n")
  log.flush()
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root(), env.get("PYTHONPATH")) if p)
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  kwargs = {"preexec_fn": _die_with_parent} if sys.platform.startswith("linux") else {}
  proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                          env=env, **kwargs)
  proc.log = log  # closed by `outcome`
  proc.started = time.monotonic()
  return proc


def outcome(proc, cell_dir: str) -> Outcome:
  """How the finished process `proc` of `start` left its cell."""
  proc.log.close()
  host = socket.gethostname()
  seconds = time.monotonic() - proc.started
  done = finished(cell_dir)
  if done is not None:
    return dataclasses.replace(done, host=host, ran=True, seconds=seconds)
  code = proc.returncode
  what = (f"killed by signal {-code}" if code < 0 else f"exit {code}")
  return Outcome(FAILED, f"{what}: {last_line(os.path.join(cell_dir, LOG))}", host, True,
                 seconds)


def last_line(path: str) -> str:
  """The last non-empty line of a log (at most its last 64 KB read)."""
  try:
    with open(path, "rb") as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - 65536))
      lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines()]
  except OSError:
    return "?"
  lines = [ln for ln in lines if ln and not ln.startswith("== ")]
  return lines[-1] if lines else "no output"


def run(cell_dir: str, argv: Sequence[str]) -> Outcome:
  """Runs the cell to its end (a Ray task's body: a retry after a lost node
  resumes from the cell's checkpoints)."""
  proc = start(cell_dir, argv)
  if isinstance(proc, Outcome):
    return dataclasses.replace(proc, host=socket.gethostname())
  try:
    while proc.poll() is None:  # (in short waits: Ray's cancel arrives between them)
      time.sleep(0.2)
  except KeyboardInterrupt:  # a cancelled Ray task: the run stops as interrupted
    proc.send_signal(signal.SIGTERM)
    try:
      proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
      proc.kill()
    proc.log.close()
    raise
  return outcome(proc, cell_dir)
