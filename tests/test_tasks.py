"""The task registry: specs, models, and the real-data tasks' partitions.

FEMNIST views and the (Fashion-)MNIST tasks load the real files from
../shared/data (skipped, saying why, only when that folder is absent); the
other tasks run on small files written to tmp_path.
"""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from tff_cluster import tasks
from tff_cluster.tasks import femnist as femnist_tasks
from tff_cluster.tasks import mnist as mnist_tasks
from tff_cluster.tasks import sent140 as sent140_tasks
from tff_cluster import models
from tff_cluster.data import leaf, partition, vision
from tff_cluster.data.federated import DataError
from tff_cluster.data.partition import rotate_images
from tff_cluster.spec.task import DataOptions

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
FEMNIST_DIR = SHARED / "femnist_leaf"
FMNIST_DIR = SHARED / "fashion_mnist"
MNIST_DIR = SHARED / "mnist"

DEFAULT_KEYS = {"rounds", "clients_per_round", "batch_size", "client_lr", "mu",
                "num_clients"}

# Classes of the tasks whose data must come from files (the others are
# generated, so the test loads them to ask).
EXPECTED_CLASSES = {
    "femnist": 62, "femnist_digits": 10, "femnist_upper": 26,
    "femnist_lower": 26, "rotated_femnist_digits": 10, "mnist": 10,
    "fmnist": 10, "rotated_fmnist_iid": 10, "rotated_fmnist": 10, "rotated_mnist": 10,
    "rotated_cifar10": 10, "fmnist_clusterwise_dir": 10,
    "fmnist_clusterwise_class": 10, "cifar10": 10, "cifar10_pfl": 10, "sent140": 2, "femnist_fedprox": 26,
    "fmnist_clientwise_dir": 10, "fmnist_clientwise_class": 10,
    "mnist_clusterwise_dir": 10, "mnist_clusterwise_class": 10,
    "mnist_clientwise_dir": 10, "mnist_clientwise_class": 10, "mnist_workers": 10,
    "cifar100_tff": 100, "celeba": 2, "shakespeare": 90}

REGISTRY = tasks.registry()


# ---------------------------------------------------------------------------
# Small files in the real formats.


def write_json(path: Path, users: dict) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps({
      "users": list(users), "num_samples": [len(y) for _, y in users.values()],
      "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}))


def write_sent140(root: Path) -> tuple:
  def tweet(text):
    return ["1", "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", "user", text]
  write_json(root / "train" / "t.json", {
      "u1": ([tweet("love it"), tweet("hate it")], [1, 0]),
      "u2": ([tweet("so good")], [1])})
  write_json(root / "test" / "t.json", {
      "u1": ([tweet("love")], [1]), "u2": ([tweet("bad")], [0])})
  glove = root / "glove.6B.300d.txt"
  glove.write_text("".join(f"{w} " + " ".join(["0.1"] * 300) + "\n"
                           for w in ("love", "hate", "good", "it")))
  return str(root), str(glove)


def write_mnist_idx(folder: Path, n_train: int = 1800, n_test: int = 200) -> None:
  rng = np.random.default_rng(0)
  folder.mkdir(parents=True, exist_ok=True)
  for split, n in (("train", n_train), ("t10k", n_test)):
    for kind, arr in (("images", rng.integers(0, 256, (n, 28, 28))),
                      ("labels", np.arange(n) % 10)):
      dims = "idx3" if kind == "images" else "idx1"
      header = (0x800 | arr.ndim).to_bytes(4, "big") + b"".join(
          d.to_bytes(4, "big") for d in arr.shape)
      (folder / f"{split}-{kind}-{dims}-ubyte.gz").write_bytes(
          gzip.compress(header + arr.astype(np.uint8).tobytes()))


def write_cifar(folder: Path, per_batch: int = 100) -> None:
  folder = folder / vision.CIFAR10_DIR
  folder.mkdir(parents=True)
  rng = np.random.default_rng(0)
  for name in vision.CIFAR10_FILES:
    with open(folder / name, "wb") as f:
      pickle.dump({b"data": rng.integers(0, 256, (per_batch, 3072)).astype(
          np.uint8), b"labels": list(np.arange(per_batch) % 10)}, f)


# ---------------------------------------------------------------------------
# Every task.


def test_registry_has_the_tasks():
  assert set(EXPECTED_CLASSES) <= set(REGISTRY)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_spec(name):
  spec = REGISTRY[name]
  assert spec.name == name
  assert isinstance(spec.description, str) and spec.description.strip()
  assert "\n" not in spec.description
  assert spec.source.strip()
  assert DEFAULT_KEYS <= set(spec.defaults)
  # Local work: epochs or steps, exactly one.
  assert (spec.defaults.get("local_epochs") is None) != (spec.defaults.get("local_steps") is None)
  assert spec.loss in models.LOSSES


def test_mnist_models_have_fedgroup_table2_sizes():
  """FedGroup's Table 2: MNIST MCLR 7,850 and MLP 101,770 parameters (784-128-10)."""
  spec = REGISTRY["mnist"]
  assert spec.model_names == ("mclr", "mlp")
  assert spec.model_fn().count_params() == 7850
  mlp = spec.with_model("mlp").model_fn()
  assert mlp.count_params() == 101770
  assert [layer.units for layer in mlp.layers[1:]] == [128, 10]


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_model_output_matches_classes(name, tmp_path, monkeypatch):
  spec = REGISTRY[name]
  if name == "sent140":  # its vocabulary comes from the data
    monkeypatch.setitem(sent140_tasks._EMBEDDING, "matrix", None)
    with pytest.raises(DataError, match="load the data"):
      spec.model_fn()
    data_dir, glove = write_sent140(tmp_path)
    spec.load_data(DataOptions(data_dir=data_dir, glove_path=glove))
  num_classes = EXPECTED_CLASSES.get(name)
  if num_classes is None:
    num_classes = spec.load_data(DataOptions(num_clients=3)).num_classes
  model = spec.model_fn()
  want = 1 if spec.loss == models.BINARY_PROBS else num_classes
  assert model.output_shape[-1] == want


def test_sent140_task(tmp_path, monkeypatch):
  monkeypatch.setitem(sent140_tasks._EMBEDDING, "matrix", None)
  data_dir, glove = write_sent140(tmp_path)
  spec = REGISTRY["sent140"]
  data = spec.load_data(DataOptions(data_dir=data_dir, glove_path=glove))
  assert data.num_clients == 2 and data.num_classes == 2
  x, _ = data.train["u1"]
  probs = spec.model_fn()(x).numpy()
  assert probs.shape == (2, 1) and np.all((probs > 0) & (probs < 1))
  assert spec.load_data(DataOptions(data_dir=data_dir, glove_path=glove,
                                    num_clients=1)).num_clients == 1


@pytest.mark.parametrize("name,options,expected", [
    ("femnist", DataOptions(data_dir="/nonexistent/femnist"),
     "train/\\*.json and test/\\*.json.*leave --data_dir out to fetch"),
    ("femnist_upper", DataOptions(data_dir="/nonexistent/femnist"),
     "train/\\*.json and test/\\*.json.*preprocess.sh -s niid --sf 0.05"),
    ("sent140", DataOptions(data_dir="/nonexistent/sent140"), "train/\\*.json and test/\\*.json"),
    ("fmnist", DataOptions(data_dir="/nonexistent/fmnist"),
     "train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz"),
    ("mnist", DataOptions(data_dir="/nonexistent/mnist"),
     "train-images-idx3-ubyte.gz.*FedProx's MNIST JSON"),
    ("cifar10", DataOptions(data_dir="/nonexistent/cifar"),
     "cifar-10-batches-py/.*test_batch"),
])
def test_missing_data_is_one_data_error_line(name, options, expected):
  with pytest.raises(DataError, match=expected) as e:
    REGISTRY[name].load_data(options)
  assert "\n" not in str(e.value)


def test_sent140_missing_glove(tmp_path, monkeypatch):
  # No --glove_path: GloVe is fetched; here from a stopped server on 127.0.0.1.
  import socket
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  monkeypatch.setenv("TFF_CLUSTER_DATA", str(tmp_path / "cache"))
  monkeypatch.setenv("TFF_CLUSTER_DATA_MIRROR", f"http://127.0.0.1:{port}")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  monkeypatch.delenv("KERAS_HOME", raising=False)
  data_dir, _ = write_sent140(tmp_path)
  with pytest.raises(DataError, match="could not fetch glove.6B.300d.txt"):
    REGISTRY["sent140"].load_data(DataOptions(data_dir=data_dir))


# ---------------------------------------------------------------------------
# FEMNIST on the real data.


@pytest.fixture(scope="module")
def real_femnist():
  if not FEMNIST_DIR.exists():
    pytest.skip(f"real data {FEMNIST_DIR} absent (../shared/data)")
  return leaf.load_femnist(str(FEMNIST_DIR))


@pytest.fixture
def femnist_cached(real_femnist, monkeypatch):
  # The view tasks read the real files through the module's one load.
  monkeypatch.setattr(leaf, "load_femnist", lambda path, seed=0: real_femnist)
  return DataOptions(data_dir=str(FEMNIST_DIR))


def test_femnist_task(real_femnist, monkeypatch):
  data = REGISTRY["femnist"].load_data(DataOptions(data_dir=str(FEMNIST_DIR)))
  assert data.num_clients == 51 and data.num_classes == 62
  # The images come as 8-bit codes (compact.CodedArray): np.asarray gives the
  # float32 a Keras model takes (Keras 2 converts only numpy arrays itself).
  logits = REGISTRY["femnist"].model_fn()(np.asarray(data.train[data.client_ids[0]][0][:4]))
  assert logits.shape == (4, 62)
  monkeypatch.setattr(leaf, "load_femnist", lambda path, seed=0: real_femnist)
  sub = REGISTRY["femnist"].load_data(
      DataOptions(data_dir=str(FEMNIST_DIR), num_clients=10, seed=1))
  assert sub.num_clients == 10 and set(sub.client_ids) <= set(data.client_ids)


@pytest.mark.parametrize("name", sorted(femnist_tasks.VIEWS))
def test_femnist_views_relabel(real_femnist, name):
  first, num_classes = femnist_tasks.VIEWS[name]
  view = femnist_tasks.label_view(real_femnist, first, num_classes, name)
  assert view.num_classes == num_classes
  raw_total = 0
  for cid in real_femnist.client_ids:
    for split in ("train", "test"):
      raw_y = getattr(real_femnist, split)[cid][1]
      raw_counts = np.bincount(raw_y, minlength=62)[first:first + num_classes]
      if cid in view.client_ids:
        y = getattr(view, split)[cid][1]
        assert y.min() >= 0 and y.max() < num_classes
        np.testing.assert_array_equal(np.bincount(y, minlength=num_classes),
                                      raw_counts)
        raw_total += raw_counts.sum()
      else:  # dropped: nothing to train or to evaluate on in this view
        other = "test" if split == "train" else "train"
        other_y = getattr(real_femnist, other)[cid][1]
        assert raw_counts.sum() == 0 or not np.any(
            (other_y >= first) & (other_y < first + num_classes))
  assert raw_total == (view.num_train_samples().sum() +
                       view.num_test_samples().sum()) > 0
  x, _ = view.train[view.client_ids[0]]
  np.testing.assert_array_equal(x, real_femnist.train[view.client_ids[0]][0][
      (real_femnist.train[view.client_ids[0]][1] >= first) &
      (real_femnist.train[view.client_ids[0]][1] < first + num_classes)])


def test_femnist_upper_task_loads(femnist_cached):
  data = REGISTRY["femnist_upper"].load_data(femnist_cached)
  ys = np.concatenate([data.train[c][1] for c in data.client_ids])
  assert data.num_classes == 26 and ys.min() >= 0 and ys.max() <= 25
  assert len(np.unique(ys)) == 26


@pytest.mark.parametrize("m", [4, 2])
def test_rotated_femnist_digits(real_femnist, femnist_cached, m):
  options = DataOptions(data_dir=str(FEMNIST_DIR), seed=5,
                        extra={} if m == 4 else {"num_clusters": m})
  data = REGISTRY["rotated_femnist_digits"].load_data(options)
  assert data.num_classes == 10
  assert sorted(set(data.true_clusters.tolist())) == list(range(m))
  assert np.ptp(np.bincount(data.true_clusters)) <= 1
  digits = femnist_tasks.label_view(real_femnist, 0, 10, "femnist_digits")
  assert data.client_ids == digits.client_ids
  for cid, k in zip(data.client_ids, data.true_clusters):
    np.testing.assert_array_equal(
        data.test[cid][0], rotate_images(digits.test[cid][0], 90 * k))
    np.testing.assert_array_equal(data.train[cid][1], digits.train[cid][1])


# ---------------------------------------------------------------------------
# Fashion-MNIST on the real data (70k images: loaded once for the module).


@pytest.fixture(scope="module")
def fmnist_pooled():
  if not FMNIST_DIR.exists():
    pytest.skip(f"real data {FMNIST_DIR} absent (../shared/data)")
  return vision.load_fashion_mnist(str(FMNIST_DIR))


@pytest.fixture
def fmnist_options(fmnist_pooled, monkeypatch):
  # The tasks read the real directory once per module, not once per task.
  from tff_cluster.tasks import fmnist as fmnist_tasks
  monkeypatch.setattr(fmnist_tasks, "_pooled", lambda options: fmnist_pooled)
  return DataOptions(data_dir=str(FMNIST_DIR))


def _labels_per_client(data):
  return [set(np.concatenate([data.train[c][1], data.test[c][1]]).tolist())
          for c in data.client_ids]


def test_fmnist_default_partition(fmnist_options):
  data = REGISTRY["fmnist"].load_data(fmnist_options)
  assert data.num_clients == 200 and data.num_classes == 10
  assert all(len(s) == 2 for s in _labels_per_client(data))
  assert (data.num_train_samples() + data.num_test_samples()).sum() == 70000
  x, _ = data.train[data.client_ids[0]]
  assert REGISTRY["fmnist"].model_fn()(x[:3]).shape == (3, 10)


def test_rotated_fmnist_iid(fmnist_options, fmnist_pooled):
  data = REGISTRY["rotated_fmnist_iid"].load_data(fmnist_options)
  assert data.num_clients == 200
  assert np.all(np.bincount(data.true_clusters) == 50)  # m = 4
  # A 90-degree cluster's images are rotated copies of pooled images.
  x, _ = data.train[data.client_ids[int(np.flatnonzero(data.true_clusters == 1)[0])]]
  back = rotate_images(x[:5], 270).astype(np.float32)
  pooled = fmnist_pooled[0]
  for img in back:
    assert np.any(np.all(pooled == img, axis=1))


@pytest.fixture(scope="module")
def fmnist_official():
  if not FMNIST_DIR.exists():
    pytest.skip(f"real data {FMNIST_DIR} absent (../shared/data)")
  from tff_cluster.tasks import fmnist as fmnist_tasks
  return fmnist_tasks.official_split("fashion_mnist", str(FMNIST_DIR))


@pytest.fixture
def wecfl_options(fmnist_official, monkeypatch):
  from tff_cluster.tasks import fmnist as fmnist_tasks
  monkeypatch.setattr(fmnist_tasks, "_official", lambda options: fmnist_official)
  return DataOptions(data_dir=str(FMNIST_DIR))


def _cluster_sets(data):
  per_client = _labels_per_client(data)
  return per_client, [set().union(*[s for s, c in zip(per_client, data.true_clusters)
                                    if c == k]) for k in range(10)]


def test_fmnist_clusterwise_real_seed0(wecfl_options, fmnist_official):
  (_, y_tr), (_, y_te) = fmnist_official
  assert len(y_tr) == 60000 and len(y_te) == 10000
  data = REGISTRY["fmnist_clusterwise_dir"].load_data(wecfl_options)
  assert data.num_clients == 200
  assert np.bincount(data.true_clusters).tolist() == [20] * 10  # 10 x 20, in order
  assert data.true_clusters.tolist() == np.repeat(np.arange(10), 20).tolist()
  n_tr, n_te = data.num_train_samples(), data.num_test_samples()
  assert n_te.min() > 5  # clients with <= 5 test samples are dropped
  # seed 0 drops nobody here: at most the official sets, nothing twice.
  assert "0 clients dropped" in data.description and "0 duplicates" in data.description
  assert n_tr.sum() <= 60000 and n_te.sum() <= 10000 and n_te.sum() > 9800
  # The same proportions cut train and test (6,000 : 1,000 per class): sizes
  # stay near 6:1 per client (rounding of small counts moves them; seed 0:
  # 4.9 to 8.0).
  assert np.all((n_tr / n_te > 4.5) & (n_tr / n_te < 8.5))
  cls = REGISTRY["fmnist_clusterwise_class"].load_data(wecfl_options)
  assert cls.num_clients == 200 and np.bincount(cls.true_clusters).tolist() == [20] * 10
  per_client, per_cluster = _cluster_sets(cls)
  assert all(len(s) <= 2 for s in per_client)
  assert all(len(u) <= 3 for u in per_cluster)  # a cluster's 3 picked classes
  assert REGISTRY["fmnist_clusterwise_dir"].defaults["clients_per_round"] == 200
  x, _ = cls.train[cls.client_ids[0]]
  assert REGISTRY["fmnist_clusterwise_class"].model_fn()(x[:3]).shape == (3, 10)


def test_fmnist_clusterwise_options(wecfl_options):
  opts = lambda **extra: DataOptions(data_dir=wecfl_options.data_dir, extra=extra)
  five = REGISTRY["fmnist_clusterwise_dir"].load_data(opts(num_clusters=5))
  assert np.bincount(five.true_clusters).tolist() == [40] * 5
  ours = REGISTRY["fmnist_clusterwise_dir"].load_data(opts(recipe="ours"))
  assert ours.num_clients == 200 and "recipe=ours" in ours.description
  assert (ours.num_train_samples() + ours.num_test_samples()).sum() == 70000
  with pytest.raises(DataError, match="not a multiple") as info:
    REGISTRY["fmnist_clusterwise_dir"].load_data(
        DataOptions(data_dir=wecfl_options.data_dir, num_clients=201))
  assert "\n" not in str(info.value)


def test_fmnist_clientwise_real_seed0(wecfl_options):
  data = REGISTRY["fmnist_clientwise_dir"].load_data(wecfl_options)
  assert data.num_clients == 200 and data.true_clusters is None
  assert data.num_test_samples().min() > 5
  # P has 3 decimals (log10(10000 / 10)) and every class has 6,000 train and
  # 1,000 test images: round(6000 p) = 6 round(1000 p) exactly.
  assert np.array_equal(data.num_train_samples(), 6 * data.num_test_samples())
  assert "26 clients dropped (<= 5 test samples), 26 duplicates" in data.description
  ids = {}  # duplicates: identical test sets under two client ids
  for c in data.client_ids:
    ids.setdefault(data.test[c][1].tobytes() + data.test[c][0][:, 300].tobytes(), []).append(c)
  assert sum(len(v) - 1 for v in ids.values()) == 26
  cls = REGISTRY["fmnist_clientwise_class"].load_data(wecfl_options)
  assert cls.num_clients == 200 and all(len(s) <= 2 for s in _labels_per_client(cls))
  with pytest.raises(DataError, match="fedbase_quirks=true"):
    REGISTRY["fmnist_clientwise_dir"].load_data(DataOptions(
        data_dir=wecfl_options.data_dir, extra={"fedbase_quirks": False}))


def test_mnist_clusterwise_real(monkeypatch):
  if not MNIST_DIR.exists():
    pytest.skip(f"real data {MNIST_DIR} absent (../shared/data)")
  data = REGISTRY["mnist_clusterwise_class"].load_data(DataOptions(data_dir=str(MNIST_DIR)))
  assert data.num_clients == 200 and np.bincount(data.true_clusters).tolist() == [20] * 10
  assert "MNIST" in data.description and "Fashion" not in data.description
  assert all(len(s) <= 2 for s in _labels_per_client(data))


# ---------------------------------------------------------------------------
# MNIST and CIFAR-10 on generated files.


def test_mnist_from_idx(tmp_path):
  write_mnist_idx(tmp_path)  # 2,000 images, 200 of each digit
  data = REGISTRY["mnist"].load_data(DataOptions(data_dir=str(tmp_path),
                                                 num_clients=50))
  assert data.num_clients == 50 and data.num_classes == 10
  assert _labels_per_client(data) == [{u % 10, (u + 1) % 10} for u in range(50)]
  n = data.num_train_samples() + data.num_test_samples()
  assert n.min() >= 10
  assert data.num_train_samples().tolist() == [int(0.9 * k) for k in n]
  assert REGISTRY["mnist"].defaults["client_lr"] == 0.03
  assert REGISTRY["mnist"].defaults["num_clients"] == 1000
  # 201 devices put digit 0 in 41 slots: 205 images for phase 1, only 200.
  with pytest.raises(DataError, match="use at most 200 clients") as info:
    REGISTRY["mnist"].load_data(DataOptions(data_dir=str(tmp_path),
                                            num_clients=201))
  assert "\n" not in str(info.value)


def test_mnist_from_fedprox_json(tmp_path):
  users = {f"f_{i:05d}": ([[0.5] * 784] * 3, [i % 10, (i + 1) % 10, i % 10])
           for i in range(4)}
  write_json(tmp_path / "train" / "mytrain.json", users)
  write_json(tmp_path / "test" / "mytest.json", users)
  data = REGISTRY["mnist"].load_data(DataOptions(data_dir=str(tmp_path)))
  assert data.num_clients == 4 and data.num_train_samples().sum() == 12


# ---------------------------------------------------------------------------
# MNIST on the real idx files: FedProx's generator recipe.

# Seed 0 on the real MNIST: images the recipe uses (of 70,000) and the largest
# device (truncated shares leave the rest unused).
MNIST_SEED0_USED = 69041
MNIST_SEED0_LARGEST = 1854


@pytest.fixture(scope="module")
def real_mnist():
  if not MNIST_DIR.is_dir():
    pytest.skip(f"real data {MNIST_DIR} absent (../shared/data)")
  return vision.load_mnist(str(MNIST_DIR))


@pytest.fixture(scope="module")
def mnist_task(real_mnist):
  return REGISTRY["mnist"].load_data(DataOptions(data_dir=str(MNIST_DIR)))


def test_mnist_real_pixels_standardised_over_pool(real_mnist):
  x, y = real_mnist
  assert x.shape == (70000, 784) and np.bincount(y)[0] == 6903
  z = mnist_tasks.standardize_pixels(x)
  assert z.dtype == np.float32 and x.max() == 1.0  # x left untouched
  assert np.abs(z.mean(axis=0, dtype=np.float64)).max() < 1e-5
  # Pixel 0 is blank in every image: std 0, so (0 - 0) / 0.001 = 0.
  assert np.all(z[:, 0] == 0)
  # Pixel 406 (row 14, column 14), by hand on the raw 0-255 values.
  raw = np.rint(x[:, 406].astype(np.float64) * 255)
  mean = raw.sum() / 70000
  std = np.sqrt(((raw - mean) ** 2).sum() / 70000)
  for i in (0, 59999, 60000, 69999):  # train and test images alike
    assert z[i, 406] == pytest.approx((raw[i] - mean) / (std + 0.001), abs=1e-5)
  assert z[:, 406].std(dtype=np.float64) == pytest.approx(std / (std + 0.001),
                                                         rel=1e-5)


def test_mnist_real_fedprox_recipe(real_mnist, mnist_task):
  data = mnist_task
  assert data.num_clients == 1000
  assert data.client_ids == [f"client_{u:04d}" for u in range(1000)]
  assert _labels_per_client(data) == [{u % 10, (u + 1) % 10}
                                      for u in range(1000)]
  train, test = data.num_train_samples(), data.num_test_samples()
  n = train + test
  assert n.min() >= 10 and n.sum() == MNIST_SEED0_USED
  assert n.max() == MNIST_SEED0_LARGEST
  assert train.tolist() == [int(0.9 * k) for k in n]
  assert f"{MNIST_SEED0_USED:,} of 70,000" in data.description
  assert "standardised" in data.description
  # A device's train + test rows are its pooled images, standardised over
  # all 70,000 (not over the device or the used images).
  x, y = real_mnist
  part = partition.fedprox_mnist(y, 1000, 2, seed=0)
  # Device 0's first 5 images are the first five 0s of the training file.
  assert part.client_indices[0][:5].tolist() == np.flatnonzero(y == 0)[:5].tolist()
  z = mnist_tasks.standardize_pixels(x)
  for u in (0, 1, 999):
    cid = data.client_ids[u]
    got = np.concatenate([data.train[cid][0], data.test[cid][0]])
    want = z[part.client_indices[u]]
    assert np.array_equal(np.sort(got, axis=0), np.sort(want, axis=0))


def test_mnist_real_deterministic_by_seed(real_mnist, mnist_task, monkeypatch):
  x, y = real_mnist
  monkeypatch.setattr(vision, "load_mnist", lambda data_dir, data_source: (x.copy(), y))
  again = REGISTRY["mnist"].load_data(DataOptions(data_dir=str(MNIST_DIR)))
  for cid in mnist_task.client_ids:
    for split in ("train", "test"):
      a, b = getattr(mnist_task, split)[cid], getattr(again, split)[cid]
      assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
  sizes0 = partition.fedprox_mnist(y, 1000, 2, seed=0).sizes()
  assert np.array_equal(sizes0, mnist_task.num_train_samples()
                        + mnist_task.num_test_samples())
  assert not np.array_equal(partition.fedprox_mnist(y, 1000, 2, seed=1).sizes(),
                            sizes0)


def test_cifar10_task(tmp_path):
  write_cifar(tmp_path)
  spec = REGISTRY["cifar10"]
  data = spec.load_data(DataOptions(data_dir=str(tmp_path), num_clients=10,
                                    extra={"concentration": 0.3}))
  assert data.num_clients == 10
  assert (data.num_train_samples() + data.num_test_samples()).sum() == 600
  x, _ = data.train[data.client_ids[0]]
  assert x.shape[1:] == (32, 32, 3)
  assert spec.model_fn()(x[:2]).shape == (2, 10)


def test_tasks_are_importable_outside_a_checkout(tmp_path):
  """`tff_cluster.tasks` comes with the installed package: from another
  directory (no checkout on the path) the registry and a task's data load."""
  import subprocess
  import sys
  code = ("import sys; sys.path = [p for p in sys.path if p not in ('', '.')]; "
          "import tff_cluster, tff_cluster.tasks as t; "
          "assert 'rotated_mnist' in t.task_names(); "
          "from tff_cluster.spec.task import DataOptions; "
          "d = t.get_task('synthetic').load_data(DataOptions(num_clients=3)); "
          "print(d.num_clients, tff_cluster.__file__)")
  out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.startswith("3 ")
