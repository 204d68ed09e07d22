"""One 24-cell sweep three ways on this machine: one cell after another,
`--parallel=2`, and a three-node Ray cluster (a head with no CPUs and two
worker nodes of one CPU each, all on 127.0.0.1); the wall time of each, the
results.csv numbers of the three compared, and the wall time a cluster of H
hosts would take, *projected* from the cells' own times.

  python benchmarks/sweep_speed.py                    # all three (about 20 min on 2 cores)
  python benchmarks/sweep_speed.py --modes=sequential,parallel

The sweep: FedAvg, IFCA, HypCluster and CFL-MGD (K = 3) × seeds 0–2 ×
`synthetic_clusters` and `synthetic`, 10 rounds of 10 clients, evaluated every
5 rounds. Each mode writes its own folder under --out. The cluster runs
inside a network namespace with only loopback (the script re-executes itself
there with `unshare -n`; root only), so Ray reaches no other address.

The projection: each cell's seconds as a process (measured one after another,
nothing beside it) placed longest first on the earliest free of H × `--slots`
slots (LPT scheduling); it leaves out what hosts would share (a file system)
and Ray's start-up, so it is a bound to compare against, not a measurement.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

from tff_cluster.sweep import driver, spec  # noqa: E402  (no TensorFlow)

MODES = ("sequential", "parallel", "cluster")
SPEC = {"algos": ["fedavg", "ifca", "hypcluster", "cfl_mgd"],
        "tasks": ["synthetic_clusters", "synthetic"], "seeds": [0, 1, 2],
        "flags": {"rounds": 10, "clients_per_round": 10, "eval_every": 5},
        "when": [{"algo": ["ifca", "hypcluster", "cfl_mgd"], "flags": {"num_groups": 3}}]}
# results.csv columns that must agree between modes (not the timings)
NUMBERS = ("final_test_accuracy", "final_test_accuracy_clientavg", "ari", "purity",
           "rounds_completed", "mb_per_round")


def run_mode(mode: str, out: str) -> dict:
  """Runs the sweep one way into out/<mode>; its wall time and cells' times."""
  folder = os.path.join(out, mode)
  seconds = {}

  def on_cell(cell, outcome):
    seconds[cell.path] = outcome.seconds

  t0 = time.perf_counter()
  if mode == "cluster":
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
      for _ in range(2):
        cluster.add_node(num_cpus=1)
      cluster.wait_for_nodes()
      t0 = time.perf_counter()  # the cluster's start-up left out
      result = driver.sweep(SPEC, out=folder, ray_address=cluster.address, progress=False,
                            plots=False, on_cell=on_cell)
    finally:
      import ray
      ray.shutdown()
      cluster.shutdown()
  else:
    result = driver.sweep(SPEC, out=folder, parallel=1 if mode == "sequential" else 2,
                          progress=False, plots=False, on_cell=on_cell)
  wall = time.perf_counter() - t0
  if result.failed:
    raise SystemExit(f"{mode}: cells failed: {result.failed}")
  return {"wall_seconds": wall, "cell_seconds": seconds}


def numbers(folder: str) -> dict:
  with open(os.path.join(folder, "results.csv")) as f:
    return {r["run_dir"]: tuple(r[k] for k in NUMBERS) for r in csv.DictReader(f)}


def projected(cell_seconds, hosts: int, slots: int) -> float:
  """LPT: the longest cells first, each on the earliest free slot."""
  free = [0.0] * (hosts * slots)
  for s in sorted(cell_seconds, reverse=True):
    i = free.index(min(free))
    free[i] += s
  return max(free)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--modes", default=",".join(MODES))
  p.add_argument("--out", default=os.path.join(REPO_ROOT, "results", "sweep_speed"))
  p.add_argument("--slots", type=int, default=2, help="cells at a time per projected host")
  args = p.parse_args(argv)
  modes = args.modes.split(",")
  bad = [m for m in modes if m not in MODES]
  if bad:
    raise SystemExit(f"sweep_speed.py: error: unknown mode {bad[0]!r}; valid: {', '.join(MODES)}")
  from tff_cluster.runners import ray_setup
  if "cluster" in modes and not ray_setup.loopback_only():
    # Ray inside a loopback-only namespace: this script again, there.
    inner = [sys.executable, os.path.abspath(__file__), "--modes=cluster", f"--out={args.out}"]
    code = subprocess.call(["unshare", "-n", "sh", "-c",
                            "ip link set lo up && exec \"$@\"", "sh", *inner])
    if code:
      return code
    modes = [m for m in modes if m != "cluster"]
  record_path = os.path.join(args.out, "speed.json")
  record = json.load(open(record_path)) if os.path.exists(record_path) else {}
  for mode in modes:
    if os.path.exists(os.path.join(args.out, mode)):
      raise SystemExit(f"sweep_speed.py: error: {args.out}/{mode} exists; valid: another --out "
                       "(a finished cell would be kept, not timed)")
    record[mode] = run_mode(mode, args.out)
    print(f"{mode}: {record[mode]['wall_seconds']:.1f} s", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(record_path, "w") as f:
      json.dump(record, f, indent=1)
  ran = [m for m in MODES if m in record]
  if len(ran) > 1:
    first = numbers(os.path.join(args.out, ran[0]))
    for m in ran[1:]:
      same = numbers(os.path.join(args.out, m)) == first
      print(f"results.csv numbers of {m} {'equal' if same else 'DIFFER from'} {ran[0]}'s")
  if "sequential" in record and "cluster" not in modes:
    cells = list(record["sequential"]["cell_seconds"].values())
    print(f"{len(cells)} cells, {sum(cells):.1f} s of cell processes one after another; "
          f"projected wall (LPT, {args.slots} cells a host):")
    for hosts in (1, 2, 4, 8, 24):
      print(f"  {hosts:2d} hosts: {projected(cells, hosts, args.slots):7.1f} s")
  return 0


if __name__ == "__main__":
  sys.exit(main())
