"""Runs a sweep: its folder claimed, its cells run, its report written
(`sweep`, also `tff_cluster.api.sweep`; the package's docstring says what a
sweep is)."""


from __future__ import annotations

import dataclasses
import json
import os
import socket
from typing import Any, Dict, List, Mapping, Optional, Union

from tff_cluster.io import checkpoint
from tff_cluster.sweep import cells as cells_mod
from tff_cluster.sweep import execute, report
from tff_cluster.sweep.spec import Sweep, SpecError, from_dict, load, conflicts, union

RECORD = "sweep.json"
LOCK = ".sweep.lock"

try:
  import fcntl
except ImportError:  # not POSIX
  fcntl = None


@dataclasses.dataclass
class SweepResult:
  """What a sweep left: its folder, the rows of results.csv, the cells that
  failed (path -> one line)."""
  out: str
  rows: List[Dict[str, Any]]
  failed: Dict[str, str]


class SweepBusy(SpecError):
  """Another sweep runs in (or holds) the folder; one line."""


def _absolute_paths(sweep: Sweep) -> Sweep:
  """Folders among the cells' flags made absolute (a cell may run elsewhere)."""
  fixed = []
  for c in sweep.cells:
    flags = tuple((n, os.path.abspath(v) if n in ("data_dir", "glove_path") else v)
                  for n, v in c.flags)
    fixed.append(dataclasses.replace(c, flags=flags))
  return dataclasses.replace(sweep, cells=fixed)


def resolve(spec: Union[str, Mapping[str, Any], Sweep]) -> Sweep:
  """A Sweep from a file path, a dict (a sweep file's content) or a Sweep."""
  if isinstance(spec, Sweep):
    sweep = spec
  elif isinstance(spec, (str, os.PathLike)):
    sweep = load(os.fspath(spec))
  elif isinstance(spec, Mapping):
    sweep = from_dict(spec)
  else:
    raise SpecError(f"sweep spec of type {type(spec).__name__}; valid: a sweep file's path, "
                    "a dict of its keys, or a Sweep")
  return _absolute_paths(sweep)


class _FolderLock:
  """`.sweep.lock` in the sweep's folder, held (flock) while a sweep runs:
  released by the kernel however the process ends."""

  def __init__(self, out: str):
    self.path = os.path.join(out, LOCK)
    self.fd = None

  def __enter__(self):
    self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    if fcntl is not None:
      try:
        fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError:
        holder = os.read(self.fd, 200).decode(errors="replace").strip() or "another process"
        os.close(self.fd)
        raise SweepBusy(f"{os.path.dirname(self.path)} is being run by another sweep "
                        f"({holder}); valid: another --out, or wait for that sweep to end"
                        ) from None
    os.ftruncate(self.fd, 0)
    os.write(self.fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
    return self

  def __exit__(self, *exc):
    os.close(self.fd)
    return False


def _read_record(out: str) -> Dict[str, Any]:
  """`out`/sweep.json ({} where there is none). Raises SweepBusy (one line)."""
  path = os.path.join(out, RECORD)
  if not os.path.exists(path):
    return {}
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise SweepBusy(f"{path} cannot be read ({e}); valid: another --out") from None


def _write_record(out: str, recorded: Mapping[str, Any]) -> None:
  checkpoint.atomic_write_bytes(os.path.join(out, RECORD),
                                json.dumps(recorded, indent=1).encode())


def _claim(sweep: Sweep, out: str) -> None:
  """Records the sweep's cells in `out`/sweep.json (with the cells of earlier
  sweeps there), or refuses a folder where one of its cells ran with other
  flags."""
  recorded = _read_record(out)
  differs = conflicts(recorded, sweep)
  if differs is not None:
    raise SweepBusy(f"{out} holds another sweep ({differs}); valid: the same cells' flags "
                    "(a sweep may add cells or leave some out), or another --out")
  _write_record(out, union(recorded, sweep))


def sweep(spec: Union[str, Mapping[str, Any], Sweep], out: Optional[str] = None,
          parallel: int = 1, ray_address: Optional[str] = None, cpus_per_cell: float = 1.0,
          gpus_per_cell: float = 0.0, retries: int = 3, progress: bool = True,
          plots: bool = True, on_cell=None) -> SweepResult:
  """Runs the sweep `spec` (a TOML file's path, or its keys as a dict) into
  `out` (default: the file's `out`), `parallel` cells at a time on this
  machine, or as Ray tasks on the cluster at `ray_address`. Returns the
  results; a failed cell does not stop the others (`SweepResult.failed`).
  Raises SpecError for a bad spec or folder, `execute.Stopped` on a stop
  signal (run it again to finish). `on_cell(cell, outcome)` is called as
  each cell ends."""
  sweep_ = resolve(spec)
  out = out or sweep_.out
  if not out:
    raise SpecError("no folder for the sweep; valid: --out=FOLDER (or out = \"...\" in the "
                    "sweep file)")
  if parallel < 1:
    raise SpecError(f"--parallel={parallel}; valid: an integer >= 1")
  if retries < 0:
    raise SpecError(f"--retries={retries}; valid: an integer >= 0")
  if cpus_per_cell <= 0 or gpus_per_cell < 0:
    raise SpecError(f"--cpus_per_cell={cpus_per_cell}, --gpus_per_cell={gpus_per_cell}; "
                    "valid: CPUs > 0, GPUs >= 0")
  out = os.path.abspath(out)
  if os.path.isdir(out) and not os.path.exists(os.path.join(out, RECORD)):
    entries = [e for e in os.listdir(out) if e != LOCK]
    if entries:  # refused before anything is written there
      raise SweepBusy(f"{out} is not empty and holds no sweep ("
                      f"{', '.join(sorted(entries)[:3])}); valid: a new or empty folder for "
                      "--out, or a sweep's folder")
  try:
    os.makedirs(out, exist_ok=True)
  except OSError as e:
    raise SpecError(f"--out={out} cannot be made ({e.strerror or e}); valid: a folder this "
                    "user can write") from None
  by_path = {c.path: c for c in sweep_.cells}
  failed: Dict[str, str] = {}

  def record(job, outcome: cells_mod.Outcome) -> None:
    cell = by_path[job[0]]
    if outcome.status == cells_mod.FAILED:
      failed[cell.path] = outcome.message
    if on_cell is not None:
      on_cell(cell, outcome)

  with _FolderLock(out):
    _claim(sweep_, out)
    jobs = [(c.path, os.path.join(out, c.path), c.argv()) for c in sweep_.cells]
    try:
      if ray_address:
        execute.run_ray(jobs, ray_address, record, cpus_per_cell, gpus_per_cell, retries,
                        show=progress)
      else:
        execute.run_local(jobs, parallel, record, show=progress)
    except execute.Stopped:
      report.write(sweep_, out, failed, plots=False)  # what has finished so far
      raise
    finally:
      _record_failures(out, sweep_, failed)
    rows = report.write(sweep_, out, failed, plots=plots)
  return SweepResult(out, rows, failed)


def _record_failures(out: str, sweep: Sweep, failed: Dict[str, str]) -> None:
  """sweep.json's `failed`: each failed cell's line (a later report says why
  it failed); a cell of this sweep that did not fail this time is taken off."""
  recorded = _read_record(out)
  mine = {c.path for c in sweep.cells}
  kept = {p: m for p, m in recorded.get("failed", {}).items() if p not in mine}
  _write_record(out, {**recorded, "failed": {**kept, **failed}})


def recorded_failures(out: str) -> Dict[str, str]:
  """The failed cells sweep.json in `out` names (path -> one line)."""
  try:
    return dict(_read_record(out).get("failed", {}))
  except SweepBusy:
    return {}
