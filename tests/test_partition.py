"""Tests of the partitioners: each checks the setting's defining property."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from tff_cluster.data import partition as P
from tff_cluster.data.federated import DataError

NUM_CLASSES = 10
LABELS = np.repeat(np.arange(NUM_CLASSES), 200)  # 10 classes x 200, sorted
N = len(LABELS)


def _assert_disjoint(part: P.Partition, n: int, all_used: bool = True):
  # No index twice, all in range, and (when documented) every sample used.
  flat = np.concatenate(part.client_indices)
  assert len(flat) == len(np.unique(flat)), "a sample was given twice"
  assert flat.min() >= 0 and flat.max() < n
  if all_used:
    assert len(flat) == n
  else:
    assert len(flat) <= n


def _classes(part: P.Partition, labels=LABELS):
  return [set(np.unique(labels[i]).tolist()) for i in part.client_indices]


def _entropy(part: P.Partition, labels=LABELS) -> float:
  # Mean label-distribution entropy (nats) over clients.
  out = []
  for idx in part.client_indices:
    p = np.bincount(labels[idx], minlength=NUM_CLASSES) / len(idx)
    p = p[p > 0]
    out.append(-(p * np.log(p)).sum())
  return float(np.mean(out))


def _same(a: P.Partition, b: P.Partition) -> bool:
  return (len(a.client_indices) == len(b.client_indices) and all(
      np.array_equal(x, y) for x, y in zip(a.client_indices, b.client_indices))
          and (a.true_clusters is None) == (b.true_clusters is None) and (
              a.true_clusters is None
              or np.array_equal(a.true_clusters, b.true_clusters)))


ALL = {
    "fedprox": lambda s: P.fedprox_mnist_noniid(LABELS, num_clients=100, seed=s),
    "pathological": lambda s: P.n_class_pathological(LABELS, 50, 2, s),
    "dirichlet": lambda s: P.dirichlet_label_skew(LABELS, 50, 0.5, s),
    "quantity": lambda s: P.quantity_skew(N, 50, 1.0, s),
    "cw_dirichlet": lambda s: P.clusterwise_dirichlet(LABELS, 5, 200, 0.1, 10, s),
    "cw_classes": lambda s: P.clusterwise_classes(LABELS, 5, 50, 3, 2, s),
    "rotation": lambda s: P.rotation_clusters(N, 40, 4, s),
    "permutation": lambda s: P.label_permutation_clusters(LABELS, 40, 4, 10, s),
}


@pytest.mark.parametrize("name", sorted(ALL))
def test_disjoint_all_used_and_deterministic(name):
  make = ALL[name]
  part = make(0)
  _assert_disjoint(part, N)
  assert all(len(i) > 0 for i in part.client_indices)
  assert _same(part, make(0))
  assert not _same(part, make(1))


def test_fedprox_two_digits_and_power_law_sizes():
  labels = np.repeat(np.arange(NUM_CLASSES), 1000)
  part = P.fedprox_mnist_noniid(labels, num_clients=200, seed=0)
  _assert_disjoint(part, len(labels))
  assert all(len(c) == 2 for c in _classes(part, labels))
  sizes = part.sizes()
  # Heavy tail: the largest client dwarfs the median one, unlike equal shards.
  assert sizes.max() / np.median(sizes) > 10
  assert sizes.min() >= 2  # at least one sample of each of its two digits


@pytest.mark.parametrize("k", [1, 2, 3])
def test_pathological_exact_classes_per_client(k):
  part = P.n_class_pathological(LABELS, 40, k, seed=3)
  _assert_disjoint(part, N)
  assert [len(c) for c in _classes(part)] == [k] * 40
  assert part.sizes().max() - part.sizes().min() <= 1  # equal shards


def test_pathological_unbalanced_labels_still_exact():
  rng = np.random.default_rng(0)
  labels = rng.choice(NUM_CLASSES, size=1500, p=np.linspace(1, 5, 10) / 30)
  part = P.n_class_pathological(labels, 60, 2, seed=0)
  _assert_disjoint(part, len(labels))
  assert all(len(c) == 2 for c in _classes(part, labels))


def test_pathological_too_many_classes_raises():
  with pytest.raises(DataError, match="classes_per_client"):
    P.n_class_pathological(LABELS, 10, 11, seed=0)


def test_dirichlet_concentration_controls_skew():
  skewed = P.dirichlet_label_skew(LABELS, 50, 0.1, seed=0)
  uniform = P.dirichlet_label_skew(LABELS, 50, 100.0, seed=0)
  _assert_disjoint(skewed, N)
  _assert_disjoint(uniform, N)
  present = lambda p: np.mean([len(c) for c in _classes(p)])
  assert present(skewed) < 5 < 9.5 < present(uniform)
  assert _entropy(skewed) < 0.6 * _entropy(uniform)


def test_dirichlet_min_samples_per_client():
  part = P.dirichlet_label_skew(LABELS, 400, 0.05, seed=1,
                                min_samples_per_client=3)
  _assert_disjoint(part, N)
  assert part.sizes().min() >= 3


def test_quantity_skew_sizes_follow_concentration():
  skewed = P.quantity_skew(N, 50, 0.1, seed=0)
  even = P.quantity_skew(N, 50, 1000.0, seed=0)
  assert skewed.sizes().min() >= 1
  assert skewed.sizes().std() > 5 * even.sizes().std()
  # Labels stay IID: big clients see (nearly) every class.
  big = skewed.client_indices[int(np.argmax(skewed.sizes()))]
  assert len(np.unique(LABELS[big])) == NUM_CLASSES


def test_quantity_skew_too_many_clients_raises():
  with pytest.raises(DataError, match="at least 1"):
    P.quantity_skew(10, 11, 1.0, seed=0)


def test_clusterwise_dirichlet_clusters_differ_clients_alike():
  m = 5
  part = P.clusterwise_dirichlet(LABELS, m, 200, 0.1, 10.0, seed=0)
  _assert_disjoint(part, N)
  assert np.array_equal(np.bincount(part.true_clusters), [40] * m)
  hist = np.stack([np.bincount(LABELS[i], minlength=NUM_CLASSES) / len(i)
                   for i in part.client_indices])
  # Clients of one cluster share its label mix; other clusters' mixes differ.
  within, between = [], []
  centers = np.stack([hist[part.true_clusters == k].mean(0) for k in range(m)])
  for k in range(m):
    d = np.abs(hist[part.true_clusters == k][:, None] - centers).sum(-1)  # L1
    within.append(d[:, k].mean())
    between.append(np.delete(d, k, axis=1).mean())
  assert np.mean(within) < 0.5 * np.mean(between)


def test_clusterwise_dirichlet_remainder_clients():
  part = P.clusterwise_dirichlet(LABELS, 3, 20, 0.5, 10.0, seed=0)
  assert sorted(np.bincount(part.true_clusters).tolist()) == [6, 7, 7]
  assert part.sizes().min() >= 1


@pytest.mark.parametrize("m,n_cluster,n_client", [(5, 3, 2), (3, 3, 2), (2, 5, 1)])
def test_clusterwise_classes_membership(m, n_cluster, n_client):
  part = P.clusterwise_classes(LABELS, m, 60, n_cluster, n_client, seed=2)
  _assert_disjoint(part, N, all_used=False)
  cluster_classes = part.cluster_info["cluster_classes"]
  assert all(len(set(c.tolist())) == n_cluster for c in cluster_classes)
  if m * n_cluster <= NUM_CLASSES:  # disjoint class sets when possible
    flat = np.concatenate(cluster_classes)
    assert len(np.unique(flat)) == len(flat)
  for classes, k in zip(_classes(part), part.true_clusters):
    assert len(classes) == n_client
    assert classes <= set(cluster_classes[k].tolist())


def test_rotation_clusters_and_transform():
  part = P.rotation_clusters(N, 10, 3, seed=0)
  _assert_disjoint(part, N)
  assert part.cluster_info["rotations"] == [0, 90, 180]
  assert sorted(np.bincount(part.true_clusters).tolist()) == [3, 3, 4]
  x = np.random.default_rng(0).random((N, 784)).astype(np.float32)
  data = P.build_federated_data(x, LABELS, part, NUM_CLASSES, 0, "rot",
                                transform=P.rotation_transform(part))
  for cid, k in zip(data.client_ids, data.true_clusters):
    xs, _ = data.train[cid]
    idx = part.client_indices[int(cid.split("_")[1])]
    # Every training image must be the pooled image rotated by 90 * k degrees.
    expected = {np.rot90(x[j].reshape(28, 28), k).tobytes() for j in idx}
    assert all(img.reshape(28, 28).tobytes() in expected for img in xs)


def test_rotate_images_shapes_and_direction():
  img = np.arange(16, dtype=np.float32).reshape(1, 4, 4)
  rot = P.rotate_images(img, 90)
  assert np.array_equal(rot[0], np.rot90(img[0]))  # counter-clockwise
  assert np.array_equal(P.rotate_images(img, 360), img)
  flat = np.arange(2 * 784, dtype=np.float32).reshape(2, 784)
  out = P.rotate_images(flat, 180)
  assert out.shape == (2, 784)
  assert np.array_equal(out[1].reshape(28, 28), flat[1].reshape(28, 28)[::-1, ::-1])
  nhwc = np.zeros((3, 5, 7, 2))
  assert P.rotate_images(nhwc, 270).shape == (3, 7, 5, 2)
  with pytest.raises(DataError, match="multiple of 90"):
    P.rotate_images(img, 45)
  with pytest.raises(DataError, match="square"):
    P.rotate_images(np.zeros((2, 10)), 90)


def test_label_permutation_clusters_and_transform():
  part = P.label_permutation_clusters(LABELS, 40, 4, NUM_CLASSES, seed=0)
  perms = part.cluster_info["permutations"]
  assert perms.shape == (4, NUM_CLASSES)
  assert np.array_equal(perms[0], np.arange(NUM_CLASSES))  # cluster 0: identity
  assert all(np.array_equal(np.sort(p), np.arange(NUM_CLASSES)) for p in perms)
  assert len({tuple(p) for p in perms}) == 4
  x = np.arange(N, dtype=np.float32)[:, None]  # x remembers the pooled index
  data = P.build_federated_data(x, LABELS, part, NUM_CLASSES, 0, "perm",
                                transform=P.label_permutation_transform(part))
  for cid, k in zip(data.client_ids, data.true_clusters):
    for xs, ys in (data.train[cid], data.test[cid]):
      orig = LABELS[xs[:, 0].astype(np.int64)]
      assert np.array_equal(ys, perms[k][orig])
  assert np.array_equal(P.permute_labels(np.array([0, 1, 2]), np.array([2, 0, 1])),
                        [2, 0, 1])


def test_label_permutation_too_many_clusters_raises():
  with pytest.raises(DataError, match="distinct permutations"):
    P.label_permutation_clusters(np.array([0, 1, 0, 1]), 4, 3, 2, seed=0)


def test_build_federated_data_split_and_ids():
  part = P.n_class_pathological(LABELS, 20, 2, seed=0)  # 100 samples each
  x = np.random.default_rng(0).random((N, 5)).astype(np.float32)
  data = P.build_federated_data(x, LABELS, part, NUM_CLASSES, 0, "desc")
  assert data.client_ids == [f"client_{i:04d}" for i in range(20)]
  assert np.all(data.num_train_samples() == 90)
  assert np.all(data.num_test_samples() == 10)
  assert data.true_clusters is None and data.description == "desc"
  # Train + test of a client are exactly its partition's samples.
  for i, cid in enumerate(data.client_ids):
    got = np.sort(np.concatenate([data.train[cid][0], data.test[cid][0]]), 0)
    assert np.array_equal(got, np.sort(x[part.client_indices[i]], 0))


def test_build_federated_data_skips_empty_clients():
  part = P.Partition([np.arange(0, 10), np.zeros(0, np.int64), np.arange(10, 30)],
                     np.array([0, 1, 2]), {})
  x = np.zeros((30, 2), np.float32)
  with pytest.warns(UserWarning, match="client 1 has no samples"):
    data = P.build_federated_data(x, LABELS[:30], part, NUM_CLASSES, 0, "d")
  assert data.client_ids == ["client_0000", "client_0002"]
  assert data.true_clusters.tolist() == [0, 2]


def test_build_federated_data_deterministic():
  part = P.rotation_clusters(N, 10, 2, seed=0)
  x = np.random.default_rng(0).random((N, 3)).astype(np.float32)
  a = P.build_federated_data(x, LABELS, part, NUM_CLASSES, 5, "d")
  b = P.build_federated_data(x, LABELS, part, NUM_CLASSES, 5, "d")
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # no empty-client warning here
    c = P.build_federated_data(x, LABELS, part, NUM_CLASSES, 6, "d")
  cid = a.client_ids[0]
  assert np.array_equal(a.train[cid][0], b.train[cid][0])
  assert not np.array_equal(a.train[cid][0], c.train[cid][0])


@pytest.mark.parametrize("call,match", [
    (lambda: P.dirichlet_label_skew(LABELS, 10, 0.0, 0), "concentration"),
    (lambda: P.dirichlet_label_skew(LABELS[:5], 10, 1.0, 0), "at least"),
    (lambda: P.clusterwise_dirichlet(LABELS, 5, 3, 0.1, 10, 0), "num_clusters"),
    (lambda: P.clusterwise_classes(LABELS, 2, 10, 2, 3, 0), "classes_per_client"),
    (lambda: P.rotation_clusters(N, 10, 5, 0), "num_clusters"),
    (lambda: P.n_class_pathological(LABELS.reshape(-1, 2), 10, 2, 0), "1-D"),
    (lambda: P.label_permutation_clusters(LABELS, 10, 2, 5, 0), "num_classes"),
])
def test_bad_arguments_raise_one_line(call, match):
  with pytest.raises(DataError, match=match) as info:
    call()
  assert "\n" not in str(info.value)
