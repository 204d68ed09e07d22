"""CFL-GP: the profile's weight schedule, the label matching, the SVD-then-k-means
partition, and a round's per-cluster gradient step by hand."""

import numpy as np
import pytest

from tff_cluster import registry, tasks
from tff_cluster.algorithms.cflgp import cflgp
from tff_cluster.host.driver import TrainingConfig
from tff_cluster.spec.task import DataOptions


def test_the_profile_weight_follows_the_codes_schedule():
  # K = 4, T = 2 (the authors' defaults): overwrite, then a half, then a third.
  got = [cflgp.profile_weight(t, 4, 2) for t in range(0, 20, 2)]
  assert got == [1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 1 / 3, 1 / 3]


def test_labels_are_renamed_to_keep_the_most_clients_in_place():
  np.testing.assert_array_equal(
      cflgp.match_labels(np.array([0, 0, 1, 1, 2]), np.array([1, 1, 0, 0, 2]), 3),
      [1, 1, 0, 0, 2])
  # A tie (identity and the swap keep one client each): the identity, first.
  np.testing.assert_array_equal(cflgp.match_labels(np.array([0, 0]), np.array([0, 1]), 2),
                                [0, 0])
  # (0, 2, 1), the first permutation that keeps a client, renames 1 to 2.
  np.testing.assert_array_equal(cflgp.match_labels(np.array([0, 1]), np.array([2, 2]), 3),
                                [0, 2])
  # Above 8 clusters the optimal assignment gives the same renaming.
  labels = np.arange(10)
  np.testing.assert_array_equal(cflgp.match_labels(labels, (labels + 3) % 10, 10),
                                (labels + 3) % 10)


def test_the_partition_is_k_means_of_the_profiles_svd_projection():
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=50), rng.normal(size=50)
  profiles = np.stack([a + 0.01 * rng.normal(size=50) for _ in range(4)]
                      + [b + 0.01 * rng.normal(size=50) for _ in range(3)])
  labels = cflgp.spectral_labels(profiles, 2, None)
  assert len(set(labels[:4])) == 1 and len(set(labels[4:])) == 1 and labels[0] != labels[4]
  from sklearn.cluster import KMeans
  u, s, _ = np.linalg.svd(profiles, full_matrices=False)
  expected = KMeans(n_clusters=2, init="k-means++", random_state=42).fit(u[:, :2] * s[:2]).labels_
  np.testing.assert_array_equal(labels, expected)
  # Matched to earlier labels: the names follow the old clusters.
  np.testing.assert_array_equal(cflgp.spectral_labels(profiles, 2, 1 - expected), 1 - expected)


@pytest.mark.parametrize("profile_at", ["own", "criterion"])
def test_a_round_steps_each_cluster_by_its_members_mean_gradient(profile_at):
  task = tasks.get_task("synthetic_clusters")
  data = task.load_data(DataOptions(seed=0, num_clients=8, extra={"num_clusters": 2}))
  config = TrainingConfig(rounds=3, clients_per_round=8, local_epochs=1, batch_size=10,
                          client_lr=0.05, seed=0)
  driver = registry.build_driver("cflgp", task, data, config, num_groups=2, cflgp_period=1,
                                 cflgp_profile_at=profile_at)
  driver.setup()
  calls = []
  train = driver.train_clients

  def recording(mode, state, clients, round_num, **kw):
    out = train(mode, state, clients, round_num, **kw)
    calls.append((np.asarray(kw["keys"]), out))
    return out

  driver.train_clients = recording
  sampled = np.arange(8)
  for round_num in (1, 2):
    before = [np.array(w) for w in driver.runner.numpy_state(driver.state)["models"]]
    keys_before = np.maximum(driver.host.assignment, 0)
    calls.clear()
    driver.run_round(round_num, sampled)
    keys, out = calls[0]
    np.testing.assert_array_equal(keys, keys_before)  # each at its cluster's model
    after = driver.runner.numpy_state(driver.state)["models"]
    clusters = driver.host.assignment
    for j in range(2):
      members = np.flatnonzero(clusters == j)
      for i in range(driver.definition.num_trainable):
        if len(members):
          mean = np.mean([out.results[m]["message"][i] for m in members], axis=0)
          np.testing.assert_allclose(after[i][j], before[i][j] - 0.05 * mean,
                                     rtol=1e-5, atol=1e-7)
        else:
          np.testing.assert_array_equal(after[i][j], before[i][j])
    if round_num == 2 and len(calls) > 1:  # the profile's own computations
      extra_keys, _ = calls[1]
      expected = keys_before[keys_before != 0]
      np.testing.assert_array_equal(extra_keys, expected if profile_at == "own" else 0)
  assert (driver.host.assignment >= 0).all()
  assert np.abs(driver.host.profile).sum() > 0


def test_under_sampling_only_the_profiled_clients_are_partitioned():
  task = tasks.get_task("synthetic_clusters")
  data = task.load_data(DataOptions(seed=0, num_clients=8, extra={"num_clusters": 2}))
  config = TrainingConfig(rounds=1, clients_per_round=5, local_epochs=1, batch_size=10,
                          client_lr=0.05, seed=0)
  driver = registry.build_driver("cflgp", task, data, config, num_groups=2)
  driver.setup()
  sampled = np.array([0, 2, 3, 5, 7])
  driver.run_round(1, sampled)
  assert (driver.host.assignment[sampled] >= 0).all()
  np.testing.assert_array_equal(driver.host.assignment[[1, 4, 6]], -1)
  np.testing.assert_array_equal(driver.host.profile[[1, 4, 6]], 0.0)
  _, index = driver.eval_models()
  np.testing.assert_array_equal(index[[1, 4, 6]], 0)  # theta_0, the model they would train
