"""TensorFlow Datasets as the vision tasks' source (`--data_source`).

Offline, no download: TFDS is mocked (`tfds.testing.mock_data`) or fed files
written here. The TFDS tests are skipped where tensorflow_datasets is not
installed (the `tfds` extra; CI's today phase has it); the rule for `auto` and
the one-line refusal without TFDS run everywhere.
"""

from __future__ import annotations

import importlib.util
import sys
from unittest import mock

import numpy as np
import pytest

from tests.helpers import main_in_process
from tff_cluster import tasks
from tff_cluster.data import tfds_source, vision
from tff_cluster.data.federated import DataError
from tff_cluster.spec.task import DataOptions

HAS_TFDS = importlib.util.find_spec("tensorflow_datasets") is not None
needs_tfds = pytest.mark.skipif(not HAS_TFDS, reason="tensorflow_datasets is not installed "
                                "(the tfds extra: uv sync --extra tfds)")
SPLITS = {"train": 0, "test": 1}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
  """No connection leaves this machine during these tests (TFDS included)."""
  import socket
  real_connect = socket.socket.connect

  def connect(sock, address):
    host = address[0] if isinstance(address, tuple) else address
    if sock.family == socket.AF_UNIX or host in ("127.0.0.1", "::1", "localhost"):
      return real_connect(sock, address)
    raise OSError(f"test_tfds is offline: refused a connection to {address}")
  monkeypatch.setattr(socket.socket, "connect", connect)


def keras_arrays(name: str, n_train: int, n_test: int, seed: int = 0):
  """What tf.keras.datasets.<name>.load_data() returns, made up: uint8
  images, uint8 labels ([n] or, for CIFAR-10, [n, 1]), every class present."""
  rng = np.random.default_rng(seed)
  shape = (32, 32, 3) if name == "cifar10" else (28, 28)
  out = []
  for n in (n_train, n_test):
    x = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
    y = rng.permutation(np.arange(n) % 10).astype(np.uint8)
    out.append((x, y.reshape(-1, 1) if name == "cifar10" else y))
  return tuple(out)


def tfds_mock(arrays_of):
  """`tfds.testing.mock_data` serving `arrays_of[name]` (Keras' layout, the
  files' order) as a TFDS copy holds them: examples sorted by TFDS's own
  key hash (its `hashing.Hasher`, salted with the split's name), images with
  their channel axis, int64 labels, CIFAR-10's `id`."""
  import tensorflow as tf
  import tensorflow_datasets as tfds
  from tensorflow_datasets.core import hashing

  def as_dataset(self, split, **kwargs):
    split = str(split)
    x, y = arrays_of[self.name][SPLITS[split]]
    n = len(x)
    stored = sorted(range(n), key=hashing.Hasher(split).hash_key)
    example = {"image": x[stored].reshape(n, *x.shape[1:3], -1),
               "label": y.reshape(-1)[stored].astype(np.int64)}
    if self.name == "cifar10":
      example["id"] = np.array([f"{split}_{i:05d}".encode() for i in stored])
    return tf.data.Dataset.from_tensor_slices(example)

  return tfds.testing.mock_data(as_dataset_fn=as_dataset)


def clients(data):
  """Every client's arrays, dense: {id: (x_train, y_train, x_test, y_test)}."""
  def dense(a):
    return np.asarray(a.decode() if hasattr(a, "decode") else a)
  return {c: (*map(dense, data.train[c]), *map(dense, data.test[c])) for c in data.client_ids}


# task, data set, extra task settings (small enough for the arrays above)
TASK_CASES = [
    ("fmnist", "fashion_mnist", 8, {}),
    ("mnist", "mnist", 10, {}),
    ("rotated_mnist", "mnist", None, {"clients_per_cluster": 4, "samples_per_client": 20,
                                       "test_clients_per_cluster": 2}),
    ("cifar10", "cifar10", 5, {}),
]


@needs_tfds
@pytest.mark.parametrize("task_name,dataset,num_clients,extra", TASK_CASES,
                         ids=[c[0] for c in TASK_CASES])
def test_keras_and_tfds_give_the_same_clients(monkeypatch, task_name, dataset, num_clients,
                                              extra):
  """One array set through Keras' loader and through TFDS (in TFDS's own
  stored order): the same client ids and the same arrays for each client."""
  import tensorflow as tf
  arrays = keras_arrays(dataset, 160, 40)
  monkeypatch.setattr(getattr(tf.keras.datasets, dataset), "load_data", lambda: arrays)
  task = tasks.get_task(task_name)
  options = dict(seed=3, num_clients=num_clients, extra=extra)
  from_keras = task.load_data(DataOptions(data_source="keras", **options))
  with tfds_mock({dataset: arrays}):
    from_tfds = task.load_data(DataOptions(data_source="tfds", **options))
  assert from_tfds.client_ids == from_keras.client_ids and len(from_keras.client_ids) > 1
  keras_clients, tfds_clients = clients(from_keras), clients(from_tfds)
  for cid in from_keras.client_ids:
    for a, b in zip(keras_clients[cid], tfds_clients[cid]):
      assert a.dtype == b.dtype and a.shape == b.shape
      np.testing.assert_array_equal(a, b)
  assert "Keras cache" in from_keras.description
  assert "TensorFlow Datasets" in from_tfds.description


@needs_tfds
def test_tfds_arrays_are_keras_arrays(monkeypatch):
  """The raw arrays: Keras' dtypes, shapes and order, from TFDS's hashed order."""
  arrays = {name: keras_arrays(name, 30, 12, seed=i)
            for i, name in enumerate(("mnist", "cifar10"))}
  with tfds_mock(arrays):
    for name, want in arrays.items():
      got = tfds_source.load(name)
      for (x, y), (wx, wy) in zip(got, want):
        assert (x.dtype, x.shape, y.dtype, y.shape) == (wx.dtype, wx.shape, wy.dtype, wy.shape)
        np.testing.assert_array_equal(x, wx)
        np.testing.assert_array_equal(y, wy)


@needs_tfds
def test_stored_keys_follow_tfds_hash():
  from tensorflow_datasets.core import hashing
  for split in ("train", "test"):
    want = sorted(range(500), key=hashing.Hasher(split).hash_key)
    np.testing.assert_array_equal(tfds_source.stored_keys(split, 500), want)
  assert list(tfds_source.stored_keys("train", 500)) != list(range(500))


def _idx(arr) -> bytes:
  arr = np.asarray(arr, np.uint8)
  header = (0x800 + arr.ndim).to_bytes(4, "big")
  return header + b"".join(d.to_bytes(4, "big") for d in arr.shape) + arr.tobytes()


@needs_tfds
def test_order_of_a_copy_written_by_tfds(tmp_path, monkeypatch):
  """TFDS's own MNIST and CIFAR-10 builders prepare copies from files written
  here (its download replaced by these files): read back, the arrays are the
  files' arrays in the files' order, though TFDS stores them in another; with
  an empty Keras cache, `auto` reads that copy."""
  import tensorflow_datasets as tfds
  from tensorflow_datasets.image_classification import mnist as tfds_mnist
  (mx, my), (mtx, mty) = keras_arrays("mnist", 40, 12)
  for stem, arr in (("train-images-idx3-ubyte", mx), ("train-labels-idx1-ubyte", my),
                    ("t10k-images-idx3-ubyte", mtx), ("t10k-labels-idx1-ubyte", mty)):
    (tmp_path / stem).write_bytes(_idx(arr))
  mnist_files = {"train_data": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
                 "test_data": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}
  (cx, cy), (ctx, cty) = keras_arrays("cifar10", 20, 6)
  bin_dir = tmp_path / "cifar" / "cifar-10-batches-bin"
  bin_dir.mkdir(parents=True)
  (bin_dir / "batches.meta.txt").write_text("\n".join(f"class{i}" for i in range(10)) + "\n")
  def records(x, y):  # label byte, then the image channel-major
    return b"".join(bytes([int(l)]) + img.transpose(2, 0, 1).tobytes() for img, l in zip(x, y[:, 0]))
  for i in range(5):
    (bin_dir / f"data_batch_{i + 1}.bin").write_bytes(records(cx[4 * i:4 * i + 4], cy[4 * i:4 * i + 4]))
  (bin_dir / "test_batch.bin").write_bytes(records(ctx, cty))

  def download_and_extract(self, urls):
    if isinstance(urls, dict):  # MNIST's four files
      return {k: str(tmp_path / mnist_files[k]) for k in urls}
    return str(tmp_path / "cifar")
  root = tmp_path / "tfds"
  with mock.patch.object(tfds.download.DownloadManager, "download_and_extract",
                         download_and_extract), \
      mock.patch.object(tfds_mnist, "_TRAIN_EXAMPLES", 40), \
      mock.patch.object(tfds_mnist, "_TEST_EXAMPLES", 12):
    for name in ("mnist", "cifar10"):
      tfds.builder(f"{name}:{tfds_source.DATASETS[name].version}", data_dir=str(root)
                   ).download_and_prepare(download_dir=str(tmp_path / "downloads"))
  stored = [int(e["label"]) for e in tfds.as_numpy(
      tfds.builder("mnist:3.0.1", data_dir=str(root)).as_dataset(split="train"))]
  assert stored != my.tolist() and sorted(stored) == sorted(my.tolist())  # hashed order

  for name, want in (("mnist", ((mx, my), (mtx, mty))), ("cifar10", ((cx, cy), (ctx, cty)))):
    got = tfds_source.load(name, str(root))
    for (x, y), (wx, wy) in zip(got, want):
      np.testing.assert_array_equal(x, wx)
      np.testing.assert_array_equal(y, wy)

  keras_home = tmp_path / "keras"
  keras_home.mkdir()
  monkeypatch.setenv("KERAS_HOME", str(keras_home))
  monkeypatch.setenv("TFDS_DATA_DIR", str(root))
  assert vision.resolve_source("mnist", None, "auto") == "tfds"
  x, y = vision.load_mnist(data_source="auto")
  np.testing.assert_array_equal(y, np.concatenate([my, mty]))
  np.testing.assert_array_equal(x, np.concatenate([mx, mtx]).reshape(52, 784) / np.float32(255))


def test_auto_rule(tmp_path, monkeypatch):
  """auto: --data_dir's files; else Keras' cache when it holds the files; else
  a prepared TFDS copy when TFDS is installed; else Keras (its download)."""
  keras_home, tfds_dir = tmp_path / "keras", tmp_path / "tfds"
  keras_home.mkdir()
  monkeypatch.setenv("KERAS_HOME", str(keras_home))
  monkeypatch.setenv("TFDS_DATA_DIR", str(tfds_dir))
  monkeypatch.setattr(tfds_source, "installed", lambda: True)
  resolve = vision.resolve_source
  for name in ("mnist", "fashion_mnist", "cifar10"):
    assert resolve(name, None, "auto") == "keras"  # nothing anywhere: Keras downloads
    copy = tfds_dir / tfds_source.DATASETS[name].tfds_name / tfds_source.DATASETS[name].version
    copy.mkdir(parents=True)
    (copy / "dataset_info.json").write_text("{}")
    assert resolve(name, None, "auto") == "tfds"
    assert vision.source_label(name, None, "auto") == f"TensorFlow Datasets {tfds_dir}"
    assert resolve(name, str(tmp_path), "auto") == "files"  # --data_dir first
    assert resolve(name, None, "keras") == "keras"
    with monkeypatch.context() as m:
      m.setattr(tfds_source, "installed", lambda: False)
      assert resolve(name, None, "auto") == "keras"
  datasets = keras_home / "datasets"
  (datasets / "fashion-mnist").mkdir(parents=True)
  for path in ("mnist.npz", "cifar-10-batches-py-target_archive",
               *(f"fashion-mnist/{s}.gz" for s in vision.IDX_FILES[:3])):
    (datasets / path).write_bytes(b"")
  assert resolve("mnist", None, "auto") == "keras"  # Keras' cache first
  assert resolve("cifar10", None, "auto") == "keras"
  assert resolve("fashion_mnist", None, "auto") == "tfds"  # one of four files missing
  (datasets / f"fashion-mnist/{vision.IDX_FILES[3]}.gz").write_bytes(b"")
  assert resolve("fashion_mnist", None, "auto") == "keras"
  assert vision.source_label("mnist", None, "auto") == "Keras cache"
  assert resolve("mnist", str(tmp_path), "tfds") == "tfds"  # --data_dir: TFDS's directory
  with pytest.raises(DataError, match=r"invalid --data_source=hub; valid: auto, keras, tfds"):
    resolve("mnist", None, "hub")


def test_without_tfds_one_line(monkeypatch, tmp_path, capsys):
  """TFDS absent: --data_source=tfds is refused in one line naming the extra,
  exit 2, before any data is read; the loaders say the same."""
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # import fails
  assert not tfds_source.installed()
  out_dir = tmp_path / "run"
  code, _, err = main_in_process(["--task=fmnist", "--data_source=tfds",
                                  f"--output_dir={out_dir}"], capsys)
  assert code == 2 and "Traceback" not in err
  lines = [line for line in err.splitlines() if line.strip()]
  assert len(lines) == 1 and "pip install 'tff-cluster[tfds]'" in lines[0], err
  assert not out_dir.exists()
  with pytest.raises(DataError) as e:
    vision.load_fashion_mnist(data_source="tfds")
  assert "pip install 'tff-cluster[tfds]'" in str(e.value) and "\n" not in str(e.value)


def test_the_tfds_extra_is_declared_and_not_default():
  from tests.conftest import REPO_ROOT
  tomllib = pytest.importorskip("tomllib")
  project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
  assert any(d.startswith("tensorflow-datasets") for d in project["optional-dependencies"]["tfds"])
  assert not any("tensorflow-datasets" in d for d in project["dependencies"])
  assert tfds_source.INSTALL == "pip install 'tff-cluster[tfds]'"
