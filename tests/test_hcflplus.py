"""HCFL+: the distance, the split's choice and parts, the weights a split
and a removal leave, the label prior, one client's round against the rule
written out step by step (both trainers), and a driver's round that splits
and removes."""

import collections
import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from tff_cluster import models, registry, tasks
from tff_cluster.algorithms.hcflplus import hcflplus
from tff_cluster.host.driver import TrainingConfig
from tff_cluster.learning import schedule, trainers
from tff_cluster.spec.task import DataOptions


def _cos_distance(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return 1.0 - a @ b / np.linalg.norm(a) / np.linalg.norm(b)


def row_distance(x, y):
  """The code's `proto_sim_cs` for one pair, row by row (the reference)."""
  out = 0.0
  for r in range(len(x) - 1):
    a, b = np.asarray(x[r], np.float64), np.asarray(y[r], np.float64)
    if np.sum(a) == 0 or np.sum(b) == 0:
      continue
    out = max(out, _cos_distance(a, b))
  return out


def test_the_distance_is_the_largest_row_distance_but_the_last_rows():
  x = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [5.0, -1.0]])
  y = np.array([[0.0, 1.0], [1.0, 2.0], [3.0, 1.0], [-5.0, 1.0]])
  # Row 0: 1 - 0 = 1; row 1: 1 - 3 / sqrt(10); row 2 skipped (x's sums to 0);
  # row 3 (the last, 1 - (-1) = 2) left out.
  assert row_distance(x, y) == pytest.approx(1.0, rel=1e-12)
  x[0] = [1.0, 1.0]
  assert row_distance(x, y) == pytest.approx(
      max(_cos_distance([1, 1], [0, 1]), _cos_distance([1, 1], [1, 2])), rel=1e-12)
  # Every pair at once: the same numbers.
  many = np.random.default_rng(1).normal(size=(5, 4, 3))
  many[2, 1] = 0.0
  many[3, 0] = [1.0, -1.0, 0.0]
  got = hcflplus.pair_distances(many)
  for a in range(5):
    for b in range(5):
      assert got[a, b] == pytest.approx(row_distance(many[a], many[b]), abs=1e-12)
  # One row: it is the last, so nothing is compared (the code's K = 1).
  assert row_distance(x[:1], -x[:1]) == 0.0
  # A row summing to 0 though not zero is skipped (the code's test is the sum).
  assert row_distance(np.array([[1.0, -1.0], [0, 1]]),
                      np.array([[-1.0, 1.0], [0, 1]])) == 0.0


def test_the_split_takes_the_cluster_of_the_largest_weighted_distance():
  # Clients 0-3 in cluster 0 (two pairs far apart), 4-5 in cluster 1.
  d = np.zeros((6, 6))
  far = [(0, 2), (0, 3), (1, 2), (1, 3)]
  for a, b in far:
    d[a, b] = d[b, a] = 0.9
  d[0, 1] = d[1, 0] = d[2, 3] = d[3, 2] = 0.1
  d[4, 5] = d[5, 4] = 0.5
  pi = np.full((6, 2), 0.5)
  pi[:4, 0] = 1.0
  members = {0: np.arange(4), 1: np.array([4, 5])}
  m, rows, block, go = hcflplus.split_choice(d, pi, members, [0, 1], tol=0.05)
  assert m == 0 and list(rows) == [0, 1, 2, 3]
  np.testing.assert_allclose(block, d[:4, :4])  # pi 1 in cluster 0
  # max 0.9 - mean over the 16 entries (4 x 0.9 x 2 + 4 x 0.1 ... ) / 16.
  mean = (8 * 0.9 + 4 * 0.1) / 16
  assert go == (0.9 - mean > 0.05)
  assert not hcflplus.split_choice(d, pi, members, [0, 1], tol=0.9 - mean + 1e-12)[3]
  labels = hcflplus.two_parts(block)
  assert labels[0] == labels[1] != labels[2] == labels[3]
  # Cluster 1's entry weighted by 0.5 * 0.5 (0.125) is below cluster 0's.
  pi[:4, 0] = 0.3
  m, _, block, _ = hcflplus.split_choice(d, pi, members, [0, 1], tol=0.05)
  assert m == 1 and block.max() == pytest.approx(0.125)
  # No positive entry anywhere: no choice.
  assert hcflplus.split_choice(np.zeros((6, 6)), pi, members, [0, 1], 0.05)[0] is None


def test_a_split_halves_a_column_and_a_removal_renormalises():
  w = np.array([[0.5, 0.3, 0.2, 0.0], [0.1, 0.1, 0.8, 0.0]])
  got = hcflplus.halve(w, 0, 3)
  np.testing.assert_allclose(got, [[0.25, 0.3, 0.2, 0.25], [0.05, 0.1, 0.8, 0.05]])
  got = hcflplus.drop(got, 2)
  np.testing.assert_allclose(got, [[0.25 / 0.8, 0.3 / 0.8, 0, 0.25 / 0.8],
                                   [0.05 / 0.2, 0.1 / 0.2, 0, 0.05 / 0.2]])
  masses = np.zeros((2, 3, 2))
  masses[0, 0] = [3.0, 1.0]
  masses[1, 0] = [1.0, 0.0]
  prior = hcflplus.label_prior(masses, np.array([True, True, False]))
  np.testing.assert_allclose(prior[0], [0.8, 0.2])
  np.testing.assert_allclose(prior[1], [0.5, 0.5])  # floored at 1e-8: uniform
  np.testing.assert_allclose(prior[2], [0.5, 0.5])  # not in use


# ---------------------------------------------------------------------------
# The authors' code on the same inputs (tests/data/hcflplus_authors.json, from
# benchmarks/crosscheck/hcflplus_authors.py: LINs-lab/FedRC at ce79229, its
# FedIASAggregator and FedRC_SW run unmodified in float64).

AUTHORS = json.loads((pathlib.Path(__file__).parent / "data" / "hcflplus_authors.json").read_text())


def test_the_distances_are_the_authors_proto_sim_cs():
  fixture = AUTHORS["distances"]
  np.testing.assert_allclose(hcflplus.pair_distances(np.array(fixture["messages"])),
                             fixture["matrix"], rtol=0, atol=1e-12)


def test_the_e_step_and_the_weights_are_the_authors_fedrc_sw():
  fixture = AUTHORS["e_step"]
  given = {k: np.array(v, np.float64) for k, v in fixture["inputs"].items()
           if isinstance(v, list)}
  score = -given["losses"] - np.log(given["labels_weights"])  # [K, n]
  gamma = hcflplus.e_step(given["sample_learner_weights"], score).numpy()
  post = hcflplus.e_step(given["learners_weights"][:, None], score).numpy()
  np.testing.assert_allclose(gamma, fixture["samples_weights"], rtol=0, atol=1e-12)
  np.testing.assert_allclose(post, fixture["new_samples_weights"], rtol=0, atol=1e-12)
  pi = post.mean(axis=1)
  np.testing.assert_allclose(pi, fixture["learners_weights"], rtol=0, atol=1e-12)
  omega = hcflplus.next_prior(gamma.T, pi, fixture["mu"])  # rows: examples
  np.testing.assert_allclose(omega.T, fixture["sample_learner_weights"], rtol=0, atol=1e-12)
  # The label masses (the code's labels_learner_weights): gamma summed per label.
  targets = np.array(fixture["inputs"]["targets"], int)
  masses = np.stack([gamma[:, targets == c].sum(axis=1) for c in range(4)], axis=1)
  np.testing.assert_allclose(masses, fixture["labels_learner_weights"], rtol=0, atol=1e-12)


def test_a_split_and_a_removal_leave_the_authors_weights():
  fixture = AUTHORS["add_remove"]
  omega = np.zeros((7, 4))  # slots: the code's three clusters, then the new one
  omega[:, :3] = np.array(fixture["inputs"]["sample_learner_weights"]).T
  added = fixture["after_add_learner_1"]
  omega = hcflplus.halve(omega, 1, 3)
  np.testing.assert_allclose(omega.T, added["sample_learner_weights"], rtol=0, atol=1e-12)
  # The split resets pi to uniform (SplitLearnersEnsemble.add_learner).
  np.testing.assert_allclose(added["learners_weights"], np.full(4, 0.25), rtol=0, atol=1e-12)
  removed = fixture["after_remove_learner_0"]
  omega = hcflplus.drop(omega, 0)
  np.testing.assert_allclose(omega[:, 1:].T, removed["sample_learner_weights"], rtol=0,
                             atol=1e-12)
  np.testing.assert_allclose(hcflplus.drop(np.full(4, 0.25), 0)[1:],
                             removed["learners_weights"], rtol=0, atol=1e-12)


def test_the_split_is_the_authors_mix():
  fixture = AUTHORS["split"]
  run = fixture["authors_run"]
  updates = np.array(fixture["inputs"]["updates"])  # [clients, clusters, F]
  pi = np.array(fixture["inputs"]["learners_weights"])
  picked = np.argmax(pi, axis=1)
  np.testing.assert_array_equal(picked, [run["clients_cluster_indicies"][str(i)]
                                         for i in range(6)])
  distances = hcflplus.pair_distances(updates)
  np.testing.assert_allclose(distances, run["similarities"], rtol=0, atol=1e-12)
  members = {m: np.flatnonzero(picked == m) for m in range(3)}
  m, rows, block, go = hcflplus.split_choice(distances, pi, members, [0, 1, 2], 0.05)
  assert m == run["chosen_cluster"] and go == run["split"]
  assert list(rows) == run["members"]
  np.testing.assert_allclose(block, run["weighted_matrix"], rtol=0, atol=1e-12)
  assert block.max() == pytest.approx(run["min_sim"], abs=1e-12)
  assert block.mean() == pytest.approx(run["mean"], abs=1e-12)
  labels = hcflplus.two_parts(block)
  np.testing.assert_array_equal(labels, fixture["sklearn_metric_precomputed"]["labels"])
  assert [c for c in range(3) if not len(members[c])] == run["decide_removes"]


# ---------------------------------------------------------------------------
# One client's round, the rule written out.

def _model():
  return tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3, activation="tanh"),
                              tf.keras.layers.Dense(2)])


def _ce(logits, y):
  return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)


def _reference(w, kernels, biases, active, log_prior, pi, omega, x, y, batches, lr, mu):
  """The module docstring's steps 1-3 for one client, plain TF on the weights."""
  w1, b1 = tf.constant(w[0]), tf.constant(w[1])
  s = len(kernels)
  off = np.where(active > 0, 0.0, -np.inf)[:, None]

  def feats(w1, b1, xb):
    return tf.tanh(xb @ w1 + b1)

  def scores(xb, yb):
    z = feats(w1, b1, xb)
    losses = tf.stack([_ce(z @ kernels[m] + biases[m], yb) for m in range(s)]).numpy()
    return -losses + off - log_prior[:, yb]

  visited = sorted({int(r) for rows in batches for r in rows})
  sc = {r: scores(x[[r]], y[[r]])[:, 0] for r in visited}
  gamma = {r: np.exp(np.log(omega[r]) + sc[r] - np.logaddexp.reduce(np.log(omega[r]) + sc[r]))
           for r in visited}
  post = {r: np.exp(np.log(pi) + sc[r] - np.logaddexp.reduce(np.log(pi) + sc[r])) for r in visited}
  seen = [r for rows in batches for r in rows]  # every visit counts (the round's batches)
  new_pi = np.mean([post[r] for r in seen], axis=0)
  masses = np.zeros((s, 2))
  for r in seen:
    masses[:, y[r]] += gamma[r]
  new_omega = omega.copy()
  for r in visited:
    new_omega[r] = mu * gamma[r] + (1 - mu) * new_pi
  heads = []
  for m in range(s):
    k, b = tf.Variable(kernels[m]), tf.Variable(biases[m])
    if active[m] > 0:
      for rows in batches:
        g = tf.constant(np.array([gamma[r][m] for r in rows], np.float32))
        with tf.GradientTape() as tape:
          loss = tf.reduce_sum(g * _ce(feats(w1, b1, x[rows]) @ k + b, y[rows])) / len(rows)
        gk, gb = tape.gradient(loss, [k, b])
        k.assign_sub(lr * gk)
        b.assign_sub(lr * gb)
    heads.append((k.numpy(), b.numpy()))
  v1, c1 = tf.Variable(w1), tf.Variable(b1)
  for rows in batches:
    g = np.array([[gamma[r][m] for r in rows] for m in range(s)], np.float32)
    with tf.GradientTape() as tape:
      z = feats(v1, c1, x[rows])
      loss = tf.add_n([tf.reduce_sum(g[m] * _ce(z @ heads[m][0] + heads[m][1], y[rows]))
                       for m in range(s)]) / len(rows)
    g1, g2 = tape.gradient(loss, [v1, c1])
    v1.assign_sub(lr * g1)
    c1.assign_sub(lr * g2)
  return dict(pi=new_pi, omega=new_omega, masses=masses, heads=heads,
              body=[v1.numpy() - w[0], c1.numpy() - w[1]])


@pytest.mark.parametrize("trainer_kind", ["padded", "dataset"])
def test_a_clients_round_is_the_rule_step_by_step(trainer_kind):
  tf.keras.utils.set_random_seed(3)
  model = _model()
  w = [np.asarray(v) for v in models.get_weights(model)]
  spec = [tf.TensorSpec(a.shape, tf.float32) for a in w]
  rng = np.random.default_rng(0)
  n, s = 7, 3
  x = rng.normal(size=(n, 4)).astype(np.float32)
  y = np.array([0, 1, 1, 0, 1, 0, 1], np.int32)
  d = hcflplus.HCFLPlusDefinition(spec, 4, s, head=[2, 3], num_rows=9, num_classes=2, mu=0.4,
                                  likelihood="fedrc", distance="updates")
  kernels = np.stack([w[2], -w[2], 0.5 * w[2]]).astype(np.float32)
  biases = np.stack([w[3], w[3] + 0.1, w[3]]).astype(np.float32)
  active = np.array([1.0, 1.0, 0.0], np.float32)  # slot 2 not in use
  state = d.initial_state((w, kernels, biases, active))
  log_prior = np.log(np.array([[0.7, 0.3], [0.4, 0.6], [0.5, 0.5]], np.float32))
  state["log_prior"] = log_prior
  received = d.broadcast(state, {"lr": np.float32(0.3)}, "train")
  pi = np.array([0.6, 0.4, 0.0], np.float32)
  omega = np.zeros((9, s), np.float32)
  omega[:, 0] = rng.uniform(0.2, 0.8, size=9)
  omega[:, 1] = 1 - omega[:, 0]
  client_state = collections.OrderedDict(pi=pi, omega=omega, weight=np.float32(n))
  # Three steps of batch 3 over 7 examples: the first epoch's 3 batches.
  work = schedule.LocalWork(3, steps=3)
  padded = schedule.padded_batches(n, 0, work, 11)
  batches = [list(padded.indices[i, :padded.sizes[i]]) for i in range(3)]
  if trainer_kind == "padded":
    trainer = trainers.PaddedTrainer(model, models.SPARSE_CE_LOGITS, tf.constant(x),
                                     tf.constant(y))
    data = padded
  else:
    trainer = trainers.DatasetTrainer(model, models.SPARSE_CE_LOGITS)
    data = schedule.work_dataset(x, y, work, 11, rows=True)
  out = d.client_work(trainer, None, received, client_state, data, "train")
  want = _reference(w, kernels, biases, active, log_prior, pi.astype(np.float64),
                    omega.astype(np.float64), x, y, batches, 0.3, 0.4)
  np.testing.assert_allclose(out.result["pi"], want["pi"], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out.state["omega"], want["omega"], rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(out.state["omega"][7:], omega[7:])  # rows past the data
  np.testing.assert_allclose(out.result["label_mass"], want["masses"], rtol=1e-5, atol=1e-6)
  for m in range(s):
    np.testing.assert_allclose(out.result["d_kernel"][m], want["heads"][m][0] - kernels[m],
                               rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(out.result["d_bias"][m], want["heads"][m][1] - biases[m],
                               rtol=1e-4, atol=1e-6)
  np.testing.assert_array_equal(out.result["d_kernel"][2], 0.0)  # slot 2 untouched
  for got, ref in zip(out.summed["body"][:2], want["body"]):
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)
  np.testing.assert_array_equal(out.summed["body"][2], 0.0)  # the head is not the body's
  np.testing.assert_allclose(out.summed["kernels"], n * np.asarray(out.result["d_kernel"]),
                             rtol=1e-6)
  # The rows a split compares: each cluster's head update, kernel then bias.
  np.testing.assert_array_equal(
      hcflplus.update_rows(out.result["d_kernel"], out.result["d_bias"])[1],
      np.concatenate([np.ravel(out.result["d_kernel"][1]), out.result["d_bias"][1]]))


# ---------------------------------------------------------------------------
# The host's steps on a real round.

def _driver(**options):
  task = tasks.get_task("synthetic_clusters")
  data = task.load_data(DataOptions(seed=0, num_clients=8, extra={"num_clusters": 2}))
  config = TrainingConfig(rounds=3, clients_per_round=8, local_steps=2, local_epochs=None,
                          batch_size=10, client_lr=0.05, seed=0)
  driver = registry.build_driver("hcflplus", task, data, config, **options)
  driver.setup()
  return driver, data


def test_a_round_splits_the_cluster_and_removes_the_unpicked_one():
  driver, data = _driver(num_groups=3, hcflplus_init=2, hcflplus_tol=0.0)
  calls = []
  train = driver.train_clients

  def spy(mode, state, clients, round_num, **kw):
    out = train(mode, state, clients, round_num, **kw)
    calls.append(out)
    return out

  driver.train_clients = spy
  before = driver.runner.numpy_state(driver.state)
  everyone = np.arange(8)
  row = driver.run_round(1, everyone)
  out = calls[0]
  host = driver.host
  pis = np.stack([np.asarray(r["pi"], np.float64) for r in out.results])
  picked = np.argmax(pis, axis=1)
  # The distances of the round's pairs: the code's rows in the clusters' order.
  rows = [hcflplus.update_rows(r["d_kernel"], r["d_bias"])[[0, 1]] for r in out.results]
  for a in range(8):
    for b in range(8):
      assert host.distances[a, b] == pytest.approx(row_distance(rows[a], rows[b]))
  members = {m: everyone[picked == m] for m in (0, 1)}
  m, part_rows, block, go = hcflplus.split_choice(host.distances, pis, members, [0, 1], 0.0)
  unpicked = [c for c in (0, 1) if not (picked == c).any()]
  assert go and row["hcflplus_split"] == 1
  assert row["hcflplus_removed"] == len(unpicked)
  # Bytes: each client receives and sends the extractor (none: MCLR) and the
  # round's two heads, 60 x 10 + 10 floats each, both ways.
  assert row["bytes_down"] == row["bytes_up"] == 8 * 2 * 610 * 4
  assert host.order == [c for c in (0, 1) if c not in unpicked] + [2]
  # The new heads: each part's n-weighted mean of its local heads m.
  labels = hcflplus.two_parts(block)
  sizes = data.num_train_samples().astype(np.float64)
  state = driver.runner.numpy_state(driver.state)
  for part, slot in ((0, m), (1, 2)):
    clients = part_rows[labels == part]
    w = sizes[clients] / sizes[clients].sum()
    want = before["kernels"][m] + sum(
        wi * np.asarray(out.results[int(k)]["d_kernel"], np.float64)[m]
        for wi, k in zip(w, clients))
    np.testing.assert_allclose(state["kernels"][slot], want, rtol=1e-5, atol=1e-7)
  # Every client's pi uniform over the clusters left; omega halved into the new slot.
  active = np.isin(np.arange(3), host.order)
  np.testing.assert_allclose(host.pi, np.tile(active / active.sum(), (8, 1)))
  np.testing.assert_array_equal(state["active"], active.astype(np.float32))
  for key, st in driver.client_states.numpy_items(driver.client_states.snapshot()).items():
    omega = np.asarray(st["omega"], np.float64)[:int(sizes[key])]
    np.testing.assert_allclose(omega.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(omega[:, m], omega[:, 2], rtol=1e-6)
    for c in unpicked:
      assert (omega[:, c] == 0).all()
    np.testing.assert_allclose(st["pi"], active / active.sum(), rtol=1e-6)
  # A client never sampled starts with the same weights.
  np.testing.assert_allclose(host.fresh_pi, active / active.sum())
  assert driver.summary()["hcflplus_splits"][0]["new_slot"] == 2


def test_a_model_not_ending_in_a_dense_layer_is_refused_in_one_line():
  task = tasks.get_task("synthetic_clusters")
  data = task.load_data(DataOptions(seed=0, num_clients=8, extra={"num_clusters": 2}))
  config = TrainingConfig(rounds=1, clients_per_round=4, local_steps=1, local_epochs=None,
                          batch_size=10, client_lr=0.05, seed=0)

  def softmax_after():
    return tf.keras.Sequential([tf.keras.Input((60,)), tf.keras.layers.Dense(10),
                                tf.keras.layers.Dense(10), tf.keras.layers.Softmax()])

  import dataclasses
  with pytest.raises(ValueError, match="ends in a Dense layer with use_bias=True"):
    registry.build_driver("hcflplus", dataclasses.replace(task, model_fn=softmax_after), data,
                          config, num_groups=2)
  with pytest.raises(ValueError, match=r"invalid --hcflplus_init=3; valid: 1..--num_groups \(2\)"):
    registry.build_driver("hcflplus", task, data, config, num_groups=2, hcflplus_init=3)
