"""`python -m tff_cluster.sweep [SPEC] [flags]`: runs a sweep (docs/sweeps.md).

Exit status: 0 when every cell finished (a run the divergence guard stopped
is a result), 1 when a cell failed (each named in one line; the others ran),
2 for a bad sweep file, flag or folder (one line, nothing run), 128 + the
signal's number when a stop signal ended it (run it again to finish).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from tff_cluster.runners.ray_setup import RayUnavailable
from tff_cluster.sweep import driver as sweeps
from tff_cluster.sweep import execute, report, spec

PROG = "python -m tff_cluster.sweep"


class _Parser(argparse.ArgumentParser):
  def error(self, message):
    print(f"{PROG}: error: {message} (see --help)", file=sys.stderr)
    sys.exit(2)


def parser() -> argparse.ArgumentParser:
  p = _Parser(prog=PROG, description="Runs a grid of experiments (algorithms x tasks x "
              "seeds x option values) and writes results.csv, table.md and the curves of "
              "each task. The grid comes from a sweep file (TOML; docs/sweeps.md), from "
              "the flags below, or both (the flags win).")
  p.add_argument("spec", nargs="?", help="the sweep file (TOML)")
  p.add_argument("--algos", default="", help="comma-separated --algo values")
  p.add_argument("--tasks", default="", help="comma-separated --task values")
  p.add_argument("--seeds", default="", help="comma-separated seeds")
  p.add_argument("--flag", action="append", default=[], metavar="NAME=VALUE",
                 help="a run_experiment.py flag of every cell (repeatable)")
  p.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2",
                 help="one more axis of the grid: a flag and its values (repeatable)")
  p.add_argument("--out", default=None, help="the sweep's folder (default: the file's out)")
  p.add_argument("--parallel", type=int, default=1,
                 help="cells run at a time on this machine, each its own process (default 1)")
  p.add_argument("--ray_address", default=None, metavar="HOST:PORT",
                 help="run each cell as a Ray task on this cluster (its folder on storage "
                      "every node sees)")
  p.add_argument("--cpus_per_cell", type=float, default=1.0,
                 help="Ray: CPUs a cell asks for (default 1)")
  p.add_argument("--gpus_per_cell", type=float, default=0.0,
                 help="Ray: GPUs a cell asks for (default 0)")
  p.add_argument("--retries", type=int, default=3,
                 help="Ray: times a cell whose node is lost is run again (default 3)")
  p.add_argument("--progress", default="true", choices=("true", "false"),
                 help="draw the sweep's progress bar (default true)")
  p.add_argument("--dry_run", action="store_true", help="list the cells and stop")
  p.add_argument("--report_only", action="store_true",
                 help="write results.csv, table.md and the curves from the runs there")
  return p


def main(argv: Optional[Sequence[str]] = None) -> int:
  args = parser().parse_args(argv)
  try:
    data = spec.read_toml(args.spec) if args.spec else {}
    data = spec.merge(data, spec.from_flags(args.algos, args.tasks, args.seeds, args.flag,
                                            args.grid))
    the_sweep = sweeps.resolve(spec.from_dict(data, source=args.spec or "flags"))
    if args.dry_run:
      out = args.out or the_sweep.out or "OUT"
      for cell in the_sweep.cells:
        print(f"{os.path.join(out, cell.path)}: {' '.join(cell.argv())}")
      print(f"{len(the_sweep.cells)} cells")
      return 0
    if args.report_only:
      out = args.out or the_sweep.out
      if not out or not os.path.isdir(out):
        raise spec.SpecError(f"--report_only: no sweep folder {out!r}; valid: --out=FOLDER of "
                             "a sweep")
      report.write(the_sweep, out, sweeps.recorded_failures(out))
      print(f"{os.path.join(out, report.RESULTS_CSV)}, {report.TABLE_MD}", file=sys.stderr)
      return 0
    result = sweeps.sweep(the_sweep, out=args.out, parallel=args.parallel,
                          ray_address=args.ray_address, cpus_per_cell=args.cpus_per_cell,
                          gpus_per_cell=args.gpus_per_cell, retries=args.retries,
                          progress=args.progress == "true")
  except spec.SpecError as e:
    print(f"{PROG}: error: {e}", file=sys.stderr)
    return 2
  except execute.Stopped as e:
    print(f"{PROG}: stopped by {e}; the finished cells are kept and the running ones "
          "resume from their checkpoints: run the same command again to finish",
          file=sys.stderr)
    return 128 + e.signum
  except Exception as e:  # noqa: BLE001 - Ray's connection errors, among others
    if isinstance(e, RayUnavailable):
      print(f"{PROG}: error: {e}", file=sys.stderr)
      return 2
    raise
  for path, message in result.failed.items():
    print(f"FAILED {path}: {message} (log: {os.path.join(result.out, path, 'output.log')})",
          file=sys.stderr)
  done = sum(r["status"] in ("done", "diverged") for r in result.rows)
  print(f"{done}/{len(result.rows)} cells finished; {os.path.join(result.out, 'table.md')}",
        file=sys.stderr)
  return 1 if result.failed else 0


if __name__ == "__main__":
  sys.exit(main())
