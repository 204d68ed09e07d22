"""FedPAC: the statistics and the combination weights against the authors'
code on the same inputs, the alignment term's gradient by hand, and a
round's classifier combination."""

import dataclasses
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tff_cluster import models, registry, tasks
from tff_cluster.algorithms.fedpac import fedpac
from tff_cluster.host.driver import TrainingConfig
from tff_cluster.learning import optimizers, trainers
from tff_cluster.spec.task import DataOptions

AUTHORS = os.path.join(os.path.dirname(__file__), "data", "fedpac_authors.json")


@pytest.mark.parametrize("case", ["A_fixed_stats", "C_degenerate", "D_tie"])
def test_the_combination_weights_equal_the_authors_code(case):
  """The weights each combined classifier puts on the participants', ours
  and the authors' (cvxpy/OSQP; C: P singular, one client through the
  eigenvalue cut, one keeping its own classifier; D: tied clients)."""
  fixture = json.load(open(AUTHORS))["cases"][case]
  v, h = np.asarray(fixture["Vars"]), np.asarray(fixture["Hs"])
  for i, theirs in enumerate(fixture["alpha_effective"]):
    alpha = fedpac.combination_weights(v, h, i)
    mine = np.eye(len(v))[i] if alpha is None else alpha / alpha.sum()
    np.testing.assert_allclose(mine, theirs, atol=2e-5)


def _case_b_samples(setup, noise):
  """The features and labels the authors' statistics were run on."""
  rng = np.random.default_rng(0)
  means = rng.normal(size=(4, 2, 3))
  means[1] = means[0] + 0.1 * rng.normal(size=(2, 3))
  np.testing.assert_allclose(means, setup["means"])
  r = np.random.default_rng(0)
  out = []
  for i in range(4):
    xs, ys = [], []
    for k in range(2):
      n = setup["counts"][i][k]
      xs.append(means[i, k] + noise[i] * r.normal(size=(n, 3)))
      ys += [k] * n
    x, y = np.concatenate(xs).astype(np.float32), np.array(ys)
    perm = r.permutation(len(y))
    out.append((x[perm], y[perm]))
  return out


def test_the_statistics_and_prototypes_equal_the_authors_code():
  fixture = json.load(open(AUTHORS))
  theirs = fixture["cases"]["B_from_features"]
  sums, counts = np.zeros((2, 3)), np.zeros(2)
  for i, (z, y) in enumerate(_case_b_samples(fixture["setup"], fixture["noise"])):
    onehot = np.eye(2)[y]
    client_sums, client_counts = onehot.T @ z, onehot.sum(0)
    v, h = fedpac.statistics(client_sums, onehot.T @ (z * z).sum(1), client_counts, len(y))
    np.testing.assert_allclose(v, json.loads(theirs["V"])[i] if isinstance(theirs["V"], str)
                               else theirs["V"][i], rtol=1e-5)
    their_h = json.loads(theirs["H"]) if isinstance(theirs["H"], str) else theirs["H"]
    np.testing.assert_allclose(h, their_h[i], atol=1e-6)
    sums, counts = sums + client_sums, counts + client_counts
  # The server's prototypes: the class sums over the class counts (the
  # code's count-weighted mean of the clients' class means).
  protos = theirs["global_prototypes"]["official_weighted_by_label_counts"]
  for k in range(2):
    np.testing.assert_allclose(sums[k] / counts[k], protos[str(k)], atol=1e-6)


def test_the_variance_term_by_hand():
  # One class, features 1 and 3 (mu 2, E||z||^2 5): V = (5 - 4) / 2 = 0.5;
  # a second class absent: its row of h is 0.
  v, h = fedpac.statistics(np.array([[4.0], [0.0]]), np.array([10.0, 0.0]),
                           np.array([2.0, 0.0]), 2)
  assert v == pytest.approx(0.5)
  np.testing.assert_allclose(h, [[2.0], [0.0]])


def test_the_alignment_adds_lambda_times_the_mean_squared_feature_gap():
  tf.keras.utils.set_random_seed(0)
  model = models.mlp(4, 3, 2)
  x = tf.constant(np.random.default_rng(0).normal(size=(5, 4)), tf.float32)
  y = tf.constant([0, 1, 1, 0, 1])
  targets = tf.constant([[0.5, -0.2, 0.1], [0.0, 0.3, 0.2]])
  start = models.get_weights(model)
  trainer = trainers.PaddedTrainer(model, models.SPARSE_CE_LOGITS, x, y)
  feat = trainers.feature_model(model)
  with tf.GradientTape() as tape:
    logits, z = feat(x, training=True)
    loss = tf.reduce_mean(models.per_example_loss(models.SPARSE_CE_LOGITS, y, logits)
                          + 0.7 * tf.reduce_mean(tf.square(z - tf.gather(targets, y)), -1))
  grads = tape.gradient(loss, model.trainable_variables)
  expected = [w - 0.1 * g for w, g in zip(start, grads)]
  models.set_weights(model, start)
  opt, state = trainers.start_optimizer(optimizers.chain(), start)
  out = trainers.sgd_step(model, models.SPARSE_CE_LOGITS, (x, y, None), 0.1, opt, state, None,
                          (trainer._features(), trainers.FeatureAlignment(targets, 0.7)))
  np.testing.assert_allclose(float(out[0]) / 5, float(loss), rtol=1e-5)
  for a, b in zip(models.get_weights(model), expected):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_round_combines_each_participants_classifier_by_its_weights():
  task = tasks.get_task("synthetic_clusters")
  data = task.load_data(DataOptions(seed=0, num_clients=8, extra={"num_clusters": 2}))
  task = dataclasses.replace(task, model_fn=lambda: models.mlp(60, 8, 10))
  config = TrainingConfig(rounds=2, clients_per_round=4, local_epochs=1, batch_size=10,
                          client_lr=0.05, seed=0)
  driver = registry.build_driver("fedpac", task, data, config)
  driver.setup()
  calls = []
  train = driver.train_clients

  def recording(mode, state, clients, round_num, **kw):
    out = train(mode, state, clients, round_num, **kw)
    calls.append(out)
    return out

  driver.train_clients = recording
  sampled = np.array([0, 2, 5, 7])
  for round_num in (1, 2):
    calls.clear()
    driver.run_round(round_num, sampled)
  stats, trained = calls
  heads = [[np.asarray(w) for w in r["head"]] for r in trained.results]
  vh = [fedpac.statistics(r["sums"], r["squares"], r["counts"], float(r["samples"]))
        for r in stats.results]
  v, h = np.array([a for a, _ in vh]), np.stack([b for _, b in vh])
  for i, c in enumerate(sampled):
    alpha = fedpac.combination_weights(v, h, i)
    expected = fedpac.combine_heads(alpha, heads, i)
    got = driver.client_states[driver.state_key_offset + int(c)]["personal"]
    for a, b in zip(got, expected):
      np.testing.assert_allclose(a, b, rtol=1e-6)
  protos = driver.runner.numpy_state(driver.state)["prototypes"]
  assert np.abs(protos).sum() > 0 and protos.shape == (10, 8)
