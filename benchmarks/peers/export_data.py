"""Dumps one benchmark setting's client arrays, as tff-cluster builds them, for
the peer frameworks (run by `benchmarks/peers.py` under tff-cluster's own
Python, with the checkout on PYTHONPATH).

Writes into --out (a temp folder the harness owns):
  x_train.npy   float32, the exported clients' training rows, one after another
  y_train.npy   int32
  offsets.npy   int64 [clients + 1]: client i's rows are offsets[i]:offsets[i+1]
  client_ids.json  the exported clients' ids (tff-cluster's), in that order
  schedule.npy  int64 [rounds, clients_per_round]: round r's clients, as
                indices into the exported clients
  x_test.npy, y_test.npy  every client's test rows pooled (what tff-cluster's
                evaluation scores: one global model on all clients' test data)
  data.json     counts, shapes, classes, the data's description

The schedule is tff-cluster's own: the `client_sampling` stream of --seed and
the training loop's `sample_clients`, so every framework trains the same
clients in the same rounds as `run_experiment.py --seed=S` does. Only clients
that some round samples are exported (pfl's CIFAR-10 setting has 1,000 users;
6 rounds of 50 touch at most 300 of them).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--task", required=True)
  parser.add_argument("--data_dir", required=True)
  parser.add_argument("--seed", type=int, required=True)
  parser.add_argument("--rounds", type=int, required=True)
  parser.add_argument("--clients_per_round", type=int, required=True)
  parser.add_argument("--out", required=True)
  args = parser.parse_args()

  # Imported here: the library is only needed once the arguments are good.
  from tff_cluster import seeds
  from tff_cluster.host.driver import sample_clients
  from tff_cluster.spec.task import DataOptions
  from tff_cluster.tasks import get_task

  data = get_task(args.task).load_data(DataOptions(seed=args.seed, data_dir=args.data_dir))
  rng = seeds.generator(args.seed, "client_sampling")
  trainable = data.training_clients()
  rounds = [sample_clients(rng, trainable, args.clients_per_round)
            for _ in range(args.rounds)]
  used = sorted({int(c) for r in rounds for c in r})
  position = {c: i for i, c in enumerate(used)}
  schedule = np.array([[position[int(c)] for c in r] for r in rounds], dtype=np.int64)

  ids = [data.client_ids[c] for c in used]
  xs = [np.asarray(data.train[cid][0], dtype=np.float32) for cid in ids]
  ys = [np.asarray(data.train[cid][1]).astype(np.int32) for cid in ids]
  offsets = np.concatenate([[0], np.cumsum([len(y) for y in ys])]).astype(np.int64)
  tests = [data.test[cid] for cid in data.client_ids if len(data.test[cid][1])]
  x_test = np.concatenate([np.asarray(x, dtype=np.float32) for x, _ in tests])
  y_test = np.concatenate([np.asarray(y).astype(np.int32) for _, y in tests])

  os.makedirs(args.out, exist_ok=True)
  for name, array in (("x_train", np.concatenate(xs)), ("y_train", np.concatenate(ys)),
                      ("offsets", offsets), ("schedule", schedule),
                      ("x_test", x_test), ("y_test", y_test)):
    np.save(os.path.join(args.out, f"{name}.npy"), array)
  with open(os.path.join(args.out, "client_ids.json"), "w") as f:
    json.dump(ids, f)
  info = {"task": args.task, "seed": args.seed, "num_classes": int(data.num_classes),
          "input_shape": list(xs[0].shape[1:]), "clients_total": len(data.client_ids),
          "clients_exported": len(ids), "train_rows": int(offsets[-1]),
          "test_rows": int(len(y_test)), "rounds": args.rounds,
          "clients_per_round": args.clients_per_round, "description": data.description}
  with open(os.path.join(args.out, "data.json"), "w") as f:
    json.dump(info, f, indent=1)
  print(json.dumps(info))


if __name__ == "__main__":
  main()
