"""FedAvgM, FedMom and SlowMo: server updates by hand, and their reductions to FedAvg."""

import collections

import numpy as np
import pytest
import tensorflow as tf

import tasks
from tff_cluster import algorithms, experiment
from tff_cluster.algorithms.server_momentum import ServerMomentumDefinition
from tff_cluster.task import DataOptions

SPEC = [tf.TensorSpec([2], tf.float32)]


def _summed(mean_delta, lr=0.1, clients=2):
  """What the clients' sum looks like for a weighted mean update `mean_delta`
  (total weight 4) at client learning rate `lr`."""
  return collections.OrderedDict(
      update=[tf.constant(np.asarray(mean_delta) * 4.0, tf.float32)],
      weight=tf.constant(4.0), loss_sum=tf.constant(0.0),
      lr_sum=tf.constant(lr * clients, tf.float32), num_clients=tf.constant(float(clients)))


def _two_rounds(kind, deltas, lrs=(0.1, 0.1), **kw):
  d = ServerMomentumDefinition(SPEC, 1, kind, **kw)
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
  driver = algorithms.get_algorithm(algo).make_driver(task, data, config, **options)
  experiment.run_training(task, data, config, driver, None, progress=False)
  return [np.asarray(w) for w in driver.runner.numpy_state(driver.state)["model"]]


def _config(**kw):
  base = dict(rounds=3, clients_per_round=4, local_epochs=1, batch_size=10, client_lr=0.05,
              seed=2, runner="local")
  base.update(kw)
  return experiment.TrainingConfig(**base)


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
  config = _config(runner="tff", client_lr=0.05)
  driver = algorithms.get_algorithm("mime_lite").make_driver(task, data, config,
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
