"""What the tables over a grid of cells (algorithm x task x seed) share: their
command-line options, the run of every cell (two processes by `--shard`),
FedAvg's 1-point round that sets a task's rounds, and the projection of a
plan from a few timed rounds (the clustered catalogue, the personalized
baselines)."""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from _sweep import (REPO_ROOT, load_recorded, median_round_seconds, registered_algorithms,
                    run_one)
from tff_cluster.io import rundir  # (_sweep put the repository on sys.path)

PROJECT_ROUNDS = 4


def parser(description: str, tasks: Sequence[str], algos: Sequence[str],
           out: str) -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=description)
  p.add_argument("--tasks", default=",".join(tasks))
  p.add_argument("--algos", default=",".join(algos))
  p.add_argument("--seeds", default=None, help="override the cut's seeds")
  p.add_argument("--rounds", type=int, default=None, help="override the cut's rounds")
  p.add_argument("--clients_per_round", type=int, default=None,
                 help="override the cut's clients per round")
  p.add_argument("--out", default=os.path.join(REPO_ROOT, "results", out))
  p.add_argument("--project", action="store_true",
                 help=f"time {PROJECT_ROUNDS} rounds of each (task, algorithm) and project "
                      "the plan")
  p.add_argument("--converge", action="store_true",
                 help="run FedAvg (seed 0, the cut, the task's default rounds) and print "
                      "the round from which it stays within 1 point of its final accuracy")
  p.add_argument("--shard", default="0/1", help="i/n: run every n-th job from the i-th "
                 "(two processes on two cores)")
  p.add_argument("--table_only", action="store_true")
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


def jobs(tasks: Sequence[str], args, cut: Callable, left_out: Dict[str, Tuple[str, ...]]
         ) -> List[Tuple[str, str, int]]:
  """(algo, task, seed) of the plan: seed 0 of every task first, then the
  further seeds; the cut's left-out cells dropped."""
  seeds = sorted({s for t in tasks for s in cut(t, args)["seeds"]})
  return [(a, t, s) for s in seeds for t in tasks if s in cut(t, args)["seeds"]
          for a in args.algos.split(",") if a not in left_out.get(t, ())]


def run_cells(script: str, tasks: Sequence[str], args, cut: Callable, flags_for: Callable,
              eval_every: Callable[[str], int], score: Callable,
              left_out: Dict[str, Tuple[str, ...]],
              note: Callable[[str, str], Optional[str]] = lambda algo, task: None,
              record: Optional[Callable[[List[Dict[str, object]]], None]] = None,
              recorded: frozenset = frozenset()) -> List[Dict[str, object]]:
  """Runs this process's share of the cells (a finished run is reused, an
  interrupted one resumes; a failed cell does not stop the table) and
  returns the records of every finished cell. `record` gets each cell this
  process ran as soon as it finishes; a cell in `recorded` whose run directory
  is not here is not run (nor shared out)."""
  unset = [t for t in tasks if cut(t, args)["rounds"] is None]
  if unset:
    raise SystemExit(f"{script}: error: {unset[0]} has no rounds in its cut "
                     "yet: run --converge and write them into TASKS (or pass --rounds)")
  i, n = (int(x) for x in args.shard.split("/"))
  t0 = time.perf_counter()
  records = []
  plan = [job for job in jobs(tasks, args, cut, left_out)
          if job not in recorded or os.path.isdir(cell_dir(args, *job))]
  for j, (algo, task, seed) in enumerate(plan):
    c = cut(task, args)
    d = cell_dir(args, algo, task, seed)
    mine = not args.table_only and j % n == i
    if mine:
      try:
        run_one(flags_for(algo, task, c["clients_per_round"])
                + [f"--eval_every={eval_every(task)}"], d, seed, "local", c["rounds"])
      except RuntimeError as e:
        print(f"FAILED {task} {algo} seed {seed}: {e}", flush=True)
        continue
    got = score(d)
    print(f"[{time.perf_counter() - t0:7.0f} s] {task} {algo} seed {seed}: {got}", flush=True)
    if got is not None:
      extra = note(algo, task)
      records.append({"algo": algo, "task": task, "seed": seed,
                      **({} if extra is None else {"note": extra}), **got})
      if mine and record is not None:
        record(records[-1:])
  return records


def cell_dir(args, algo: str, task: str, seed: int) -> str:
  return os.path.join(args.out, task, algo, f"seed{seed}")


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


def converge(tasks: Sequence[str], args, cut: Callable, flags_for: Callable,
             extra: Sequence[str] = ()) -> None:
  """FedAvg at each task's default rounds under the cut: the round from which
  it stays within 1 point of its final accuracy, rounded up to 10."""
  from tff_cluster import tasks as registry
  for task in tasks:
    c = cut(task, args)
    rounds = int(registry.get_task(task).defaults["rounds"])
    d = os.path.join(args.out, "_fedavg_converge", task)
    run_one(flags_for("fedavg", task, c["clients_per_round"]) + list(extra), d, 0, "local",
            rounds)
    r = one_point_round(d)
    print(f"{task}: FedAvg within 1 point of its round-{rounds} accuracy from round {r} "
          f"-> rounds {min(rounds, -(-r // 10) * 10)}", flush=True)


def project(tasks: Sequence[str], args, cut: Callable, flags_for: Callable,
            left_out: Dict[str, Tuple[str, ...]]) -> None:
  """Times `PROJECT_ROUNDS` rounds of each (task, algorithm) and projects the
  plan's CPU time: that run's wall time plus the rest at its median round
  (the first round's compilation left out of the rate)."""
  from tff_cluster import tasks as registry
  total, runs = 0.0, 0
  for task in tasks:
    c = cut(task, args)
    rounds = c["rounds"] or int(registry.get_task(task).defaults["rounds"])
    for algo in args.algos.split(","):
      if algo in left_out.get(task, ()):
        continue
      with tempfile.TemporaryDirectory() as tmp:
        run = os.path.join(tmp, "run")
        s = run_one(flags_for(algo, task, c["clients_per_round"])
                    + [f"--rounds={PROJECT_ROUNDS}"], run, 0, "local", PROJECT_ROUNDS)
        per_round = median_round_seconds(run)
      if "wall_seconds" not in s:  # the divergence guard stopped it (exit 3)
        print(f"{task} {algo}: diverged at round {s.get('rounds_completed')} of "
              f"{PROJECT_ROUNDS}; counted at its rate for the whole run", flush=True)
        per_round = per_round if math.isfinite(per_round) else 0.0  # none completed
      one = s.get("wall_seconds", 0.0) + (rounds - PROJECT_ROUNDS) * per_round
      total += one * len(c["seeds"])
      runs += len(c["seeds"])
      print(f"{task} {algo}: {per_round:.2f} s/round -> {one / 60:.1f} min for {rounds} "
            f"rounds x {len(c['seeds'])} seeds", flush=True)
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
