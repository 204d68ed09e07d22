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

The cells (each task's cut, each algorithm's flags, the cells left out) are
the sweep file benchmarks/sweeps/clustered_catalogue.toml; this script runs
them with `tff_cluster.sweep` and scores them into
benchmarks/recorded/clustered_catalogue.csv:

  python benchmarks/clustered_catalogue.py --project            # time 4 rounds per cell
  python benchmarks/clustered_catalogue.py --dry_run            # list the cells and their flags
  python benchmarks/clustered_catalogue.py --tasks=synthetic_clusters --seeds=0,1,2
  python benchmarks/clustered_catalogue.py --record --skip_recorded --parallel=2
  python benchmarks/clustered_catalogue.py --table_only --record
  python benchmarks/clustered_catalogue.py --paper_rows --record   # the per-paper rows
  python -m tff_cluster.sweep benchmarks/sweeps/clustered_catalogue.toml --parallel=2
                                       # the same cells, no recording (from the repository root)
Each run is `python -m tff_cluster` in its own directory under `--out`
(TASK/ALGO/seedS, a sweep's folder) with checkpoints; a finished run is
reused and an interrupted one resumes.
"""

from __future__ import annotations

import os
from typing import Dict, Optional

import numpy as np

import _cells
from _cells import one_point_round  # noqa: F401  (the cut's rule, tested here)
from _sweep import (completed_summary, load_recorded, mean_std, median_round_seconds,
                    save_markdown, save_recorded, truncated)
from tff_cluster.io import rundir  # (_sweep put the repository on sys.path)

NAME = "clustered_catalogue"  # benchmarks/sweeps/NAME.toml, benchmarks/recorded/NAME.csv
SCRIPT = "clustered_catalogue.py"


def fedsoft_k(data: dict) -> dict:
  """FedSoft's K (clients per cluster) in a sweep file's keys: the round's
  clients over the task's clusters (the rule the file's values follow), so
  that it follows --clients_per_round."""
  for w in data.get("when", []):
    if "fedsoft_k" in w.get("flags", {}):
      flags = _cells.flags_of(data, "fedsoft", w["task"])
      w["flags"]["fedsoft_k"] = max(1, flags["clients_per_round"] // flags["num_groups"])
  return data


# The cells (each task's cut, the flags of each algorithm, the cells left
# out, evaluation): benchmarks/sweeps/clustered_catalogue.toml.
PARTS = [_cells.part(NAME, adjust=fedsoft_k)]
TASKS = {task: _cells.task_cut(PARTS[0].data, task) for task in PARTS[0].data["tasks"]}
ALGOS = tuple(PARTS[0].data["algos"])
# Mixture methods: each client predicts with its own mixture weights, so the
# test-only clients, never trained, keep the initial ones.
MIXTURE = ("fedem", "fedrc", "hcflplus")


def rotated_note(algo: str) -> str:
  """How `rotated_mnist`'s test-only clients (which hold all its test data)
  are tested by `algo`."""
  if algo == "fedavg":
    return ""
  if algo in MIXTURE:
    return ("test-only clients predict with the initial uniform mixture (never trained, their "
            "weights never estimated): not comparable with the rows that choose by test loss")
  return "test-only clients choose by their own test loss (IFCA's protocol)"
# The per-paper rows (the one setting of a new algorithm's paper or code that
# fits offline, beside the number its authors published where one could be
# read): benchmarks/sweeps/clustered_catalogue_papers.toml, a row per
# algorithm there.
PAPERS = _cells.part(f"{NAME}_papers")
PAPER_ROWS = {  # label: (its algorithm, the README's number, in %)
    "fedem_femnist": ("fedem", 79.9),
    "fedavg_femnist": ("fedavg", 78.6),
}
PAPER_NOTE = "not comparable: 51-writer LEAF sample, MLP, 90/10 split"
PAPER_FIELDS = ("row", "seed", "rounds", "accuracy", "accuracy_clientavg", "paper",
                "seconds_per_round", "note")
RECORD_KEY = ("algo", "task", "seed")
RECORD_FIELDS = RECORD_KEY + ("rounds", "accuracy", "accuracy_clientavg", "ari", "purity",
                              "bytes_per_round", "seconds_per_round", "note")


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
  p = _cells.parser(__doc__.splitlines()[0], TASKS, ALGOS, NAME)
  p.add_argument("--paper_rows", action="store_true",
                 help="run the per-paper rows (PAPER_ROWS); with --record, record them")
  args = p.parse_args(argv)
  _cells.check_names(SCRIPT, args, TASKS, ALGOS)
  if args.markdown:
    return save_markdown(args.markdown, markdown())
  if args.paper_rows:
    return paper_rows(args)
  if args.converge:
    return _cells.converge(SCRIPT, PARTS, args)
  if args.project:
    return _cells.project(SCRIPT, PARTS, args)
  save = lambda rows: save_recorded(NAME, rows, RECORD_KEY, RECORD_FIELDS)  # noqa: E731
  records = _cells.run_cells(
      SCRIPT, PARTS, args, score,
      note=lambda algo, task: rotated_note(algo) if task == "rotated_mnist" else "",
      record=save if args.record else None,
      recorded=_cells.recorded_cells(NAME) if args.skip_recorded else frozenset())
  if args.record and records:
    save(records)


def markdown() -> str:
  """The recorded table, one block per task: mean ± std over the recorded seeds
  (percent for accuracies and purity; ARI as a fraction), bytes per round in
  MB, and the median seconds per round beside FedAvg's on the task."""
  num = _cells.number

  def cells(mine):
    ari = [num(r, "ari") for r in mine if num(r, "ari") is not None]
    ari_cell = (truncated(np.mean(ari), 2) + (f" ± {truncated(np.std(ari, ddof=1), 2)}"
                                              if len(ari) > 1 else "")) if ari else "–"
    return [mean_std([num(r, "accuracy") for r in mine]),
            mean_std([num(r, "accuracy_clientavg") for r in mine]), ari_cell,
            mean_std([num(r, "purity") for r in mine], digits=1)]

  out = _cells.task_blocks(load_recorded(NAME), TASKS, ALGOS,
                           ["accuracy %", "client-avg %", "ARI", "purity %"], cells)
  papers = load_recorded("clustered_catalogue_papers")
  if papers:
    out += ["**Per-paper rows**", "", "| row | seeds | rounds | ours: accuracy % | client-avg % "
            "| README % | s/round | note |", "|---|---|---|---|---|---|---|---|"]
    for label in PAPER_ROWS:
      mine = [r for r in papers if r["row"] == label]
      if mine:
        out.append(
            f"| `{label}` | {','.join(r['seed'] for r in mine)} | {mine[0]['rounds']} "
            f"| {mean_std([num(r, 'accuracy') for r in mine])} "
            f"| {mean_std([num(r, 'accuracy_clientavg') for r in mine])} | {mine[0]['paper']} "
            f"| {truncated(np.median([num(r, 'seconds_per_round') for r in mine]), 2)} "
            f"| {mine[0]['note']} |")
    out.append("")
  return "\n".join(out)


def paper_rows(args):
  """Runs the per-paper rows into OUT_papers (a sweep's folder beside the
  table's), each seed of each row; with --record, records them."""
  from tff_cluster.sweep import spec
  from tff_cluster.sweep.driver import sweep
  the_sweep = spec.from_dict(PAPERS.data, source=_cells.sweep_file(PAPERS.stem))
  out = f"{args.out}_papers"
  if args.dry_run:
    return print("\n".join(f"{os.path.join(out, c.path)}: {' '.join(c.argv())}"
                            for c in the_sweep.cells))
  if not args.table_only:
    try:
      sweep(the_sweep, out=out, parallel=args.parallel, progress=False, plots=False)
    except spec.SpecError as e:
      raise SystemExit(f"{SCRIPT}: error: {e}") from None
  records = []
  for row, (algo, paper) in PAPER_ROWS.items():
    for cell in [c for c in the_sweep.cells if c.algo == algo]:
      got = score(os.path.join(out, cell.path))
      print(f"{row} seed {cell.seed}: {got} (README: {paper})", flush=True)
      if got is not None:
        records.append({"row": row, "seed": cell.seed, "paper": paper, **got,
                        "note": PAPER_NOTE})
  if args.record and records:
    save_recorded("clustered_catalogue_papers", records, ("row", "seed"), PAPER_FIELDS)


if __name__ == "__main__":
  main()
