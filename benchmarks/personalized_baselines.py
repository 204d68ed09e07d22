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
  python benchmarks/personalized_baselines.py --dry_run           # list the cells and their flags
  python benchmarks/personalized_baselines.py --record --skip_recorded --parallel=2
  python benchmarks/personalized_baselines.py --table_only --record
  python -m tff_cluster.sweep benchmarks/sweeps/personalized_baselines.toml --parallel=2
                                       # the same cells, no recording (from the repository root)
The cells are sweep files: benchmarks/sweeps/personalized_baselines.toml
(the three tasks) and personalized_baselines_<setting>.toml (each paper's
setting, its rows named by the setting). Each run is `python -m tff_cluster`
in its own directory under `--out` (TASK/ALGO/seedS, a sweep's folder; a
setting's under OUT_<setting>/) with checkpoints; a finished run is reused
and an interrupted one resumes.
"""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np

import _cells
from _sweep import (diverged_cell, is_diverged, load_recorded, mean_std,
                    median_round_seconds, run_rounds, save_markdown, save_recorded, truncated)
from tff_cluster.io import rundir  # (_sweep put the repository on sys.path)

NAME = "personalized_baselines"  # benchmarks/sweeps/NAME*.toml, recorded/NAME.csv, results/NAME/
SCRIPT = "personalized_baselines.py"
# The cells: benchmarks/sweeps/personalized_baselines.toml (the three tasks:
# each task's cut, the flags of each algorithm, the cells left out) and, for
# each paper's setting (the spec's section 18 that fits offline: each
# paper's closest task here, its hyper-parameters, its method beside FedAvg),
# personalized_baselines_<setting>.toml, whose rows are named by the setting
# (the same task runs with other flags in the table or in another setting).
SETTINGS = ("pfedme_mnist", "pfedme_synthetic", "lg_mnist", "ditto_fmnist", "fedrep_sent140")
PARTS = [_cells.part(NAME)] + [_cells.part(f"{NAME}_{s}", label=s) for s in SETTINGS]
# Each row's cut: clients per round, rounds, eval_every, seeds (a setting's
# also its task and algorithms).
TASKS = {label: _cells.task_cut(p.data, label) if p.label is None else dict(
    _cells.task_cut(p.data, p.data["tasks"][0]), task=p.data["tasks"][0],
    algos=tuple(p.data["algos"])) for p in PARTS for label in p.labels()}
ALGOS = tuple(PARTS[0].data["algos"])
EVAL_EVERY = 5  # FedAvg's evaluation in --converge
RECORD_KEY = ("algo", "task", "seed")
SCORES = ("accuracy", "accuracy_clientavg", "accuracy_client_mean", "accuracy_p10",
          "accuracy_p50", "accuracy_p90")
RECORD_FIELDS = RECORD_KEY + ("rounds", *SCORES, "bytes_per_round", "seconds_per_round",
                              "diverged_round")


def score(directory: str) -> Optional[Dict[str, object]]:
  """The record of a finished run: its final round's scores, or, for a run
  the divergence guard stopped, the round it diverged in and no scores (None
  if it has not finished)."""
  summary = rundir.read_summary(directory) or {}
  diverged = is_diverged(summary)
  if not summary.get("completed") and not diverged:
    return None
  _, rows = rundir.read_metrics(directory)
  last = rows[-1]
  moved = [float(r["bytes_down"]) + float(r["bytes_up"]) for r in rows]

  def value(key):
    return "" if diverged or last.get(key) in (None, "") else float(last[key])

  return {"rounds": run_rounds(directory) if diverged else int(last["round"]),
          **{s: value(s.replace("accuracy", "test_accuracy", 1)) for s in SCORES},
          "bytes_per_round": int(np.mean(moved)),
          "seconds_per_round": truncated(median_round_seconds(directory), 3),
          "diverged_round": summary["diverged_round"] if diverged else ""}


def main(argv=None):
  p = _cells.parser(__doc__.splitlines()[0], TASKS, ALGOS, NAME)
  args = p.parse_args(argv)
  _cells.check_names(SCRIPT, args, TASKS, ALGOS)
  if args.markdown:
    return save_markdown(args.markdown, markdown())
  if args.converge:
    return _cells.converge(SCRIPT, PARTS, args, [f"--eval_every={EVAL_EVERY}"])
  if args.project:
    return _cells.project(SCRIPT, PARTS, args)
  save = lambda rows: save_recorded(NAME, rows, RECORD_KEY, RECORD_FIELDS)  # noqa: E731
  records = _cells.run_cells(SCRIPT, PARTS, args, score, record=save if args.record else None,
                             recorded=_cells.recorded_cells(NAME) if args.skip_recorded
                             else frozenset())
  if args.record and records:
    save(records)


def markdown() -> str:
  """The recorded table, one block per task: mean ± std over the recorded
  seeds (percent), MB a round, the median seconds of a round beside FedAvg's."""
  def cells(mine):
    """Mean ± std over the seeds that finished; the seeds the divergence
    guard stopped are named in the first cell."""
    ok = [r for r in mine if not r.get("diverged_round")]
    out = [mean_std([_cells.number(r, s) for r in ok]) for s in SCORES]
    stopped = [int(r["diverged_round"]) for r in mine if r.get("diverged_round")]
    if stopped:
      said = diverged_cell(stopped, len(mine))
      out[0] = said if not ok else f"{out[0]} ({said})"
    return out

  out = _cells.task_blocks(load_recorded(NAME), TASKS, ALGOS,
                           ["accuracy %", "client-avg %", "client mean %", "p10 %", "p50 %",
                            "p90 %"], cells)
  return "\n".join(out)


if __name__ == "__main__":
  main()
