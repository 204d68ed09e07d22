"""Reproduces the FedGroup paper's Table 3 with several seeds: mean ± std beside the paper.

The cells (each row a setting, each column a method, its flags, its seeds)
are the sweep files benchmarks/sweeps/fedgroup_table3.toml (every row and
column) and fedgroup_table3_ablation.toml (`--ablation`); this script
narrows them to its `--tasks`, `--columns` and `--seeds` (and `--rounds`,
the data folders, `--runner`), runs them with `tff_cluster.sweep`
(`--parallel` at a time, each in its own process) into `--out` (a sweep's
folder: each run in OUT/ROW/COLUMN/seedS, the row's and column's names with
characters other than letters, digits, - and _ as _, the folders the runs had
before the table was a sweep; a finished run is reused, an interrupted one
resumes, a failed one does not stop the others), then prints and writes the
table from each finished cell's summary.json.

Columns (Table 3's, those the library implements): FedAvg, FedProx, FG-RCC-EDC,
FG-RAC-EDC, FG-EDC, FGP-EDC, FG-MADC, FGP-MADC. IFCA and FeSEM join when they
are registered algorithms. The score is Table 3's: the maximum test accuracy
over the rounds, for FedGroup columns over the clients ever assigned to a group
(`max_test_accuracy_assigned`, the paper's protocol), for the baselines over
all clients (`max_test_accuracy`), each tested with the model it holds: IFCA's
clients with the cluster their training loss chose (`--ifca_eval=assigned`; a
client not sampled yet, the argmin of its training loss over the K models).
A cell whose runs the divergence guard stopped reads "diverged at round r (k/n
seeds)", never an accuracy; `--record` keeps each run's largest loss ratio.
Seconds per round: the median round of each run (training, aggregation and the
host steps, no evaluation; a median, so a run paused for a while is not
inflated), the median over the seeds in the table.

Rows:
  synthetic      Synthetic(1,1)-MCLR: our seeded draws of FedProx's generator,
                 not the paper's files (its 100 clients hold 75,349 samples
                 with one dominant client; ours 35,621 at seed 0, and the
                 draw changes with the seed);
  mnist          MNIST-MCLR / -MLP (784-128-10, 101,770 parameters): FedProx's
                 recipe on the real MNIST (`--mnist_dir`);
  sent140        Sent140-LSTM on the raw Sentiment140 CSV with GloVe
                 (`--sent140_dir`; the shared partial corpus with 50-d GloVe,
                 `--min_tweets` 5: 124 users) -- not comparable with the
                 paper's 772 LEAF users and 300-d GloVe, and marked so;
  femnist_fedprox FEMNIST-MCLR / -MLP: FedProx's nist recipe (`--femnist_dir`).
                 A source with fewer than 4,000 images per letter cannot give
                 the paper's data; its rows are printed apart, marked "not
                 comparable: N source images".
Settings are each task's defaults (the paper's E = 20, K = 20, B = 10, alpha = 20,
eta_g = 0; rounds: FedProx's T, as the FedGroup paper does not state T), on
`--runner` (default local). Rows where not every client is pre-trained (MNIST,
FEMNIST, Sent140) add FG-EDC and FG-MADC with `--newcomer_rule=flexcfl` when any
FedGroup column runs (`--no-newcomer_columns` leaves them out; `--columns` may also name
them, so that two processes can share a row's columns without running one twice).
`--ablation` adds FedGroup-EDC with alpha = 4 under both newcomer rules and RAC (80
of 100 Synthetic clients then join by client cold start).

  python benchmarks/fedgroup_table3.py --tasks=synthetic,mnist --seeds=0,1,2
  python benchmarks/fedgroup_table3.py --dry_run     # list the cells and their flags
  python benchmarks/fedgroup_table3.py --project     # time 2 rounds of each run
  python benchmarks/fedgroup_table3.py --table_only  # the table from finished runs
  python -m tff_cluster.sweep benchmarks/sweeps/fedgroup_table3.toml
                          # every row's cells, no table (from the repository root)
"""

from __future__ import annotations

import argparse
import copy
import csv
import dataclasses
import json
import os
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

import _cells
from _sweep import (REPO_ROOT, completed_summary, diverged_cell, diverged_summary, fmt,
                    is_diverged, median_round_seconds, registered_algorithms, run_config,
                    run_one, run_rounds, save_recorded, truncated)
from tff_cluster.sweep import spec  # (_sweep put the repository on sys.path)

NAME = "fedgroup_table3"  # benchmarks/sweeps/NAME*.toml, benchmarks/recorded/NAME.csv
SCRIPT = "fedgroup_table3.py"
# The cells: benchmarks/sweeps/fedgroup_table3.toml (every row and column),
# fedgroup_table3_ablation.toml (--ablation) and fedgroup_table3_ifca_test_loss.toml
# (the recorded "IFCA (test loss)" cells, which this script does not run).
PART = _cells.part(NAME)
ABLATION_PART = _cells.part(f"{NAME}_ablation")
TEST_LOSS = _cells.part(f"{NAME}_ifca_test_loss")

# benchmarks/recorded/fedgroup_table3.csv: one row per finished run (`seeds` one
# seed) or, for the cells re-entered from an earlier README, per cell (`seeds`
# the list, `mean` and `std` over them).
RECORD_KEY = ("row", "column", "seeds")
RECORD_FIELDS = RECORD_KEY + ("mean", "std", "seconds_per_round", "max_loss_ratio",
                              "diverged_round", "recorded", "note")

# Table 3 of the FedGroup paper (accuracy in %), by row and column.
PAPER = {
    "MNIST-MCLR": dict(FedAvg=89.8, FedProx=90.7, IFCA=95.3, FeSEM=89.1, **{
        "FG-RCC-EDC": 92.6, "FG-RAC-EDC": 88.8, "FG-EDC": 96.0, "FGP-EDC": 96.1,
        "FG-MADC": 95.6, "FGP-MADC": 95.3}),
    "FEMNIST-MCLR": dict(FedAvg=78.8, FedProx=77.9, IFCA=87.9, FeSEM=65.6, **{
        "FG-RCC-EDC": 88.8, "FG-RAC-EDC": 74.7, "FG-EDC": 91.7, "FGP-EDC": 91.7,
        "FG-MADC": 91.2, "FGP-MADC": 90.7}),
    "FEMNIST-MLP": dict(FedAvg=82.7, FedProx=81.0, IFCA=95.5, FeSEM=69.9, **{
        "FG-RCC-EDC": 91.5, "FG-RAC-EDC": 78.4, "FG-EDC": 96.8, "FGP-EDC": 95.4,
        "FG-MADC": 94.6, "FGP-MADC": 93.6}),
    "MNIST-MLP": dict(FedAvg=95.3, FedProx=94.6, IFCA=97.8, FeSEM=93.9, **{
        "FG-RCC-EDC": 96.5, "FG-RAC-EDC": 94.3, "FG-EDC": 97.9, "FGP-EDC": 97.7,
        "FG-MADC": 97.9, "FGP-MADC": 97.7}),
    "Sent140-LSTM": dict(FedAvg=72.2, FedProx=71.9, IFCA=76.8, FeSEM=70.0, **{
        "FG-RCC-EDC": 76.1, "FG-RAC-EDC": 72.2, "FG-EDC": 75.3, "FGP-EDC": 75.4,
        "FG-MADC": 75.8, "FGP-MADC": 75.4}),
    "Synthetic(1,1)-MCLR": dict(FedAvg=74.7, FedProx=81.5, IFCA=95.5, FeSEM=92.1, **{
        "FG-RCC-EDC": 92.9, "FG-RAC-EDC": None, "FG-EDC": 88.4, "FGP-EDC": 87.4,
        "FG-MADC": 92.1, "FGP-MADC": 88.5}),
}


def folder_name(label: str) -> str:
  """A row's or column's setting / method in the sweep files (its runs'
  folder): characters other than letters, digits, - and _ as _."""
  return "".join(c if c.isalnum() or c in "-_" else "_" for c in label)


# Column -> its method in the sweep files (FedGroup columns are scored on
# assigned clients).
COLUMNS = {c: folder_name(c) for c in (
    "FedAvg", "FedProx", "IFCA", "FeSEM", "FG-RCC-EDC", "FG-RAC-EDC", "FG-EDC", "FGP-EDC",
    "FG-MADC", "FGP-MADC")}
# --ablation (Synthetic only; fedgroup_table3_ablation.toml).
ABLATION = {c: folder_name(c) for c in (
    "FG-EDC alpha=4 newcomer=paper", "FG-EDC alpha=4 newcomer=flexcfl", "FG-EDC alpha=4 RAC")}
# Rows with clients outside the group cold start (alpha * m < N): FedGroup
# with the authors' TF2 newcomer rule beside the paper's (the default).
NEWCOMER_COLUMNS = {c: folder_name(c) for c in (
    "FG-EDC newcomer=flexcfl", "FG-MADC newcomer=flexcfl")}
# The recorded IFCA column from before --ifca_eval=assigned (not run here).
TEST_LOSS_COLUMNS = {"IFCA (test loss)": "IFCA_test_loss"}
# Row -> its setting in the sweep files, by --tasks name.
ROWS = {row: folder_name(row) for row in (
    "Synthetic(1,1)-MCLR", "MNIST-MCLR", "MNIST-MLP", "Sent140-LSTM", "FEMNIST-MCLR",
    "FEMNIST-MLP")}
TASKS = ("synthetic", "mnist", "femnist_fedprox", "sent140")
# Each setting's task and the flags the command's options set there.
SETTINGS = {name: s["task"] for name, s in PART.data["settings"].items()}
ROW_OF = {setting: row for row, setting in ROWS.items()}
COLUMN_OF = {method: column for column, method in
             {**COLUMNS, **NEWCOMER_COLUMNS, **ABLATION, **TEST_LOSS_COLUMNS}.items()}
FULL_SOURCE_IMAGES = 10 * 4000  # the nist recipe's 4,000 images per letter


def rows_for(tasks: Sequence[str], args) -> List[dict]:
  """Each requested table row: its label, its setting in the sweep files and
  its task."""
  labels = []
  for task in tasks:
    if task == "synthetic":
      labels.append("Synthetic(1,1)-MCLR")
    elif task == "mnist":
      labels += [f"MNIST-{m.upper()}" for m in args.mnist_models.split(",")]
    elif task == "sent140":
      labels.append("Sent140-LSTM")
    elif task == "femnist_fedprox":
      labels += [f"FEMNIST-{m.upper()}" for m in args.femnist_models.split(",")]
    else:
      raise SystemExit(f"{SCRIPT}: error: unknown task {task!r}; valid: "
                       "synthetic, mnist, femnist_fedprox, sent140")
  for label in labels:
    if label not in ROWS:
      raise SystemExit(f"{SCRIPT}: error: no row {label}; valid: "
                       f"{', '.join(r for r in ROWS if r.split('-')[0] == label.split('-')[0])}"
                       " (--mnist_models / --femnist_models: mclr, mlp)")
  return [dict(row=label, setting=ROWS[label], task=SETTINGS[ROWS[label]]) for label in labels]


def run_dir(out: str, row: str, column: str, seed: int) -> str:
  """The run of (row, column) at `seed`: its cell's folder under `out`."""
  return os.path.join(out, folder_name(row), folder_name(column), f"seed{seed}")


def score(column: str, summary: dict) -> float:
  key = ("max_test_accuracy_assigned" if column.startswith("FG")
         else "max_test_accuracy")
  return float(summary[key])


def source_images(directory: str) -> Optional[int]:
  """Distinct source images of a femnist_fedprox run (its data description)."""
  config = run_config(directory)
  if not config:
    return None
  text = json.dumps(config)
  import re
  found = re.search(r"(\d[\d,]*) distinct source images", text)
  return int(found.group(1).replace(",", "")) if found else None


def num_clients(directory: str) -> Optional[int]:
  """The number of clients a run loaded (its config.json)."""
  return run_config(directory).get("num_clients_loaded")


def rounds_note(row: dict, directories: Sequence[str]) -> str:
  """Names the rounds of a row's runs where they are not its task's T (a
  `--rounds` override), so that the label says what ran."""
  if "task" not in row:
    return ""
  rounds = {run_rounds(d) for d in directories}
  rounds.discard(None)
  t = default_rounds(row)
  if rounds <= {t}:
    return ""
  return f"{'/'.join(map(str, sorted(rounds)))} rounds, not the task's T = {t}"


def columns_for(args) -> List[str]:
  """The columns the arguments ask for, in running order: those named
  (registered algorithms only), then (where a FedGroup column runs and
  --newcomer_columns) the newcomer columns, then those named among them."""
  available = registered_algorithms()
  methods = {**PART.data["methods"], **ABLATION_PART.data["methods"]}
  columns, newcomer = [], []
  for name in args.columns.split(","):
    if name in NEWCOMER_COLUMNS:
      newcomer.append(name)
      continue
    if name not in COLUMNS:
      raise SystemExit(f"{SCRIPT}: error: unknown column {name!r}; valid: "
                       f"{', '.join([*COLUMNS, *NEWCOMER_COLUMNS])}")
    algo = methods[COLUMNS[name]]["algo"]
    if algo in available:
      columns.append(name)
    else:
      print(f"(column {name}: --algo={algo} is not implemented yet; left out)")
  if args.newcomer_columns and any(c.startswith("FG") for c in columns):
    newcomer = [*NEWCOMER_COLUMNS, *newcomer]
  return list(dict.fromkeys([*columns, *newcomer]))


def _narrowed(data: dict, settings: Sequence[str], methods: Sequence[str], seeds, args
              ) -> Optional[dict]:
  """A sweep file's keys narrowed to `settings`, `methods` and `seeds`, with
  the command's data folders, --min_tweets, --runner and --rounds; None when
  no cell is left."""
  data = copy.deepcopy(data)
  data["tasks"] = [s for s in settings if s in data["tasks"]]
  data["algos"] = [m for m in methods if m in data["algos"]]
  def skipped(setting, method):  # (a [[when]] with skip names settings and methods)
    return any(w.get("skip") and setting in (_cells._names(w.get("task")) or [setting])
               and method in (_cells._names(w.get("algo")) or [method])
               for w in data.get("when", []))

  data["tasks"] = [s for s in data["tasks"]
                   if not all(skipped(s, m) for m in data["algos"])]
  if not data["tasks"] or not data["algos"]:
    return None
  data["seeds"] = list(seeds)
  folders = {"mnist": args.mnist_dir, "femnist_fedprox": args.femnist_dir,
             "sent140": args.sent140_dir}
  for name, setting in data.get("settings", {}).items():
    flags = setting.setdefault("flags", {})
    folder = folders.get(setting["task"])
    if folder is not None:
      flags["data_dir"] = os.path.abspath(folder)
      if setting["task"] == "sent140":
        flags["glove_path"] = os.path.abspath(folder)
    if setting["task"] == "sent140" and args.min_tweets is not None:
      flags["task_arg"] = {"min_tweets": args.min_tweets}
  if args.runner != "local":
    data.setdefault("flags", {})["runner"] = args.runner
  if args.rounds is not None:
    data = _cells.override(data, "rounds", args.rounds)
  return data


def plan(args) -> Tuple[List[dict], List[int], Optional[spec.Sweep]]:
  """The rows and seeds the arguments ask for, and the sweep of their cells
  (the main file's, then --ablation's; None when there is none)."""
  seeds = [int(s) for s in args.seeds.split(",")]
  rows = rows_for(args.tasks.split(","), args)
  settings = [r["setting"] for r in rows]
  methods = [{**COLUMNS, **NEWCOMER_COLUMNS}[c] for c in columns_for(args)]
  parts = [(PART, methods)]
  if args.ablation:
    parts.append((ABLATION_PART, list(ABLATION.values())))
  sweeps = []
  for p, names in parts:
    data = _narrowed(p.data, settings, names, seeds, args)
    if data is not None:
      sweeps.append(_cells.load(SCRIPT, data, p.stem))
  if not sweeps:
    return rows, seeds, None
  return rows, seeds, dataclasses.replace(
      sweeps[0], cells=[c for s in sweeps for c in s.cells])


def finished_summary(directory: str) -> Optional[dict]:
  """The summary.json of a finished run (completed, or stopped by the
  divergence guard), else None."""
  if not os.path.isdir(directory):
    return None
  return completed_summary(directory) or diverged_summary(directory)


def results_of(the_sweep: Optional[spec.Sweep], out: str) -> Dict[tuple, tuple]:
  """(row, column, seed) -> (summary, run directory) of each finished cell."""
  results = {}
  for cell in [] if the_sweep is None else the_sweep.cells:
    directory = os.path.join(out, cell.path)
    summary = finished_summary(directory)
    if summary is not None:
      results[(ROW_OF[cell.setting], COLUMN_OF[cell.method], cell.seed)] = (summary, directory)
  return results


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--tasks", default="synthetic,mnist")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--columns", default=",".join(COLUMNS))
  p.add_argument("--newcomer_columns", default=True, action=argparse.BooleanOptionalAction,
                 help="rows where not every client is pre-trained: add the flexcfl "
                      "newcomer columns when a FedGroup column runs")
  p.add_argument("--ablation", action="store_true",
                 help="add FedGroup-EDC with alpha = 4 (Synthetic rows only; the sweep file "
                      "fedgroup_table3_ablation.toml)")
  p.add_argument("--runner", default="local", choices=("local", "tff"),
                 help="the cells' --runner (tff: the cells' flags say so)")
  p.add_argument("--rounds", type=int, default=None, help="override every task's T")
  p.add_argument("--parallel", "--jobs", dest="parallel", type=int, default=2,
                 help="cells run at a time, each its own process (default 2; --jobs: the "
                      "same)")
  p.add_argument("--mnist_dir", default=None,
                 help="MNIST's folder (default: the sweep file's, ../shared/data/mnist)")
  p.add_argument("--femnist_dir", default=None,
                 help="femnist_fedprox's folder (default: the sweep file's, "
                      "../shared/data/femnist_leaf)")
  p.add_argument("--femnist_models", default="mclr,mlp", help="femnist_fedprox rows")
  p.add_argument("--mnist_models", default="mclr,mlp", help="mnist rows")
  p.add_argument("--sent140_dir", default=None,
                 help="raw Sentiment140 CSV and GloVe (default: the sweep file's, the shared "
                      "partial corpus ../shared/data/sent140_partial)")
  p.add_argument("--min_tweets", type=int, default=None,
                 help="sent140: keep users with at least this many tweets (default: the "
                      "sweep file's 5; the partial corpus: 5 leaves 124 users, enough for "
                      "alpha * m = 100 pre-trained)")
  p.add_argument("--out", default=os.path.join(REPO_ROOT, "results", NAME),
                 help="the sweep's folder (runs in OUT/ROW/COLUMN/seedS)")
  p.add_argument("--table", default=os.path.join(REPO_ROOT, "benchmarks", "results", NAME))
  p.add_argument("--record", action="store_true",
                 help="add every finished run's score to benchmarks/recorded/"
                      "fedgroup_table3.csv (one row per seed; the same row, column and "
                      "seed replaced)")
  p.add_argument("--project", action="store_true",
                 help="time 2 rounds of each run instead and project the total")
  p.add_argument("--dry_run", action="store_true",
                 help="list each cell's folder and flags (as the sweep runs it) and stop")
  p.add_argument("--table_only", action="store_true",
                 help="run nothing: the table from the finished runs under --out")
  args = p.parse_args(argv)
  rows, seeds, the_sweep = plan(args)

  if args.project:
    return project(the_sweep, args)

  t0 = time.perf_counter()

  def done(cell):
    summary = finished_summary(os.path.join(args.out, cell.path))
    row, column = ROW_OF[cell.setting], COLUMN_OF[cell.method]
    got = (f"diverged at round {summary.get('diverged_round')}" if is_diverged(summary)
           else f"{score(column, summary):.4f}")
    print(f"[{time.perf_counter() - t0:7.0f} s] {row} {column} seed {cell.seed}: {got}",
          flush=True)

  if the_sweep is not None and not args.table_only:
    _cells.run_sweep(SCRIPT, the_sweep, args.out, args, done, parallel=args.parallel)
  if args.dry_run:
    return 0
  write_table(results_of(the_sweep, args.out), rows, seeds, args)
  return 0


def project(the_sweep: Optional[spec.Sweep], args):
  """Times 2 rounds per (row, column) (the first includes compilation) and
  projects each of its runs."""
  import tempfile
  total = 0.0
  seen = {}
  cells = [] if the_sweep is None else the_sweep.cells
  for cell in cells:
    key = (cell.setting, cell.method)
    row, column = ROW_OF[cell.setting], COLUMN_OF[cell.method]
    if key not in seen:
      with tempfile.TemporaryDirectory() as tmp:
        s = run_one(_cells.cell_flags(cell, ("runner",)), os.path.join(tmp, "run"), cell.seed,
                    args.runner, 2)
      rounds = dict(cell.flags).get("rounds") or default_rounds(dict(task=cell.task))
      # Training and evaluation of one round (the first includes compilation).
      per_round = (s["total_seconds"] - s["setup_seconds"]) / 2
      seen[key] = s["wall_seconds"] + (rounds - 2) * per_round
      print(f"{row} {column}: {s['wall_seconds']:.1f} s for 2 rounds, "
            f"{per_round:.3f} s/round -> {seen[key] / 60:.1f} min for {rounds} rounds",
            flush=True)
    total += seen[key]
  print(f"projected total: {total / 3600:.2f} h for {len(cells)} runs "
        f"({total / 3600 / max(args.parallel, 1):.2f} h with {args.parallel} in parallel)")


def default_rounds(row) -> int:
  from tff_cluster import tasks
  return int(tasks.get_task(row["task"]).defaults["rounds"])


def write_table(results, rows, seeds, args):
  os.makedirs(os.path.dirname(args.table) or ".", exist_ok=True)
  lines = [f"Seeds {','.join(map(str, seeds))}; runner {args.runner}; "
           f"rounds {'task defaults' if args.rounds is None else args.rounds}. "
           "Ours: mean ± std (%) over seeds (one seed: its score); paper: Table 3.", ""]
  csv_rows = []
  recorded = []
  for row in rows:
    label = row["row"]
    order = [*COLUMNS, *NEWCOMER_COLUMNS, *ABLATION]
    cols = sorted({c for (r, c, _) in results if r == label}, key=order.index)
    images = {source_images(d) for (r, c, s), (_, d) in results.items() if r == label}
    images.discard(None)
    note = ""
    if label.startswith("FEMNIST") and images and max(images) < FULL_SOURCE_IMAGES:
      note = f" (not comparable: {max(images)} source images)"
    if label.startswith("Sent140"):
      users = {num_clients(d) for (r, c, s), (_, d) in results.items() if r == label}
      users.discard(None)
      note = (f" (not comparable: {max(users) if users else '?'} users of a partial "
              "corpus, 50-d GloVe; the paper: 772 users, 300-d GloVe)")
    short = rounds_note(row, [d for (r, _, _), (_, d) in results.items() if r == label])
    if short:
      note = f"{note[:-1]}; {short})" if note else f" ({short})"
    lines += [f"**{label}**{note}", "", "| column | ours | paper | seconds/round |",
              "|---|---|---|---|"]
    for column in cols:
      runs = [(s, results[(label, column, s)][0]) for s in seeds if (label, column, s) in results]
      seconds = {s: median_round_seconds(results[(label, column, s)][1],
                                         summary.get("mean_round_seconds", np.nan))
                 for s, summary in runs}
      got = [score(column, summary) for _, summary in runs if not is_diverged(summary)]
      stopped = [int(summary["diverged_round"]) for _, summary in runs if is_diverged(summary)]
      secs = list(seconds.values())
      paper = PAPER.get(label, {}).get(column)
      cell = diverged_cell(stopped, len(runs)) if stopped else fmt(got)
      lines.append(f"| {column} | {cell} | {'–' if paper is None else paper} | "
                   f"{truncated(float(np.median(secs)), 3)} |")
      for s, summary in runs:
        stop = int(summary["diverged_round"]) if is_diverged(summary) else None
        value = None if stop is not None else score(column, summary)
        ratio = summary.get("max_loss_ratio")
        csv_rows.append(dict(row=label, column=column, seed=s,
                             score="" if value is None else value, paper=paper,
                             note=note.strip()))
        recorded.append(dict(
            row=label, column=column, seeds=str(s),
            mean="" if value is None else f"{value:.6f}", std="",
            seconds_per_round=truncated(seconds[s], 3),
            max_loss_ratio="" if ratio is None else f"{ratio:.4g}",
            diverged_round="" if stop is None else stop,
            recorded=time.strftime("%Y-%m-%d"), note=note.strip()))
    lines.append("")
  text = "\n".join(lines)
  print(text)
  with open(args.table + ".md", "w") as f:
    f.write(text + "\n")
  with open(args.table + ".csv", "w", newline="") as f:
    w = csv.DictWriter(f, ["row", "column", "seed", "score", "paper", "note"],
                       lineterminator="\n")
    w.writeheader()
    w.writerows(csv_rows)
  if getattr(args, "record", False) and recorded:
    save_recorded("fedgroup_table3", recorded, RECORD_KEY, RECORD_FIELDS)


if __name__ == "__main__":
  sys.exit(main())
