"""Sweeps: a grid of runs (algorithms × tasks × seeds × option values) in one
command, on this machine or a Ray cluster, with one table at the end.

    python -m tff_cluster.sweep examples/sweep.toml --parallel=2
    python -m tff_cluster.sweep --algos=fedavg,ifca --tasks=synthetic_clusters \\
        --seeds=0,1 --flag=rounds=30 --grid=client_lr=0.01,0.03 --out=results/lr
    tff_cluster.api.sweep("examples/sweep.toml", parallel=2)

The sweep file (`spec`) names the grid; each cell is an ordinary run
directory under the sweep's folder (`TASK/ALGO[/NAME=VALUE,...]/seedS`), so
every reader, plot and `--resume` works on it. `sweep.json` records the
cells, so running the same sweep again finishes what is unfinished (a
completed cell is kept, an interrupted one resumes from its checkpoints) and
another sweep into the folder is refused; `.sweep.lock` is held while a sweep
runs there. At the end: results.csv, table.md, curves_<task>.png
(`report`). docs/sweeps.md is the guide; `driver.sweep` (also `tff_cluster.api.sweep`)
runs one.
"""
