"""IFCA's start on rotated MNIST, 10 seeds per start: how often the four rotations are recovered.

The protocol (one for every row): `rotated_mnist` with 20 training clients and
10 test-only clients per rotation (`--task_arg=clients_per_cluster=20
--task_arg=test_clients_per_cluster=10`: 80 training clients), the task's MLP
784-200-10, 20 clients a round, 10 full-batch steps at lr 0.1 (the task's
defaults), K = 4, 50 rounds, seeds 0-9, evaluated at the last round only. The
starts:

  ifca random keras   K independent draws of Keras's initializers (Glorot
                      kernels, zero biases): our default
  ifca random torch   K draws of PyTorch's default nn.Linear start (kernels and
                      biases uniform in +-1/sqrt(fan_in)): the authors'
                      rotated-MNIST code (jichan3751/ifca 61e44b8,
                      mnist/train_cluster_mnist.py `setup_models`), which has
                      no restarts
  ifca good_init torch  the authors' CIFAR check (redraw until every cluster
                      gets 10 % of a client sample) over the torch draws
  hypcluster          FedJAX's k-means++-by-loss start (`kmeans_loss`),
                      scored as FedJAX's evaluator (train-loss argmin)

A seed "recovers" the rotations when the final assignment's ARI against the
true rotations is 1. Test-only clients choose their model by their own test
loss (IFCA's protocol for its test machines); the training clients' scores
are on their assignments.

  python benchmarks/ifca_start.py                 # run (or reuse) every cell, record, table
  python benchmarks/ifca_start.py --seeds=0,1     # some seeds
  python benchmarks/ifca_start.py --table_only

Each run takes about 35 s on one core here (20 s of rounds, the rest start-up);
the 40 runs about 25 minutes.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List

import numpy as np

from _sweep import (SHARED, load_recorded, median_round_seconds, run_one, save_markdown,
                    save_recorded)

NAME = "ifca_start"
PROTOCOL = ["--task=rotated_mnist", "--task_arg=clients_per_cluster=20",
            "--task_arg=test_clients_per_cluster=10", "--num_groups=4",
            "--clients_per_round=20", "--rounds=50", "--eval_every=1000",
            f"--data_dir={os.path.join(SHARED, 'mnist')}"]
STARTS: Dict[str, List[str]] = {
    "ifca random keras": ["--algo=ifca"],
    "ifca random torch": ["--algo=ifca", "--ifca_init_dist=torch"],
    "ifca good_init torch": ["--algo=ifca", "--ifca_init=good_init", "--ifca_init_dist=torch"],
    "hypcluster": ["--algo=hypcluster"],
}
FIELDS = ("start", "seed", "rounds", "accuracy", "ari", "purity", "clusters_used",
          "seconds_per_round")


def score(start: str, seed: int, directory: str, summary: dict) -> Dict[str, object]:
  final = summary.get("final_assignment") or summary.get("last_training_cluster") or {}
  used = len(set(int(g) for g in final.values() if int(g) >= 0)) if final else ""
  return dict(start=start, seed=seed, rounds=50, accuracy=summary["final_test_accuracy"],
              ari=summary.get("ari", ""), purity=summary.get("purity", ""),
              clusters_used=used, seconds_per_round=round(median_round_seconds(directory), 3))


def table(rows) -> str:
  lines = ["| start | recovered (ARI 1) | mean ARI | mean final accuracy | min / max accuracy |"
           " seeds |", "|---|---|---|---|---|---|"]
  for start in STARTS:
    mine = [r for r in rows if r["start"] == start]
    if not mine:
      continue
    ari = np.array([float(r["ari"]) for r in mine])
    acc = np.array([float(r["accuracy"]) for r in mine])
    lines.append(f"| {start} | {int((ari > 1 - 1e-9).sum())} of {len(mine)} | {ari.mean():.3f} | "
                 f"{acc.mean():.4f} | {acc.min():.4f} / {acc.max():.4f} | "
                 f"{','.join(sorted((r['seed'] for r in mine), key=int))} |")
  return "\n".join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--seeds", default="0,1,2,3,4,5,6,7,8,9")
  parser.add_argument("--starts", default=",".join(STARTS))
  parser.add_argument("--out", default="results/ifca_start")
  parser.add_argument("--table_only", action="store_true")
  args = parser.parse_args(argv)
  starts = [s for s in args.starts.split(",") if s]
  unknown = [s for s in starts if s not in STARTS]
  if unknown:
    print(f"error: unknown --starts {unknown}; valid: {', '.join(STARTS)}", file=sys.stderr)
    return 2
  if not args.table_only:
    for start in starts:
      for seed in [int(s) for s in args.seeds.split(",") if s]:
        directory = os.path.join(args.out, start.replace(" ", "_"), f"seed{seed}")
        summary = run_one(PROTOCOL + STARTS[start], directory, seed, "local", 50)
        save_recorded(NAME, [score(start, seed, directory, summary)], ("start", "seed"), FIELDS)
        print(f"{start} seed {seed}: accuracy {summary['final_test_accuracy']:.4f} "
              f"ARI {summary.get('ari')}", flush=True)
  text = table(load_recorded(NAME))
  save_markdown(os.path.join("benchmarks", "results", NAME), text)
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
