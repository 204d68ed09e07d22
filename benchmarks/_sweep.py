"""Helpers every table script shares: run a cell (or reuse its finished run),
read its summary, format cells, write tables, and keep the recorded results
in `benchmarks/recorded/<table>.csv`.

The table scripts import this module from their own directory; it puts the
repository root on `sys.path` once, for the library and the CLI.
"""

from __future__ import annotations

import csv
import fcntl
import os
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(REPO_ROOT), "shared", "data")
if REPO_ROOT not in sys.path:  # the library and the CLI's tasks, for every table script
  sys.path.insert(0, REPO_ROOT)

from tff_cluster.io import checkpoint  # noqa: E402  (TF-free)
from tff_cluster.io import rundir  # noqa: E402  (TF-free)
from tff_cluster.sweep import report  # noqa: E402  (TF-free)


def registered_algorithms() -> set:
  from tff_cluster import registry  # TF-free registry
  return set(registry.ALGORITHMS)


def run_one(flags: List[str], directory: str, seed: int, runner: str,
            rounds: Optional[int]) -> dict:
  """Runs (or reuses) one experiment; returns its summary.json (a run the
  divergence guard stopped is finished too: its summary says "diverged")."""
  _check_rounds(directory, rounds)
  summary = completed_summary(directory) or diverged_summary(directory)
  if summary is not None:
    return summary
  if checkpoint.rounds(directory):
    # An unfinished run continues from its latest checkpoint (its summary may
    # predate the `checkpoint_round` field an interrupted run now records).
    return _resume(directory, rounds)
  cmd = [sys.executable, os.path.join(REPO_ROOT, "run_experiment.py"), *flags,
         f"--seed={seed}", f"--runner={runner}", "--progress=false", "--overwrite",
         f"--output_dir={directory}"]
  return _run(cmd, directory, rounds, f"{' '.join(flags)} seed {seed}")


def _check_rounds(directory: str, rounds: Optional[int]) -> None:
  """Stops a table that asks for `rounds` where `directory` already holds a run
  of another length, which it would otherwise reuse or resume as if it were
  the run asked for."""
  ran = None if rounds is None else run_rounds(directory)
  if ran is not None and ran != rounds:
    raise SystemExit(f"{directory} holds a run of {ran} rounds, not the {rounds} asked "
                     f"for: pass another --out, or remove that directory")


def run_config(directory: str) -> dict:
  """A run's config.json ({} where it has none)."""
  return rundir.read_config(directory, missing_ok=True)


def run_rounds(directory: str) -> Optional[int]:
  """The rounds a run was asked for (its config.json)."""
  rounds = run_config(directory).get("rounds")
  return None if rounds is None else int(rounds)


def completed_summary(directory: str) -> Optional[dict]:
  """The run's summary.json if the run has completed, else None (no summary,
  or a run in progress, interrupted, diverged or failed)."""
  summary = rundir.read_summary(directory)
  return summary if summary is not None and summary.get("completed") else None


def diverged_summary(directory: str) -> Optional[dict]:
  """The run's summary.json if the divergence guard stopped it, else None."""
  summary = rundir.read_summary(directory)
  return summary if summary is not None and is_diverged(summary) else None


def is_diverged(summary: dict) -> bool:
  """Whether the divergence guard stopped the run (its scores are no result)."""
  return summary.get("reason") == "diverged"


def diverged_cell(rounds: Sequence[int], total: int) -> str:
  """A table cell for runs the guard stopped: "diverged at round r (k/n seeds)"
  (the earliest round)."""
  return f"diverged at round {min(rounds)} ({len(rounds)}/{total} seeds)"


def _resume(directory: str, rounds: Optional[int]) -> dict:
  cmd = [sys.executable, os.path.join(REPO_ROOT, "run_experiment.py"), "--resume",
         "--progress=false", f"--output_dir={directory}"]
  return _run(cmd, directory, rounds, f"--resume {directory}")


def _run(cmd: List[str], directory: str, rounds: Optional[int], what: str) -> dict:
  if rounds is not None:
    cmd.append(f"--rounds={rounds}")
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
  if proc.returncode == 3 and diverged_summary(directory) is not None:
    return diverged_summary(directory)  # a result: the table says it diverged
  if proc.returncode != 0:
    tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
    raise RuntimeError(f"{what}: exit {proc.returncode}: {tail}")
  summary = rundir.read_summary(directory)
  if summary is None:
    raise RuntimeError(f"{what}: exit 0 without {rundir.path_of(directory, rundir.SUMMARY)}")
  summary["wall_seconds"] = time.perf_counter() - t0
  return summary


def median_round_seconds(directory: str, default: float = float("nan")) -> float:
  """The median seconds of a run's rounds (its metrics.jsonl, else its
  metrics.csv; training, aggregation and host steps, no evaluation), robust to
  a machine paused or shared for a while, which inflates one round and so the
  mean; `default` where neither file holds any (the sweep report's, with a
  default)."""
  seconds = report.median_round_seconds(directory)
  return default if np.isnan(seconds) else seconds


def measured(text: str) -> float:
  """A recorded time back as a number: NaN for "–" or "" (none measured, e.g.
  a run the divergence guard stopped), the inverse of `truncated`'s "–"."""
  return float("nan") if text in ("–", "", None) else float(text)


# A number cut to `digits` decimals (never rounded up; NaN is "–"): the
# sweep report's.
truncated = report.truncated


def fmt(values: Sequence[float]) -> str:
  """The FedGroup table's cell: `mean_std` to one decimal."""
  return mean_std(values, digits=1)


def mean_std(values: Sequence[Optional[float]], digits: int = 2) -> str:
  """Fractions as a percentage cell: "m ± s" over seeds (sample std), one
  value alone without ±, "–" when there is none (None or NaN values are
  skipped): the sweep report's `mean_std` in percent."""
  return report.mean_std(values, digits, scale=100.0)


def save_markdown(stem: str, text: str) -> None:
  """Writes `text` to `stem`.md, creating its folder."""
  os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
  with open(stem + ".md", "w") as f:
    f.write(text + "\n")


RECORDED = os.path.join(REPO_ROOT, "benchmarks", "recorded")


def load_recorded(name: str) -> List[Dict[str, str]]:
  """The rows of `benchmarks/recorded/<name>.csv`: scores of finished runs
  kept in the repository, so a table can combine seeds run on different
  machines or days (run directories under `results/` are not kept)."""
  path = os.path.join(RECORDED, name + ".csv")
  if not os.path.exists(path):
    return []
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def save_recorded(name: str, rows: Sequence[Dict[str, object]], key: Sequence[str],
                  fields: Sequence[str]) -> None:
  """Merges `rows` into `benchmarks/recorded/<name>.csv` (a row with the same
  `key` fields is replaced), sorted by key, written atomically. The read and
  the write hold a lock on the directory, so two table processes recording
  as their cells finish do not drop each other's rows."""
  os.makedirs(RECORDED, exist_ok=True)
  lock = os.open(RECORDED, os.O_RDONLY)
  try:
    fcntl.flock(lock, fcntl.LOCK_EX)
    merged = {tuple(str(r[k]) for k in key): dict(r) for r in load_recorded(name)}
    merged.update({tuple(str(r[k]) for k in key): dict(r) for r in rows})
    path = os.path.join(RECORDED, name + ".csv")
    with open(path + ".tmp", "w", newline="") as f:
      writer = csv.DictWriter(f, list(fields), lineterminator="\n", extrasaction="ignore")
      writer.writeheader()
      writer.writerows(merged[k] for k in sorted(merged))
    os.replace(path + ".tmp", path)
  finally:
    os.close(lock)  # (releases the lock)
