"""Reproduces the WeCFL paper's Table 2 (cluster-wise non-IID FMNIST) beside the paper.

The paper's setting, which is the default of the `fmnist_clusterwise_*` tasks:
200 clients (10 true clusters x 20), all of them every round, 10 local steps of
SGD (lr 0.001, momentum 0.9 kept by each client, batch 32), 100 rounds. Each run
is `run_experiment.py` in its own process and directory under `--out` (a
finished run is reused, so an interrupted table resumes).

Score: the mean over rounds 98-100 of `test_accuracy_clientavg` (the paper's
accuracy, a data-weighted mean of the clients' accuracies) and `test_macro_f1`;
FedAvg+ / FedProx+ are scored once, at the end (their ensemble is formed from
the final models). Ours: mean ± std (%) over the seeds run. Every method is
scored on the same clients, all 200, each tested with the model it holds: its
cluster's (WeCFL, FeSEM), the cluster its training loss chose (IFCA), the one
model (FedAvg, FedProx) or the ensemble. A run the divergence guard stopped
is shown as "diverged at round r (k/n seeds)".

Methods (flags beyond the task's defaults; each row at its K a method of the
sweep file, ROW_K<K>):
  FedAvg, FedProx       one global model (the paper's K = 1 rows; mu 0.95),
                        --client_weighting=samples (FedBase weights clients by
                        their data, not by the examples of the round's 10 steps);
  FedAvg+, FedProx+     --ensemble_size=K independent runs, logits averaged,
                        weighted as FedAvg;
  IFCA                  --ifca_loss_batches=3 --ifca_agg=samples
                        --client_state=reset --ifca_eval=assigned (the FedBase
                        code behind the paper's IFCA rows: loss on 3 batches,
                        data-size-weighted averaging, a fresh momentum
                        optimizer every round, each client tested with the
                        cluster its training loss chose). The paper's IFCA
                        numbers come from code whose cluster models alias one
                        object (all clients train one model), so they are
                        shown for reference only;
  IFCA (test loss)      --client_state=persist --ifca_eval=test_loss: the
                        rows recorded before that protocol (momentum kept,
                        each client tested with the model of lowest loss on
                        its own test data); in no phase: the table shows
                        them from the recorded scores (their cells: the sweep
                        file wecfl_table2_ifca_test_loss.toml);
  FeSEM                 --fesem_center=data (the code behind the paper's rows);
  WeCFL                 defaults.
The cells are the sweep file benchmarks/sweeps/wecfl_table2.toml (settings
`dir` and `class`, a method per row and K); this script runs them with
`tff_cluster.sweep` into `--out` (a sweep's folder: each run in
OUT/SETTING/ROW_K<K>/seedS; a finished run is reused, an interrupted one
resumes), phase by phase (`--phases`, default all; the issue's order):
  1. K = 10, alpha = (0.1, 10): WeCFL, FeSEM, IFCA, FedAvg, seeds `--seeds`
     (seed-major: every method's seed 0 first);
  2. K = 10, (3, 2)-class: the same methods, 1 seed;
  3. K = 5, alpha = (0.1, 10): FeSEM, WeCFL, IFCA, 1 seed;
  4. FedAvg+ and FedProx+ (K = 10, alpha = (0.1, 10)) and FedProx, 1 seed.
Runner: local, jit auto (off for this BatchNorm CNN; the runner speed
benchmark: the local runner's CNN round is as fast as the tff runner's).

  python benchmarks/wecfl_table2.py --phases=1 --seeds=0,1,2
  python benchmarks/wecfl_table2.py --phases=1 --seeds=1,2 --methods=FeSEM,IFCA
  python benchmarks/wecfl_table2.py --dry_run      # list the cells and their flags
  python benchmarks/wecfl_table2.py --project      # time 2 rounds of each method
  python benchmarks/wecfl_table2.py --table_only   # the table from finished runs
  python -m tff_cluster.sweep benchmarks/sweeps/wecfl_table2.toml
                              # every phase's cells, no table (from the repository root)
"""

from __future__ import annotations

import argparse
import copy
import csv
import os
import re
import tempfile
import time
from typing import Dict, Optional, Sequence

import numpy as np

import _cells
from _sweep import (REPO_ROOT, completed_summary, diverged_cell, diverged_summary,
                    load_recorded, mean_std, measured, median_round_seconds,
                    registered_algorithms, run_one, save_markdown, save_recorded, truncated)
from tff_cluster.io import rundir  # (_sweep put the repository on sys.path)

NAME = "wecfl_table2"  # benchmarks/sweeps/NAME.toml, benchmarks/recorded/NAME.csv
SCRIPT = "wecfl_table2.py"
# The cells: benchmarks/sweeps/wecfl_table2.toml (the phases' rows) and
# wecfl_table2_ifca_test_loss.toml (the recorded "IFCA (test loss)" rows).
PART = _cells.part(NAME)
TEST_LOSS = _cells.part(f"{NAME}_ifca_test_loss")

# The WeCFL paper's Table 2, FMNIST columns: (accuracy, macro-F1) in %.
PAPER = {
    ("dir", 1, "FedAvg"): (86.08, 57.24), ("class", 1, "FedAvg"): (86.33, 46.09),
    ("dir", 1, "FedProx"): (86.32, 58.03), ("class", 1, "FedProx"): (86.42, 45.86),
    ("dir", 5, "FedAvg+"): (87.61, 59.48), ("class", 5, "FedAvg+"): (86.95, 65.61),
    ("dir", 5, "FedProx+"): (87.94, 59.83), ("class", 5, "FedProx+"): (86.52, 65.73),
    ("dir", 5, "IFCA"): (84.60, 62.03), ("class", 5, "IFCA"): (84.94, 66.50),
    ("dir", 5, "FeSEM"): (94.64, 82.90), ("class", 5, "FeSEM"): (94.20, 77.07),
    ("dir", 5, "WeCFL"): (94.64, 84.4), ("class", 5, "WeCFL"): (94.97, 77.36),
    ("dir", 10, "FedAvg+"): (89.42, 67.83), ("class", 10, "FedAvg+"): (86.91, 63.01),
    ("dir", 10, "FedProx+"): (89.55, 68.02), ("class", 10, "FedProx+"): (86.73, 63.42),
    ("dir", 10, "IFCA"): (82.10, 62.62), ("class", 10, "IFCA"): (86.58, 66.22),
    ("dir", 10, "FeSEM"): (95.73, 89.34), ("class", 10, "FeSEM"): (95.54, 84.43),
    ("dir", 10, "WeCFL"): (95.88, 89.81), ("class", 10, "WeCFL"): (97.10, 88.96),
}
# Setting -> its task (the sweep file's settings).
TASKS = {name: setting["task"] for name, setting in PART.data["settings"].items()}
SETTING = {"dir": "α=(0.1,10)", "class": "(3,2)-class"}
# Row -> its algorithm (its flags: the sweep files' methods ROW_K<K>).
METHODS = {"FedAvg": "fedavg", "FedProx": "fedprox", "FedAvg+": "fedavg_plus",
           "FedProx+": "fedprox_plus", "IFCA": "ifca", "IFCA (test loss)": "ifca",
           "FeSEM": "fesem", "WeCFL": "wecfl"}
# Each row's settings beyond the tasks' defaults, in words (the table's label).
LABELS = {
    "FedAvg": "data-size weights",
    "FedProx": "mu 0.95, data-size weights",
    "FedAvg+": "K runs, logits averaged",
    "FedProx+": "K runs, mu 0.95, logits averaged",
    "IFCA": "loss on 3 batches, data-size weights, momentum reset each round, "
            "tested with its assigned cluster",
    "IFCA (test loss)": "loss on 3 batches, data-size weights, momentum kept across rounds, "
                        "each client tested with the model of lowest loss on its own test "
                        "data (not the other rows' protocol)",
    "FeSEM": "uniform K-Means weights, data-weighted centres",
    "WeCFL": "data-weighted K-Means and centres",
}
ENSEMBLES = ("FedAvg+", "FedProx+")
LAST_ROUNDS = (98, 99, 100)


def method_name(method: str, k: int) -> str:
  """The sweep files' method (and folder) of a row at K: ROW_K<K>, the row's
  name with other characters than letters, digits and + as _."""
  return f"{re.sub(r'[^A-Za-z0-9+]+', '_', method).strip('_')}_K{k}"


# The sweep files' methods -> (row, K).
ROWS = {method_name(m, k): (m, k) for m in METHODS for k in (1, 5, 10)}
# Phase -> (its setting, its methods in running order); phase 1 runs every
# seed given, the others the first.
PHASES = {
    1: ("dir", ["WeCFL_K10", "FeSEM_K10", "IFCA_K10", "FedAvg_K1"]),
    2: ("class", ["FedAvg_K1", "FeSEM_K10", "WeCFL_K10", "IFCA_K10"]),
    3: ("dir", ["FeSEM_K5", "WeCFL_K5", "IFCA_K5"]),
    4: ("dir", ["FedAvg+_K10", "FedProx+_K10", "FedProx_K1"]),
}


def phases(seeds: Sequence[int], methods: Sequence[str] = tuple(METHODS),
           rounds: Optional[int] = None, data_dir: Optional[str] = None) -> Dict[int, dict]:
  """Phase -> the sweep file's keys narrowed to its setting and its rows among
  `methods` (in running order), its seeds (phase 1: `seeds`, the others the
  first), `rounds` and `data_dir` where given; phases with no row left out."""
  out = {}
  for phase, (setting, names) in PHASES.items():
    data = copy.deepcopy(PART.data)
    data["tasks"] = [setting]
    data["algos"] = [n for n in names if ROWS[n][0] in methods]
    if not data["algos"]:
      continue
    data["seeds"] = list(seeds if phase == 1 else seeds[:1])
    for w in data.get("when", []):
      w.pop("seeds", None)
    if rounds is not None:
      data = _cells.override(data, "rounds", rounds)
    if data_dir is not None:
      data = _cells.override(data, "data_dir", os.path.abspath(data_dir))
    out[phase] = data
  return out


def run_dir(out: str, setting: str, k: int, method: str, seed: int) -> str:
  """The run of `method` at K in `setting` (its cell's folder under `out`)."""
  return os.path.join(out, setting, method_name(method, k), f"seed{seed}")


def score(directory: str, method: str) -> Optional[tuple]:
  """(accuracy, macro-F1, largest loss ratio, None) of a finished run: the
  mean of rounds 98-100 (the last round for an ensemble); (None, None, None,
  round) for a run the divergence guard stopped; None if the run has not
  finished (a run in progress has no last round yet) or those rounds are
  missing."""
  stopped = diverged_summary(directory)
  if stopped is not None:
    return None, None, None, int(stopped["diverged_round"])
  summary = completed_summary(directory)
  if summary is None:
    return None
  try:
    rows = {int(r["round"]): r for r in rundir.read_metrics(directory)[1]}
  except rundir.RunDirError:
    return None
  if not rows:
    return None
  wanted = (max(rows),) if method in ENSEMBLES else LAST_ROUNDS
  if any(r not in rows for r in wanted):
    return None
  acc = np.mean([float(rows[r]["test_accuracy_clientavg"]) for r in wanted])
  f1 = np.mean([float(rows[r]["test_macro_f1"]) for r in wanted])
  return float(acc), float(f1), summary.get("max_loss_ratio"), None


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--phases", default="1,2,3,4")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--methods", default=",".join(METHODS),
                 help="only these methods of the phases (comma-separated)")
  p.add_argument("--rounds", type=int, default=None,
                 help="override the 100 rounds (the score then needs rounds 98-100)")
  p.add_argument("--data_dir", default=None,
                 help="FMNIST's folder (default: the sweep file's, ../shared/data/fashion_mnist)")
  p.add_argument("--out", default=os.path.join(REPO_ROOT, "results", NAME),
                 help="the sweep's folder (runs in OUT/SETTING/ROW_K<K>/seedS)")
  p.add_argument("--table", default=os.path.join(REPO_ROOT, "benchmarks", "results", NAME))
  p.add_argument("--project", action="store_true",
                 help="time 2 rounds of each method instead and project the total")
  p.add_argument("--dry_run", action="store_true",
                 help="list each cell's folder and flags (as the sweep runs it) and stop")
  p.add_argument("--table_only", action="store_true",
                 help="write the table from the finished runs under --out")
  p.add_argument("--record", action="store_true",
                 help="add the finished runs under --out to benchmarks/recorded/"
                      "wecfl_table2.csv, which the table always includes")
  args = p.parse_args(argv)
  seeds = [int(s) for s in args.seeds.split(",")]
  wanted = [int(x) for x in args.phases.split(",")]
  bad = [x for x in wanted if x not in PHASES]
  if bad:
    raise SystemExit(f"{SCRIPT}: error: unknown phase {bad[0]}; valid: 1, 2, 3, 4")
  methods = args.methods.split(",")
  unknown = [m for m in methods if m not in METHODS]
  if unknown:
    raise SystemExit(f"{SCRIPT}: error: unknown method {unknown[0]!r}; valid: "
                     f"{', '.join(METHODS)}")
  available = registered_algorithms()
  for m in [m for m in methods if METHODS[m] not in available]:
    print(f"({m}: --algo={METHODS[m]} is not registered; left out)")
  methods = [m for m in methods if METHODS[m] in available]
  plan = phases(seeds, methods, args.rounds, args.data_dir)
  sweeps = [_cells.load(SCRIPT, plan[x], NAME) for x in wanted if x in plan]
  if args.project:
    return project([c for s in sweeps for c in s.cells], args)
  t0 = time.perf_counter()

  def done(cell):
    method, k = ROWS[cell.method]
    got = score(os.path.join(args.out, cell.path), method)
    print(f"[{time.perf_counter() - t0:7.0f} s] {SETTING[cell.setting]} K={k} {method} "
          f"seed {cell.seed}: {got}", flush=True)
    write_table(args)

  if not args.table_only:
    for the_sweep in sweeps:
      _cells.run_sweep(SCRIPT, the_sweep, args.out, args, done)
  if not args.dry_run:
    write_table(args)


def project(cells, args):
  """Times 2 rounds of each (setting, K, method) and projects the plan."""
  total, seen = 0.0, {}
  for cell in cells:
    key = (cell.setting, cell.method)
    if key not in seen:
      method, k = ROWS[cell.method]
      with tempfile.TemporaryDirectory() as tmp:
        s = run_one(_cells.cell_flags(cell), os.path.join(tmp, "run"), cell.seed, "local", 2)
      per_round = (s["total_seconds"] - s["setup_seconds"]) / 2
      rounds = args.rounds or 100
      seen[key] = s["wall_seconds"] + (rounds - 2) * per_round
      print(f"{SETTING[cell.setting]} K={k} {method}: {per_round:.2f} s/round -> "
            f"{seen[key] / 60:.1f} min for {rounds} rounds", flush=True)
    total += seen[key]
  print(f"projected total: {total / 3600:.2f} h for {len(cells)} runs")


RECORD_KEY = ("setting", "K", "method", "seed")
RECORD_FIELDS = RECORD_KEY + ("accuracy", "macro_f1", "seconds_per_round", "max_loss_ratio",
                              "diverged_round", "recorded", "note")


def _float(text):
  return float(text) if text not in (None, "") else None


def write_table(args):
  """The table of every finished run under `--out`, plus the runs recorded in
  `benchmarks/recorded/wecfl_table2.csv` (a run on disk takes precedence);
  `--record` adds the runs on disk to that file."""
  found: Dict[tuple, Dict[int, tuple]] = {}
  secs: Dict[tuple, Dict[int, float]] = {}
  for r in load_recorded("wecfl_table2"):
    key, seed = (r["setting"], int(r["K"]), r["method"]), int(r["seed"])
    diverged = _float(r.get("diverged_round"))
    found.setdefault(key, {})[seed] = (_float(r["accuracy"]), _float(r["macro_f1"]),
                                       _float(r.get("max_loss_ratio")),
                                       None if diverged is None else int(diverged))
    secs.setdefault(key, {})[seed] = measured(r["seconds_per_round"])
  on_disk = []
  for setting in TASKS:
    for k in (1, 5, 10):
      for method in METHODS:
        base = os.path.dirname(run_dir(args.out, setting, k, method, 0))
        if not os.path.isdir(base):
          continue
        for name in sorted(os.listdir(base)):
          d = os.path.join(base, name)
          got = score(d, method)
          if got is not None and name.startswith("seed"):
            seed = int(name[4:])
            found.setdefault((setting, k, method), {})[seed] = got
            secs.setdefault((setting, k, method), {})[seed] = median_round_seconds(d)
            acc, f1, ratio, diverged = got
            on_disk.append(dict(
                setting=setting, K=k, method=method, seed=seed,
                accuracy="" if acc is None else f"{acc:.6f}",
                macro_f1="" if f1 is None else f"{f1:.6f}",
                seconds_per_round=truncated(secs[(setting, k, method)][seed], 2),
                max_loss_ratio="" if ratio is None else f"{ratio:.4g}",
                diverged_round="" if diverged is None else diverged,
                recorded=time.strftime("%Y-%m-%d"), note=""))
  if getattr(args, "record", False) and on_disk:
    save_recorded("wecfl_table2", on_disk, RECORD_KEY, RECORD_FIELDS)
  lines = ["The WeCFL paper's Table 2 (FMNIST, cluster-wise non-IID): accuracy / macro-F1 "
           "(%), mean of rounds 98-100 (FedAvg+/FedProx+: the final round); ours: "
           "mean ± std over the seeds listed, local runner, 100 rounds, the tasks' "
           "defaults (200 clients, all per round, 10 steps, lr 0.001, momentum 0.9 "
           "persisted, batch 32). Paper IFCA rows: reference only (aliasing bug in "
           "the code behind them).", "",
           "| setting | K | method | settings | seeds | ours acc | ours F1 | paper acc | "
           "paper F1 | s/round (median) | max loss ratio |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  csv_rows = []
  order = list(METHODS)
  for (setting, k, method) in sorted(found, key=lambda t: (list(TASKS).index(t[0]), -t[1],
                                                             order.index(t[2]))):
    runs = found[(setting, k, method)]
    s = sorted(runs)
    acc = [runs[x][0] for x in s]
    f1 = [runs[x][1] for x in s]
    stopped = [runs[x][3] for x in s if runs[x][3] is not None]
    ratios = [runs[x][2] for x in s if runs[x][2] is not None]
    acc_cell = diverged_cell(stopped, len(s)) if stopped else mean_std(acc)
    f1_cell = "–" if stopped else mean_std(f1)
    paper = PAPER.get((setting, k, "IFCA" if method.startswith("IFCA") else method))
    pa, pf = ("–", "–") if paper is None else paper
    if method.startswith("IFCA") and paper is not None:
      pa, pf = f"({pa})", f"({pf})"
    lines.append(f"| {SETTING[setting]} | {k} | {method} | {LABELS[method]} | "
                 f"{','.join(map(str, s))} | {acc_cell} | {f1_cell} | {pa} | {pf} | "
                 f"{truncated(np.nanmedian(list(secs[(setting, k, method)].values())), 1)} | "
                 f"{f'{max(ratios):.3g}' if ratios else '–'} |")
    for seed in s:
      csv_rows.append(dict(setting=SETTING[setting], K=k, method=method, seed=seed,
                           accuracy=runs[seed][0], macro_f1=runs[seed][1],
                           paper_accuracy=None if paper is None else paper[0] / 100,
                           paper_macro_f1=None if paper is None else paper[1] / 100))
  save_markdown(args.table, "\n".join(lines))
  with open(args.table + ".csv", "w", newline="") as f:
    writer = csv.DictWriter(f, ["setting", "K", "method", "seed", "accuracy", "macro_f1",
                                "paper_accuracy", "paper_macro_f1"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(csv_rows)
  print("\n".join(lines))


if __name__ == "__main__":
  main()
