"""A round of `cifar100_tff` or `celeba` on TFF's layout at full size, from random pixels.

TFF's `cifar100.sqlite` (500 training clients x 100 images, 100 test clients
x 100) and `celeba.sqlite` (split_by_examples: 9,343 celebrities, 177,457 /
22,831 images) are what the tasks fetch. Where they cannot be fetched, this
script writes a database in their layout (`tff_cluster.data.tff_sqlite`) with
the full numbers of clients and images, each image random bytes stored as
TFF stores it (an int64 list of the pixel values, row-major, in a
`tf.train.Example`, serialized here by a vectorized encoder checked against
TensorFlow's), then runs

    run_experiment.py --algo=fedavg --task=<task> --data_dir=<db> --rounds=R

at the task's defaults (other flags after `--`) under `/usr/bin/time` and
prints one JSON line: clients, images, the file's size, the data load, each
round's training and evaluation seconds (metrics.csv) and the run's peak
resident memory. The pixels are noise, so the accuracies mean nothing; the
sizes, and so the times and the memory, are the full data's.

CelebA's celebrity sizes are drawn uniformly from 5..35 (LEAF keeps
celebrities with at least 5 images; CelebA has at most 35 per identity) and
scaled to TFF's totals, each celebrity's test share TFF's overall one
(22,831 of 200,288). Its split_by_clients group, which the task's default
does not read, is written as one image per split (TFF's file holds it in
full: the reader's SQL skips those rows without reading their images).

  python benchmarks/tff_sqlite_full_round.py --task cifar100_tff --work /tmp/tff_full
  python benchmarks/tff_sqlite_full_round.py --task celeba --work /tmp/tff_full -- --eval_every=1
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import time

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from tff_cluster.data import tff_sqlite  # noqa: E402
from tff_cluster.io import rundir  # noqa: E402

CELEBA_TRAIN, CELEBA_TEST, CELEBA_CLIENTS = 177_457, 22_831, 9_343
ATTRIBUTES = 40  # CelebA's binary attributes; `smiling` is the label


def _varint(n: int) -> bytes:
  out = bytearray()
  while True:
    byte = n & 0x7F
    n >>= 7
    if n:
      out.append(byte | 0x80)
    else:
      out.append(byte)
      return bytes(out)


def _field(number: int, payload: bytes) -> bytes:  # a length-delimited field
  return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _scalar(name: str, value: int) -> bytes:
  # A map entry {key: name, value: Feature{int64_list{value: [value]}}}.
  feature = _field(3, _field(1, _varint(value)))
  return _field(1, _field(1, name.encode()) + _field(2, feature))


def encode_examples(images: np.ndarray, scalars) -> list:
  """Serialized `tf.train.Example`s: `image` the int64 list of each uint8
  image's values, and the int64 scalars `scalars` (name -> [n] values)."""
  n = len(images)
  flat = images.reshape(n, -1)
  high = flat >= 128  # two-byte varints
  length = flat.shape[1] + high.sum(axis=1)
  tails = [b"".join(_scalar(name, int(values[i])) for name, values in scalars.items())
           for i in range(n)]
  out = []
  for i in range(n):
    v = flat[i]
    body = np.empty(int(length[i]), np.uint8)
    pos = np.arange(len(v)) + np.concatenate([[0], np.cumsum(high[i])[:-1]])
    body[pos] = np.where(high[i], (v & 0x7F) | 0x80, v)
    body[pos[high[i]] + 1] = 1  # v >> 7 for 128..255
    packed = _field(1, body.tobytes())  # Int64List, packed
    image = _field(1, _field(1, b"image") + _field(2, _field(3, packed)))
    out.append(_field(1, image + tails[i]))
  return out


def check_encoder() -> None:
  """The encoder's bytes parse to what TensorFlow's own serialization does."""
  import tensorflow as tf
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (3, 4, 5, 3), dtype=np.uint8)
  labels = {"label": np.array([0, 99, 200]), "coarse_label": np.array([0, 19, 3])}
  spec = {"image": tf.io.FixedLenFeature((4, 5, 3), tf.int64),
          "label": tf.io.FixedLenFeature((), tf.int64),
          "coarse_label": tf.io.FixedLenFeature((), tf.int64)}
  ours = tf.io.parse_example(encode_examples(images, labels), spec)
  theirs = [tf.train.Example(features=tf.train.Features(feature={
      "image": tf.train.Feature(int64_list=tf.train.Int64List(value=images[i].ravel())),
      **{k: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v[i])]))
         for k, v in labels.items()}})).SerializeToString() for i in range(3)]
  theirs = tf.io.parse_example(theirs, spec)
  for key in spec:
    np.testing.assert_array_equal(ours[key].numpy(), theirs[key].numpy())
  np.testing.assert_array_equal(ours["image"].numpy(), images)


def _sizes(raw, total):
  """Integer sizes proportional to `raw`, at least 1, summing to `total`."""
  exact = np.asarray(raw, float) * total / np.sum(raw)
  sizes = np.maximum(np.floor(exact).astype(int), 1)
  order = np.argsort(exact - np.floor(exact))[::-1]
  sizes[order[:total - sizes.sum()]] += 1
  return sizes


def layout(task: str, seed: int = 0):
  """[(split, client id, images)] of the full data set, and the image shape."""
  rng = np.random.default_rng(seed)
  if task == "cifar100_tff":
    return ([("train", str(c), 100) for c in range(500)] +
            [("test", str(c), 100) for c in range(100)]), (32, 32, 3)
  total = _sizes(rng.integers(5, 36, CELEBA_CLIENTS), CELEBA_TRAIN + CELEBA_TEST)
  test = _sizes(total, CELEBA_TEST)
  test = np.minimum(test, total - 1)
  test[np.argsort(total - test)[::-1][:CELEBA_TEST - test.sum()]] += 1
  ids = [str(k + 1) for k in range(CELEBA_CLIENTS)]
  rows = [("split_by_examples_train", c, int(n - t)) for c, n, t in zip(ids, total, test)]
  rows += [("split_by_examples_test", c, int(t)) for c, t in zip(ids, test)]
  rows += [("split_by_clients_train", ids[0], 1), ("split_by_clients_test", ids[1], 1)]
  return rows, (84, 84, 3)


def write_database(path: str, task: str, seed: int = 0) -> None:
  rows, shape = layout(task, seed)
  rng = np.random.default_rng(seed + 1)
  con = sqlite3.connect(path)
  con.execute("PRAGMA journal_mode = OFF")
  con.execute("PRAGMA synchronous = OFF")
  tff_sqlite.create_tables(con)
  for split, cid, n in rows:
    images = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
    if task == "cifar100_tff":
      fine = rng.integers(0, 100, n)
      scalars = {"coarse_label": fine // 5, "label": fine}
    else:
      scalars = {f"attribute_{k:02d}": rng.integers(0, 2, n) for k in range(ATTRIBUTES - 1)}
      scalars["smiling"] = rng.integers(0, 2, n)
    con.executemany("INSERT INTO examples VALUES (?, ?, ?)",
                    ((split, cid, blob) for blob in encode_examples(images, scalars)))
    con.execute("INSERT INTO client_metadata VALUES (?, ?, ?)", (cid, split, n))
  con.commit()
  con.close()


def run(task: str, db: str, out: str, rounds: int, extra) -> dict:
  """One CLI run under /usr/bin/time; its times and peak memory."""
  cmd = ["/usr/bin/time", "-f", "%M %e", sys.executable,
         os.path.join(REPO_ROOT, "run_experiment.py"), "--algo=fedavg", f"--task={task}",
         f"--data_dir={db}", f"--rounds={rounds}", f"--output_dir={out}", "--overwrite",
         "--noprogress", *extra]
  done = subprocess.run(cmd, cwd=REPO_ROOT, stderr=subprocess.PIPE, text=True)
  last = done.stderr.strip().splitlines()[-1]
  if done.returncode != 0:
    raise SystemExit(f"the run failed (exit {done.returncode}): {done.stderr[-2000:]}")
  peak_kb, wall = last.split()
  config = rundir.read_config(out)
  rows = rundir.read_metrics(out)[1]
  return dict(clients=config["num_clients_loaded"], train=config["num_train_samples"],
              test=config["num_test_samples"], data_seconds=round(config["data_seconds"], 1),
              round_seconds=[round(float(r["round_seconds"]), 1) for r in rows],
              eval_seconds=[round(float(r["eval_seconds"]), 1) for r in rows
                            if r.get("eval_seconds") not in (None, "")],
              wall_seconds=float(wall), peak_rss_gb=round(int(peak_kb) / 2**20, 2),
              flags=list(extra))


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--task", choices=("cifar100_tff", "celeba"), required=True)
  p.add_argument("--work", required=True, help="folder for the database and the run")
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("extra", nargs="*", help="further run_experiment.py flags (after --)")
  args = p.parse_args()
  os.makedirs(args.work, exist_ok=True)
  check_encoder()
  db = os.path.join(args.work, f"{args.task}_full.sqlite")
  if not os.path.isfile(db):
    start = time.perf_counter()
    write_database(db + ".part", args.task)
    os.replace(db + ".part", db)
    print(f"wrote {db} in {time.perf_counter() - start:.0f} s", file=sys.stderr)
  result = run(args.task, db, os.path.join(args.work, f"run_{args.task}"), args.rounds,
               args.extra)
  print(json.dumps({"task": args.task, "db_gb": round(os.path.getsize(db) / 1e9, 2),
                    **result}), flush=True)


if __name__ == "__main__":
  main()
