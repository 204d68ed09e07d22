"""The writers of everything a run leaves in `--output_dir` (file names and
readers: `tff_cluster.io.rundir`).

  config.json     every resolved setting of the run, the task's arguments as
                  applied, the git commit and library versions
  metrics.csv     one row per round (fixed columns; empty cells where a value
  metrics.jsonl   was not computed that round, e.g. between evaluations)
  groups.csv      each client's group/model index (-1: none): one row per round
                  (`--groups_format=wide`), or `round,client,group` lines for
                  the clients whose group changed (`long`)
  summary.json    final/max test accuracy, timings, the final ARI and purity
                  (clustered algorithms, tasks with true clusters), algorithm
                  extras
  tensorboard/    TensorBoard scalars (tf.summary), one step per round, under
                  metrics/, groups/, comm/ and time/; the run's HParams (not
                  written where the `tensorboard` package is missing)
  accuracy.png    test accuracy (per group too) and train loss curves
  groups.png      clustered algorithms: each client's group per round (from
                  groups.csv), the final ARI and purity in the title where the
                  task has true clusters
  checkpoints/    the run state for --resume (`tff_cluster.io.checkpoint`)
  models/         final/ and best/ models: `model_<j>.npz` (the weights, read on
                  any stack), `model_<j>.keras` (Keras' own format, readable
                  by the Keras that wrote it only) and `clients.json`
  eval_<task>.json  --eval_only results

Non-finite numbers: a CSV cell holds `nan`, `inf` or `-inf` (an empty cell
means "not computed that round"); JSON has no such numbers, so JSON and JSONL
write null and list the fields that were non-finite under "nonfinite" (e.g.
`"nonfinite": ["test_loss"]`, nested ones as `name.key` / `name[i]`), a key
present only when there are any.
"""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import warnings
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

import numpy as np

from tff_cluster import stack
from tff_cluster.io import background, checkpoint
from tff_cluster.io import plot
from tff_cluster.io.checkpoint import WriteFailed, atomic_write_bytes, write_failed
from tff_cluster.io import rundir
from tff_cluster.io.rundir import foreign_entries
from tff_cluster.io import lock


class OutputDirError(ValueError):
  """An --output_dir that cannot take a run's results; the message is one line."""


def check_output_dir(path: str, overwrite: bool) -> None:
  """Refuses an existing non-empty directory unless `overwrite` and it holds
  nothing but a previous run's own files (no side effects)."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise OutputDirError(f"--output_dir={path} exists and is not a directory; "
                         "choose another path")
  if not os.path.isdir(path) or not os.listdir(path):
    return
  try:
    lock.check(path)
  except lock.LockHeld as e:
    raise OutputDirError(str(e)) from None
  if not overwrite:
    raise OutputDirError(
        f"--output_dir={path} is not empty; choose another directory "
        f"({rundir.OVERWRITE_SCOPE}, "
        "and refuses a directory holding anything else)")
  try:
    foreign = foreign_entries(path)
  except OSError as e:
    raise OutputDirError(f"--output_dir={path} cannot be read ({e.strerror or e}); "
                         "choose another directory") from None
  if foreign:
    more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
    raise OutputDirError(
        f"--output_dir={path} holds {', '.join(foreign[:3])}{more}, which no run wrote "
        f"there; {rundir.OVERWRITE_SCOPE}: nothing was changed; move those away or choose "
        "another directory")


def _clear_previous_results(path: str) -> None:
  """Removes a previous run's files from `path` (`check_output_dir` has made
  sure it holds nothing else): only what a run writes is removed."""
  checkpoint.remove_temporary(path)
  foreign = set(foreign_entries(path))
  for name in os.listdir(path):
    full = os.path.join(path, name)
    if name in foreign or name + "/" in foreign or name in (rundir.LOCK, rundir.LOG):
      continue  # (the lock: this run's own, held; the log: a sweep writing this run's output)
    if os.path.isdir(full) and not os.path.islink(full):
      if any(f.startswith(name + "/") for f in foreign):
        continue  # never the case after check_output_dir; kept whole if it were
      shutil.rmtree(full)
    else:
      os.remove(full)


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


def nonfinite_fields(value: Any, prefix: str = "") -> List[str]:
  """The fields of `value` holding NaN or an infinity: top-level keys by name,
  nested ones as `name.key` / `name[i]`."""
  if isinstance(value, Mapping):
    out = []
    for k, v in value.items():
      out += nonfinite_fields(v, f"{prefix}.{k}" if prefix else str(k))
    return out
  if isinstance(value, (list, tuple, np.ndarray)):
    if isinstance(value, np.ndarray) and value.dtype.kind not in "fc":
      return []
    out = []
    for i, v in enumerate(value):
      out += nonfinite_fields(v, f"{prefix}[{i}]")
    return out
  if isinstance(value, (float, np.floating)) and not math.isfinite(float(value)):
    return [prefix]
  return []


def json_record(value: Any) -> Any:
  """`value` for JSON: non-finite numbers as null; a mapping with any gets
  "nonfinite": [their fields]."""
  out = to_jsonable(value)
  if isinstance(value, Mapping):
    bad = [f for f in nonfinite_fields(value) if f != "nonfinite"]
    if bad:
      out["nonfinite"] = sorted(bad)
  return out


def write_json(path: str, value: Any) -> None:
  """Atomically (temporary file, fsync, rename): a reader never sees half a file.
  Non-finite numbers become null, listed under "nonfinite" (`json_record`)."""
  text = json.dumps(json_record(value), indent=2, sort_keys=True, allow_nan=False) + "\n"
  atomic_write_bytes(path, text.encode())


def _jsonl_line(row: Mapping[str, Any]) -> str:
  return json.dumps(json_record(row), sort_keys=True, allow_nan=False) + "\n"


def csv_cell(value: Any) -> Any:
  """A CSV cell: empty for None, `nan`/`inf`/`-inf` for non-finite numbers,
  plain Python numbers for numpy scalars."""
  if value is None:
    return ""
  if isinstance(value, np.generic):
    value = value.item()
  if isinstance(value, float):
    if math.isnan(value):
      return "nan"
    if math.isinf(value):
      return "inf" if value > 0 else "-inf"
  return value


def _csv_line(values) -> str:
  buffer = io.StringIO()
  csv.writer(buffer, lineterminator="\n").writerow(values)
  return buffer.getvalue()


def _plain(row: Mapping[str, Any]) -> Dict[str, Any]:
  """A row with numpy scalars as Python values (NaN and infinities kept)."""
  return {str(k): v.item() if isinstance(v, np.generic) else v for k, v in row.items()}


GROUPS_FORMATS = ("wide", "long")

# The rows of an algorithm that groups its clients (the clustered ones) have
# `group_<j>_size` columns: its runs get groups.png.
_GROUP_SIZE = re.compile(r"^group_\d+_size$")


def is_grouping_column(column: str, algo: Optional[str] = None) -> bool:
  """Whether a metrics column describes how the clients are grouped: a
  per-group value (`group_*`), a count of clients or clusters (`num_*`), the
  grouping against the true clusters (`ari`, `purity`), a clustering
  objective (`*_objective`), or a diagnostic that the run's algorithm `algo`
  names after itself (`<algo>_*`, e.g. CFL's `cfl_splits`)."""
  return (column.startswith(("group_", "num_")) or column in ("ari", "purity")
          or column.endswith("_objective")
          or (algo is not None and column.startswith(f"{algo}_")))


def tensorboard_tag(column: str, algo: Optional[str] = None) -> str:
  """The TensorBoard tag of a metrics column of a run of `algo`: `comm/` for
  bytes, `time/` for seconds, `groups/` for group and clustering columns
  (`is_grouping_column`), `metrics/` for the rest (accuracies, losses, F1,
  algorithm metrics)."""
  if column.startswith("bytes_"):
    return f"comm/{column}"
  if column.endswith("_seconds"):
    return f"time/{column}"
  if is_grouping_column(column, algo):
    return f"groups/{column}"
  return f"metrics/{column}"


def hparams_of(config: Mapping[str, Any]) -> Dict[str, Any]:
  """The run's settings for the TensorBoard HParams plugin: the training
  settings, the algorithm's options and the task's arguments (`task_arg.NAME`),
  scalar str/int/float/bool values only."""
  def scalar(v):
    if isinstance(v, np.generic):
      v = v.item()
    return v if isinstance(v, (str, bool, int, float)) and not (
        isinstance(v, float) and not math.isfinite(v)) else None

  out: Dict[str, Any] = {}
  for key in rundir.HYPERPARAMETERS:
    if scalar(config.get(key)) is not None:
      out[key] = scalar(config[key])
  for key, value in sorted((config.get("algo_options") or {}).items()):
    if scalar(value) is not None:
      out[key] = scalar(value)
  task_args = config.get("task_args_applied")
  if task_args is None:
    task_args = config.get("task_args") or {}
  for key, value in sorted(task_args.items()):
    if scalar(value) is not None:
      out[f"task_arg.{key}"] = scalar(value)
  return out


def library_versions() -> Dict[str, Any]:
  """Python's and the installed numpy, TensorFlow, Keras, tf_keras and TFF
  versions (None: not installed) and TF_USE_LEGACY_KERAS, read from the package
  metadata (nothing is imported)."""
  return stack.versions()


def _git(repo: str, *args: str) -> Optional[str]:
  try:
    out = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True,
                         timeout=20, stdin=subprocess.DEVNULL)
  except (OSError, subprocess.SubprocessError, ValueError):
    return None
  return out.stdout.strip() if out.returncode == 0 else None


def git_state(repo: Optional[str] = None) -> Dict[str, Any]:
  """{"git_commit": HEAD, "git_dirty": whether tracked files differ from it} of
  the checkout holding this package (`repo`: another directory); both None
  when it is not the top of a git work tree or git is missing. Never raises."""
  if repo is None:  # the folder holding the package: tff_cluster/io/results.py's third parent
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  none = {"git_commit": None, "git_dirty": None}
  try:
    top = _git(repo, "rev-parse", "--show-toplevel")
    if not top or os.path.realpath(top) != os.path.realpath(repo):
      return none  # e.g. an installed package inside someone else's repository
    commit = _git(repo, "rev-parse", "HEAD")
    if not commit:
      return none
    status = _git(repo, "status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit, "git_dirty": None if status is None else bool(status)}
  except Exception:  # noqa: BLE001 - provenance must never fail a run
    return none


def provenance() -> Dict[str, Any]:
  """config.json's record of where a run's code came from."""
  return {**git_state(), "versions": library_versions()}


class ResultsWriter:
  """Writes config, per-round rows and groups, TensorBoard scalars and the summary.

  Each row is one `write` of a whole line followed by flush and fsync, so a
  killed run leaves whole rows. `resume_rows` (a resumed run) rewrites
  metrics.csv/metrics.jsonl atomically with exactly those rows, dropping any
  the killed run wrote after its last checkpoint, then appends; groups.csv
  keeps its rows of the same rounds (`write_groups`). `figures=False`: no
  PNG (`plot` draws nothing), for callers that read the rows only (drawing
  them took a fifth of a short run's time).
  """

  def __init__(self, path: str, columns: Iterable[str], overwrite: bool = False,
               tensorboard: bool = True, resume_rows: Optional[List[Mapping]] = None,
               groups_format: str = "wide", figures: bool = True):
    self.figures = figures
    if groups_format not in GROUPS_FORMATS:
      raise ValueError(f"invalid --groups_format={groups_format}; valid: "
                       f"{', '.join(GROUPS_FORMATS)}")
    self.groups_format = groups_format
    self._last_groups: Optional[np.ndarray] = None
    self.path = path
    self._created: List[str] = []  # a new run's files, removed if it cannot start
    self._csv_file = self._jsonl = self._groups_file = None
    self._tb = None
    self._lock: Optional[lock.RunLock] = None
    if resume_rows is None:
      check_output_dir(path, overwrite)
      try:
        os.makedirs(path, exist_ok=True)
      except OSError as e:
        raise write_failed(path, e) from None
    self._hold(path)  # one writer at a time: a second one stops here, in one line
    try:
      if resume_rows is None:
        _clear_previous_results(path)
      else:  # what a killed run left half-written
        checkpoint.remove_temporary(path)
    except BaseException:
      self._release()
      raise
    self.columns: List[str] = list(dict.fromkeys(columns))
    self.config: Optional[Dict[str, Any]] = None
    csv_path = rundir.path_of(path, rundir.METRICS_CSV)
    jsonl_path = rundir.path_of(path, rundir.METRICS_JSONL)
    raw = [_plain(r) for r in (resume_rows or [])]
    self._resume_rounds = (None if resume_rows is None else
                           {int(r["round"]) for r in raw})
    csv_lines = [_csv_line(self.columns)] + [self._csv_row(r) for r in raw]
    jsonl_lines = [_jsonl_line(r) for r in raw]
    # The running SHA-256 of both files, which a checkpoint records in place of
    # the rows (`checkpoint.read_rows`).
    self._hashes = {rundir.METRICS_CSV: hashlib.sha256(), rundir.METRICS_JSONL: hashlib.sha256()}
    for name, lines in ((rundir.METRICS_CSV, csv_lines), (rundir.METRICS_JSONL, jsonl_lines)):
      for line in lines:
        self._hashes[name].update(line.encode())
    try:
      for file_path, lines in ((csv_path, csv_lines), (jsonl_path, jsonl_lines)):
        atomic_write_bytes(file_path, "".join(lines).encode())
        self._created.append(file_path)
      self._csv_file = open(csv_path, "ab", buffering=0)
      self._jsonl = open(jsonl_path, "ab", buffering=0)
    except OSError as e:
      self._discard()
      raise write_failed(csv_path, e) from None
    self._raw_rows: List[Dict[str, Any]] = raw  # NaN and infinities kept
    self._groups_width = 0
    # tf.summary's implementation is the tensorboard package (a dependency;
    # absent only from installs made without dependencies): no logs without it.
    if tensorboard and importlib.util.find_spec("tensorboard") is not None:
      import tensorflow as tf
      tb_dir = rundir.path_of(path, rundir.TENSORBOARD)
      if not os.path.exists(tb_dir):
        self._created.append(tb_dir)
      try:
        self._tb = tf.summary.create_file_writer(tb_dir)
      except Exception as e:  # noqa: BLE001 - e.g. a full disk
        self._tb_failed(e)
    # The rows, groups and scalars are written by this thread, in order; what
    # reads them (a checkpoint's digest, the summary, the plots) waits for it.
    self._background = background.Background()

  def _hold(self, path: str) -> None:
    try:
      self._lock = lock.RunLock(path).acquire()
    except lock.LockHeld as e:
      raise OutputDirError(str(e)) from None
    except OSError as e:
      raise write_failed(rundir.path_of(path, rundir.LOCK), e) from None

  def _release(self) -> None:
    if self._lock is not None:
      self._lock.release()
      self._lock = None

  def _discard(self) -> None:
    """A new run that could not start: close and remove what it wrote (a
    resumed run's files are left as they were)."""
    if getattr(self, "_background", None) is not None:
      try:
        self._background.close()
      except Exception:  # noqa: BLE001 - the run could not start anyway
        pass
    for f in (self._csv_file, self._jsonl, self._groups_file):
      if f is not None and not f.closed:
        try:
          f.close()
        except OSError:
          pass
    if self._tb is not None:
      try:
        self._tb.close()
      except Exception:  # noqa: BLE001
        pass
      self._tb = None
    if getattr(self, "_resume_rounds", None) is None:
      for path in self._created:
        if os.path.isdir(path):
          shutil.rmtree(path, ignore_errors=True)
        elif os.path.exists(path):
          os.remove(path)
    self._created = []
    self._release()

  def _tb_failed(self, error: BaseException) -> None:
    """TensorBoard's scalars are a convenience: a failure to write them stops
    them (one warning line), not the run."""
    print(f"warning: TensorBoard scalars stopped ({type(error).__name__}: "
          f"{str(error).splitlines()[0] if str(error) else ''}); metrics.csv has every row",
          file=sys.stderr)
    tb, self._tb = self._tb, None
    try:
      if tb is not None:
        tb.close()
    except Exception:  # noqa: BLE001
      pass

  def records_digest(self) -> Dict[str, Any]:
    """{"count": rows written, "metrics.csv": SHA-256, "metrics.jsonl": SHA-256}:
    what a checkpoint records in place of the rows (once they are on disk)."""
    self._background.drain()
    return {"count": len(self._raw_rows),
            **{name: h.hexdigest() for name, h in self._hashes.items()}}

  def _csv_row(self, row: Mapping[str, Any]) -> str:
    return _csv_line([csv_cell(row.get(c)) for c in self.columns])

  @staticmethod
  def _append(*pairs) -> None:
    """Appends each (file, line) pair's line, each one write then fsync; if any
    fails, every file is cut back to where it was (no torn or partial row) and
    `WriteFailed` is raised."""
    sizes = [os.fstat(f.fileno()).st_size for f, _ in pairs]
    try:
      for f, line in pairs:
        data = memoryview(line.encode())
        while data:
          data = data[f.write(data):]
        os.fsync(f.fileno())
    except OSError as e:
      for (f, _), size in zip(pairs, sizes):
        try:
          os.ftruncate(f.fileno(), size)
        except OSError:
          pass
      raise write_failed(f.name, e, len(line.encode())) from None

  def write_config(self, config: Mapping[str, Any]) -> None:
    """config.json; a new run's (not a resumed one's) settings also go to the
    TensorBoard HParams plugin, once."""
    self.config = dict(config)
    try:
      write_json(rundir.path_of(self.path, rundir.CONFIG), config)
    except WriteFailed:
      self._discard()  # a new run without its config.json leaves nothing
      raise
    self._created = []
    if self._tb is not None and self._resume_rounds is None:
      self._background.submit(self._write_hparams, self.config)

  def _write_hparams(self, config: Mapping[str, Any]) -> None:
    if self._tb is None:
      return
    from tensorboard.plugins.hparams import api as hp_api
    try:
      with self._tb.as_default():
        hp_api.hparams(hparams_of(config),
                       trial_id=os.path.basename(os.path.normpath(self.path)))
      self._tb.flush()
    except Exception as e:  # noqa: BLE001
      self._tb_failed(e)

  def write_round(self, row: Mapping[str, Any]) -> None:
    """Queues a round's row for metrics.csv, metrics.jsonl and TensorBoard
    (written by the writer thread; a failed write is raised by a later call)."""
    raw = _plain(row)
    unknown = set(raw) - set(self.columns)
    if unknown:
      raise KeyError(f"metrics {sorted(unknown)} are not declared columns")
    self._raw_rows.append(raw)
    self._background.submit(self._write_row, raw)

  def _write_row(self, raw: Dict[str, Any]) -> None:
    csv_line, jsonl_line = self._csv_row(raw), _jsonl_line(raw)
    self._append((self._csv_file, csv_line), (self._jsonl, jsonl_line))
    self._hashes[rundir.METRICS_CSV].update(csv_line.encode())
    self._hashes[rundir.METRICS_JSONL].update(jsonl_line.encode())
    if self._tb is not None:
      import tensorflow as tf
      algo = (self.config or {}).get("algo")
      try:
        with self._tb.as_default(step=int(raw["round"])):
          for key, value in raw.items():
            if (key != "round" and isinstance(value, (int, float))
                and math.isfinite(value)):
              tf.summary.scalar(tensorboard_tag(key, algo), value)
      except Exception as e:  # noqa: BLE001
        self._tb_failed(e)

  def write_groups(self, round_num: int, client_ids: Sequence[str],
                   groups: Optional[Sequence[int]]) -> None:
    """One groups.csv line: `round_num`, then each client's group/model index
    (-1: none); `groups=None` leaves the cells empty (not known this round).

    The first call writes the header (`round`, the client ids); in a resumed
    run it keeps the existing rows of the rounds in `resume_rows` (torn or
    later lines dropped, as in metrics.csv), rewritten atomically. Written by
    the writer thread, like the rows.
    """
    groups = None if groups is None else np.array(groups, copy=True)
    self._background.submit(self._write_groups, int(round_num), list(client_ids), groups)

  def _write_groups(self, round_num: int, client_ids: List[str],
                    groups: Optional[np.ndarray]) -> None:
    if self.groups_format == "long":
      self._write_groups_long(round_num, client_ids, groups)
      return
    if self._groups_file is None:
      self._open_groups(list(client_ids))
    if groups is None:
      cells = [""] * (self._groups_width - 1)
    else:
      cells = [int(g) for g in groups]
      if len(cells) != self._groups_width - 1:
        raise ValueError(f"groups.csv: {len(cells)} values for "
                         f"{self._groups_width - 1} clients")
    self._append((self._groups_file, _csv_line([int(round_num), *cells])))

  def _open_groups(self, client_ids: List[str]) -> None:
    header = ["round", *client_ids]
    path = rundir.path_of(self.path, rundir.GROUPS_CSV)
    kept = []
    if self._resume_rounds and os.path.isfile(path):
      with open(path, newline="") as f:
        lines = list(csv.reader(f))
      if lines and lines[0] == header:
        for cells in lines[1:]:
          if (len(cells) == len(header) and re.fullmatch(r"\d+", cells[0])
              and int(cells[0]) in self._resume_rounds):
            kept.append(cells)
    atomic_write_bytes(path, "".join(_csv_line(c) for c in [header, *kept]).encode())
    self._groups_file = self._open_append(path)
    self._groups_width = len(header)

  def _write_groups_long(self, round_num: int, client_ids: Sequence[str],
                         groups: Optional[Sequence[int]]) -> None:
    """groups.csv in the long format: `round,client,group` lines for the
    clients whose group differs from the last line written for them (every
    client on the first round written); a round without known groups writes
    nothing. A client's group in round r is its last line at a round <= r."""
    if self._groups_file is None:
      self._open_groups_long(list(client_ids))
    if groups is None:
      return
    groups = np.asarray(groups, np.int64)
    if len(groups) != len(client_ids):
      raise ValueError(f"groups.csv: {len(groups)} values for {len(client_ids)} clients")
    changed = (np.arange(len(groups)) if self._last_groups is None
               else np.flatnonzero(groups != self._last_groups))
    self._last_groups = groups.copy()
    if len(changed):
      self._append((self._groups_file, "".join(
          _csv_line([int(round_num), client_ids[k], int(groups[k])]) for k in changed)))

  def _open_groups_long(self, client_ids: List[str]) -> None:
    header = ["round", "client", "group"]
    path = rundir.path_of(self.path, rundir.GROUPS_CSV)
    kept = []
    if self._resume_rounds and os.path.isfile(path):
      index = {c: k for k, c in enumerate(client_ids)}
      last = np.full(len(client_ids), -1, np.int64)
      seen = False
      with open(path, newline="") as f:
        lines = list(csv.reader(f))
      if lines and lines[0] == header:
        for cells in lines[1:]:
          if (len(cells) == 3 and re.fullmatch(r"\d+", cells[0])
              and int(cells[0]) in self._resume_rounds and cells[1] in index
              and re.fullmatch(r"-?\d+", cells[2])):
            kept.append(cells)
            last[index[cells[1]]] = int(cells[2])
            seen = True
      self._last_groups = last if seen else None
    atomic_write_bytes(path, "".join(_csv_line(c) for c in [header, *kept]).encode())
    self._groups_file = self._open_append(path)

  @staticmethod
  def _open_append(path: str):
    try:
      return open(path, "ab", buffering=0)
    except OSError as e:
      raise write_failed(path, e) from None

  @property
  def rows(self) -> List[Dict[str, Any]]:
    """The rows so far, JSON-ready (non-finite numbers as None)."""
    return [to_jsonable(r) for r in self._raw_rows]

  def write_summary(self, summary: Mapping[str, Any]) -> None:
    self._background.drain()
    write_json(rundir.path_of(self.path, rundir.SUMMARY), summary)

  def plot(self, title: Optional[str] = None) -> Optional[str]:
    """accuracy.png: test accuracy, each group's accuracy (when the rows have
    `group_<j>_accuracy`) and train loss against rounds, drawn by
    `tff_cluster.io.plot`; titled from the config (algorithm, task, seed, key
    settings), else `title`. Then, for a clustered algorithm, groups.png
    (`plot_groups`). A failure to draw is a warning, never an error.
    Returns accuracy.png's path (None: not drawn, or `figures=False`)."""
    if not self.figures:
      return None
    self._background.drain()
    out = self._plot_accuracy(title)
    self.plot_groups()
    return out

  def plot_groups(self) -> Optional[str]:
    """groups.png, for an algorithm that groups its clients (its rows have
    `group_<j>_size`): clients x rounds from groups.csv, coloured by group
    (`tff_cluster.io.plot.groups_figure`), titled with the run and, where the
    task has true clusters (an `ari` column), the final ARI and purity (the
    last evaluated round's, as in summary.json). Returns its path, or None
    when not drawn. A failure to draw is a warning, never an error."""
    self._background.drain()
    path = rundir.path_of(self.path, rundir.GROUPS_CSV)
    if not any(_GROUP_SIZE.match(c) for c in self.columns) or not os.path.isfile(path):
      return None
    scores = final_cluster_scores(self._raw_rows)
    title = plot.groups_title(self.config or {}, scores.get("ari"), scores.get("purity"),
                              scored="ari" in self.columns)
    # A long groups.csv writes no line for a round without changes: the rows say
    # which rounds there were.
    rounds = ([int(r["round"]) for r in self._raw_rows]
              if self.groups_format == "long" and self._raw_rows else None)
    try:
      return plot.plot_groups(path, rundir.path_of(self.path, rundir.GROUPS_PNG), title, rounds)
    except Exception as e:  # noqa: BLE001 - the run's results matter more
      warnings.warn(f"groups.png not written: {type(e).__name__}: {e}")
      return None

  def _plot_accuracy(self, title: Optional[str]) -> Optional[str]:
    if not any(r.get("test_accuracy") is not None for r in self._raw_rows):
      return None
    rows = [{k: (float(v) if isinstance(v, (int, float)) else None)
             for k, v in r.items()} for r in self._raw_rows]
    run = plot.Run(self.path, dict(self.config or {}), list(self.columns), rows)
    out = rundir.path_of(self.path, rundir.ACCURACY_PNG)
    try:
      return plot.plot_runs([run], out, title=None if self.config else title, dpi=100)
    except Exception as e:  # noqa: BLE001 - the run's results matter more
      warnings.warn(f"accuracy.png not written: {type(e).__name__}: {e}")
      return None

  def close(self, last: Optional[Callable[[], None]] = None) -> None:
    """Closes the files and TensorBoard's writer; runs `last` (e.g. a final
    `write_summary`), then gives the folder up. Raises the error of a
    failed queued write once the files are closed."""
    failed: Optional[BaseException] = None
    try:
      self._background.close()
    except Exception as e:  # noqa: BLE001 - raised below, with the files closed
      failed = e
    for f in (self._csv_file, self._jsonl, self._groups_file):
      if f is not None and not f.closed:
        try:
          f.close()  # unbuffered: every row is on disk already
        except OSError:
          pass
    if self._tb is not None:
      try:
        self._tb.flush()
        self._tb.close()
      except Exception as e:  # noqa: BLE001
        self._tb_failed(e)
      self._tb = None
    try:
      if failed is not None:
        raise failed
      if last is not None:
        last()
    finally:
      self._release()


def maximized_columns(columns: Iterable[str]) -> List[str]:
  """The test scores among `columns` that a summary reports the maximum of,
  like `test_accuracy`'s: every `test_*` column but test_accuracy itself and
  the losses (e.g. test_accuracy_clientavg and test_macro_f1, the WeCFL
  paper's client-averaged scores, and FedGroup's test_accuracy_assigned, its
  paper's score), sorted by name."""
  return sorted({c for c in columns if c.startswith("test_") and c != "test_accuracy"
                 and not c.endswith("_loss")})


def final_cluster_scores(rows: Sequence[Mapping[str, Any]]) -> Dict[str, float]:
  """{"ari", "purity"} of the last row with a finite `ari`: the scores of the
  final assignment against the true clusters (a clustered algorithm's rows
  have them at every evaluation, the last round always evaluated, where the
  task has true clusters); {} when no row has them."""
  for row in reversed(rows):
    ari = row.get("ari")
    if ari is not None and np.isfinite(ari):
      return {"ari": float(ari), "purity": float(row["purity"])}
  return {}


def summarize(rows: List[Mapping[str, Any]], rounds: int,
              first_rounds: Sequence[int] = ()) -> Dict[str, Any]:
  """final/max test accuracy (and the round of the max), the final ARI and
  purity (`final_cluster_scores`), the largest `loss_ratio` and the mean
  round time, from per-round rows. `first_rounds`: the rounds each process
  of the run started with, which compiled what the others reuse: left out of
  `mean_round_seconds` when other rounds remain."""
  evaluated = [r for r in rows if r.get("test_accuracy") is not None]
  summary: Dict[str, Any] = {"rounds": rounds, "rounds_completed": len(rows)}
  if evaluated:
    best = max(evaluated, key=lambda r: r["test_accuracy"])
    summary.update(final_test_accuracy=evaluated[-1]["test_accuracy"],
                   max_test_accuracy=best["test_accuracy"],
                   max_round=best["round"])
  # The other test scores, maximised like test_accuracy: max_<name> and its round.
  for name in maximized_columns(c for r in rows for c in r):
    scored = [r for r in evaluated if r.get(name) is not None and np.isfinite(r[name])]
    if scored:
      best = max(scored, key=lambda r: r[name])
      summary.update({f"final_{name}": scored[-1][name], f"max_{name}": best[name],
                      f"max_{name}_round": best["round"]})
  summary.update(final_cluster_scores(rows))
  ratios = [r for r in rows if r.get("loss_ratio") is not None and np.isfinite(r["loss_ratio"])]
  if ratios:  # the divergence rule's margin (--divergence_ratio)
    worst = max(ratios, key=lambda r: r["loss_ratio"])
    summary.update(max_loss_ratio=worst["loss_ratio"], max_loss_ratio_round=worst["round"])
  timed = [r for r in rows if r.get("round_seconds") is not None]
  warm = [r for r in timed if r.get("round") not in set(first_rounds)]
  round_seconds = [r["round_seconds"] for r in (warm or timed)]
  if round_seconds:
    summary["mean_round_seconds"] = float(np.mean(round_seconds))
  return summary
