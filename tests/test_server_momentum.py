"""FedAvgM, FedMom and SlowMo: server updates by hand, and their reductions to FedAvg."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tff_cluster import tasks
from tff_cluster import registry
from tff_cluster.host import loop
from tff_cluster.host.driver import TrainingConfig
from tff_cluster.runners.config import RunnerConfig
from tff_cluster.algorithms.fedavg.fedavg import FedAvgDefinition
from tff_cluster.algorithms.fedavg.fedavg import SERVER_OPTIMIZERS
from tff_cluster.spec.task import DataOptions

SPEC = [tf.TensorSpec([2], tf.float32)]


def _summed(mean_delta, lr=0.1, clients=2):
  """What the clients' sum looks like for a weighted mean update `mean_delta`
  (total weight 4) at client learning rate `lr`."""
  return collections.OrderedDict(
      update=[tf.constant(np.asarray(mean_delta) * 4.0, tf.float32)],
      weight=tf.constant(4.0), loss_sum=tf.constant(0.0),
      lr_sum=tf.constant(lr * clients, tf.float32), num_clients=tf.constant(float(clients)))


def _definition(kind, spec, server_lr, server_momentum):
  """FedAvg's definition with `kind`'s server optimizer."""
  kind = registry.get_algorithm(kind).fixed["server_optimizer"]
  return FedAvgDefinition(spec, 1, mu=0.0, weighting="processed",
                          server_optimizer=SERVER_OPTIMIZERS[kind](server_lr, server_momentum))


def _two_rounds(kind, deltas, lrs=(0.1, 0.1), **kw):
  d = _definition(kind, SPEC, **kw)
  state = tf.nest.map_structure(lambda a: tf.constant(a, tf.float32),
                                d.initial_state([np.array([1.0, -1.0])]))
  out = []
  for delta, lr in zip(deltas, lrs):
    state = d.server_update(state, _summed(delta, lr), "train")
    out.append(state["model"][0].numpy().astype(np.float64))
  return out


DELTAS = ([0.2, 0.4], [-0.1, 0.3])  # the clients' weighted mean update w_bar - w_t


def test_fedavgm_is_heavy_ball_on_the_pseudo_gradient():
  w1, w2 = _two_rounds("fedavgm", DELTAS, server_lr=0.5, server_momentum=0.9)
  w0 = np.array([1.0, -1.0])
  m1 = -np.array(DELTAS[0])
  np.testing.assert_allclose(w1, w0 - 0.5 * m1, rtol=1e-6)
  m2 = 0.9 * m1 - np.array(DELTAS[1])
  np.testing.assert_allclose(w2, w1 - 0.5 * m2, rtol=1e-6)


def test_fedmom_is_nesterov_on_the_pseudo_gradient():
  w1, w2 = _two_rounds("fedmom", DELTAS, server_lr=0.5, server_momentum=0.9)
  w0 = np.array([1.0, -1.0])
  v0 = w0
  v1 = w0 + 0.5 * np.array(DELTAS[0])  # w_t - eta_s d_t with d_t = -delta
  np.testing.assert_allclose(w1, v1 + 0.9 * (v1 - v0), rtol=1e-6)
  v2 = w1 + 0.5 * np.array(DELTAS[1])
  np.testing.assert_allclose(w2, v2 + 0.9 * (v2 - v1), rtol=1e-6)


def test_fedmom_by_hand():
  """FedMom's server Nesterov step on numbers worked by hand (eta_s = 1,
  beta = 0.5, two equally weighted clients, w_0 = v_0 = 1):
    round 1: clients at 0.4 and 0.6, mean 0.5, d = 1 - 0.5 = 0.5,
             v_1 = 1 - 0.5 = 0.5,  w_1 = 0.5 + 0.5 (0.5 - 1) = 0.25;
    round 2: clients at 0.2 and 0.4, mean 0.3, d = 0.25 - 0.3 = -0.05,
             v_2 = 0.25 + 0.05 = 0.3,  w_2 = 0.3 + 0.5 (0.3 - 0.5) = 0.2.
  The paper's algorithm section (arXiv 2002.02090) could not be read here;
  the rule is the one two public implementations that cite it write (v the
  averaged-model sequence, v_0 = w_0). With v_0 = 0 instead, w_1 would be 0.75."""
  d = _definition("fedmom", [tf.TensorSpec([1], tf.float32)], server_lr=1.0,
                  server_momentum=0.5)
  state = tf.nest.map_structure(lambda a: tf.constant(a, tf.float32),
                                d.initial_state([np.array([1.0])]))
  models = []
  for mean_client_model in (0.5, 0.3):
    w = float(state["model"][0][0])
    summed = collections.OrderedDict(
        update=[tf.constant([2.0 * (mean_client_model - w)], tf.float32)],
        weight=tf.constant(2.0), loss_sum=tf.constant(0.0), lr_sum=tf.constant(0.2),
        num_clients=tf.constant(2.0))
    state = d.server_update(state, summed, "train")
    models.append(float(state["model"][0][0]))
  np.testing.assert_allclose(models, [0.25, 0.2], rtol=1e-6)


def test_slowmo_divides_by_the_base_lr_and_multiplies_back():
  w1, w2 = _two_rounds("slowmo", DELTAS, lrs=(0.1, 0.05), server_lr=2.0, server_momentum=0.5)
  w0 = np.array([1.0, -1.0])
  u1 = -np.array(DELTAS[0]) / 0.1
  np.testing.assert_allclose(w1, w0 - 2.0 * 0.1 * u1, rtol=1e-6)
  u2 = 0.5 * u1 - np.array(DELTAS[1]) / 0.05
  np.testing.assert_allclose(w2, w1 - 2.0 * 0.05 * u2, rtol=1e-5)


@pytest.fixture(scope="module")
def small():
  task = tasks.get_task("synthetic")
  return task, task.load_data(DataOptions(seed=3, num_clients=10))


def _final(task, data, algo, config, **options):
  driver = registry.build_driver(algo, task, data, config, **options)
  loop.run_training(task, data, config, driver, None, progress=False)
  return [np.asarray(w) for w in driver.runner.numpy_state(driver.state)["model"]]


def _config(**kw):
  base = dict(rounds=3, clients_per_round=4, local_epochs=1, batch_size=10, client_lr=0.05,
              seed=2)
  base.update(kw)
  return TrainingConfig(**base)


@pytest.mark.parametrize("algo", ["fedmom", "fedavgm", "slowmo"])
def test_server_lr_one_and_no_momentum_is_fedavg(small, algo):
  task, data = small
  ref = _final(task, data, "fedavg", _config())
  got = _final(task, data, algo, _config(), server_lr=1.0, server_momentum=0.0)
  for a, b in zip(ref, got):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_slowmo_equals_fedavgm_at_a_constant_lr_but_not_under_decay(small):
  task, data = small
  a = _final(task, data, "slowmo", _config(), server_lr=0.7, server_momentum=0.5)
  b = _final(task, data, "fedavgm", _config(), server_lr=0.7, server_momentum=0.5)
  for x, y in zip(a, b):
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)
  a = _final(task, data, "slowmo", _config(lr_decay=0.5), server_lr=0.7, server_momentum=0.5)
  b = _final(task, data, "fedavgm", _config(lr_decay=0.5), server_lr=0.7, server_momentum=0.5)
  assert not np.allclose(a[0], b[0], rtol=1e-3)


@pytest.mark.tff
def test_mime_lite_tff_runner_matches_tffs_build_weighted_mime_lite(small):
  """Three rounds of our MimeLite on the tff runner and of TFF's own
  `build_weighted_mime_lite` (SGDM base optimizer, server SGD at 1.0) on the
  same client datasets end at the same weights."""
  import tensorflow_federated as tff
  task, data = small
  config = _config(runner=RunnerConfig("tff"), client_lr=0.05)
  driver = registry.build_driver("mime_lite", task, data, config,
                                                             mime_momentum=0.5)
  driver.setup()
  sampled = np.array([0, 2, 3, 5])
  batches = {r: driver.runner.datasets(sampled, r, config.local_work) for r in (1, 2, 3)}
  for r in (1, 2, 3):
    driver.run_round(r, sampled)
  ours = driver.runner.numpy_state(driver.state)["model"]

  element_spec = batches[1][0].element_spec

  def model_fn():
    return tff.learning.models.from_keras_model(
        task.model_fn(), loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=element_spec)

  process = tff.learning.algorithms.build_weighted_mime_lite(
      model_fn, base_optimizer=tff.learning.optimizers.build_sgdm(0.05, momentum=0.5),
      server_optimizer=tff.learning.optimizers.build_sgdm(1.0))
  state = process.initialize()
  n = driver.definition.num_trainable
  state = process.set_model_weights(state, tff.learning.models.ModelWeights(
      trainable=list(driver.w0[:n]), non_trainable=list(driver.w0[n:])))
  for r in (1, 2, 3):
    state = process.next(state, batches[r]).state
  theirs = process.get_model_weights(state)
  for a, b in zip(ours[:n], theirs.trainable):  # float32 rounding of different op orders
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  assert not np.allclose(ours[0], driver.w0[0])


def _softmax_grad(w, x, y):
  z = x @ w[0] + w[1]
  p = np.exp(z - z.max(axis=1, keepdims=True))
  p /= p.sum(axis=1, keepdims=True)
  p[np.arange(len(y)), y] -= 1.0
  return [x.T @ p / len(y), p.mean(axis=0)]


def _numpy_mime(w0, clients, lr, beta, server_lr, form, full, steps, rounds):
  """Mime / MimeLite with an SGDM base optimizer written out in numpy for a
  linear softmax model (full-batch local steps): U(g, m) = s g + beta m and
  V(c, m) = s c + beta m with s = 1 - beta ('paper') or 1 ('tff'); MimeLite
  steps with g = grad f_i(y), Mime with grad f_i(y) - grad f_i(x) + c, c the
  sample-weighted mean of the clients' full gradients at x."""
  s = 1.0 - beta if form == "paper" else 1.0
  sizes = np.array([len(y) for _, y in clients], np.float64)
  a = sizes / sizes.sum()
  x = [np.array(v, np.float64) for v in w0]
  m = [np.zeros_like(v) for v in x]
  out = []
  for _ in range(rounds):
    grads_at_x = [_softmax_grad(x, *c) for c in clients]
    c_bar = [sum(a[i] * grads_at_x[i][j] for i in range(len(clients))) for j in range(2)]
    deltas = []
    for i, (cx, cy) in enumerate(clients):
      y = [v.copy() for v in x]
      for _ in range(steps):
        g = _softmax_grad(y, cx, cy)
        if full:
          g = [gj - gx + cj for gj, gx, cj in zip(g, grads_at_x[i], c_bar)]
        y = [yj - lr * (s * gj + beta * mj) for yj, gj, mj in zip(y, g, m)]
      deltas.append([yj - xj for yj, xj in zip(y, x)])
    m = [s * cj + beta * mj for cj, mj in zip(c_bar, m)]
    x = [xj + server_lr * sum(a[i] * deltas[i][j] for i in range(len(clients)))
         for j, xj in enumerate(x)]
    out.append(([v.copy() for v in x], [v.copy() for v in m]))
  return out


@pytest.mark.parametrize("form", ["tff", "paper"])
@pytest.mark.parametrize("algo", ["mime_lite", "mime"])
def test_mime_rounds_equal_the_update_rules_worked_in_numpy(algo, form):
  """Two rounds of MimeLite and Mime under both base-optimizer forms equal the
  rules worked out in numpy (`_numpy_mime`); the two forms differ."""
  from tff_cluster import models
  from tff_cluster.data.federated import FederatedData
  from tff_cluster.spec.task import TaskSpec
  rng = np.random.default_rng(3)
  labelling = rng.normal(size=(3, 3))

  def split(n, shift):
    x = (rng.normal(size=(n, 3)) + shift).astype(np.float32)
    return x, (x @ labelling).argmax(axis=1).astype(np.int64)

  train = {"a": split(6, 0.0), "b": split(10, 0.8)}
  data = FederatedData(["a", "b"], train, {"a": split(3, 0.0), "b": split(3, 0.8)}, 3)
  task = TaskSpec(name="t", description="", load_data=None, model_fn=lambda: models.mclr(3, 3),
                  loss=models.SPARSE_CE_LOGITS, defaults={})
  config = TrainingConfig(rounds=2, clients_per_round=2, local_epochs=None,
                                     local_steps=3, batch_size=16, client_lr=0.4, seed=0)
  driver = registry.build_driver(algo, 
      task, data, config, mime_momentum=0.6, server_lr=0.9, mime_momentum_form=form)
  driver.setup()
  expected = _numpy_mime(driver.w0, [train["a"], train["b"]], 0.4, 0.6, 0.9, form,
                         algo == "mime", 3, 2)
  for round_num, (x, m) in enumerate(expected, start=1):
    driver.run_round(round_num, np.array([0, 1]))
    state = driver.runner.numpy_state(driver.state)
    for got, want in zip(state["model"], x):
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    for got, want in zip(state["momentum"], m):
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
  other = _numpy_mime(driver.w0, [train["a"], train["b"]], 0.4, 0.6, 0.9,
                      "tff" if form == "paper" else "paper", algo == "mime", 3, 2)
  assert not np.allclose(other[-1][0][0], expected[-1][0][0], rtol=1e-3)


def test_mime_refuses_batchnorm_models():
  from tff_cluster import models
  from tff_cluster.data.federated import FederatedData
  from tff_cluster.spec.task import TaskSpec
  rng = np.random.default_rng(0)
  arrays = (rng.normal(size=(4, 784)).astype(np.float32), np.zeros(4, np.int64))
  data = FederatedData(["a"], {"a": arrays}, {"a": arrays}, 10)
  task = TaskSpec(name="bn", description="", load_data=None, model_fn=models.fmnist_cnn,
                  loss=models.SPARSE_CE_LOGITS, defaults={})
  config = TrainingConfig(rounds=1, clients_per_round=1, local_epochs=1,
                                     batch_size=4, client_lr=0.1)
  with pytest.raises(ValueError, match="BatchNorm"):
    registry.build_driver("mime", task, data, config)
