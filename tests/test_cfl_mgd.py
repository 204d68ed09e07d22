"""CFL-MGD: hand-computed rounds of options I and II, and its reductions to IFCA and FedAvg."""


import numpy as np
import pytest
import tensorflow as tf

from tff_cluster import tasks
from tff_cluster import registry
from tff_cluster.host.driver import TrainingConfig
from tff_cluster.runners.config import RunnerConfig
from tff_cluster.algorithms.cfl_mgd import cfl_mgd
from tff_cluster.spec.task import DataOptions
from tests.conftest import tiered


class FakeTrainer:
  """Losses and gradients given by hand (no model)."""

  def __init__(self, losses, grad):
    self.losses = list(losses)
    self.grad = [tf.constant(g, tf.float32) for g in grad]

  def loss(self, weights, data, max_batches=0):
    del data, max_batches
    # The cluster is recognised by its first weight's first entry (0, 1, 2...).
    j = int(round(float(tf.reshape(weights[0], [-1])[0])))
    return tf.constant(self.losses[j], tf.float32), tf.constant(1.0)

  def gradient(self, weights, data, max_batches=1):
    return self.grad, tf.constant(4.0)


def _cfl(spec, k, *, num_clients, **given):
  """CFL-MGD's definition with one trainable weight and K = k; `given` by the
  definition's names (option, beta, buffer, norm), the rest the declared
  defaults."""
  flags = {"option": "cfl_mgd_option", "beta": "cfl_mgd_beta", "buffer": "cfl_mgd_buffer",
           "norm": "grad_avg_norm"}
  options = registry.get_algorithm("cfl_mgd").options(
      num_groups=k, **{flags[n]: v for n, v in given.items()})
  o = options
  return cfl_mgd.CFLMGDDefinition(spec, 1, k, option=o.cfl_mgd_option, beta=o.cfl_mgd_beta,
                                  buffer=o.cfl_mgd_buffer, norm=o.grad_avg_norm,
                                  num_clients=num_clients, loss_batches=o.ifca_loss_batches,
                                  grad_batches=o.cfl_mgd_grad_batches)


def _f32(structure):
  return tf.nest.map_structure(lambda a: tf.constant(a, tf.float32), structure)


def test_option_one_scales_by_eta_over_all_clients_and_averages_buffers():
  spec = [tf.TensorSpec([2], tf.float32)]
  d = _cfl(spec, 2, option="gradient", beta=0.5, num_clients=4)
  state = d.initial_state([[np.array([0., 0.])], [np.array([1., 1.])]])
  received = d.broadcast(_f32(state), {"lr": tf.constant(0.2)}, "train")
  clients = [  # (losses per cluster, gradient, previous u_i)
      ([0.1, 0.9], [1., 2.], [2., 0.]),
      ([0.2, 0.8], [3., 0.], [0., 4.])]
  total = None
  us = []
  for losses, grad, u_prev in clients:
    out = d.client_work(FakeTrainer(losses, [grad]), None, received,
                        {"velocity": [tf.constant(u_prev, tf.float32)]}, None, "train")
    assert int(out.result["cluster"]) == 0
    u = 0.5 * np.array(u_prev) + np.array(grad)  # u_i <- beta u_i + g_i (current gradient)
    np.testing.assert_allclose(out.state["velocity"][0].numpy(), u)
    us.append(u)
    total = out.summed if total is None else tf.nest.map_structure(tf.add, total, out.summed)
  new = d.server_update(_f32(state), total, "train")
  # chi_0 <- chi_0 - (eta / m) sum u_i with m = 4 clients in total (not 2 members).
  np.testing.assert_allclose(new["models"][0].numpy()[0], -0.2 / 4 * (us[0] + us[1]),
                             rtol=1e-6)
  np.testing.assert_allclose(new["models"][0].numpy()[1], [1., 1.])  # no member
  np.testing.assert_allclose(new["momenta"][0].numpy()[0], (us[0] + us[1]) / 2, rtol=1e-6)
  np.testing.assert_allclose(new["momenta"][0].numpy()[1], [0., 0.])
  # --grad_avg_norm=members divides by the cluster's 2 members instead.
  d2 = _cfl(spec, 2, option="gradient", beta=0.5, num_clients=4,
                        norm="members")
  new2 = d2.server_update(_f32(state), total, "train")
  np.testing.assert_allclose(new2["models"][0].numpy()[0], -0.2 / 2 * (us[0] + us[1]),
                             rtol=1e-6)


def test_option_one_server_buffer_starts_from_the_cluster_buffer():
  spec = [tf.TensorSpec([1], tf.float32)]
  d = _cfl(spec, 2, option="gradient", beta=0.5, buffer="server",
                       num_clients=2)
  assert d.client_state_spec("train") is None
  state = d.initial_state([[np.array([0.])], [np.array([1.])]])
  state["momenta"] = [np.array([[10.], [20.]], np.float32)]
  received = d.broadcast(_f32(state), {"lr": tf.constant(1.0)}, "train")
  out = d.client_work(FakeTrainer([0.5, 0.1], [[1.]]), None, received, None, None, "train")
  assert int(out.result["cluster"]) == 1
  np.testing.assert_allclose(out.summed["velocity_sums"][0].numpy(), [[0.], [11.]])


def test_argmin_ties_go_to_the_lowest_cluster():
  spec = [tf.TensorSpec([1], tf.float32)]
  d = _cfl(spec, 3, option="gradient", beta=0.0, num_clients=1,
                       buffer="server")
  state = d.initial_state([[np.array([0.])], [np.array([1.])], [np.array([2.])]])
  received = d.broadcast(_f32(state), {"lr": tf.constant(1.0)}, "train")
  out = d.client_work(FakeTrainer([0.3, 0.1, 0.1], [[1.]]), None, received, None, None,
                      "train")
  assert int(out.result["cluster"]) == 1


def _softmax_linear_task():
  """One input feature x = 1, two classes, a Dense(2) without bias: the logits
  are the kernel's row, so the cross-entropy gradient is p - onehot(y)."""
  from tff_cluster import models

  def model_fn():
    inputs = tf.keras.Input(shape=(1,))
    logits = tf.keras.layers.Dense(2, use_bias=False, kernel_initializer="zeros")(inputs)
    return tf.keras.Model(inputs, logits)

  return _one_point_task("tiny", model_fn, models.SPARSE_CE_LOGITS, label=0)


def _one_point_task(name, model_fn, loss, label):
  """A task of one client holding the single example (x = 1, `label`)."""
  from tff_cluster.data.federated import FederatedData
  from tff_cluster.spec.task import TaskSpec

  def load(options):
    del options
    x, y = np.ones((1, 1), np.float32), np.full(1, label, np.int32)
    return FederatedData(["a"], {"a": (x, y)}, {"a": (x, y)}, 2, description="one point")

  return TaskSpec(name=name, description="", load_data=load, model_fn=model_fn, loss=loss,
                  defaults={})


def _two_option_two_steps(task, runner, lr, beta, momenta):
  """One CFL-MGD option-II round (P = 1, its one client, 2 local steps of batch
  1) started from the server buffer `momenta`; returns the state in numpy."""
  config = TrainingConfig(rounds=1, clients_per_round=1, local_steps=2,
                                     local_epochs=None, batch_size=1, client_lr=lr, seed=0,
                                     runner=RunnerConfig(runner))
  driver = registry.build_driver("cfl_mgd", 
      task, task.load_data(None), config, num_groups=1, cfl_mgd_beta=beta)
  driver.setup()
  state = driver.runner.numpy_state(driver.state)
  state["momenta"] = [momenta]
  driver.state = driver.runner.put_state(state)
  driver.run_round(1, np.array([0]))
  return driver.runner.numpy_state(driver.state)


@pytest.mark.parametrize("runner", ["local", "tff"])
def test_two_option_two_steps_are_heavy_ball_from_the_cluster_buffer(runner):
  u0 = np.array([[0.2, -0.1]], np.float32)
  got = _two_option_two_steps(_softmax_linear_task(), runner, 0.5, 0.9, u0[None])
  # By hand: w = logits (the kernel's row), grad = softmax(w) - e_0; two steps
  # of u <- beta u + grad, w <- w - eta u, from (w, u) = (0, u_0).
  w, u = np.zeros(2), u0[0].astype(np.float64)
  trajectory = [w.copy()]
  for _ in range(2):
    p = np.exp(w) / np.exp(w).sum()
    u = 0.9 * u + (p - np.array([1.0, 0.0]))
    w = w - 0.5 * u
    trajectory.append(w.copy())
  np.testing.assert_allclose(got["models"][0][0, 0], w, rtol=1e-5)
  np.testing.assert_allclose(got["momenta"][0][0, 0], u, rtol=1e-5)
  # The single-variable form (eq. 7): chi^(s) = chi^(s-1) - eta grad + beta (chi^(s-1) - chi^(s-2)),
  # with chi^(-1) chosen so that the initial buffer is u_0: chi^(-1) = chi^(0) + eta u_0.
  prev, cur = np.zeros(2) + 0.5 * u0[0], np.zeros(2)
  for _ in range(2):
    p = np.exp(cur) / np.exp(cur).sum()
    prev, cur = cur, cur - 0.5 * (p - np.array([1.0, 0.0])) + 0.9 * (cur - prev)
  np.testing.assert_allclose(cur, w, rtol=1e-5)


def _quadratic_task(center):
  """A 1-D quadratic through the real local trainer: one input x = 1, a
  bias-free Dense(1) whose kernel is the scalar w, then p = exp(-(w - c)^2)
  under the binary cross-entropy with label 1, so the loss is -log p = (w - c)^2
  (Keras's 1e-7 guard is negligible while p stays far from 0 and 1)."""
  from tff_cluster import models

  def model_fn():
    inputs = tf.keras.Input(shape=(1,))
    w = tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")(inputs)
    p = tf.keras.layers.Lambda(lambda z: tf.exp(-tf.square(z - center)))(w)
    return tf.keras.Model(inputs, p)

  return _one_point_task("quadratic", model_fn, models.BINARY_PROBS, label=1)


@pytest.mark.parametrize("runner", ["local", "tff"])
def test_two_option_two_steps_on_a_quadratic_equal_the_heavy_ball_closed_form(runner):
  """f(w) = (w - c)^2: heavy ball u <- beta u + f'(w), w <- w - eta u is linear
  in (w - c, u), so two steps are the matrix M^2 with M = [[1 - 2 eta, -eta beta],
  [2, beta]], started from the cluster's server buffer u_0."""
  center, eta, beta, u0 = 1.0, 0.1, 0.9, 0.5
  got = _two_option_two_steps(_quadratic_task(center), runner, eta, beta,
                              np.full((1, 1, 1), u0, np.float32))
  m = np.array([[1 - 2 * eta, -eta * beta], [2.0, beta]])
  e2, u2 = np.linalg.matrix_power(m, 2) @ np.array([0.0 - center, u0])
  np.testing.assert_allclose(float(got["models"][0].reshape(-1)[0]), center + e2, rtol=1e-5)
  np.testing.assert_allclose(float(got["momenta"][0].reshape(-1)[0]), u2, rtol=1e-5)
  # And not what plain SGD or a zero starting buffer would give.
  assert abs((center + e2) - (center + (1 - 2 * eta) ** 2 * (0.0 - center))) > 1e-2
  e2_zero, _ = np.linalg.matrix_power(m, 2) @ np.array([0.0 - center, 0.0])
  assert abs(e2 - e2_zero) > 1e-2


@pytest.fixture(scope="module")
def small():
  task = tasks.get_task("synthetic_clusters")
  return task, task.load_data(DataOptions(seed=3, num_clients=12, extra={"num_clusters": 2}))


def _steps_config(**kw):
  base = dict(rounds=3, clients_per_round=6, local_steps=4, local_epochs=None, batch_size=10,
              client_lr=0.05, seed=4)
  base.update(kw)
  return TrainingConfig(**base)


def _rounds(driver, rounds, data):
  rng = np.random.default_rng(0)
  for r in range(1, rounds + 1):
    driver.run_round(r, np.sort(rng.choice(data.num_clients, 6, replace=False)))
  return driver.runner.numpy_state(driver.state)


INITS = {"random": {},
         "good_init": {"ifca_init": "good_init"},
         "fedavg_warm": {"ifca_init": "fedavg_warm", "ifca_warm_rounds": 2,
                         "ifca_forced_rounds": 2}}


# Each start with the decayed schedule, and the constant one once, in CI; the
# other starts with the constant schedule in the slices (CI's time: 15-26 s a
# case on CI's 2 cores).
@pytest.mark.parametrize("init,lr_decay", tiered(
    [(init, decay) for init in sorted(INITS) for decay in (1.0, 0.5)],
    lambda c: c[1] == 0.5 or c[0] == "random"))
def test_option_two_with_beta_zero_is_ifca_with_uniform_averaging(small, init, lr_decay):
  """The benchmark's control: CFL-MGD with beta = 0 is IFCA (uniform averaging),
  with the same learning-rate schedule and IFCA's initialisations."""
  task, data = small
  config = _steps_config(lr_decay=lr_decay)
  mgd = registry.build_driver("cfl_mgd", task, data, config, num_groups=3,
                                                        cfl_mgd_beta=0.0, **INITS[init])
  ifca = registry.build_driver("ifca", task, data, config, num_groups=3,
                                                      ifca_agg="uniform", **INITS[init])
  mgd.setup()
  ifca.setup()
  a, b = _rounds(mgd, 3, data), _rounds(ifca, 3, data)
  np.testing.assert_array_equal(mgd.host.assignment, ifca.host.assignment)
  for x, y in zip(a["models"], b["models"]):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)
  assert mgd.host.summary["init"] == init and not np.array_equal(a["models"][0][0],
                                                             a["models"][0][1])


def test_one_cluster_with_beta_zero_is_fedavg_on_equal_work(small):
  task, data = small
  config = _steps_config()  # 4 steps of 10 examples each: equal FedAvg weights
  mgd = registry.build_driver("cfl_mgd", task, data, config, num_groups=1,
                                                        cfl_mgd_beta=0.0)
  fedavg = registry.build_driver("fedavg", task, data, config)
  mgd.setup()
  fedavg.setup()
  start = [np.asarray(w[0]) for w in mgd.runner.numpy_state(mgd.state)["models"]]
  fedavg.state = fedavg.runner.put_state(fedavg.definition.initial_state(start))
  a = _rounds(mgd, 3, data)
  b = _rounds(fedavg, 3, data)
  for x, y in zip(a["models"], b["model"]):
    np.testing.assert_allclose(x[0], y, rtol=1e-5, atol=1e-7)


def test_option_one_participants_take_their_cluster_buffer(small):
  task, data = small
  config = _steps_config(local_steps=1)
  driver = registry.build_driver("cfl_mgd", 
      task, data, config, num_groups=2, cfl_mgd_option="gradient", cfl_mgd_beta=0.9)
  driver.setup()
  sampled = np.array([0, 3, 5, 8])
  driver.run_round(1, sampled)
  momenta = driver.runner.numpy_state(driver.state)["momenta"]
  for k in sampled:
    p = driver.host.assignment[k]
    for u, v in zip(driver.client_states[int(k)]["velocity"], momenta):
      np.testing.assert_array_equal(u, v[p])


def test_momentum_reaches_tolerance_in_fewer_rounds_on_least_squares():
  """Option I with full-batch gradients on a strongly convex least-squares
  problem, 1/2 ||D (w - w*)||^2 with D^2 = diag(1, 0.3, 0.1, 0.03, 0.01)
  (condition number 100): with the same stable eta = 1, beta = 0.9 needs
  fewer rounds than beta = 0 (heavy ball's rate ~ sqrt(beta) against 1 - 0.01)."""
  h = np.array([1.0, 0.3, 0.1, 0.03, 0.01])
  target = np.array([1.0, -2.0, 0.5, 3.0, -1.0])
  spec = [tf.TensorSpec([5], tf.float32)]

  class LSTrainer:
    def loss(self, weights, data, max_batches=0):
      return tf.constant(0.0), tf.constant(1.0)

    def gradient(self, weights, data, max_batches=1):
      return [tf.constant(h * (weights[0].numpy() - target), tf.float32)], tf.constant(1.0)

  def rounds_to_tolerance(beta):
    d = _cfl(spec, 1, option="gradient", beta=beta, num_clients=1)
    state = _f32(d.initial_state([np.zeros(5)]))
    u = [tf.zeros([5])]
    for t in range(1, 3001):
      received = d.broadcast(state, {"lr": tf.constant(1.0)}, "train")
      out = d.client_work(LSTrainer(), None, received, {"velocity": u}, None, "train")
      state = d.server_update(state, out.summed, "train")
      u = list(out.state["velocity"])
      if np.linalg.norm(state["models"][0].numpy()[0] - target) < 1e-3:
        return t
    return 3001

  plain, heavy = rounds_to_tolerance(0.0), rounds_to_tolerance(0.9)
  assert heavy < plain < 3001, (heavy, plain)
