"""8-bit image codes (`tff_cluster.data.compact`): the same float32 values, a
quarter of the memory, through the readers, the local runner and evaluation."""

import json
import os
import pickle
import sqlite3

import numpy as np
import pytest
import tensorflow as tf

from tff_cluster import models
from tff_cluster.data import compact, emnist, leaf, tff_sqlite
from tff_cluster.data.federated import FederatedData
from tff_cluster.learning import schedule
from tff_cluster.learning.evaluation import Evaluator

LEAF_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data",
                        "femnist_leaf")


def test_the_table_is_k_over_255_by_every_route():
  k = np.arange(256)
  # float32(k) / float32(255), correctly rounded in float32 arithmetic
  assert np.array_equal(compact.UNIT.view(np.uint32),
                        (k.astype(np.float32) / np.float32(255)).view(np.uint32))
  # a decimal JSON number of the double k/255 (LEAF's files) read as float32
  parsed = np.asarray(json.loads(json.dumps([float(v) / 255.0 for v in k])), np.float32)
  assert np.array_equal(compact.UNIT.view(np.uint32), parsed.view(np.uint32))
  assert np.all(np.diff(compact.UNIT) > 0)


def test_encode_is_exact_or_nothing():
  rng = np.random.default_rng(0)
  codes = rng.integers(0, 256, (50, 784)).astype(np.uint8)
  x = compact.UNIT[codes]
  coded = compact.encode(x)
  assert coded is not None and coded.codes.dtype == np.uint8
  assert np.array_equal(coded.codes, codes)
  assert np.array_equal(np.asarray(coded).view(np.uint32), x.view(np.uint32))
  assert coded.nbytes * 4 == x.nbytes
  for bad in (np.float32(0.5), np.float32(-0.0), np.float32(np.nan), np.float32(1.5)):
    y = x.copy()
    y[3, 7] = bad
    assert compact.encode(y) is None, bad
    assert compact.compact(y) is y
  assert compact.encode(x.astype(np.float64)) is None


def test_indexing_pickling_and_concatenation_stay_coded():
  codes = np.arange(60, dtype=np.uint8).reshape(6, 10)
  coded = compact.CodedArray(codes)
  assert isinstance(coded[1:3], compact.CodedArray) and coded[1:3].shape == (2, 10)
  assert isinstance(coded[[0, 5]], compact.CodedArray)
  assert isinstance(coded[np.array([True, False] * 3)], compact.CodedArray)
  assert coded[2, 3] == compact.UNIT[23]
  assert len(coded) == 6 and coded.dtype == np.float32 and coded.shape == (6, 10)
  back = pickle.loads(pickle.dumps(coded))
  assert isinstance(back, compact.CodedArray) and np.array_equal(back.codes, codes)
  big = compact.CodedArray(np.zeros((100, 784), np.uint8))
  assert len(pickle.dumps(big)) < np.asarray(big).nbytes / 3.9  # codes and the table
  joined = compact.concatenate([coded[:2], coded[4:]])
  assert isinstance(joined, compact.CodedArray)
  assert np.array_equal(np.asarray(joined), np.asarray(coded)[[0, 1, 4, 5]])
  mixed = compact.concatenate([coded[:2], np.ones((1, 10), np.float32)])
  assert isinstance(mixed, np.ndarray) and mixed.dtype == np.float32
  assert np.array_equal(mixed[:2], np.asarray(coded)[:2])
  assert np.array_equal(tf.constant(coded).numpy(), np.asarray(coded))


def _emnist_fixture(path, images):
  con = sqlite3.connect(path)
  tff_sqlite.create_tables(con)
  for split in ("all_train", "all_test"):
    for cid, (x, y) in images.items():
      for row, label in zip(x, y):
        proto = tf.train.Example(features=tf.train.Features(feature={
            "pixels": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}))
        con.execute("INSERT INTO examples VALUES (?, ?, ?)",
                    (split, cid, proto.SerializeToString()))
      con.execute("INSERT INTO client_metadata VALUES (?, ?, ?)", (cid, split, len(y)))
  con.commit()
  con.close()


def test_the_database_reader_keeps_codes_with_the_parsed_values(tmp_path):
  rng = np.random.default_rng(1)
  images = {f"w{i}": (compact.UNIT[rng.integers(0, 256, (3 + i, 784))],
                      rng.integers(0, 62, 3 + i)) for i in range(3)}
  off_table = images["w2"][0].copy()
  off_table[0, 0] = 0.3  # not k/255: this writer's batch stays float32
  images["w2"] = (off_table, images["w2"][1])
  db = str(tmp_path / "emnist_all.sqlite")
  _emnist_fixture(db, images)
  data = emnist.load_database(db)
  for cid, (x, y) in images.items():
    got = data.train[cid][0]
    assert np.array_equal(np.asarray(got).view(np.uint32), x.view(np.uint32))
    assert np.array_equal(data.train[cid][1], y)
  # one batch of 4096 rows holds all three writers: off the table, all float32
  assert not compact.is_coded(data.train["w0"][0])
  del images["w2"]
  _emnist_fixture(db2 := str(tmp_path / "b.sqlite"), images)
  data = emnist.load_database(db2)
  assert all(compact.is_coded(data.train[c][0]) for c in data.client_ids)


@pytest.mark.skipif(not os.path.isdir(LEAF_DIR), reason="needs ../shared/data")
def test_leaf_femnist_comes_coded_with_the_values_float32_parsing_gives():
  data = leaf.load_femnist(LEAF_DIR)
  plain = leaf.load_leaf(LEAF_DIR, leaf.dense_parser(leaf.IMAGE_PIXELS,
                                                     leaf.FEMNIST_NUM_CLASSES),
                         leaf.FEMNIST_NUM_CLASSES, name="FEMNIST")
  assert data.client_ids == plain.client_ids
  for cid in data.client_ids:
    for split in ("train", "test"):
      x = getattr(data, split)[cid][0]
      assert compact.is_coded(x)
      ref = getattr(plain, split)[cid][0]
      assert np.array_equal(np.asarray(x).view(np.uint32), ref.view(np.uint32))


def _federation(coded: bool):
  rng = np.random.default_rng(2)
  train, test = {}, {}
  for i in range(3):
    x = compact.CodedArray(rng.integers(0, 256, (12 + 3 * i, 16)).astype(np.uint8))
    xt = compact.CodedArray(rng.integers(0, 256, (5, 16)).astype(np.uint8))
    y, yt = rng.integers(0, 4, len(x)), rng.integers(0, 4, 5)
    if not coded:
      x, xt = np.asarray(x), np.asarray(xt)
    train[f"c{i}"], test[f"c{i}"] = (x, y), (xt, yt)
  return FederatedData(list(train), train, test, 4)


def test_gather_rows_looks_the_values_up():
  x = compact.CodedArray(np.random.default_rng(3).integers(0, 256, (20, 8)).astype(np.uint8))
  rows = tf.constant([[3, 0], [19, 7]])
  got = schedule.gather_rows(schedule.device_rows([x[:9], x[9:]], "/CPU:0"), rows).numpy()
  assert got.dtype == np.float32
  assert np.array_equal(got.view(np.uint32), np.asarray(x)[[[3, 0], [19, 7]]].view(np.uint32))


@pytest.mark.parametrize("batching", ["sequential", "parallel"])
def test_a_round_on_codes_equals_the_round_on_float32(batching):
  from tff_cluster.algorithms.fedavg.fedavg import FedAvgDefinition
  from tff_cluster.runners.local_runner import LocalRunner

  model_fn = lambda: models.mlp(16, 8, 4)  # noqa: E731
  tf.keras.utils.set_random_seed(0)
  init = models.get_weights(model_fn())
  specs = models.weights_type_spec(model_fn())
  states = []
  for coded in (True, False):
    definition = FedAvgDefinition(specs, 2, mu=0.0, weighting="processed")
    runner = LocalRunner(definition, model_fn, models.SPARSE_CE_LOGITS, _federation(coded),
                         seed=0, client_batching=batching)
    out = runner.run("train", definition.initial_state(init), [0, 1, 2], 1,
                     schedule.LocalWork(4, epochs=2), 0.1)
    states.append(tf.nest.flatten(runner.numpy_state(out.state)))
  assert len(states[0]) == len(states[1])
  for a, b in zip(*states):
    assert np.array_equal(np.asarray(a), np.asarray(b))
  assert not np.array_equal(np.asarray(states[0][0]), init[0])  # it trained


def test_evaluation_on_codes_equals_evaluation_on_float32():
  model_fn = lambda: models.mlp(16, 8, 4)  # noqa: E731
  tf.keras.utils.set_random_seed(0)
  weights = [models.get_weights(model_fn()) for _ in range(2)]
  got = []
  for coded in (True, False):
    ev = Evaluator(model_fn, models.SPARSE_CE_LOGITS, _federation(coded), batch_size=4)
    got.append((ev.evaluate(weights, np.array([0, 1, 0])), ev.mean_losses(weights[1])))
  (a, la), (b, lb) = got
  assert a.accuracy == b.accuracy and a.loss == b.loss
  assert np.array_equal(a.per_client_loss_sum, b.per_client_loss_sum)
  assert np.array_equal(la, lb)


@pytest.mark.parametrize("sizes,batch", [((5, 0, 7, 3), 4), ((9,), 4), ((2, 2), 8), ((), 3),
                                         ((4, 4), 4)])
def test_batches_are_the_concatenation_sliced(sizes, batch):
  from tff_cluster.learning.evaluation import _batches
  rng = np.random.default_rng(4)
  parts = [compact.CodedArray(rng.integers(0, 256, (n, 3)).astype(np.uint8)) for n in sizes]
  whole = np.concatenate([np.asarray(p) for p in parts]) if parts else np.zeros((0, 3))
  got = list(_batches(parts, batch))
  assert [s for s, _ in got] == list(range(0, len(whole), batch))
  for start, b in got:
    assert isinstance(b, np.ndarray)
    assert np.array_equal(b, whole[start:start + batch])
  plain = [np.asarray(p) for p in parts]
  assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(got, _batches(plain, batch)))


@pytest.mark.parametrize("dtype", [np.uint8, np.float32, np.int32])
def test_a_host_tensor_is_the_arrays_memory(dtype):
  parts = [np.arange(n * 3, dtype=dtype).reshape(n, 3) for n in (5, 0, 70)]
  joined = compact.concatenate(parts, aligned=True)
  assert joined.ctypes.data % compact.ALIGNMENT == 0
  assert np.array_equal(joined, np.concatenate(parts))
  tensor = schedule.host_tensor(joined)
  assert tensor.dtype == dtype and np.array_equal(tensor.numpy(), joined)
  joined[0, 0] = 9  # the same memory: no copy was made
  assert tensor.numpy()[0, 0] == 9
  assert np.array_equal(tf.gather(tensor, [74, 0]).numpy(), joined[[74, 0]])
  odd = np.concatenate([np.zeros(1, dtype), joined.ravel()])[1:]  # not aligned
  assert np.array_equal(schedule.host_tensor(odd).numpy(), odd)  # a copy, not a crash


def test_packed_data_is_one_buffer_the_runner_takes_as_is():
  from tff_cluster.data.federated import packed
  data = _federation(True)
  same = packed(data)
  for split in ("train", "test"):
    for c in data.client_ids:
      a, b = getattr(data, split)[c], getattr(same, split)[c]
      assert np.array_equal(np.asarray(a[0]), np.asarray(b[0])) and a[1] is b[1]
  parts = [same.train[c][0] for c in same.client_ids]
  rows = schedule.device_rows(parts, "/CPU:0")
  assert isinstance(rows, schedule.Coded)
  joined = compact.concatenate(parts, aligned=True)
  assert joined.codes.ctypes.data == parts[0].codes.ctypes.data  # no copy
  assert compact.concatenate(parts[::-1]).codes.ctypes.data != parts[0].codes.ctypes.data
  assert np.array_equal(np.asarray(compact.concatenate(parts[::-1])),
                        np.concatenate([np.asarray(p) for p in parts[::-1]]))


def test_a_shard_of_packed_data_is_copied_out_so_the_rest_can_be_freed():
  parts = compact.pack([compact.CodedArray(np.full((n, 4), n, np.uint8)) for n in (3, 5, 2)])
  assert compact.pack(parts)[0].codes.ctypes.data == parts[0].codes.ctypes.data
  shard = compact.pack(parts[1:])
  assert shard[0].codes.ctypes.data != parts[1].codes.ctypes.data
  assert compact._root(shard[0].codes).nbytes <= 7 * 4 + compact.ALIGNMENT
  assert np.array_equal(np.asarray(shard[1]), np.asarray(parts[2]))
