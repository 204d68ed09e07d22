"""Small databases in TFF's sqlite layout of its image data sets (CIFAR-100,
CelebA), written by the tests: tables `examples` and `client_metadata` as
TFF's `SqlClientData` reads them, each row a `tf.train.Example` whose `image`
is an int64 list of the pixel values 0..255 (row-major, channels last) and
whose labels are int64 scalars, as TFF's parsers of cifar100.sqlite and
celeba.sqlite expect them."""

from __future__ import annotations

import sqlite3
from typing import Dict, Mapping, Sequence

import numpy as np

from tff_cluster.data import tff_sqlite

# TFF's attribute names of federated CelebA (tff.simulation.datasets.celeba).
CELEBA_ATTRIBUTES = (
    "five_o_clock_shadow", "arched_eyebrows", "attractive", "bags_under_eyes", "bald",
    "bangs", "big_lips", "big_nose", "black_hair", "blond_hair", "blurry", "brown_hair",
    "bushy_eyebrows", "chubby", "double_chin", "eyeglasses", "goatee", "gray_hair",
    "heavy_makeup", "high_cheekbones", "male", "mouth_slightly_open", "mustache",
    "narrow_eyes", "no_beard", "oval_face", "pale_skin", "pointy_nose",
    "receding_hairline", "rosy_cheeks", "sideburns", "smiling", "straight_hair",
    "wavy_hair", "wearing_earrings", "wearing_hat", "wearing_lipstick",
    "wearing_necklace", "wearing_necktie", "young")


def example(image: np.ndarray, scalars: Mapping[str, int]) -> bytes:
  import tensorflow as tf
  feature = {"image": tf.train.Feature(int64_list=tf.train.Int64List(
      value=np.asarray(image, np.int64).reshape(-1).tolist()))}
  for name, value in scalars.items():
    feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))
  return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_database(path, splits: Mapping[str, Mapping[str, Sequence]], seed: int = 0,
                   metadata_counts: Mapping = None) -> None:
  """`splits`: split name -> client id -> list of (uint8 image, {label: value}).
  Rows are inserted with the clients and splits interleaved at random (each
  client's own rows in order), as nothing in TFF's layout keeps a client's
  rows together. `metadata_counts` (split -> client -> n) overrides
  `client_metadata`'s counts."""
  rng = np.random.default_rng(seed)
  con = sqlite3.connect(str(path))
  tff_sqlite.create_tables(con)
  queues: Dict[tuple, list] = {(split, cid): list(items)
                               for split, clients in splits.items()
                               for cid, items in clients.items()}
  while any(queues.values()):
    live = [key for key, q in queues.items() if q]
    split, cid = live[rng.integers(len(live))]
    image, scalars = queues[(split, cid)].pop(0)
    con.execute("INSERT INTO examples VALUES (?, ?, ?)", (split, cid, example(image, scalars)))
  for split, clients in splits.items():
    for cid, items in clients.items():
      n = len(items) if metadata_counts is None else metadata_counts[split][cid]
      con.execute("INSERT INTO client_metadata VALUES (?, ?, ?)", (cid, split, n))
  con.commit()
  con.close()


def images(rng: np.random.Generator, n: int, shape) -> np.ndarray:
  """n uint8 images with 0 and 255 among their pixels."""
  x = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
  x.reshape(n, -1)[:, 0] = 0
  x.reshape(n, -1)[:, 1] = 255
  return x
