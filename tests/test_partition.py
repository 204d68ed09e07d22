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


# FedProx's MNIST recipe on 10 devices x 2 digits: digit l's k-th image is
# pooled index l + 10 k (30 images per digit), so every index is hand-checkable.
FEDPROX_LABELS = np.tile(np.arange(NUM_CLASSES), 30)


def _digit_images(digit, start, stop):
  return [digit + 10 * k for k in range(start, stop)]


def test_fedprox_mnist_phase1_exact_images_and_digits():
  part = P.fedprox_mnist(FEDPROX_LABELS, num_clients=10, classes_per_client=2,
                         seed=0)
  assert part.num_clients == 10 and part.true_clusters is None
  assert part.cluster_info["classes"].tolist() == [
      [u, (u + 1) % 10] for u in range(10)]
  idx = part.client_indices
  # Device 0 takes the first 5 of digit 0, then the first 5 of digit 1.
  assert idx[0][:10].tolist() == [0, 10, 20, 30, 40, 1, 11, 21, 31, 41]
  # Device 1: digit 1's cursor is at 5 (device 0 took 5); digit 2 is fresh.
  assert idx[1][:10].tolist() == [51, 61, 71, 81, 91, 2, 12, 22, 32, 42]
  # Device 9: digit 9 after device 8's five, digit 0 after device 0's five.
  assert idx[9][:10].tolist() == [59, 69, 79, 89, 99, 50, 60, 70, 80, 90]
  for u in range(1, 9):
    assert idx[u][:10].tolist() == (_digit_images(u, 5, 10)
                                    + _digit_images(u + 1, 0, 5))
  for u in range(10):  # exactly the digits (u, u+1) mod 10
    assert set(FEDPROX_LABELS[idx[u]].tolist()) == {u, (u + 1) % 10}
  flat = np.concatenate(idx)
  assert len(flat) == len(np.unique(flat))  # no image used twice


def test_fedprox_mnist_phase2_shares_from_seeded_lognormal():
  part = P.fedprox_mnist(FEDPROX_LABELS, 10, 2, seed=7)
  props = np.random.default_rng(7).lognormal(0.0, 2.0, (10, 1, 2))
  np.testing.assert_array_equal(part.cluster_info["props"], props)
  # 30 images per digit, 2 slots x 5 taken in phase 1: 20 left to share.
  shares = 20 * props / props.sum(axis=(1, 2), keepdims=True)
  np.testing.assert_allclose(part.cluster_info["shares"], shares, rtol=1e-12)
  n = shares.astype(np.int64)  # n[l, 0, j]: slot j of the device holding l there
  idx = part.client_indices
  # Device u gets int(shares[u, 0, 0]) of digit u and int(shares[u+1, 0, 1])
  # of digit u+1; sums of truncated shares stay below 20, so none is refused.
  assert part.cluster_info["slots_refused"] == 0
  sizes = [10 + n[u, 0, 0] + n[(u + 1) % 10, 0, 1] for u in range(10)]
  assert part.sizes().tolist() == sizes
  assert part.cluster_info["samples_used"] == sum(sizes)
  # Digit 3's cursor after phase 1 is 10; device 2 (slot 1) reads it first,
  # then device 3 (slot 0).
  a, b = n[3, 0, 1], n[3, 0, 0]
  assert idx[2][10 + n[2, 0, 0]:].tolist() == _digit_images(3, 10, 10 + a)
  assert idx[3][10:10 + b].tolist() == _digit_images(3, 10 + a, 10 + a + b)
  # Digit 0: device 0 (slot 0, u = 0) reads before device 9 (slot 1).
  c, d = n[0, 0, 0], n[0, 0, 1]
  assert idx[0][10:10 + c].tolist() == _digit_images(0, 10, 10 + c)
  assert idx[9][10 + n[9, 0, 0]:].tolist() == _digit_images(0, 10 + c,
                                                           10 + c + d)
  flat = np.concatenate(idx)
  assert len(flat) == len(np.unique(flat))
  assert P.fedprox_mnist(FEDPROX_LABELS, 10, 2, seed=7).sizes().tolist() == sizes
  assert P.fedprox_mnist(FEDPROX_LABELS, 10, 2, seed=8).sizes().tolist() != sizes


def test_fedprox_mnist_strict_cursor_rule():
  # One device per digit (c = 1, 3 devices): a share is all 95 images left,
  # and FedProx only takes it if cursor + n < count: 5 + 95 is not < 100.
  labels = np.repeat(np.arange(NUM_CLASSES), 100)
  part = P.fedprox_mnist(labels, 3, 1, seed=3)
  shares = part.cluster_info["shares"][:3, 0, 0]
  n = shares.astype(np.int64)
  want = [5 + k if 5 + k < 100 else 5 for k in n]
  assert part.sizes().tolist() == want
  assert 5 in want  # at least one refusal is exercised (95.0 exactly)
  assert part.cluster_info["slots_refused"] == want.count(5)
  assert part.client_indices[0][:5].tolist() == [0, 1, 2, 3, 4]


def test_fedprox_mnist_general_n_scales_by_slots():
  # N = 15: slot 0 holds digits 0..9, 0..4 and slot 1 holds 1..9, 0, 1..5,
  # so digit 0 sits in 2 + 1 slots, 1..4 in 2 + 2, 5 in 1 + 2, 6..9 in 1 + 1.
  labels = np.repeat(np.arange(NUM_CLASSES), 200)
  part = P.fedprox_mnist(labels, 15, 2, seed=0)
  digits = part.cluster_info["classes"]
  slots = np.bincount(digits.ravel(), minlength=10)
  assert slots.tolist() == [3, 4, 4, 4, 4, 3, 2, 2, 2, 2]
  # Block 1 (devices 10..14) reads props[l, 1, 0] only for l = 0..4: digit 9's
  # unread entry takes no share, so scaling all of props[9] would fall short.
  assert part.cluster_info["shares"][9].sum() > 200 - 5 * 2
  shares = part.cluster_info["shares"]
  for l in range(10):  # the shares read by some slot sum to 200 - 5 * slots
    read = sum(shares[l, u // 10, j] for u in range(15) for j in range(2)
               if digits[u, j] == l)
    assert read == pytest.approx(200 - 5 * slots[l])
  assert part.cluster_info["props"].shape == (10, 2, 2)  # ceil(15 / 10) blocks


def test_fedprox_mnist_phase1_too_small_is_one_line():
  labels = np.repeat(np.arange(NUM_CLASSES), 200)
  P.fedprox_mnist(labels, 200, 2, seed=0)  # 40 slots x 5 = 200 per digit: fits
  with pytest.raises(DataError, match="digit 0 has 200 images but 41 "
                     "device-slots need 205; use at most 200 clients") as info:
    P.fedprox_mnist(labels, 201, 2, seed=0)
  assert "\n" not in str(info.value)


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
    (lambda: P.fedprox_mnist(LABELS + 1, 10, 2, 0), "digit labels 0..9"),
    (lambda: P.fedprox_mnist(LABELS, 10, 11, 0), "classes_per_client"),
    (lambda: P.fedprox_mnist(LABELS, 0, 2, 0), "num_clients"),
])
def test_bad_arguments_raise_one_line(call, match):
  with pytest.raises(DataError, match=match) as info:
    call()
  assert "\n" not in str(info.value)


# ---------------------------------------------------------------------------
# The WeCFL authors' split (FedBase): train and test cut with one matrix.


def _scripted(monkeypatch, matrices):
  """Makes fedbase_proportions return `matrices` in turn (a hand-set P)."""
  it = iter(matrices)
  monkeypatch.setattr(P, "fedbase_proportions",
                      lambda *args, **kwargs: np.array(next(it), dtype=float))


def test_fedbase_all_pick_consecutive_runs_rounding_overshoot():
  # 2 classes, 3 nodes, every node picks both: P = 1 / (3 + 1e-10) everywhere.
  # Train: class 1 at indices 1, 3, ..., 11 (6 samples), class 0 elsewhere (15).
  y_tr = np.zeros(21, np.int64)
  y_tr[[1, 3, 5, 7, 9, 11]] = 1
  cls0 = np.flatnonzero(y_tr == 0)
  assert len(cls0) == 15
  y_te = np.array([0] * 9 + [1] * 12)  # test: 3 + 4 = 7 > 5 per node
  part = P.fedbase_split(y_tr, y_te, 3, 2, "class", seed=0)
  assert part.num_clients == 3 and part.info["dropped"] == 0
  assert part.info["duplicated"] == 0 and part.true_clusters is None
  # round(15 / 3) = 5 of class 0, 2 of class 1, consecutive in dataset order.
  assert part.train_indices[0].tolist() == cls0[0:5].tolist() + [1, 3]
  assert part.train_indices[1].tolist() == cls0[5:10].tolist() + [5, 7]
  assert part.train_indices[2].tolist() == cls0[10:15].tolist() + [9, 11]
  # The test set is cut with the same P: 3 of class 0 and 4 of class 1 each.
  assert part.test_indices[1].tolist() == [3, 4, 5, 13, 14, 15, 16]
  # Overshoot: 11 samples of class 0 among 3 nodes -> 4, 4, 3 (clipped).
  y_small = np.array([0] * 11 + [1] * 6)
  over = P.fedbase_split(y_small, y_te, 3, 2, "class", seed=0)
  assert [len(i) for i in over.train_indices] == [4 + 2, 4 + 2, 3 + 2]
  assert over.train_indices[2].tolist() == [8, 9, 10, 15, 16]


def test_fedbase_dirichlet_counts_follow_the_drawn_matrix():
  # 10 classes; train interleaved (class c at c, c+10, ...), 60 per class;
  # test 20 per class -> P rounded to round(log10(200 / 10)) = 1 decimal.
  y_tr = np.tile(np.arange(10), 60)
  y_te = np.repeat(np.arange(10), 20)
  part = P.fedbase_split(y_tr, y_te, 4, 100.0, "dirichlet", seed=3)
  assert part.info["draws"] == 1 and part.info["dropped"] == 0
  p = part.info["proportions"][0]
  want = np.round(np.random.default_rng(3).dirichlet(np.full(4, 100.0), size=10), 1)
  assert np.array_equal(p, want)
  assert np.allclose(p * 10, np.round(p * 10))  # 1 decimal
  for c in range(10):
    tr_c, te_c = np.flatnonzero(y_tr == c), np.flatnonzero(y_te == c)
    stop_tr = np.minimum(np.cumsum(np.round(60 * p[c])), 60).astype(int)
    stop_te = np.minimum(np.cumsum(np.round(20 * p[c])), 20).astype(int)
    for j in range(4):
      got_tr = part.train_indices[j][y_tr[part.train_indices[j]] == c]
      got_te = part.test_indices[j][y_te[part.test_indices[j]] == c]
      start_tr = stop_tr[j - 1] if j else 0
      start_te = stop_te[j - 1] if j else 0
      assert got_tr.tolist() == tr_c[start_tr:stop_tr[j]].tolist()
      assert got_te.tolist() == te_c[start_te:stop_te[j]].tolist()
  # A hand-checked entry: node 0 holds round(60 * P[0, 0]) of class 0 in train
  # and round(20 * P[0, 0]) in test, e.g. 0.3 -> 18 and 6.
  n0 = int(np.sum(y_tr[part.train_indices[0]] == 0))
  assert n0 == round(60 * p[0, 0]) and n0 % 6 == 0
  assert np.sum(y_te[part.test_indices[0]] == 0) == n0 // 3


def test_fedbase_drop_and_replace_with_quirks(monkeypatch):
  y = np.zeros(40, np.int64)  # one class, 40 train and 40 test samples
  _scripted(monkeypatch, [[[0.5, 0.15, 0.125, 0.1]],   # test 20, 6, 5, 4
                          [[0.25, 0.1, 0.1, 0.1]]])    # test 10, 4, 4, 4
  part = P.fedbase_split(y, y, 4, 1.0, "dirichlet", seed=0, quirks=True)
  # Draw 1 keeps 2 <= 4 // 2 nodes (6 > 5 kept, 5 dropped): draw 2 is appended.
  assert part.info["draws"] == 2 and part.info["dropped"] == 5
  assert part.info["duplicated"] == 1 and part.num_clients == 4
  tests = [t.tolist() for t in part.test_indices]
  assert tests[:3] == [list(range(20)), list(range(20, 26)), list(range(10))]
  assert part.train_indices[2].tolist() == list(range(10))  # overlaps client 0
  assert tests[3] in tests[:3]  # a duplicate of a kept client
  k = tests[:3].index(tests[3])
  assert np.array_equal(part.train_indices[3], part.train_indices[k])


def test_fedbase_without_quirks_redraws_until_all_kept(monkeypatch):
  y = np.zeros(40, np.int64)
  _scripted(monkeypatch, [[[0.5, 0.15, 0.125, 0.1]], [[0.25, 0.1, 0.1, 0.1]],
                          [[0.25, 0.25, 0.25, 0.25]]])
  part = P.fedbase_split(y, y, 4, 1.0, "dirichlet", seed=0, quirks=False)
  assert part.info["draws"] == 3 and part.info["duplicated"] == 0
  assert [t.tolist() for t in part.test_indices] == [
      list(range(10 * j, 10 * j + 10)) for j in range(4)]


def test_fedbase_class_picks_are_independent_uniform():
  y_tr = np.repeat(np.arange(10), 60)
  y_te = np.repeat(np.arange(10), 30)
  part = P.fedbase_split(y_tr, y_te, 20, 2, "class", seed=5)
  p = part.info["proportions"][0]
  rng = np.random.default_rng(5)
  picks = [sorted(rng.choice(10, 2, replace=False).tolist()) for _ in range(20)]
  assert [np.flatnonzero(p[:, j]).tolist() for j in range(20)] == picks
  pickers = np.bincount(np.concatenate(picks), minlength=10)
  for c in range(10):  # P[c, j] = 1 / (number of nodes that picked c)
    if pickers[c]:
      assert np.allclose(p[c][p[c] > 0], 1 / pickers[c])
  assert part.info["dropped"] == 0 and part.num_clients == 20
  for j in range(20):  # node j holds exactly the 2 classes it picked
    held = set(y_tr[part.train_indices[j]]) | set(y_te[part.test_indices[j]])
    assert held == set(picks[j])


def test_fedbase_groupwise_clusters_hold_their_clients():
  y_tr = np.tile(np.arange(10), 600)  # 6,000 train, 1,000 test
  y_te = np.tile(np.arange(10), 100)
  part = P.fedbase_groupwise(y_tr, y_te, 4, 3, "class", 5, 2, "class", seed=1)
  assert part.true_clusters.tolist() == np.repeat(np.arange(4), 5).tolist()
  info = part.info
  for g in range(4):
    ctr, cte = set(info["cluster_train"][g].tolist()), set(info["cluster_test"][g].tolist())
    assert len(cte) > 0.3 * 1000 / 4
    assert len(set(y_tr[list(ctr)])) == 3  # the cluster's 3 picked classes
    for i in np.flatnonzero(part.true_clusters == g):
      assert set(part.train_indices[i].tolist()) <= ctr
      assert set(part.test_indices[i].tolist()) <= cte
      assert len(set(y_tr[part.train_indices[i]])) <= 2
  a = P.fedbase_groupwise(y_tr, y_te, 4, 0.5, "dirichlet", 5, 10, "dirichlet", seed=1)
  b = P.fedbase_groupwise(y_tr, y_te, 4, 0.5, "dirichlet", 5, 10, "dirichlet", seed=1)
  c = P.fedbase_groupwise(y_tr, y_te, 4, 0.5, "dirichlet", 5, 10, "dirichlet", seed=2)
  same = lambda u, v: all(np.array_equal(x, z) for x, z in zip(
      u.train_indices + u.test_indices, v.train_indices + v.test_indices))
  assert same(a, b) and not same(a, c)


@pytest.mark.parametrize("call,match", [
    (lambda: P.fedbase_split(LABELS, LABELS, 10, 1.0, "shards", 0), "dirichlet, class"),
    (lambda: P.fedbase_split(LABELS, LABELS, 10, 11, "class", 0), "at most 10 classes"),
    (lambda: P.fedbase_split(LABELS, LABELS, 10, 0.0, "dirichlet", 0), "concentration"),
    (lambda: P.fedbase_split(LABELS, LABELS[:20], 200, 0.1, "dirichlet", 0, False),
     "fedbase_quirks=true"),
])
def test_fedbase_bad_arguments_raise_one_line(call, match):
  with pytest.raises(DataError, match=match) as info:
    call()
  assert "\n" not in str(info.value)
