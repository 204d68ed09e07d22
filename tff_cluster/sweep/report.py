"""A sweep's results: `results.csv` (a row per cell), `table.md` (mean ± sample
std over seeds) and the curves of each task (`curves_<task>.png`).

Every number is read from the cells' run directories (summary.json,
metrics.csv), so the report can be written again at any time
(`--report_only`) and equals what the runs wrote. results.csv keeps floats
in full (Python's shortest round-trip form); table.md cuts them (never
rounds up). Nothing here imports TensorFlow.
"""

from __future__ import annotations

import csv
import io
import math
import os
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from tff_cluster.io import checkpoint, plot, rundir
from tff_cluster.sweep import cells as cells_mod
from tff_cluster.sweep.spec import Cell, Sweep, flag_text

RESULTS_CSV = "results.csv"
TABLE_MD = "table.md"
# summary.json keys shown by default; ari/purity only where a task's runs report them
DEFAULT_COLUMNS = ("final_test_accuracy", "final_test_accuracy_clientavg", "ari", "purity")
PERCENT = ("accuracy", "ari", "purity", "f1")  # columns shown as percentages (substrings)
MEASURED = ("rounds_completed", "mb_per_round", "seconds_per_round", "total_seconds")


def median_round_seconds(run_dir: str) -> float:
  """The median of a run's `round_seconds` (training and host steps, no
  evaluation; the median is robust to round 1's compilation and to a
  machine shared for a while); NaN where none is recorded."""
  try:
    _, rows = rundir.read_metrics(run_dir, first=rundir.METRICS_JSONL)
  except rundir.RunDirError:
    return float("nan")
  times = [r["round_seconds"] for r in rows if r.get("round_seconds") is not None]
  return float(np.median(times)) if times else float("nan")


def cell_row(sweep: Sweep, cell: Cell, out: str, columns: Sequence[str],
             failures: Dict[str, str]) -> Dict[str, Any]:
  """One results.csv row: the cell, its status and its numbers."""
  run_dir = os.path.join(out, cell.path)
  row: Dict[str, Any] = {"task": cell.setting, "algo": cell.method}
  row.update({n: flag_text(v) for n, v in cell.options})
  row["seed"] = cell.seed
  done = cells_mod.finished(run_dir)
  summary = rundir.read_summary(run_dir) if os.path.isdir(run_dir) else None
  if done is not None:
    row["status"] = done.status
  elif cell.path in failures:
    row["status"] = cells_mod.FAILED
  else:
    row["status"] = "unfinished"
  summary = summary or {}
  for column in columns:
    row[column] = summary.get(column)
  completed = summary.get("rounds_completed")
  row["rounds_completed"] = completed
  moved = (summary.get("bytes_down") or 0) + (summary.get("bytes_up") or 0)
  row["mb_per_round"] = moved / completed / 1e6 if completed else None
  seconds = median_round_seconds(run_dir) if summary else float("nan")
  row["seconds_per_round"] = seconds if math.isfinite(seconds) else None
  row["total_seconds"] = summary.get("total_seconds")
  row["run_dir"] = cell.path
  row["message"] = failures.get(cell.path, "")
  return row


def table_columns(sweep: Sweep) -> List[str]:
  return list(sweep.columns or DEFAULT_COLUMNS)


def rows(sweep: Sweep, out: str, failures: Optional[Dict[str, str]] = None
         ) -> List[Dict[str, Any]]:
  """Every cell's row, in the sweep's order."""
  columns = table_columns(sweep)
  return [cell_row(sweep, c, out, columns, failures or {}) for c in sweep.cells]


def _text(value: Any) -> str:
  if value is None:
    return ""
  if isinstance(value, float):
    return repr(value) if math.isfinite(value) else ""
  return str(value)


def write_csv(path: str, table: Sequence[Dict[str, Any]]) -> None:
  """`table` as CSV, written atomically (floats in full)."""
  fields = list(table[0]) if table else []
  text = io.StringIO()
  writer = csv.writer(text, lineterminator="\n")
  writer.writerow(fields)
  for row in table:
    writer.writerow([_text(row.get(k)) for k in fields])
  checkpoint.atomic_write_bytes(path, text.getvalue().encode())


def truncated(x: float, digits: int) -> str:
  """`x` with `digits` decimals, cut rather than rounded (reported numbers are
  never rounded up): 88.6575 -> "88.65". A float a hair below the decimal it
  stands for (100 * 0.9457 = 94.57000000000001 or 94.56999999999999) keeps it;
  NaN (no measurement) is "–"."""
  if not math.isfinite(x):
    return "–"
  scale = 10 ** digits
  cut = math.trunc(round(x * scale, 6)) / scale
  return f"{cut:.{digits}f}"


def mean_std(values: Sequence[Optional[float]], digits: int = 2, scale: float = 100.0) -> str:
  """"m ± s" over seeds (sample std) of `scale` × the values, one value alone
  without ±, "–" when there is none (None values are skipped)."""
  values = [v for v in values if v is not None and math.isfinite(v)]
  if not values:
    return "–"
  a = scale * np.asarray(values, dtype=np.float64)
  if len(a) == 1:
    return truncated(a[0], digits)
  return f"{truncated(a.mean(), digits)} ± {truncated(a.std(ddof=1), digits)}"


def _is_percent(column: str) -> bool:
  return any(p in column for p in PERCENT)


def markdown(sweep: Sweep, table: Sequence[Dict[str, Any]]) -> str:
  """table.md: a block per task, a row per (algorithm, grid values): its
  seeds, mean ± sample std of each column over the seeds that finished
  (accuracies, ARI and purity in %), MB and seconds a round."""
  names = list(sweep.grid_names)
  lines = ["# Sweep results", "",
           "Mean ± sample standard deviation over the seeds each row names (accuracy, ARI "
           "and purity in %; a cell the divergence guard stopped is counted in *diverged*, "
           "not in the means). MB/round: bytes down and up over rounds completed; s/round: "
           "the median round's seconds (training and host steps, no evaluation).", ""]
  for task in dict.fromkeys(r["task"] for r in table):
    mine = [r for r in table if r["task"] == task]
    shown = [c for c in table_columns(sweep)
             if any(r.get(c) is not None for r in mine)]
    heads = ["algo", *names, "seeds", *shown, "MB/round", "s/round", "diverged", "failed"]
    lines += [f"## {task}", "", "| " + " | ".join(heads) + " |",
              "|" + "---|" * len(heads)]
    keys = dict.fromkeys((r["algo"], *(r[n] for n in names)) for r in mine)
    for key in keys:
      group = [r for r in mine if (r["algo"], *(r[n] for n in names)) == key]
      ok = [r for r in group if r["status"] == cells_mod.DONE]
      cells = [f"`{key[0]}`", *key[1:], ",".join(str(r["seed"]) for r in ok) or "–"]
      cells += [mean_std([r.get(c) for r in ok], scale=100.0 if _is_percent(c) else 1.0)
                for c in shown]
      cells += [mean_std([r["mb_per_round"] for r in ok], scale=1.0),
                mean_std([r["seconds_per_round"] for r in ok], scale=1.0)]
      diverged = [str(r["seed"]) for r in group if r["status"] == cells_mod.DIVERGED]
      failed = [str(r["seed"]) for r in group
                if r["status"] not in (cells_mod.DONE, cells_mod.DIVERGED)]
      cells += [",".join(diverged) or "–", ",".join(failed) or "–"]
      lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines.append("")
  return "\n".join(lines)


def plot_tasks(sweep: Sweep, out: str, table: Sequence[Dict[str, Any]]) -> List[str]:
  """curves_<task>.png: the task's finished cells, one curve per (algorithm,
  grid values) with its seeds' mean ± std band (`tff_cluster.io.plot`)."""
  written = []
  for task in dict.fromkeys(r["task"] for r in table):
    dirs = [os.path.join(out, r["run_dir"]) for r in table
            if r["task"] == task and r["status"] == cells_mod.DONE]
    if not dirs:
      continue
    path = os.path.join(out, f"curves_{task}.png")
    plot.plot_runs([plot.load_run(d) for d in dirs], path)
    written.append(path)
  return written


def write(sweep: Sweep, out: str, failures: Optional[Dict[str, str]] = None,
          plots: bool = True) -> List[Dict[str, Any]]:
  """results.csv, table.md and the curves; returns the rows."""
  table = rows(sweep, out, failures)
  write_csv(os.path.join(out, RESULTS_CSV), table)
  checkpoint.atomic_write_bytes(os.path.join(out, TABLE_MD),
                                (markdown(sweep, table) + "\n").encode())
  if plots:
    plot_tasks(sweep, out, table)
  return table
