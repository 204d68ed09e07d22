"""mnist_workers: pFedMo's MNIST splits on the real MNIST files."""

import numpy as np
import pytest

from tff_cluster import tasks
from tff_cluster.tasks import fmnist, mnist_workers
from tests.conftest import SHARED_DATA
from tff_cluster.data.federated import DataError
from tff_cluster.spec.task import DataOptions

MNIST = SHARED_DATA / "mnist"


@pytest.fixture(scope="module")
def labels():
  if not MNIST.is_dir():
    pytest.skip("../shared/data/mnist not available")
  (_, y_train), (_, y_test) = fmnist.official_split("mnist", str(MNIST))
  return y_train, y_test


def _disjoint(rows, total):
  joined = np.concatenate(rows)
  assert len(np.unique(joined)) == len(joined), "a sample is dealt twice"
  assert joined.min() >= 0 and joined.max() < total


def test_iid_deals_everything_equally(labels):
  y_train, y_test = labels
  train, test, _ = mnist_workers.split_workers(y_train, y_test, 4, "iid", seed=0)
  _disjoint(train, len(y_train))
  assert sorted(np.concatenate(train)) == list(range(len(y_train)))
  assert [len(r) for r in train] == [15000] * 4
  assert [len(r) for r in test] == [2500] * 4
  # IID: every worker sees every class in about the global proportion.
  share = np.bincount(y_train, minlength=10) / len(y_train)
  for r in train:
    np.testing.assert_allclose(np.bincount(y_train[r], minlength=10) / len(r), share, atol=0.01)


@pytest.mark.parametrize("classes", [3, 6, 9])
def test_label_skew_gives_each_worker_its_classes_in_equal_counts(labels, classes):
  y_train, y_test = labels
  train, test, how = mnist_workers.split_workers(y_train, y_test, 4, "label", seed=1,
                                                  classes_per_worker=classes)
  _disjoint(train, len(y_train))
  _disjoint(test, len(y_test))
  sizes = {len(r) for r in train}
  assert len(sizes) == 1, "every worker holds the same number of samples"
  for r, t in zip(train, test):
    present = np.flatnonzero(np.bincount(y_train[r], minlength=10))
    assert len(present) == classes
    counts = np.bincount(y_train[r], minlength=10)[present]
    assert counts.min() == counts.max()  # balanced over its classes
    assert set(np.unique(y_test[t])) == set(present)
  assert f"{classes} classes per worker" in how


def test_quantity_skew_has_the_papers_shares_of_every_class(labels):
  y_train, y_test = labels
  train, test, _ = mnist_workers.split_workers(y_train, y_test, 4, "quantity", seed=0)
  _disjoint(train, len(y_train))
  sizes = np.array([len(r) for r in train])
  np.testing.assert_allclose(sizes, [5000, 12500, 17500, 25000], atol=10)
  share = np.bincount(y_train, minlength=10) / len(y_train)
  for r in train:
    np.testing.assert_allclose(np.bincount(y_train[r], minlength=10) / len(r), share,
                               atol=0.002)
  np.testing.assert_allclose([len(t) for t in test],
                             np.array([5000, 12500, 17500, 25000]) / 6, atol=10)
  with pytest.raises(DataError, match="split=quantity"):
    mnist_workers.split_workers(y_train, y_test, 5, "quantity", seed=0)


def test_dirichlet_is_seeded_disjoint_and_skewed(labels):
  y_train, y_test = labels
  a = mnist_workers.split_workers(y_train, y_test, 4, "dirichlet", seed=3,
                                  dirichlet_alpha=0.05)
  b = mnist_workers.split_workers(y_train, y_test, 4, "dirichlet", seed=3,
                                  dirichlet_alpha=0.05)
  for ra, rb in zip(a[0], b[0]):
    np.testing.assert_array_equal(ra, rb)
  _disjoint(a[0], len(y_train))
  assert sum(len(r) for r in a[0]) >= len(y_train) - 40  # floors lose a few per class
  assert min(len(r) for r in a[0]) >= mnist_workers.MIN_TRAIN
  # xi = 0.05 concentrates each class on few workers; xi = 1 spreads it.
  def top_share(rows):
    counts = np.array([np.bincount(y_train[r], minlength=10) for r in rows])
    return np.mean(counts.max(axis=0) / counts.sum(axis=0))
  spread = mnist_workers.split_workers(y_train, y_test, 4, "dirichlet", seed=3,
                                       dirichlet_alpha=1.0)
  assert top_share(a[0]) > 0.8 > top_share(spread[0])


def test_task_sets_a_disjoint_public_set_aside():
  if not MNIST.is_dir():
    pytest.skip("../shared/data/mnist not available")
  task = tasks.get_task("mnist_workers")
  data = task.load_data(DataOptions(seed=0, data_dir=str(MNIST),
                                    extra={"public_size": 6000}))
  assert data.client_ids == [f"worker_{i}" for i in range(4)]
  assert len(data.public[1]) == 6000
  assert data.num_train_samples().sum() == 54000
  assert data.num_test_samples().sum() == 10000
  # The public images are not among the workers' (compare the rows' bytes;
  # MNIST's train set has no exact duplicates among these).
  workers = {row.tobytes() for c in data.client_ids for row in data.train[c][0]}
  assert not any(row.tobytes() in workers for row in data.public[0])
  none = task.load_data(DataOptions(seed=0, data_dir=str(MNIST), extra={"public_size": 0}))
  assert none.public is None and none.num_train_samples().sum() == 60000
  assert task.with_model("logistic").model_fn().count_params() == 7850
  assert task.model_fn().count_params() == 61706
