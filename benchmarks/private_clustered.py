"""Private clustered FL: FedAvg, IFCA and HypCluster under DP-FedAvg's mechanism
at epsilon = inf, 8 and 2, beside their non-private rows (docs/reproductions/private_clustered.md).

The cells are the sweep file benchmarks/sweeps/private_clustered.toml (the
clustered catalogue's cut of `synthetic_clusters`, seeds 0-2, and
`rotated_mnist`, seed 0, with `--aggregator=dp_fixed --clip=0.5`); this script
runs them with `tff_cluster.sweep` into `--out` (each run in
OUT/TASK/METHOD/seedS), then writes the table from the finished runs and the
recorded ones (benchmarks/recorded/private_clustered.csv; `--record` adds the
runs on disk). The non-private rows are the clustered catalogue's recorded
runs of the same cut (benchmarks/recorded/clustered_catalogue.csv).

  python benchmarks/private_clustered.py --parallel=2 --record
  python benchmarks/private_clustered.py --table_only
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List

from _sweep import (REPO_ROOT, completed_summary, load_recorded, mean_std,
                    median_round_seconds, save_markdown, save_recorded, truncated)

NAME = "private_clustered"
SWEEP = os.path.join(REPO_ROOT, "benchmarks", "sweeps", NAME + ".toml")
ALGOS = ("fedavg", "ifca", "hypcluster")
BUDGETS = ("inf", "8", "2")  # the methods' suffixes: dp_inf, dp_8, dp_2
TASKS = {"synthetic_clusters": (0, 1, 2), "rotated_mnist": (0,)}
RECORD_KEY = ("task", "algo", "epsilon", "seed")
RECORD_FIELDS = (*RECORD_KEY, "rounds", "accuracy", "ari", "purity", "dp_epsilon", "dp_delta",
                 "noise_multiplier", "seconds_per_round", "recorded")


def _runs(out: str) -> List[Dict[str, object]]:
  """The finished runs under `out`, one row each."""
  rows = []
  for task, seeds in TASKS.items():
    for algo in ALGOS:
      for budget in BUDGETS:
        for seed in seeds:
          directory = os.path.join(out, task, f"{algo}_dp_{budget}", f"seed{seed}")
          summary = completed_summary(directory)
          if summary is None:
            continue
          rows.append(dict(
              task=task, algo=algo, epsilon=budget, seed=seed, rounds=summary["rounds"],
              accuracy=summary["final_test_accuracy"], ari=summary.get("ari", ""),
              purity=summary.get("purity", ""),
              dp_epsilon="inf" if summary.get("dp_epsilon") is None else summary["dp_epsilon"],
              dp_delta=summary["dp_delta"], noise_multiplier=summary["dp_noise_multiplier"],
              seconds_per_round=truncated(median_round_seconds(directory), 3),
              recorded=time.strftime("%Y-%m-%d")))
  return rows


def _value(row, key):
  return None if row.get(key) in ("", None) else float(row[key])


def table(rows) -> str:
  """The markdown table: per task, a row per algorithm and budget (the
  catalogue's non-private rows first), mean ± sample std over the seeds."""
  catalogue = [r for r in load_recorded("clustered_catalogue")
               if r["algo"] in ALGOS and r["task"] in TASKS
               and int(r["seed"]) in TASKS[r["task"]]]
  lines = []
  for task, seeds in TASKS.items():
    lines += [f"**{task}** (seeds {', '.join(map(str, seeds))})", "",
              "| algorithm | ε | z | accuracy (%) | ARI | s / round |",
              "|---|---|---|---|---|---|"]
    for algo in ALGOS:
      mine = [r for r in catalogue if r["task"] == task and r["algo"] == algo]
      lines.append(_line(algo, "non-private", "–", mine, "seconds_per_round"))
      for budget in BUDGETS:
        cell = [r for r in rows if r["task"] == task and r["algo"] == algo
                and str(r["epsilon"]) == budget]
        z = sorted({truncated(float(r["noise_multiplier"]), 2) for r in cell}) or ["–"]
        lines.append(_line(algo, "∞" if budget == "inf" else budget, ", ".join(z), cell,
                           "seconds_per_round"))
    lines.append("")
  return "\n".join(lines)


def _line(algo, epsilon, z, cell, seconds_key) -> str:
  """A table row: accuracy in percent and ARI as mean ± sample std over the
  seeds, the median of the runs' seconds a round (cut, never rounded up)."""
  accuracy = mean_std([_value(r, "accuracy") for r in cell])
  ari = "–" if algo == "fedavg" else _plain_mean_std([_value(r, "ari") for r in cell])
  seconds = sorted(s for s in (_value(r, seconds_key) for r in cell) if s is not None)
  median = truncated(seconds[len(seconds) // 2], 3) if seconds else "–"
  return f"| {algo} | {epsilon} | {z} | {accuracy} | {ari} | {median} |"


def _plain_mean_std(values) -> str:
  values = [v for v in values if v is not None]
  if not values:
    return "–"
  if len(values) == 1:
    return truncated(values[0], 3)
  return f"{truncated(statistics.mean(values), 3)} ± {truncated(statistics.stdev(values), 3)}"


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", default=os.path.join(REPO_ROOT, "results", NAME))
  p.add_argument("--parallel", type=int, default=1)
  p.add_argument("--table", default=os.path.join(REPO_ROOT, "benchmarks", "results", NAME))
  p.add_argument("--dry_run", action="store_true", help="list the cells and stop")
  p.add_argument("--table_only", action="store_true", help="no runs: the table only")
  p.add_argument("--record", action="store_true",
                 help="add the finished runs under --out to benchmarks/recorded/")
  args = p.parse_args(argv)
  if not args.table_only:
    command = [sys.executable, "-m", "tff_cluster.sweep", SWEEP, f"--out={args.out}",
               f"--parallel={args.parallel}", *(["--dry_run"] if args.dry_run else [])]
    code = subprocess.call(command, cwd=REPO_ROOT)
    if args.dry_run or code not in (0, 1):
      return code
  on_disk = _runs(args.out)
  if args.record and on_disk:
    save_recorded(NAME, on_disk, RECORD_KEY, RECORD_FIELDS)
  rows = {tuple(str(r[k]) for k in RECORD_KEY): r for r in load_recorded(NAME)}
  rows.update({tuple(str(r[k]) for k in RECORD_KEY): r for r in on_disk})
  text = table(list(rows.values()))
  save_markdown(args.table, text)
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
