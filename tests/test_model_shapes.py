"""Every way of writing a Keras model trains through `tff_cluster.api`:
`keras.Sequential` with and without `keras.Input`, functional, subclassed, and
a model with a custom layer, with FedAvg, IFCA and FedGroup on the `local`
runner, one client at a time and (where the model is a chain of layers) side
by side; where side by side is refused, `api.build` says so in one line.

Run under Keras 3 and, with TF_USE_LEGACY_KERAS=1, under tf_keras: `tf.keras`
is whichever the process has. The data are made here (6 clients in 2 clusters,
8 features, 4 classes), so nothing is read from disk.
"""

import numpy as np
import pytest
import tensorflow as tf

from tff_cluster import api, models
from tff_cluster.learning import functional
from tff_cluster.data.federated import FederatedData

keras = tf.keras
layers = tf.keras.layers
FEATURES, CLASSES = 8, 4


class Scale(layers.Layer):
  """A custom layer: a learned scale per feature."""

  def build(self, input_shape):
    self.scale = self.add_weight(name="scale", shape=(int(input_shape[-1]),),
                                 initializer="ones")

  def call(self, inputs):
    return inputs * self.scale


class SubclassedMLP(keras.Model):
  """A subclassed model: its forward pass is its own call()."""

  def __init__(self):
    super().__init__()
    self.hidden = layers.Dense(16, activation="relu")
    self.logits = layers.Dense(CLASSES)

  def call(self, inputs, training=False):
    return self.logits(self.hidden(inputs))


def sequential_with_input():
  return keras.Sequential([keras.Input((FEATURES,)), layers.Dense(16, activation="relu"),
                           layers.Dense(CLASSES)])


def sequential_without_input():
  return keras.Sequential([layers.Dense(16, activation="relu"), layers.Dense(CLASSES)])


def functional_model():
  inputs = keras.Input((FEATURES,))
  hidden = layers.Dense(16, activation="relu")(inputs)
  return keras.Model(inputs, layers.Dense(CLASSES)(hidden))


def custom_layer():
  return keras.Sequential([keras.Input((FEATURES,)), layers.Dense(16, activation="relu"),
                           Scale(name="scale"), layers.Dense(CLASSES)])


# name -> (model_fn, None if side by side trains it, else what its refusal names)
SHAPES = {
    "sequential_with_input": (sequential_with_input, None),
    "sequential_without_input": (sequential_without_input, None),
    "functional": (functional_model, None),
    "subclassed": (SubclassedMLP, "SubclassedMLP is a subclassed model"),
    "custom_layer": (custom_layer, "layer 'scale' (Scale)"),
}
ALGORITHMS = {"fedavg": {}, "ifca": {"num_groups": 2}, "fedgroup": {"num_groups": 2}}
SETTINGS = dict(client_lr=0.1, local_epochs=2, batch_size=5, seed=0, jit="off",
                evaluate=False)


@pytest.fixture(scope="module")
def data():
  """6 clients, 20 training and 10 test examples each; clients 0, 2, 4 label
  by one linear rule and 1, 3, 5 by another (two clusters)."""
  rng = np.random.default_rng(0)
  rules = rng.normal(size=(2, FEATURES, CLASSES))
  ids, train, test = [], {}, {}
  for k in range(6):
    x = rng.normal(size=(30, FEATURES)).astype(np.float32)
    y = np.argmax(x @ rules[k % 2], axis=1).astype(np.int32)
    ids.append(f"c{k}")
    train[ids[-1]], test[ids[-1]] = (x[:20], y[:20]), (x[20:], y[20:])
  return FederatedData(ids, train, test, CLASSES, true_clusters=np.arange(6) % 2)


def _train(algo, model_fn, data, client_batching):
  """(weights before, weights after, test loss before, after, last train loss)
  of 2 rounds on every client."""
  process = api.build(algo, model_fn, "sparse_ce_logits", client_batching=client_batching,
                      **SETTINGS, **ALGORITHMS[algo])
  state = process.initialize(data)
  before = process.get_model_weights(state)
  loss_before = process.evaluate(state)["test_loss"]
  for _ in range(2):
    out = process.next(state)
    state = out.state
  return (before, process.get_model_weights(state), loss_before,
          process.evaluate(state)["test_loss"], out.metrics["train_loss"])


@pytest.fixture(scope="module")
def trained(data):
  """`trained(algo, shape, client_batching)`: `_train`'s result, each run once
  per module (the side-by-side test compares with the sequential run)."""
  runs = {}

  def run(algo, shape, client_batching="sequential"):
    key = (algo, shape, client_batching)
    if key not in runs:
      runs[key] = _train(algo, SHAPES[shape][0], data, client_batching)
    return runs[key]

  return run


# Every shape with FedAvg; IFCA and FedGroup with every shape but the
# functional one, the shape of the library's own models, which every
# algorithm trains in tests/test_api.py and tests/test_runners.py.
CASES = [(shape, algo) for shape in sorted(SHAPES) for algo in sorted(ALGORITHMS)
         if algo == "fedavg" or shape != "functional"]


@pytest.mark.parametrize("shape,algo", CASES)
def test_every_model_shape_trains(shape, algo, trained):
  """One client at a time: the weights move and the test loss falls."""
  before, after, loss_before, loss_after, train_loss = trained(algo, shape)
  assert len(before) == len(after) >= 1
  assert [w.shape for w in after[0].trainable] == [w.shape for w in before[0].trainable]
  assert any(not np.array_equal(a, b) for m_a, m_b in zip(after, before)
             for a, b in zip(m_a.trainable, m_b.trainable))
  assert np.isfinite(train_loss)
  assert loss_after < 0.9 * loss_before, (loss_before, loss_after)


LAYER_GRAPHS = ["functional", "sequential_with_input", "sequential_without_input"]


@pytest.mark.parametrize("shape", LAYER_GRAPHS)
def test_a_chain_of_layers_is_a_function_of_its_weights(shape):
  """The forward pass that trains clients side by side equals the model's own
  call, read from any of the layer-graph shapes (a Sequential without Input
  once built for its input shape)."""
  model = models.build_model(SHAPES[shape][0](), (FEATURES,))
  forward = functional.stateless_forward(model)
  x = np.random.default_rng(1).normal(size=(5, FEATURES)).astype(np.float32)
  weights = [tf.convert_to_tensor(v) for v in models.model_variables(model)]
  np.testing.assert_allclose(forward(weights, x).numpy(), model(x).numpy(), rtol=1e-6,
                             atol=1e-6)
  assert forward.activations == FEATURES + 16 + CLASSES


def test_a_sequential_model_side_by_side_gives_the_sequential_numbers(trained):
  """FedAvg on a Sequential without Input (built at initialize, then checked
  for side by side there) with clients side by side: the one-at-a-time run's
  weights (the runner parity tolerance) and train loss. Side by side is the
  same for every algorithm once the model is a function of its weights
  (tests/test_client_batching.py holds each algorithm to the loop)."""
  sequential = trained("fedavg", "sequential_without_input", "sequential")
  parallel = trained("fedavg", "sequential_without_input", "parallel")
  for a, b in zip(sequential[1][0].trainable, parallel[1][0].trainable):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  assert parallel[4] == pytest.approx(sequential[4], rel=1e-5)
  assert parallel[3] < 0.9 * parallel[2]


def _functional_cnn():
  inputs = keras.Input((FEATURES,))
  h = layers.Reshape((4, 2, 1))(inputs)
  h = layers.Conv2D(3, 2, padding="same", activation="relu", name="conv_f")(h)
  return keras.Model(inputs, layers.Dense(CLASSES)(layers.Flatten()(h)))


REFUSED = {name: (fn, why) for name, (fn, why) in SHAPES.items() if why is not None}
REFUSED.update({
    "functional_cnn": (_functional_cnn, "layer 'conv_f' (Conv2D)"),
    "sequential_cnn_without_input": (
        lambda: keras.Sequential([layers.Reshape((4, 2, 1)), layers.Conv2D(2, 2, name="conv"),
                                  layers.Flatten(), layers.Dense(CLASSES)]),
        "layer 'conv' (Conv2D)"),
    "batchnorm": (lambda: keras.Sequential([keras.Input((FEATURES,)), layers.Dense(16),
                                            layers.BatchNormalization(name="bn"),
                                            layers.Dense(CLASSES)]),
                  "layer 'bn' (BatchNormalization)"),
})


# Keras 3 models run through their own stateless call (any layer whose ops
# vectorize); tf_keras models only as chains of Dense-like layers.
KERAS3 = hasattr(keras.Model, "stateless_call")


@pytest.mark.slow
@pytest.mark.parametrize("shape", sorted(REFUSED))
def test_models_beyond_dense_chains_side_by_side(shape, data):
  """Under Keras 3 a subclassed model, a layer of one's own, CNNs (built at
  initialize or not) and BatchNorm train side by side with the one-at-a-time
  numbers (the runner parity tolerance); under tf_keras they are refused at
  build in one line naming why, and `auto` takes the loop for them."""
  model_fn, why = REFUSED[shape]
  if KERAS3:
    sequential = _train("fedavg", model_fn, data, "sequential")
    parallel = _train("fedavg", model_fn, data, "parallel")
    for a, b in zip(sequential[1][0].trainable, parallel[1][0].trainable):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert parallel[4] == pytest.approx(sequential[4], rel=1e-5)
    return
  with pytest.raises(ValueError) as refused:
    api.build("fedavg", model_fn, "sparse_ce_logits", client_batching="parallel",
              **SETTINGS)
  message = str(refused.value)
  assert "\n" not in message and "--" not in message, message
  assert message.startswith("client_batching='parallel' needs a keras.Sequential or "
                            "functional model"), message
  assert why in message and message.endswith(
      "valid for this model: client_batching='auto' or 'sequential'"), message
  # `auto` takes the loop for it.
  api.build("fedavg", model_fn, "sparse_ce_logits", client_batching="auto", **SETTINGS)


@pytest.mark.skipif(not KERAS3, reason="Keras 3's stateless call")
def test_a_keras3_layer_without_a_side_by_side_form_is_refused_in_one_line():
  def model_fn():
    inputs = keras.Input((FEATURES,))
    h = layers.Reshape((2, 4, 1))(inputs)
    h = layers.Conv2DTranspose(2, 2, name="up")(h)
    return keras.Model(inputs, layers.Dense(CLASSES)(layers.Flatten()(h)))

  with pytest.raises(ValueError) as refused:
    api.build("fedavg", model_fn, "sparse_ce_logits", client_batching="parallel",
              **SETTINGS)
  assert str(refused.value) == (
      "client_batching='parallel' needs a Keras 3 model whose layers have side-by-side forms; "
      "layer 'up' (Conv2DTranspose): op Conv2DBackpropInput has no side-by-side form; valid "
      "for this model: client_batching='auto' or 'sequential'")


def test_bad_settings_of_the_model_are_refused_in_one_line(data):
  with pytest.raises(ValueError, match=r"^invalid client_batching='sideways'; valid: 'auto', "
                                       r"'sequential', 'parallel'$"):
    api.build("fedavg", functional_model, "sparse_ce_logits", client_batching="sideways",
              **SETTINGS)
  # A model built at initialize for the data's inputs: weights of another
  # shape are refused there, and a model the data cannot feed in one line.
  process = api.build("fedavg", sequential_without_input, "sparse_ce_logits",
                      initial_weights=[np.zeros((3, 16))], **SETTINGS)
  with pytest.raises(ValueError, match=r"initial_weights have shapes \[\(3, 16\)\]; valid: "
                                       r"the model's \[\(8, 16\), \(16,\), \(16, 4\), \(4,\)\]"):
    process.initialize(data)
  process = api.build("fedavg", lambda: keras.Sequential([layers.Reshape((3, 3)),
                                                          layers.Dense(CLASSES)]),
                      "sparse_ce_logits", **SETTINGS)
  with pytest.raises(ValueError, match=r"^initialize\(\): model_fn's model cannot be built "
                                       r"for the data's inputs of shape \(8,\) \(float32\)"):
    process.initialize(data)
