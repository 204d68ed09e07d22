"""`FederatedData` <-> `tff.simulation.datasets.ClientData`, both ways.

`to_client_data(ids, split)` gives TFF pipelines a `ClientData` whose
`serializable_dataset_fn` is traceable by TF (TFF 0.87's
`ClientData.from_clients_and_tf_fn` requires it): the clients' arrays are
concatenated once, and a client id (a string tensor inside a `tf.function` or
computation) is mapped to its rows by a static hash table.

`from_client_data(train, test, ...)` materialises any `ClientData` (e.g. TFF's
EMNIST, or one built by `to_client_data`) as a `FederatedData`, reading each
client's dataset once into numpy arrays.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np

from tff_cluster import stack
from tff_cluster.data.federated import Arrays, DataError, FederatedData


def to_client_data(client_ids: Sequence[str], split: Dict[str, Arrays],
                   x_key: str = "x", y_key: str = "y"):
  """A TFF `ClientData` over `split` (client id -> (x, y)); elements
  `{x_key: x_row, y_key: y_row}`, in each client's stored order."""
  stack.require_tff()
  import tensorflow as tf
  import tensorflow_federated as tff

  client_ids = [str(c) for c in client_ids]
  if not client_ids:
    raise DataError("a ClientData needs at least one client")
  missing = [c for c in client_ids if c not in split]
  if missing:
    raise DataError(f"client {missing[0]!r} has no arrays; valid: the ids of the split")
  sizes = np.array([len(split[c][1]) for c in client_ids], np.int64)
  offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
  xs = np.concatenate([np.asarray(split[c][0]) for c in client_ids])
  ys = np.concatenate([np.asarray(split[c][1]) for c in client_ids])
  def dataset_fn(client_id) -> "tf.data.Dataset":
    # Built inside whatever graph calls it (eager, tf.function or TFF).
    table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
        tf.constant(client_ids), tf.range(len(client_ids), dtype=tf.int64)),
        default_value=-1)
    index = table.lookup(tf.convert_to_tensor(client_id, tf.string))
    tf.debugging.assert_non_negative(index, message="unknown client id")
    start = tf.gather(tf.constant(offsets), index)
    size = tf.gather(tf.constant(sizes), index)
    rows = tf.range(start, start + size)
    return tf.data.Dataset.from_tensor_slices({
        x_key: tf.gather(tf.constant(xs), rows), y_key: tf.gather(tf.constant(ys), rows)})

  return tff.simulation.datasets.ClientData.from_clients_and_tf_fn(client_ids, dataset_fn)


def _arrays(dataset, x_key: str, y_key: str, client_id: str) -> Arrays:
  xs, ys = [], []
  for element in dataset.as_numpy_iterator():
    if x_key not in element or y_key not in element:
      raise DataError(f"client {client_id!r}: elements have keys {sorted(element)}; "
                      f"valid: pass x_key/y_key naming the input and label (to "
                      "from_client_data, or to a process's initialize)")
    xs.append(element[x_key])
    ys.append(element[y_key])
  if not xs:
    return np.zeros((0,)), np.zeros((0,), np.int64)
  return np.stack(xs), np.asarray(ys)


def train_client_data(data: FederatedData):
  """`data`'s training data as a TFF `ClientData` (elements `{'x': ..., 'y': ...}`;
  the reverse is `from_client_data`)."""
  return to_client_data(data.client_ids, data.train)


def test_client_data(data: FederatedData):
  """`data`'s test data as a TFF `ClientData` (the same client ids)."""
  return to_client_data(data.client_ids, data.test)


def from_client_data(train, test=None, num_classes: Optional[int] = None,
                     x_key: str = "x", y_key: str = "y",
                     client_ids: Optional[Sequence[str]] = None,
                     flatten: bool = False, description: str = "") -> FederatedData:
  """A `FederatedData` from TFF `ClientData` (train, and test with the same
  ids; without `test` every client's test set is empty).

  Args:
    x_key, y_key: the element keys of inputs and labels (TFF's EMNIST:
      'pixels' and 'label').
    client_ids: a subset, in this order (default: every training client).
    flatten: reshape each input to one vector (e.g. 28 x 28 -> 784).
    num_classes: default 1 + the largest label seen.
  """
  ids = list(client_ids) if client_ids is not None else list(train.client_ids)
  if test is not None:
    absent = sorted(set(ids) - set(test.client_ids))
    if absent:
      raise DataError(f"client {absent[0]!r} has training data but no test data; valid: "
                      "ClientData with the same client ids")
  train_arrays: Dict[str, Arrays] = {}
  test_arrays: Dict[str, Arrays] = {}
  for cid in ids:
    x, y = _arrays(train.create_tf_dataset_for_client(cid), x_key, y_key, cid)
    if test is not None:
      tx, ty = _arrays(test.create_tf_dataset_for_client(cid), x_key, y_key, cid)
    else:
      tx, ty = x[:0], y[:0]
    if flatten:
      x, tx = x.reshape(len(x), -1), tx.reshape(len(tx), -1)
    train_arrays[cid] = (x.astype(np.float32) if x.dtype.kind == "f" else x,
                         y.astype(np.int64))
    test_arrays[cid] = (tx.astype(np.float32) if tx.dtype.kind == "f" else tx,
                        ty.astype(np.int64))
  if num_classes is None:
    labels = [a[1] for a in (*train_arrays.values(), *test_arrays.values()) if len(a[1])]
    num_classes = int(max(int(l.max()) for l in labels)) + 1 if labels else 1
  return FederatedData(ids, train_arrays, test_arrays, num_classes,
                       description=description or f"{len(ids)} clients from a TFF ClientData")
