"""Is today's `tff` runner slower than commit f5507fb's? Alternating A/B runs.

One TFF round's time drifts by 15-30 % between processes (the C++ worker's
threads), more than the difference being asked about, so single runs of each
disagree from one session to the next. This script alternates fresh
processes of the old code (f5507fb, exported with `git archive`) and the
current working tree, `--pairs` times, each timing `--rounds` rounds after
`--warmup` (same data, seeds and sampled clients as the training loop), and
reports every process's median seconds per round and the mean over pairs.

  python benchmarks/tff_vs_f5507fb.py --task=synthetic --algorithm=fedavg
  python benchmarks/tff_vs_f5507fb.py --task=femnist --algorithm=fedgroup

Writes one CSV row per process to `--output` (appending).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run inside a child process whose cwd is the code under test.
_CHILD = r"""
import json, os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
spec = json.loads(sys.argv[1])
sys.path.insert(0, os.getcwd())
import numpy as np, tensorflow as tf
tf.get_logger().setLevel("ERROR")
import tasks
from tff_cluster import experiment, runtime
from tff_cluster.task import DataOptions
task = tasks.get_task(spec["task"])
data = task.load_data(DataOptions(**spec["data"]))
kw = dict(rounds=spec["rounds"] + spec["warmup"], clients_per_round=20, local_epochs=10,
          batch_size=10, client_lr=spec["lr"], seed=0)
options = {"num_groups": 5, "pretrain_scale": 20.0} if spec["algorithm"] == "fedgroup" else {}
if spec["which"] == "old":
  import importlib
  module = importlib.import_module("tff_cluster.algorithms." + spec["algorithm"])
  driver = module.make_runner(task, data, experiment.TrainingConfig(**kw), **options)
else:
  from tff_cluster import algorithms
  driver = algorithms.get_algorithm(spec["algorithm"]).make_driver(
      task, data, experiment.TrainingConfig(runner="tff", **kw), **options)
rng = np.random.default_rng(np.random.SeedSequence([0, 7]))
times = []
with runtime.tff_runtime():
  driver.setup()
  for r in range(1, kw["rounds"] + 1):
    sampled = experiment.sample_clients(rng, data.num_clients, 20)
    start = time.perf_counter()
    driver.run_round(r, sampled)
    times.append(time.perf_counter() - start)
print(json.dumps({"median": float(np.median(times[spec["warmup"]:]))}))
"""

SETTINGS = {"synthetic": dict(lr=0.01, data=dict(seed=0, num_clients=100)),
            "femnist": dict(lr=0.003, data=dict(seed=0))}


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--task", choices=sorted(SETTINGS), default="synthetic")
  p.add_argument("--algorithm", choices=("fedavg", "fedgroup"), default="fedavg")
  p.add_argument("--pairs", type=int, default=3)
  p.add_argument("--rounds", type=int, default=12)
  p.add_argument("--warmup", type=int, default=3)
  p.add_argument("--commit", default="f5507fb")
  p.add_argument("--femnist_dir", default="../shared/data/femnist_leaf")
  p.add_argument("--output", default="benchmarks/results/tff_vs_f5507fb.csv")
  args = p.parse_args()
  setting = SETTINGS[args.task]
  data = dict(setting["data"])
  if args.task == "femnist":
    data["data_dir"] = os.path.abspath(os.path.join(REPO_ROOT, args.femnist_dir))
  medians = {"old": [], "new": []}
  with tempfile.TemporaryDirectory() as old_dir:
    archive = subprocess.run(["git", "-C", REPO_ROOT, "archive", args.commit],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", old_dir], input=archive, check=True)
    for pair in range(args.pairs):
      for which, cwd in (("old", old_dir), ("new", REPO_ROOT)):
        spec = dict(which=which, task=args.task, algorithm=args.algorithm, lr=setting["lr"],
                    data=data, rounds=args.rounds, warmup=args.warmup)
        out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(spec)], cwd=cwd,
                             capture_output=True, text=True, check=True)
        median = json.loads(out.stdout.strip().splitlines()[-1])["median"]
        medians[which].append(median)
        print(f"pair {pair + 1} {which:<3} ({args.commit if which == 'old' else 'now'}): "
              f"{median:.3f} s/round", flush=True)
  os.makedirs(os.path.dirname(os.path.join(REPO_ROOT, args.output)), exist_ok=True)
  path = os.path.join(REPO_ROOT, args.output)
  new_file = not os.path.exists(path)
  with open(path, "a", newline="") as f:
    writer = csv.writer(f, lineterminator="\n")
    if new_file:
      writer.writerow(["task", "algorithm", "code", "pair", "median_s_per_round", "rounds"])
    for which in ("old", "new"):
      for i, m in enumerate(medians[which]):
        writer.writerow([args.task, args.algorithm, args.commit if which == "old" else "now",
                         i + 1, f"{m:.4f}", args.rounds])
  old, new = np.mean(medians["old"]), np.mean(medians["new"])
  print(f"{args.task} {args.algorithm}: {args.commit} {old:.3f} s/round, now {new:.3f} "
        f"s/round (mean of {args.pairs} alternating processes); now/{args.commit} = "
        f"{new / old:.2f}")


if __name__ == "__main__":
  main()
