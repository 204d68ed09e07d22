"""The rotated tasks (IFCA/CFL-MGD construction) and test-only clients."""

import numpy as np
import pytest

import tasks
from tasks import fmnist, rotated
from tests.conftest import SHARED_DATA
from tests.helpers import main_in_process
from tests.test_tasks import write_cifar
from tff_cluster import models
from tff_cluster.data.federated import FederatedData
from tff_cluster.data.partition import rotate_images
from tff_cluster.evaluation import Evaluator
from tff_cluster.task import DataOptions

MNIST = SHARED_DATA / "mnist"


def _row_counts(x):
  keys, counts = np.unique(np.ascontiguousarray(x).view(
      np.dtype((np.void, x.dtype.itemsize * x.shape[1]))).ravel(), return_counts=True)
  return dict(zip(keys.tolist(), counts.tolist()))


@pytest.fixture(scope="module")
def mnist_full():
  if not MNIST.is_dir():
    pytest.skip("../shared/data/mnist not available")
  data = tasks.get_task("rotated_mnist").load_data(DataOptions(seed=0, data_dir=str(MNIST)))
  return data, fmnist.official_split("mnist", str(MNIST))


def test_rotated_mnist_has_a_full_rotated_copy_per_cluster(mnist_full):
  data, ((x_train, _), (x_test, y_test)) = mnist_full
  assert data.num_clients == 2800 and data.num_training_clients == 2400
  assert set(data.num_train_samples()) == {0, 100}
  assert data.test_only().sum() == 400
  assert np.array_equal(np.bincount(data.true_clusters), [700] * 4)
  original = _row_counts(x_train)
  for p in range(4):
    members = [c for c, t, only in zip(data.client_ids, data.true_clusters, data.test_only())
               if t == p and not only]
    assert len(members) == 600
    images = np.concatenate([data.train[c][0] for c in members])
    back = rotate_images(images, -90 * p)  # undo the cluster's turn
    assert _row_counts(back) == original, f"cluster {p} is not the training set once"
  # Clusters are independent permutations: client 0 of clusters 0 and 1 differ.
  a = data.train["r000_train_0000"][0]
  b = rotate_images(data.train["r090_train_0000"][0], -90)
  assert not np.array_equal(a, b)
  # Test-only clients: the test set in order, rotated like their cluster.
  c = "r180_test_0007"
  assert len(data.train[c][1]) == 0
  np.testing.assert_array_equal(data.test[c][0], rotate_images(x_test[700:800], 180))
  np.testing.assert_array_equal(data.test[c][1], y_test[700:800])
  assert data.true_clusters[data.client_ids.index(c)] == 2


def test_small_settings_and_bad_ones():
  if not MNIST.is_dir():
    pytest.skip("../shared/data/mnist not available")
  task = tasks.get_task("rotated_fmnist")
  fm = SHARED_DATA / "fashion_mnist"
  if not fm.is_dir():
    pytest.skip("../shared/data/fashion_mnist not available")
  data = task.load_data(DataOptions(seed=1, data_dir=str(fm), extra={
      "num_clusters": 2, "clients_per_cluster": 3, "test_clients_per_cluster": 2}))
  assert data.num_clients == 10 and data.num_training_clients == 6
  assert task.model_fn().count_params() == 159010
  from tff_cluster.data.federated import DataError
  with pytest.raises(DataError, match="clients_per_cluster"):
    task.load_data(DataOptions(data_dir=str(fm), extra={"samples_per_client": 1000}))


def test_rotated_cifar10_on_generated_files(tmp_path, capsys):
  write_cifar(tmp_path, per_batch=20)  # 100 training, 20 test images
  task = tasks.get_task("rotated_cifar10")
  data = task.load_data(DataOptions(seed=0, data_dir=str(tmp_path), extra={
      "clients_per_cluster": 5, "samples_per_client": 10, "test_clients_per_cluster": 2}))
  assert data.num_training_clients == 10 and data.test_only().sum() == 4
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
  assert models.cifar_cnn_cflmgd().count_params() == 1068298
  out = tmp_path / "run"
  code, _, err = main_in_process(
      ["--algo=ifca", "--task=rotated_cifar10", f"--data_dir={tmp_path}", "--rounds=1",
       "--task_arg=clients_per_cluster=5", "--task_arg=samples_per_client=10",
       "--task_arg=test_clients_per_cluster=2", "--clients_per_round=4",
       "--local_epochs=1", "--runner=local", "--progress=false", f"--output_dir={out}"], capsys)
  assert code == 0, err


def _two_model_data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(8, 4)).astype(np.float32)
  train = {"a": (x[:4], np.zeros(4, np.int64)), "b": (x[4:], np.ones(4, np.int64)),
           "t0": (x[:0], np.zeros(0, np.int64)), "t1": (x[:0], np.zeros(0, np.int64))}
  test = {"a": (x[:2], np.zeros(2, np.int64)), "b": (x[:2], np.zeros(2, np.int64)),
          "t0": (x[:3], np.zeros(3, np.int64)), "t1": (x[:3], np.ones(3, np.int64))}
  return FederatedData(["a", "b", "t0", "t1"], train, test, 2)


def _constant_model(label):
  """MCLR weights that predict `label` for every input (bias only)."""
  kernel = np.zeros((4, 2), np.float32)
  bias = np.zeros(2, np.float32)
  bias[label] = 5.0
  return [kernel, bias]


def test_evaluator_lets_test_only_clients_choose_by_test_loss():
  data = _two_model_data()
  assert list(data.test_only()) == [False, False, True, True]
  assert list(data.training_clients()) == [0, 1]
  ev = Evaluator(lambda: models.mclr(4, 2), models.SPARSE_CE_LOGITS, data)
  weights = [_constant_model(0), _constant_model(1)]
  result = ev.evaluate(weights, np.array([1, 1, 0, 0]))
  # Training clients keep their assignment (model 1 on label-0 data: wrong);
  # t0 (labels 0) picks model 0, t1 (labels 1) picks model 1: both right.
  np.testing.assert_array_equal(result.client_model, [1, 1, 0, 1])
  np.testing.assert_array_equal(result.per_client_correct, [0, 0, 3, 3])


def test_rounds_sample_only_clients_with_training_data():
  from tff_cluster import experiment
  rng = np.random.default_rng(0)
  candidates = np.array([0, 1, 5, 7])
  for _ in range(20):
    picked = experiment.sample_clients(rng, candidates, 3)
    assert set(picked) <= set(candidates) and len(set(picked)) == 3
  # With every client a candidate, the draw equals the one from range(n).
  a = experiment.sample_clients(np.random.default_rng(4), 10, 4)
  b = experiment.sample_clients(np.random.default_rng(4), np.arange(10), 4)
  np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("algo", ["ifca", "fedgroup", "cfl_mgd", "fedavg"])
def test_test_only_clients_are_evaluated_never_trained(algo, tmp_path, capsys):
  if not MNIST.is_dir():
    pytest.skip("../shared/data/mnist not available")
  import json
  out = tmp_path / "run"
  code, _, err = main_in_process(
      [f"--algo={algo}", "--task=rotated_mnist", f"--data_dir={MNIST}", "--rounds=2",
       "--task_arg=num_clusters=2", "--task_arg=clients_per_cluster=6",
       "--task_arg=test_clients_per_cluster=2", "--clients_per_round=12",
       "--num_groups=2", "--local_steps=2", "--runner=local", "--progress=false",
       f"--output_dir={out}"], capsys)
  assert code == 0, err
  rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  assert all(0 < r["test_accuracy"] <= 1 for r in rows)
  summary = json.loads((out / "summary.json").read_text())
  if "final_assignment" in summary:  # test-only clients never got a group
    for cid, group in summary["final_assignment"].items():
      if "_test_" in cid:
        assert group == -1, (cid, group)
  code, _, err = main_in_process(
      [f"--algo={algo}", "--task=rotated_mnist", f"--data_dir={MNIST}", "--rounds=1",
       "--task_arg=num_clusters=2", "--task_arg=clients_per_cluster=6",
       "--task_arg=test_clients_per_cluster=2", "--clients_per_round=13",
       "--num_groups=2", f"--output_dir={tmp_path / 'bad'}"], capsys)
  assert code != 0 and "12 clients with training data (and 4 test-only clients)" in err
