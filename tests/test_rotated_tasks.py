"""The rotated tasks (IFCA/CFL-MGD construction) and test-only clients."""

import json

import numpy as np
import pytest

from tff_cluster import tasks
from tff_cluster.tasks import fmnist, rotated
from tests.conftest import SHARED_DATA
from tests.helpers import main_in_process
from tests.test_tasks import write_cifar
from tff_cluster import models
from tff_cluster.learning import evaluation
from tff_cluster.host import loop
from tff_cluster.host.driver import Driver, TrainingConfig, sample_clients
from tff_cluster.data.federated import DataError, FederatedData
from tff_cluster.data.partition import rotate_images
from tff_cluster.learning.evaluation import CHOOSE_BY_TEST_LOSS, Evaluator
from tff_cluster.spec.hparams import HParamError
from tff_cluster.spec.task import DataOptions

MNIST = SHARED_DATA / "mnist"
FASHION = SHARED_DATA / "fashion_mnist"
DIRS = {"rotated_mnist": ("mnist", MNIST), "rotated_fmnist": ("fashion_mnist", FASHION)}


def _need(path):
  if not path.is_dir():
    pytest.skip(f"../shared/data/{path.name} not available")


# ---------------------------------------------------------------------------
# The full tasks on the real data.


def _fingerprint(x: np.ndarray, angle: int = 0) -> np.ndarray:
  """An integer fingerprint of each flat image (pixels k/255), the same for an
  image and its copy turned by `angle` (the weights are turned alike): equal
  images give equal fingerprints; different ones practically never do. Three
  dot products with random integer weights < 84 (exact in float32: every
  partial sum is an integer below 2^24), mixed into one uint64."""
  w = np.random.default_rng(123).integers(0, 84, (3, 784)).astype(np.float32)
  w = rotate_images(w, angle).T
  f = (np.rint(np.asarray(x, np.float32) * np.float32(255.0)) @ w).astype(np.uint64)
  return (f[:, 0] * np.uint64(0x9E3779B97F4A7C15) ^ f[:, 1] * np.uint64(0xC2B2AE3D27D4EB4F)
          ^ f[:, 2])


def _source_rows(images, angle, train_fp, order):
  """Indices into the training set of `images` (turned by `angle`), found by
  fingerprint (a duplicated image maps to one of its copies)."""
  fp = _fingerprint(images, angle)
  pos = np.searchsorted(train_fp[order], fp)
  return order[np.minimum(pos, len(order) - 1)]


@pytest.fixture(scope="module", params=sorted(DIRS))
def full_task(request):
  name = request.param
  dataset, folder = DIRS[name]
  _need(folder)
  data = tasks.get_task(name).load_data(DataOptions(seed=0, data_dir=str(folder)))
  yield name, data, fmnist.official_split(dataset, str(folder))


@pytest.mark.slow
def test_full_rotated_task_counts_and_test_only_clients(full_task):
  _, data, (_, (x_test, y_test)) = full_task
  assert data.num_clients == 2800 and data.num_training_clients == 2400
  only = data.test_only()
  assert only.sum() == 400
  np.testing.assert_array_equal(data.num_train_samples(), np.where(only, 0, 100))
  np.testing.assert_array_equal(data.num_test_samples(), np.where(only, 100, 0))
  np.testing.assert_array_equal(np.bincount(data.true_clusters[~only]), [600] * 4)
  np.testing.assert_array_equal(np.bincount(data.true_clusters[only]), [100] * 4)
  ids = np.asarray(data.client_ids)
  for p, angle in enumerate((0, 90, 180, 270)):
    # Cluster p's test-only clients: the whole test set in order, turned by
    # its angle, 100 images each.
    members = ids[only & (data.true_clusters == p)]
    assert list(members) == [f"r{angle:03d}_test_{j:04d}" for j in range(100)]
    x = np.concatenate([data.test[c][0] for c in members])
    y = np.concatenate([data.test[c][1] for c in members])
    np.testing.assert_array_equal(x, rotate_images(x_test, angle))
    np.testing.assert_array_equal(y, y_test)
    assert all(len(data.train[c][0]) == 0 and data.train[c][0].shape[1:] == (784,)
               for c in members)
  x = data.train["r000_train_0000"][0]
  assert x.dtype == np.float32 and x.shape == (100, 784) and 0 <= x.min() and x.max() <= 1


@pytest.mark.slow
def test_full_rotated_task_holds_the_training_set_once_per_cluster(full_task):
  _, data, ((x_train, y_train), _) = full_task
  train_fp = _fingerprint(x_train)
  order = np.argsort(train_fp, kind="stable")
  ids = np.asarray(data.client_ids)
  sources = []
  for p, angle in enumerate((0, 90, 180, 270)):
    members = ids[~data.test_only() & (data.true_clusters == p)]
    assert list(members) == [f"r{angle:03d}_train_{j:04d}" for j in range(600)]
    x = np.concatenate([data.train[c][0] for c in members])
    y = np.concatenate([data.train[c][1] for c in members])
    # Every training image exactly once (as a multiset: duplicates included).
    np.testing.assert_array_equal(np.sort(_fingerprint(x, angle)), train_fp[order])
    # Each client image is its source image turned by the cluster's angle,
    # with its label.
    src = _source_rows(x, angle, train_fp, order)
    np.testing.assert_array_equal(x, rotate_images(x_train, angle, index=src))
    np.testing.assert_array_equal(y, y_train[src])
    sources.append(src)
  # The clusters' permutations are independent (IFCA's code).
  assert np.mean(sources[0] == sources[1]) < 0.01


@pytest.mark.slow
def test_shared_permutation_turns_the_same_images_per_cluster():
  _need(MNIST)
  task = tasks.get_task("rotated_mnist")
  data = task.load_data(DataOptions(seed=0, data_dir=str(MNIST), extra={
      "permutation": "shared", "test_clients_per_cluster": 1}))
  (x_train, _), _ = fmnist.official_split("mnist", str(MNIST))
  assert data.num_training_clients == 2400 and data.num_clients == 2404
  base = np.concatenate([data.train[f"r000_train_{j:04d}"][0] for j in range(600)])
  train_fp = _fingerprint(x_train)
  order = np.argsort(train_fp, kind="stable")
  src = _source_rows(base, 0, train_fp, order)
  for angle in (90, 180, 270):
    # Client j of cluster k: the same 100 source images as cluster 0's client
    # j, turned by 90k degrees.
    x = np.concatenate([data.train[f"r{angle:03d}_train_{j:04d}"][0] for j in range(600)])
    np.testing.assert_array_equal(x, rotate_images(base, angle))
    np.testing.assert_array_equal(x, rotate_images(x_train, angle, index=src))
    for j in (0, 599):
      np.testing.assert_array_equal(data.train[f"r{angle:03d}_train_{j:04d}"][1],
                                    data.train[f"r000_train_{j:04d}"][1])
  # Cluster 0 is the same under both settings (same seed).
  small = task.load_data(DataOptions(seed=0, data_dir=str(MNIST), extra={
      "num_clusters": 1, "clients_per_cluster": 3, "test_clients_per_cluster": 0}))
  np.testing.assert_array_equal(small.train["r000_train_0002"][0],
                                data.train["r000_train_0002"][0])


def test_small_settings_and_bad_ones():
  _need(FASHION)
  task = tasks.get_task("rotated_fmnist")
  data = task.load_data(DataOptions(seed=1, data_dir=str(FASHION), extra={
      "num_clusters": 2, "clients_per_cluster": 3, "test_clients_per_cluster": 2}))
  assert data.num_clients == 10 and data.num_training_clients == 6
  assert list(data.true_clusters) == [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]
  # P = 2: 0 and 180 degrees (IFCA's code).
  assert data.client_ids[5:7] == ["r180_train_0000", "r180_train_0001"]
  np.testing.assert_array_equal(data.test["r180_test_0001"][0], rotate_images(
      fmnist.official_split("fashion_mnist", str(FASHION))[1][0][100:200], 180))
  assert task.model_fn().count_params() == 159010
  assert task.defaults["clients_per_round"] == 2400 and task.defaults["local_steps"] == 10
  assert task.defaults["batch_size"] == 100 and task.defaults["num_groups"] == 4
  assert task.defaults["ifca_loss_batches"] == 1  # one batch = the whole 100 images
  with pytest.raises(DataError, match="clients_per_cluster"):
    task.load_data(DataOptions(data_dir=str(FASHION), extra={"samples_per_client": 1000}))
  with pytest.raises(HParamError, match="permutation=random; valid: per_cluster, shared"):
    task.load_data(DataOptions(data_dir=str(FASHION), extra={"permutation": "random"}))
  with pytest.raises(HParamError, match="num_clusters=5"):
    task.load_data(DataOptions(data_dir=str(FASHION), extra={"num_clusters": 5}))


def test_rotated_cifar10_on_generated_files(tmp_path, capsys):
  write_cifar(tmp_path, per_batch=20)  # 100 training, 20 test images
  task = tasks.get_task("rotated_cifar10")
  small = {"clients_per_cluster": 5, "samples_per_client": 10, "test_clients_per_cluster": 2}
  data = task.load_data(DataOptions(seed=0, data_dir=str(tmp_path), extra=small))
  assert data.num_training_clients == 10 and data.test_only().sum() == 4
  np.testing.assert_array_equal(data.true_clusters, [0] * 7 + [1] * 7)
  x, _ = data.train["r180_train_0001"]
  assert x.shape == (10, 24, 24, 3)
  flat = x.reshape(10, -1)
  np.testing.assert_allclose(flat.mean(axis=1), 0, atol=1e-5)
  np.testing.assert_allclose(flat.std(axis=1), 1, atol=1e-3)
  # 180 degrees: the test-only client of cluster 1 holds the first test images,
  # turned and then cropped as the model sees them.
  from tff_cluster.data import vision
  pooled, labels = vision.load_cifar10(str(tmp_path))  # train then test, pooled
  expected = rotated.crop_and_standardise(rotate_images(pooled[100:110], 180))
  np.testing.assert_allclose(data.test["r180_test_0000"][0], expected, atol=1e-5)
  np.testing.assert_array_equal(data.test["r180_test_0000"][1], labels[100:110])
  # A shared permutation: cluster 1's client j is cluster 0's turned by 180
  # degrees (the central crop and the per-image standardisation commute with it).
  shared = task.load_data(DataOptions(seed=0, data_dir=str(tmp_path),
                                      extra=dict(small, permutation="shared")))
  for j in range(5):
    a, ya = shared.train[f"r000_train_{j:04d}"]
    b, yb = shared.train[f"r180_train_{j:04d}"]
    np.testing.assert_allclose(b, rotate_images(a, 180), atol=1e-5)
    np.testing.assert_array_equal(ya, yb)
  assert models.cifar_cnn_cflmgd().count_params() == 1068298
  assert task.with_model("cifar_cnn_small").model_fn().count_params() == 73418
  assert task.defaults["num_groups"] == 2
  out = tmp_path / "run"
  code, _, err = main_in_process(
      ["--algo=ifca", "--task=rotated_cifar10", f"--data_dir={tmp_path}", "--rounds=1",
       "--task_arg=clients_per_cluster=5", "--task_arg=samples_per_client=10",
       "--task_arg=test_clients_per_cluster=2", "--clients_per_round=4",
       "--model=cifar_cnn_small", "--local_epochs=1", "--runner=local",
       "--progress=false", f"--output_dir={out}"], capsys)
  assert code == 0, err


def test_cifar_cnn_small_layers():
  model = models.cifar_cnn_small()
  convs = [l for l in model.layers if l.__class__.__name__ == "Conv2D"]
  assert [l.filters for l in convs] == [32, 64, 64]
  assert all(l.kernel_size == (3, 3) and l.padding == "valid" for l in convs)
  dense = [l for l in model.layers if l.__class__.__name__ == "Dense"]
  assert [l.units for l in dense] == [64, 10]
  assert dense[-1].activation.__name__ == "linear"  # logits
  assert model.count_params() == 122570


# ---------------------------------------------------------------------------
# The evaluator: test-only clients choose by their own test loss.


def _two_model_data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(8, 4)).astype(np.float32)
  train = {"a": (x[:4], np.zeros(4, np.int64)), "b": (x[4:], np.ones(4, np.int64)),
           "t0": (x[:0], np.zeros(0, np.int64)), "t1": (x[:0], np.zeros(0, np.int64))}
  test = {"a": (x[:2], np.zeros(2, np.int64)), "b": (x[:2], np.zeros(2, np.int64)),
          "t0": (x[:3], np.zeros(3, np.int64)), "t1": (x[:3], np.ones(3, np.int64))}
  return FederatedData(["a", "b", "t0", "t1"], train, test, 2)


def _constant_model(label, strength=5.0):
  """MCLR weights that predict `label` for every input (bias only)."""
  kernel = np.zeros((4, 2), np.float32)
  bias = np.zeros(2, np.float32)
  bias[label] = strength
  return [kernel, bias]


def _evaluator(data):
  return Evaluator(lambda: models.mclr(4, 2), models.SPARSE_CE_LOGITS, data)


def test_evaluator_lets_test_only_clients_choose_by_test_loss():
  data = _two_model_data()
  assert list(data.test_only()) == [False, False, True, True]
  assert list(data.training_clients()) == [0, 1]
  ev = _evaluator(data)
  weights = [_constant_model(0), _constant_model(1)]
  for given in ([1, 1, 0, 0], [1, 1, -1, -1], [1, 1, 1, 1]):
    result = ev.evaluate(weights, np.array(given))
    # Training clients keep their assignment (model 1 on label-0 data: wrong);
    # t0 (labels 0) picks model 0, t1 (labels 1) picks model 1: both right,
    # whatever the array said for them.
    np.testing.assert_array_equal(result.client_model, [1, 1, 0, 1])
    np.testing.assert_array_equal(result.per_client_correct, [0, 0, 3, 3])
  # Three models: the choice is the lowest mean test loss, not the first
  # model that classifies right (model 2 is the more confident label-1 model).
  weights3 = [_constant_model(0), _constant_model(1, 1.0), _constant_model(1, 8.0)]
  result = ev.evaluate(weights3, np.array([0, 0, -1, -1]))
  np.testing.assert_array_equal(result.client_model, [0, 0, 0, 2])
  # The same choices as CHOOSE_BY_TEST_LOSS gives the test-only clients.
  every = ev.evaluate(weights3, CHOOSE_BY_TEST_LOSS)
  np.testing.assert_array_equal(every.client_model[2:], [0, 2])


def test_evaluator_with_one_model_and_test_only_clients():
  ev = _evaluator(_two_model_data())
  result = ev.evaluate([_constant_model(0)], np.array([0, 0, -1, -1]))
  np.testing.assert_array_equal(result.client_model, [0, 0, 0, 0])
  np.testing.assert_array_equal(result.per_client_correct, [2, 2, 3, 0])
  assert result.accuracy == pytest.approx(7 / 10)


def test_client_weights_with_test_only_clients():
  # Test-only clients (no training data) make every tested client weigh by
  # its test samples: a (train 4, test 2), b (train 4, test 2), t0, t1 (test 3).
  data = _two_model_data()
  result = _evaluator(data).evaluate([_constant_model(0)], np.zeros(4, np.int64))
  np.testing.assert_allclose(result.client_weight, [0.2, 0.2, 0.3, 0.3])
  assert result.accuracy_clientavg == pytest.approx(0.2 + 0.2 + 0.3)
  assert evaluation.client_weights([5, 0, 3], [1, 2, 0]).tolist() == [1 / 3, 2 / 3, 0.0]
  # Without test-only clients: training sizes, as before.
  assert evaluation.client_weights([1, 3], [5, 5]).tolist() == [0.25, 0.75]
  # Clients without test data (the rotated tasks' training clients) weigh 0.
  assert evaluation.client_weights([100, 100, 0], [0, 0, 4]).tolist() == [0, 0, 1]


# ---------------------------------------------------------------------------
# Training never touches test-only clients.


def test_rounds_sample_only_clients_with_training_data():
  rng = np.random.default_rng(0)
  candidates = np.array([0, 1, 5, 7])
  for _ in range(20):
    picked = sample_clients(rng, candidates, 3)
    assert set(picked) <= set(candidates) and len(set(picked)) == 3
  # With every client a candidate, the draw equals the one from range(n).
  a = sample_clients(np.random.default_rng(4), 10, 4)
  b = sample_clients(np.random.default_rng(4), np.arange(10), 4)
  np.testing.assert_array_equal(a, b)


def test_run_training_refuses_more_clients_per_round_than_training_clients():
  data = _two_model_data()
  task = tasks.get_task("synthetic")
  config = TrainingConfig(rounds=1, clients_per_round=3, local_epochs=1,
                                     batch_size=2, client_lr=0.1)
  with pytest.raises(ValueError, match="clients_per_round=3: 2 clients have training "
                                       "data; valid: 1..2"):
    loop.run_training(task, data, config, driver=None, progress=False)


def test_api_process_never_trains_test_only_clients():
  from tff_cluster import api
  data = _two_model_data()
  process = api.build("fedavg",
      lambda: models.mclr(4, 2), models.SPARSE_CE_LOGITS, client_lr=0.1, local_epochs=1,
      batch_size=2, seed=0, runner="local")
  state = process.initialize(data)
  out = process.next(state)  # default: every client with training data
  assert out.metrics["test_accuracy"] >= 0
  with pytest.raises(ValueError, match="'t1' is test-only"):
    process.next(out.state, ["a", "t1"])
  with pytest.raises(ValueError, match="test-only"):
    process.next(out.state, [2])


RUN = ["--task=rotated_mnist", "--rounds=2", "--task_arg=num_clusters=2",
       "--task_arg=clients_per_cluster=6", "--task_arg=test_clients_per_cluster=2",
       "--num_groups=2", "--local_steps=2", "--progress=false"]
TEST_ONLY = {"r000_test_0000", "r000_test_0001", "r180_test_0000", "r180_test_0001"}


def _saved_choices_and_losses(run_dir, data):
  """The run's final choice per client id (`clients.json`) and each client's
  mean test loss under each saved final model, [models, clients]."""
  import tensorflow as tf


  info = json.loads((run_dir / "models" / "final" / "clients.json").read_text())
  weights = [models.get_weights(tf.keras.models.load_model(
      run_dir / "models" / "final" / f"model_{j}.keras", compile=False))
             for j in range(info["num_models"])]
  ev = Evaluator(tasks.get_task("rotated_mnist").model_fn, models.SPARSE_CE_LOGITS, data)
  counts = np.maximum(data.num_test_samples(), 1)
  losses = np.stack([ev.evaluate([w], np.zeros(data.num_clients, np.int64))
                     .per_client_loss_sum / counts for w in weights])
  return info["client_model"], losses


@pytest.mark.slow
@pytest.mark.parametrize("algo,runner", [
    ("ifca", "local"), ("fedgroup", "local"), ("cfl_mgd", "local"), ("fedavg", "local"),
    ("wecfl", "local"), ("cfl", "local"), ("ifca", "tff"), ("wecfl", "tff")])
def test_test_only_clients_are_evaluated_never_trained(algo, runner, tmp_path, capsys,
                                                      monkeypatch):
  _need(MNIST)
  trained = []
  original = Driver.train_clients

  def recording(self, mode, state, clients, *args, **kwargs):
    trained.extend(self.data.client_ids[int(k)] for k in clients)
    return original(self, mode, state, clients, *args, **kwargs)

  monkeypatch.setattr(Driver, "train_clients", recording)
  out = tmp_path / "run"
  code, _, err = main_in_process(
      [f"--algo={algo}", f"--runner={runner}", f"--data_dir={MNIST}",
       "--clients_per_round=12", f"--output_dir={out}", *RUN], capsys)
  assert code == 0, err
  assert trained and not set(trained) & TEST_ONLY  # never trained
  assert len(set(trained)) == 12  # every training client was
  rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  assert all(0 < r["test_accuracy"] <= 1 for r in rows)
  summary = json.loads((out / "summary.json").read_text())
  assignment = summary.get("final_assignment", summary.get("last_training_cluster"))
  if algo != "fedavg":  # test-only clients never got a group
    assert {c for c, g in assignment.items() if g < 0} == TEST_ONLY
  # Evaluated: each test-only client with the saved model of lowest loss on
  # its own test data, whether the algorithm chooses by loss (IFCA, CFL-MGD)
  # or returns an assignment (FedGroup, WeCFL, CFL).
  data = tasks.get_task("rotated_mnist").load_data(DataOptions(
      seed=0, data_dir=str(MNIST), extra={"num_clusters": 2, "clients_per_cluster": 6,
                                          "test_clients_per_cluster": 2}))
  saved, losses = _saved_choices_and_losses(out, data)
  for k, c in enumerate(data.client_ids):
    if c in TEST_ONLY:  # (ties within rounding: e.g. FedGroup's auxiliary model)
      assert losses[saved[c], k] <= losses[:, k].min() + 1e-5, (c, saved[c], losses[:, k])
  last = rows[-1]
  if algo in ("wecfl", "cfl"):  # sizes count the assigned (training) clients only
    assert sum(last[f"group_{j}_size"] for j in range(2)) == 12
    assert "ari" in last and "purity" in last
  if algo in ("ifca", "cfl_mgd"):
    # Under the default --ifca_eval=assigned the sizes count the assigned
    # (training) clients with the cluster they last trained; test-only
    # clients, which choose by test loss, are not in them.
    groups = [assignment[c] for c in data.client_ids if c not in TEST_ONLY]
    assert len(groups) == 12
    for j in range(2):
      assert last[f"group_{j}_size"] == groups.count(j)


def test_too_many_clients_per_round_names_the_test_only_clients(tmp_path, capsys):
  _need(MNIST)
  code, _, err = main_in_process(
      ["--algo=ifca", f"--data_dir={MNIST}", "--clients_per_round=13",
       f"--output_dir={tmp_path / 'bad'}", *RUN], capsys)
  assert code == 2
  assert ("invalid --clients_per_round=13: the task has 12 clients with training data "
          "(and 4 test-only clients); valid: 1..12") in err


def test_pfl_research_cifar10_users():
  """pfl-research's split: standardised by the training images' channel
  statistics, users are consecutive blocks of one shuffle of the training
  images (disjoint, all used when they fill it), the test images dealt out
  in order; too many users for the images is one clear line."""
  from tff_cluster.tasks import cifar10
  rng = np.random.default_rng(0)
  x_train = rng.uniform(size=(30, 4, 4, 3)).astype(np.float32) * [1, 2, 3]
  y_train = np.arange(30) % 10
  x_test = rng.uniform(size=(10, 4, 4, 3)).astype(np.float32)
  y_test = np.arange(10)
  data = cifar10.pfl_iid_users(x_train, y_train, x_test, y_test, 6, seed=3, per_user=5)
  assert data.client_ids == [f"user_{u:04d}" for u in range(6)]
  mean, std = x_train.mean(axis=(0, 1, 2)), x_train.std(axis=(0, 1, 2))
  seen = []
  for cid in data.client_ids:
    x, y = data.train[cid]
    assert x.shape == (5, 4, 4, 3) and x.dtype == np.float32
    rows = [int(np.argmin(np.abs(x_train - (xi * std + mean)).sum(axis=(1, 2, 3)))) for xi in x]
    np.testing.assert_array_equal(y, y_train[rows])
    seen += rows
  assert sorted(seen) == list(range(30))  # 6 x 5 = every training image once
  pooled = np.concatenate([data.train[c][0] for c in data.client_ids])
  np.testing.assert_allclose(pooled.mean(axis=(0, 1, 2)), 0, atol=1e-5)
  np.testing.assert_allclose(pooled.std(axis=(0, 1, 2)), 1, atol=1e-4)
  np.testing.assert_array_equal(np.concatenate([data.test[c][1] for c in data.client_ids]),
                                y_test)
  np.testing.assert_allclose(data.test["user_0000"][0], (x_test[:2] - mean) / std, atol=1e-5)
  with pytest.raises(ValueError, match=r"num_clients=7 x 5 images needs 35 training images; "
                                       r"valid: at most 6 users"):
    cifar10.pfl_iid_users(x_train, y_train, x_test, y_test, 7, seed=3, per_user=5)


@pytest.mark.slow
def test_pfl_research_cifar10_task_runs(tmp_path, capsys):
  """The task on CIFAR-10's own files (generated: 100 training images, 20
  test): 2 users of 50, the simple CNN, one round side by side."""
  write_cifar(tmp_path, per_batch=20)
  data = tasks.get_task("cifar10_pfl").load_data(
      DataOptions(seed=0, data_dir=str(tmp_path), num_clients=2))
  assert [len(data.train[c][1]) for c in data.client_ids] == [50, 50]
  assert [len(data.test[c][1]) for c in data.client_ids] == [10, 10]
  out = tmp_path / "run"
  code, _, err = main_in_process(
      ["--algo=fedavg", "--task=cifar10_pfl", f"--data_dir={tmp_path}", "--rounds=1",
       "--num_clients=2", "--clients_per_round=2", "--client_batching=parallel",
       "--progress=false", f"--output_dir={out}"], capsys)
  assert code == 0, err
  config = json.loads((out / "config.json").read_text())
  assert config["runner_info"]["client_batching"] == "parallel"
