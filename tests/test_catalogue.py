"""The clustered catalogue's rules: HypCluster, FL+HC and PACFL, and the parts
they added (agglomerative cuts, PACFL's merge loop, client summaries, IFCA's
per-cluster server optimizer, k-means++ by loss, evaluation by training loss).

Runner parity and resume are `tests/test_runners.py`'s and
`tests/test_reliability.py`'s, from each algorithm's PARITY_CASES entry."""

from __future__ import annotations

import collections
import functools

import numpy as np
import pytest
import tensorflow as tf

from tff_cluster import clustering, registry, tasks
from tff_cluster.algorithms.ifca import ifca
from tff_cluster.algorithms.pacfl import pacfl
from tff_cluster.host import loop
from tff_cluster.host.driver import TrainingConfig
from tff_cluster.learning import optimizers
from tff_cluster.spec.task import DataOptions


def _config(**kw):
  base = dict(rounds=3, clients_per_round=8, local_epochs=1, batch_size=10, client_lr=0.05,
              seed=4)
  base.update(kw)
  return TrainingConfig(**base)


@pytest.fixture(scope="module")
def two_clusters():
  task = tasks.get_task("synthetic_clusters")
  return task, task.load_data(DataOptions(seed=3, num_clients=20, extra={"num_clusters": 2}))


def _driver(task, data, algo, config, **options):
  return registry.build_driver(algo, task, data, config, **options)


# --------------------------------------------------------------------------- #
# Agglomerative clustering (FL+HC) and PACFL's merge loop, by hand.


def test_agglomerative_cuts_at_the_threshold_or_into_at_most_k_clusters():
  x = np.array([[0.0], [0.1], [5.0], [5.2], [20.0]])
  labels, found = clustering.agglomerative(x, "euclidean", "single", 1.0, 5)
  assert labels.tolist() == [0, 0, 1, 1, 2] and found == 3
  # The same threshold with room for 2 clusters only: the tree cut into 2.
  labels, found = clustering.agglomerative(x, "euclidean", "single", 1.0, 2)
  assert labels.tolist() == [0, 0, 0, 0, 1] and found == 3
  labels, found = clustering.agglomerative(x, "euclidean", "single", None, 2)
  assert labels.tolist() == [0, 0, 0, 0, 1] and found is None
  # Labels are numbered by first appearance, whatever SciPy's numbering.
  labels, _ = clustering.agglomerative(x[::-1], "euclidean", "complete", 1.0, 5)
  assert labels.tolist() == [0, 1, 1, 2, 2]
  # Cosine: directions, not lengths.
  d = np.array([[1.0, 0.0], [10.0, 0.5], [0.0, 1.0], [0.2, 7.0]])
  assert clustering.agglomerative(d, "cosine", "average", 0.1, 4)[0].tolist() == [0, 0, 1, 1]
  with pytest.raises(ValueError, match="ward"):
    clustering.agglomerative(d, "cosine", "ward", 0.1, 4)


def test_pacfl_merge_loop_by_hand():
  d = np.array([[0, 1, 4, 5], [1, 0, 3, 6], [4, 3, 0, 2], [5, 6, 2, 0]], float)
  # average: merge (0,1) at 1 -> its row is the mean of the two rows
  # [0.5, 0.5, 3.5, 5.5]; then (2,3) at 2 -> the distance of {0,1} to {2,3}
  # is (3.5 + 5.5) / 2 = 4.5.
  labels, found = clustering.merge_below(d, 2.5, "average", 4)
  assert labels.tolist() == [0, 0, 1, 1] and found == 2
  labels, found = clustering.merge_below(d, 4.5, "average", 4)
  assert labels.tolist() == [0, 0, 0, 0] and found == 1  # 4.5 <= beta merges
  # maximum (complete): {0,1} to {2,3} is max(4, 5, 3, 6) = 6 > 4.5.
  labels, found = clustering.merge_below(d, 4.5, "maximum", 4)
  assert labels.tolist() == [0, 0, 1, 1] and found == 2
  # minimum (single): 3 <= 3.
  assert clustering.merge_below(d, 3.0, "minimum", 4)[0].tolist() == [0, 0, 0, 0]
  # At most one cluster: merging goes on past beta; `found` is beta's count.
  labels, found = clustering.merge_below(d, 2.5, "average", 1)
  assert labels.tolist() == [0, 0, 0, 0] and found == 2
  labels, found = clustering.merge_below(d, 0.5, "average", 4)
  assert labels.tolist() == [0, 1, 2, 3] and found == 4


def _merge_by_deleting(d, beta, linkage, max_clusters):
  """The code's loop as it reads: the merged cluster's row and column
  replaced, the other's deleted (the library masks it in place)."""
  a, members, found = np.array(d, float), [[i] for i in range(len(d))], None
  combine = {"average": lambda u, v: (u + v) / 2, "maximum": np.maximum,
             "minimum": np.minimum}[linkage]
  while len(members) > 1:
    work = a + np.diag(np.full(len(a), np.inf))
    i, j = sorted(divmod(int(np.argmin(work)), len(a)))
    if work[i, j] > beta:
      found = len(members) if found is None else found
      if len(members) <= max_clusters:
        break
    a[:, i] = a[i, :] = combine(a[:, i], a[:, j])
    a = np.delete(np.delete(a, j, 0), j, 1)
    members[i] += members.pop(j)
  labels = np.empty(len(d), int)
  for c, group in enumerate(members):
    labels[group] = c
  return labels, len(members) if found is None else found


def test_pacfl_merge_loop_equals_the_codes_deleting_loop_with_ties():
  rng = np.random.default_rng(0)
  for case in range(120):
    n = int(rng.integers(2, 30))
    x = rng.integers(0, 5, (n, n)).astype(float) if case % 2 else rng.random((n, n))
    d = (x + x.T) / 2  # integers: many ties, broken row-major
    for linkage in ("average", "maximum", "minimum"):
      beta, k = float(rng.choice([0.3, 1.0, 2.5, 9.0])), int(rng.integers(1, n + 1))
      want_labels, want_found = _merge_by_deleting(d, beta, linkage, k)
      labels, found = clustering.merge_below(d, beta, linkage, k)
      assert found == want_found, (case, linkage)
      groups = lambda y: {frozenset(np.flatnonzero(y == c)) for c in set(y)}  # noqa: E731
      assert groups(labels) == groups(want_labels), (case, linkage)


def test_pacfl_angles_by_hand():
  """One label each: client A's inputs along e1, client B's along the unit
  vector at 30 degrees in the (e1, e2) plane; a third along e3."""
  rng = np.random.default_rng(0)
  t = np.radians(30.0)
  u = np.array([np.cos(t), np.sin(t), 0.0])
  xs = [rng.uniform(1, 2, (6, 1)) * v for v in (np.eye(3)[0], u, np.eye(3)[2])]
  sig = [pacfl.signature(x, np.zeros(len(x), int), basis=1) for x in xs]
  principal = pacfl.proximity(sig, "principal")
  np.testing.assert_allclose(principal[0, 1], 30.0, atol=1e-6)
  np.testing.assert_allclose(principal[0, 2], 90.0, atol=1e-6)
  np.testing.assert_allclose(np.diag(principal), 0.0, atol=1e-4)
  # The code's form: the angle between the two basis vectors as the SVD signs
  # them (30 or 150 degrees: no absolute value).
  code = pacfl.proximity(sig, "code")
  assert min(abs(code[0, 1] - 30.0), abs(code[0, 1] - 150.0)) < 1e-6
  # Two labels: per label p vectors side by side; a label with fewer examples
  # than p keeps what it has.
  x = rng.normal(size=(7, 4))
  y = np.array([0, 0, 0, 0, 0, 1, 1])
  s = pacfl.signature(x, y, basis=3)
  assert s.shape == (4, 3 + 2)
  np.testing.assert_allclose(s[:, :3].T @ s[:, :3], np.eye(3), atol=1e-10)
  u0 = np.linalg.svd(x[y == 0].T, full_matrices=False)[0][:, :3]
  np.testing.assert_allclose(np.abs(s[:, :3]), np.abs(u0), atol=1e-12)


def test_pacfl_proximity_equals_its_pairwise_definition_on_both_forms():
  """The blocked, upper-triangle forms equal the pairwise definitions: the
  code's min over the element-wise angles of U_i^T U_j, and the smallest
  principal angle (from the largest singular value of Q_i^T Q_j)."""
  rng = np.random.default_rng(0)
  sig = [pacfl.signature(rng.normal(size=(12, 6)), rng.integers(0, k, 12), 2)
         for k in (1, 2, 3, 2, 1)]
  code = pacfl.proximity(sig, "code")
  principal = pacfl.proximity(sig, "principal")
  q = [np.linalg.qr(u)[0] for u in sig]
  for i in range(5):
    for j in range(5):
      want = np.degrees(np.min(np.arccos(np.clip(sig[i].T @ sig[j], -1, 1))))
      assert code[i, j] == pytest.approx(want, abs=1e-9)
      s_max = np.linalg.svd(q[i].T @ q[j], compute_uv=False)[0]
      assert principal[i, j] == pytest.approx(np.degrees(np.arccos(min(s_max, 1.0))), abs=1e-6)


def test_pacfl_recovers_the_true_clusters_with_principal_angles(two_clusters):
  """synthetic_clusters' clusters differ in their input distribution, which
  PACFL's subspaces see: with principal angles, beta = 3 degrees falls
  between the draw's largest within-cluster (2.18) and smallest
  between-cluster (3.47) angle. (The code's element-wise angle depends on
  the signs the SVD gives the basis vectors: on this draw two clients of one
  cluster are 87 degrees apart by it, so no beta separates the clusters.)"""
  task, data = two_clusters
  driver = _driver(task, data, "pacfl", _config(), num_groups=4, pacfl_basis=3,
                   pacfl_beta=3.0, pacfl_proximity="principal")
  driver.setup()
  assert driver.cluster_scores(driver.host.assignment)["ari"] == 1.0
  assert driver.host.summary["pacfl_num_clusters"] == 2
  # The summaries the runner computed are the signatures of the data.
  sigs = driver.runner.client_summaries(functools.partial(pacfl.signature, basis=3), [0, 5])
  np.testing.assert_array_equal(sigs[1], pacfl.signature(*data.train[data.client_ids[5]], 3))


def test_pacfl_more_clusters_than_slots_merge_on_with_a_warning(two_clusters):
  task, data = two_clusters
  driver = _driver(task, data, "pacfl", _config(), num_groups=2, pacfl_basis=3,
                   pacfl_beta=0.5, pacfl_proximity="principal")
  with pytest.warns(UserWarning, match="merged on to 2"):
    driver.setup()
  assert driver.host.summary["pacfl_clusters_at_beta"] > 2
  assert len(np.unique(driver.host.assignment)) == 2


# --------------------------------------------------------------------------- #
# FL+HC.


def test_flhc_is_fedavg_before_its_round_then_clusters_from_the_global_model(two_clusters):
  task, data = two_clusters
  config = _config(rounds=3)
  fedavg = _driver(task, data, "fedavg", config, client_weighting="samples")
  flhc = _driver(task, data, "flhc", config, num_groups=3, flhc_round=3,
                 flhc_threshold=0.8, flhc_metric="cosine", flhc_linkage="average")
  rng_a, rng_b = np.random.default_rng(1), np.random.default_rng(1)
  fedavg.setup()
  flhc.setup()
  for r in (1, 2):
    sampled = np.sort(rng_a.choice(20, 8, replace=False))
    assert (sampled == np.sort(rng_b.choice(20, 8, replace=False))).all()
    a = fedavg.run_round(r, sampled)
    b = flhc.run_round(r, sampled)
    np.testing.assert_allclose(a["train_loss"], b["train_loss"], rtol=1e-6)
  global_model = fedavg.model_weights()
  for w, v in zip(flhc._models()[0], global_model):  # every client in cluster 0
    np.testing.assert_allclose(w, v, rtol=1e-5, atol=1e-7)
  # Round n: every client with training data trains; clusters from the
  # updates; every cluster model restarts at the global model.
  row = flhc.run_round(3, np.arange(8))
  assert row["bytes_up"] == 20 * flhc.num_params * 4
  for m in flhc._models():
    for w, v in zip(m, global_model):
      np.testing.assert_allclose(w, v, rtol=1e-5, atol=1e-7)
  assert row["num_clusters"] == len(np.unique(flhc.host.assignment)) > 1
  # Then FedAvg within the clusters (ClusterModelsDriver's rounds); no re-clustering.
  before = flhc.host.assignment.copy()
  flhc.run_round(4, np.arange(8))
  np.testing.assert_array_equal(flhc.host.assignment, before)


def test_flhc_recovers_the_true_clusters_by_the_directions_of_first_updates(two_clusters):
  """Clustering in round 1 (updates from the initial model): the draw's
  cosine distances are at most 0.64 within a cluster and at least 0.98
  between, so a cut at 0.8 separates them."""
  task, data = two_clusters
  flhc = _driver(task, data, "flhc", _config(), num_groups=3, flhc_round=1,
                 flhc_threshold=0.8, flhc_metric="cosine", flhc_linkage="average")
  flhc.setup()
  flhc.run_round(1, np.arange(8))
  assert flhc.cluster_scores(flhc.host.assignment)["ari"] == 1.0
  assert flhc.host.summary["flhc_clusters_at_threshold"] == 2


def test_flhc_refuses_ward_with_another_metric(two_clusters):
  task, data = two_clusters
  with pytest.raises(ValueError, match="flhc_metric=cosine with --flhc_linkage=ward"):
    _driver(task, data, "flhc", _config(), num_groups=2, flhc_metric="cosine")


# --------------------------------------------------------------------------- #
# HypCluster: IFCA's module with FedJAX's choices.


def _specs(*shapes):
  return [tf.TensorSpec(s, tf.float32) for s in shapes]


def test_per_cluster_server_optimizer_by_hand():
  """Heavy ball per cluster: m_j <- beta m_j + d_j, w_j <- w_j - eta m_j with
  d_j = -(mean update of cluster j); a cluster without clients keeps its
  model and its buffer; a non-trainable weight takes the plain mean."""
  eta, beta = 0.5, 0.9
  d = ifca.IFCADefinition(_specs((2,), (1,)), 1, 2, aggregation="uniform", loss_batches=0,
                          server_optimizer=optimizers.server_heavy_ball(eta, beta))
  w = [np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), np.array([[0.5], [0.7]], np.float32)]
  state = d.initial_state([[w[0][j], w[1][j]] for j in range(2)])
  assert [b.shape for b in state["server_opt_state"]] == [(2, 2)]
  state["server_opt_state"] = [np.array([[0.1, -0.1], [1.0, 1.0]], np.float32)]
  # Two clients in cluster 0 with updates (1, 0), (0, 2) and stats 0.2, 0.4.
  summed = collections.OrderedDict(
      update_sums=[np.array([[1.0, 2.0], [0, 0]], np.float32),
                   np.array([[0.6], [0.0]], np.float32)],
      weight_sums=np.array([2.0, 0.0], np.float32))
  new = d.server_update(state, summed, "train")
  m0 = beta * np.array([0.1, -0.1]) + (-np.array([0.5, 1.0]))
  np.testing.assert_allclose(new["server_opt_state"][0][0], m0, rtol=1e-6)
  np.testing.assert_allclose(new["models"][0][0], [1.0, 2.0] - eta * m0, rtol=1e-6)
  np.testing.assert_allclose(new["models"][1][0], [0.8], rtol=1e-6)
  np.testing.assert_array_equal(new["models"][0][1], w[0][1])  # no clients: kept
  np.testing.assert_array_equal(new["server_opt_state"][0][1], [1.0, 1.0])
  np.testing.assert_array_equal(new["models"][1][1], w[1][1])
  # Without a server optimizer: the mean update added (IFCA's rule).
  plain = ifca.IFCADefinition(_specs((2,), (1,)), 1, 2, aggregation="uniform",
                              loss_batches=0)
  out = plain.server_update(plain.initial_state([[w[0][j], w[1][j]] for j in range(2)]),
                            summed, "train")
  np.testing.assert_allclose(out["models"][0][0], [1.5, 3.0])


def test_kmeans_loss_start_is_farthest_by_lowest_loss(two_clusters):
  """FedJAX's kmeans_init: each next centre is the candidate whose lowest
  mean training loss over the centres so far is the largest; the centres are
  the candidates' own trained models. Losses recomputed with an evaluator of
  the training data (not the runner's assign call)."""
  task, data = two_clusters
  driver = _driver(task, data, "hypcluster", _config(clients_per_round=6), num_groups=3)
  driver.setup()
  ids = list(data.client_ids)
  candidates = [ids.index(c) for c in driver.host.summary["kmeans_init_candidates"]]
  chosen = [ids.index(c) for c in driver.host.summary["kmeans_init_clients"]]
  single = driver.definition.initial_state(driver.w0)
  models = {}
  for c in candidates:
    out = driver.train_clients("forced", single, [c], 1, keys=[0], persist=False,
                               shuffle_round=ifca.KMEANS_SHUFFLE_BASE)
    models[c] = [np.asarray(w)[0] for w in driver.runner.numpy_state(out.state)["models"]]
  for j, c in enumerate(chosen):  # the cluster models are the chosen clients' models
    for w, v in zip(driver._models()[j], models[c]):
      np.testing.assert_array_equal(w, v)
  evaluator = driver.make_evaluator("train")
  losses = {c: evaluator.mean_losses(models[c])[candidates] for c in candidates}
  for step in range(1, 3):
    lowest = np.min([losses[c] for c in chosen[:step]], axis=0)
    np.testing.assert_allclose(lowest.max(), lowest[candidates.index(chosen[step])],
                               rtol=1e-4)


def test_train_loss_evaluation_takes_each_clients_lowest_training_loss(two_clusters):
  task, data = two_clusters
  driver = _driver(task, data, "hypcluster", _config(), num_groups=2,
                   hypcluster_init="random")
  driver.setup()
  driver.run_round(1, np.arange(8))
  models, chosen = driver.eval_models()
  evaluator = driver.make_evaluator("train")
  expected = np.argmin(np.stack([evaluator.mean_losses(m) for m in models]), axis=0)
  np.testing.assert_array_equal(chosen, expected)
  # Clients 8.. were never sampled: chosen at evaluation all the same.
  assert (driver.host.assignment[8:] == -1).all()


def test_hypcluster_recovers_the_true_clusters(two_clusters):
  task, data = two_clusters
  config = _config(rounds=5, clients_per_round=10)
  driver = _driver(task, data, "hypcluster", config, num_groups=2)
  loop.run_training(task, data, config, driver, None, progress=False)
  models, chosen = driver.eval_models()
  assert driver.cluster_scores(chosen)["ari"] == 1.0


# --------------------------------------------------------------------------- #
# Per-example loss weights from frozen models (FedEM's and FedRC's part).


def _np_losses(w, b, x, y):
  z = x @ w + b
  z = z - z.max(1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(1, keepdims=True))
  return -logp[np.arange(len(y)), y]


@pytest.mark.parametrize("trainer_kind", ["dataset", "padded", "functional"])
def test_example_weights_weigh_each_loss_by_a_function_of_frozen_models(trainer_kind):
  """Two steps with w_i = softmax_m(log pi_m - l_m(x_i, y_i))[0] over two
  frozen models (FedEM's responsibility of component 0): each step's
  gradient is sum_i w_i grad l_i / b, by hand; `example_sums` is
  sum_i of the responsibilities of both components."""
  from tff_cluster import models
  from tff_cluster.learning import functional, schedule, trainers
  rng = np.random.default_rng(0)
  n, d, c, lr = 6, 4, 3, 0.5
  x = rng.normal(size=(n, d)).astype(np.float32)
  y = rng.integers(0, c, n).astype(np.int32)
  model = models.mclr(d, c)
  w0 = [rng.normal(size=(d, c)).astype(np.float32), rng.normal(size=c).astype(np.float32)]
  frozen = [[rng.normal(size=(d, c)).astype(np.float32), rng.normal(size=c).astype(np.float32)]
            for _ in range(2)]
  log_pi = np.log(np.array([0.3, 0.7], np.float32))

  def responsibilities(losses, labels):
    del labels
    return tf.nn.softmax(log_pi[:, None] - losses, axis=0)

  first = trainers.ExampleWeights(frozen, lambda l, yy: responsibilities(l, yy)[0])
  both = trainers.ExampleWeights(frozen, responsibilities, width=2)
  work = schedule.LocalWork(3, steps=2)
  if trainer_kind == "dataset":
    trainer = trainers.DatasetTrainer(model, models.SPARSE_CE_LOGITS)
    data = schedule.work_dataset(x, y, work, seed=1)
  else:
    data = schedule.PaddedBatches(*[tf.constant(t) for t in
                                    schedule.padded_batches(n, 0, work, 1)])
    if trainer_kind == "padded":
      trainer = trainers.PaddedTrainer(model, models.SPARSE_CE_LOGITS, tf.constant(x),
                                       tf.constant(y))
    else:
      trainer = functional.FunctionalTrainer(functional.stateless_model(model),
                                             models.SPARSE_CE_LOGITS, tf.constant(x),
                                             tf.constant(y))
  out = tf.function(lambda: trainer.train(w0, data, lr, example_weights=first))()
  sums, count = tf.function(lambda: trainer.example_sums(both, data, 0))()
  order = [b["y"] for b in schedule.work_dataset(
      np.zeros((n, 1), np.float32), np.arange(n, dtype=np.int32), work, 1).as_numpy_iterator()]
  frozen64 = [[a.astype(np.float64) for a in f] for f in frozen]
  lf = np.stack([_np_losses(*f, x, y) for f in frozen64])  # [2, n]
  q = np.exp(log_pi[:, None] - lf)
  q /= q.sum(0, keepdims=True)
  w, b = [t.astype(np.float64) for t in w0]
  for rows in order:
    z = x[rows] @ w + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(rows)), y[rows]] -= 1.0
    p *= q[0, rows][:, None]
    w, b = w - lr * x[rows].T @ p / len(rows), b - lr * p.mean(0)
  np.testing.assert_allclose(out.delta[0], w - w0[0], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(out.delta[1], b - w0[1], rtol=1e-4, atol=1e-5)
  seen = np.concatenate(order)
  np.testing.assert_allclose(sums, q[:, seen].sum(1), rtol=1e-5)
  assert float(count) == len(seen)


# --------------------------------------------------------------------------- #
# FedEM and FedRC: one round by hand.


def _np_step(w, b, x, y, weights, lr):
  """One weighted SGD step of softmax regression on the whole batch."""
  z = x @ w + b
  p = np.exp(z - z.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  p[np.arange(len(y)), y] -= 1.0
  p *= weights[:, None]
  return w - lr * x.T @ p / len(y), b - lr * p.mean(0)


@pytest.fixture(scope="module")
def three_clients():
  task = tasks.get_task("synthetic_clusters")
  data = task.load_data(DataOptions(seed=5, num_clients=3, extra={"num_clusters": 2}))
  return task, data


@pytest.mark.parametrize("algo", ["fedem", "fedrc"])
def test_a_mixture_round_by_hand(algo, three_clients):
  """Clients 0 and 2 of 3 sampled, one local step on the whole training set
  (a batch larger than any client's data):
    FedEM: q = softmax_m(log pi - l_m), pi = mean q, a q-weighted step per
      component, theta_m + sum_{k sampled} (n_k / n) Delta_k,m (n: every
      client's samples);
    FedRC (uniform prior in round 1): the same weights, the n_k-weighted mean
      over the sampled clients; the prior after the round is the clamped,
      normalised sum of the clients' label masses sum_{i: y_i = c} q(i, m).
  """
  task, data = three_clients
  lr, m_count = 0.3, 2
  sizes = data.num_train_samples()
  config = _config(rounds=1, clients_per_round=2, local_epochs=None, local_steps=1,
                   batch_size=int(sizes.max()) + 1, client_lr=lr)
  driver = _driver(task, data, algo, config, num_groups=m_count)
  driver.setup()
  start = [[np.asarray(w, np.float64) for w in m] for m in driver._models()]
  sampled = np.array([0, 2])
  driver.run_round(1, sampled)
  new = driver._models()
  expected = [[np.zeros_like(w) for w in m] for m in start]
  masses, weights_sum = [], 0.0
  for k in sampled:
    x, y = data.train[data.client_ids[k]]
    x = x.astype(np.float64)
    losses = np.stack([_np_losses(*m, x, y) for m in start])
    q = np.exp(np.log(0.5) - losses)
    q /= q.sum(0, keepdims=True)
    np.testing.assert_allclose(driver.host.pi[k], q.mean(1), rtol=1e-5)
    share = sizes[k] / sizes.sum() if algo == "fedem" else sizes[k]
    weights_sum += sizes[k]
    for m in range(m_count):
      w, b = _np_step(*start[m], x, y, q[m], lr)
      expected[m][0] += share * (w - start[m][0])
      expected[m][1] += share * (b - start[m][1])
    masses.append(np.stack([[q[m][y == c].sum() for c in range(data.num_classes)]
                            for m in range(m_count)]))
  for m in range(m_count):
    scale = 1.0 if algo == "fedem" else 1.0 / weights_sum
    for layer in range(2):
      np.testing.assert_allclose(new[m][layer], start[m][layer] + scale * expected[m][layer],
                                 rtol=1e-4, atol=1e-6)
  assert not driver.host.sampled[1] and np.allclose(driver.host.pi[1], 0.5)
  if algo == "fedrc":
    prior = np.maximum(np.sum(masses, axis=0), 1e-8)
    prior /= prior.sum(1, keepdims=True)
    got = driver.runner.numpy_state(driver.state)["log_prior"]
    np.testing.assert_allclose(np.exp(got), prior, rtol=1e-5)


def test_fedrc_weights_divide_by_the_label_prior():
  from tff_cluster.algorithms.fedrc import fedrc
  d = fedrc.FedRCDefinition(_specs((2, 3), (3,)), 2, 2, num_classes=3)
  log_prior = np.log(np.array([[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]], np.float32))
  pi = np.array([0.4, 0.6], np.float32)
  losses = np.array([[1.0, 2.0], [0.5, 0.1]], np.float32)
  y = np.array([0, 2])
  got = d.responsibilities({"log_prior": log_prior}, {"pi": pi})(losses, y).numpy()
  num = pi[:, None] * np.exp(-losses) / np.exp(log_prior)[:, y]
  np.testing.assert_allclose(got, num / num.sum(0), rtol=1e-5)
  masses = np.zeros((3, 2, 3))
  masses[0, 0, 1] = 2.0
  prior = fedrc.label_prior(masses)
  np.testing.assert_allclose(prior[0], [1e-8 / (2 + 2e-8), 2 / (2 + 2e-8), 1e-8 / (2 + 2e-8)])
  np.testing.assert_allclose(prior[1], [1 / 3] * 3)


@pytest.mark.slow
def test_fedem_recovers_the_true_clusters(two_clusters):
  """On an easy draw the components' responsibilities split the clients by
  their true cluster (argmax pi)."""
  task, data = two_clusters
  config = _config(rounds=8, clients_per_round=20, client_lr=0.1)
  driver = _driver(task, data, "fedem", config, num_groups=2)
  loop.run_training(task, data, config, driver, None, progress=False)
  assert driver.cluster_scores(driver.dominant())["ari"] == 1.0


# --------------------------------------------------------------------------- #
# StoCFL.


def test_stocfl_merges_by_hand(two_clusters):
  """Sampled clusters 0, 3, 5 (3 holds clients 3 and 4, 4 unsampled) with
  directions e1, (1, 1)/sqrt2 ... : pairs by cosine, highest first, united
  while >= tau; the merged cluster keeps the smaller id and the larger
  cluster's model."""
  task, data = two_clusters
  driver = _driver(task, data, "stocfl", _config(), stocfl_tau=0.6)
  host = driver.host
  host.cluster_of[4] = 3  # cluster 3 = {3, 4}
  host.psi = {0: np.array([1.0, 0.0]), 3: np.array([1.0, 1.0]), 5: np.array([0.0, 1.0]),
              4: np.array([-5.0, 0.0])}
  host.models = {3: ["model of 3"], 5: ["model of 5"]}
  # cos(0, 3) = cos(3, 5) = 0.707 (row-major: (0, 3) first), cos(0, 5) = 0.
  driver.merge(np.array([0, 3, 5]))
  # (0, 3): cluster 0 (1 member, no model) < cluster 3 (2 members): 0 takes 3's
  # model; (3, 5): 3 resolves to client 3's cluster, now 0: 0 (3 members)
  # keeps its model, 5's is dropped; the (0, 5) pair is below tau.
  assert host.cluster_of[[0, 3, 4, 5]].tolist() == [0, 0, 0, 0]
  assert host.models == {0: ["model of 3"]} and host.merges == 2
  # Stops at the first pair below tau.
  driver = _driver(task, data, "stocfl", _config(), stocfl_tau=0.8)
  driver.host.psi = {0: np.array([1.0, 0.0]), 3: np.array([1.0, 1.0]),
                     5: np.array([0.0, 1.0])}
  driver.merge(np.array([0, 3, 5]))
  assert driver.host.merges == 0 and driver.host.cluster_of[[0, 3, 5]].tolist() == [0, 3, 5]


@pytest.mark.parametrize("rule", ["chain", "parallel"])
def test_stocfl_round_by_hand(rule, three_clients):
  """Two fresh clients in round 1, one step on the whole training set: psi =
  anchor - (anchor after obep=1 step); their two singleton clusters stay
  apart (tau 1 is out of reach); each cluster model = w_g after one step of
  CE + (mu/2)||w - w_g||^2 from a copy of w_g; the global model: chain,
  client 0 from w_g then client 2 from client 0's result, their mean;
  parallel, the mean of both from w_g."""
  task, data = three_clients
  lr, mu = 0.3, 0.5
  sizes = data.num_train_samples()
  batch = int(sizes.max()) + 1
  config = _config(rounds=1, clients_per_round=2, local_epochs=None, local_steps=1,
                   batch_size=batch, client_lr=lr)
  driver = _driver(task, data, "stocfl", config, stocfl_tau=1.0, stocfl_mu=mu,
                   stocfl_obep=1, stocfl_global=rule)
  driver.setup()
  g = [np.asarray(w, np.float64) for w in driver.w0]
  driver.run_round(1, np.array([0, 2]))
  ones = lambda k: np.ones(sizes[k])  # noqa: E731
  trained = {}
  for k in (0, 2):
    x, y = data.train[data.client_ids[k]]
    x = x.astype(np.float64)
    w, b = _np_step(*g, x, y, ones(k), lr)
    psi = np.concatenate([(g[0] - w).ravel(), (g[1] - b).ravel()])
    np.testing.assert_allclose(driver.host.psi[k], psi, rtol=1e-4, atol=1e-6)
    # The cluster step: the proximal term is 0 at the start (w = w_g).
    for got, want in zip(driver.host.models[k], (w, b)):
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    trained[k] = (w, b)
  if rule == "parallel":
    expected = [(trained[0][i] + trained[2][i]) / 2 for i in range(2)]
  else:
    x, y = data.train[data.client_ids[2]]
    second = _np_step(*trained[0], x.astype(np.float64), y, ones(2), lr)
    expected = [(trained[0][i] + second[i]) / 2 for i in range(2)]
  state = driver.runner.numpy_state(driver.state)
  for got, want in zip(state["global"], expected):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
  for got, want in zip(state["anchor"], driver.w0):  # the anchor never moves
    np.testing.assert_array_equal(got, want)
  assert driver.host.merges == 0


def test_stocfl_proximal_pull_by_hand(three_clients):
  """Round 2 of one client whose cluster model differs from w_g: one step of
  g + mu (w - w_g)."""
  task, data = three_clients
  lr, mu = 0.3, 0.5
  sizes = data.num_train_samples()
  config = _config(rounds=2, clients_per_round=1, local_epochs=None, local_steps=1,
                   batch_size=int(sizes.max()) + 1, client_lr=lr)
  driver = _driver(task, data, "stocfl", config, stocfl_mu=mu, stocfl_obep=1,
                   stocfl_global="parallel")
  driver.setup()
  driver.run_round(1, np.array([1]))
  g = [np.asarray(w, np.float64) for w in driver.runner.numpy_state(driver.state)["global"]]
  start = [np.asarray(w, np.float64) for w in driver.host.models[1]]
  driver.host.models[1] = [np.asarray(w + 0.1, np.float32) for w in start]
  start = [w + 0.1 for w in start]
  driver.run_round(2, np.array([1]))
  x, y = data.train[data.client_ids[1]]
  w, b = _np_step(*start, x.astype(np.float64), y, np.ones(sizes[1]), lr)
  w, b = w - lr * mu * (start[0] - g[0]), b - lr * mu * (start[1] - g[1])
  for got, want in zip(driver.host.models[1], (w, b)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_stocfl_recovers_the_true_clusters_of_the_clients_it_has_seen(two_clusters):
  task, data = two_clusters
  config = _config(rounds=4, clients_per_round=8)
  driver = _driver(task, data, "stocfl", config)
  loop.run_training(task, data, config, driver, None, progress=False)
  seen = driver.seen()
  assert len(seen) >= 15
  assert driver.cluster_scores(np.where(np.isin(np.arange(20), seen),
                                        driver.host.cluster_of, -1))["ari"] == 1.0


# --------------------------------------------------------------------------- #
# FedSoft.


def test_lowest_loss_counts_take_the_lowest_index_on_ties():
  from tff_cluster.algorithms.fedsoft import fedsoft
  # Columns are examples: [0.5, 0.1, 0.1] ties clusters 1 and 2 -> 1;
  # [0.2, 0.2, 0.7] -> 0; [0.3, 0.9, 0.3] -> 0; [0.4, 0.3, 0.2] -> 2.
  losses = tf.constant([[0.5, 0.2, 0.3, 0.4], [0.1, 0.2, 0.9, 0.3], [0.1, 0.7, 0.3, 0.2]])
  got = fedsoft.lowest_loss_counts(3)(losses, None).numpy()
  np.testing.assert_array_equal(got, [[0, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 1]])


def test_proximal_mix_adds_each_clusters_pull():
  coefs = tf.constant([0.2, 0.5])
  anchors = [tf.constant([[1.0, 2.0], [3.0, -1.0]])]
  t = optimizers.proximal_mix(coefs, anchors)
  grads, _ = t.update([tf.constant([0.1, 0.1])], (), [tf.constant([2.0, 0.0])], 0.1, None)
  np.testing.assert_allclose(grads[0], [0.1 + 0.2 * 1 + 0.5 * -1, 0.1 + 0.2 * -2 + 0.5 * 1])


def test_fedsoft_round_by_hand(three_clients):
  """S = 2, K = 2, one Adam step on the whole training set: u from each
  sample's lowest-loss cluster (sigma where none); v per cluster; each
  cluster draws K clients with probabilities v_s from the host's generator;
  w_k = w0 after one Adam step on CE + sum_s (lambda/2) u_s ||w - c_s||^2;
  c_s = the mean of its K selected clients' models."""
  task, data = three_clients
  lr, lam, sigma = 0.01, 0.5, 1e-4
  sizes = data.num_train_samples()
  config = _config(rounds=1, clients_per_round=3, local_epochs=None, local_steps=1,
                   batch_size=int(sizes.max()) + 1, client_lr=lr)
  driver = _driver(task, data, "fedsoft", config, num_groups=2, fedsoft_k=2,
                   fedsoft_lambda=lam, fedsoft_sigma=sigma)
  driver.setup()
  clusters = [[np.asarray(w, np.float64) for w in m] for m in driver._models()]
  rng = np.random.default_rng(np.random.SeedSequence([config.seed, 31]))
  driver.run_round(1, np.arange(3))
  u = np.zeros((3, 2))
  for k in range(3):
    x, y = data.train[data.client_ids[k]]
    losses = np.stack([_np_losses(*c, x.astype(np.float64), y) for c in clusters])
    counts = np.bincount(np.argmin(losses, axis=0), minlength=2)
    u[k] = np.where(counts > 0, counts / sizes[k], sigma)
  np.testing.assert_allclose(driver.host.u, u, rtol=1e-6)
  v = u * sizes[:, None]
  v /= v.sum(0)
  picks = [rng.choice(3, 2, replace=False, p=v[:, s]) for s in range(2)]
  w0 = [np.asarray(w, np.float64) for w in driver.w0]
  local = {}
  for k in sorted(set(np.concatenate(picks))):
    x, y = data.train[data.client_ids[k]]
    w, b = _np_step(*w0, x.astype(np.float64), y, np.ones(sizes[k]), 1.0)  # w - g
    g = [w0[0] - w, w0[1] - b]
    g = [g[i] + lam * sum(u[k, s] * (w0[i] - clusters[s][i]) for s in range(2))
         for i in range(2)]
    # Adam's first step: m = (1-b1) g, v = (1-b2) g^2, bias-corrected: g / (|g| + eps).
    local[k] = [w0[i] - lr * g[i] / (np.abs(g[i]) + 1e-8) for i in range(2)]
    for got, want in zip(driver.client_states[k]["model"], local[k]):
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
  for s in range(2):
    for i in range(2):
      want = np.mean([local[int(k)][i] for k in picks[s]], axis=0)
      np.testing.assert_allclose(driver._models()[s][i], want, rtol=1e-4, atol=1e-6)


def test_fedsoft_recovers_the_true_clusters(two_clusters):
  task, data = two_clusters
  config = _config(rounds=3, client_lr=0.01)
  driver = _driver(task, data, "fedsoft", config, num_groups=2, fedsoft_k=5)
  loop.run_training(task, data, config, driver, None, progress=False)
  assert driver.cluster_scores(driver.choice())["ari"] == 1.0
