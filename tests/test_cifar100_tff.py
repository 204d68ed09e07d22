"""`--task=cifar100_tff`: TFF's federated CIFAR-100 read without TFF from a
database in TFF's layout written here (a few clients, a few 32 x 32 x 3 images
as TFF's file holds them), served from 127.0.0.1 into an empty cache, trained
for a round; offline with an empty cache, and with a file that is not FedJAX's
recorded one, one line, exit 2 and nothing left behind."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import lzma
import pickle
import sqlite3

import numpy as np
import pytest

from tests import tff_image_fixtures as fx
from tests.helpers import assert_one_line_error, main_in_process
from tests.test_download import cache_files, closed_port_url, serving
from tff_cluster import tasks
from tff_cluster.data import cifar100_tff, compact, download
from tff_cluster.data.federated import DataError
from tff_cluster.spec.hparams import HParamError
from tff_cluster.spec.task import DataOptions
from tff_cluster.tasks import cifar100_tff as task_module

SHAPE = (32, 32, 3)
# TFF's ids are strings sorted as strings: "10" before "2".
TRAIN = {"0": 5, "1": 4, "10": 3, "2": 4}
TEST = {"0": 3, "1": 2}


def make_clients(counts, rng):
  out = {}
  for cid, n in counts.items():
    x = fx.images(rng, n, SHAPE)
    fine = rng.integers(0, 100, n)
    out[cid] = [(x[i], {"label": fine[i], "coarse_label": fine[i] // 5}) for i in range(n)]
  return out


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
  rng = np.random.default_rng(7)
  splits = {"train": make_clients(TRAIN, rng), "test": make_clients(TEST, rng)}
  path = tmp_path_factory.mktemp("cifar100") / "cifar100.sqlite"
  fx.write_database(path, splits)
  return path, splits


@pytest.fixture
def cache(tmp_path, monkeypatch):
  """An empty cache root (not yet created), no TFF or Keras cache; the task's
  class count restored after the test."""
  root = tmp_path / "cache" / "tff_cluster"
  monkeypatch.setenv(download.ENV_DATA, str(root))
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  monkeypatch.delenv("KERAS_HOME", raising=False)
  monkeypatch.delenv(download.ENV_MIRROR, raising=False)
  for builder in (task_module.RESNET18, task_module.CNN):
    monkeypatch.setattr(builder, "num_classes", builder.num_classes)
  return root


def expected(splits, split, cid, field="label"):
  items = splits[split][cid]
  return (np.stack([image for image, _ in items]),
          np.array([labels[field] for _, labels in items], np.int64))


def test_reader_gives_the_images_back_bit_exact(fixture, cache):
  path, splits = fixture
  data = cifar100_tff.load_database(str(path))
  assert data.client_ids == ["train_0", "train_1", "train_10", "train_2",
                             "test_0", "test_1"]
  assert data.num_classes == 100
  assert list(data.test_only()) == [False] * 4 + [True] * 2
  for split, counts in (("train", TRAIN), ("test", TEST)):
    for cid in counts:
      x_want, y_want = expected(splits, split, cid)
      x, y = (data.train if split == "train" else data.test)[f"{split}_{cid}"]
      assert compact.is_coded(x) and x.codes.dtype == np.uint8
      np.testing.assert_array_equal(x.codes, x_want)  # each client's rows, in order
      decoded = np.asarray(x)  # k/255 as float32, bit for bit
      want = x_want.astype(np.float32) / np.float32(255)
      assert decoded.dtype == np.float32 and np.array_equal(decoded.view(np.uint32),
                                                            want.view(np.uint32))
      np.testing.assert_array_equal(y, y_want)
      # Training clients have no test data; test clients no training data.
      other = (data.test if split == "train" else data.train)[f"{split}_{cid}"]
      assert len(other[1]) == 0 and other[0].shape == (0, *SHAPE)
  assert data.num_train_samples().sum() == sum(TRAIN.values())
  assert data.num_test_samples().sum() == sum(TEST.values())
  coarse = cifar100_tff.load_database(str(path), labels="coarse")
  assert coarse.num_classes == 20
  np.testing.assert_array_equal(coarse.test["test_1"][1],
                                expected(splits, "test", "1", "coarse_label")[1])
  # A seeded subset of the training clients; the test clients all stay.
  sub = cifar100_tff.load_database(str(path), num_clients=2, seed=3)
  assert len(sub.client_ids) == 4 and sub.client_ids[-2:] == ["test_0", "test_1"]
  # holdout: a share of each training client's own images becomes its test set.
  held = cifar100_tff.load_database(str(path), holdout=0.25, seed=1)
  x_all, _ = expected(splits, "train", "0")
  x_tr, x_te = held.train["train_0"][0].codes, held.test["train_0"][0].codes
  assert (len(x_tr), len(x_te)) == (3, 2) and not held.test_only()[0]  # int(0.75 * 5)
  np.testing.assert_array_equal(np.sort(np.concatenate([x_tr, x_te]).reshape(5, -1), 0),
                                np.sort(x_all.reshape(5, -1), 0))


def test_fetch_then_train_then_cache_alone(fixture, cache, tmp_path, monkeypatch, capsys):
  """Download -> cache -> one round with the small CNN, no TFF; then the data
  again from the cache alone, the server gone."""
  path, splits = fixture
  archive = lzma.compress(path.read_bytes(), format=lzma.FORMAT_ALONE, preset=0)
  monkeypatch.setattr(download, "CIFAR100", dataclasses.replace(
      download.CIFAR100, size=len(archive), sha256=hashlib.sha256(archive).hexdigest()))
  out = tmp_path / "run"
  with serving({download.CIFAR100.archive: archive}) as base:
    monkeypatch.setenv(download.ENV_MIRROR, base + "/files")
    code, _, err = main_in_process(
        ["--algo=fedavg", "--task=cifar100_tff", "--model=cnn", "--rounds=1",
         "--clients_per_round=2", "--batch_size=4", "--task_arg=labels=coarse",
         "--noprogress", f"--output_dir={out}"], capsys)
  assert code == 0, err
  assert cache_files(cache) == [download.CIFAR100.name]  # decompressed, nothing else
  config = json.loads((out / "config.json").read_text())
  assert str(cache) in config["data_description"] and "20 classes" in config[
      "data_description"]
  assert config["num_clients_loaded"] == len(TRAIN) + len(TEST)
  summary = json.loads((out / "summary.json").read_text())
  assert summary["completed"]
  # The server is gone: the data comes from the cache.
  monkeypatch.setenv(download.ENV_MIRROR, closed_port_url())
  spec = tasks.registry()["cifar100_tff"]
  data = spec.load_data(DataOptions(extra={"labels": "coarse"}))
  assert data.num_clients == len(TRAIN) + len(TEST)
  assert spec.model_fn().output_shape[-1] == 20  # the head follows the labels
  # The builder ships its class count (the ray runner's actors build the same head).
  assert pickle.loads(pickle.dumps(task_module.CNN)).num_classes == 20


@pytest.mark.parametrize("case", ["offline", "not_fedjax_file"])
def test_a_failed_fetch_is_one_line_and_leaves_nothing(case, fixture, cache, tmp_path,
                                                        monkeypatch, capsys):
  path, _ = fixture
  archive = lzma.compress(path.read_bytes(), format=lzma.FORMAT_ALONE, preset=0)
  out = tmp_path / "out"
  args = ["--algo=fedavg", "--task=cifar100_tff", "--model=cnn", "--rounds=1",
          f"--output_dir={out}"]
  with serving({download.CIFAR100.archive: archive}) as base:
    if case == "offline":
      mirror, needle = closed_port_url(), "Connection refused"
    else:  # the fixture is not the file FedJAX recorded
      mirror = base + "/files"
      needle = f"{len(archive):,} bytes, not the 153,019,920 of FedJAX's"
    monkeypatch.setenv(download.ENV_MIRROR, mirror)
    code, _, err = main_in_process(args, capsys)
  assert_one_line_error(code, err, out, "could not fetch cifar100.sqlite",
                        f"{mirror}/cifar100.sqlite.lzma", f"in {cache}", needle)
  assert not cache.exists() and not cache.parent.exists()


def test_bad_files_and_settings_are_one_line(fixture, cache, tmp_path):
  path, splits = fixture
  spec = tasks.registry()["cifar100_tff"]
  with pytest.raises(HParamError, match="invalid --task_arg=labels=mixed; valid: fine, "
                     "coarse"):
    spec.load_data(DataOptions(data_dir=str(path), extra={"labels": "mixed"}))
  with pytest.raises(HParamError, match=r"invalid --task_arg=holdout=1.0; valid"):
    spec.load_data(DataOptions(data_dir=str(path), extra={"holdout": 1.0}))
  text = tmp_path / "cifar100.sqlite"
  text.write_text("not a database")
  with pytest.raises(DataError, match="not TFF's federated CIFAR-100 database \\(no SQLite "
                     "header\\); expected cifar100.sqlite, the decompressed https://"):
    spec.load_data(DataOptions(data_dir=str(tmp_path)))  # a folder holding the file
  with pytest.raises(DataError, match="no such file|No such file"):
    spec.load_data(DataOptions(data_dir=str(tmp_path / "absent.sqlite")))
  # client_metadata saying more than the rows hold; a pixel outside 0..255.
  short = tmp_path / "short.sqlite"
  counts = {"train": dict(TRAIN, **{"1": 6}), "test": TEST}
  fx.write_database(short, splits, metadata_counts=counts)
  with pytest.raises(DataError, match="client '1' has 4 examples under 'train', not the 6 "
                     "client_metadata gives it"):
    cifar100_tff.load_database(str(short))
  bad = tmp_path / "bad.sqlite"
  image = np.zeros(SHAPE, np.int64)
  image[0, 0, 0] = 256
  fx.write_database(bad, {"train": {"0": [(image, {"label": 1, "coarse_label": 0})]},
                          "test": {"0": [(image * 0, {"label": 1, "coarse_label": 0})]}})
  with pytest.raises(DataError, match="a pixel is 256; valid: 0..255"):
    cifar100_tff.load_database(str(bad))
  missing = tmp_path / "tables.sqlite"
  sqlite3.connect(str(missing)).execute("CREATE TABLE examples (split_name TEXT)").close()
  with pytest.raises(DataError, match="table 'examples' has no column 'client_id'"):
    cifar100_tff.load_database(str(missing))


def test_resnet18_is_tffs_with_its_baseline_preprocessing(cache):
  """TFF's create_resnet18 layout (11,227,812 parameters with 100 classes)
  behind the central 24 x 24 crop and per-image standardization of TFF's
  CIFAR-100 baseline, computed here as TFF's preprocessing does."""
  import tensorflow as tf
  spec = tasks.registry()["cifar100_tff"]
  assert spec.model_names == ("resnet18", "cnn")
  model = spec.model_fn()
  assert model.count_params() == 11_227_812 and model.output_shape == (None, 100)
  assert spec.with_model("cnn").model_fn().count_params() == 1_638_052
  pixels = fx.images(np.random.default_rng(0), 3, SHAPE)
  pixels[2] = 17  # a flat image: standardization's 1/sqrt(N) floor
  x = pixels.astype(np.float32) / np.float32(255)
  inner = tf.keras.Model(model.inputs, model.get_layer("standardize").output)
  want = tf.image.per_image_standardization(tf.image.resize_with_crop_or_pad(
      tf.cast(pixels, tf.float32), 24, 24))
  np.testing.assert_allclose(inner(x).numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
