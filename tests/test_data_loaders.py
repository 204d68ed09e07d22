"""Loaders of real data on disk: LEAF JSON, idx / CIFAR pickles, TFF EMNIST.

The real files live in ../shared/data relative to the repo root (FEMNIST
LEAF JSON, FedProx Synthetic(1,1) test file, Fashion-MNIST idx); tests on them
skip, saying why, only when that folder is absent. Everything else runs on
small files written to tmp_path in the same formats.
"""

from __future__ import annotations

import gzip
import json
import pickle
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.helpers import write_emnist_sqlite
from tff_cluster.data import compact, emnist, leaf, vision
from tff_cluster.data.federated import DataError

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
FEMNIST_DIR = SHARED / "femnist_leaf"
SYNTHETIC_FILE = SHARED / "fedprox_synthetic_1_1" / "mytest.json"
FMNIST_DIR = SHARED / "fashion_mnist"


def needs(path: Path):
  return pytest.mark.skipif(
      not path.exists(), reason=f"real data {path} absent (../shared/data)")


# ---------------------------------------------------------------------------
# File writers for the fixtures.


def leaf_blob(users: dict) -> dict:
  """users: id -> (x, y) lists -> a LEAF JSON object."""
  return {"users": list(users), "num_samples": [len(y) for _, y in users.values()],
          "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}


def write_json(path: Path, blob) -> Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(blob))
  return path


def images(n: int, label: int, dim: int = 784):
  return [[label / 100.0] * dim for _ in range(n)], [label] * n


def idx_bytes(arr: np.ndarray) -> bytes:
  magic = 0x800 | arr.ndim
  header = magic.to_bytes(4, "big") + b"".join(
      d.to_bytes(4, "big") for d in arr.shape)
  return header + arr.astype(np.uint8).tobytes()


def write_idx_dir(folder: Path, n_train: int, n_test: int, gz: bool,
                  seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  folder.mkdir(parents=True, exist_ok=True)
  arrays = {
      "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
      "train-labels-idx1-ubyte": np.arange(n_train) % 10,
      "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
      "t10k-labels-idx1-ubyte": np.arange(n_test) % 10,
  }
  for stem, arr in arrays.items():
    data = idx_bytes(arr)
    if gz:
      (folder / f"{stem}.gz").write_bytes(gzip.compress(data))
    else:
      (folder / stem).write_bytes(data)
  return arrays


def write_cifar_dir(folder: Path, per_batch: int = 4) -> None:
  folder = folder / vision.CIFAR10_DIR
  folder.mkdir(parents=True)
  for i, name in enumerate(vision.CIFAR10_FILES):
    # Channel c of every image is constant 10 * c + i: checks the CHW -> HWC.
    img = np.concatenate([np.full(1024, 10 * c + i) for c in range(3)])
    data = np.tile(img, (per_batch, 1)).astype(np.uint8)
    labels = [(i + j) % 10 for j in range(per_batch)]
    with open(folder / name, "wb") as f:
      pickle.dump({b"data": data, b"labels": labels}, f)


# ---------------------------------------------------------------------------
# Real LEAF data.


@needs(FEMNIST_DIR)
def test_real_femnist():
  data = leaf.load_femnist(str(FEMNIST_DIR))
  assert data.num_clients == 51
  assert data.num_train_samples().sum() == 7236
  assert data.num_test_samples().sum() == 829
  assert data.num_classes == 62
  xs = np.concatenate([data.train[c][0] for c in data.client_ids])
  ys = np.concatenate([data.train[c][1] for c in data.client_ids] +
                      [data.test[c][1] for c in data.client_ids])
  assert xs.dtype == np.float32 and xs.shape[1] == 784
  assert xs.min() >= 0.0 and xs.max() <= 1.0
  assert np.median(xs) == 1.0  # LEAF: 1.0 = background, most pixels.
  assert ys.min() >= 0 and ys.max() <= 61 and len(np.unique(ys)) == 62
  assert all(len(data.test[c][1]) > 0 for c in data.client_ids)


@needs(SYNTHETIC_FILE)
def test_real_synthetic_single_file_split_90_10():
  data = leaf.load_fedprox_synthetic(str(SYNTHETIC_FILE), seed=3)
  assert data.num_clients == 30
  n_train, n_test = data.num_train_samples(), data.num_test_samples()
  assert (n_train + n_test).sum() == 1084
  assert np.all(n_train == (0.9 * (n_train + n_test)).astype(int))
  for c in data.client_ids:
    for x, y in (data.train[c], data.test[c]):
      assert x.shape[1] == 60 and y.dtype == np.int64
      assert y.min() >= 0 and y.max() <= 9
  again = leaf.load_fedprox_synthetic(str(SYNTHETIC_FILE), seed=3)
  c = data.client_ids[0]
  np.testing.assert_array_equal(data.test[c][0], again.test[c][0])
  with pytest.raises(DataError, match="single file has no train/test split"):
    leaf.load_fedprox_synthetic(str(SYNTHETIC_FILE), split_single_file=False)


# ---------------------------------------------------------------------------
# LEAF fixtures and bad inputs.


def make_leaf_dir(root: Path) -> Path:
  # Two shards; "a" and "b" in shard 0, "c" in shard 1 (natural order 2 < 10).
  write_json(root / "train" / "all_data_2_train.json",
             leaf_blob({"a": images(3, 1), "b": images(2, 61)}))
  write_json(root / "train" / "all_data_10_train.json",
             leaf_blob({"c": images(4, 5)}))
  write_json(root / "test" / "all_data_2_test.json",
             leaf_blob({"a": images(1, 1), "b": images(1, 60)}))
  write_json(root / "test" / "all_data_10_test.json",
             leaf_blob({"c": images(2, 5)}))
  return root


def test_leaf_dir_merges_users_across_train_and_test(tmp_path):
  data = leaf.load_femnist(str(make_leaf_dir(tmp_path)))
  assert data.client_ids == ["a", "b", "c"]
  assert list(data.num_train_samples()) == [3, 2, 4]
  assert list(data.num_test_samples()) == [1, 1, 2]
  np.testing.assert_array_equal(data.test["b"][1], [60])
  assert data.train["a"][0].dtype == np.float32


def test_leaf_same_user_in_two_shards_is_concatenated(tmp_path):
  make_leaf_dir(tmp_path)
  write_json(tmp_path / "train" / "all_data_11_train.json",
             leaf_blob({"a": images(2, 7)}))
  data = leaf.load_femnist(str(tmp_path))
  np.testing.assert_array_equal(data.train["a"][1], [1, 1, 1, 7, 7])


def test_leaf_missing_dir_names_expected_files(tmp_path):
  with pytest.raises(DataError) as e:
    leaf.load_femnist(str(tmp_path / "nope"))
  msg = str(e.value)
  assert "train/*.json and test/*.json" in msg and "preprocess.sh -s niid" in msg
  assert "\n" not in msg
  with pytest.raises(DataError, match="pass --data_dir"):
    leaf.load_femnist(None)
  with pytest.raises(DataError, match="generate_niid.py"):
    leaf.load_fedprox_mnist(str(tmp_path / "nope"))


def test_leaf_missing_test_split_names_it(tmp_path):
  write_json(tmp_path / "train" / "x.json", leaf_blob({"a": images(2, 1)}))
  with pytest.raises(DataError, match=r"no test/\*\.json found"):
    leaf.load_femnist(str(tmp_path))


def test_leaf_invalid_json_names_file(tmp_path):
  make_leaf_dir(tmp_path)
  bad = tmp_path / "test" / "all_data_10_test.json"
  bad.write_text('{"users": [')
  with pytest.raises(DataError, match=f"{bad}: not valid JSON"):
    leaf.load_femnist(str(tmp_path))


def test_leaf_missing_key_names_file_and_key(tmp_path):
  path = write_json(tmp_path / "one.json", {"users": ["a"], "num_samples": [1]})
  with pytest.raises(DataError, match=f"{path}: missing key 'user_data'"):
    leaf.load_femnist(str(path))
  blob = leaf_blob({"a": images(1, 1)})
  del blob["user_data"]["a"]["y"]
  write_json(path, blob)
  with pytest.raises(DataError, match="user 'a': missing key 'y'"):
    leaf.load_femnist(str(path))
  blob = leaf_blob({"a": images(1, 1)})
  blob["users"].append("ghost")
  blob["num_samples"].append(0)
  write_json(path, blob)
  with pytest.raises(DataError, match="'ghost' is in 'users' but missing"):
    leaf.load_femnist(str(path))


def test_leaf_label_out_of_range_names_client_and_label(tmp_path):
  make_leaf_dir(tmp_path)
  write_json(tmp_path / "test" / "all_data_10_test.json",
             leaf_blob({"c": images(2, 62)}))
  with pytest.raises(DataError, match=r"client 'c': label 62 is out of range 0\.\.61"):
    leaf.load_femnist(str(tmp_path))
  with pytest.raises(DataError, match=r"client 'b': label 61 is out of range 0\.\.9"):
    leaf.load_fedprox_mnist(str(tmp_path))  # 10 classes: 'b' (61) fails first
  path = write_json(tmp_path / "f.json", leaf_blob({"u": ([[0.0] * 60], [2.5])}))
  with pytest.raises(DataError, match="client 'u': label 2.5 is not an integer"):
    leaf.load_fedprox_synthetic(str(path))


def test_leaf_xy_length_mismatch_names_client(tmp_path):
  x, y = images(3, 1)
  path = write_json(tmp_path / "f.json",
                    {"users": ["w1"], "num_samples": [3],
                     "user_data": {"w1": {"x": x, "y": y[:2]}}})
  with pytest.raises(DataError, match="client 'w1' has 3 inputs .* but 2 labels"):
    leaf.load_femnist(str(path))


def test_leaf_wrong_feature_count_names_client(tmp_path):
  path = write_json(tmp_path / "f.json", leaf_blob({"w1": images(2, 1, dim=783)}))
  with pytest.raises(DataError, match="client 'w1': expected 784 features"):
    leaf.load_femnist(str(path))


def test_leaf_empty_client_warns_and_is_skipped(tmp_path):
  make_leaf_dir(tmp_path)
  write_json(tmp_path / "train" / "all_data_3_train.json",
             leaf_blob({"empty": ([], [])}))
  write_json(tmp_path / "test" / "all_data_3_test.json",
             leaf_blob({"empty": ([], [])}))
  with pytest.warns(UserWarning, match="skipping 1 clients with no training "
                                       "samples: 'empty'"):
    data = leaf.load_femnist(str(tmp_path))
  assert "empty" not in data.client_ids and data.num_clients == 3


def test_leaf_unmatched_users(tmp_path):
  make_leaf_dir(tmp_path)
  write_json(tmp_path / "train" / "all_data_4_train.json",
             leaf_blob({"lonely": images(10, 3)}))
  with pytest.raises(DataError, match="'lonely' only in train/.*-t sample"):
    leaf.load_femnist(str(tmp_path))
  with pytest.warns(UserWarning, match="dropping 1 users"):
    dropped = leaf.load_femnist(str(tmp_path), unmatched="drop")
  assert "lonely" not in dropped.client_ids
  split = leaf.load_femnist(str(tmp_path), unmatched="split")
  assert len(split.train["lonely"][1]) == 9 and len(split.test["lonely"][1]) == 1


def test_sample_clients_is_seeded_subset(tmp_path):
  data = leaf.load_femnist(str(make_leaf_dir(tmp_path)))
  sub = leaf.sample_clients(data, 2, seed=1)
  assert sub.num_clients == 2 and set(sub.client_ids) <= set(data.client_ids)
  assert leaf.sample_clients(data, 2, seed=1).client_ids == sub.client_ids
  assert leaf.sample_clients(data, None, seed=1) is data


# ---------------------------------------------------------------------------
# Sent140 and GloVe.


def write_glove(path: Path, words, dim: int = 4) -> Path:
  lines = [f"{w} " + " ".join(str(i + 0.5 * j) for j in range(dim))
           for i, w in enumerate(words, 1)]
  path.write_text("\n".join(lines) + "\n")
  return path


def tweet(text):
  return ["1467810369", "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", "user", text]


def write_sent140(root: Path) -> Path:
  write_json(root / "train" / "t.json", leaf_blob({
      "u1": ([tweet("I LOVE this, really!"), tweet("hate hate zzzunknown")], [1, 0]),
      "u2": ([tweet(" ".join(["love"] * 40))], [1])}))
  write_json(root / "test" / "t.json", leaf_blob({
      "u1": ([tweet("love")], [1]), "u2": ([tweet("hate it")], [0])}))
  return root


def test_tokenize_and_ids():
  assert leaf.tokenize("I LOVE this, really! don't") == [
      "i", "love", "this", ",", "really", "!", "don't"]
  vocab = {"love": 1, "hate": 2}
  ids = leaf.tweet_to_ids("Love you HATE", vocab, seq_len=5)
  np.testing.assert_array_equal(ids, [1, 3, 2, 0, 0])  # unknown = 3, pad = 0


def test_load_glove(tmp_path):
  path = write_glove(tmp_path / "g.txt", ["the", "love", "hate"], dim=4)
  vocab, emb = leaf.load_glove(str(path), dim=4)
  assert vocab == {"the": 1, "love": 2, "hate": 3}
  assert emb.shape == (5, 4) and emb.dtype == np.float32
  assert not emb[0].any() and not emb[-1].any()
  np.testing.assert_allclose(emb[2], [2.0, 2.5, 3.0, 3.5])
  vocab, emb = leaf.load_glove(str(path), dim=4, words={"hate", "nope"})
  assert vocab == {"hate": 1} and emb.shape == (3, 4)
  with pytest.raises(DataError, match="line 1: expected a word and 5 numbers"):
    leaf.load_glove(str(path), dim=5)


def test_sent140_loader(tmp_path):
  glove = write_glove(tmp_path / "glove.txt", ["the", "love", "hate", "i", ","])
  data, emb = leaf.load_sent140(str(write_sent140(tmp_path / "s")), str(glove),
                                dim=4)
  assert data.num_classes == 2 and data.client_ids == ["u1", "u2"]
  x, y = data.train["u1"]
  assert x.shape == (2, 25) and x.dtype == np.int32
  np.testing.assert_array_equal(y, [1, 0])
  # Only the words used survive: i, love, ',', hate (in order of the file).
  assert emb.shape == (4 + 2, 4)
  unk = emb.shape[0] - 1
  love = x[0][1]
  assert x[0][0] != unk and love != unk and x[0][2] == unk  # "this" unknown
  assert list(x[0][6:]) == [0] * 19  # padding
  assert list(data.train["u2"][0][0]) == [love] * 25  # truncated to 25 tokens
  np.testing.assert_array_equal(x[1][:3], [x[1][0], x[1][0], unk])


def test_sent140_missing_glove_names_file(tmp_path):
  root = write_sent140(tmp_path / "s")
  with pytest.raises(DataError) as e:
    leaf.load_sent140(str(root), str(tmp_path / "glove.6B.300d.txt"))
  assert "glove.6B.300d.txt" in str(e.value)
  assert "nlp.stanford.edu/projects/glove" in str(e.value)
  with pytest.raises(DataError, match="no GloVe file given: expected "
                                      "glove.6B.300d.txt"):
    leaf.load_sent140(str(root), None)
  with pytest.raises(DataError, match="preprocess.sh"):
    leaf.load_sent140(str(tmp_path / "nope"), None)


def test_sent140_bad_sample_and_label(tmp_path):
  glove = write_glove(tmp_path / "g.txt", ["a"])
  path = write_json(tmp_path / "f.json", leaf_blob({"u": ([["only text"]], [1])}))
  with pytest.raises(DataError, match="client 'u': a Sent140 sample must be"):
    leaf.load_sent140(str(path), str(glove), dim=4)
  path = write_json(tmp_path / "f.json", leaf_blob({"u": ([tweet("a")], [4])}))
  with pytest.raises(DataError, match="client 'u': label 4 is out of range 0..1"):
    leaf.load_sent140(str(path), str(glove), dim=4)


# ---------------------------------------------------------------------------
# idx files and Keras.


@pytest.fixture(scope="module")
def real_fmnist_idx():
  if not FMNIST_DIR.exists():
    pytest.skip(f"real data {FMNIST_DIR} absent (../shared/data)")
  return vision.read_idx_dir(str(FMNIST_DIR))


def test_real_fashion_mnist_idx(real_fmnist_idx):
  (x_train, y_train), (x_test, y_test) = real_fmnist_idx
  assert x_train.shape == (60000, 28, 28) and x_test.shape == (10000, 28, 28)
  assert x_train.dtype == np.uint8
  assert y_train.shape == (60000,) and y_test.shape == (10000,)
  assert set(np.unique(y_train)) == set(range(10)) == set(np.unique(y_test))
  assert np.all(np.bincount(y_train) == 6000)


def test_real_fashion_mnist_pooled(real_fmnist_idx):
  x, y = vision.load_fashion_mnist(str(FMNIST_DIR))
  assert x.shape == (70000, 784) and x.dtype == np.float32
  assert x.min() == 0.0 and x.max() == 1.0
  assert y.dtype == np.int64 and np.all(np.bincount(y) == 7000)
  np.testing.assert_allclose(x[60000].reshape(28, 28),
                             real_fmnist_idx[1][0][0] / 255.0, rtol=1e-6)


@pytest.mark.parametrize("gz", [True, False])
def test_idx_gz_and_raw(tmp_path, gz):
  arrays = write_idx_dir(tmp_path, 7, 3, gz=gz)
  (xtr, ytr), (xte, yte) = vision.read_idx_dir(str(tmp_path))
  np.testing.assert_array_equal(xtr, arrays["train-images-idx3-ubyte"])
  np.testing.assert_array_equal(yte, arrays["t10k-labels-idx1-ubyte"])
  x, y = vision.load_mnist(str(tmp_path))
  assert x.shape == (10, 784) and x.max() <= 1.0
  np.testing.assert_array_equal(y, list(range(7)) + list(range(3)))


def test_idx_missing_files_are_named(tmp_path):
  write_idx_dir(tmp_path, 4, 2, gz=True)
  (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
  with pytest.raises(DataError, match="missing t10k-labels-idx1-ubyte.gz"):
    vision.read_idx_dir(str(tmp_path))
  with pytest.raises(DataError, match="does not exist: expected a directory "
                                      "with train-images-idx3-ubyte.gz"):
    vision.load_fashion_mnist(str(tmp_path / "nope"))


def test_idx_bad_magic_and_truncated(tmp_path):
  write_idx_dir(tmp_path, 4, 2, gz=False)
  path = tmp_path / "train-labels-idx1-ubyte"
  raw = path.read_bytes()
  path.write_bytes(b"\x00\x00\x09\x01" + raw[4:])
  with pytest.raises(DataError, match="bad idx magic number 0x00000901"):
    vision.read_idx_dir(str(tmp_path))
  path.write_bytes(raw[:-1])
  with pytest.raises(DataError, match=r"header says \(4,\) .* but the file has 3"):
    vision.read_idx_dir(str(tmp_path))
  # Labels file in the images slot: caught by the dimension check.
  path.write_bytes(raw)
  (tmp_path / "train-images-idx3-ubyte").write_bytes(raw)
  with pytest.raises(DataError, match="expected a 3-d idx file"):
    vision.read_idx_dir(str(tmp_path))


def test_idx_count_mismatch(tmp_path):
  write_idx_dir(tmp_path, 4, 2, gz=False)
  (tmp_path / "train-labels-idx1-ubyte").write_bytes(idx_bytes(np.arange(3)))
  with pytest.raises(DataError, match="train has 4 images but 3 labels"):
    vision.read_idx_dir(str(tmp_path))


@pytest.mark.parametrize("name,loader", [
    ("mnist", vision.load_mnist), ("fashion_mnist", vision.load_fashion_mnist),
    ("cifar10", vision.load_cifar10)])
def test_keras_download_failure_is_one_line(monkeypatch, name, loader):
  def fail():
    raise Exception("URL fetch failure on https://example/x: None -- [Errno -2] "
                    "Name or service not known\nsecond line")
  monkeypatch.setattr(getattr(tf.keras.datasets, name), "load_data", fail)
  with pytest.raises(DataError) as e:
    loader()
  msg = str(e.value)
  assert "\n" not in msg and "URL fetch failure" in msg
  assert "--data_dir" in msg and "~/.keras/datasets" in msg


def test_keras_path_used_without_data_dir(monkeypatch):
  fake = ((np.zeros((2, 28, 28), np.uint8), np.array([1, 2], np.uint8)),
          (np.full((1, 28, 28), 255, np.uint8), np.array([3], np.uint8)))
  monkeypatch.setattr(tf.keras.datasets.fashion_mnist, "load_data", lambda: fake)
  x, y = vision.load_fashion_mnist()
  assert x.shape == (3, 784) and x[2].min() == 1.0
  np.testing.assert_array_equal(y, [1, 2, 3])


def test_cifar10_pickles(tmp_path):
  write_cifar_dir(tmp_path, per_batch=4)
  for folder in (tmp_path, tmp_path / vision.CIFAR10_DIR):
    x, y = vision.load_cifar10(str(folder))
    assert x.shape == (24, 32, 32, 3) and x.dtype == np.float32
    np.testing.assert_allclose(x[0, 5, 7] * 255, [0, 10, 20], atol=1e-4)
    np.testing.assert_allclose(x[-1, 0, 0] * 255, [5, 15, 25], atol=1e-4)
    assert y.dtype == np.int64 and y.max() <= 9
  (tmp_path / vision.CIFAR10_DIR / "test_batch").unlink()
  with pytest.raises(DataError, match="missing CIFAR-10 batches test_batch"):
    vision.load_cifar10(str(tmp_path))


# ---------------------------------------------------------------------------
# TFF EMNIST.


@pytest.mark.tff
def test_emnist_from_preplaced_cache(tmp_path):
  write_emnist_sqlite(tmp_path / emnist.EMNIST_DB_FILE, {
      "digits_only_train": {"w1": [1, 2, 3], "w2": [4]},
      "digits_only_test": {"w1": [5], "w2": [6, 7]},
      "all_train": {"w1": [40]}, "all_test": {"w1": [61]}})
  data = emnist.load_emnist(only_digits=True, cache_dir=str(tmp_path))
  assert data.client_ids == ["w1", "w2"] and data.num_classes == 10
  x, y = data.train["w1"]
  assert x.shape == (3, 784) and x.dtype == np.float32
  np.testing.assert_array_equal(y, [1, 2, 3])
  np.testing.assert_allclose(x[:, 0], [0.1, 0.2, 0.3], rtol=1e-6)
  np.testing.assert_array_equal(data.test["w2"][1], [6, 7])
  full = emnist.load_emnist(only_digits=False, cache_dir=str(tmp_path))
  assert full.num_classes == 62 and full.client_ids == ["w1"]
  assert emnist.load_emnist(cache_dir=str(tmp_path), num_clients=1).num_clients == 1


@pytest.mark.tff
def test_emnist_conversion_from_client_data():
  import tensorflow_federated as tff  # deferred: heavy import.

  def cd(labels):
    return tff.simulation.datasets.TestClientData({
        cid: {"label": np.asarray(ls, np.int32),
              "pixels": np.ones((len(ls), 28, 28), np.float32)}
        for cid, ls in labels.items()})
  train, test = cd({"a": [1, 9], "b": [0]}), cd({"a": [2], "c": [3]})
  data = emnist.client_data_to_federated(train, test, 10)
  assert data.client_ids == ["a"]  # only writers in both splits
  assert data.train["a"][0].shape == (2, 784)
  np.testing.assert_array_equal(data.train["a"][1], [1, 9])
  with pytest.raises(DataError, match="client 'a': label outside 0..1"):
    emnist.client_data_to_federated(train, test, 2)


@pytest.mark.tff
def test_emnist_download_failure_is_one_line(tmp_path, monkeypatch):
  def offline(*args, **kwargs):
    raise urllib.error.URLError("[Errno -2] Name or service not known")
  monkeypatch.setattr(urllib.request, "urlopen", offline)
  with pytest.raises(DataError) as e:
    emnist.load_emnist(cache_dir=str(tmp_path))
  msg = str(e.value)
  assert "\n" not in msg and "URLError" in msg
  assert "emnist_all.sqlite.lzma" in msg and str(tmp_path) in msg
  assert f"place {emnist.EMNIST_DB_FILE} in" in msg
  assert not (tmp_path / emnist.EMNIST_DB_FILE).exists()


def test_synthetic_samples_per_client_makes_each_client_alone():
  """With samples_per_client, each client is drawn from its own seed: any
  shard of clients equals the same clients of the whole federation, the
  catalogue's counts are the arrays', and the draw depends on the seed."""
  from tff_cluster import tasks
  from tff_cluster.data.federated import LazyFederatedData
  from tff_cluster.spec.task import DataOptions
  for name in ("synthetic", "synthetic_iid", "synthetic_clusters"):
    data = tasks.get_task(name).load_data(DataOptions(
        seed=3, num_clients=9, extra={"samples_per_client": 21}))
    assert isinstance(data, LazyFederatedData)
    whole = data.materialize()
    assert list(whole.num_train_samples()) == [18] * 9  # 90/10 of 21
    assert list(data.num_test_samples()) == [3] * 9
    for lo, hi in ((0, 4), (4, 9), (6, 7)):
      shard = data.load(lo, hi)
      assert shard.client_ids == whole.client_ids[lo:hi]
      for c in shard.client_ids:
        for split in ("train", "test"):
          np.testing.assert_array_equal(getattr(shard, split)[c][0], getattr(whole, split)[c][0])
          np.testing.assert_array_equal(getattr(shard, split)[c][1], getattr(whole, split)[c][1])
    if name == "synthetic_clusters":
      np.testing.assert_array_equal(data.load(4, 9).true_clusters, data.true_clusters[4:9])
    other = tasks.get_task(name).load_data(DataOptions(
        seed=4, num_clients=9, extra={"samples_per_client": 21})).load(0, 1)
    assert not np.array_equal(other.train[other.client_ids[0]][0],
                              whole.train[whole.client_ids[0]][0])
  with pytest.raises(DataError, match="arrays are made on demand"):
    data.train  # noqa: B018
  with pytest.raises(DataError, match="valid: >= 2"):
    tasks.get_task("synthetic").load_data(DataOptions(extra={"samples_per_client": 1}))


def test_a_file_backed_task_under_ray_is_a_catalogue_read_again_per_shard():
  """With --runner=ray the CLI keeps only a file-backed task's catalogue on
  the host; each shard reads the task again and keeps its clients, equal to
  the same clients of the whole federation, in arrays of their own (views of
  a whole-dataset array would keep all of it alive in the actor)."""
  from tff_cluster import experiment as run_experiment
  from tff_cluster import tasks
  from tff_cluster.data.federated import LazyFederatedData, materialize
  from tff_cluster.cli import load_task_data
  mnist = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist"
  if not mnist.exists():
    pytest.skip(f"needs {mnist}")
  run_experiment.FLAGS.unparse_flags()
  args = ["--algo=fedavg", "--task=rotated_mnist", f"--data_dir={mnist}", "--runner=local",
          "--task_arg=clients_per_cluster=5", "--task_arg=samples_per_client=30",
          "--clients_per_round=4"]
  run_experiment.FLAGS(["run_experiment.py", *args])
  settings = run_experiment.resolve_settings(run_experiment._flag_values())  # noqa: SLF001
  task = tasks.get_task("rotated_mnist")
  whole = load_task_data(dict(settings), task)
  assert not isinstance(whole, LazyFederatedData)
  lazy = load_task_data(dict(settings, runner="ray"), task)
  assert isinstance(lazy, LazyFederatedData)
  assert lazy.client_ids == whole.client_ids
  np.testing.assert_array_equal(lazy.num_train_samples(), whole.num_train_samples())
  np.testing.assert_array_equal(lazy.true_clusters, whole.true_clusters)
  for lo, hi in ((0, 7), (7, 20), (13, 14)):
    shard = lazy.load(lo, hi)
    assert shard.client_ids == whole.client_ids[lo:hi]
    np.testing.assert_array_equal(shard.true_clusters, whole.true_clusters[lo:hi])
    for split in ("train", "test"):
      # The shard's inputs: one buffer of its own clients' rows (`packed`),
      # nothing of the rest of the federation kept alive.
      inputs = [np.asarray(getattr(shard, split)[c][0]) for c in shard.client_ids]
      held = sum(x.nbytes for x in inputs)
      for c in shard.client_ids:
        x = getattr(shard, split)[c][0]
        codes = x.codes if compact.is_coded(x) else x
        assert compact._root(codes).nbytes <= held // (4 if compact.is_coded(x) else 1) + 64
        for mine, theirs in zip(getattr(shard, split)[c], getattr(whole, split)[c]):
          np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs))
          assert not np.shares_memory(np.asarray(getattr(mine, "codes", mine)),
                                      np.asarray(getattr(theirs, "codes", theirs)))
  assert materialize(lazy).num_clients == whole.num_clients
