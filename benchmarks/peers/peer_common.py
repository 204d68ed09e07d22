"""What the peer scripts (`pfl_run.py`, `flower_run.py`) share: reading the
run's spec and the arrays `export_data.py` wrote, the two models, the
evaluation rule, and the JSON lines the harness (`benchmarks/peers.py`) reads.

Imports numpy only at module level; the Keras module is passed in (pfl runs
tf_keras, Keras 2; Flower runs TensorFlow's Keras 3), so this file works in
either peer environment.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Dict, List, Tuple

import numpy as np

PREFIX = "PEERS_JSON "


def emit(event: str, **fields: Any) -> None:
  """One line the harness parses (stdout, flushed at once)."""
  line = json.dumps({"event": event, **fields},
                    default=lambda v: v.item() if hasattr(v, "item") else str(v))
  sys.stdout.write(PREFIX + line + "\n")
  sys.stdout.flush()


def load_spec(path: str) -> Dict[str, Any]:
  with open(path) as f:
    return json.load(f)


class Arrays:
  """The exported clients (memory-mapped, so every process that opens them
  shares the pages) and the pooled test set."""

  def __init__(self, folder: str, with_test: bool = True):
    self.folder = folder
    self.x = np.load(os.path.join(folder, "x_train.npy"), mmap_mode="r")
    self.y = np.load(os.path.join(folder, "y_train.npy"), mmap_mode="r")
    self.offsets = np.load(os.path.join(folder, "offsets.npy"))
    self.schedule = np.load(os.path.join(folder, "schedule.npy"))
    with open(os.path.join(folder, "client_ids.json")) as f:
      self.client_ids: List[str] = json.load(f)
    if with_test:
      self.x_test = np.load(os.path.join(folder, "x_test.npy"))
      self.y_test = np.load(os.path.join(folder, "y_test.npy"))

  @property
  def num_clients(self) -> int:
    return len(self.client_ids)

  def client(self, i: int) -> Tuple[np.ndarray, np.ndarray]:
    """Client i's training arrays (in-memory copies)."""
    lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
    return np.array(self.x[lo:hi]), np.array(self.y[lo:hi])


def build_model(keras, spec: Dict[str, Any]):
  """The setting's model in `keras` (tf_keras or Keras 3), logits out: the
  same layers as tff-cluster's `models.mlp` / `models.simple_cnn`."""
  layers = keras.layers
  shape = tuple(spec["input_shape"])
  classes = int(spec["num_classes"])
  inputs = keras.Input(shape=shape, dtype="float32")
  if spec["model"] == "mlp":
    h = inputs if len(shape) == 1 else layers.Flatten()(inputs)
    h = layers.Dense(512, activation="relu")(h)
  elif spec["model"] == "simple_cnn":
    h = layers.Conv2D(32, 3, activation="relu")(inputs)
    h = layers.Conv2D(64, 3, activation="relu")(h)
    h = layers.MaxPooling2D(2)(h)
    h = layers.Dropout(0.25)(h)
    h = layers.Flatten()(h)
    h = layers.Dense(128, activation="relu")(h)
    h = layers.Dropout(0.5)(h)
  else:
    raise ValueError(f"unknown model {spec['model']!r}")
  return keras.Model(inputs, layers.Dense(classes)(h))


def evaluates_after(round_num: int, spec: Dict[str, Any]) -> bool:
  """tff-cluster's rule: every `eval_every` rounds, and the last."""
  return round_num % int(spec["eval_every"]) == 0 or round_num == int(spec["rounds"])


def shuffled(x: np.ndarray, y: np.ndarray, seed: int) -> Tuple[np.ndarray, np.ndarray]:
  order = np.random.default_rng(seed).permutation(len(y))
  return x[order], y[order]


def round_seed(spec: Dict[str, Any], round_num: int, client: int) -> int:
  return int(np.random.SeedSequence([int(spec["seed"]), round_num, client])
             .generate_state(1)[0] & 0x7FFFFFFF)


class Stopwatch:
  def __init__(self):
    self.start = time.perf_counter()

  def seconds(self) -> float:
    return time.perf_counter() - self.start


def _read_cifar_batch(path: str) -> Tuple[np.ndarray, np.ndarray]:
  import pickle
  with open(path, "rb") as f:
    batch = pickle.load(f, encoding="bytes")
  x = np.asarray(batch[b"data"], np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
  return x, np.asarray(batch[b"labels"], np.int64)


def prepare_cifar10_users(folder: str, seed: int, users: int = 1000, per_user: int = 50
                          ) -> Dict[str, Any]:
  """The data preparation of pfl-research's CIFAR-10 setting, done in the
  peer's own process from CIFAR-10's python batches (`folder`): pixels to
  [0, 1], every channel standardised by the training images' mean and
  standard deviation, the training images shuffled once with `seed` and cut
  into `users` blocks of `per_user`, the test images standardised alike. The
  numpy steps tff-cluster's `cifar10_pfl` task takes, so the users equal the
  exported ones (`check_users` says so); its seconds are the peer's, as they
  are ours."""
  parts = [_read_cifar_batch(os.path.join(folder, f"data_batch_{i}")) for i in range(1, 6)]
  x_train = np.concatenate([p[0] for p in parts])
  y_train = np.concatenate([p[1] for p in parts])
  x_test, y_test = _read_cifar_batch(os.path.join(folder, "test_batch"))
  x_train = x_train.astype(np.float32)
  np.divide(x_train, np.float32(255.0), out=x_train)
  x_test = x_test.astype(np.float32)
  np.divide(x_test, np.float32(255.0), out=x_test)
  mean = x_train.mean(axis=(0, 1, 2), dtype=np.float64)
  std = x_train.std(axis=(0, 1, 2), dtype=np.float64)
  order = np.random.default_rng(seed).permutation(len(y_train))[:users * per_user]
  blocks = [order[u * per_user:(u + 1) * per_user] for u in range(users)]
  return {"users": [(((x_train[b] - mean) / std).astype(np.float32), y_train[b].astype(np.int32))
                    for b in blocks],
          "test": (((x_test - mean) / std).astype(np.float32), y_test.astype(np.int32))}


def check_users(prepared: Dict[str, Any], arrays: "Arrays") -> None:
  """Raises unless the peer's own users equal the exported ones (by id)."""
  for i, cid in enumerate(arrays.client_ids):
    x, y = prepared["users"][int(cid.split("_")[-1])]
    ex, ey = arrays.client(i)
    if not (np.array_equal(x, ex) and np.array_equal(y, ey)):
      raise SystemExit(f"the peer's own CIFAR-10 user {cid} differs from the exported one")
