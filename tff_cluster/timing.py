"""Where a run's seconds go: the process's wall time split into named parts.

`Ledger` adds up the seconds of each part of a run (`PARTS`, in the order
summary.json's `process_time` lists them) from an origin: the start of the
process for the command (`process_start`), the start of `run_training`
otherwise. `breakdown()` closes the account: the parts, `unaccounted` (the
wall time no part claims) and `process` (the wall time from the origin), so
that the parts and `unaccounted` add up to `process` exactly and a test can
hold `unaccounted` small.

The first round of a process compiles (XLA, `tf.function` tracing) what the
later rounds reuse: `Ledger.round` takes each round's training and
evaluation seconds and `breakdown` moves the first ones' excess over the
later rounds' mean into `compile` (an estimate: the first call's time less a
warm call's; with one round, all of it is `training`).

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Dict, Iterator, List, Optional

# The parts of a run, in order (docs/outputs.md names each):
PARTS = (
    "start",               # the interpreter, the library's modules, the flags, up to TF's import
    "tensorflow_import",   # `import tensorflow` itself
    "library_import",      # the library's TensorFlow modules (the host, runners)
    "data",                # loading or generating the task's data
    "build",               # the model, the runner and the driver (`registry.build_driver`)
    "results_setup",       # the output folder: lock, metrics files, TensorBoard, config.json
    "divergence_baseline",  # the initial model's losses on the rounds' clients (`LossRatio`)
    "setup",               # the algorithm's set-up (e.g. FedGroup's cold start), checkpoint 0
    "compile",             # the first round's and first evaluation's excess: tracing, XLA
    "training",            # the rounds' training (local steps, aggregation, server update)
    "evaluation",          # the rounds' evaluations
    "host",                # per round, the rest: checks, rows, groups, TensorBoard, checkpoints
    "closing",             # the final models, the plots, summary.json, closing the files
)


def process_start() -> float:
  """`time.time()` when this process started (Linux: from /proc, to 10 ms);
  elsewhere, when this module was first imported."""
  try:
    with open("/proc/self/stat", "rb") as f:
      fields = f.read().rsplit(b")", 1)[1].split()
    with open("/proc/uptime", "rb") as f:
      uptime = float(f.read().split()[0])
    started_after_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
    return time.time() - (uptime - started_after_boot)
  except (OSError, ValueError, IndexError, AttributeError):
    return _IMPORTED


_IMPORTED = time.time()


class Ledger:
  """Seconds per part since `origin` (a `time.time()`; None: now)."""

  def __init__(self, origin: Optional[float] = None):
    self.origin = time.time() if origin is None else origin
    self.seconds: Dict[str, float] = {part: 0.0 for part in PARTS}
    self._train: List[float] = []
    self._eval: List[float] = []
    self._open: Dict[int, tuple] = {}  # the parts being timed now: (name, start)

  def add(self, part: str, seconds: float) -> None:
    if part not in self.seconds:
      raise KeyError(f"unknown part {part!r}; valid: {', '.join(PARTS)}")
    self.seconds[part] += max(0.0, float(seconds))

  @contextlib.contextmanager
  def part(self, name: str) -> Iterator[None]:
    """Adds the seconds spent inside the block to part `name`."""
    if name not in self.seconds:
      raise KeyError(f"unknown part {name!r}; valid: {', '.join(PARTS)}")
    start, key = time.perf_counter(), object()
    self._open[id(key)] = (name, start)
    try:
      yield
    finally:
      del self._open[id(key)]
      self.add(name, time.perf_counter() - start)

  def round(self, train_seconds: float, eval_seconds: Optional[float]) -> None:
    """A round's training and (None: not evaluated) evaluation seconds."""
    self._train.append(float(train_seconds))
    if eval_seconds is not None:
      self._eval.append(float(eval_seconds))

  def compile_seconds(self) -> float:
    """The first round's and first evaluation's excess over the mean of the
    later ones (0 when there is no later one)."""
    return sum(_excess(times) for times in (self._train, self._eval))

  def mean_round_seconds(self) -> Optional[float]:
    """The mean training seconds of this process's rounds after its first
    (the first's, with one round; None: no round)."""
    if not self._train:
      return None
    later = self._train[1:] or self._train
    return sum(later) / len(later)

  def breakdown(self) -> Dict[str, float]:
    """{part: seconds} for every part, then `unaccounted` and `process` (the
    wall time since the origin; the others add up to it). A part being timed
    now counts its seconds so far."""
    out = dict(self.seconds)
    now = time.perf_counter()
    for name, start in self._open.values():
      out[name] += now - start
    compile_seconds = self.compile_seconds()
    out["compile"] += compile_seconds
    out["training"] += sum(self._train) - _excess(self._train)
    out["evaluation"] += sum(self._eval) - _excess(self._eval)
    process = time.time() - self.origin
    out["unaccounted"] = process - sum(out.values())
    out["process"] = process
    return out


def _excess(times: List[float]) -> float:
  if len(times) < 2:
    return 0.0
  rest = times[1:]
  return max(0.0, times[0] - sum(rest) / len(rest))


def table(breakdown: Dict[str, float]) -> str:
  """`--profile`'s table: each part's seconds and share of the process."""
  total = breakdown.get("process") or 0.0
  lines = [f"{'part':<22}{'seconds':>10}{'share':>9}"]
  for part, seconds in breakdown.items():
    share = f"{100 * seconds / total:8.1f}%" if total > 0 and part != "process" else ""
    lines.append(f"{part:<22}{seconds:>10.3f}{share:>9}")
  return "\n".join(lines)


def print_table(breakdown: Dict[str, float]) -> None:
  print(table(breakdown), file=sys.stderr)
