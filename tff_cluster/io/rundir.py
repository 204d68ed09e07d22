"""The run directory: the files a run writes in `--output_dir`, and their readers.

The names of a run directory's files and folders are here (docs/outputs.md
says what each holds; `tff_cluster.io.checkpoint` names the files inside
checkpoints/), and every reader of a run directory (`tff_cluster.io.plot`,
`tff_cluster.evaluate`, `--resume` / `--eval_only`, the benchmark scripts)
reads through the functions here:

  config.json       `read_config`          metrics.csv / .jsonl  `read_metrics`
  summary.json      `read_summary`         models/<which>/       `models_dir`,
  eval_<task>.json  `eval_path`                                  `read_clients`,
                                                                 `read_model_npz`

`RUN_FILES`, `RUN_DIRS` and `RUN_ENTRIES` say which entries belong to a run:
`foreign_entries` lists what else a directory holds (what `--overwrite`
refuses to remove). `HYPERPARAMETERS` (from the declarations of
`tff_cluster.spec.hparams`) and `DATA_SETTINGS` name the config.json keys that
hold a run's settings. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import csv
import fnmatch
import json
import math
import os
import re
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from tff_cluster.spec import hparams as hp

CONFIG = "config.json"
METRICS_CSV = "metrics.csv"
METRICS_JSONL = "metrics.jsonl"
SUMMARY = "summary.json"
GROUPS_CSV = "groups.csv"
ACCURACY_PNG = "accuracy.png"
GROUPS_PNG = "groups.png"
TENSORBOARD = "tensorboard"
CHECKPOINTS = "checkpoints"
MODELS = "models"
MODEL_KINDS = ("final", "best")  # models/final: the last round's; models/best: the best round's
CLIENTS_JSON = "clients.json"
EVAL_PREFIX = "eval_"
WRITE_TEST = ".write-test"  # the empty file that tells a folder is writable (never a link)
LOCK = ".lock"  # held while a run writes (`tff_cluster.io.lock`; never a link)
LOG = "output.log"  # a sweep's cell: its runs' output (`tff_cluster.sweep`), kept by --overwrite
RUN_FILES = (CONFIG, METRICS_CSV, METRICS_JSONL, SUMMARY, ACCURACY_PNG, GROUPS_CSV, GROUPS_PNG)
RUN_DIRS = (TENSORBOARD, CHECKPOINTS, MODELS)
# The temporary files and directories a write of a run makes, by folder:
# `NAME.tmp-<pid>` of an atomic write (`checkpoint.atomic_write_bytes`) or a
# checkpoint's clients folder, where NAME is exactly one a run writes there,
# and `model_<j>.tmp.keras` of a saved model. Nothing else is a temporary: a
# user's `backup.tmp-2023/` is the user's, whatever its name looks like.
_ATOMIC_FILES = "|".join(re.escape(n) for n in (CONFIG, METRICS_CSV, METRICS_JSONL, SUMMARY,
                                                 GROUPS_CSV))
_MODEL_TEMPORARIES = re.compile(rf"(model_\d+\.npz|{re.escape(CLIENTS_JSON)})\.tmp-\d+"
                                r"|model_\d+\.tmp\.keras")
_TEMPORARIES = {
    "": re.compile(rf"({_ATOMIC_FILES}|{EVAL_PREFIX}[A-Za-z0-9_.-]+\.json)\.tmp-\d+"),
    CHECKPOINTS: re.compile(r"round-\d{6,}\.(npz|pkl|clients)\.tmp-\d+"),
    **{f"{MODELS}/{kind}": _MODEL_TEMPORARIES for kind in MODEL_KINDS},
}
# What a run writes besides RUN_FILES, as glob patterns per folder (a folder
# pattern of its own); `*/` marks a folder.
RUN_ENTRIES = {
    "": (f"{EVAL_PREFIX}*.json", WRITE_TEST, LOCK, LOG, *(f"{d}/" for d in RUN_DIRS)),
    TENSORBOARD: ("events.out.tfevents.*", "*/"),
    f"{TENSORBOARD}/*": ("events.out.tfevents.*", "*/"),
    CHECKPOINTS: ("round-[0-9][0-9][0-9][0-9][0-9][0-9]*.npz",
                  "round-[0-9][0-9][0-9][0-9][0-9][0-9]*.pkl",
                  "round-[0-9][0-9][0-9][0-9][0-9][0-9]*.clients/"),
    f"{CHECKPOINTS}/*.clients": ("part-[0-9][0-9][0-9][0-9][0-9][0-9]*.npz",),
    MODELS: tuple(f"{k}/" for k in MODEL_KINDS),
    f"{MODELS}/*": ("model_[0-9]*.npz", "model_[0-9]*.keras", CLIENTS_JSON),
}
# The config.json keys every run's config has (how a run's directory is told
# from any other).
CONFIG_KEYS = ("algo", "task", "seed", "rounds")
OVERWRITE_SCOPE = ("--overwrite replaces only a previous run's own files (config.json, "
                   "metrics.csv/.jsonl, summary.json, groups.csv/.png, accuracy.png, "
                   "eval_*.json, tensorboard/, checkpoints/, models/)")

# The settings of a run, as config.json keys. What ran: the algorithm, the
# task and its model. The training settings (`hparams.TRAINING`) but the
# divergence rule, which stops a run and changes none of the rounds it lets
# through. How the rounds were computed: the runner, its XLA setting and its
# client batching (the ray_* and tff_* settings say where, not how).
IDENTITY = ("algo", "task", "model")
TRAINING_SETTINGS = tuple(d.name for d in hp.TRAINING if d is not hp.DIVERGENCE_RATIO)
EXECUTION_SETTINGS = tuple(d.name for d in (hp.RUNNER, hp.JIT, hp.CLIENT_BATCHING,
                                            hp.CLIENT_CHUNK))
# The run's hyper-parameters (TensorBoard's HParams): the three above and the
# number of clients.
HYPERPARAMETERS = (*IDENTITY, *TRAINING_SETTINGS, "num_clients", *EXECUTION_SETTINGS)
# The general flags that say which data a run read, beside `num_clients`.
DATA_SETTINGS = ("synthetic_alpha", "synthetic_beta", "data_dir", "glove_path")


class RunDirError(ValueError):
  """A run directory's file that is missing or cannot be read; the message is
  one line naming the file."""


# ---------------------------------------------------------------------------
# Paths


def is_temporary(name: str, folder: str = "") -> bool:
  """Whether `name`, in the run directory's `folder` ("" for the run
  directory itself, "checkpoints", "models/final", "models/best"), is a
  temporary file or directory a write of a run makes there: `NAME.tmp-<pid>`
  of a NAME the run writes in that folder, `model_<j>.tmp.keras` in a models
  folder. Names in other folders are never temporaries."""
  pattern = _TEMPORARIES.get(folder)
  return bool(pattern and pattern.fullmatch(name))


TEMPORARY_FOLDERS = tuple(_TEMPORARIES)  # the folders a run writes temporaries in


def path_of(run_dir: str, name: str) -> str:
  """The path of the run directory's file or folder `name` (one of the names above)."""
  return os.path.join(run_dir, name)


def models_dir(run_dir: str, which: str) -> str:
  """`models/final` or `models/best` of the run."""
  if which not in MODEL_KINDS:
    raise ValueError(f"unknown saved models {which!r}; valid: {', '.join(MODEL_KINDS)}")
  return os.path.join(run_dir, MODELS, which)


def model_stem(directory: str, j: int) -> str:
  """The saved model `j` of a models folder, without its extension
  (`.npz`: the weights; `.keras`: Keras' own format)."""
  return os.path.join(directory, f"model_{j}")


def eval_path(run_dir: str, task: str) -> str:
  """The `--eval_only` report of the run's models on `task`."""
  return os.path.join(run_dir, f"{EVAL_PREFIX}{task}.json")


# ---------------------------------------------------------------------------
# Readers


def read_json(path: str) -> Any:
  """The JSON value of `path`; RunDirError (one line) when it cannot be read."""
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise RunDirError(f"cannot read {path} ({e.__class__.__name__})") from None


def read_config(run_dir: str, missing_ok: bool = False) -> Dict[str, Any]:
  """The run's config.json ({} where it has none and `missing_ok`). Raises
  RunDirError when it cannot be read or is not a JSON object."""
  path = path_of(run_dir, CONFIG)
  if missing_ok and not os.path.exists(path):
    return {}
  config = read_json(path)
  if not isinstance(config, dict):
    raise RunDirError(f"{path} is not a JSON object")
  return config


def is_run_config(path: str) -> bool:
  """Whether `path` is a config.json a run wrote (a JSON object with CONFIG_KEYS)."""
  try:
    config = read_json(path)
  except RunDirError:
    return False
  return isinstance(config, dict) and all(k in config for k in CONFIG_KEYS)


def read_summary(run_dir: str) -> Optional[Dict[str, Any]]:
  """The run's summary.json (None where it has none yet). Raises RunDirError
  when it cannot be read."""
  path = path_of(run_dir, SUMMARY)
  if not os.path.exists(path):
    return None
  summary = read_json(path)
  if not isinstance(summary, dict):
    raise RunDirError(f"{path} is not a JSON object")
  return summary


def read_clients(directory: str) -> Dict[str, Any]:
  """A models folder's clients.json: {"round", "num_models", "client_model":
  {client id: model index}}. Raises RunDirError."""
  info = read_json(os.path.join(directory, CLIENTS_JSON))
  if not isinstance(info, dict) or not all(
      k in info for k in ("round", "num_models", "client_model")):
    raise RunDirError(f"{os.path.join(directory, CLIENTS_JSON)} lacks round, num_models "
                      "or client_model")
  return info


def read_model_npz(directory: str, j: int) -> Optional[List[np.ndarray]]:
  """The weights `w0, w1, ...` of `model_<j>.npz` (None where the folder has
  no such file: a run saved before them has `.keras` files only)."""
  path = model_stem(directory, j) + ".npz"
  if not os.path.isfile(path):
    return None
  with np.load(path, allow_pickle=False) as archive:
    return [np.asarray(archive[f"w{i}"]) for i in range(len(archive.files))]


def _cell(value: Optional[str]) -> Optional[float]:
  if value is None or value == "":
    return None
  return float(value)  # 'nan', 'inf' and '-inf' included


def _read_metrics_csv(path: str) -> Tuple[List[str], List[Dict[str, Optional[float]]]]:
  try:
    with open(path, newline="") as f:
      reader = csv.reader(f)
      header = next(reader, None)
      if not header:
        raise RunDirError(f"{path} is empty; valid: a metrics.csv with a header line")
      rows = []
      for line_num, cells in enumerate(reader, start=2):
        if len(cells) != len(header):
          continue  # a torn line
        try:
          rows.append({c: _cell(v) for c, v in zip(header, cells)})
        except ValueError:
          raise RunDirError(f"{path} line {line_num} has a value that is not a "
                            "number; valid: numbers, nan, inf or empty cells") from None
  except OSError as e:
    raise RunDirError(f"cannot read {path} ({e.strerror or e})") from None
  return header, [r for r in rows if r.get("round") is not None]


def _read_metrics_jsonl(path: str) -> Tuple[List[str], List[Dict[str, Optional[float]]]]:
  columns: Dict[str, None] = {}
  rows = []
  try:
    with open(path) as f:
      lines = f.read().splitlines()
  except OSError as e:
    raise RunDirError(f"cannot read {path} ({e.strerror or e})") from None
  for i, line in enumerate(lines):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except ValueError:
      if i == len(lines) - 1:
        continue  # a torn last line
      raise RunDirError(f"{path} line {i + 1} is not JSON; valid: one JSON "
                        "object per line") from None
    nonfinite = set(record.pop("nonfinite", ()) or ())
    row = {}
    for key, value in record.items():
      columns.setdefault(key)
      if value is None:
        row[key] = math.nan if key in nonfinite else None
      elif isinstance(value, (int, float)):
        row[key] = float(value)
    if row.get("round") is not None:
      rows.append(row)
  return list(columns), rows


def read_metrics(run_dir: str, first: str = METRICS_CSV
                 ) -> Tuple[List[str], List[Dict[str, Optional[float]]]]:
  """(columns, rows) of a run's metrics.csv, or of metrics.jsonl without one
  (`first=METRICS_JSONL`: metrics.jsonl where the run has it). The rows are
  the same in both, each a dict of floats.

  CSV cells: empty = not computed that round (None), `nan`/`inf`/`-inf` as
  floats. JSONL: null is None, or NaN when the row lists the field under
  "nonfinite". A torn last line (a run killed mid-write) is skipped.
  Raises RunDirError when there is neither file or one cannot be parsed.
  """
  readers = {METRICS_CSV: _read_metrics_csv, METRICS_JSONL: _read_metrics_jsonl}
  if first not in readers:
    raise ValueError(f"unknown metrics file {first!r}; valid: {', '.join(readers)}")
  for name in sorted(readers, key=lambda n: n != first):
    if os.path.isfile(path_of(run_dir, name)):
      return readers[name](path_of(run_dir, name))
  raise RunDirError(f"{run_dir} has no {METRICS_CSV} or {METRICS_JSONL}; valid: a run "
                    "directory written by run_experiment.py (its --output_dir)")


# ---------------------------------------------------------------------------
# Which entries belong to a run


def _rule_of(rel: str) -> tuple:
  for pattern, names in RUN_ENTRIES.items():
    if fnmatch.fnmatchcase(rel, pattern):
      return names
  return ()


def _foreign(path: str, rel: str = "") -> List[str]:
  """The entries under `path`/`rel` that no run writes (relative paths)."""
  out = []
  folder = os.path.join(path, rel) if rel else path
  rules = _rule_of(rel) + (RUN_FILES if rel == "" else ())
  for name in sorted(os.listdir(folder)):
    entry = f"{rel}/{name}" if rel else name
    full = os.path.join(folder, name)
    if os.path.islink(full):  # a run writes no links
      out.append(entry)
      continue
    if is_temporary(name, rel):
      continue
    is_dir = os.path.isdir(full)  # (links were named above)
    if is_dir and any(r.endswith("/") and fnmatch.fnmatchcase(name, r[:-1]) for r in rules):
      out += _foreign(path, entry)
    elif not is_dir and any(not r.endswith("/") and fnmatch.fnmatchcase(name, r)
                            for r in rules):
      continue
    else:
      out.append(entry + ("/" if is_dir else ""))
  return out


def is_plain_file(path: str) -> bool:
  """A regular file that is not a link (what a run's own files are)."""
  return os.path.isfile(path) and not os.path.islink(path)


def foreign_entries(path: str) -> List[str]:
  """What in the directory `path` no run of this project wrote (relative
  paths, folders ending in `/`): everything, when it holds no run's
  `config.json` (a directory holding only a run's temporary files is a
  run's); [] for a previous run's directory."""
  names = [n for n in os.listdir(path)
           if not (n in (WRITE_TEST, LOCK, LOG) and is_plain_file(os.path.join(path, n)))]
  if not names or all(is_temporary(n) for n in names):
    return []
  if not is_run_config(path_of(path, CONFIG)):
    return sorted(n + ("/" if os.path.isdir(os.path.join(path, n)) else "") for n in names)
  return _foreign(path)
