"""Where a sweep's cells run: processes on this machine, or Ray tasks.

`run_local(jobs, parallel)` keeps `parallel` cell processes going (each cell
its own process, `cells.start`), polling them from this thread. `run_ray(jobs,
address, ...)` submits one Ray task per cell (`cells.run` in a Ray worker,
which starts the cell's process there) with the CPUs and GPUs a cell asks;
a task whose node is lost is retried by Ray on another node (`retries`
times) and resumes from the cell's checkpoints, which it finds because the
sweep's folder is on storage every node sees (one machine, or a shared file
system; see docs/sweeps.md). Plain Ray tasks, not Ray Tune: a cell is a
process with its own run directory and checkpoints, which is all a Tune
trial would add, at the cost of Tune's dependencies and its own copy of each
trial's state (docs/sweeps.md has the measurement).

Both call `report(job, outcome)` as each cell ends and draw one progress bar
(cells done / running / failed). A stop signal (SIGINT, SIGTERM, SIGHUP)
stops the running cells (their runs end as interrupted, resumable) and
raises `Stopped`; running the sweep again finishes it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from tff_cluster.io import lock
from tff_cluster.progress import progress_bar
from tff_cluster.runners import ray_setup
from tff_cluster.sweep import cells

POLL_S = 0.2
STOP_GRACE_S = cells.STOP_GRACE_S  # how long stopped cells get to write their interrupted state
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

Job = Tuple[str, str, List[str]]  # (name, cell directory, run_experiment.py flags)
Report = Callable[[Job, cells.Outcome], None]


class Stopped(Exception):
  """A stop signal ended the sweep; `signum` is the signal's number."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum


class _Signals:
  """Notes the first stop signal instead of raising in the middle of a poll."""

  def __init__(self):
    self.received: Optional[int] = None
    self._old = {}

  def __enter__(self):
    for sig in STOP_SIGNALS:
      self._old[sig] = signal.signal(sig, self._note)
    return self

  def _note(self, signum, frame):
    del frame
    self.received = self.received or signum

  def __exit__(self, *exc):
    for sig, old in self._old.items():
      signal.signal(sig, old)
    return False


class Bar:
  """The sweep's progress bar: cells done (of all), running, failed."""

  def __init__(self, total: int, show: bool):
    self.done = self.failed = self.running = 0
    self.bar = progress_bar(total=total, desc="sweep", unit="cell",
                            disable=None if show else True, dynamic_ncols=True)

  def update(self, running: int, finished: int = 0, failed: int = 0) -> None:
    self.running = running
    self.done += finished
    self.failed += failed
    self.bar.set_postfix_str(f"running {running}, failed {self.failed}", refresh=False)
    self.bar.update(finished)
    self.bar.refresh()

  def close(self) -> None:
    self.bar.close()


def run_local(jobs: Sequence[Job], parallel: int, report: Report, show: bool = True) -> None:
  """Runs `jobs` as processes on this machine, `parallel` at a time."""
  pending = list(jobs)
  running: Dict[object, Job] = {}
  bar = Bar(len(jobs), show)
  with _Signals() as signals:
    try:
      while pending or running:
        while pending and len(running) < parallel and signals.received is None:
          job = pending.pop(0)
          proc = cells.start(job[1], job[2])
          if isinstance(proc, cells.Outcome):
            report(job, proc)
            bar.update(len(running), 1, proc.status == cells.FAILED)
          else:
            running[proc] = job
            bar.update(len(running))
        if signals.received is not None:
          _stop(running, report)
          raise Stopped(signals.received)
        time.sleep(POLL_S)
        for proc in [p for p in running if p.poll() is not None]:
          job = running.pop(proc)
          result = cells.outcome(proc, job[1])
          report(job, result)
          bar.update(len(running), 1, result.status == cells.FAILED)
    finally:
      for proc in running:  # an exception of our own: no cell left running
        if proc.poll() is None:
          proc.kill()
      bar.close()


def _stop(running: Dict[object, Job], report: Report) -> None:
  """SIGTERM to every running cell; waits for them to write their state."""
  for proc in running:
    with contextlib.suppress(ProcessLookupError):
      proc.send_signal(signal.SIGTERM)
  deadline = time.monotonic() + STOP_GRACE_S
  for proc in list(running):
    try:
      proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except Exception:  # noqa: BLE001  (subprocess.TimeoutExpired)
      proc.kill()
      proc.wait()
    proc.log.close()
  running.clear()


def _ray_cell(cell_dir: str, argv: List[str]) -> cells.Outcome:
  """A Ray task's body: the cell's run on the worker's node (named in the
  outcome). Ray's cancel reaches a running task as SIGINT's KeyboardInterrupt,
  which a worker started where SIGINT is ignored (`nohup`, a background job
  of a script) would never raise: Python's own handler is put back for the
  task."""
  old = None
  if threading.current_thread() is threading.main_thread():
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    outcome = cells.run(cell_dir, argv)
  finally:
    if old is not None:
      signal.signal(signal.SIGINT, old)
  outcome.node = ray_setup.import_ray().get_runtime_context().get_node_id()
  return outcome


def connect_ray(address: str):
  """(Ray, whether this call started the connection): Ray joined to the
  cluster at `address` (checked to answer first). A Ray already initialised
  in the process (a notebook's, a test's) is used as it is."""
  ray = ray_setup.import_ray()
  if ray.is_initialized():
    return ray, False
  ray_setup.check_reachable(address)
  kwargs = ray_setup.init_kwargs(address=address)
  kwargs["log_to_driver"] = False  # the cells' output is in their output.log
  ray.init(**kwargs)
  return ray, True


def run_ray(jobs: Sequence[Job], address: str, report: Report, cpus: float = 1.0,
            gpus: float = 0.0, retries: int = 3, show: bool = True) -> None:
  """Runs `jobs` as Ray tasks on the cluster at `address` (disconnecting at
  the end where this call connected)."""
  ray, connected = connect_ray(address)
  try:
    _run_tasks(ray, jobs, report, cpus, gpus, retries, show)
  finally:
    if connected:
      ray.shutdown()


def _run_tasks(ray, jobs, report, cpus, gpus, retries, show) -> None:
  remote = ray.remote(_ray_cell).options(num_cpus=cpus, num_gpus=gpus, max_retries=retries,
                                         retry_exceptions=False)
  refs = {remote.remote(job[1], list(job[2])): job for job in jobs}
  bar = Bar(len(jobs), show)
  with _Signals() as signals:
    try:
      while refs:
        ready, _ = ray.wait(list(refs), num_returns=1, timeout=POLL_S * 5)
        if signals.received is not None:
          _cancel(ray, refs)
          raise Stopped(signals.received)
        for ref in ready:
          job = refs.pop(ref)
          try:
            result = ray.get(ref)
          except Exception as e:  # noqa: BLE001  (retries spent: a node lost too often)
            result = cells.Outcome(cells.FAILED, _first_line(e))
          report(job, result)
          bar.update(_held(refs.values()), 1, result.status == cells.FAILED)
        if not ready:
          bar.update(_held(refs.values()))
    finally:
      bar.close()


def _cancel(ray, refs: Dict[object, Job]) -> None:
  """Stops the cells' tasks: a KeyboardInterrupt in each (`cells.run` then
  stops its run with SIGTERM, so it ends as interrupted), then waits while
  any of their runs still holds its run directory's lock (a cancelled task's
  result is ready before its run has stopped), at most STOP_GRACE_S; the
  workers of tasks still running then are killed."""
  for ref in refs:
    ray.cancel(ref, force=False)
  deadline = time.monotonic() + STOP_GRACE_S
  while _held(refs.values()) and time.monotonic() < deadline:
    time.sleep(POLL_S)
  _, left = ray.wait(list(refs), num_returns=len(refs), timeout=0)
  for ref in left:
    ray.cancel(ref, force=True)


def _held(jobs) -> int:
  """How many of `jobs` have a run writing (its run directory's lock held)."""
  count = 0
  for job in jobs:
    try:
      lock.check(job[1])
    except lock.LockHeld:
      count += 1
  return count


def _first_line(e: Exception) -> str:
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[-1] if text else ''}"
