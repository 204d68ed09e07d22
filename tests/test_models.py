"""Tests of the model builders: parameter counts, shapes, forward passes."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests import references
from tff_cluster import models
from tff_cluster.data.federated import DataError

# (builder, expected trainable parameters, input shape, output width)
CASES = {
    "mclr_synthetic": (lambda: models.mclr(60, 10), 610, (60,), 10),
    "mclr_mnist": (lambda: models.mclr(784, 10), 7_850, (784,), 10),
    "mclr_femnist": (lambda: models.mclr(784, 62), 48_670, (784,), 62),
    "mclr_letters": (lambda: models.mclr(784, 26), 20_410, (784,), 26),
    "mlp_mnist": (lambda: models.mlp(784, 128, 10), 101_770, (784,), 10),
    "mlp_femnist": (lambda: models.mlp(784, 512, 62), 433_726, (784,), 62),
    "mlp_letters": (lambda: models.mlp(784, 512, 26), 415_258, (784,), 26),
    "fmnist_cnn": (models.fmnist_cnn, 29_034, (784,), 10),
    "cifar10_cnn": (models.cifar10_cnn, 62_006, (32, 32, 3), 10),
    "simple_cnn": (models.simple_cnn, 1_626_442, (32, 32, 3), 10),  # pfl-research's CIFAR-10
    "lenet5": (models.lenet5, 61_706, (784,), 10),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_counts_shapes_forward(name):
  build, expected, in_shape, out_dim = CASES[name]
  model = build()
  assert references.count_trainable(model) == expected
  assert model.output_shape == (None, out_dim)
  x = np.random.default_rng(0).random((3,) + in_shape).astype(np.float32)
  logits = model(x, training=False).numpy()
  assert logits.shape == (3, out_dim)
  assert np.all(np.isfinite(logits))
  # Logits, not probabilities: rows need not sum to one.
  loss = models.per_example_loss(models.SPARSE_CE_LOGITS, np.array([0, 1, 2]),
                                 logits)
  assert loss.shape == (3,)


def test_count_trainable_skips_frozen_and_batchnorm_stats():
  model = models.fmnist_cnn()
  # BatchNorm moving mean/variance (2 x (16 + 32) = 96) are not trainable.
  assert model.count_params() - references.count_trainable(model) == 96


def test_flat_and_image_inputs_agree():
  flat = models.lenet5()
  image = models.lenet5(input_shape=(28, 28, 1))
  image.set_weights(flat.get_weights())
  x = np.random.default_rng(1).random((2, 784)).astype(np.float32)
  np.testing.assert_allclose(flat(x).numpy(),
                             image(x.reshape(2, 28, 28, 1)).numpy(), rtol=1e-5,
                             atol=1e-5)


def test_sent140_lstm_frozen_embedding():
  rng = np.random.default_rng(0)
  matrix = rng.normal(size=(50, 300)).astype(np.float32)
  model = models.sent140_lstm(matrix)
  assert references.count_trainable(model) == 243_861
  assert model.count_params() == 243_861 + 50 * 300
  emb = model.get_layer("embedding")
  assert not emb.trainable
  np.testing.assert_array_equal(emb.get_weights()[0], matrix)
  tokens = rng.integers(0, 50, size=(4, 25)).astype(np.int32)
  probs = model(tokens).numpy()
  assert probs.shape == (4, 1)
  assert np.all((probs > 0) & (probs < 1))
  loss = models.per_example_loss(models.BINARY_PROBS, np.array([0, 1, 1, 0]),
                                 probs)
  assert loss.shape == (4,)


@pytest.mark.tff
def test_sent140_lstm_built_in_graph_keeps_matrix():
  # TFF builds models inside graphs: the matrix must come with the initializer.
  matrix = np.arange(10 * 300, dtype=np.float32).reshape(10, 300)
  with tf.Graph().as_default():
    model = models.sent140_lstm(matrix, seq_len=5)
    init = model.get_layer("embedding").embeddings.initial_value
    with tf.compat.v1.Session() as sess:
      np.testing.assert_array_equal(sess.run(init), matrix)


def test_sent140_lstm_bad_matrix():
  with pytest.raises(DataError, match="2-D"):
    models.sent140_lstm(np.zeros(300))


def test_sent140_lstm_unrolled_computes_the_rolled_model():
  # `unroll` changes how the time loop is built, not what it computes: with the
  # same weights both give the same probabilities and the same gradients.
  rng = np.random.default_rng(3)
  matrix = rng.normal(size=(30, 8)).astype(np.float32)
  rolled = models.sent140_lstm(matrix, seq_len=6, unroll=False)
  unrolled = models.sent140_lstm(matrix, seq_len=6, unroll=True)
  assert not rolled.layers[2].unroll and unrolled.layers[2].unroll
  assert unrolled.layers[3].unroll
  unrolled.set_weights(rolled.get_weights())
  tokens = rng.integers(0, 30, size=(5, 6)).astype(np.int32)
  labels = np.array([0, 1, 1, 0, 1], np.float32)

  def probs_and_grads(model):
    with tf.GradientTape() as tape:
      probs = model(tokens, training=True)
      loss = tf.reduce_sum(models.per_example_loss(models.BINARY_PROBS, labels, probs))
    return probs.numpy(), [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]

  p0, g0 = probs_and_grads(rolled)
  p1, g1 = probs_and_grads(unrolled)
  np.testing.assert_allclose(p1, p0, rtol=1e-6, atol=1e-7)
  assert len(g0) == len(g1) == 10  # 2 LSTMs x 3, 2 Dense x 2
  for a, b in zip(g1, g0):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_sent140_lstm_unrolls_unless_a_gpu_is_visible(monkeypatch):
  matrix = np.zeros((4, 3), np.float32)
  monkeypatch.setattr(tf.config, "list_physical_devices",
                      lambda kind=None: [] if kind == "GPU" else ["cpu"])
  assert models.sent140_lstm(matrix, seq_len=2).layers[2].unroll
  monkeypatch.setattr(tf.config, "list_physical_devices",
                      lambda kind=None: ["gpu"] if kind == "GPU" else ["cpu"])
  assert not models.sent140_lstm(matrix, seq_len=2).layers[2].unroll
