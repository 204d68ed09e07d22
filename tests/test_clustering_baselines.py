"""Building blocks of the clustered baselines: weighted K-Means (WeCFL/FeSEM), CFL's split."""

import numpy as np
import pytest

from tff_cluster import clustering


def test_weighted_centres_by_hand():
  features = np.array([[0.0, 0.0], [4.0, 0.0], [10.0, 10.0], [1.0, 1.0]])
  labels = np.array([0, 0, 1, 0])
  weights = np.array([1.0, 3.0, 2.0, 4.0])
  got = clustering.weighted_centres(features, labels, 3, weights,
                                    previous=np.full((3, 2), 7.0))
  # Cluster 0: (1*(0,0) + 3*(4,0) + 4*(1,1)) / 8 = (16/8, 4/8); cluster 2 is empty.
  np.testing.assert_allclose(got, [[2.0, 0.5], [10.0, 10.0], [7.0, 7.0]])
  uniform = clustering.weighted_centres(features, labels, 3)
  np.testing.assert_allclose(uniform[0], [5.0 / 3, 1.0 / 3])
  np.testing.assert_allclose(uniform[2], [0.0, 0.0])


def test_weighted_kmeans_weights_move_the_centres():
  # Two clear groups; inside the right group a heavy client pulls the centre.
  features = np.array([[0.0], [0.2], [10.0], [12.0]])
  labels, centres = clustering.weighted_kmeans(features, 2, np.array([1, 1, 1, 3.0]), seed=0)
  assert labels[0] == labels[1] != labels[2] == labels[3]
  right = labels[2]
  assert centres[right, 0] == pytest.approx((10.0 + 3 * 12.0) / 4)
  _, uniform = clustering.weighted_kmeans(features, 2, None, seed=0)
  assert uniform[right, 0] == pytest.approx(11.0)
  with pytest.raises(ValueError, match="positive"):
    clustering.weighted_kmeans(features, 2, np.array([1, 1, 0, 1.0]))


def test_nearest_centre_and_its_tie_rule():
  centres = np.array([[0.0, 0.0], [2.0, 0.0]])
  got = clustering.nearest_centre(np.array([[0.9, 5.0], [1.1, -3.0], [1.0, 0.0]]), centres)
  np.testing.assert_array_equal(got, [0, 1, 0])  # the tie (1, 0) goes to the lower index


def test_cfl_split_criterion_uses_the_norm_of_the_mean_update():
  # Two opposite updates: their mean is 0 (stationary), each has norm 2.
  opposite = np.array([[2.0, 0.0], [-2.0, 0.0], [2.0, 0.0]])
  assert clustering.cfl_should_split(opposite, eps1=1.0, eps2=1.5)
  # (mean of the three = (2/3, 0), norm 0.667 < 1; max norm 2 > 1.5.)
  assert not clustering.cfl_should_split(opposite, eps1=0.5, eps2=1.5)  # 0.667 >= 0.5
  assert not clustering.cfl_should_split(opposite, eps1=1.0, eps2=2.5)  # max norm 2 <= 2.5
  assert not clustering.cfl_should_split(opposite[:2], eps1=1.0, eps2=1.5)  # 2 members
  # Data-weighted mean (the paper): weights (1, 1, 4) -> mean (4/3, 0), norm 1.33 > 1.
  assert not clustering.cfl_should_split(opposite, 1.0, 1.5, weights=np.array([1, 1, 4.0]))


def test_cfl_step_splits_by_direction_and_keeps_global_indices():
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=5), rng.normal(size=5)
  updates = np.zeros((9, 5))
  # Global clients 2, 4, 7, 8 point along a; 3, 5, 6 along -a + b; 0, 1 elsewhere.
  for i in (2, 4, 7, 8):
    updates[i] = a + rng.normal(0, 0.01, 5)
  for i in (3, 5, 6):
    updates[i] = -a + 0.3 * b + rng.normal(0, 0.01, 5)
  updates[0], updates[1] = b, -b
  clusters = [[0, 1], [2, 3, 4, 5, 6, 7, 8]]
  got = clustering.cfl_step(clusters, updates, eps1=10.0, eps2=0.1)
  assert got[0] == [0, 1]  # fewer than 3 members: never split
  assert sorted(map(sorted, got[1:])) == [[2, 4, 7, 8], [3, 5, 6]]
  # No split when the cluster is not stationary (its mean update is large).
  assert clustering.cfl_step(clusters, updates, eps1=1e-3, eps2=0.1) == clusters
