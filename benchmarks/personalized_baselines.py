"""The personalized baselines' table: the ten personalized methods beside FedAvg, pFedMo and the best
clustered methods, each client tested with the model it would deploy.

Tasks: `mnist_workers` (pFedMo's MNIST, `--task_arg=split=label`, 20
workers, so that the spread over clients means something), the WeCFL paper's
`fmnist_clientwise_class` and `femnist` on the shared LEAF sample (51
writers). Scores (docs/outputs.md), the final round's (never a maximum over
rounds): the pooled test accuracy, the clients' data-weighted mean
(`test_accuracy_clientavg`), their unweighted mean
(`test_accuracy_client_mean`) and its spread (`_p10`, `_p50`, `_p90`); the
mean bytes a round moves and the median seconds of a round, on this
machine's CPU.

  python benchmarks/personalized_baselines.py --converge          # FedAvg's 1-point round per task
  python benchmarks/personalized_baselines.py --project           # time 4 rounds per cell
  python benchmarks/personalized_baselines.py --tasks=mnist_workers
  python benchmarks/personalized_baselines.py --table_only --record
Each run is `run_experiment.py` in its own directory under `--out` with
checkpoints; a finished run is reused and an interrupted one resumes.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Dict, List, Optional

import numpy as np

from _sweep import (REPO_ROOT, SHARED, completed_summary, load_recorded, mean_std,
                    median_round_seconds, registered_algorithms, run_one, save_markdown,
                    save_recorded, truncated)
import clustered_catalogue  # the 1-point round, shared
from tff_cluster.io import rundir  # (_sweep put the repository on sys.path)

# The cut: each task's flags, clients per round and seeds; its rounds are
# FedAvg's 1-point round (`--converge`, as in the clustered catalogue), written
# here before the table runs (None: not measured yet).
TASKS = {
    "mnist_workers": dict(flags=[f"--data_dir={os.path.join(SHARED, 'mnist')}",
                                 "--num_clients=20", "--task_arg=split=label"],
                          clients_per_round=20, seeds="0,1,2", rounds=None),
    "fmnist_clientwise_class": dict(flags=[
        f"--data_dir={os.path.join(SHARED, 'fashion_mnist')}"], clients_per_round=20,
        seeds="0,1,2", rounds=None),
    "femnist": dict(flags=[f"--data_dir={os.path.join(SHARED, 'femnist_leaf')}"],
                    clients_per_round=10, seeds="0,1,2", rounds=None),
}
PERSONALIZED = ("ditto", "fedrep", "fedper", "lg_fedavg", "fedbn", "apfl", "perfedavg",
                "pfedme", "local_only", "fedavg_ft")
# The clustered methods that led the clustered catalogue
# (docs/reproductions/clustered_catalogue.md), with the task's K below.
CLUSTERED = ("fedgroup", "hypcluster", "flhc")
ALGOS = ("fedavg", "pfedmo", *CLUSTERED, *PERSONALIZED)
NUM_GROUPS = {"mnist_workers": 4, "fmnist_clientwise_class": 5, "femnist": 5}
# Cells a model refuses (one line, by the CLI): FedBN keeps BatchNorm layers
# local, and LeNet-5 and the FEMNIST MLP have none.
LEFT_OUT = {"mnist_workers": ("fedbn",), "femnist": ("fedbn",)}
EVAL_EVERY = 5
PROJECT_ROUNDS = 4
RECORD_KEY = ("algo", "task", "seed")
SCORES = ("accuracy", "accuracy_clientavg", "accuracy_client_mean", "accuracy_p10",
          "accuracy_p50", "accuracy_p90")
RECORD_FIELDS = RECORD_KEY + ("rounds", *SCORES, "bytes_per_round", "seconds_per_round")


def flags_for(algo: str, task: str, cpr: int) -> List[str]:
  flags = [f"--algo={algo}", f"--task={task}", *TASKS[task]["flags"],
           f"--clients_per_round={cpr}", "--checkpoint_every=10"]
  if algo in CLUSTERED:
    flags.append(f"--num_groups={NUM_GROUPS[task]}")
  return flags


def cut(task: str, args) -> Dict[str, object]:
  c = TASKS[task]
  return {"clients_per_round": args.clients_per_round or c["clients_per_round"],
          "seeds": [int(x) for x in (args.seeds or c["seeds"]).split(",")],
          "rounds": args.rounds or c["rounds"]}


def score(directory: str) -> Optional[Dict[str, object]]:
  """The record of a finished run (None if it has not finished)."""
  if completed_summary(directory) is None:
    return None
  _, rows = rundir.read_metrics(directory)
  last = rows[-1]
  moved = [float(r["bytes_down"]) + float(r["bytes_up"]) for r in rows]
  value = lambda key: "" if last.get(key) in (None, "") else float(last[key])  # noqa: E731
  return {"rounds": int(last["round"]),
          **{s: value(s.replace("accuracy", "test_accuracy", 1)) for s in SCORES},
          "bytes_per_round": int(np.mean(moved)),
          "seconds_per_round": truncated(median_round_seconds(directory), 3)}


def jobs(tasks, args):
  seeds = sorted({s for t in tasks for s in cut(t, args)["seeds"]})
  return [(a, t, s) for s in seeds for t in tasks if s in cut(t, args)["seeds"]
          for a in args.algos.split(",") if a not in LEFT_OUT.get(t, ())]


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--tasks", default=",".join(TASKS))
  p.add_argument("--algos", default=",".join(ALGOS))
  p.add_argument("--seeds", default=None, help="override the cut's seeds")
  p.add_argument("--rounds", type=int, default=None, help="override the cut's rounds")
  p.add_argument("--clients_per_round", type=int, default=None)
  p.add_argument("--out", default=os.path.join(REPO_ROOT, "results", "personalized_baselines"))
  p.add_argument("--project", action="store_true", help="time 4 rounds of each cell")
  p.add_argument("--converge", action="store_true",
                 help="FedAvg at the task's default rounds: its 1-point round")
  p.add_argument("--shard", default="0/1", help="i/n: every n-th job from the i-th")
  p.add_argument("--table_only", action="store_true")
  p.add_argument("--markdown", default=None, metavar="STEM")
  p.add_argument("--record", action="store_true")
  args = p.parse_args(argv)
  for name, given, valid in (("task", args.tasks, TASKS), ("algo", args.algos, ALGOS)):
    bad = [x for x in given.split(",") if x not in valid]
    if bad:
      raise SystemExit(f"personalized_baselines.py: error: unknown {name} {bad[0]!r}; valid: "
                       f"{', '.join(valid)}")
  missing = [a for a in args.algos.split(",") if a not in registered_algorithms()]
  if missing:
    raise SystemExit(f"personalized_baselines.py: error: --algo={missing[0]} is not registered")
  tasks = args.tasks.split(",")
  if args.markdown:
    return save_markdown(args.markdown, markdown())
  if args.converge:
    return converge(tasks, args)
  if args.project:
    return project(tasks, args)
  unset = [t for t in tasks if cut(t, args)["rounds"] is None]
  if unset:
    raise SystemExit(f"personalized_baselines.py: error: {unset[0]} has no rounds in its cut "
                     "yet: run --converge and write them into TASKS (or pass --rounds)")
  i, n = (int(x) for x in args.shard.split("/"))
  t0 = time.perf_counter()
  records = []
  for j, (algo, task, seed) in enumerate(jobs(tasks, args)):
    c = cut(task, args)
    d = os.path.join(args.out, task, algo, f"seed{seed}")
    if not args.table_only and j % n == i:
      try:
        run_one(flags_for(algo, task, c["clients_per_round"]) + [f"--eval_every={EVAL_EVERY}"],
                d, seed, "local", c["rounds"])
      except RuntimeError as e:  # one failed cell does not stop the table
        print(f"FAILED {task} {algo} seed {seed}: {e}", flush=True)
        continue
    got = score(d)
    print(f"[{time.perf_counter() - t0:7.0f} s] {task} {algo} seed {seed}: {got}", flush=True)
    if got is not None:
      records.append({"algo": algo, "task": task, "seed": seed, **got})
  if args.record and records:
    save_recorded("personalized_baselines", records, RECORD_KEY, RECORD_FIELDS)


def markdown() -> str:
  """The recorded table, one block per task: mean ± std over the recorded
  seeds (percent), MB a round, the median seconds of a round beside FedAvg's."""
  rows = load_recorded("personalized_baselines")
  num = lambda r, k: None if r.get(k) in (None, "") else float(r[k])  # noqa: E731
  out = []
  for task in TASKS:
    got = [r for r in rows if r["task"] == task]
    if not got:
      continue
    base = [num(r, "seconds_per_round") for r in got if r["algo"] == "fedavg"]
    base_s = float(np.median(base)) if base else None
    out += [f"**{task}** ({got[0]['rounds']} rounds, {TASKS[task]['clients_per_round']} "
            "clients a round)", "",
            "| `--algo` | seeds | accuracy % | client-avg % | client mean % | p10 % | p50 % | "
            "p90 % | MB/round | s/round | × FedAvg |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for algo in ALGOS:
      mine = [r for r in got if r["algo"] == algo]
      if not mine:
        continue
      sec = float(np.median([num(r, "seconds_per_round") for r in mine]))
      ratio = truncated(sec / base_s, 1) if base_s else "–"
      cells = " | ".join(mean_std([num(r, s) for r in mine]) for s in SCORES)
      out.append(f"| `{algo}` | {','.join(r['seed'] for r in mine)} | {cells} "
                 f"| {truncated(np.mean([num(r, 'bytes_per_round') for r in mine]) / 1e6, 2)} "
                 f"| {truncated(sec, 2)} | {ratio} |")
    out.append("")
  return "\n".join(out)


def converge(tasks, args):
  from tff_cluster import tasks as registry
  for task in tasks:
    c = cut(task, args)
    rounds = int(registry.get_task(task).defaults["rounds"])
    d = os.path.join(args.out, "_fedavg_converge", task)
    run_one(flags_for("fedavg", task, c["clients_per_round"]) + [f"--eval_every={EVAL_EVERY}"],
            d, 0, "local", rounds)
    r = clustered_catalogue.one_point_round(d)
    print(f"{task}: FedAvg within 1 point of its round-{rounds} accuracy from round {r} "
          f"-> rounds {min(rounds, -(-r // 10) * 10)}", flush=True)


def project(tasks, args):
  """Times `PROJECT_ROUNDS` rounds of each cell and projects the plan's CPU
  time: that run's wall time plus the rest at its median round."""
  from tff_cluster import tasks as registry
  total, runs = 0.0, 0
  for task in tasks:
    c = cut(task, args)
    rounds = c["rounds"] or int(registry.get_task(task).defaults["rounds"])
    for algo in args.algos.split(","):
      if algo in LEFT_OUT.get(task, ()):
        continue
      with tempfile.TemporaryDirectory() as tmp:
        run = os.path.join(tmp, "run")
        s = run_one(flags_for(algo, task, c["clients_per_round"])
                    + [f"--rounds={PROJECT_ROUNDS}"], run, 0, "local", PROJECT_ROUNDS)
        per_round = median_round_seconds(run)
      one = s["wall_seconds"] + (rounds - PROJECT_ROUNDS) * per_round
      total += one * len(c["seeds"])
      runs += len(c["seeds"])
      print(f"{task} {algo}: {per_round:.2f} s/round -> {one / 60:.1f} min for {rounds} "
            f"rounds x {len(c['seeds'])} seeds", flush=True)
  print(f"projected total: {total / 3600:.2f} h for {runs} runs (training; evaluation "
        f"not included)")


if __name__ == "__main__":
  main()
