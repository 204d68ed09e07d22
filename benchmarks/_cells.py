"""What the tables over a grid of cells (algorithm x task x seed) share: their
sweep files (`benchmarks/sweeps/<table>.toml`, run by `tff_cluster.sweep`),
their command-line options, the run of every cell (`--parallel` at a time),
FedAvg's 1-point round that sets a task's rounds, and the projection of a
plan from a few timed rounds (the clustered catalogue, the personalized
baselines).

A table's cells and their flags are its sweep files; the table script reads
them, narrows them to its `--tasks/--algos/--seeds` (and `--rounds`,
`--clients_per_round`), runs them with `tff_cluster.sweep.driver.sweep` and
scores each finished cell into the table's recorded CSV. The same cells run
without the script: `python -m tff_cluster.sweep benchmarks/sweeps/<table>.toml`
from the repository root (the files' data folders are relative to it).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import os
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence

from _sweep import (REPO_ROOT, load_recorded, median_round_seconds, registered_algorithms,
                    run_one)
from tff_cluster.io import rundir  # (_sweep put the repository on sys.path)
from tff_cluster.sweep import cells as sweep_cells
from tff_cluster.sweep import driver, spec

PROJECT_ROUNDS = 4
SWEEPS = os.path.join(REPO_ROOT, "benchmarks", "sweeps")
PATH_FLAGS = ("data_dir", "glove_path")  # folders, relative to the repository root
CUT = ("clients_per_round", "rounds", "eval_every")  # a task's cut among its flags


@dataclasses.dataclass
class Part:
  """One sweep file of a table: `stem` (benchmarks/sweeps/STEM.toml), its
  keys with the data folders made absolute from the repository root, and
  `label`, the table's name for its one task where that is not the task's
  own (a paper's setting of a task that the table runs otherwise too)."""
  stem: str
  data: dict
  label: Optional[str] = None
  adjust: Optional[Callable[[dict], dict]] = None  # keys that follow others, set again

  def label_of(self, cell: spec.Cell) -> str:
    """The table's `task` of a cell."""
    return self.label or cell.task

  def labels(self) -> List[str]:
    return [self.label] if self.label else list(self.data["tasks"])

  def out(self, base: str) -> str:
    """The part's sweep folder under the table's --out: the folder itself,
    or BASE_LABEL beside it for a setting (each sweep folder holds one
    sweep)."""
    return base if self.label is None else f"{base}_{self.label}"


def sweep_file(stem: str) -> str:
  return os.path.join(SWEEPS, f"{stem}.toml")


def part(stem: str, label: Optional[str] = None,
         adjust: Optional[Callable[[dict], dict]] = None) -> Part:
  """The sweep file `stem`, its data folders absolute (the file has them
  relative to the repository root, where the sweep command is run from)."""
  data = spec.read_toml(sweep_file(stem))
  named = [n.get("flags", {}) for key in ("methods", "settings")
           for n in data.get(key, {}).values()]
  whens = [w.get("flags", {}) for w in data.get("when", [])]
  for table in [data.get("flags", {}), *named, *whens]:
    for name in PATH_FLAGS:
      if isinstance(table.get(name), str):
        table[name] = os.path.normpath(os.path.join(REPO_ROOT, table[name]))
  return Part(stem, data, label, adjust)


def _names(value) -> Optional[List[str]]:
  return None if value is None else [value] if isinstance(value, str) else list(value)


def task_cut(data: dict, task: str) -> Dict[str, object]:
  """A task's cut as its sweep file writes it: its clients per round, rounds
  and eval_every (the file's flags, then every [[when]] naming the task) and
  its seeds (the file's, or those of a [[when]] naming the task alone)."""
  cut = {name: data.get("flags", {}).get(name) for name in CUT}
  seeds = data["seeds"]
  for w in data.get("when", []):
    if w.get("skip") or task not in (_names(w.get("task")) or ()):
      continue
    cut.update({n: v for n, v in w.get("flags", {}).items() if n in CUT})
    if "seeds" in w and "algo" not in w:
      seeds = w["seeds"]
  return {**cut, "seeds": list(seeds)}


def flags_of(data: dict, algo: str, task: str) -> Dict[str, object]:
  """The flags a sweep file gives the cell (`algo`, `task`): its [flags],
  then each [[when]] that matches, in order."""
  flags = dict(data.get("flags", {}))
  for w in data.get("when", []):
    if ((w.get("task") is None or task in _names(w["task"]))
        and (w.get("algo") is None or algo in _names(w["algo"]))):
      flags.update(w.get("flags", {}))
  return flags


def override(data: dict, name: str, value) -> dict:
  """`data` with flag `name` set to `value` wherever the file sets it (in
  [flags] where it sets it nowhere)."""
  data = copy.deepcopy(data)
  tables = [data.setdefault("flags", {})] + [w["flags"] for w in data.get("when", [])
                                              if "flags" in w]
  hits = [t for t in tables if name in t] or tables[:1]
  for table in hits:
    table[name] = value
  return data


def narrowed(p: Part, args, labels: Sequence[str]) -> Optional[dict]:
  """The part's keys narrowed to the command's --tasks (`labels`), --algos
  and --seeds, with its --rounds and --clients_per_round; None when none of
  its cells is asked for."""
  data = copy.deepcopy(p.data)
  tasks = (list(data["tasks"]) if p.label in labels else [] if p.label
           else [t for t in labels if t in data["tasks"]])  # (in the order asked)
  algos = [a for a in args.algos.split(",") if a in data["algos"]]
  if not tasks or not algos:
    return None
  data["tasks"], data["algos"] = tasks, algos
  if args.seeds:
    data["seeds"] = [int(x) for x in args.seeds.split(",")]
    for w in data.get("when", []):
      w.pop("seeds", None)
  for name in ("rounds", "clients_per_round"):
    if getattr(args, name):
      data = override(data, name, getattr(args, name))
  return data if p.adjust is None else p.adjust(data)


def parser(description: str, tasks: Sequence[str], algos: Sequence[str],
           out: str) -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=description)
  p.add_argument("--tasks", default=",".join(tasks))
  p.add_argument("--algos", default=",".join(algos))
  p.add_argument("--seeds", default=None, help="override the cut's seeds")
  p.add_argument("--rounds", type=int, default=None, help="override the cut's rounds")
  p.add_argument("--clients_per_round", type=int, default=None,
                 help="override the cut's clients per round")
  p.add_argument("--out", default=os.path.join(REPO_ROOT, "results", out),
                 help="the sweep's folder (a paper setting's: OUT_SETTING beside it)")
  p.add_argument("--project", action="store_true",
                 help=f"time {PROJECT_ROUNDS} rounds of each (task, algorithm) and project "
                      "the plan")
  p.add_argument("--converge", action="store_true",
                 help="run FedAvg (seed 0, the cut, the task's default rounds) and print "
                      "the round from which it stays within 1 point of its final accuracy")
  p.add_argument("--parallel", type=int, default=1,
                 help="cells run at a time, each its own process (default 1; 2 on two cores)")
  p.add_argument("--table_only", action="store_true")
  p.add_argument("--dry_run", action="store_true",
                 help="list each cell's folder and flags (as the sweep runs it) and stop")
  p.add_argument("--markdown", default=None, metavar="STEM",
                 help="write the recorded table to STEM.md and stop")
  p.add_argument("--record", action="store_true",
                 help="add the finished runs to the table's recorded CSV, each as soon as it "
                      "finishes")
  p.add_argument("--skip_recorded", action="store_true",
                 help="do not run a cell the recorded CSV already has (and whose run "
                      "directory is not here): a table spread over sessions whose run "
                      "directories do not survive")
  return p


def recorded_cells(name: str) -> set:
  """The (algo, task, seed) of the cells in `benchmarks/recorded/<name>.csv`."""
  return {(r["algo"], r["task"], int(r["seed"])) for r in load_recorded(name)}


def check_names(script: str, args, tasks: Sequence[str], algos: Sequence[str]) -> None:
  """Refuses, in one line, a task or algorithm the table does not have."""
  for name, given, valid in (("task", args.tasks, tasks), ("algo", args.algos, algos)):
    bad = [x for x in given.split(",") if x not in valid]
    if bad:
      raise SystemExit(f"{script}: error: unknown {name} {bad[0]!r}; valid: "
                       f"{', '.join(valid)}")
  missing = [a for a in args.algos.split(",") if a not in registered_algorithms()]
  if missing:
    raise SystemExit(f"{script}: error: --algo={missing[0]} is not registered")


def sweeps(script: str, parts: Sequence[Part], args, need_rounds: bool = True
           ) -> List[tuple]:
  """(part, its narrowed Sweep) of each part with cells asked for; refuses,
  in one line, cells the sweep's checks refuse and (`need_rounds`) a task
  whose cut has no rounds yet."""
  labels = args.tasks.split(",")
  out = []
  for p in parts:
    data = narrowed(p, args, labels)
    if data is None:
      continue
    for task in data["tasks"]:
      if need_rounds and task_cut(data, task)["rounds"] is None:
        raise SystemExit(f"{script}: error: {p.label or task} has no rounds in its cut "
                         f"yet: run --converge and write them into {sweep_file(p.stem)} "
                         "(or pass --rounds)")
    try:
      out.append((p, spec.from_dict(data, source=sweep_file(p.stem))))
    except spec.SpecError as e:
      raise SystemExit(f"{script}: error: {e}") from None
  return out


def run_cells(script: str, parts: Sequence[Part], args, score: Callable,
              note: Callable[[str, str], Optional[str]] = lambda algo, task: None,
              record: Optional[Callable[[List[Dict[str, object]]], None]] = None,
              recorded: frozenset = frozenset()) -> List[Dict[str, object]]:
  """Runs the table's cells, `args.parallel` at a time, with
  `tff_cluster.sweep` (a finished run is reused, an interrupted one resumes;
  a failed cell does not stop the table; nothing runs with --table_only) and
  returns the records of every finished cell, each `record`ed as soon as it
  finishes. A cell in `recorded` (algo, table task, seed) whose run directory
  is not here is not run."""
  t0 = time.perf_counter()
  records = []

  def scored(p: Part, out: str, cell: spec.Cell) -> None:
    task = p.label_of(cell)
    got = score(os.path.join(out, cell.path))
    print(f"[{time.perf_counter() - t0:7.0f} s] {task} {cell.algo} seed {cell.seed}: {got}",
          flush=True)
    if got is not None:
      extra = note(cell.algo, task)
      records.append({"algo": cell.algo, "task": task, "seed": cell.seed,
                      **({} if extra is None else {"note": extra}), **got})
      if record is not None and not args.table_only:
        record(records[-1:])

  for p, the_sweep in sweeps(script, parts, args):
    out = p.out(args.out)
    kept = [c for c in the_sweep.cells
            if (c.algo, p.label_of(c), c.seed) not in recorded
            or os.path.isdir(os.path.join(out, c.path))]
    if args.dry_run:
      for cell in driver.resolve(dataclasses.replace(the_sweep, cells=kept)).cells:
        print(f"{os.path.join(out, cell.path)}: {' '.join(cell.argv())}")
      print(f"{len(kept)} cells ({sweep_file(p.stem)})")
      continue
    if not kept:
      continue
    if args.table_only:
      for cell in kept:
        scored(p, out, cell)
      continue

    def on_cell(cell, outcome, p=p, out=out):
      if outcome.status == sweep_cells.FAILED:
        print(f"FAILED {p.label_of(cell)} {cell.algo} seed {cell.seed}: {outcome.message}",
              flush=True)
      else:
        scored(p, out, cell)

    try:
      driver.sweep(dataclasses.replace(the_sweep, cells=kept), out=out,
                   parallel=args.parallel, progress=False, plots=False, on_cell=on_cell)
    except spec.SpecError as e:
      raise SystemExit(f"{script}: error: {e}") from None
  return records


def load(script: str, data: dict, stem: str) -> spec.Sweep:
  """The sweep of a sweep file's keys (`data`, narrowed by a table), checked;
  refuses, in one line, what the sweep's checks refuse."""
  try:
    return spec.from_dict(data, source=sweep_file(stem))
  except spec.SpecError as e:
    raise SystemExit(f"{script}: error: {e}") from None


def run_sweep(script: str, the_sweep: spec.Sweep, out: str, args,
              done: Callable[[spec.Cell], None], parallel: int = 1) -> None:
  """Runs a table's sweep into its folder `out` with `tff_cluster.sweep`
  (`parallel` cells at a time; a finished run is reused, an interrupted one
  resumes; a failed cell does not stop the others), calling `done(cell)` as
  each cell finishes (completed, or stopped by the divergence guard); with
  `args.dry_run` lists each cell's folder and flags instead, runs nothing."""
  if args.dry_run:
    for cell in driver.resolve(the_sweep).cells:
      print(f"{os.path.join(out, cell.path)}: {' '.join(cell.argv())}")
    print(f"{len(the_sweep.cells)} cells ({the_sweep.source})")
    return

  def on_cell(cell, outcome):
    if outcome.status == sweep_cells.FAILED:
      print(f"FAILED {spec.describe(cell)}: {outcome.message}", flush=True)
    else:
      done(cell)

  try:
    driver.sweep(the_sweep, out=out, parallel=parallel, progress=False, plots=False,
                 on_cell=on_cell)
  except spec.SpecError as e:
    raise SystemExit(f"{script}: error: {e}") from None


def cell_flags(cell: spec.Cell, drop: Sequence[str] = ()) -> List[str]:
  """A cell's run_experiment.py flags but its seed, rounds and `drop`."""
  skip = ("seed", "rounds", *drop)
  return [f for f in cell.argv() if f[2:].partition("=")[0] not in skip]


def one_point_round(directory: str) -> int:
  """The first evaluated round from which the run's test accuracy stays within
  1 point (0.01) of its final round's."""
  _, rows = rundir.read_metrics(directory)
  acc = [(int(r["round"]), float(r["test_accuracy"])) for r in rows
         if r.get("test_accuracy") not in (None, "")]
  final = acc[-1][1]
  first = acc[-1][0]
  for rnd, a in reversed(acc):
    if abs(a - final) > 0.01 + 1e-9:  # (0.91 - 0.90 is 0.010000000000000009)
      break
    first = rnd
  return first


def converge(script: str, parts: Sequence[Part], args, extra: Sequence[str] = ()) -> None:
  """FedAvg at each task's default rounds under the cut (seed 0; its cell's
  flags but eval_every, then `extra`): the round from which it stays within
  1 point of its final accuracy, rounded up to 10."""
  from tff_cluster import tasks as registry
  args = copy.copy(args)
  args.algos, args.seeds = "fedavg", "0"
  for p, the_sweep in sweeps(script, parts, args, need_rounds=False):
    for cell in the_sweep.cells:
      task = p.label_of(cell)
      rounds = int(registry.get_task(cell.task).defaults["rounds"])
      d = os.path.join(args.out, "_fedavg_converge", task)
      run_one(cell_flags(cell, ("eval_every",)) + list(extra), d, 0, "local", rounds)
      r = one_point_round(d)
      print(f"{task}: FedAvg within 1 point of its round-{rounds} accuracy from round {r} "
            f"-> rounds {min(rounds, -(-r // 10) * 10)}", flush=True)


def project(script: str, parts: Sequence[Part], args) -> None:
  """Times `PROJECT_ROUNDS` rounds of each (task, algorithm) and projects the
  plan's CPU time: that run's wall time plus the rest at its median round
  (the first round's compilation left out of the rate)."""
  from tff_cluster import tasks as registry
  total, runs = 0.0, 0
  for p, the_sweep in sweeps(script, parts, args, need_rounds=False):
    pairs: Dict[tuple, List[spec.Cell]] = {}
    for cell in the_sweep.cells:
      pairs.setdefault((cell.task, cell.algo), []).append(cell)
    for (_, algo), cells in pairs.items():
      cell, seeds = cells[0], len(cells)
      task = p.label_of(cell)
      rounds = (dict(cell.flags).get("rounds")
                or int(registry.get_task(cell.task).defaults["rounds"]))
      with tempfile.TemporaryDirectory() as tmp:
        run = os.path.join(tmp, "run")
        s = run_one(cell_flags(cell, ("eval_every",)) + [f"--rounds={PROJECT_ROUNDS}"], run,
                    0, "local", PROJECT_ROUNDS)
        per_round = median_round_seconds(run)
      if "wall_seconds" not in s:  # the divergence guard stopped it (exit 3)
        print(f"{task} {algo}: diverged at round {s.get('rounds_completed')} of "
              f"{PROJECT_ROUNDS}; counted at its rate for the whole run", flush=True)
        per_round = per_round if math.isfinite(per_round) else 0.0  # none completed
      one = s.get("wall_seconds", 0.0) + (rounds - PROJECT_ROUNDS) * per_round
      total += one * seeds
      runs += seeds
      print(f"{task} {algo}: {per_round:.2f} s/round -> {one / 60:.1f} min for {rounds} "
            f"rounds x {seeds} seeds", flush=True)
  print(f"projected total: {total / 3600:.2f} h for {runs} runs (training; evaluation "
        f"not included)")


def number(row: Dict[str, str], key: str) -> Optional[float]:
  """A recorded field as a number (None where empty)."""
  return None if row.get(key) in (None, "") else float(row[key])


def task_blocks(rows: Sequence[Dict[str, str]], tasks: Dict[str, dict], algos: Sequence[str],
                headings: Sequence[str], cells: Callable[[List[Dict[str, str]]], List[str]]
                ) -> List[str]:
  """A recorded table's markdown, one block per task: each algorithm's
  seeds, its `cells(rows)` under `headings`, then the mean MB a round and the
  median seconds of a round beside FedAvg's on the task."""
  import numpy as np
  from _sweep import truncated
  out = []
  for task, spec in tasks.items():
    got = [r for r in rows if r["task"] == task]
    if not got:
      continue
    base = [number(r, "seconds_per_round") for r in got if r["algo"] == "fedavg"]
    base_s = float(np.median(base)) if base else None
    columns = ["`--algo`", "seeds", *headings, "MB/round", "s/round", "× FedAvg"]
    out += [f"**{task}** ({got[0]['rounds']} rounds, {spec['clients_per_round']} clients a "
            "round)", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for algo in algos:
      mine = [r for r in got if r["algo"] == algo]
      if not mine:
        continue
      sec = float(np.median([number(r, "seconds_per_round") for r in mine]))
      ratio = truncated(sec / base_s, 1) if base_s else "–"
      mb = truncated(np.mean([number(r, "bytes_per_round") for r in mine]) / 1e6, 2)
      out.append(f"| `{algo}` | {','.join(r['seed'] for r in mine)} | "
                 + " | ".join(cells(mine)) + f" | {mb} | {truncated(sec, 2)} | {ratio} |")
    out.append("")
  return out
