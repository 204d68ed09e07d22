"""pFedGraph: the graph's rows (a hand case of the simplex projection), the
difference clip, the local term's gradient, a round's host step, and the
cross-check against the authors' TensorFlow port on the same inputs."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tff_cluster import registry, tasks
from tff_cluster.algorithms.pfedgraph import pfedgraph
from tff_cluster.host.driver import TrainingConfig
from tff_cluster.learning import optimizers
from tff_cluster.spec.task import DataOptions

PORT = os.path.join(os.path.dirname(__file__), "data", "pfedgraph_authors_port.json")


def test_the_projection_onto_the_simplex_by_hand():
  # v = (0.5, 0.3, -0.2): rho = 2, theta = (0.8 - 1) / 2 = -0.1, x = (0.6, 0.4, 0).
  np.testing.assert_allclose(pfedgraph.project_to_simplex([0.5, 0.3, -0.2]), [0.6, 0.4, 0.0])
  # Already on the simplex: unchanged; one coordinate far ahead takes all.
  np.testing.assert_allclose(pfedgraph.project_to_simplex([0.2, 0.3, 0.5]), [0.2, 0.3, 0.5])
  np.testing.assert_allclose(pfedgraph.project_to_simplex([3.0, 0.1, 0.0]), [1.0, 0.0, 0.0])
  # The projection is the QP's minimiser: no simplex point is closer.
  rng = np.random.default_rng(0)
  v = rng.normal(size=5)
  x = pfedgraph.project_to_simplex(v)
  for _ in range(200):
    y = rng.dirichlet(np.ones(5))
    assert np.linalg.norm(x - v) <= np.linalg.norm(y - v) + 1e-12


def test_the_difference_matrix_clips_near_parallel_changes_and_zeros_a_null_one():
  changes = np.array([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0], [0.0, 0.0]])
  m = pfedgraph.difference_matrix(changes)
  cos01 = 1.0 / np.sqrt(1.01)  # 0.995 > 0.9: the pair counts as one
  assert m[0, 1] == m[1, 0] == -1.0 and m[0, 0] == -1.0
  np.testing.assert_allclose(m[1, 2], -0.1 / np.sqrt(1.01))  # 0.0995: kept
  assert cos01 > pfedgraph.SAME_DIRECTION and m[0, 2] == 0.0
  np.testing.assert_array_equal(m[3], 0.0)  # a client that did not move: cosine 0


def test_a_row_of_the_graph_by_hand():
  # Two clients, p = (1/4, 3/4), alpha = 1, orthogonal changes: M = -I.
  # Row 0: p - M_0 / 2 = (0.75, 0.75) -> (0.5, 0.5); row 1: (0.25, 1.25) -> (0, 1).
  graph = pfedgraph.collaboration_graph(np.array([[1.0, 0.0], [0.0, 2.0]]), [10, 30], 1.0)
  np.testing.assert_allclose(graph, [[0.5, 0.5], [0.0, 1.0]])
  models = [[np.array([2.0, 0.0], np.float32)], [np.array([0.0, 4.0], np.float32)]]
  new, vectors = pfedgraph.aggregate(graph, models, 1)
  np.testing.assert_allclose(new[0][0], [1.0, 2.0])
  np.testing.assert_allclose(new[1][0], [0.0, 4.0])
  np.testing.assert_allclose(vectors[0][0], [0.5, 0.5])  # 0.5 * unit(w_0) + 0.5 * unit(w_1)


def test_the_local_terms_gradient_is_that_of_coef_cos():
  rng = np.random.default_rng(1)
  w = [tf.constant(rng.normal(size=(3, 2)), tf.float32), tf.constant(rng.normal(size=2),
                                                                    tf.float32)]
  c = [tf.constant(rng.normal(size=(3, 2)), tf.float32), tf.constant(rng.normal(size=2),
                                                                    tf.float32)]
  with tf.GradientTape() as tape:
    tape.watch(w)
    flat_w = tf.concat([tf.reshape(x, [-1]) for x in w], 0)
    flat_c = tf.concat([tf.reshape(x, [-1]) for x in c], 0)
    term = 0.3 * tf.reduce_sum(flat_c * flat_w) / tf.norm(flat_w)
  expected = tape.gradient(term, w)
  transform = optimizers.cosine_pull(0.3, c)
  zeros = [tf.zeros_like(x) for x in w]
  got, _ = transform.update(zeros, (), w, 0.1, None)
  for a, b in zip(got, expected):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  got0, _ = transform.update(zeros, (), [tf.zeros_like(x) for x in w], 0.1, None)
  for a in got0:  # ||w|| = 0: nothing added
    np.testing.assert_array_equal(a, 0.0)


@pytest.mark.parametrize("scenario", ["A_all_clients_measure_all", "B_all_clients_measure_fc",
                                      "C_partial_2_0_3_measure_all"])
def test_the_graph_and_models_equal_the_authors_tensorflow_port(scenario):
  """The same trained models, start and data sizes through the authors'
  `update_graph_matrix_neighbor` and `aggregation_by_graph` (their TF port
  at 4f5f17c, its cvxpy QP) and through ours: the same graph rows, models
  and vectors to the QP solver's tolerance."""
  port = json.load(open(PORT))
  inputs, case = port["inputs"], port["scenarios"][scenario]
  start = [np.asarray(w, np.float32) for w in inputs["global"]]
  clients = case["participants"]
  models = [[np.asarray(w, np.float32) for w in inputs["clients"][c]] for c in clients]
  compared = [0] if case["measure"] == "fc" else [0, 1]  # fc: the rank-2 kernel
  changes = np.stack([pfedgraph.flat([m[i] - start[i] for i in compared]) for m in models])
  sizes = np.asarray(inputs["data_sizes"])[clients]
  graph = pfedgraph.collaboration_graph(changes, sizes, inputs["alpha"])
  theirs = np.asarray(case["graph"])[np.ix_(clients, clients)]
  np.testing.assert_allclose(graph, theirs, atol=2e-5)
  new, vectors = pfedgraph.aggregate(graph, models, 2)
  for a, c in enumerate(clients):
    for mine, their in zip(new[a], case["aggregated"][str(c)]):
      np.testing.assert_allclose(mine, their, atol=1e-4)
    np.testing.assert_allclose(pfedgraph.flat(vectors[a]), case["cluster_vectors"][str(c)],
                               atol=1e-4)


def test_the_local_term_equals_the_authors_at_their_point():
  port = json.load(open(PORT))
  case = port["scenarios"]["A_all_clients_measure_all"]
  w = [tf.constant(x, tf.float32) for x in case["aggregated"]["0"]]
  c_flat = np.asarray(case["cluster_vectors"]["0"], np.float32)
  c = [tf.constant(c_flat[:6].reshape(3, 2)), tf.constant(c_flat[6:])]
  lam = port["inputs"]["lam"]
  got, _ = optimizers.cosine_pull(lam, c).update([tf.zeros_like(x) for x in w], (), w, 0.1, None)
  np.testing.assert_allclose(pfedgraph.flat(got), port["local_term_client0"]["grad"], atol=1e-8)


def test_a_round_gives_each_client_its_graph_weighted_model():
  task = tasks.get_task("synthetic_clusters")
  data = task.load_data(DataOptions(seed=0, num_clients=8, extra={"num_clusters": 2}))
  config = TrainingConfig(rounds=1, clients_per_round=4, local_epochs=1, batch_size=10,
                          client_lr=0.05, seed=0)
  driver = registry.build_driver("pfedgraph", task, data, config, pfedgraph_alpha=0.3,
                                 pfedgraph_lam=0.2)
  driver.setup()
  sampled = np.array([1, 3, 4, 6])
  out = driver.train_clients("train", driver.state, sampled, 1, persist=False)
  trained = [[np.asarray(w) for w in r["model"]] for r in out.results]
  driver.run_round(1, sampled)
  n = driver.definition.num_trainable
  changes = np.stack([pfedgraph.flat([m[i] - driver.w0[i] for i in range(n)]) for m in trained])
  graph = pfedgraph.collaboration_graph(changes, data.num_train_samples()[sampled], 0.3)
  for a, c in enumerate(sampled):
    state = driver.client_states[driver.state_key_offset + int(c)]
    for i, w in enumerate(state["personal"]):
      np.testing.assert_allclose(w, sum(graph[a, b] * trained[b][i] for b in range(4)),
                                 rtol=1e-5, atol=1e-6)
    assert float(state["pull"]) == pytest.approx(0.2)
  assert driver.state_key_offset + 0 not in driver.client_states  # not sampled: untouched
