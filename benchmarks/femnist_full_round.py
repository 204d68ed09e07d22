"""FedGroup on federated EMNIST's full layout (3,400 writers), measured on the LEAF sample scaled.

TFF's `emnist_all.sqlite` (3,400 writers, 671,585 training and 77,483 test
images by TFF's documentation) is what `--task=femnist` fetches without
`--data_dir`. Where it cannot be fetched, this script builds a database in its
layout (`tff_cluster.data.emnist`) from LEAF FEMNIST JSON: writer k of
`--writers` takes source writer k mod S's images, drawn with replacement
(seeded) in that writer's proportions, scaled so that the totals are TFF's.
The images repeat, so the accuracies mean nothing; the sizes, and so the
times, are the full data's. It then runs

    run_experiment.py --algo=fedgroup --task=femnist --data_dir=<db> --rounds=R

at the task's defaults (20 writers per round, E = 20, batch 10, MLP
784-512-62), on the scaled database and on the unscaled sample, and prints one
JSON line per run: writers, training images, the data load, the group cold
start, the mean round and evaluation seconds (config.json, summary.json,
metrics.csv) and the process's peak resident memory (getrusage).

  python benchmarks/femnist_full_round.py --leaf_dir ../shared/data/femnist_leaf \\
      --work /tmp/femnist_full --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from tff_cluster.data import leaf, tff_sqlite  # noqa: E402
from tff_cluster.io import rundir  # noqa: E402

TFF_WRITERS, TFF_TRAIN, TFF_TEST = 3400, 671_585, 77_483  # all_train / all_test


def _example(x, y) -> bytes:
  import tensorflow as tf
  return tf.train.Example(features=tf.train.Features(feature={
      "pixels": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
      "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(y)]))}
  )).SerializeToString()


def _sizes(source_sizes, total, writers):
  """Per-writer sizes proportional to their sources' that sum to `total`."""
  raw = np.asarray([source_sizes[k % len(source_sizes)] for k in range(writers)], float)
  exact = raw * total / raw.sum()
  sizes = np.maximum(np.floor(exact).astype(int), 1)
  for i in np.argsort(exact - np.floor(exact))[::-1][:total - sizes.sum()]:
    sizes[i] += 1
  return sizes


def write_database(path, train, test, writers, totals, seed=0):
  """A TFF-layout database (all_train / all_test) of `writers` writers."""
  ids = sorted(train)
  rng = np.random.default_rng(seed)
  con = sqlite3.connect(path)
  con.execute("PRAGMA journal_mode = OFF")
  con.execute("PRAGMA synchronous = OFF")
  tff_sqlite.create_tables(con)
  for split, data, total in (("all_train", train, totals[0]), ("all_test", test, totals[1])):
    protos = {cid: [_example(x, y) for x, y in zip(*data[cid])] for cid in ids}
    sizes = _sizes([len(protos[c]) for c in ids], total, writers)
    for k in range(writers):
      source = protos[ids[k % len(ids)]]
      picks = (np.arange(len(source)) if writers == len(ids) else
               rng.integers(0, len(source), sizes[k]))
      cid = f"w{k:04d}"
      con.executemany("INSERT INTO examples VALUES (?, ?, ?)",
                      ((split, cid, source[i]) for i in picks))
      con.execute("INSERT INTO client_metadata VALUES (?, ?, ?)", (cid, split, int(sizes[k])))
  con.commit()
  con.close()


# Runs a command as its child and prints the child's peak resident size (kB):
# each run's own peak, not the largest of every run so far.
_PEAK = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
         "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def run(db, out, rounds, extra):
  """One CLI run; its times and its peak resident memory."""
  cmd = [sys.executable, os.path.join(REPO_ROOT, "run_experiment.py"), "--algo=fedgroup",
         "--task=femnist", f"--data_dir={db}", f"--rounds={rounds}", f"--output_dir={out}",
         "--overwrite", "--noprogress", *extra]
  done = subprocess.run([sys.executable, "-c", _PEAK, *cmd], check=True, cwd=REPO_ROOT,
                        stdout=subprocess.PIPE, text=True)
  peak_kb = int(done.stdout.strip().splitlines()[-1])
  config = rundir.read_config(out)
  summary = rundir.read_summary(out) or {}
  rows = rundir.read_metrics(out)[1]
  return dict(writers=config["num_clients_loaded"], train=config["num_train_samples"],
              test=config["num_test_samples"], data_seconds=round(config["data_seconds"], 1),
              setup_seconds=round(summary.get("setup_seconds", float("nan")), 1),
              round_seconds=[round(float(r["round_seconds"]), 2) for r in rows],
              eval_seconds=[round(float(r["eval_seconds"]), 2) for r in rows],
              peak_resident_gb=round(peak_kb * 1024 / 1e9, 2), flags=extra)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--leaf_dir", default=os.path.join(REPO_ROOT, "..", "shared", "data",
                                                    "femnist_leaf"))
  p.add_argument("--work", required=True, help="folder for the databases and runs")
  p.add_argument("--writers", type=int, default=TFF_WRITERS)
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("--only", choices=("sample", "scaled", "both"), default="both")
  p.add_argument("extra", nargs="*", help="further run_experiment.py flags")
  args = p.parse_args()
  os.makedirs(args.work, exist_ok=True)
  train_raw, test_raw = leaf.read_leaf(args.leaf_dir)
  parse = leaf.dense_parser(leaf.IMAGE_PIXELS, leaf.FEMNIST_NUM_CLASSES)
  train = {u: parse(u, *xy) for u, xy in train_raw.items()}
  test = {u: parse(u, *xy) for u, xy in test_raw.items()}
  layouts = {"sample": (len(train), (sum(len(v[1]) for v in train.values()),
                                     sum(len(v[1]) for v in test.values()))),
             "scaled": (args.writers, (round(TFF_TRAIN * args.writers / TFF_WRITERS),
                                       round(TFF_TEST * args.writers / TFF_WRITERS)))}
  for name in (("sample", "scaled") if args.only == "both" else (args.only,)):
    writers, totals = layouts[name]
    db = os.path.join(args.work, f"{name}_{writers}.sqlite")
    if not os.path.isfile(db):
      write_database(db + ".part", train, test, writers, totals)
      os.replace(db + ".part", db)
    result = run(db, os.path.join(args.work, f"run_{name}"), args.rounds, args.extra)
    print(json.dumps({"layout": name, **result}), flush=True)


if __name__ == "__main__":
  main()
