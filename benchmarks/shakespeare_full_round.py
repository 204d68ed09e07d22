"""FedAvg on federated Shakespeare's full layout (715 roles), measured on synthetic text.

TFF's `shakespeare.sqlite` (715 roles, 16,068 train and 2,356 test snippets by
TFF's documentation) is what `--task=shakespeare` fetches without
`--data_dir`. Where it cannot be fetched, this script builds a database in its
layout (`tff_cluster.data.shakespeare`: tables `examples` and
`client_metadata`, one `snippets` bytes feature per Example, splits `train` and
`test`) of those counts: each role's snippet count drawn lognormal (seeded),
at least one per split, scaled to TFF's totals; snippet lengths lognormal,
scaled to `--chars` characters in all (TFF publishes no character count: 4
million is this script's assumption, about the dialogue of the plays); the
text random characters of TFF's vocabulary. The accuracies mean nothing; the
sizes, and so the times and memory, are of that layout. It then runs

    run_experiment.py --algo=fedavg --task=shakespeare --data_dir=<db> --rounds=R

at the task's defaults (10 roles per round, one epoch, batch 4, the
char-LSTM 8-256-256-90) under `/usr/bin/time -v`, and prints one JSON line:
roles, training and test sequences, the database's size, the data load, each
round's training and evaluation seconds (metrics.csv) and the run's peak
resident memory.

  python benchmarks/shakespeare_full_round.py --work /tmp/shakespeare_full --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import subprocess
import sys

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from tff_cluster.data import shakespeare, tff_sqlite  # noqa: E402
from tff_cluster.io import rundir  # noqa: E402

TFF_ROLES, TFF_TRAIN, TFF_TEST = 715, 16_068, 2_356


def _scaled(weights, total, low=1):
  """Integers >= low proportional to `weights` that sum to `total`."""
  exact = np.asarray(weights, float) * (total - low * len(weights)) / np.sum(weights)
  out = np.floor(exact).astype(int)
  for i in np.argsort(exact - out)[::-1][:total - low * len(weights) - out.sum()]:
    out[i] += 1
  return out + low


def _snippet_proto(text: bytes) -> bytes:
  import tensorflow as tf
  return tf.train.Example(features=tf.train.Features(feature={
      "snippets": tf.train.Feature(bytes_list=tf.train.BytesList(value=[text]))})
  ).SerializeToString()


def write_database(path, roles=TFF_ROLES, train=TFF_TRAIN, test=TFF_TEST,
                   chars=4_000_000, seed=0):
  """A TFF-layout database of `roles` roles, `train` / `test` snippets and
  `chars` characters (module docstring)."""
  rng = np.random.default_rng(seed)
  size = rng.lognormal(0.0, 1.2, roles)
  counts = {"train": _scaled(size, train), "test": _scaled(size, test)}
  lengths = _scaled(rng.lognormal(0.0, 1.0, train + test), chars)
  alphabet = np.frombuffer(shakespeare.CHAR_VOCAB.encode("ascii"), np.uint8)
  con = sqlite3.connect(path)
  con.execute("PRAGMA journal_mode = OFF")
  con.execute("PRAGMA synchronous = OFF")
  tff_sqlite.create_tables(con)
  k = 0
  for split in ("train", "test"):
    for r in range(roles):
      cid = f"PLAY_{r // 20:02d}_ROLE_{r:03d}"
      n = int(counts[split][r])
      rows = []
      for _ in range(n):
        rows.append((split, cid, _snippet_proto(
            alphabet[rng.integers(0, len(alphabet), lengths[k])].tobytes())))
        k += 1
      con.executemany("INSERT INTO examples VALUES (?, ?, ?)", rows)
      con.execute("INSERT INTO client_metadata VALUES (?, ?, ?)", (cid, split, n))
  con.commit()
  con.close()


def run(db, out, rounds, extra):
  """One CLI run under /usr/bin/time -v; its sizes, times and peak memory."""
  cmd = ["/usr/bin/time", "-v", sys.executable, os.path.join(REPO_ROOT, "run_experiment.py"),
         "--algo=fedavg", "--task=shakespeare", f"--data_dir={db}", f"--rounds={rounds}",
         f"--output_dir={out}", "--overwrite", "--noprogress", *extra]
  done = subprocess.run(cmd, check=True, cwd=REPO_ROOT, stderr=subprocess.PIPE, text=True)
  peak_kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1))
  config = rundir.read_config(out)
  rows = rundir.read_metrics(out)[1]
  return dict(roles=config["num_clients_loaded"], train=config["num_train_samples"],
              test=config["num_test_samples"], data_seconds=round(config["data_seconds"], 1),
              round_seconds=[round(float(r["round_seconds"]), 2) for r in rows],
              eval_seconds=[round(float(r["eval_seconds"]), 2) for r in rows],
              test_accuracy=[round(float(r["test_accuracy"]), 4) for r in rows],
              peak_rss_mib=round(peak_kib / 1024), flags=extra)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--work", required=True, help="folder for the database and the run")
  p.add_argument("--chars", type=int, default=4_000_000,
                 help="characters in all snippets (default 4,000,000)")
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("extra", nargs="*", help="further run_experiment.py flags")
  args = p.parse_args()
  os.makedirs(args.work, exist_ok=True)
  db = os.path.join(args.work, f"shakespeare_{TFF_ROLES}_{args.chars}.sqlite")
  if not os.path.isfile(db):
    write_database(db + ".part", chars=args.chars)
    os.replace(db + ".part", db)
  result = run(db, os.path.join(args.work, "run"), args.rounds, args.extra)
  print(json.dumps({"database_bytes": os.path.getsize(db), "chars": args.chars, **result}),
        flush=True)


if __name__ == "__main__":
  main()
