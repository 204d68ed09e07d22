"""Tests of the FedGroup clustering maths (tff_cluster.clustering)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tensorflow as tf

from tests import references
from tff_cluster import clustering as cl


def _grouped_updates(seed: int, scales=None, noise: float = 0.05):
  """3 groups × 5 clients in d=20: a random direction per group + noise.

  Clients are interleaved (0,1,2,0,1,2,...) so contiguous labels are no hint.
  `scales` optionally multiplies each client's update.
  """
  rng = np.random.default_rng(seed)
  directions = rng.normal(size=(3, 20))
  directions /= np.linalg.norm(directions, axis=1, keepdims=True)
  true = np.tile(np.arange(3), 5)
  updates = directions[true] + noise * rng.normal(size=(15, 20))
  if scales is not None:
    updates = updates * np.asarray(scales, dtype=np.float64)[:, None]
  return updates, true


# --------------------------------------------------------------------------- #
# Flattening and cosine similarity.
# --------------------------------------------------------------------------- #


def test_flatten_weights_concatenates_ravelled_arrays():
  flat = cl.flatten_weights([np.array([[1., 2.], [3., 4.]]), np.arange(3)])
  np.testing.assert_array_equal(flat, [1, 2, 3, 4, 0, 1, 2])
  assert flat.dtype == np.float64


def test_flatten_stacked_rows_match_flatten_weights():
  rng = np.random.default_rng(0)
  stacked = [rng.normal(size=(4, 2, 3)), rng.normal(size=(4,)),
             rng.normal(size=(4, 5))]
  flat = references.flatten_stacked(stacked)
  assert flat.shape == (4, 6 + 1 + 5)
  for i in range(4):
    np.testing.assert_array_equal(flat[i],
                                  cl.flatten_weights([s[i] for s in stacked]))


def test_cosine_similarity_matrix_values_and_zero_rows():
  a = np.array([[1., 0.], [1., 1.], [0., 0.], [-2., 0.]])
  s = cl.cosine_similarity_matrix(a)
  r = 1 / np.sqrt(2)
  expected = np.array([[1, r, 0, -1],
                       [r, 1, 0, -r],
                       [0, 0, 0, 0],
                       [-1, -r, 0, 1]])
  np.testing.assert_allclose(s, expected, atol=1e-12)
  b = np.array([[0., 3.]])
  np.testing.assert_allclose(cl.cosine_similarity_matrix(a, b),
                             [[0], [r], [0], [0]], atol=1e-12)


# --------------------------------------------------------------------------- #
# EDC.
# --------------------------------------------------------------------------- #


def test_edc_features_on_axis_aligned_updates():
  # ΔWᵀΔW = diag(18, 2, 4, 0) (the ±1 cross terms of rows 0 and 1 cancel), so
  # the top-3 right singular vectors are ±e0, ±e2, ±e1 in that order, and the
  # sign convention (largest-|.| component positive) makes them +e0, +e2, +e1:
  # even the signs of the cosines are known.
  updates = np.array([[3., 1., 0., 0.],
                      [3., -1., 0., 0.],
                      [0., 0., -2., 0.]])
  r = 1 / np.sqrt(10)
  expected = np.array([[3 * r, 0., r],
                       [3 * r, 0., -r],
                       [0., -1., 0.]])
  np.testing.assert_allclose(cl.edc_features(updates, 3), expected,
                             atol=1e-12)
  np.testing.assert_allclose(cl.edc_features(updates, 1), expected[:, :1],
                             atol=1e-12)


def _edc_features_by_svd(updates, m):
  """Brute force: np.linalg.svd, sign convention, explicit cosine loop."""
  _, _, vt = np.linalg.svd(updates, full_matrices=False)
  out = np.zeros((len(updates), m))
  for k in range(m):
    v = vt[k] * np.sign(vt[k][np.argmax(np.abs(vt[k]))])
    for i, u in enumerate(updates):
      out[i, k] = u @ v / np.linalg.norm(u) / np.linalg.norm(v)
  return out


@pytest.mark.parametrize("spread", [1.0, 1e3])
def test_edc_features_match_svd_on_random_data(spread):
  # spread: client update norms span [1, spread] (the Gram route squares the
  # condition number, so check it against the SVD on uneven scales too).
  rng = np.random.default_rng(1)
  updates = rng.normal(size=(9, 40))
  updates *= np.geomspace(1.0, spread, 9)[:, None]
  features = cl.edc_features(updates, 4)
  np.testing.assert_allclose(features, _edc_features_by_svd(updates, 4),
                             atol=1e-9)
  # Sign-deterministic: negating every update negates every feature.
  np.testing.assert_allclose(cl.edc_features(-updates, 4), -features,
                             atol=1e-9)


def test_edc_features_rank_deficient_and_zero_update():
  # ΔWᵀΔW = diag(5, 25, 0): directions e1 (s²=25), e0 (s²=5), then a null
  # direction (rank 2 < m = 3) orthogonal to every update, so its column is 0;
  # the zero update has cosine 0 with every direction.
  updates = np.array([[1., 0., 0.], [2., 0., 0.], [0., 5., 0.],
                      [0., 0., 0.]])
  expected = np.array([[0., 1., 0.], [0., 1., 0.], [1., 0., 0.],
                       [0., 0., 0.]])
  features = cl.edc_features(updates, 3)
  np.testing.assert_allclose(features, expected, atol=1e-7)
  assert np.all(np.isfinite(features))


@pytest.mark.parametrize("num_groups", [0, 4, 2.0, True])
def test_edc_features_rejects_bad_num_groups(num_groups):
  with pytest.raises(ValueError, match="num_groups"):
    cl.edc_features(np.ones((3, 5)), num_groups)  # min(n, d) = 3


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_edc_cluster_recovers_groups(seed):
  updates, true = _grouped_updates(seed)
  labels = cl.edc_cluster(updates, 3, seed=seed)
  assert cl.adjusted_rand_index(true, labels) == 1.0
  assert set(labels.tolist()) == {0, 1, 2}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_edc_cluster_is_scale_invariant(seed):
  scales = np.ones(15)
  scales[4] = 10.0  # one client ×10
  updates, true = _grouped_updates(seed, scales=scales)
  assert cl.adjusted_rand_index(true, cl.edc_cluster(updates, 3, seed)) == 1.0
  # And arbitrary positive per-client scales over three orders of magnitude.
  scales = np.random.default_rng(seed + 10).uniform(0.1, 100.0, size=15)
  updates, true = _grouped_updates(seed, scales=scales)
  assert cl.adjusted_rand_index(true, cl.edc_cluster(updates, 3, seed)) == 1.0


# --------------------------------------------------------------------------- #
# MADC.
# --------------------------------------------------------------------------- #


def _madc_brute_force(updates):
  n = len(updates)
  unit = lambda v: v / np.linalg.norm(v) if np.linalg.norm(v) > 0 else v * 0
  s = np.array([[unit(a) @ unit(b) for b in updates] for a in updates])
  out = np.zeros((n, n))
  for i, j in itertools.product(range(n), range(n)):
    if i == j:
      continue
    out[i, j] = sum(abs(s[i, z] - s[j, z]) for z in range(n)
                    if z not in (i, j)) / (n - 2)
  return out


def test_madc_matrix_matches_triple_loop():
  rng = np.random.default_rng(3)
  updates = rng.normal(size=(8, 6))
  updates[5] = 0.0  # a zero update: cosine 0 with everything, no NaN
  madc = cl.madc_matrix(updates)
  np.testing.assert_allclose(madc, _madc_brute_force(updates), atol=1e-12)
  np.testing.assert_array_equal(madc, madc.T)
  np.testing.assert_array_equal(np.diag(madc), 0.0)
  assert np.all(np.isfinite(madc))


def test_madc_matrix_hand_case():
  # S = [[1,0,1],[0,1,0],[1,0,1]]: clients 0 and 2 agree on their only third
  # party (client 1), clients 0/1 and 1/2 disagree fully.
  updates = np.array([[1., 0.], [0., 2.], [5., 0.]])
  expected = np.array([[0., 1., 0.], [1., 0., 1.], [0., 1., 0.]])
  np.testing.assert_allclose(cl.madc_matrix(updates), expected, atol=1e-12)


def test_madc_matrix_needs_three_updates():
  with pytest.raises(ValueError, match="at least 3"):
    cl.madc_matrix(np.ones((2, 4)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_madc_cluster_recovers_groups_and_is_scale_invariant(seed):
  updates, true = _grouped_updates(seed)
  labels = cl.madc_cluster(updates, 3)
  assert cl.adjusted_rand_index(true, labels) == 1.0
  assert set(labels.tolist()) == {0, 1, 2}
  scales = np.ones(15)
  scales[7] = 10.0
  scaled, true = _grouped_updates(seed, scales=scales)
  assert cl.adjusted_rand_index(true, cl.madc_cluster(scaled, 3)) == 1.0
  # MADC only sees cosines, so rescaling clients leaves the matrix unchanged.
  np.testing.assert_allclose(cl.madc_matrix(scaled), cl.madc_matrix(updates),
                             atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_madc_cluster_is_complete_linkage(seed):
  # Against scipy's complete-linkage hierarchy cut at 3 clusters, on random
  # updates with no cluster structure (where single/average linkage differ).
  from scipy.cluster import hierarchy
  from scipy.spatial import distance
  updates = np.random.default_rng(seed + 20).normal(size=(14, 5))
  tree = hierarchy.linkage(distance.squareform(cl.madc_matrix(updates)),
                           method="complete")
  expected = hierarchy.fcluster(tree, t=3, criterion="maxclust")
  labels = cl.madc_cluster(updates, 3)
  assert cl.adjusted_rand_index(expected, labels) == 1.0


def test_cluster_updates_dispatches_and_rejects_unknown_measure():
  updates, true = _grouped_updates(5)
  np.testing.assert_array_equal(cl.cluster_updates(updates, 3, "edc", 5),
                                cl.edc_cluster(updates, 3, 5))
  np.testing.assert_array_equal(cl.cluster_updates(updates, 3, "madc", 5),
                                cl.madc_cluster(updates, 3))
  with pytest.raises(ValueError, match="edc, madc"):
    cl.cluster_updates(updates, 3, "kmeans", 5)


# --------------------------------------------------------------------------- #
# Cold start.
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("scale", [1e-3, 1.0, 7.3, 1e3])
def test_assign_by_direction_joins_group_with_same_direction(scale):
  rng = np.random.default_rng(4)
  group_updates = rng.normal(size=(4, 30))
  # Make group 2 the smallest, so a Euclidean rule would not pick it at scale.
  group_updates[2] *= 0.01
  newcomer = scale * (group_updates[2] / np.linalg.norm(group_updates[2])
                      + 0.1 * rng.normal(size=30) / np.sqrt(30))
  assert references.assign_by_direction(newcomer, group_updates) == 2


def test_assign_by_direction_zero_update_and_ties_pick_lowest_index():
  group_updates = np.array([[1., 0.], [0., 1.], [1., 0.]])
  assert references.assign_by_direction(np.zeros(2), group_updates) == 0
  # Groups 0 and 2 are equally close: the lower index wins.
  assert references.assign_by_direction(np.array([3., 0.]), group_updates) == 0
  # Opposite direction is the farthest group: (1 − (−1))/2 = 1.
  assert references.assign_by_direction(np.array([0., -1.]), group_updates) == 0
  assert references.assign_by_direction(np.array([-1., 5.]), group_updates) == 1


def test_assign_many_matches_assign_by_direction():
  rng = np.random.default_rng(6)
  group_updates = rng.normal(size=(3, 10))
  updates = rng.normal(size=(12, 10))
  labels = references.assign_many(updates, group_updates)
  assert labels.tolist() == [references.assign_by_direction(u, group_updates)
                             for u in updates]
  expected = np.argmax(cl.cosine_similarity_matrix(updates, group_updates), 1)
  np.testing.assert_array_equal(labels, expected)


# --------------------------------------------------------------------------- #
# Inter-group aggregation.
# --------------------------------------------------------------------------- #

# w = [(0,0), (3,0), (0,4)], η = 0.5. Unit vectors towards the other groups:
#   group 0: (3,0)/3 + (0,4)/4            = (1, 1)        -> (0.5, 0.5)
#   group 1: (-3,0)/3 + (-3,4)/5          = (-1.6, 0.8)   -> (2.2, 0.4)
#   group 2: (0,-4)/4 + (3,-4)/5          = (0.6, -1.8)   -> (0.3, 3.1)
# Coordinate x is one "layer" [3, 1], y another [3]: a per-layer norm would
# give different numbers (e.g. group 1 would move by (-1-1, +1)·0.5).
_HAND_X = np.array([[0.], [3.], [0.]], dtype=np.float32)
_HAND_Y = np.array([0., 0., 4.], dtype=np.float32)
_HAND_X_NEW = np.array([[0.5], [2.2], [0.3]])
_HAND_Y_NEW = np.array([0.5, 0.4, 3.1])


def test_inter_group_step_hand_example_uses_joint_norm():
  x_new, y_new = cl.inter_group_step(
      [tf.constant(_HAND_X), tf.constant(_HAND_Y)], 0.5)
  assert x_new.shape == (3, 1) and y_new.shape == (3,)
  assert x_new.dtype == tf.float32
  np.testing.assert_allclose(x_new.numpy(), _HAND_X_NEW, atol=1e-6)
  np.testing.assert_allclose(y_new.numpy(), _HAND_Y_NEW, atol=1e-6)
  flat = np.stack([_HAND_X[:, 0], _HAND_Y], axis=1)
  np.testing.assert_allclose(
      references.inter_group_step_np(flat, 0.5),
      np.stack([_HAND_X_NEW[:, 0], _HAND_Y_NEW], axis=1), atol=1e-12)


def test_inter_group_step_inside_tf_function_with_unknown_m():
  @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32),
                                tf.TensorSpec([None], tf.float32),
                                tf.TensorSpec([], tf.float32)])
  def step(x, y, eta):
    return cl.inter_group_step([x, y], eta)

  x_new, y_new = step(_HAND_X, _HAND_Y, tf.constant(0.5))
  np.testing.assert_allclose(x_new.numpy(), _HAND_X_NEW, atol=1e-6)
  np.testing.assert_allclose(y_new.numpy(), _HAND_Y_NEW, atol=1e-6)


def test_inter_group_step_matches_numpy_reference_on_random_layers():
  rng = np.random.default_rng(7)
  layers = [rng.normal(size=(4, 3, 2)), rng.normal(size=(4,)),
            rng.normal(size=(4, 5))]
  out = cl.inter_group_step([tf.constant(w) for w in layers], 0.3)
  expected = references.inter_group_step_np(references.flatten_stacked(layers), 0.3)
  np.testing.assert_allclose(references.flatten_stacked([o.numpy() for o in out]),
                             expected, atol=1e-12)


def test_inter_group_step_eta_zero_is_identity():
  rng = np.random.default_rng(8)
  layers = [rng.normal(size=(3, 4)).astype(np.float32),
            rng.normal(size=(3,)).astype(np.float32)]
  out = cl.inter_group_step([tf.constant(w) for w in layers], 0.0)
  for o, w in zip(out, layers):
    np.testing.assert_array_equal(o.numpy(), w)


def test_inter_group_step_identical_groups_give_no_nan():
  # Groups 0 and 1 coincide: they only move towards group 2, by η·(3,4)/5.
  x = tf.constant([[1.], [1.], [4.]])
  y = tf.constant([1., 1., 5.])
  x_new, y_new = cl.inter_group_step([x, y], 0.5)
  np.testing.assert_allclose(x_new.numpy(), [[1.3], [1.3], [3.4]], atol=1e-6)
  np.testing.assert_allclose(y_new.numpy(), [1.4, 1.4, 4.2], atol=1e-6)
  all_same = cl.inter_group_step([tf.ones([3, 2])], 1.0)[0]
  np.testing.assert_array_equal(all_same.numpy(), np.ones([3, 2]))
  np.testing.assert_array_equal(
      references.inter_group_step_np(np.ones((3, 2)), 1.0), np.ones((3, 2)))


def test_inter_group_step_rejects_mismatched_groups():
  with pytest.raises(ValueError, match="leading dimensions"):
    cl.inter_group_step([tf.zeros([3, 2]), tf.zeros([4])], 0.1)


# --------------------------------------------------------------------------- #
# Clustering quality.
# --------------------------------------------------------------------------- #


def test_purity_and_ari_hand_cases():
  true = [0, 0, 0, 1, 1, 1]
  assert cl.purity(true, [1, 1, 1, 0, 0, 0]) == 1.0
  assert cl.adjusted_rand_index(true, [1, 1, 1, 0, 0, 0]) == 1.0
  assert cl.purity(true, [0] * 6) == 0.5
  assert cl.adjusted_rand_index(true, [0] * 6) == 0.0
  # Clusters {0,0}, {0,1}, {1,1}: purity (2+1+2)/6. ARI from the contingency
  # table [[2,1,0],[0,1,2]]: index 2, expected 6·3/15 = 1.2, max 4.5,
  # so (2 − 1.2)/(4.5 − 1.2) = 8/33.
  pred = [0, 0, 1, 1, 2, 2]
  assert cl.purity(true, pred) == pytest.approx(5 / 6)
  assert cl.adjusted_rand_index(true, pred) == pytest.approx(8 / 33)
  # Purity with string labels and one singleton cluster per point is 1.
  assert cl.purity(["a", "b", "a"], [5, 6, 7]) == 1.0


def test_quality_metrics_reject_length_mismatch():
  with pytest.raises(ValueError, match="same length"):
    cl.purity([0, 1], [0])
  with pytest.raises(ValueError, match="same length"):
    cl.adjusted_rand_index([0, 1], [0])


def test_flatten_rows_and_row_norms_are_the_whole_array_forms():
  """FedGroup's cold start builds its [n, d] matrix row by row and takes the
  norms a few rows at a time (no copy of the matrix): the same numbers, bit
  for bit, as stacking the flattened models and norming along axis 1."""
  rng = np.random.default_rng(0)
  models = [[rng.normal(size=(7, 5)).astype(np.float32), rng.normal(size=5).astype(np.float32)]
            for _ in range(19)]
  want = np.stack([cl.flatten_weights(m) for m in models])
  got = cl.flatten_rows(models)
  assert got.dtype == np.float64 and np.array_equal(got, want)
  x = rng.normal(size=(19, 1001)) * rng.uniform(0.1, 10.0, size=(19, 1))
  assert np.array_equal(cl.row_norms(x), np.linalg.norm(x, axis=1, keepdims=True))
  with pytest.raises(ValueError, match="parameters"):
    cl.flatten_rows([models[0], models[1][:1]])


def test_the_blockwise_measures_equal_the_float64_ones(monkeypatch):
  """Past EXACT_BYTES FedGroup keeps its updates float32 and the measures sum
  over column blocks in float64: the same features, distances and groups as
  the float64 matrix, to round-off."""
  rng = np.random.default_rng(3)
  centres = rng.normal(size=(3, 50_000))
  x32 = (np.repeat(centres, 7, axis=0) + 0.3 * rng.normal(size=(21, 50_000))).astype(np.float32)
  x32[4] = 0.0  # a zero update: cosine 0 with everything, both ways
  x64 = x32.astype(np.float64)
  np.testing.assert_allclose(cl.edc_features(x32, 3), cl.edc_features(x64, 3), atol=1e-12)
  np.testing.assert_allclose(cl.madc_matrix(x32), cl.madc_matrix(x64), atol=1e-12)
  assert np.array_equal(cl.edc_cluster(x32, 3, seed=0), cl.edc_cluster(x64, 3, seed=0))
  assert np.array_equal(cl.madc_cluster(x32, 3), cl.madc_cluster(x64, 3))
  models = [[row[:30_000].reshape(100, 300), row[30_000:]] for row in x32]
  assert cl.flatten_rows(models).dtype == np.float64  # 8.4 MB: under EXACT_BYTES
  monkeypatch.setattr(cl, "EXACT_BYTES", 1 << 20)
  big = cl.flatten_rows(models)  # past EXACT_BYTES: the models' own arrays
  assert isinstance(big, cl.RowBlocks) and big.shape == x32.shape
  assert big.models[0][0] is models[0][0] or np.shares_memory(big.models[0][0], models[0][0])
  assert np.array_equal(np.concatenate([b for _, b in big.blocks()], axis=1), x64)
  np.testing.assert_allclose(cl.edc_features(big, 3), cl.edc_features(x64, 3), atol=1e-12)
  np.testing.assert_allclose(cl.madc_matrix(big), cl.madc_matrix(x64), atol=1e-12)
  assert np.array_equal(cl.cluster_updates(big, 3, "edc", seed=0), cl.edc_cluster(x64, 3, seed=0))
  bad = [[w.copy() for w in m] for m in models]
  bad[2][1][5] = np.nan
  with pytest.raises(ValueError, match="NaN"):
    cl.edc_features(cl.flatten_rows(bad), 3)
