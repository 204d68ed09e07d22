"""Everything a run leaves in `--output_dir`.

  config.json     every resolved setting of the run
  metrics.csv     one row per round (fixed columns; empty cells where a value
  metrics.jsonl   was not computed that round, e.g. between evaluations)
  summary.json    final/max test accuracy, timings, algorithm extras
  tensorboard/    TensorBoard scalars (tf.summary), one step per round
  accuracy.png    test accuracy and train loss curves
  checkpoints/    the run state for --resume (`tff_cluster.checkpoint`)
  models/         final/ and best/ models (`model_<j>.keras`, `clients.json`)
  eval_<task>.json  --eval_only results
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import math
import os
from typing import Any, Dict, Iterable, List, Mapping, Optional

import numpy as np

RESULT_FILES = ("config.json", "metrics.csv", "metrics.jsonl", "summary.json",
                "accuracy.png", "groups.csv")
TENSORBOARD_DIR = "tensorboard"
RESULT_DIRS = (TENSORBOARD_DIR, "checkpoints", "models")


class OutputDirError(ValueError):
  pass


def check_output_dir(path: str, overwrite: bool) -> None:
  """Refuses an existing non-empty directory unless `overwrite` (no side effects)."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise OutputDirError(f"--output_dir={path} exists and is not a directory; "
                         "choose another path")
  if os.path.isdir(path) and os.listdir(path) and not overwrite:
    raise OutputDirError(
        f"--output_dir={path} is not empty; pass --overwrite to replace its "
        "results or choose another directory")


def _clear_previous_results(path: str) -> None:
  # Only our own files: --overwrite must never delete anything else the
  # directory may hold.
  for name in RESULT_FILES:
    if os.path.isfile(os.path.join(path, name)):
      os.remove(os.path.join(path, name))
  for name in RESULT_DIRS:
    if os.path.isdir(os.path.join(path, name)):
      shutil.rmtree(os.path.join(path, name))


def to_jsonable(value: Any) -> Any:
  if isinstance(value, Mapping):
    return {str(k): to_jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [to_jsonable(v) for v in value]
  if isinstance(value, np.ndarray):
    return to_jsonable(value.tolist())
  if isinstance(value, (np.integer,)):
    return int(value)
  if isinstance(value, (np.floating, float)):
    value = float(value)
    return None if math.isnan(value) or math.isinf(value) else value
  return value


def write_json(path: str, value: Any) -> None:
  """Atomically (temporary file, fsync, rename): a reader never sees half a file."""
  from tff_cluster.checkpoint import atomic_write_bytes
  text = json.dumps(to_jsonable(value), indent=2, sort_keys=True) + "\n"
  atomic_write_bytes(path, text.encode())


def _csv_line(values) -> str:
  buffer = io.StringIO()
  csv.writer(buffer, lineterminator="\n").writerow(values)
  return buffer.getvalue()


class ResultsWriter:
  """Writes config, per-round rows, TensorBoard scalars and the summary.

  Each row is one `write` of a whole line followed by flush and fsync, so a
  killed run leaves whole rows. `resume_rows` (a resumed run) rewrites
  metrics.csv/metrics.jsonl atomically with exactly those rows, dropping any
  the killed run wrote after its last checkpoint, then appends.
  """

  def __init__(self, path: str, columns: Iterable[str], overwrite: bool = False,
               tensorboard: bool = True, resume_rows: Optional[List[Mapping]] = None):
    if resume_rows is None:
      check_output_dir(path, overwrite)
      os.makedirs(path, exist_ok=True)
      _clear_previous_results(path)
    self.path = path
    self.columns: List[str] = list(dict.fromkeys(columns))
    self._rows: List[Dict[str, Any]] = []
    csv_path = os.path.join(path, "metrics.csv")
    jsonl_path = os.path.join(path, "metrics.jsonl")
    from tff_cluster.checkpoint import atomic_write_bytes
    rows = [to_jsonable(dict(r)) for r in (resume_rows or [])]
    atomic_write_bytes(csv_path, "".join(
        [_csv_line(self.columns)] + [self._csv_row(r) for r in rows]).encode())
    atomic_write_bytes(jsonl_path, "".join(
        json.dumps(r, sort_keys=True) + "\n" for r in rows).encode())
    self._rows.extend(rows)
    self._csv_file = open(csv_path, "a", newline="")
    self._jsonl = open(jsonl_path, "a")
    self._tb = None
    if tensorboard:
      import tensorflow as tf
      self._tb = tf.summary.create_file_writer(os.path.join(path, TENSORBOARD_DIR))

  def _csv_row(self, row: Mapping[str, Any]) -> str:
    return _csv_line(["" if row.get(c) is None else row.get(c) for c in self.columns])

  @staticmethod
  def _append(f, line: str) -> None:
    f.write(line)
    f.flush()
    os.fsync(f.fileno())

  def write_config(self, config: Mapping[str, Any]) -> None:
    write_json(os.path.join(self.path, "config.json"), config)

  def write_round(self, row: Mapping[str, Any]) -> None:
    row = to_jsonable(dict(row))
    unknown = set(row) - set(self.columns)
    if unknown:
      raise KeyError(f"metrics {sorted(unknown)} are not declared columns")
    self._append(self._csv_file, self._csv_row(row))
    self._append(self._jsonl, json.dumps(row, sort_keys=True) + "\n")
    self._rows.append(row)
    if self._tb is not None:
      import tensorflow as tf
      with self._tb.as_default(step=int(row["round"])):
        for key, value in row.items():
          if key != "round" and isinstance(value, (int, float)):
            tf.summary.scalar(key, value)

  @property
  def rows(self) -> List[Dict[str, Any]]:
    return self._rows

  def write_summary(self, summary: Mapping[str, Any]) -> None:
    write_json(os.path.join(self.path, "summary.json"), summary)

  def plot(self, title: str) -> Optional[str]:
    """Test accuracy and train loss against rounds, saved as accuracy.png."""
    evaluated = [r for r in self._rows if r.get("test_accuracy") is not None]
    if not evaluated:
      return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot([r["round"] for r in evaluated],
             [r["test_accuracy"] for r in evaluated])
    ax1.set(xlabel="round", ylabel="test accuracy", title=title, ylim=(0, 1))
    ax1.grid(alpha=0.3)
    trained = [r for r in self._rows if r.get("train_loss") is not None]
    ax2.plot([r["round"] for r in trained], [r["train_loss"] for r in trained])
    ax2.set(xlabel="round", ylabel="train loss")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    out = os.path.join(self.path, "accuracy.png")
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out

  def close(self) -> None:
    for f in (self._csv_file, self._jsonl):
      if not f.closed:
        f.close()
    if self._tb is not None:
      self._tb.flush()
      self._tb.close()
      self._tb = None


# test_accuracy_clientavg / test_macro_f1: client-averaged (training-size
# weighted) accuracy and macro-F1, the WeCFL paper's scores.
MAXIMIZED_COLUMNS = ("test_accuracy_assigned", "test_accuracy_clientavg", "test_macro_f1")


def summarize(rows: List[Mapping[str, Any]], rounds: int) -> Dict[str, Any]:
  """final/max test accuracy (and the round of the max) from per-round rows."""
  evaluated = [r for r in rows if r.get("test_accuracy") is not None]
  summary: Dict[str, Any] = {"rounds": rounds, "rounds_completed": len(rows)}
  if evaluated:
    best = max(evaluated, key=lambda r: r["test_accuracy"])
    summary.update(final_test_accuracy=evaluated[-1]["test_accuracy"],
                   max_test_accuracy=best["test_accuracy"],
                   max_round=best["round"])
  # Algorithm scores maximised like test_accuracy (e.g. FedGroup's
  # test_accuracy_assigned, the paper's score): max_<name> and its round.
  for name in MAXIMIZED_COLUMNS:
    scored = [r for r in evaluated if r.get(name) is not None and np.isfinite(r[name])]
    if scored:
      best = max(scored, key=lambda r: r[name])
      summary.update({f"final_{name}": scored[-1][name], f"max_{name}": best[name],
                      f"max_{name}_round": best["round"]})
  round_seconds = [r["round_seconds"] for r in rows if r.get("round_seconds") is not None]
  if round_seconds:
    summary["mean_round_seconds"] = float(np.mean(round_seconds))
  return summary
