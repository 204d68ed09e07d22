"""`--task=celeba`: TFF's federated CelebA read without TFF from a database in
TFF's layout written here (a few celebrities, a few 84 x 84 x 3 images with
TFF's 40 attributes, both split groups), served from 127.0.0.1 into an empty
cache and trained for a round with LEAF's CNN; its clients are read from the
file when the runner asks (a catalogue); offline with an empty cache, one
line, exit 2 and nothing left behind."""

from __future__ import annotations

import json
import lzma
import pickle

import numpy as np
import pytest

from tests import tff_image_fixtures as fx
from tests.helpers import assert_one_line_error, main_in_process
from tests.test_download import cache_files, closed_port_url, serving
from tff_cluster import tasks
from tff_cluster.data import celeba, compact, download
from tff_cluster.data.federated import DataError, LazyFederatedData
from tff_cluster.spec.hparams import HParamError
from tff_cluster.spec.task import DataOptions

SHAPE = (84, 84, 3)
# split group -> split -> celebrity -> images: by examples, every celebrity in
# both halves; by clients, disjoint celebrities.
EXAMPLES = {"split_by_examples_train": {"1021": 4, "17": 3, "305": 3},
            "split_by_examples_test": {"1021": 1, "17": 1, "305": 2}}
CLIENTS = {"split_by_clients_train": {"1021": 5, "17": 4},
           "split_by_clients_test": {"305": 5}}


def celebrity_images(n, rng):
  x = fx.images(rng, n, SHAPE)
  attributes = rng.integers(0, 2, (n, len(fx.CELEBA_ATTRIBUTES)))
  return [(x[i], dict(zip(fx.CELEBA_ATTRIBUTES, attributes[i]))) for i in range(n)]


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
  rng = np.random.default_rng(11)
  splits = {split: {cid: celebrity_images(n, rng) for cid, n in clients.items()}
            for group in (EXAMPLES, CLIENTS) for split, clients in group.items()}
  path = tmp_path_factory.mktemp("celeba") / "celeba.sqlite"
  fx.write_database(path, splits)
  return path, splits


@pytest.fixture
def cache(tmp_path, monkeypatch):
  root = tmp_path / "cache" / "tff_cluster"
  monkeypatch.setenv(download.ENV_DATA, str(root))
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  monkeypatch.delenv("KERAS_HOME", raising=False)
  monkeypatch.delenv(download.ENV_MIRROR, raising=False)
  return root


def expected(splits, split, cid):
  items = splits[split][cid]
  return (np.stack([image for image, _ in items]),
          np.array([labels["smiling"] for _, labels in items], np.int64))


def check_client(data, splits, cid, train_split, test_split):
  for arrays, split in ((data.train, train_split), (data.test, test_split)):
    x, y = arrays[cid]
    if cid not in splits[split]:
      assert len(y) == 0 and x.shape == (0, *SHAPE)
      continue
    x_want, y_want = expected(splits, split, cid)
    assert compact.is_coded(x)
    np.testing.assert_array_equal(x.codes, x_want)
    want = x_want.astype(np.float32) / np.float32(255)
    assert np.array_equal(np.asarray(x).view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(y, y_want)


def test_reader_reads_celebrities_on_demand_bit_exact(fixture, cache):
  path, splits = fixture
  lazy = celeba.load_catalogue(str(path))
  assert isinstance(lazy, LazyFederatedData) and lazy.num_classes == 2
  assert lazy.client_ids == ["1021", "17", "305"]  # TFF's order: sorted ids
  assert list(lazy.num_train_samples()) == [4, 3, 3]
  assert list(lazy.num_test_samples()) == [1, 1, 2]
  shard = lazy.load(1, 3)  # only these celebrities are read
  assert shard.client_ids == ["17", "305"]
  for cid in shard.client_ids:
    check_client(shard, splits, cid, *celeba.SPLITS["examples"])
  whole = lazy.materialize()
  check_client(whole, splits, "1021", *celeba.SPLITS["examples"])
  # The loader travels to the ray runner's actors: it pickles, with no arrays.
  assert len(pickle.dumps(lazy.shard_loader(0, 3))) < 4096
  # split=clients: training celebrities, then test-only ones.
  by_clients = celeba.load_catalogue(str(path), split="clients").materialize()
  assert by_clients.client_ids == ["1021", "17", "305"]
  assert list(by_clients.test_only()) == [False, False, True]
  for cid in by_clients.client_ids:
    check_client(by_clients, splits, cid, *celeba.SPLITS["clients"])
  sub = celeba.load_catalogue(str(path), num_clients=2, seed=0)
  assert len(sub.client_ids) == 2 and set(sub.client_ids) <= {"1021", "17", "305"}


def test_fetch_then_train_then_cache_alone(fixture, cache, tmp_path, monkeypatch, capsys):
  """Download -> cache -> one round of LEAF's CNN at the task's defaults (2
  celebrities a round), no TFF; then the catalogue from the cache alone."""
  path, _ = fixture
  archive = lzma.compress(path.read_bytes(), format=lzma.FORMAT_ALONE, preset=0)
  out = tmp_path / "run"
  with serving({download.CELEBA.archive: archive}) as base:
    monkeypatch.setenv(download.ENV_MIRROR, base + "/files")
    code, _, err = main_in_process(["--algo=fedavg", "--task=celeba", "--rounds=1",
                                    "--noprogress", f"--output_dir={out}"], capsys)
  assert code == 0, err
  assert cache_files(cache) == [download.CELEBA.name]
  config = json.loads((out / "config.json").read_text())
  assert str(cache) in config["data_description"] and config["num_clients_loaded"] == 3
  assert json.loads((out / "summary.json").read_text())["completed"]
  monkeypatch.setenv(download.ENV_MIRROR, closed_port_url())
  lazy = tasks.registry()["celeba"].load_data(DataOptions())
  assert lazy.client_ids == ["1021", "17", "305"]


def test_offline_with_an_empty_cache_is_one_line(cache, tmp_path, monkeypatch, capsys):
  mirror = closed_port_url()
  monkeypatch.setenv(download.ENV_MIRROR, mirror)
  out = tmp_path / "out"
  code, _, err = main_in_process(["--algo=fedavg", "--task=celeba", "--rounds=1",
                                  f"--output_dir={out}"], capsys)
  assert_one_line_error(code, err, out, "could not fetch celeba.sqlite",
                        f"{mirror}/celeba.sqlite.lzma", f"in {cache}", "Connection refused")
  assert not cache.exists() and not cache.parent.exists()


def test_bad_files_and_settings_are_one_line(fixture, cache, tmp_path):
  path, splits = fixture
  spec = tasks.registry()["celeba"]
  with pytest.raises(HParamError, match="invalid --task_arg=split=users; valid: examples, "
                     "clients"):
    spec.load_data(DataOptions(data_dir=str(path), extra={"split": "users"}))
  only_examples = tmp_path / "examples.sqlite"
  fx.write_database(only_examples, {s: splits[s] for s in EXAMPLES})
  with pytest.raises(DataError, match="not TFF's federated CelebA database \\(no clients "
                     "under the split name 'split_by_clients_train'"):
    spec.load_data(DataOptions(data_dir=str(only_examples)))
  odd = tmp_path / "odd.sqlite"
  image, attributes = splits["split_by_examples_train"]["17"][0]
  odd_splits = {s: {"17": [(image, dict(attributes, smiling=2))]}
                for group in (EXAMPLES, CLIENTS) for s in group}
  fx.write_database(odd, odd_splits)
  with pytest.raises(DataError, match="a 'smiling' attribute is 2; valid: 0 or 1"):
    celeba.load_catalogue(str(odd)).materialize()


def test_leaf_cnn():
  """LEAF's CelebA CNN: 4 x (conv 32, BN, pool, ReLU), dense 2 on 1,152 features."""
  model = tasks.registry()["celeba"].model_fn()
  assert model.count_params() == 31_458 and model.output_shape == (None, 2)
  assert model.get_layer("logits").kernel.shape == (1152, 2)
