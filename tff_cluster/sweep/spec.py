"""A sweep's file: the grid of runs it names, checked before anything runs.

A sweep file is TOML (Python reads it with the standard library's `tomllib`,
so no parser is added to the install; its values are typed, where YAML's
readers turn `1e-3` into a string and `no` into False):

    algos = ["fedavg", "ifca"]          # --algo of each cell
    tasks = ["synthetic_clusters"]      # --task of each cell
    seeds = [0, 1, 2]                   # --seed of each cell
    out = "results/my_sweep"            # optional (the command's --out wins)
    columns = ["final_test_accuracy"]   # optional: summary.json keys for table.md

    [flags]                             # flags of every cell, by their run_experiment.py names
    rounds = 30
    task_arg = {num_clusters = 5}       # --task_arg as a table (or a list of "NAME=VALUE")

    [grid]                              # optional: each list one more axis of the grid
    client_lr = [0.01, 0.03]

    [[when]]                            # optional, in order: flags, seeds or skip of the cells
    algo = "ifca"                       # that match (algo and/or task: a name or a list)
    flags = {num_groups = 5}
    [[when]]
    task = "synthetic_clusters"
    algo = ["fedavg"]
    seeds = [0]                         # (or skip = true: no such cell)

    [methods.ifca_decay]                # optional: a named algorithm with its own flags,
    algo = "ifca"                       # listed in `algos` by its name
    flags = {lr_decay = 0.99}
    [settings.mnist_label]              # optional: a named task with its own flags,
    task = "mnist_workers"              # listed in `tasks` by its name
    flags = {task_arg = {split = "label"}}

A cell's flags: [flags], then its setting's, its method's, the matching
[[when]] blocks' in order, then the grid's values. A [[when]] matches a
method or setting by its name or by its algorithm's or task's.

Every cell is checked by the CLI's own rules (`cli.resolve_settings`) before
any runs, so a bad file gets the one line the run would have given, with the
key it came from. `Sweep.cells` lists the cells: algorithm, task, the grid's
values, seed, and the flags of its run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import itertools
import json
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from tff_cluster import cli
from tff_cluster.spec import hparams as hp

TOP_KEYS = ("algos", "tasks", "seeds", "out", "columns", "flags", "grid", "when", "methods",
            "settings")
NAMED_KEYS = {"methods": ("algo", "flags"), "settings": ("task", "flags")}
WHEN_KEYS = ("algo", "task", "flags", "seeds", "skip")
# What a cell's run is given by the sweep itself, never by the file.
SWEEP_OWNED = ("algo", "task", "seed", "output_dir", "overwrite", "progress", "resume",
               "eval_only")
# The general flags' types (the declared settings carry their own).
GENERAL_TYPES = {"model": str, "num_clients": int, "data_dir": str, "synthetic_alpha": float,
                 "synthetic_beta": float, "glove_path": str, "task_arg": list,
                 "checkpoint_every": int, "groups_format": str, "data_source": str}
# The seeds a cell may take (a run's --seed: 0 .. 2**31 - 1).
MAX_SEED = hp.INT_LIMIT


class SpecError(ValueError):
  """A sweep file (or the sweep's flags) that cannot run; one line naming the
  key and what is valid."""


@dataclasses.dataclass(frozen=True)
class Cell:
  """One run of the sweep. `options`: the grid's values, in the grid's order;
  `flags`: every flag of the run but algo, task, seed and the folder;
  `method` / `setting`: the names the file gives the algorithm and the task
  (their own names unless the file names a method or a setting)."""
  algo: str
  task: str
  seed: int
  options: Tuple[Tuple[str, Any], ...]
  flags: Tuple[Tuple[str, Any], ...]
  method: str = ""
  setting: str = ""

  def __post_init__(self):
    object.__setattr__(self, "method", self.method or self.algo)
    object.__setattr__(self, "setting", self.setting or self.task)

  @property
  def path(self) -> str:
    """The cell's run directory under the sweep's folder:
    SETTING/METHOD[/NAME=VALUE,...]/seedS (a task's and an algorithm's own
    names unless the file names them)."""
    parts = [self.setting, self.method]
    if self.options:
      parts.append(",".join(f"{n}={_path_text(v)}" for n, v in self.options))
    return os.path.join(*parts, f"seed{self.seed}")

  def argv(self) -> List[str]:
    """The cell's run as run_experiment.py flags (no folder)."""
    out = [f"--algo={self.algo}", f"--task={self.task}", f"--seed={self.seed}"]
    for name, value in self.flags:
      if name == "task_arg":
        out += [f"--task_arg={item}" for item in value]
      else:
        out.append(f"--{name}={flag_text(value)}")
    return out

  def record(self) -> Dict[str, Any]:
    """The cell as sweep.json keeps it."""
    return {"path": self.path, "algo": self.algo, "task": self.task, "seed": self.seed,
            "method": self.method, "setting": self.setting,
            "options": [list(o) for o in self.options], "flags": [list(f) for f in self.flags]}


@dataclasses.dataclass
class Sweep:
  """A checked sweep: its cells in run order (seed by seed, then task, then
  algorithm, then the grid), the grid's names and the table's columns."""
  cells: List[Cell]
  grid_names: Tuple[str, ...]
  columns: Tuple[str, ...]
  out: Optional[str]
  source: str


def flag_text(value: Any) -> str:
  """A value as a flag's text (booleans true/false, floats in full)."""
  if isinstance(value, float):
    return repr(value)
  return hp.format_value(value)


def _path_text(value: Any) -> str:
  """A grid value in a folder name: letters, digits and . _ - + only."""
  return re.sub(r"[^A-Za-z0-9._+-]", "_", flag_text(value))


def read_toml(path: str) -> Dict[str, Any]:
  """The TOML file at `path` as a dict. Raises SpecError (one line)."""
  try:
    import tomllib  # Python 3.11+
  except ImportError:  # Python 3.10: the same parser, as a package
    try:
      import tomli as tomllib
    except ImportError:
      raise SpecError("reading a sweep file on Python 3.10 needs the tomli package "
                      "(pip install tomli); valid: Python 3.11+, or tomli") from None
  try:
    with open(path, "rb") as f:
      return tomllib.load(f)
  except FileNotFoundError:
    raise SpecError(f"{path}: no such file; valid: a sweep file (TOML, docs/sweeps.md)"
                    ) from None
  except (OSError, UnicodeDecodeError) as e:
    raise SpecError(f"{path}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
  except tomllib.TOMLDecodeError as e:
    raise SpecError(f"{path}: not valid TOML ({str(e).splitlines()[0]}); valid: a sweep "
                    "file as docs/sweeps.md shows") from None


def load(path: str) -> Sweep:
  """The sweep in the TOML file `path`, checked."""
  return from_dict(read_toml(path), source=path)


def _declarations() -> Dict[str, hp.HParam]:
  return {d.name: d for d in (*hp.TRAINING, *cli.RUNNER_HPARAMS, *cli.ALGO_HPARAMS.values())}


def flag_type(name: str):
  """The type of flag `name` (None: no such flag)."""
  decl = _declarations().get(name)
  return decl.type if decl is not None else GENERAL_TYPES.get(name)


def _valid_flags() -> str:
  names = [n for n in cli.flag_names() if n not in SWEEP_OWNED]
  return ", ".join(sorted(names))


def typed(name: str, value: Any, where: str) -> Any:
  """`value` of flag `name` as the flag's type: TOML values as they are
  (an integer for a float flag widened), text (the command's flags) parsed
  as the run's flags parse it. Raises SpecError naming `where`."""
  if name in SWEEP_OWNED:
    raise SpecError(f"{where}: {name} is set by the sweep itself; valid: algos, tasks and "
                    "seeds at the top of the file; the sweep chooses each cell's folder")
  kind = flag_type(name)
  if kind is None:
    raise SpecError(f"{where}: unknown flag {name!r}; valid: {_valid_flags()}")
  if kind is list:
    return _task_args(value, where)
  if isinstance(value, str) and kind is not str:
    return _parsed(kind, value, where, name)
  if kind is float and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
    valid = {int: "an integer", float: "a number", bool: "true or false",
             str: "a string"}[kind]
    raise SpecError(f"{where}: {name} = {value!r}; valid: {valid}")
  return value


def _parsed(kind, text: str, where: str, name: str) -> Any:
  try:
    if kind is bool:
      if text.lower() not in ("true", "false"):
        raise ValueError(text)
      return text.lower() == "true"
    return kind(text)
  except ValueError:
    valid = {int: "an integer", float: "a number", bool: "true or false"}[kind]
    raise SpecError(f"{where}: {name} = {text!r}; valid: {valid}") from None


def _task_args(value: Any, where: str) -> Tuple[str, ...]:
  """--task_arg items: a table {NAME = VALUE} or a list of "NAME=VALUE"."""
  if isinstance(value, Mapping):
    return tuple(f"{k}={flag_text(v)}" for k, v in value.items())
  if isinstance(value, str):
    value = [value]
  if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
    return tuple(value)
  raise SpecError(f"{where}: task_arg = {value!r}; valid: a table {{NAME = VALUE}} or a list "
                  "of \"NAME=VALUE\" strings")


def _names(value: Any, key: str, valid: Sequence[str], where: str) -> List[str]:
  items = [value] if isinstance(value, str) else value
  if not isinstance(items, list) or not items or not all(isinstance(v, str) for v in items):
    raise SpecError(f"{where}: {key} = {value!r}; valid: a name or a non-empty list of "
                    f"names, each one of {', '.join(sorted(valid))}")
  for v in items:
    if v not in valid:
      raise SpecError(f"{where}: unknown {key.rstrip('s')} {v!r}; valid: "
                      f"{', '.join(sorted(valid))}")
  if len(set(items)) != len(items):
    raise SpecError(f"{where}: {key} names one twice; valid: each once")
  return list(items)


def _seeds(value: Any, where: str) -> List[int]:
  if isinstance(value, int) and not isinstance(value, bool):
    value = [value]
  if (not isinstance(value, list) or not value or any(
      not isinstance(s, int) or isinstance(s, bool) or not 0 <= s <= MAX_SEED for s in value)):
    raise SpecError(f"{where}: seeds = {value!r}; valid: a non-empty list of integers "
                    f"0..{MAX_SEED}")
  if len(set(value)) != len(value):
    raise SpecError(f"{where}: seeds name one twice; valid: each once")
  return list(value)


def _table(value: Any, key: str, where: str) -> Dict[str, Any]:
  if not isinstance(value, Mapping):
    raise SpecError(f"{where}: {key} must be a table ([{key}] or {key} = {{...}}); "
                    f"got {value!r}")
  return dict(value)


def _flags(table: Mapping[str, Any], where: str) -> Dict[str, Any]:
  return {name: typed(name, v, f"{where} {name}") for name, v in table.items()}


def _grid(table: Mapping[str, Any], where: str) -> Dict[str, List[Any]]:
  out = {}
  for name, values in table.items():
    if not isinstance(values, list) or not values:
      raise SpecError(f"{where} {name} = {values!r}; valid: a non-empty list of values, "
                      "one per cell")
    out[name] = [typed(name, v, f"{where} {name}") for v in values]
    if len({flag_text(v) for v in out[name]}) != len(values):
      raise SpecError(f"{where} {name} names a value twice; valid: each once")
  return out


@dataclasses.dataclass
class _When:
  algos: Optional[List[str]]
  tasks: Optional[List[str]]
  flags: Dict[str, Any]
  seeds: Optional[List[int]]
  skip: bool

  def matches(self, method: str, algo: str, setting: str, task: str) -> bool:
    return ((self.algos is None or method in self.algos or algo in self.algos)
            and (self.tasks is None or setting in self.tasks or task in self.tasks))


def _named(value: Any, key: str, registered: Mapping[str, Any], source: str
           ) -> Dict[str, Tuple[str, Dict[str, Any]]]:
  """[methods.NAME] / [settings.NAME] tables: name -> (algorithm or task, flags)."""
  what, _ = NAMED_KEYS[key]
  table = _table(value, key, source)
  out = {}
  for name, entry in table.items():
    where = f"{source}: [{key}.{name}]"
    if name in registered:
      raise SpecError(f"{where}: {name!r} is already the name of {what} {name!r}; valid: "
                      f"another name for the {key[:-1]}")
    if not re.fullmatch(r"[A-Za-z0-9._+-]+", name):
      raise SpecError(f"{where}: valid names: letters, digits and . _ - + (a folder's name)")
    entry = _table(entry, f"{key}.{name}", source)
    for k in entry:
      if k not in NAMED_KEYS[key]:
        raise SpecError(f"{where}: unknown key {k!r}; valid: {', '.join(NAMED_KEYS[key])}")
    if what not in entry:
      raise SpecError(f"{where}: no {what}; valid: {what} = \"NAME\"")
    target = _names(entry[what], what, registered, where)
    if len(target) != 1:
      raise SpecError(f"{where}: {what} names {len(target)}; valid: one")
    out[name] = (target[0], _flags(_table(entry.get("flags", {}), "flags", where),
                                   f"{where} flags"))
  return out


def _whens(value: Any, source: str, algos=cli.ALGOS, tasks=cli.TASKS) -> List[_When]:
  if not isinstance(value, list) or not all(isinstance(w, Mapping) for w in value):
    raise SpecError(f"{source}: when must be a list of tables ([[when]] blocks)")
  out = []
  for i, w in enumerate(value):
    where = f"{source}: [[when]] #{i + 1}"
    for key in w:
      if key not in WHEN_KEYS:
        raise SpecError(f"{where}: unknown key {key!r}; valid: {', '.join(WHEN_KEYS)}")
    if "algo" not in w and "task" not in w:
      raise SpecError(f"{where}: names no algo or task; valid: algo and/or task, each a "
                      "name or a list")
    skip = w.get("skip", False)
    if not isinstance(skip, bool):
      raise SpecError(f"{where}: skip = {skip!r}; valid: true or false")
    out.append(_When(
        algos=_names(w["algo"], "algo", algos, where) if "algo" in w else None,
        tasks=_names(w["task"], "task", tasks, where) if "task" in w else None,
        flags=_flags(_table(w.get("flags", {}), "flags", where), f"{where} flags"),
        seeds=_seeds(w["seeds"], where) if "seeds" in w else None, skip=skip))
  return out


def from_dict(data: Mapping[str, Any], source: str = "sweep") -> Sweep:
  """The sweep a file's (or the command's flags') dict names, every cell
  checked. Raises SpecError (one line)."""
  for key in data:
    if key not in TOP_KEYS:
      raise SpecError(f"{source}: unknown key {key!r}; valid: {', '.join(TOP_KEYS)}")
  for key in ("algos", "tasks", "seeds"):
    if key not in data:
      raise SpecError(f"{source}: no {key}; valid: {key} = [...] at the top of the file")
  methods = _named(data.get("methods", {}), "methods", cli.ALGOS, source)
  settings = _named(data.get("settings", {}), "settings", cli.TASKS, source)
  algo_names = [*cli.ALGOS, *methods]
  task_names = [*cli.TASKS, *settings]
  algos = _names(data["algos"], "algos", algo_names, source)
  tasks = _names(data["tasks"], "tasks", task_names, source)
  seeds = _seeds(data["seeds"], source)
  flags = _flags(_table(data.get("flags", {}), "flags", source), f"{source}: [flags]")
  grid = _grid(_table(data.get("grid", {}), "grid", source), f"{source}: [grid]")
  whens = _whens(data.get("when", []), source, algo_names, task_names)
  out = data.get("out")
  if out is not None and (not isinstance(out, str) or not out):
    raise SpecError(f"{source}: out = {out!r}; valid: a folder path")
  columns = data.get("columns", ())
  if not isinstance(columns, (list, tuple)) or not all(isinstance(c, str) for c in columns):
    raise SpecError(f"{source}: columns = {columns!r}; valid: a list of summary.json keys")
  method_of = {a: methods.get(a, (a, {})) for a in algos}
  setting_of = {t: settings.get(t, (t, {})) for t in tasks}
  cells = _cells(method_of, setting_of, seeds, flags, grid, whens)
  if not cells:
    raise SpecError(f"{source}: every cell is skipped; valid: a grid with at least one cell")
  sweep = Sweep(cells, tuple(grid), tuple(columns), out, source)
  check_cells(sweep)
  return sweep


def _cells(method_of, setting_of, seeds, flags, grid, whens) -> List[Cell]:
  """The cells, seed by seed, then setting (task), method (algorithm), grid."""
  combos = list(itertools.product(*grid.values())) if grid else [()]
  per_pair = {}
  for setting, (task, task_flags) in setting_of.items():
    for method, (algo, algo_flags) in method_of.items():
      mine = [w for w in whens if w.matches(method, algo, setting, task)]
      if any(w.skip for w in mine):
        continue
      merged = {**flags, **task_flags, **algo_flags}
      pair_seeds = seeds
      for w in mine:
        merged.update(w.flags)
        pair_seeds = w.seeds if w.seeds is not None else pair_seeds
      per_pair[setting, method] = (algo, task, merged, pair_seeds)
  cells = []
  for seed in sorted({s for *_, ss in per_pair.values() for s in ss}):
    for (setting, method), (algo, task, merged, pair_seeds) in per_pair.items():
      if seed not in pair_seeds:
        continue
      for combo in combos:
        options = tuple(zip(grid, combo))
        run_flags = {**merged, **dict(options)}
        cells.append(Cell(algo, task, seed, options, tuple(run_flags.items()), method, setting))
  return cells


def check_cells(sweep: Sweep) -> None:
  """Every cell's flags through the run's own checks, folders distinct. The
  warnings a run would print (flags an algorithm ignores) are printed once."""
  import sys
  seen: Dict[str, Cell] = {}
  warnings: Dict[str, None] = {}
  for cell in sweep.cells:
    if cell.path in seen:
      raise SpecError(f"{sweep.source}: the cells {describe(seen[cell.path])} and "
                      f"{describe(cell)} have one folder ({cell.path}); valid: grid values "
                      "that differ in letters, digits or . _ - +")
    seen[cell.path] = cell
    values = {name: None for name in cli.flag_names()}
    values.update(cli.GENERAL_DEFAULTS)
    values.update(dict(cell.flags), algo=cell.algo, task=cell.task, seed=cell.seed,
                  output_dir=os.path.join("sweep", cell.path), progress=False)
    if values["groups_format"] not in cli.GROUPS_FORMATS:
      raise SpecError(f"{sweep.source}: groups_format = {values['groups_format']!r}; "
                      f"valid: {', '.join(cli.GROUPS_FORMATS)}")
    captured = io.StringIO()
    try:
      with contextlib.redirect_stderr(captured):
        cli.resolve_settings(values)
    except cli.UsageError as e:
      raise SpecError(f"{sweep.source}: cell {describe(cell)}: {e}") from None
    for line in captured.getvalue().splitlines():
      warnings.setdefault(line)
  for line in warnings:
    print(line, file=sys.stderr)


def describe(cell: Cell) -> str:
  """'task=T algo=A [name=value ...] seed=S' (one line; a named setting or
  method by its name)."""
  options = "".join(f" {n}={flag_text(v)}" for n, v in cell.options)
  return f"task={cell.setting} algo={cell.method}{options} seed={cell.seed}"


def from_flags(algos: str, tasks: str, seeds: str, flags: Sequence[str],
               grid: Sequence[str]) -> Dict[str, Any]:
  """The dict a sweep file would hold, from the command's flags: comma lists
  of algorithms, tasks and seeds; `NAME=VALUE` flags; `NAME=V1,V2` grid axes
  (values as text, typed by `from_dict`). Raises SpecError."""
  data: Dict[str, Any] = {}
  if algos:
    data["algos"] = [a for a in algos.split(",") if a]
  if tasks:
    data["tasks"] = [t for t in tasks.split(",") if t]
  if seeds:
    try:
      data["seeds"] = [int(s) for s in seeds.split(",") if s]
    except ValueError:
      raise SpecError(f"--seeds={seeds}; valid: a comma-separated list of integers") from None
  table: Dict[str, Any] = {}
  for item in flags:
    name, sep, value = item.partition("=")
    if not sep or not name:
      raise SpecError(f"--flag={item}; valid: NAME=VALUE (a run_experiment.py flag)")
    if name == "task_arg":
      table.setdefault("task_arg", []).append(value)
    else:
      table[name] = value
  if table:
    data["flags"] = table
  axes: Dict[str, Any] = {}
  for item in grid:
    name, sep, values = item.partition("=")
    if not sep or not name or not values:
      raise SpecError(f"--grid={item}; valid: NAME=V1,V2,... (a run_experiment.py flag)")
    axes[name] = values.split(",")
  if axes:
    data["grid"] = axes
  return data


def merge(base: Mapping[str, Any], given: Mapping[str, Any]) -> Dict[str, Any]:
  """A file's dict with the command's flags on top (their lists replace the
  file's; their flags and grid axes are added to the file's)."""
  out = dict(base)
  for key, value in given.items():
    if key in ("flags", "grid") and isinstance(out.get(key), Mapping):
      out[key] = {**out[key], **value}
    else:
      out[key] = value
  return out


def conflicts(recorded: Mapping[str, Any], sweep: Sweep) -> Optional[str]:
  """None when every cell the sweep shares (by folder) with `recorded` (a
  sweep.json) has the same flags there (the sweep may add cells or leave
  some out: more seeds, another task), else the first that differs, in words."""
  old = {c["path"]: json.dumps(c, sort_keys=True) for c in recorded.get("cells", [])}
  changed = [c.path for c in sweep.cells
             if c.path in old and old[c.path] != json.dumps(c.record(), sort_keys=True)]
  if not changed:
    return None
  return f"{len(changed)} of its cells ran there with other flags, e.g. {changed[0]}"


def union(recorded: Mapping[str, Any], sweep: Sweep) -> Dict[str, Any]:
  """sweep.json after `sweep` ran: the recorded cells and the sweep's."""
  paths = {c.path for c in sweep.cells}
  kept = [c for c in recorded.get("cells", []) if c["path"] not in paths]
  return {**recorded, "cells": kept + [c.record() for c in sweep.cells]}
