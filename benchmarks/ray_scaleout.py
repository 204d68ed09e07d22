"""Seconds per round of the `ray` runner for 1, 2, ... actors, beside `local`.

Times `driver.run_round` (the sampled clients' training, the partial sums'
addition and the server update; no evaluation) for `--rounds_timed` rounds
after `--warmup` rounds (XLA compilation, actor start-up), the same clients
for every configuration, seed 0, and each actor's own training time in the
round (`per-shard s`). The difference between a round and its slowest shard
is what Ray and the driver add (`overhead s`): putting the state in the
object store, the calls, the clients' results coming back, the server update.

Projection to H hosts (one actor each), from the 1-actor run's measured
numbers: the round's training divided by H (the sampled clients spread
over the shards; a round's slowest shard takes longer than that when the
clients fall unevenly) plus the 2-actor run's overhead. A projection, not a
measurement: the table says which is which.

On this machine (no --ray_address) every Ray process runs inside a network
namespace with only loopback (the script re-executes itself under
`unshare -n` when it is not in one; root only), so Ray talks over 127.0.0.1
alone. On a cluster: start it (docs/runners.md), then

  python benchmarks/ray_scaleout.py --ray_address=HEAD:6379 --workers=1,2,4,8

Settings (`--task`): synthetic (Synthetic(1,1), 100 clients, MCLR, 20
clients per round, 10 local epochs, batch 10, lr 0.01) or femnist (51 LEAF
writers, MLP 784-512-62, lr 0.003; `--femnist_dir`); the algorithm is
`--algo` (default fedavg).

  python benchmarks/ray_scaleout.py --task=synthetic --workers=1,2
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))

ISOLATED_ENV = "TFF_CLUSTER_RAY_ISOLATED"


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--task", default="synthetic", choices=("synthetic", "femnist"))
  p.add_argument("--algo", default="fedavg")
  p.add_argument("--workers", default="1,2", help="comma-separated actor counts")
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument("--rounds_timed", type=int, default=5)
  p.add_argument("--project_hosts", default="2,4,8,16")
  p.add_argument("--ray_address", default=None)
  p.add_argument("--femnist_dir", default=os.path.join(os.path.dirname(REPO_ROOT), "shared",
                                                       "data", "femnist_leaf"))
  p.add_argument("--out", default=os.path.join(REPO_ROOT, "benchmarks", "results",
                                               "ray_scaleout.csv"))
  return p.parse_args(argv)


def reexec_isolated() -> int:
  """Runs this script again inside a loopback-only network namespace."""
  if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
    sys.exit("ray_scaleout.py: a loopback-only network namespace is needed on this machine "
             "(root and `unshare`, `ip`); or give --ray_address of a cluster")
  inner = " ".join([f"exec {sys.executable}", *map(_quote, sys.argv)])
  env = dict(os.environ, **{ISOLATED_ENV: "1"})
  return subprocess.call(["unshare", "-n", "sh", "-c", f"ip link set lo up && {inner}"],
                         env=env)


def _quote(text: str) -> str:
  import shlex
  return shlex.quote(text)


def measure(args, runner: str, workers=None):
  """Per-round seconds (and per-shard seconds for ray) over the timed rounds."""
  import numpy as np
  from runner_speed import CLIENTS_PER_ROUND, SEED, TASK_SETTINGS
  from tff_cluster import tasks
  from tff_cluster import registry
  from tff_cluster.host.driver import TrainingConfig, sample_clients
  from tff_cluster.runners.config import RunnerConfig
  from tff_cluster.spec.task import DataOptions
  setting = TASK_SETTINGS[args.task]
  options = dict(seed=SEED)
  if setting["num_clients"]:
    options["num_clients"] = setting["num_clients"]
  if args.task == "femnist":
    options["data_dir"] = os.path.abspath(args.femnist_dir)
  task = tasks.get_task(args.task)
  data = task.load_data(DataOptions(**options))
  rounds = args.warmup + args.rounds_timed
  config = TrainingConfig(
      rounds=rounds, clients_per_round=CLIENTS_PER_ROUND, local_epochs=10,
      batch_size=10, client_lr=setting["lr"], seed=SEED,
      runner=RunnerConfig(runner, ray_workers=workers,
                          ray_address=args.ray_address if runner == "ray" else None))
  driver = registry.build_driver(args.algo, task, data, config)
  driver.setup()
  rng = np.random.default_rng(np.random.SeedSequence([SEED, 7]))
  seconds, shard_max, shard_sum = [], [], []
  for r in range(1, rounds + 1):
    sampled = sample_clients(rng, data.num_clients, CLIENTS_PER_ROUND)
    t0 = time.perf_counter()
    driver.run_round(r, sampled)
    elapsed = time.perf_counter() - t0
    if r > args.warmup:
      seconds.append(elapsed)
      shards = getattr(driver.runner, "last_shard_seconds", None)
      if shards:
        shard_max.append(max(shards.values()))
        shard_sum.append(sum(shards.values()))
    print(f"  {runner}{'' if workers is None else f' x{workers}'} round {r}: {elapsed:.3f} s",
          file=sys.stderr, flush=True)
  info = driver.describe()
  if runner == "ray":
    driver.runner.close()
  out = {"median_s": statistics.median(seconds)}
  if shard_max:
    out["slowest_shard_s"] = statistics.median(shard_max)
    out["all_shards_s"] = statistics.median(shard_sum)
    out["overhead_s"] = statistics.median(s - m for s, m in zip(seconds, shard_max))
    out["hosts"] = sorted({a["host"] for a in info["actors"]})
  return out


def main(argv=None):
  args = parse_args(argv)
  from tff_cluster.runners.ray_runner import loopback_only
  if args.ray_address is None and not loopback_only():
    if os.environ.get(ISOLATED_ENV):
      sys.exit("ray_scaleout.py: re-executed, yet not in a loopback-only namespace")
    return reexec_isolated()
  from tff_cluster import stack
  stack.import_tensorflow()
  import ray
  from tff_cluster.runners import ray_runner
  rows = []
  local = measure(args, "local")
  rows.append(dict(task=args.task, algo=args.algo, runner="local", workers="", kind="measured",
                   median_s_per_round=local["median_s"]))
  if args.ray_address is None:
    ray.init(**ray_runner.init_kwargs(num_cpus=max(int(w) for w in args.workers.split(","))))
  measured = {}
  for w in (int(x) for x in args.workers.split(",")):
    got = measure(args, "ray", w)
    measured[w] = got
    rows.append(dict(task=args.task, algo=args.algo, runner="ray", workers=w, kind="measured",
                     median_s_per_round=got["median_s"], slowest_shard_s=got["slowest_shard_s"],
                     all_shards_s=got["all_shards_s"], overhead_s=got["overhead_s"],
                     hosts=len(got["hosts"])))
  if 1 in measured:
    overhead = measured[max(measured)]["overhead_s"]
    work = measured[1]["all_shards_s"]
    for h in (int(x) for x in args.project_hosts.split(",")):
      rows.append(dict(task=args.task, algo=args.algo, runner="ray", workers=h,
                       kind="projected", median_s_per_round=work / h + overhead,
                       slowest_shard_s=work / h, overhead_s=overhead, hosts=h))
  ray_runner.shutdown()
  if ray.is_initialized():
    ray.shutdown()
  fields = ("task", "algo", "runner", "workers", "hosts", "kind", "median_s_per_round",
            "slowest_shard_s", "all_shards_s", "overhead_s")
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=fields)
    writer.writeheader()
    for row in rows:
      writer.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in row.items()})
  print(f"| runner | actors | kind | s/round | slowest shard s | overhead s |")
  print("|---|---:|---|---:|---:|---:|")
  for row in rows:
    cell = lambda k: "" if row.get(k) in (None, "") else (  # noqa: E731
        f"{row[k]:.3f}" if isinstance(row[k], float) else str(row[k]))
    print(f"| {row['runner']} | {cell('workers')} | {row['kind']} | {cell('median_s_per_round')}"
          f" | {cell('slowest_shard_s')} | {cell('overhead_s')} |")
  print(f"wrote {args.out}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
