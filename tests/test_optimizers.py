"""Client and server optimizers (`tff_cluster.learning.optimizers`): each
transform on hand-computed numbers, chain order, and bit equality with the
update formulas local SGD and the server-momentum baselines were written
with before the optimizers were values."""

import numpy as np
import pytest
import tensorflow as tf

from tff_cluster.learning import optimizers

W = [tf.constant([1.0, -2.0]), tf.constant([[0.5]])]
G = [tf.constant([0.2, 0.4]), tf.constant([[-1.0]])]


def _step(opt, weights, grads, state, lr=0.1, gradient_at=None):
  new, state = opt.update(grads, state, weights, lr, gradient_at)
  return [w.numpy() for w in new], state


def _run(transform, steps, weights=W, grads=G, lr=0.1, state=None, gradient_at=None):
  """`steps` updates with the same gradients; (weights, state) after them."""
  opt = optimizers.as_chain(transform).bind(weights)
  state = opt.init(weights) if state is None else opt.canonical(state)
  for _ in range(steps):
    weights, state = opt.update(grads, state, weights, lr, gradient_at)
  return [w.numpy() for w in weights], state


def test_sgd_by_hand():
  w, state = _run(optimizers.sgd(), 1)
  np.testing.assert_allclose(w[0], [1.0 - 0.02, -2.0 - 0.04], rtol=1e-6)
  np.testing.assert_allclose(w[1], [[0.6]], rtol=1e-6)
  assert tf.nest.flatten(state) == []


def test_heavy_ball_two_steps_by_hand():
  # v1 = g = 0.2, w1 = 1 - 0.1*0.2 = 0.98; v2 = 0.5*0.2 + 0.2 = 0.3, w2 = 0.98 - 0.03 = 0.95.
  w, state = _run(optimizers.heavy_ball(0.5), 2)
  np.testing.assert_allclose(w[0][0], 0.95, rtol=1e-6)
  np.testing.assert_allclose(state[0][0].numpy()[0], 0.3, rtol=1e-6)
  # beta = 0 is plain SGD: no state.
  w0, state0 = _run(optimizers.heavy_ball(0.0), 2)
  assert tf.nest.flatten(state0) == []
  np.testing.assert_allclose(w0[0][0], 1.0 - 2 * 0.02, rtol=1e-6)


def test_heavy_ball_starts_from_a_given_buffer():
  # v0 = 1: v1 = 0.5 + 0.2 = 0.7, w1 = 1 - 0.07 = 0.93.
  w, _ = _run(optimizers.heavy_ball(0.5), 1,
              state=([tf.constant([1.0, 0.0]), tf.constant([[0.0]])],))
  np.testing.assert_allclose(w[0][0], 0.93, rtol=1e-6)


def test_nesterov_two_steps_by_hand():
  # y0 = w0 = 1; y1 = 1 - 0.1*0.2 = 0.98, w1 = 0.98 + 0.5 (0.98 - 1) = 0.97;
  # y2 = 0.97 - 0.02 = 0.95, w2 = 0.95 + 0.5 (0.95 - 0.98) = 0.935.
  w, state = _run(optimizers.nesterov(0.5), 2)
  np.testing.assert_allclose(w[0][0], 0.935, rtol=1e-6)
  np.testing.assert_allclose(state[0][0].numpy()[0], 0.95, rtol=1e-6)


def test_proximal_anchor_defaults_to_the_start():
  weights = [tf.constant([3.0]), tf.constant([[0.0]])]
  grads = [tf.constant([0.0]), tf.constant([[0.0]])]
  # Step 1 at the start: no pull. w1 = 3. The anchor stays 3, so nothing moves.
  w, _ = _run(optimizers.proximal(2.0), 2, weights, grads)
  np.testing.assert_allclose(w[0], [3.0])
  # An explicit anchor 1: g = 2 (3 - 1) = 4, w1 = 3 - 0.1*4 = 2.6.
  anchor = [tf.constant([1.0]), tf.constant([[0.0]])]
  w, _ = _run(optimizers.proximal(2.0, anchor), 1, weights, grads)
  np.testing.assert_allclose(w[0], [2.6], rtol=1e-6)
  # mu = 0 adds nothing.
  w, _ = _run(optimizers.proximal(0.0, anchor), 1, weights, grads)
  np.testing.assert_allclose(w[0], [3.0])


def test_proximal_without_anchor_needs_binding():
  opt = optimizers.chain(optimizers.proximal(1.0))
  with pytest.raises(ValueError, match="bound to the start"):
    opt.update(G, opt.init(W), W, 0.1)


def test_scale_offset_and_control_variate_by_hand():
  w, _ = _run(optimizers.scale(3.0), 1)
  np.testing.assert_allclose(w[0][0], 1.0 - 0.1 * 0.6, rtol=1e-6)
  w, _ = _run(optimizers.offset([tf.constant([1.0, 1.0]), tf.constant([[0.0]])]), 1)
  np.testing.assert_allclose(w[0][0], 1.0 - 0.1 * 1.2, rtol=1e-6)
  seen = []

  def gradient_at(point):
    seen.append(point)
    return [tf.constant([0.05, 0.0]), tf.constant([[0.0]])]

  point = [tf.constant([9.0, 9.0]), tf.constant([[9.0]])]
  w, _ = _run(optimizers.control_variate(point), 1, gradient_at=gradient_at)
  np.testing.assert_allclose(w[0][0], 1.0 - 0.1 * (0.2 - 0.05), rtol=1e-6)
  assert seen and seen[0] is not None and float(seen[0][0][0]) == 9.0


def test_chain_order_is_the_operation_order():
  one = [tf.constant([1.0]), tf.constant([[1.0]])]
  grads = [tf.constant([1.0]), tf.constant([[1.0]])]
  w, _ = _run(optimizers.chain(optimizers.scale(2.0), optimizers.offset(one)), 1,
              one, grads, lr=1.0)
  np.testing.assert_allclose(w[0], [1.0 - 3.0])  # 2 g + 1
  w, _ = _run(optimizers.chain(optimizers.offset(one), optimizers.scale(2.0)), 1,
              one, grads, lr=1.0)
  np.testing.assert_allclose(w[0], [1.0 - 4.0])  # 2 (g + 1)


def test_a_chain_has_one_step_at_its_end():
  with pytest.raises(ValueError, match="one step"):
    optimizers.chain(optimizers.heavy_ball(0.9), optimizers.scale(2.0))
  assert optimizers.chain(optimizers.scale(2.0)).transforms[-1].is_step  # sgd appended


def test_mask_freezes_a_weight_under_momentum():
  opt = optimizers.chain(optimizers.mask([False, True]), optimizers.heavy_ball(0.9))
  w, _ = _run(opt, 3)
  np.testing.assert_array_equal(w[0], W[0].numpy())
  assert not np.allclose(w[1], W[1].numpy())


def test_adam_equals_the_textbook_update():
  b1, b2, eps, lr = 0.9, 0.99, 1e-3, 0.1
  grads_seq = [np.array([0.2, -0.5], np.float32), np.array([0.1, 0.3], np.float32),
               np.array([-0.4, 0.0], np.float32)]
  opt = optimizers.chain(optimizers.adam(b1, b2, eps))
  w = [tf.constant([1.0, 2.0])]
  state = opt.init(w)
  x, m, v = np.array([1.0, 2.0]), np.zeros(2), np.zeros(2)
  for t, g in enumerate(grads_seq, start=1):
    w, state = opt.update([tf.constant(g)], state, w, lr)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g.astype(np.float64) ** 2
    x = x - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
  np.testing.assert_allclose(w[0].numpy(), x, rtol=1e-5)
  assert float(state[0][0]) == 3.0


def test_flat_state_round_trip():
  specs = [tf.TensorSpec([2], tf.float32), tf.TensorSpec([1, 1], tf.float32)]
  opt = optimizers.chain(optimizers.proximal(0.5), optimizers.heavy_ball(0.9))
  state = opt.init(W)
  flat = opt.flat_state(state)
  assert len(flat) == 2
  again = opt.unflat_state(flat, specs)
  assert tf.nest.flatten(again)[0] is flat[0]
  assert opt.stateful and not optimizers.chain(optimizers.sgd()).stateful


# -- bit equality with the formulas local SGD was written with ----------------


def _formula_update(weights, grads, lr, anchor, mu, momentum, velocity, grad_offset, nesterov):
  """Local SGD's update before the optimizers were values, term for term."""
  new_weights, new_velocity = [], [] if momentum or nesterov else None
  for i, (var, grad) in enumerate(zip(weights, grads)):
    if mu:
      grad = grad + mu * (var - anchor[i])
    if grad_offset is not None:
      grad = grad + grad_offset[i]
    if nesterov:
      y_new = var - lr * grad
      new_velocity.append(y_new)
      new_weights.append(y_new + momentum * (y_new - velocity[i]))
      continue
    if momentum:
      grad = momentum * velocity[i] + grad
      new_velocity.append(grad)
    new_weights.append(var - lr * grad)
  return new_weights, new_velocity


@pytest.mark.parametrize("case", [
    dict(), dict(momentum=0.9), dict(momentum=0.9, mu=0.3), dict(momentum=0.7, nesterov=True),
    dict(mu=0.01, offset=True), dict(scale=0.4, offset=True, control=True),
    dict(momentum=0.5, mu=1.0, scale=0.5, offset=True, control=True)])
def test_chain_is_bit_equal_to_the_formulas(case):
  rng = np.random.default_rng(7)
  shapes = [(3, 4), (4,)]
  rand = lambda: [tf.constant(rng.normal(size=s).astype(np.float32)) for s in shapes]  # noqa: E731
  weights, grads, anchor, velocity, grad_offset, at_control = (rand() for _ in range(6))
  momentum, mu = case.get("momentum", 0.0), case.get("mu", 0.0)
  nesterov, scale = case.get("nesterov", False), case.get("scale", 1.0)
  lr = tf.constant(0.37)
  transforms = []
  old_grads = list(grads)
  if case.get("control"):
    transforms.append(optimizers.control_variate(anchor))
    old_grads = [g - c for g, c in zip(old_grads, at_control)]
  if scale != 1.0:
    transforms.append(optimizers.scale(scale))
    old_grads = [scale * g for g in old_grads]
  transforms.append(optimizers.proximal(mu, anchor))
  if case.get("offset"):
    transforms.append(optimizers.offset(grad_offset))
  transforms.append(optimizers.nesterov(momentum) if nesterov
                    else optimizers.heavy_ball(momentum))
  opt = optimizers.chain(*transforms).bind(weights)
  stateful = momentum or nesterov
  state = ((),) * (len(transforms) - 1) + ((tuple(velocity),) if stateful else ((),))
  new, new_state = opt.update(grads, state, weights, lr, lambda point: at_control)
  want, want_velocity = _formula_update(weights, old_grads, lr, anchor, mu, momentum, velocity,
                                        grad_offset if case.get("offset") else None, nesterov)
  for a, b in zip(new, want):
    np.testing.assert_array_equal(a.numpy(), b.numpy())
  if stateful:
    for a, b in zip(opt.flat_state(new_state), want_velocity):
      np.testing.assert_array_equal(a.numpy(), b.numpy())


# -- server optimizers ----------------------------------------------------------


def _formula_server(kind, model, buffer, d, eta, beta, gamma):
  """FedAvgM / FedMom / SlowMo's server step as server_momentum.py wrote it."""
  if kind == "fedavgm":
    buffer = [beta * m + g for m, g in zip(buffer, d)]
    return [w - eta * m for w, m in zip(model, buffer)], buffer
  if kind == "fedmom":
    v_new = [w - eta * g for w, g in zip(model, d)]
    return [v + beta * (v - v_old) for v, v_old in zip(v_new, buffer)], v_new
  buffer = [beta * u + g / gamma for u, g in zip(buffer, d)]
  return [w - eta * gamma * u for w, u in zip(model, buffer)], buffer


@pytest.mark.parametrize("kind,make", [("fedavgm", optimizers.server_heavy_ball),
                                       ("fedmom", optimizers.server_nesterov),
                                       ("slowmo", optimizers.server_slowmo)])
def test_server_optimizers_are_bit_equal_to_the_formulas(kind, make):
  rng = np.random.default_rng(3)
  model = [rng.normal(size=(5, 2)).astype(np.float32), rng.normal(size=2).astype(np.float32)]
  opt = make(0.8, 0.6)
  state = opt.init(model)
  want_buffer = [tf.constant(b) for b in opt.flat_state(state)]
  weights = [tf.constant(w) for w in model]
  want = list(weights)
  gamma = tf.constant(0.05)
  assert opt.uses_client_lr == (kind == "slowmo")
  for _ in range(3):
    d = [tf.constant(rng.normal(size=w.shape).astype(np.float32)) for w in model]
    weights, state = opt.update(d, state, weights, gamma if opt.uses_client_lr else None)
    want, want_buffer = _formula_server(kind, want, want_buffer, d, 0.8, 0.6, gamma)
    for a, b in zip(weights + opt.flat_state(state), want + want_buffer):
      np.testing.assert_array_equal(a.numpy(), b.numpy())
  if kind == "fedmom":  # v_0 = w_0
    np.testing.assert_array_equal(opt.flat_state(opt.init(model))[0], model[0])


def test_server_sgd_at_one_is_the_weighted_mean_bit_for_bit():
  rng = np.random.default_rng(5)
  w = tf.constant(rng.normal(size=(6, 3)).astype(np.float32))
  update_sum = tf.constant(rng.normal(size=(6, 3)).astype(np.float32))
  weight = tf.constant(7.0)
  mean = update_sum / weight
  opt = optimizers.server_sgd(1.0)
  new, state = opt.update([-mean], opt.init([w]), [w])
  np.testing.assert_array_equal(new[0].numpy(), (w + mean).numpy())
  assert opt.flat_state(state) == [] and not opt.stateful and not opt.uses_client_lr
  # eta = 0.5 by hand on one number: 2 - 0.5 * 4 = 0.
  new, _ = optimizers.server_sgd(0.5).update([tf.constant(4.0)], ((),), [tf.constant(2.0)])
  assert float(new[0]) == 0.0
