"""Reproduces the pFedMo paper's Table 2 (MNIST columns) and its label-skew study.

Setting (`mnist_workers`, the paper's §5.1): N = 4 workers, all of them at
every aggregation, eta = 0.01, batch 64, gamma = 0.5, T = 1,000 local
iterations: LeNet-5 with tau = 40 (25 aggregations), logistic regression with
tau = 20 (50). Table 2: IID workers ("randomly shuffled and distributed"),
pi = 1. Label skew (its Fig. 4): 3 classes per worker, LeNet-5, tau = 40,
pi = 0.5. The server's public set: 6,000 training images (the task's default),
disjoint from the workers'; the scoring batch: 64 test images, fixed.

Methods: pFedMo with eq. 12 as printed (`eq12`, the rule the paper's Theorem 2
bounds) and the project's variant `mix` (after the paper's prose), FedNAG,
FedMom, SlowMo, Mime and MimeLite with the base optimizer the Mime paper is
cited for ((1 - beta) g + beta m, `--mime_momentum_form=paper`), MimeLite with
TFF's (beta m + g) at beta 0.9 and 0.5 for reference, FedAvgM (not in the
paper's table), FedProx (mu = 0.01, ours) and FedAvg, D_i/D weights
(`--client_weighting=samples`). The server-momentum baselines use our
defaults (eta_s = 1, beta = 0.9): the paper gives none. FedADC, FastSlowMo
and DOMO are not implemented: their update rules could not be read here.

Scores, at the final aggregation (T = 1,000): `global` = the accuracy of the
global model (pFedMo/FedNAG: x_+; the others: their only model) on the
pooled test data of the workers (the MNIST test set), compared with the
paper's "training accuracy"; `personal` = pFedMo/FedNAG's personalised
models x_{i+}, each on its own worker's test data. Ours: mean ± std over the
seeds run; local runner.

The cells (each setting, each method's flags) are the sweep file
benchmarks/sweeps/pfedmo_table2.toml; this script runs them with
`tff_cluster.sweep` into `--out` (a sweep's folder: each run in
OUT/SETTING/METHOD/seedS, METHOD the row's name as a folder's; a finished
run is reused, an interrupted one resumes), seed by seed, and writes the
tables.

  python benchmarks/pfedmo_table2.py --seeds=0,1,2
  python benchmarks/pfedmo_table2.py --dry_run    # list the cells and their flags
  python benchmarks/pfedmo_table2.py --table_only --record
  python -m tff_cluster.sweep benchmarks/sweeps/pfedmo_table2.toml
                              # the same cells, no tables (from the repository root)
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from typing import Dict, Optional

import numpy as np

import _cells
from _sweep import (REPO_ROOT, completed_summary, diverged_cell, diverged_summary,
                    load_recorded, mean_std, measured, median_round_seconds, save_markdown,
                    save_recorded, truncated)
from tff_cluster.io import rundir  # (_sweep put the repository on sys.path)

NAME = "pfedmo_table2"  # benchmarks/sweeps/NAME.toml, benchmarks/recorded/NAME.csv
SCRIPT = "pfedmo_table2.py"
# The cells: benchmarks/sweeps/pfedmo_table2.toml, a setting per block of the
# table, a method per row.
PART = _cells.part(NAME)

# The paper's Table 2 (%), MNIST columns; None: not in the table.
PAPER = {
    "pFedMo (eq. 12)": (89.36, 97.23), "pFedMo-mix (project variant)": (89.36, 97.23),
    "FedNAG": (88.14, 95.04), "FedMom": (88.05, 94.74), "SlowMo": (88.00, 94.88),
    "Mime (paper form)": (87.73, 93.89), "MimeLite (paper form)": (87.73, 93.89),
    "MimeLite (TFF form)": (87.73, 93.89), "MimeLite (TFF form β 0.5)": (87.73, 93.89),
    "FedAvgM": None, "FedProx": (86.85, 93.78), "FedAvg": (86.89, 93.31),
}


def method_name(method: str) -> str:
  """A row's method in the sweep file (its folder): spaces as _, beta as
  "beta", what a folder's name cannot take dropped."""
  return "".join(c for c in method.replace(" ", "_").replace("β", "beta").replace(".", "")
                 if c.isalnum() or c in "_-")


# Row -> its method in the sweep file, in the table's order.
METHODS = {m: method_name(m) for m in PAPER}
assert list(METHODS.values()) == PART.data["algos"], "the rows are the sweep file's methods"
PERSONAL = ("pFedMo (eq. 12)", "pFedMo-mix (project variant)", "FedNAG")
# The settings (the sweep file's: each its model, tau, rounds, split).
SETTINGS = tuple(PART.data["tasks"])
TITLES = {"logistic": "Logistic MNIST (IID)", "lenet5": "LeNet-5 MNIST (IID)",
          "label3": "LeNet-5 MNIST, label skew 3 classes"}
PAPER_COLUMN = {"logistic": 0, "lenet5": 1}


def plan(settings, methods, seeds, data_dir: Optional[str] = None) -> dict:
  """The sweep file's keys narrowed to `settings`, `methods` (rows) and
  `seeds`, in the order given, and `data_dir` where given."""
  data = copy.deepcopy(PART.data)
  data["tasks"], data["algos"] = list(settings), [METHODS[m] for m in methods]
  data["seeds"] = list(seeds)
  return data if data_dir is None else _cells.override(data, "data_dir",
                                                      os.path.abspath(data_dir))


def run_dir(out: str, setting: str, method: str, seed: int) -> str:
  """The run of row `method` in `setting` (its cell's folder under `out`)."""
  return os.path.join(out, setting, METHODS[method], f"seed{seed}")


def score(directory: str, method: str) -> Optional[Dict[str, float]]:
  """The final aggregation's scores of a finished run ({'diverged': round}
  for a run the divergence guard stopped), else None."""
  stopped = diverged_summary(directory)
  if stopped is not None:
    return {"global": None, "personal": None, "seconds": float("nan"), "ratio": None,
            "diverged": int(stopped["diverged_round"])}
  summary = completed_summary(directory)
  if summary is None:
    return None
  last = rundir.read_metrics(directory, first=rundir.METRICS_JSONL)[1][-1]
  seconds = median_round_seconds(directory)
  out = {"seconds": seconds, "ratio": summary.get("max_loss_ratio"), "diverged": None}
  if method in PERSONAL:
    return {**out, "global": last["global_test_accuracy"], "personal": last["test_accuracy"]}
  return {**out, "global": last["test_accuracy"], "personal": None}


RECORD_KEY = ("setting", "method", "seed")
RECORD_FIELDS = RECORD_KEY + ("global_accuracy", "personal_accuracy", "seconds_per_round",
                              "max_loss_ratio", "diverged_round", "recorded", "note")


def _float(text):
  return float(text) if text not in (None, "") else None


def collect(args) -> Dict[tuple, Dict[int, Dict[str, Optional[float]]]]:
  """(setting, method) -> {seed: score} over the runs recorded in
  `benchmarks/recorded/pfedmo_table2.csv` and the finished runs under `--out`
  (a run on disk takes precedence); `--record` adds the runs on disk to that
  file."""
  got: Dict[tuple, Dict[int, Dict[str, Optional[float]]]] = {}
  for r in load_recorded("pfedmo_table2"):
    diverged = _float(r.get("diverged_round"))
    got.setdefault((r["setting"], r["method"]), {})[int(r["seed"])] = {
        "global": _float(r["global_accuracy"]), "personal": _float(r["personal_accuracy"]),
        "seconds": measured(r["seconds_per_round"]), "ratio": _float(r.get("max_loss_ratio")),
        "diverged": None if diverged is None else int(diverged)}
  on_disk = []
  for setting in SETTINGS:
    for method in METHODS:
      base = os.path.dirname(run_dir(args.out, setting, method, 0))
      if not os.path.isdir(base):
        continue
      for name in sorted(os.listdir(base)):
        result = score(os.path.join(base, name), method) if name.startswith("seed") else None
        if result is None:
          continue
        got.setdefault((setting, method), {})[int(name[4:])] = result
        on_disk.append(dict(
            setting=setting, method=method, seed=int(name[4:]),
            global_accuracy="" if result["global"] is None else f"{result['global']:.6f}",
            personal_accuracy="" if result["personal"] is None else f"{result['personal']:.6f}",
            seconds_per_round=truncated(result["seconds"], 3),
            max_loss_ratio="" if result["ratio"] is None else f"{result['ratio']:.4g}",
            diverged_round="" if result["diverged"] is None else result["diverged"],
            recorded=time.strftime("%Y-%m-%d"), note=""))
  if getattr(args, "record", False) and on_disk:
    save_recorded("pfedmo_table2", on_disk, RECORD_KEY, RECORD_FIELDS)
  # Seed -1: a cell re-entered from an earlier README (its run directories are
  # gone), superseded by any real seed of the same setting and method.
  for seeds in got.values():
    if -1 in seeds and any(s >= 0 for s in seeds):
      del seeds[-1]
  return got


def write_table(args) -> str:
  found = collect(args)
  lines = []
  for setting in SETTINGS:
    rows = []
    for method in METHODS:
      got = found.get((setting, method))
      if not got:
        continue
      seeds = sorted(got)
      paper = PAPER.get(method)
      col = PAPER_COLUMN.get(setting)
      paper_text = "–" if paper is None or col is None else f"{paper[col]:.2f}"
      secs = np.nanmedian([got[s]["seconds"] for s in seeds])
      stopped = [got[s]["diverged"] for s in seeds if got[s]["diverged"] is not None]
      ratios = [got[s]["ratio"] for s in seeds if got[s]["ratio"] is not None]
      glob = (diverged_cell(stopped, len(seeds)) if stopped
              else mean_std([got[s]["global"] for s in seeds]))
      personal = "–" if stopped else mean_std([got[s]["personal"] for s in seeds])
      rows.append(f"| {method} | {','.join(map(str, seeds))} | {glob} | {personal} | "
                  f"{paper_text} | {truncated(secs, 2)} | "
                  f"{f'{max(ratios):.3g}' if ratios else '–'} |")
    if rows:
      lines += [f"**{TITLES[setting]}**", "",
                "| method | seeds | global x_+ (pooled test) | personalised x_i+ (own "
                "test) | paper | s/round (median) | max loss ratio |",
                "|---|---|---|---|---|---|---|", *rows, ""]
  text = "\n".join(lines)
  save_markdown(args.table, text)
  return text


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--settings", default=",".join(SETTINGS))
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--data_dir", default=None,
                 help="MNIST's folder (default: the sweep file's, ../shared/data/mnist)")
  p.add_argument("--out", default=os.path.join(REPO_ROOT, "results", NAME),
                 help="the sweep's folder (runs in OUT/SETTING/METHOD/seedS)")
  p.add_argument("--table", default=os.path.join(REPO_ROOT, "benchmarks", "results", NAME))
  p.add_argument("--methods", default=None, help="comma-separated subset of the methods")
  p.add_argument("--dry_run", action="store_true",
                 help="list each cell's folder and flags (as the sweep runs it) and stop")
  p.add_argument("--table_only", action="store_true")
  p.add_argument("--record", action="store_true",
                 help="add the finished runs under --out to benchmarks/recorded/")
  args = p.parse_args(argv)
  settings = args.settings.split(",")
  bad = [s for s in settings if s not in SETTINGS]
  if bad:
    raise SystemExit(f"{SCRIPT}: error: unknown setting {bad[0]}; valid: "
                     f"{', '.join(SETTINGS)}")
  seeds = [int(s) for s in args.seeds.split(",")]
  methods = list(METHODS) if args.methods is None else args.methods.split(",")
  unknown = [m for m in methods if m not in METHODS]
  if unknown:
    raise SystemExit(f"{SCRIPT}: error: unknown method {unknown[0]!r}; valid: "
                     f"{', '.join(METHODS)}")
  the_sweep = _cells.load(SCRIPT, plan(settings, methods, seeds, args.data_dir), NAME)
  label = {name: method for method, name in METHODS.items()}
  t0 = time.perf_counter()

  def done(cell):
    method = label[cell.method]
    print(f"[{time.perf_counter() - t0:6.0f} s] {cell.setting} {method} seed {cell.seed}: "
          f"{score(os.path.join(args.out, cell.path), method)}", flush=True)
    write_table(args)

  if not args.table_only:
    _cells.run_sweep(SCRIPT, the_sweep, args.out, args, done)
  if not args.dry_run:
    print(write_table(args))


if __name__ == "__main__":
  sys.exit(main())
