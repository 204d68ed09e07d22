"""FedGWC: the Gaussian rewards, the interaction matrix's update, the
affinity, the choice of the split by the Davies-Bouldin index, the
trainers' loss trajectories, and a round's averages, sampling and split by
hand."""

import math

import numpy as np
import pytest
import tensorflow as tf

from tff_cluster import models, registry, tasks
from tff_cluster.algorithms.fedgwc import fedgwc
from tff_cluster.host.driver import TrainingConfig
from tff_cluster.learning import schedule, trainers
from tff_cluster.spec.task import DataOptions


def test_rewards_by_hand():
  # Two clients, 1 and 3 samples; step 1: losses 1 and 3, step 2: 2 and 2.
  losses = np.array([[1.0, 2.0], [3.0, 2.0]])
  # Step 1: mu = (1 + 9) / 4 = 2.5, var = (1.5^2 + 3 * 0.5^2) / 4 = 0.75.
  # Step 2: mu = 2, var = 0 (+1e-16): both rewards exp(0) = 1.
  r0 = (math.exp(-1.5 ** 2 / (2 * 0.75)) + 1.0) / 2
  r1 = (math.exp(-0.5 ** 2 / (2 * 0.75)) + 1.0) / 2
  np.testing.assert_allclose(fedgwc.gaussian_rewards(losses, np.array([1, 3])), [r0, r1],
                             rtol=1e-12)


def test_the_interaction_block_moves_toward_each_rows_reward_share():
  matrix = np.full((4, 4), 1 / 16)
  rows = np.array([2, 0])
  change = fedgwc.update_interaction(matrix, rows, np.array([1.0, 3.0]), 0.5)
  # Row 2 (reward 1 of 4): 0.5 / 16 + 0.5 * 0.25; row 0: 0.5 / 16 + 0.5 * 0.75,
  # in both columns 0 and 2 (the diagonal too); the rest untouched.
  low, high = 0.5 / 16 + 0.125, 0.5 / 16 + 0.375
  np.testing.assert_allclose(matrix[2, [0, 2]], [low, low])
  np.testing.assert_allclose(matrix[0, [0, 2]], [high, high])
  untouched = np.ones((4, 4), bool)
  untouched[np.ix_([0, 2], [0, 2])] = False
  np.testing.assert_array_equal(matrix[untouched], 1 / 16)
  assert change == pytest.approx(2 * ((low - 1 / 16) ** 2 + (high - 1 / 16) ** 2) / 4)


def test_the_affinity_leaves_out_the_pairs_own_coordinates():
  rng = np.random.default_rng(0)
  block = rng.uniform(size=(5, 5))
  got = fedgwc.affinity(block, 0.7)
  x = block.T
  x = (x - x.min()) / (x.max() - x.min())
  for i in range(5):
    assert got[i, i] == 0.0
    for j in range(5):
      if i != j:
        keep = [k for k in range(5) if k not in (i, j)]
        want = math.exp(-0.7 * sum((x[i, k] - x[j, k]) ** 2 for k in keep))
        assert got[i, j] == pytest.approx(want, rel=1e-12)
  # A constant matrix: every row the same, every affinity 1.
  np.testing.assert_array_equal(fedgwc.affinity(np.full((3, 3), 0.2), 0.1),
                                1 - np.eye(3))


def _two_blocks(rng, sizes=(6, 5)):
  """An interaction matrix whose clients reward their own block."""
  n = sum(sizes)
  group = np.repeat(np.arange(len(sizes)), sizes)
  matrix = np.where(group[:, None] == group[None, :], 0.3, 0.01)
  return matrix + 0.001 * rng.uniform(size=(n, n)), group


def test_two_blocks_split_in_two_and_a_uniform_matrix_not_at_all():
  rng = np.random.default_rng(1)
  matrix, group = _two_blocks(rng)
  a = fedgwc.affinity(matrix, 4.0)
  n, labels, score = fedgwc.best_split(a, [2, 3], 0)
  assert n == 2 and score < 1.0
  assert len(set(labels[group == 0])) == 1 and len(set(labels[group == 1])) == 1
  assert labels[0] != labels[-1]
  from sklearn.cluster import SpectralClustering
  from sklearn.manifold import SpectralEmbedding
  from sklearn.metrics import davies_bouldin_score
  y = SpectralClustering(n_clusters=2, n_components=2, affinity="precomputed",
                         assign_labels="cluster_qr", random_state=0).fit_predict(a)
  emb = SpectralEmbedding(n_components=2, affinity="precomputed", random_state=0).fit_transform(a)
  assert score == pytest.approx(davies_bouldin_score(emb, y))
  # No structure: no candidate scores below 1 (or its labels are one cluster).
  flat = fedgwc.affinity(np.full((11, 11), 0.1) + 1e-9 * rng.uniform(size=(11, 11)), 0.1)
  n, labels, lowest = fedgwc.best_split(flat, [2, 3], 0)
  assert n == 1 and labels is None and (lowest is None or lowest >= 1.0)


def _mlp():
  return tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(4, activation="relu"),
                              tf.keras.layers.Dense(2)])


@pytest.mark.parametrize("kind", ["padded", "dataset"])
def test_a_trajectory_is_each_steps_batch_loss_before_its_step(kind):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(7, 3)).astype(np.float32)
  y = rng.integers(0, 2, size=7).astype(np.int32)
  model = _mlp()
  start = [np.array(w) for w in model.get_weights()]
  # Batches of 3: rows 0-2, 3-5, 6 (a last batch of one); 5 recorded slots.
  batches = [np.arange(0, 3), np.arange(3, 6), np.arange(6, 7)]
  lr = 0.3
  weights, want = [tf.Variable(w) for w in start], []
  for rows in batches:
    with tf.GradientTape() as tape:
      model.set_weights([w.numpy() for w in weights])
      loss = tf.reduce_mean(models.per_example_loss(models.SPARSE_CE_LOGITS, y[rows],
                                                    model(x[rows])))
    want.append(float(loss))
    grads = tape.gradient(loss, model.trainable_variables)
    for w, g in zip(weights, grads):
      w.assign_sub(lr * g)
  model.set_weights(start)
  if kind == "padded":
    trainer = trainers.PaddedTrainer(model, models.SPARSE_CE_LOGITS, x, y)
    data = schedule.PaddedBatches(
        indices=tf.constant([[0, 1, 2], [3, 4, 5], [6, 0, 0]], tf.int32),
        sizes=tf.constant([3, 3, 1], tf.int32), num_steps=tf.constant(3))
  else:
    trainer = trainers.DatasetTrainer(model, models.SPARSE_CE_LOGITS)
    data = tf.data.Dataset.from_tensor_slices({"x": x, "y": y}).batch(3)
  out = trainer.train(start, data, lr, trajectory=5)
  np.testing.assert_allclose(out.step_losses.numpy(), want + [0.0, 0.0], rtol=1e-5)
  np.testing.assert_allclose([d.numpy() + s for d, s in zip(out.delta, start)][0],
                             weights[0].numpy(), rtol=1e-5, atol=1e-6)
  assert out.loss_sum.numpy() == pytest.approx(3 * want[0] + 3 * want[1] + want[2], rel=1e-5)
  assert trainer.train(start, data, lr).step_losses is None


def _driver(**options):
  task = tasks.get_task("synthetic_clusters")
  data = task.load_data(DataOptions(seed=0, num_clients=12, extra={"num_clusters": 2}))
  config = TrainingConfig(rounds=3, clients_per_round=4, local_steps=3, local_epochs=None,
                          batch_size=10, client_lr=0.05, seed=0)
  driver = registry.build_driver("fedgwc", task, data, config, **options)
  driver.setup()
  return driver, data


def test_a_round_averages_each_clusters_sample_and_updates_its_block():
  driver, data = _driver(num_groups=3)
  calls = []
  train = driver.train_clients

  def spy(mode, state, clients, round_num, **kw):
    out = train(mode, state, clients, round_num, **kw)
    calls.append((np.array(clients), np.array(kw["keys"]), out))
    return out

  driver.train_clients = spy
  before = [np.array(w) for w in driver.runner.numpy_state(driver.state)["models"]]
  matrix = driver.host.interaction.copy()
  driver.run_round(1, np.arange(4))
  clients, keys, out = calls[0]
  # The root samples 4 of its 12 members (its own stream), every key slot 0.
  assert len(clients) == 4 == len(set(clients)) and (keys == 0).all()
  np.testing.assert_array_equal(clients, driver._sample(1, 0, np.arange(12)))
  sizes = data.num_train_samples()[clients].astype(np.float64)
  after = driver.runner.numpy_state(driver.state)["models"]
  for i, (b, a) in enumerate(zip(before, after)):
    mean = sum(s / sizes.sum() * np.asarray(r["message"][i], np.float64)
               for s, r in zip(sizes, out.results))
    np.testing.assert_allclose(a[0], b[0] + mean, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(a[1:], b[1:])  # the other slots: unused
  losses = np.stack([np.asarray(r["step_losses"], np.float64) for r in out.results])
  assert losses.shape == (4, 3) and (losses > 0).all()
  rewards = fedgwc.gaussian_rewards(losses, sizes)
  fedgwc.update_interaction(matrix, clients, rewards, 4 / 12)
  np.testing.assert_allclose(driver.host.interaction, matrix, rtol=1e-12)
  assert driver.host.patience[0] == 0 and driver.host.mse[0] < 1.0


def test_a_cluster_whose_patience_is_up_splits_by_its_block():
  driver, data = _driver(num_groups=3, fedgwc_eps=10.0, fedgwc_gamma=4.0, fedgwc_max_split=2)
  rng = np.random.default_rng(2)
  matrix, group = _two_blocks(rng, (7, 5))
  driver.host.interaction[:] = matrix
  # Patience round(12 / 4) = 3: the third round's update reaches it. The
  # trained clients' rewards move only a sampled block, so the two blocks stay.
  driver.host.patience[0] = 2
  row = driver.run_round(1, np.arange(4))
  assert row["fedgwc_split"] == 1 and row["num_clusters"] == 2
  a = fedgwc.affinity(driver.host.interaction, 4.0)
  n, labels, _ = fedgwc.best_split(a, [2], 0)
  assignment = driver.host.assignment
  np.testing.assert_array_equal(assignment, np.where(labels == 0, 0, 1))
  assert len(set(assignment[group == 0])) == 1 and len(set(assignment[group == 1])) == 1
  # Both parts start from the parent's model, with mse 1 and no patience.
  models_ = driver.runner.numpy_state(driver.state)["models"]
  for w in models_:
    np.testing.assert_array_equal(w[0], w[1])
  assert list(driver.host.mse[:2]) == [1.0, 1.0] and list(driver.host.patience[:2]) == [0, 0]
  # The next round: each part samples its own members (4 of 7 or 5).
  calls = []
  train = driver.train_clients
  driver.train_clients = lambda *a, **kw: calls.append(kw["keys"]) or train(*a, **kw)
  driver.run_round(2, np.arange(4))
  assert sorted(np.bincount(calls[0])) == [4, 4]
  summary = driver.summary()
  assert summary["num_clusters"] == 2 and summary["fedgwc_splits"][0]["round"] == 1


def test_no_free_slot_no_split():
  driver, _ = _driver(num_groups=1, fedgwc_eps=10.0, fedgwc_gamma=4.0)
  rng = np.random.default_rng(2)
  driver.host.interaction[:] = _two_blocks(rng, (7, 5))[0]
  driver.host.patience[0] = 2
  row = driver.run_round(1, np.arange(4))
  assert row["fedgwc_split"] == 0 and row["num_clusters"] == 1
  assert driver.host.mse[0] == 1.0  # tried: no candidate, the code's reset
  assert driver.summary()["fedgwc_kept"] == [
      {"round": 1, "slot": 0, "lowest_davies_bouldin": None}]


def test_the_host_steps_equal_the_authors_code_on_the_same_inputs():
  """tests/data/fedgwc_authors.json: the authors' `ServerFedGWC` methods
  (davedleo/FedGWC 24d0716) run unmodified on fixed inputs in float64
  (benchmarks/crosscheck/fedgwc_authors.py): the rewards, two updates of an
  8-client interaction matrix, its affinity at two gammas, and the split of
  a two-block matrix."""
  import json
  import pathlib
  ref = json.loads((pathlib.Path(__file__).parent / "data" / "fedgwc_authors.json").read_text())
  inputs = ref["inputs"]
  losses, sizes = np.array(inputs["losses"]), np.array(inputs["n"], np.float64)
  np.testing.assert_allclose(fedgwc.gaussian_rewards(losses, sizes), ref["rewards"], rtol=1e-12)
  k, m = inputs["K"], inputs["m"]
  matrix, mse = np.ones((k, k)) / k ** 2, inputs["mse0"]
  calls = [(inputs["indices_call1"], losses, sizes),
           (inputs["indices_call2"], np.array(inputs["losses_call2"]),
            np.array(inputs["n_call2"], np.float64))]
  for (rows, l, n), want in zip(calls, ref["update_W"]):
    alpha = m / k
    change = fedgwc.update_interaction(matrix, np.array(rows), fedgwc.gaussian_rewards(l, n),
                                       alpha)
    mse = (1 - alpha) * mse + alpha * change
    np.testing.assert_allclose(matrix, want["W"], rtol=1e-12, atol=1e-15)
    assert mse == pytest.approx(want["mse"], rel=1e-12)
  for gamma in inputs["gammas_P"]:
    np.testing.assert_allclose(fedgwc.affinity(matrix, gamma), ref["P"][str(gamma)],
                               rtol=1e-10, atol=1e-14)
  split = ref["find_best_clusters"]
  a = fedgwc.affinity(np.array(inputs["M12"]), split["gamma"])
  n, labels, score = fedgwc.best_split(a, split["candidate_n"], split["seed"])
  assert n == split["n_clusters"]
  theirs = np.array(split["labels"])
  assert all(len(set(theirs[labels == j])) == 1 for j in range(n))  # the same partition
  assert score == pytest.approx(split["davies_bouldin"], rel=1e-9)
