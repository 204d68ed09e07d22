"""Client datasets and local (proximal) SGD, checked against hand-derived numpy."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf

from tests import references
from tff_cluster import models
from tff_cluster.learning import schedule


# ---------------------------------------------------------------------------
# client_dataset


def _epochs(n: int, batch_size: int, epochs: int, seed: int):
  """Labels of each batch of a fresh `client_dataset` over samples 0..n-1."""
  x = np.arange(n, dtype=np.float32).reshape(n, 1) * 10.0
  y = np.arange(n, dtype=np.int32)
  batches = []
  for batch in schedule.client_dataset(x, y, batch_size, epochs, seed):
    # x and y must stay paired through the shuffle.
    np.testing.assert_array_equal(batch["x"].numpy()[:, 0], batch["y"].numpy() * 10.0)
    batches.append(batch["y"].numpy())
  return batches


def test_every_epoch_visits_each_sample_once_and_batches_stop_at_epoch_end():
  n, batch_size, epochs = 25, 10, 3
  batches = _epochs(n, batch_size, epochs, seed=5)
  assert [len(b) for b in batches] == [10, 10, 5] * epochs
  per_epoch = [np.concatenate(batches[3 * e:3 * e + 3]) for e in range(epochs)]
  for order in per_epoch:
    np.testing.assert_array_equal(np.sort(order), np.arange(n))
  # Reshuffled each pass: not the same permutation, and actually shuffled.
  assert not np.array_equal(per_epoch[0], per_epoch[1])
  assert not np.array_equal(per_epoch[1], per_epoch[2])
  assert not np.array_equal(per_epoch[0], np.arange(n))


def test_same_seed_same_order_different_seed_different_order():
  a = np.concatenate(_epochs(25, 10, 2, seed=11))
  b = np.concatenate(_epochs(25, 10, 2, seed=11))
  c = np.concatenate(_epochs(25, 10, 2, seed=12))
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)


def test_batch_size_larger_than_client_gives_one_batch_per_epoch():
  batches = _epochs(7, 10, 3, seed=0)
  assert [len(b) for b in batches] == [7, 7, 7]


# ---------------------------------------------------------------------------
# build_local_sgd against numpy


def _softmax(z):
  z = z - z.max(axis=1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(axis=1, keepdims=True)


def _loss_and_grads(w, b, x, y):
  """Mean softmax cross-entropy of an MCLR and its gradients (hand-derived)."""
  p = _softmax(x @ w + b)
  onehot = np.eye(w.shape[1])[y]
  loss = -np.mean(np.log(p[np.arange(len(y)), y]))
  diff = (p - onehot) / len(y)
  return loss, x.T @ diff, diff.sum(axis=0)


def _reference_local_sgd(w0, b0, batches, lr, mu):
  w, b = w0.copy(), b0.copy()
  loss_sum, num = 0.0, 0
  steps = []
  for x, y in batches:
    loss, gw, gb = _loss_and_grads(w, b, x, y)
    loss_sum += loss * len(y)
    num += len(y)
    w = w - lr * (gw + mu * (w - w0))
    b = b - lr * (gb + mu * (b - b0))
    steps.append((w.copy(), b.copy()))
  return steps, loss_sum, num


@pytest.fixture(scope="module")
def mclr_case():
  rng = np.random.default_rng(3)
  x = rng.normal(size=(5, 3))
  y = np.array([0, 3, 1, 3, 2], np.int32)
  w0 = rng.normal(scale=0.5, size=(3, 4))
  b0 = rng.normal(scale=0.5, size=4)
  model = models.mclr(3, 4)
  return x, y, w0, b0, model, references.build_local_sgd(
      model, models.SPARSE_CE_LOGITS)


def _dataset(x, y, batch_size):
  # Not shuffled: batch 1 = samples 0-2, batch 2 = samples 3-4.
  return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=x.astype(np.float32), y=y)).batch(batch_size)


@pytest.mark.parametrize("mu", [0.0, 0.5])
def test_two_steps_match_hand_derived_gradients(mclr_case, mu):
  x, y, w0, b0, model, local_sgd = mclr_case
  lr = 0.3
  batches = [(x[:3], y[:3]), (x[3:], y[3:])]
  steps, loss_sum, num = _reference_local_sgd(w0, b0, batches, lr, mu)
  # Guard the reference itself: the two batches' steps do differ, and with
  # mu > 0 the proximal term changes the second step only (w1 - w0 != 0).
  assert np.abs(steps[1][0] - steps[0][0]).max() > 1e-3

  out = local_sgd([w0.astype(np.float32), b0.astype(np.float32)],
                  _dataset(x, y, 3), lr, mu)
  w_final, b_final = steps[-1]
  delta_w, delta_b = [d.numpy() for d in out["delta"]]
  np.testing.assert_allclose(delta_w, w_final - w0, atol=1e-6)
  np.testing.assert_allclose(delta_b, b_final - b0, atol=1e-6)
  assert float(out["num_examples"]) == num == 5
  np.testing.assert_allclose(float(out["loss_sum"]), loss_sum, rtol=1e-6)
  # The model is left at w_final (the delta is taken from it).
  kernel, bias = models.get_weights(model)
  np.testing.assert_allclose(kernel, w_final, atol=1e-6)
  np.testing.assert_allclose(bias, b_final, atol=1e-6)


def test_proximal_term_pulls_second_step_towards_start(mclr_case):
  x, y, w0, b0, _, local_sgd = mclr_case
  init = [w0.astype(np.float32), b0.astype(np.float32)]
  plain = local_sgd(init, _dataset(x, y, 3), 0.3, 0.0)
  prox = local_sgd(init, _dataset(x, y, 3), 0.3, 0.5)
  # After step 1 both runs are at the same w1 (the proximal term is 0 at w0),
  # so step 2 sees the same gradient and the runs differ by lr * mu * (w1 - w0).
  steps0, _, _ = _reference_local_sgd(w0, b0, [(x[:3], y[:3]), (x[3:], y[3:])], 0.3, 0.0)
  w1 = steps0[0][0]
  expected_gap = 0.3 * 0.5 * (w1 - w0)
  gap = plain["delta"][0].numpy() - prox["delta"][0].numpy()
  np.testing.assert_allclose(gap, expected_gap, atol=1e-6)


def test_loss_sum_is_taken_before_each_step(mclr_case):
  x, y, w0, b0, _, local_sgd = mclr_case
  # One sample per batch, lr large: losses after the step would differ a lot.
  out = local_sgd([w0.astype(np.float32), b0.astype(np.float32)],
                  _dataset(x, y, 1), 1.0, 0.0)
  _, loss_sum, _ = _reference_local_sgd(
      w0, b0, [(x[i:i + 1], y[i:i + 1]) for i in range(5)], 1.0, 0.0)
  np.testing.assert_allclose(float(out["loss_sum"]), loss_sum, rtol=1e-6)
  assert float(out["num_examples"]) == 5.0


def test_client_dataset_order_ignores_global_seed():
  """The batches depend on the client seed only, not on TF's global seed state."""
  x = np.arange(40, dtype=np.float32).reshape(20, 2)
  y = np.arange(20, dtype=np.int32)

  def order():
    ds = schedule.client_dataset(x, y, batch_size=6, epochs=2, seed=17)
    return np.concatenate([b["y"].numpy() for b in ds])

  tf.random.set_seed(1)
  first = order()
  tf.random.set_seed(99)
  tf.random.uniform([3])  # advance global random state
  second = order()
  np.testing.assert_array_equal(first, second)
  assert sorted(first[:20].tolist()) == list(range(20))
  assert not np.array_equal(first[:20], first[20:])
