"""The clustered catalogue's table: every clustered algorithm and FedAvg on three tasks with true clusters.

Tasks (their defaults unless said): `synthetic_clusters` (100 clients in 5 true
clusters, MCLR), `rotated_mnist` (IFCA's construction: 4 rotations, an MLP;
its test-only clients choose their model by their own test loss, IFCA's
protocol, named so in the table) and `fmnist_clusterwise_dir` (the WeCFL
paper's cluster-wise Dirichlet FMNIST, 10 true clusters, a BatchNorm CNN).
Every clustered algorithm is given the true number of clusters
(`--num_groups`; StoCFL takes none: it merges by its threshold); PACFL's beta
is 0 with that cap, so its merging stops at K clusters; FL+HC cuts its tree
into K. Algorithms whose local solver is their own (CFL-MGD's momentum,
FedEM's, FedRC's and StoCFL's plain SGD, FedSoft's Adam) run without the
task's client momentum. FedSoft's K (clients per cluster) is the round's
size over the clusters.

Scores, each client tested with the model it would use (never one chosen on
its test labels, except the rotated tasks' test-only clients above): the
final round's pooled test accuracy, the clients' data-weighted mean
(`test_accuracy_clientavg`), ARI and purity of the final clusters against the
true ones, the mean bytes a round moves (down + up) and the median seconds of
a round (training, no evaluation), on this machine's CPU.

  python benchmarks/clustered_catalogue.py --project            # time 4 rounds per cell
  python benchmarks/clustered_catalogue.py --tasks=synthetic_clusters --seeds=0,1,2
  python benchmarks/clustered_catalogue.py --table_only --record
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

from _sweep import (REPO_ROOT, SHARED, completed_summary, median_round_seconds,  # noqa: F401
                    registered_algorithms, run_one, save_recorded, truncated)
from tff_cluster.io import rundir  # (_sweep put the repository on sys.path)

TASKS = {
    "synthetic_clusters": dict(k=5, flags=[]),
    "rotated_mnist": dict(k=4, flags=[f"--data_dir={os.path.join(SHARED, 'mnist')}"]),
    "fmnist_clusterwise_dir": dict(k=10, flags=[
        f"--data_dir={os.path.join(SHARED, 'fashion_mnist')}"]),
}
ALGOS = ("fedavg", "ifca", "hypcluster", "cfl_mgd", "wecfl", "fesem", "cfl", "fedgroup",
         "fedgrouprox", "flhc", "pacfl", "fedem", "fedrc", "stocfl", "fedsoft")
OWN_SOLVER = ("cfl_mgd", "fedem", "fedrc", "stocfl", "fedsoft")
PROJECT_ROUNDS = 4
RECORD_KEY = ("algo", "task", "seed")
RECORD_FIELDS = RECORD_KEY + ("rounds", "accuracy", "accuracy_clientavg", "ari", "purity",
                              "bytes_per_round", "seconds_per_round", "note")


def flags_for(algo: str, task: str, clients_per_round: int) -> List[str]:
  k = TASKS[task]["k"]
  flags = [f"--algo={algo}", f"--task={task}", *TASKS[task]["flags"],
           "--checkpoint_every=10"]
  if algo not in ("fedavg", "stocfl"):
    flags.append(f"--num_groups={k}")
  if algo == "pacfl":
    flags.append("--pacfl_beta=0")
  if algo == "fedsoft":
    flags.append(f"--fedsoft_k={max(1, clients_per_round // k)}")
  if algo in OWN_SOLVER:
    flags.append("--client_momentum=0")
  return flags


def clients_per_round(task: str, override: Optional[int]) -> int:
  if override:
    return override
  from tff_cluster import tasks
  return int(tasks.get_task(task).defaults["clients_per_round"])


def score(directory: str) -> Optional[Dict[str, object]]:
  """The record of a finished run (None if it has not finished)."""
  summary = completed_summary(directory)
  if summary is None:
    return None
  _, rows = rundir.read_metrics(directory)
  last = rows[-1]
  moved = [float(r["bytes_down"]) + float(r["bytes_up"]) for r in rows]
  value = lambda key: "" if last.get(key) in (None, "") else float(last[key])  # noqa: E731
  return {"rounds": int(last["round"]), "accuracy": value("test_accuracy"),
          "accuracy_clientavg": value("test_accuracy_clientavg"), "ari": value("ari"),
          "purity": value("purity"), "bytes_per_round": int(np.mean(moved)),
          "seconds_per_round": truncated(median_round_seconds(directory), 3)}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--tasks", default=",".join(TASKS))
  p.add_argument("--algos", default=",".join(ALGOS))
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--rounds", type=int, default=None, help="the cut: rounds of every cell")
  p.add_argument("--clients_per_round", type=int, default=None,
                 help="the cut: clients per round of every cell")
  p.add_argument("--out", default=os.path.join(REPO_ROOT, "results", "clustered_catalogue"))
  p.add_argument("--project", action="store_true",
                 help="time 4 rounds of each (task, algorithm) and project the plan")
  p.add_argument("--table_only", action="store_true")
  p.add_argument("--record", action="store_true",
                 help="add the finished runs to benchmarks/recorded/clustered_catalogue.csv")
  args = p.parse_args(argv)
  for name, given, valid in (("task", args.tasks, TASKS), ("algo", args.algos, ALGOS)):
    bad = [x for x in given.split(",") if x not in valid]
    if bad:
      raise SystemExit(f"clustered_catalogue.py: error: unknown {name} {bad[0]!r}; valid: "
                       f"{', '.join(valid)}")
  missing = [a for a in args.algos.split(",") if a not in registered_algorithms()]
  if missing:
    raise SystemExit(f"clustered_catalogue.py: error: --algo={missing[0]} is not registered")
  jobs = [(a, t, int(s)) for t in args.tasks.split(",") for s in args.seeds.split(",")
          for a in args.algos.split(",")]
  extra = ([f"--rounds={args.rounds}"] if args.rounds else []) + (
      [f"--clients_per_round={args.clients_per_round}"] if args.clients_per_round else [])
  if args.project:
    return project(jobs, args, extra)
  t0 = time.perf_counter()
  records = []
  for algo, task, seed in jobs:
    d = os.path.join(args.out, task, algo, f"seed{seed}")
    if not args.table_only:
      run_one(flags_for(algo, task, clients_per_round(task, args.clients_per_round)) + extra,
              d, seed, "local", args.rounds)
    got = score(d)
    print(f"[{time.perf_counter() - t0:7.0f} s] {task} {algo} seed {seed}: {got}", flush=True)
    if got is not None:
      records.append({"algo": algo, "task": task, "seed": seed, "note": "", **got})
  if args.record and records:
    save_recorded("clustered_catalogue", records, RECORD_KEY, RECORD_FIELDS)


def project(jobs, args, extra):
  """Times `PROJECT_ROUNDS` rounds of each (task, algorithm) and projects the
  plan's CPU time: that run's wall time plus the rest at its median round."""
  total, seen = 0.0, {}
  for algo, task, _ in jobs:
    if (algo, task) not in seen:
      with tempfile.TemporaryDirectory() as tmp:
        flags = flags_for(algo, task, clients_per_round(task, args.clients_per_round))
        run = os.path.join(tmp, "run")
        s = run_one(flags + [f for f in extra if not f.startswith("--rounds=")]
                    + [f"--rounds={PROJECT_ROUNDS}"], run, 0, "local", PROJECT_ROUNDS)
        # The median round: the first one's compilation left out of the rate.
        per_round = median_round_seconds(run)
      from tff_cluster import tasks
      rounds = args.rounds or int(tasks.get_task(task).defaults["rounds"])
      seen[(algo, task)] = s["wall_seconds"] + (rounds - PROJECT_ROUNDS) * per_round
      print(f"{task} {algo}: {per_round:.2f} s/round -> {seen[(algo, task)] / 60:.1f} min "
            f"for {rounds} rounds", flush=True)
    total += seen[(algo, task)]
  print(f"projected total: {total / 3600:.2f} h for {len(jobs)} runs")


if __name__ == "__main__":
  main()
