"""`Sum` and `ClusterMean` (tff_cluster/core/aggregators.py) on hand-worked numbers."""

import numpy as np
import tensorflow as tf

from tff_cluster.core.aggregators import ClusterMean, ClusterSum, Mean, Sum


def _round(clients, k, old):
  """Three clients' (key, value, weight) summed as a runner sums them, then
  the per-cluster mean."""
  agg = ClusterMean(k)
  total = None
  for key, value, weight in clients:
    contribution = agg.client(tf.constant(key), [tf.constant(value, tf.float32)],
                              None if weight is None else tf.constant(weight, tf.float32))
    total = contribution if total is None else Sum.add(total, contribution)
  sums, weights = total
  return sums, weights, agg.mean(sums, weights, [tf.constant(old, tf.float32)])


def test_cluster_mean_by_hand_with_an_empty_cluster():
  # Cluster 0: values 1 (weight 1) and 4 (weight 2): (1 + 8) / 3 = 3.
  # Cluster 2: value 10 (weight 5): 10. Cluster 1 has no member: keeps 7.
  sums, weights, means = _round([(0, [1.0, 2.0], 1.0), (2, [10.0, 0.0], 5.0),
                                 (0, [4.0, -1.0], 2.0)], 3,
                                [[0.0, 0.0], [7.0, 7.0], [0.0, 0.0]])
  np.testing.assert_allclose(weights.numpy(), [3.0, 0.0, 5.0])
  np.testing.assert_allclose(sums[0].numpy(), [[9.0, 0.0], [0.0, 0.0], [50.0, 0.0]])
  np.testing.assert_allclose(means[0].numpy(), [[3.0, 0.0], [7.0, 7.0], [10.0, 0.0]])


def test_unweighted_contributions_count_members():
  sums, weights, means = _round([(1, [2.0], None), (1, [4.0], None)], 2, [[5.0], [0.0]])
  np.testing.assert_allclose(weights.numpy(), [0.0, 2.0])
  np.testing.assert_allclose(means[0].numpy(), [[5.0], [3.0]])


def test_has_overrides_the_weights_and_a_zero_divisor_divides_by_one():
  sums = [tf.constant([[6.0], [4.0]])]
  divisor = tf.constant([0.0, 2.0])
  out = ClusterMean.mean(sums, divisor, [tf.constant([[1.0], [1.0]])],
                         has=tf.constant([True, False]))
  np.testing.assert_allclose(out[0].numpy(), [[6.0], [1.0]])


def test_cluster_mean_is_bit_equal_to_one_hot_scatter_and_masked_divide():
  """The arithmetic the clustered algorithms wrote before the aggregator:
  tensordot(one_hot, weight * value) summed, then where(weight > 0, sum /
  weight, old)."""
  rng = np.random.default_rng(2)
  k, clients = 4, [(int(rng.integers(0, 3)), rng.normal(size=(3, 2)).astype(np.float32),
                    np.float32(rng.uniform(1, 9))) for _ in range(6)]
  old = tf.constant(rng.normal(size=(k, 3, 2)).astype(np.float32))
  want_sum = tf.zeros([k, 3, 2])
  want_weight = tf.zeros([k])
  for key, value, weight in clients:
    onehot = tf.one_hot(key, k, dtype=tf.float32)
    want_sum = want_sum + tf.tensordot(onehot, weight * tf.constant(value), axes=0)
    want_weight = want_weight + onehot * weight
  safe = tf.where(want_weight > 0, want_weight, 1.0)
  want = tf.where(tf.reshape(want_weight > 0, [k, 1, 1]), want_sum / tf.reshape(safe, [k, 1, 1]),
                  old)
  sums, weights, means = _round(clients, k, old.numpy())
  np.testing.assert_array_equal(sums[0].numpy(), want_sum.numpy())
  np.testing.assert_array_equal(weights.numpy(), want_weight.numpy())
  np.testing.assert_array_equal(means[0].numpy(), want.numpy())
  assert float(weights[3]) == 0.0  # cluster 3 empty: its old value kept
  np.testing.assert_array_equal(means[0][3].numpy(), old[3].numpy())


def test_sum_adds_leaf_by_leaf():
  total = Sum.add({"a": tf.constant(1.0), "b": [tf.constant([1.0, 2.0])]},
                  {"a": tf.constant(2.5), "b": [tf.constant([0.5, 0.5])]})
  assert float(total["a"]) == 3.5
  np.testing.assert_allclose(total["b"][0].numpy(), [1.5, 2.5])


def test_cluster_sum_places_each_value_in_its_keys_row():
  agg = ClusterSum(3)
  total = None
  for key, value in [(2, 1.5), (0, -2.0), (2, 0.25)]:
    contribution = agg.client(tf.constant(key, tf.int32), [tf.constant(value)])
    total = contribution if total is None else Sum.add(total, contribution)
  np.testing.assert_array_equal(total[0].numpy(), [-2.0, 0.0, 1.75])


def test_cluster_sum_is_bit_equal_to_a_scalar_times_its_one_hot_row():
  """pFedMo's per-worker score: score * one_hot(key), the same bits."""
  rng = np.random.default_rng(5)
  for key in range(4):
    score = tf.constant(np.float32(rng.uniform(0, 3)))
    want = score * tf.one_hot(key, 4, dtype=tf.float32)
    got = ClusterSum(4).client(tf.constant(key, tf.int32), [score])[0]
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_mean_divides_the_sums_by_the_weight_and_gives_zeros_without_weight():
  # Two clients: weights 1 and 3, values 2 and 6 -> sums 20 and 4; mean 5.
  (m,) = Mean.mean([tf.constant([20.0, 4.0])], tf.constant(4.0))
  np.testing.assert_allclose(m.numpy(), [5.0, 1.0])
  (z,) = Mean.mean([tf.constant([0.0, 0.0])], tf.constant(0.0))
  np.testing.assert_array_equal(z.numpy(), [0.0, 0.0])
