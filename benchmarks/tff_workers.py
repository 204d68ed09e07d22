"""Seconds per round of the `tff` runner on 1, 2, 4 TFF workers of this host.

FedAvg on `femnist_fedprox` (MLP 784-512-26, 415,258 parameters; LEAF FEMNIST
from --data_dir), 20 clients per round, 1 local epoch, batch 10, lr 0.003,
seed 0; the median of rounds 2..R. "1 worker (own)" is the runtime's own
worker (no mergeable context); the others are `--tff_workers` started here by
`tff_cluster.runners.tff.workers.local_workers`. All workers share this machine's cores:
on 2 cores this shows what splitting a round costs, not what more hosts gain.

The workers listen on every interface: the script re-executes itself in a
loopback-only network namespace (`unshare -n`; root only).

  python benchmarks/tff_workers.py --workers=1,2,4 --rounds=4
"""

from __future__ import annotations

import argparse
import csv
import os
import shlex
import shutil
import statistics
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
ISOLATED_ENV = "TFF_CLUSTER_TFF_ISOLATED"


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--workers", default="1,2,4")
  p.add_argument("--rounds", type=int, default=4)
  p.add_argument("--data_dir", default=os.path.join(os.path.dirname(REPO_ROOT), "shared",
                                                    "data", "femnist_leaf"))
  p.add_argument("--out", default=os.path.join(REPO_ROOT, "benchmarks", "results",
                                               "tff_workers.csv"))
  return p.parse_args(argv)


def measure(args, addresses):
  import numpy as np
  from tff_cluster import tasks
  from tff_cluster import registry
  from tff_cluster.host.driver import TrainingConfig, sample_clients
  from tff_cluster.runners.config import RunnerConfig
  from tff_cluster.runners.tff import runtime
  from tff_cluster.spec.task import DataOptions
  task = tasks.get_task("femnist_fedprox")
  data = task.load_data(DataOptions(seed=0, data_dir=os.path.abspath(args.data_dir)))
  config = TrainingConfig(
      rounds=args.rounds, clients_per_round=20, local_epochs=1, batch_size=10,
      client_lr=0.003, seed=0,
      runner=RunnerConfig("tff",
                          tff_workers=None if addresses is None else ",".join(addresses)))
  driver = registry.build_driver("fedavg", task, data, config)
  driver.setup()
  rng = np.random.default_rng(np.random.SeedSequence([0, 7]))
  seconds = []
  import time
  for r in range(1, args.rounds + 1):
    sampled = sample_clients(rng, data.num_clients, 20)
    t0 = time.perf_counter()
    driver.run_round(r, sampled)
    seconds.append(time.perf_counter() - t0)
    print(f"  {len(addresses or [0])} workers round {r}: {seconds[-1]:.2f} s", file=sys.stderr,
          flush=True)
  runtime.use_own_worker()
  return statistics.median(seconds[1:]), driver.model_weights()


def main(argv=None):
  args = parse_args(argv)
  from tff_cluster.runners.ray_runner import loopback_only
  if not loopback_only():
    if os.environ.get(ISOLATED_ENV):
      sys.exit("tff_workers.py: re-executed, yet not in a loopback-only namespace")
    if os.geteuid() != 0 or shutil.which("unshare") is None:
      sys.exit("tff_workers.py: a loopback-only network namespace is needed (root, unshare)")
    inner = " ".join([f"exec {sys.executable}", *map(shlex.quote, sys.argv)])
    return subprocess.call(["unshare", "-n", "sh", "-c", f"ip link set lo up && {inner}"],
                           env=dict(os.environ, **{ISOLATED_ENV: "1"}))
  import numpy as np
  from tff_cluster.runners.tff import workers
  counts = [int(w) for w in args.workers.split(",")]
  rows = []
  reference, ref_weights = measure(args, None)
  rows.append({"workers": "1 (own)", "median_s_per_round": reference, "max_abs_diff": 0.0})
  with workers.local_workers(max(counts)) as addresses:
    for k in counts:
      seconds, weights = measure(args, addresses[:k])
      diff = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                 for a, b in zip(weights, ref_weights))
      rows.append({"workers": k, "median_s_per_round": seconds, "max_abs_diff": diff})
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=("workers", "median_s_per_round", "max_abs_diff"))
    writer.writeheader()
    for row in rows:
      writer.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in row.items()})
  print("| TFF workers | s/round (median) | max |w - w(own worker)| |")
  print("|---|---:|---:|")
  for row in rows:
    print(f"| {row['workers']} | {row['median_s_per_round']:.2f} | {row['max_abs_diff']:.2g} |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
