"""pFedMo and FedNAG: the score, the running maximum, eqs. 11-12, NAG's local
steps, the server update by hand, and pi = 0 = FedNAG."""

import collections
import dataclasses
import math

import numpy as np
import pytest
import tensorflow as tf

from tff_cluster import tasks
from tff_cluster import models, registry
from tff_cluster.host import loop
from tff_cluster.host.driver import TrainingConfig
from tff_cluster.runners.config import RunnerConfig
from tff_cluster.learning import schedule
from tff_cluster.learning import trainers
from tff_cluster.algorithms.pfedmo.pfedmo import (PFedMoDefinition, personalise,
                                           running_max_scores, soft_cross_entropy)
from tff_cluster.data import federated
from tff_cluster.data.federated import FederatedData
from tff_cluster.learning import optimizers
from tff_cluster.spec.task import DataOptions


def test_score_of_a_two_class_batch_by_hand():
  # p = (0, 0): w = (1/2, 1/2); q = (ln 3, 0): softmax(q) = (3/4, 1/4).
  loss = soft_cross_entropy(tf.constant([[0.0, 0.0]]), tf.constant([[math.log(3.0), 0.0]]))
  expected = -0.5 * (math.log(0.75) + math.log(0.25))
  assert abs(float(loss) - expected) < 1e-6
  assert round(float(loss), 4) == 0.8370


def test_score_averages_over_the_batch():
  p = tf.constant([[0.0, 0.0], [2.0, -1.0]])
  q = tf.constant([[math.log(3.0), 0.0], [0.5, 0.5]])
  each = [float(soft_cross_entropy(p[i:i + 1], q[i:i + 1])) for i in range(2)]
  np.testing.assert_allclose(float(soft_cross_entropy(p, q)), np.mean(each), rtol=1e-6)
  # With equal logits for the student, the loss is ln C whatever the teacher.
  np.testing.assert_allclose(each[1], math.log(2.0), rtol=1e-6)


def test_running_maximum_of_algorithm_2():
  u = tf.zeros([1])
  scores = []
  for loss in (2.0, 1.0, 3.0, 1.5):
    u, s = running_max_scores(u, tf.constant([loss]))
    scores.append(float(s[0]))
  np.testing.assert_allclose(scores, [0.0, 0.5, 0.0, 0.5], atol=1e-7)
  assert float(u[0]) == 3.0


def test_eq_12_identity_and_its_special_cases():
  rng = np.random.default_rng(0)
  x_bar, y_bar, x_r, y_r = (tf.constant(rng.normal(size=5), tf.float32) for _ in range(4))
  for c in (0.0, 0.3, 1.0):
    x_plus, y_plus = personalise(c, x_bar, y_bar, x_r, y_r, "eq12")
    np.testing.assert_allclose(x_plus, x_bar + c * ((x_r - x_bar) - (y_r - y_bar)),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y_plus, (1 - c) * y_bar + c * y_r, rtol=1e-5, atol=1e-6)
  x_plus, y_plus = personalise(0.0, x_bar, y_bar, x_r, y_r, "eq12")  # pi s = 0: FedNAG
  np.testing.assert_allclose(x_plus, x_bar, atol=1e-6)
  np.testing.assert_allclose(y_plus, y_bar, atol=1e-6)
  # gamma = 0: x = y at aggregation time (x_bar = y_bar, x_r = y_r). Eq. 12
  # then gives x+ = x_bar whatever the score (the representation terms
  # cancel), and y+ = (1 - c) x_bar + c x_r, which a gamma = 0 step ignores.
  x_plus, y_plus = personalise(0.4, x_bar, x_bar, x_r, x_r, "eq12")
  np.testing.assert_allclose(x_plus, x_bar, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(y_plus, 0.6 * x_bar + 0.4 * x_r, rtol=1e-5, atol=1e-6)


def test_mix_rule_weights_the_representation_model_and_eq12_cancels_it():
  x_bar, x_r = tf.constant([1.0]), tf.constant([0.0])
  # Converged models (x = y): eq. 12 keeps x_bar, the mix moves toward x_r.
  x12, y12 = personalise(0.5, x_bar, x_bar, x_r, x_r, "eq12")
  xmix, ymix = personalise(0.5, x_bar, x_bar, x_r, x_r, "mix")
  np.testing.assert_allclose(x12, [1.0])
  np.testing.assert_allclose(xmix, [0.5])
  np.testing.assert_allclose(y12, [0.5])
  np.testing.assert_allclose(ymix, [0.5])
  # With zero gradients, NAG from (x+, y+) under eq. 12 drifts away from x_r:
  # x -> 1 + c gamma / (1 - gamma) = 1.5 for c = gamma = 0.5.
  x, y_prev = float(x12[0]), float(y12[0])
  for _ in range(60):
    y = x
    x, y_prev = y + 0.5 * (y - y_prev), y
  assert abs(x - 1.5) < 1e-9


def test_server_update_by_hand():
  """Two workers with a_i = (1/4, 3/4), one 2-vector weight, pi = 0.5."""
  spec = [tf.TensorSpec([2], tf.float32)]
  d = PFedMoDefinition(spec, 1, 2, [0.25, 0.75], np.zeros((1, 2), np.float32),
                       nag_momentum=0.5, pi=0.5, representation=True, model_rule="eq12")
  state = tf.nest.map_structure(lambda a: tf.constant(a, tf.float32),
                                d.initial_state([np.zeros(2)]))
  state["rep_x"] = [tf.constant([1.0, 2.0])]
  state["rep_y"] = [tf.constant([0.5, 1.0])]
  state["u"] = tf.constant([4.0, 1.0])  # worker 0's earlier maximum
  x = np.array([[2.0, 0.0], [0.0, 4.0]], np.float32)
  y = np.array([[1.0, 0.0], [0.0, 2.0]], np.float32)
  a = np.array([0.25, 0.75], np.float32)
  summed = collections.OrderedDict(
      x=[tf.constant(a @ x)], y=[tf.constant(a @ y)], weight=tf.constant(1.0),
      score_loss=tf.constant([2.0, 3.0]), loss_sum=tf.constant(0.0),
      num_examples=tf.constant(10.0))
  new = d.server_update(state, summed, "train")
  x_bar, y_bar = a @ x, a @ y  # (0.5, 3.0), (0.25, 1.5)
  s = np.array([1 - 2.0 / 4.0, 0.0])  # worker 1's loss is a new maximum
  np.testing.assert_allclose(new["s"], s)
  np.testing.assert_allclose(new["u"], [4.0, 3.0])
  x_r, y_r = np.array([1.0, 2.0]), np.array([0.5, 1.0])
  for i in range(2):
    c = 0.5 * s[i]
    y_plus = (1 - c) * y_bar + c * y_r
    x_plus = (1 - c) * x_bar + c * x_r + y_bar - y_plus
    np.testing.assert_allclose(new["x"][0][i], x_plus, rtol=1e-6)
    np.testing.assert_allclose(new["y"][0][i], y_plus, rtol=1e-6)
  # Worker 0: c = 0.25: y+ = 0.75 (0.25, 1.5) + 0.25 (0.5, 1) = (0.3125, 1.375);
  # x+ = 0.75 (0.5, 3) + 0.25 (1, 2) + (0.25, 1.5) - y+ = (0.5625, 2.875).
  np.testing.assert_allclose(new["x"][0][0], [0.5625, 2.875], rtol=1e-6)
  np.testing.assert_allclose(new["model"][0], 0.25 * new["x"][0][0] + 0.75 * new["x"][0][1],
                             rtol=1e-6)
  # The representation model is untouched by the workers' aggregation.
  np.testing.assert_allclose(new["rep_x"][0], x_r)


def test_nag_local_steps_equal_keras_nesterov_sgd():
  """x-sequence of the (x, y) form = Keras' one-sequence Nesterov SGD from v = 0
  (y_0 = x_0); the returned y = x - gamma v."""
  rng = np.random.default_rng(1)
  x = rng.normal(size=(40, 6)).astype(np.float32)
  y = rng.integers(0, 3, 40).astype(np.int32)
  model = models.mclr(6, 3)
  start = models.get_weights(model)
  trainer = trainers.DatasetTrainer(model, models.SPARSE_CE_LOGITS)
  data = schedule.client_dataset(x, y, 8, 1, seed=3)
  out = trainer.train(start, data, 0.3, optimizers.nesterov(0.7), (start,))
  ours = [s + d.numpy() for s, d in zip(start, out.delta)]

  reference = models.mclr(6, 3)
  models.set_weights(reference, start)
  opt = tf.keras.optimizers.SGD(0.3, momentum=0.7, nesterov=True)
  for batch in data:
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(models.per_example_loss(
          models.SPARSE_CE_LOGITS, batch["y"], reference(batch["x"], training=True)))
    opt.apply_gradients(zip(tape.gradient(loss, reference.trainable_variables),
                            reference.trainable_variables))
  for a, b in zip(ours, models.get_weights(reference)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  velocities = [v.numpy() for v in opt.momentums]  # tf_keras and Keras 3 alike
  for y_ours, w, v in zip(out.velocity, ours, velocities):
    np.testing.assert_allclose(y_ours, w - 0.7 * v, rtol=1e-5, atol=1e-6)


def test_two_nag_steps_on_a_quadratic_by_hand():
  """f(w) = 0.5 w^2 per example (a one-weight linear model on x = 1, y = 0
  under squared error is this up to the loss kind; here the update itself):
  y1 = x0 - eta x0; x1 = y1 + gamma (y1 - y0); y2 = x1 - eta x1; x2 = ..."""
  eta, gamma, x0 = 0.1, 0.5, 2.0
  var = tf.Variable([x0])
  y_prev = [tf.constant([x0])]
  for _ in range(2):
    grad = var.read_value()  # d/dw 0.5 w^2
    y_new = var - eta * grad
    var.assign(y_new + gamma * (y_new - y_prev[0]))
    y_prev = [y_new]
  y1 = x0 - eta * x0
  x1 = y1 + gamma * (y1 - x0)
  y2 = x1 - eta * x1
  x2 = y2 + gamma * (y2 - y1)
  np.testing.assert_allclose(var.numpy(), [x2], rtol=1e-6)
  # The same two steps through sgd_step's nesterov branch on a model whose
  # loss gradient is w: MCLR on one example with zero input has gradient only
  # in its bias, so compare the bias sequence with the closed form instead.
  model = models.mclr(1, 2)
  bias = model.trainable_variables[1]
  bias.assign([x0, 0.0])
  model.trainable_variables[0].assign(tf.zeros_like(model.trainable_variables[0]))
  velocity = [tf.zeros_like(model.trainable_variables[0]), tf.constant([x0, 0.0])]
  xs = tf.zeros([1, 1])
  ys = tf.constant([1])
  opt = optimizers.chain(optimizers.nesterov(gamma))
  state = (velocity,)
  for _ in range(2):
    _, _, state = trainers.sgd_step(model, models.SPARSE_CE_LOGITS, (xs, ys, None),
                                          eta, opt, state)
  velocity = state[0]
  # Closed form for the bias b = (b0, b1) of softmax cross-entropy with label 1.
  b, y_old = np.array([x0, 0.0]), np.array([x0, 0.0])
  for _ in range(2):
    p = np.exp(b - b.max()) / np.exp(b - b.max()).sum()
    g = p - np.array([0.0, 1.0])
    y_new = b - eta * g
    b = y_new + gamma * (y_new - y_old)
    y_old = y_new
  np.testing.assert_allclose(bias.numpy(), b, rtol=1e-5)
  np.testing.assert_allclose(velocity[1].numpy(), y_old, rtol=1e-5)


@pytest.fixture(scope="module")
def workers():
  task = tasks.get_task("synthetic_clusters")
  data = task.load_data(DataOptions(seed=5, num_clients=4, extra={"num_clusters": 2}))
  return task, data


def _run(task, data, algo, rounds=3, runner="local", **options):
  config = TrainingConfig(rounds=rounds, clients_per_round=data.num_clients,
                                     local_epochs=None, local_steps=6, batch_size=10,
                                     client_lr=0.05, seed=2, runner=RunnerConfig(runner))
  driver = registry.build_driver(algo, task, data, config, **options)
  loop.run_training(task, data, config, driver, progress=False)
  return driver, driver.runner.numpy_state(driver.state)


def test_fednag_is_pfedmo_with_pi_zero(workers):
  task, data = workers
  _, nag = _run(task, data, "fednag", nag_momentum=0.6)
  _, pi0 = _run(task, data, "pfedmo", nag_momentum=0.6, pfedmo_pi=0.0)
  for key in ("model", "x", "y"):
    for a, b in zip(nag[key], pi0[key]):
      np.testing.assert_array_equal(a, b)
  # Every worker starts from the same (x_bar, y_bar): FedNAG's aggregation.
  for w in nag["x"]:
    np.testing.assert_allclose(w, np.broadcast_to(w[0], w.shape), atol=0)


def test_first_aggregation_of_pfedmo_is_fednags(workers):
  """At k = 1 every score is 0 (u = l), so pi = 1 changes nothing yet."""
  task, data = workers
  _, nag = _run(task, data, "fednag", rounds=1)
  _, pf = _run(task, data, "pfedmo", rounds=1, pfedmo_pi=1.0)
  np.testing.assert_array_equal(pf["s"], np.zeros(4))
  for a, b in zip(nag["x"], pf["x"]):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_pfedmo_personalises_and_the_global_model_is_their_weighted_mean(workers):
  task, data = workers
  driver, state = _run(task, data, "pfedmo", rounds=4, pfedmo_pi=1.0)
  s = state["s"]
  assert np.all((s >= 0) & (s < 1)) and s.max() > 0
  a = data.num_train_samples() / data.num_train_samples().sum()
  np.testing.assert_allclose(state["agg_weight"], a, rtol=1e-6)
  for g, stack in zip(state["model"], state["x"]):
    np.testing.assert_allclose(g, np.tensordot(a, stack, axes=1), rtol=1e-5, atol=1e-6)
  distinct = [w for w in state["x"] if not np.allclose(w, w[0])]
  assert distinct, "workers with different scores must get different models"
  # x_{i+} = x_bar + pi s_i D with one direction D for every worker, and
  # x_+ = x_bar + pi q D (q = sum a_i s_i): x_{i+} - x_+ = pi (s_i - q) D.
  q = float(a @ s)
  i, j = np.argsort(np.abs(s - q))[-2:]
  for g, stack in zip(state["model"], state["x"]):
    d_i = (stack[i] - g) / (s[i] - q)
    d_j = (stack[j] - g) / (s[j] - q)
    np.testing.assert_allclose(d_i, d_j, rtol=1e-3, atol=1e-5)


def test_representation_model_sees_only_the_public_set(workers):
  """Changing the workers' data leaves x_r unchanged; changing the public set
  changes it."""
  task, data = workers
  rng = np.random.default_rng(0)
  public = (rng.normal(size=(50, 60)).astype(np.float32),
            rng.integers(0, 10, 50).astype(np.int32))
  base = dataclasses.replace(data, public=public)
  shuffled_train = {c: (x, np.roll(y, 1)) for c, (x, y) in data.train.items()}
  other = dataclasses.replace(data, train=shuffled_train, public=public)
  _, a = _run(task, base, "pfedmo", rounds=2)
  _, b = _run(task, other, "pfedmo", rounds=2)
  for wa, wb in zip(a["rep_x"], b["rep_x"]):
    np.testing.assert_array_equal(wa, wb)
  assert not all(np.array_equal(wa, wb) for wa, wb in zip(a["x"], b["x"]))
  _, c = _run(task, dataclasses.replace(data, public=(public[0] + 1.0, public[1])),
              "pfedmo", rounds=2)
  assert not all(np.array_equal(wa, wc) for wa, wc in zip(a["rep_x"], c["rep_x"]))


def test_pfedmo_refuses_partial_participation_and_client_momentum(workers):
  task, data = workers
  config = TrainingConfig(rounds=1, clients_per_round=2, local_epochs=1,
                                     batch_size=10, client_lr=0.05)
  with pytest.raises(ValueError, match="clients_per_round=2 for pfedmo"):
    registry.build_driver("pfedmo", task, data, config)
  config = dataclasses.replace(config, clients_per_round=4, client_momentum=0.9)
  with pytest.raises(ValueError, match="client_momentum for fednag"):
    registry.build_driver("fednag", task, data, config)


def test_cli_defaults_to_every_worker_and_writes_both_accuracies(tmp_path, capsys):
  import json

  from tests.helpers import main_in_process
  out = tmp_path / "run"
  code, _, err = main_in_process(
      ["--algo=pfedmo", "--task=synthetic", "--num_clients=6", "--rounds=2",
       "--local_steps=3", "--runner=local", "--progress=false", f"--output_dir={out}"],
      capsys)
  assert code == 0, err
  config = json.loads((out / "config.json").read_text())
  assert config["clients_per_round"] == 6
  rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  assert all(0 <= r["global_test_accuracy"] <= 1 and 0 <= r["test_accuracy"] <= 1
             for r in rows)
  assert "pooled training data" in json.dumps(config)


def _softmax(z):
  z = z - z.max(axis=1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(axis=1, keepdims=True)


def _numpy_pfedmo(w0, workers, public, score_x, a, lr, gamma, pi, tau, rounds, rule):
  """Algorithm 1 with eqs. 6-12 and Algorithm 2 written out in numpy for a
  linear softmax model (W, b), full-batch steps: an oracle independent of the
  library's trainer, definition and runners."""
  def grad(w, x, y):
    p = _softmax(x @ w[0] + w[1])
    p[np.arange(len(y)), y] -= 1.0
    return [x.T @ p / len(y), p.mean(axis=0)]

  def nag(x, y_prev, data):  # tau steps of eqs. 6-7 from (x, y_prev)
    for _ in range(tau):
      y = [xi - lr * g for xi, g in zip(x, grad(x, *data))]
      x = [yi + gamma * (yi - yp) for yi, yp in zip(y, y_prev)]
      y_prev = y
    return x, y_prev

  def score_loss(teacher, student):  # eqs. 8-10
    p = _softmax(score_x @ teacher[0] + teacher[1])
    q = score_x @ student[0] + student[1]
    log_q = q - q.max(axis=1, keepdims=True)
    log_q = log_q - np.log(np.exp(log_q).sum(axis=1, keepdims=True))
    return float(np.mean(-(p * log_q).sum(axis=1)))

  n = len(workers)
  xs, ys = [list(w0) for _ in range(n)], [list(w0) for _ in range(n)]
  x_r, y_r = list(w0), list(w0)
  u = np.zeros(n)
  trace = []
  for _ in range(rounds):
    x_r, y_r = nag(x_r, y_r, public)  # the representation model's tau steps
    trained = [nag(xs[i], ys[i], workers[i]) for i in range(n)]
    losses = np.array([score_loss(x_r, trained[i][0]) for i in range(n)])
    u = np.maximum(u, losses)  # Algorithm 2 (u = l at k = 1)
    s = 1.0 - losses / u
    x_bar = [sum(a[i] * trained[i][0][j] for i in range(n)) for j in range(2)]
    y_bar = [sum(a[i] * trained[i][1][j] for i in range(n)) for j in range(2)]
    for i in range(n):
      c = pi * s[i]
      ys[i] = [(1 - c) * yb + c * yr for yb, yr in zip(y_bar, y_r)]  # eq. 11
      xs[i] = [(1 - c) * xb + c * xr for xb, xr in zip(x_bar, x_r)]
      if rule == "eq12":  # eq. 12's momentum term
        xs[i] = [x + yb - yp for x, yb, yp in zip(xs[i], y_bar, ys[i])]
    x_plus = [sum(a[i] * xs[i][j] for i in range(n)) for j in range(2)]
    trace.append(dict(s=s.copy(), u=u.copy(), x=[list(x) for x in xs],
                      y=[list(y) for y in ys], model=x_plus, x_bar=x_bar))
  return trace


@pytest.mark.parametrize("rule", ["eq12", "mix"])
def test_two_workers_over_four_aggregations_equal_the_papers_equations(rule):
  """Two workers, a 3-feature 3-class linear model, full-batch steps (tau = 3):
  the library's x_{i+}, y_{i+}, scores, running maxima and x_+ after each of
  four aggregations equal `_numpy_pfedmo`'s (scores 0 at k = 1, then above
  0.1), and the personalisation gap ||x_+ - x_bar|| is the trace's."""
  from tff_cluster.spec.task import TaskSpec
  rng = np.random.default_rng(1)
  labelling = rng.normal(size=(3, 3))  # one task; the workers' inputs are shifted

  def split(n, shift):
    x = (rng.normal(size=(n, 3)) + shift).astype(np.float32)
    return x, (x @ labelling).argmax(axis=1).astype(np.int64)

  w0 = [rng.normal(0, 0.1, size=(3, 3)).astype(np.float32), np.zeros(3, np.float32)]
  train = {"w0": split(8, 0.0), "w1": split(12, 0.3)}
  public = split(10, 0.15)
  test = {"w0": split(5, 0.0), "w1": split(5, 0.3)}
  data = FederatedData(["w0", "w1"], train, test, 3, public=public)
  task = TaskSpec(name="tiny", description="", load_data=None,
                  model_fn=lambda: models.mclr(3, 3), loss=models.SPARSE_CE_LOGITS,
                  defaults={})
  config = TrainingConfig(rounds=4, clients_per_round=2, local_epochs=None,
                                     local_steps=3, batch_size=20, client_lr=0.3, seed=0)
  driver = registry.build_driver("pfedmo", 
      task, data, config, nag_momentum=0.5, pfedmo_pi=0.8, score_batch=6, pfedmo_model=rule)
  driver.w0 = w0
  driver.setup()
  a = np.array([8, 12]) / 20.0
  oracle = _numpy_pfedmo([np.asarray(w, np.float64) for w in w0],
                         [train["w0"], train["w1"]], public,
                         driver.definition.score_x.astype(np.float64), a, 0.3, 0.5, 0.8, 3, 4,
                         rule)
  for round_num, expected in enumerate(oracle, start=1):
    row = driver.run_round(round_num, np.array([0, 1]))
    state = driver.runner.numpy_state(driver.state)
    np.testing.assert_allclose(state["s"], expected["s"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(state["u"], expected["u"], rtol=1e-4)
    for j in range(2):
      for i in range(2):
        np.testing.assert_allclose(state["x"][j][i], expected["x"][i][j], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(state["y"][j][i], expected["y"][i][j], rtol=1e-4, atol=1e-5)
      np.testing.assert_allclose(state["model"][j], expected["model"][j], rtol=1e-4, atol=1e-5)
    gap = np.sqrt(sum(np.sum((m - b) ** 2) for m, b in zip(expected["model"],
                                                           expected["x_bar"])))
    assert row["personalisation_gap"] == pytest.approx(gap, rel=1e-3, abs=1e-6)
  assert oracle[0]["s"].max() == 0 and min(oracle[-1]["s"]) > 0.1  # personalised from k = 2


def test_a_federation_read_on_demand_is_read_once(workers):
  """Data made on demand (a `LazyFederatedData`, as `--runner=ray` gets from
  the CLI) on the local runner: pFedMo's pooled batch and the runner share
  one reading."""
  task, data = workers
  calls = []

  def load():
    calls.append(1)
    return data

  lazy = federated.reloading(data, load)
  config = TrainingConfig(rounds=1, clients_per_round=data.num_clients,
                                     local_epochs=1, batch_size=10, client_lr=0.05)
  registry.build_driver("pfedmo", task, lazy, config)
  assert len(calls) == 1


@pytest.mark.tff
def test_a_train_round_on_tff_takes_each_workers_key_and_equals_the_local_runner():
  """The train mode's key is the worker index: on the TFF runner it selects
  the worker's (x, y, a_i) row and places its score in the worker's row of
  `score_loss`; the round equals the local runner's."""
  from tff_cluster.runners import local_runner
  from tff_cluster.runners.tff import runner as tff_runner
  from tff_cluster.data.synthetic import generate_synthetic
  data = generate_synthetic(num_clients=3, seed=0)
  model_fn = lambda: models.mclr(60, 10)  # noqa: E731
  model = model_fn()
  spec = [tf.TensorSpec(v.shape, v.dtype) for v in models.model_variables(model)]
  score_x = data.test[data.client_ids[0]][0][:4]
  d = PFedMoDefinition(spec, 2, 3, [0.2, 0.3, 0.5], score_x, nag_momentum=0.5,
                       pi=0.4, representation=True, model_rule="eq12")
  rng = np.random.default_rng(3)
  state = d.initial_state([rng.normal(0, 0.1, s.shape).astype(np.float32) for s in spec])
  state["rep_x"] = [w + 0.1 for w in state["rep_x"]]
  clients, keys = [2, 0, 1], [2, 0, 1]
  work = schedule.LocalWork(10, epochs=1)
  element_spec = schedule.client_dataset(*data.train[data.client_ids[0]], 10, 1,
                                               0).element_spec
  comp = tff_runner.build_round(d, "train", model_fn, models.SPARSE_CE_LOGITS, element_spec)
  datasets = [schedule.work_dataset(*data.train[data.client_ids[k]], work,
                                          schedule.client_seed(0, 1, k)) for k in clients]
  new, summed, results = comp(state, {"lr": np.float32(0.05)}, datasets,
                              [np.array([k], np.int32) for k in keys])
  scores = np.asarray(summed["score_loss"])
  for k, r in zip(keys, results):
    assert scores[k] == pytest.approx(float(r["score_loss"]), rel=1e-6)
  runner = local_runner.LocalRunner(d, model_fn, models.SPARSE_CE_LOGITS, data, seed=0)
  local = runner.run("train", state, clients, 1, work, 0.05, keys)
  np.testing.assert_allclose(local.summed["score_loss"], scores, rtol=1e-4, atol=1e-6)
  for a, b in zip(tf.nest.flatten(runner.numpy_state(local.state)), tf.nest.flatten(new)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
