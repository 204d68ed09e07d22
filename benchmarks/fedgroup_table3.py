"""Reproduces the FedGroup paper's Table 3 with several seeds: mean ± std beside the paper.

Runs `run_experiment.py` once per (task, column, seed), each in its own
process and output directory under `--out` (a finished run is not run again,
so an interrupted table resumes), then prints and writes the table.

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
FEMNIST) add FG-EDC and FG-MADC with `--newcomer_rule=flexcfl` when any FedGroup
column runs (`--no-newcomer_columns` leaves them out; `--columns` may also name them,
so that two processes can share a row's columns without running one twice). `--ablation`
adds FedGroup-EDC with alpha = 4 under both newcomer rules and RAC (80 of 100
Synthetic clients then join by client cold start).

  python benchmarks/fedgroup_table3.py --tasks=synthetic,mnist --seeds=0,1,2
  python benchmarks/fedgroup_table3.py --project   # time one round of each run
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from _sweep import (REPO_ROOT, SHARED, diverged_cell, fmt, is_diverged, median_round_seconds,
                    registered_algorithms, run_config, run_one, run_rounds, save_recorded,
                    truncated)

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

# Column -> run_experiment flags; FedGroup columns are scored on assigned clients.
COLUMNS = {
    "FedAvg": ["--algo=fedavg"],
    "FedProx": ["--algo=fedprox"],
    "IFCA": ["--algo=ifca", "--ifca_eval=assigned"],
    "FeSEM": ["--algo=fesem"],
    "FG-RCC-EDC": ["--algo=fedgroup", "--measure=edc", "--cold_start=rcc"],
    "FG-RAC-EDC": ["--algo=fedgroup", "--measure=edc", "--cold_start=rac"],
    "FG-EDC": ["--algo=fedgroup", "--measure=edc"],
    "FGP-EDC": ["--algo=fedgrouprox", "--measure=edc"],
    "FG-MADC": ["--algo=fedgroup", "--measure=madc"],
    "FGP-MADC": ["--algo=fedgrouprox", "--measure=madc"],
}
ABLATION = {
    "FG-EDC alpha=4 newcomer=paper": ["--algo=fedgroup", "--measure=edc",
                                      "--pretrain_scale=4", "--newcomer_rule=paper"],
    "FG-EDC alpha=4 newcomer=flexcfl": ["--algo=fedgroup", "--measure=edc",
                                        "--pretrain_scale=4", "--newcomer_rule=flexcfl"],
    "FG-EDC alpha=4 RAC": ["--algo=fedgroup", "--measure=edc", "--pretrain_scale=4",
                           "--cold_start=rac"],
}
# Rows with clients outside the group cold start (alpha * m < N): FedGroup
# with the authors' TF2 newcomer rule beside the paper's (the default).
NEWCOMER_COLUMNS = {
    "FG-EDC newcomer=flexcfl": ["--algo=fedgroup", "--measure=edc",
                                "--newcomer_rule=flexcfl"],
    "FG-MADC newcomer=flexcfl": ["--algo=fedgroup", "--measure=madc",
                                 "--newcomer_rule=flexcfl"],
}
FULL_SOURCE_IMAGES = 10 * 4000  # the nist recipe's 4,000 images per letter


def rows_for(tasks: Sequence[str], args) -> List[dict]:
  """(row label, task flags) of each requested table row."""
  out = []
  for task in tasks:
    if task == "synthetic":
      out.append(dict(row="Synthetic(1,1)-MCLR", flags=["--task=synthetic"]))
    elif task == "mnist":
      for model in args.mnist_models.split(","):
        # (MCLR, the task's default model, as its recorded runs were started)
        out.append(dict(row=f"MNIST-{model.upper()}",
                        flags=["--task=mnist", f"--data_dir={args.mnist_dir}",
                               *([] if model == "mclr" else [f"--model={model}"])]))
    elif task == "sent140":
      out.append(dict(row="Sent140-LSTM", flags=[
          "--task=sent140", f"--data_dir={args.sent140_dir}", f"--glove_path={args.sent140_dir}",
          f"--task_arg=min_tweets={args.min_tweets}"]))
    elif task == "femnist_fedprox":
      for model in args.femnist_models.split(","):
        out.append(dict(row=f"FEMNIST-{model.upper()}",
                        flags=["--task=femnist_fedprox", f"--data_dir={args.femnist_dir}",
                               f"--model={model}"]))
    else:
      raise SystemExit(f"fedgroup_table3.py: error: unknown task {task!r}; valid: "
                       "synthetic, mnist, femnist_fedprox, sent140")
  return out


def run_dir(out: str, row: str, column: str, seed: int) -> str:
  safe = lambda s: "".join(c if c.isalnum() or c in "-_" else "_" for c in s)  # noqa: E731
  return os.path.join(out, safe(row), safe(column), f"seed{seed}")


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
  if "flags" not in row:
    return ""
  rounds = {run_rounds(d) for d in directories}
  rounds.discard(None)
  t = default_rounds(row)
  if rounds <= {t}:
    return ""
  return f"{'/'.join(map(str, sorted(rounds)))} rounds, not the task's T = {t}"


def jobs_for(args) -> Tuple[List[dict], List[int], List[tuple]]:
  """The rows and seeds the arguments ask for, and every run's (row, column,
  seed, run_experiment flags)."""
  seeds = [int(s) for s in args.seeds.split(",")]
  available = registered_algorithms()
  columns, newcomer = {}, {}
  for name in args.columns.split(","):
    if name in NEWCOMER_COLUMNS:
      newcomer[name] = NEWCOMER_COLUMNS[name]
      continue
    if name not in COLUMNS:
      raise SystemExit(f"fedgroup_table3.py: error: unknown column {name!r}; valid: "
                       f"{', '.join([*COLUMNS, *NEWCOMER_COLUMNS])}")
    algo = COLUMNS[name][0].split("=", 1)[1]
    if algo in available:
      columns[name] = COLUMNS[name]
    else:
      print(f"(column {name}: --algo={algo} is not implemented yet; left out)")
  rows = rows_for(args.tasks.split(","), args)
  jobs = []
  for row in rows:
    cols = dict(columns)
    if args.ablation and row["row"].startswith("Synthetic"):
      cols.update(ABLATION)
    if not row["row"].startswith("Synthetic"):  # (there all 100 clients are pre-trained)
      if args.newcomer_columns and any(c.startswith("FG") for c in columns):
        cols.update(NEWCOMER_COLUMNS)
      cols.update(newcomer)
    for column, flags in cols.items():
      for seed in seeds:
        jobs.append((row, column, seed, [*row["flags"], *flags]))
  return rows, seeds, jobs


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--tasks", default="synthetic,mnist")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--columns", default=",".join(COLUMNS))
  p.add_argument("--newcomer_columns", default=True, action=argparse.BooleanOptionalAction,
                 help="rows where not every client is pre-trained: add the flexcfl "
                      "newcomer columns when a FedGroup column runs")
  p.add_argument("--ablation", action="store_true",
                 help="add FedGroup-EDC with alpha = 4 (Synthetic rows only)")
  p.add_argument("--runner", default="local", choices=("local", "tff"))
  p.add_argument("--rounds", type=int, default=None, help="override every task's T")
  p.add_argument("--jobs", type=int, default=2, help="runs in parallel")
  p.add_argument("--mnist_dir", default=os.path.join(SHARED, "mnist"))
  p.add_argument("--femnist_dir", default=os.path.join(SHARED, "femnist_leaf"))
  p.add_argument("--femnist_models", default="mclr,mlp", help="femnist_fedprox rows")
  p.add_argument("--mnist_models", default="mclr,mlp", help="mnist rows")
  p.add_argument("--sent140_dir", default=os.path.join(SHARED, "sent140_partial"),
                 help="raw Sentiment140 CSV and GloVe (the shared partial corpus)")
  p.add_argument("--min_tweets", type=int, default=5,
                 help="sent140: keep users with at least this many tweets (the partial "
                      "corpus: 5 leaves 124 users, enough for alpha * m = 100 pre-trained)")
  p.add_argument("--out", default=os.path.join(REPO_ROOT, "results", "fedgroup_table3"))
  p.add_argument("--table", default=os.path.join(REPO_ROOT, "benchmarks", "results",
                                                 "fedgroup_table3"))
  p.add_argument("--record", action="store_true",
                 help="add every finished run's score to benchmarks/recorded/"
                      "fedgroup_table3.csv (one row per seed; the same row, column and "
                      "seed replaced)")
  p.add_argument("--project", action="store_true",
                 help="time 2 rounds of each run instead and project the total")
  args = p.parse_args(argv)
  rows, seeds, jobs = jobs_for(args)

  if args.project:
    return project(jobs, args)

  from concurrent.futures import ThreadPoolExecutor
  results: Dict[tuple, dict] = {}
  t0 = time.perf_counter()

  def work(job):
    row, column, seed, flags = job
    d = run_dir(args.out, row["row"], column, seed)
    summary = run_one(flags, d, seed, args.runner, args.rounds)
    print(f"[{time.perf_counter() - t0:7.0f} s] {row['row']} {column} seed {seed}: "
          f"{score(column, summary):.4f}", flush=True)
    return (row["row"], column, seed), (summary, d)

  with ThreadPoolExecutor(args.jobs) as pool:
    for key, value in pool.map(work, jobs):
      results[key] = value
  write_table(results, rows, seeds, args)


def project(jobs, args):
  """Times 2 rounds per run (the first includes compilation) and projects."""
  import tempfile
  total = 0.0
  seen = {}
  for row, column, seed, flags in jobs:
    key = (row["row"], column)
    if key not in seen:
      with tempfile.TemporaryDirectory() as tmp:
        s = run_one(flags, os.path.join(tmp, "run"), seed, args.runner, 2)
      rounds = args.rounds or default_rounds(row)
      # Training and evaluation of one round (the first includes compilation).
      per_round = (s["total_seconds"] - s["setup_seconds"]) / 2
      seen[key] = s["wall_seconds"] + (rounds - 2) * per_round
      print(f"{row['row']} {column}: {s['wall_seconds']:.1f} s for 2 rounds, "
            f"{per_round:.3f} s/round -> {seen[key] / 60:.1f} min for {rounds} rounds",
            flush=True)
    total += seen[key]
  print(f"projected total: {total / 3600:.2f} h for {len(jobs)} runs "
        f"({total / 3600 / max(args.jobs, 1):.2f} h with {args.jobs} in parallel)")


def default_rounds(row) -> int:
  from tff_cluster import tasks
  name = row["flags"][0].split("=", 1)[1]
  return int(tasks.get_task(name).defaults["rounds"])


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
  main()
