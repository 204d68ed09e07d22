"""Clients side by side (`--client_batching=parallel`) against one at a time."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from tests import test_runners
from tests.conftest import exhaustive, shared_data, tiered
from tests.helpers import assert_one_line_error, main_in_process
from tff_cluster import models, registry
from tff_cluster.host.driver import TrainingConfig
from tff_cluster.runners.config import RunnerConfig
from tff_cluster.learning import functional
from tff_cluster.learning import schedule
from tff_cluster.learning import trainers
from tff_cluster.algorithms.fedavg import fedavg
from tff_cluster.learning import optimizers
from tff_cluster.runners import local_runner

cluster_data = test_runners.cluster_data  # the parity cases' data (module fixture)

# One parity case per algorithm (its first), the solver cases taken in turn so
# that both are covered; chunks of 3 clients, so a round of 8 clients is three
# chunks of different lengths, the last padded.
SOLVERS = sorted(test_runners.SOLVER_CASES)
CASES = [(algo, SOLVERS[i % len(SOLVERS)])
         for i, algo in enumerate(sorted(test_runners.PARITY_CASES))]


def _run(cluster_data, algo, solver, batching, tmp_path, case=0, chunk=3, rounds=2):
  task, data = cluster_data
  options = dict(test_runners.PARITY_CASES[algo][case])
  options["_config"] = dict(options.get("_config", {}), client_batching=batching,
                            client_chunk=chunk)
  return test_runners._run(task, data, algo, options, "local", tmp_path / batching,
                           test_runners.SOLVER_CASES[solver], rounds=rounds)


def test_every_algorithm_is_covered():
  assert {a for a, _ in CASES} == set(test_runners.PARITY_CASES)


# The cases whose later modes come after round 2 (CFL's splits, FL+HC's
# clustering round, FedSoft's second estimate) run the parity test's rounds;
# the others 2 rounds (CI's time), each of its modes run.
LATER_MODES = ("cfl", "flhc", "fedsoft")
# Exhaustive-only (CI's time; CI runs a slice, with 2 rounds): the
# algorithms whose clients run another one's client function
# (test_runners.SAME_CLIENTS) and those that add host or server steps only
# (test_runners.HOST_STEPS_ONLY): side by side, their chunks run FedAvg's,
# FedProx's or IFCA's clients and return the per-client results (updates,
# losses, keys) that FedAvg's, FedGroup's, IFCA's and CFL-MGD's cases check.
PARALLEL_CASES = tiered(CASES, lambda c: test_runners.representative(c[0]))
# Algorithms whose local steps need the model's features (FedPAC's
# alignment) or record each step's loss (FedGWC's trajectories): side by side
# is refused.
SEQUENTIAL_ONLY = ("fedpac", "fedgwc", "hcflplus")


@pytest.mark.slow
@pytest.mark.parametrize("algo,solver", PARALLEL_CASES)
def test_parallel_clients_give_the_sequential_numbers(algo, solver, cluster_data, tmp_path):
  """Identical assignments and accuracies, losses and weights within rtol
  1e-4 / atol 1e-6 (the runner parity tolerance)."""
  rounds = test_runners.ROUNDS if algo in LATER_MODES or exhaustive() else 2
  if algo in SEQUENTIAL_ONLY:  # refused before any round, in one line
    with pytest.raises(ValueError, match="one client after another; valid: "
                       "--client_batching=sequential"):
      _run(cluster_data, algo, solver, "parallel", tmp_path, rounds=rounds)
    return
  sequential = _run(cluster_data, algo, solver, "sequential", tmp_path, rounds=rounds)
  parallel = _run(cluster_data, algo, solver, "parallel", tmp_path, rounds=rounds)
  test_runners.assert_same_run(sequential, parallel, test_runners.PARITY_CASES[algo][0].get(
      "_weights_atol", test_runners.ATOL))
  assert sequential[0][-1]["train_loss"] < sequential[0][0]["train_loss"] * 1.5


@pytest.mark.slow
@pytest.mark.parametrize("chunk,memory", [(100, None), (100, 1)])
def test_parallel_without_xla_and_in_one_chunk(chunk, memory, cluster_data, tmp_path,
                                               monkeypatch, capsys):
  """jit off, and every client in one chunk, or chunks of one client where
  the memory available is too small for more: still the sequential numbers
  (IFCA with persistent momentum: keys, client states and results)."""
  if memory is not None:
    monkeypatch.setattr(local_runner, "available_memory", lambda device: memory)
  task, data = cluster_data
  runs = []
  for batching in ("sequential", "parallel"):
    options = dict(test_runners.PARITY_CASES["ifca"][1])
    options["_config"] = {"client_batching": batching, "jit": "off", "client_chunk": chunk}
    runs.append(test_runners._run(task, data, "ifca", options, "local", tmp_path / batching,
                                  test_runners.SOLVER_CASES["steps_momentum_persist_decay"]))
  test_runners.assert_same_run(*runs)
  warned = [l for l in capsys.readouterr().err.splitlines() if "client_batching: chunks" in l]
  if memory is None:
    assert not warned
  else:  # said once, at the first round
    assert len(warned) == 1 and "chunks of 1 clients, not 8" in warned[0], warned


def test_chunk_plan_sorts_pads_and_bounds():
  order, bounds = local_runner.chunk_plan([5, 9, 1, 9, 3], 2)
  # Most steps first (ties in client order), the last chunk padded with its client.
  np.testing.assert_array_equal(order, [[1, 3], [0, 4], [2, 2]])
  np.testing.assert_array_equal(bounds, [9, 5, 1])


def _mlp_case():
  rng = np.random.default_rng(3)
  x = rng.normal(size=(23, 5)).astype(np.float32)
  y = rng.integers(0, 3, 23).astype(np.int32)
  model = models.mlp(5, 4, 3)
  start = [rng.normal(size=w.shape).astype(np.float32) * 0.5
           for w in models.get_weights(model)]
  return x, y, model, start


def test_side_by_side_loops_are_converted_once(monkeypatch):
  """The vectorizer converts each loop of a side-by-side client once: the
  loops' values enter them each client's own (`schedule.per_client`), so no
  loop is converted again when its values turn out to differ by client (it
  was converted up to five times: the MLP's two nested loops, 4 conversions
  of their bodies and conditions now, 14 without). `per_client` changes no
  value, -0.0 and NaN included."""
  from tensorflow.python.ops.parallel_for import pfor
  converted = []
  convert = pfor._convert_function_call
  monkeypatch.setattr(pfor, "_convert_function_call", lambda func, *a: (
      converted.append(func.name), convert(func, *a))[1])
  x, y, model, start = _mlp_case()
  stateless = functional.stateless_model(model)
  batches = schedule.stacked_padded_batches([15, 8], [0, 15], schedule.LocalWork(4, epochs=2),
                                            [7, 8], 8)

  def client(c):
    trainer = functional.FunctionalTrainer(stateless, models.SPARSE_CE_LOGITS, tf.constant(x),
                                           tf.constant(y), bound=tf.constant(8))
    data = schedule.PaddedBatches(*[tf.gather(tf.constant(t), c) for t in batches])
    return trainer.train(start, data, 0.1).delta

  tf.function(lambda: tf.vectorized_map(client, tf.constant([0, 1]),
                                        fallback_to_while_loop=False)).get_concrete_function()
  assert len(converted) == 4 and len(set(converted)) == 4, converted
  values = (tf.constant([-0.0, np.nan, 1.5]), tf.constant([3, -1]), tf.constant([True, False]))
  same = schedule.per_client(values, tf.constant(7))
  for a, b in zip(values, same):
    np.testing.assert_array_equal(a.numpy().view(np.uint8), b.numpy().view(np.uint8))


def test_one_client_at_a_time_traces_the_client_once(cluster_data, tmp_path, monkeypatch):
  """The sequential round traces its client function once: the trace that
  gives the outputs' specs is the one its loop calls (two before; the
  second was 33 of 222 s in the local resume tests)."""
  traces = []
  one_client = local_runner.LocalRunner._one_client

  def counted(self, mode, *args, **kwargs):
    one = one_client(self, mode, *args, **kwargs)
    return lambda *a, **k: (traces.append(mode), one(*a, **k))[1]

  monkeypatch.setattr(local_runner.LocalRunner, "_one_client", counted)
  _run(cluster_data, "fedavg", "epochs", "sequential", tmp_path, rounds=2)
  assert traces == ["train"], traces


@pytest.mark.slow
@pytest.mark.parametrize("settings", [
    dict(momentum=0.0), dict(momentum=0.9, mu=0.3), dict(momentum=0.5, nesterov=True),
    dict(momentum=0.0, grad_offset=True, grad_scale=0.5, control=True)])
def test_functional_trainer_equals_the_padded_trainer(settings):
  """The MLP (ReLU hidden layer): the same deltas, velocities, losses and
  gradients as the Keras-variable trainer, for every term of `sgd_step`; two
  clients side by side in one `tf.vectorized_map` (the shorter masked) give
  each its own result."""
  x, y, model, start = _mlp_case()
  settings = dict(settings)
  momentum, nesterov = settings.pop("momentum"), settings.pop("nesterov", False)
  rng = np.random.default_rng(4)
  transforms = []
  grad_offset = settings.pop("grad_offset", False)
  if grad_offset:
    grad_offset = [rng.normal(size=w.shape).astype(np.float32) * 0.1 for w in start]
  if settings.pop("control", False):
    transforms.append(optimizers.control_variate([w + 0.1 for w in start]))
  transforms.append(optimizers.scale(settings.pop("grad_scale", 1.0)))
  transforms.append(optimizers.proximal(settings.pop("mu", 0.0)))
  if grad_offset:
    transforms.append(optimizers.offset(grad_offset))
  transforms.append(optimizers.nesterov(momentum) if nesterov
                    else optimizers.heavy_ball(momentum))
  optimizer = optimizers.chain(*transforms)
  velocity = ([w + 0.05 for w in start] if nesterov else
              [rng.normal(size=w.shape).astype(np.float32) * 0.1 for w in start]
              if momentum else None)
  extra = dict(optimizer=optimizer,
               opt_state=None if velocity is None else ((),) * (len(transforms) - 1) + (velocity,))
  xs, ys = tf.constant(x), tf.constant(y)
  padded = trainers.PaddedTrainer(model, models.SPARSE_CE_LOGITS, xs, ys)
  stateless = functional.stateless_model(model)
  side = functional.FunctionalTrainer(stateless, models.SPARSE_CE_LOGITS, xs, ys)
  work = schedule.LocalWork(4, epochs=2)
  # Two clients: rows 0..14 and 15..22 (fewer steps), padded to the same P.
  batches = schedule.stacked_padded_batches([15, 8], [0, 15], work, [7, 8], 8)
  one = [schedule.PaddedBatches(*[tf.constant(t[c]) for t in batches]) for c in (0, 1)]
  expected = [tf.function(lambda d=d: padded.train(start, d, 0.1, **extra))() for d in one]
  got = tf.function(lambda: side.train(start, one[1], 0.1, **extra))()
  for a, b in zip(expected[1].delta, got.delta):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

  def both(c):
    trainer = functional.FunctionalTrainer(stateless, models.SPARSE_CE_LOGITS, xs, ys,
                                           bound=tf.constant(8))
    data = schedule.PaddedBatches(*[tf.gather(tf.constant(t), c) for t in batches])
    out = trainer.train(start, data, 0.1, **extra)
    loss, count = trainer.loss(start, data, 2)
    grads, _ = trainer.gradient(start, data, 0)
    return out, loss, count, grads

  side = tf.function(lambda: tf.vectorized_map(both, tf.constant([0, 1]),
                                               fallback_to_while_loop=False),
                     jit_compile=True)()
  out, loss, count, grads = side
  for c in (0, 1):
    for a, b in zip(expected[c].delta, out.delta):
      np.testing.assert_allclose(a, b[c], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(expected[c].num_examples, out.num_examples[c])
    np.testing.assert_allclose(expected[c].loss_sum, out.loss_sum[c], rtol=1e-5)
    if momentum or nesterov:
      for a, b in zip(expected[c].velocity, out.velocity):
        np.testing.assert_allclose(a, b[c], rtol=1e-5, atol=1e-6)
    want_loss, want_count = padded.loss(start, one[c], 2)
    np.testing.assert_allclose(want_loss, loss[c], rtol=1e-5)
    assert float(want_count) == float(count[c])
    want_grads, _ = padded.gradient(start, one[c], 0)
    for a, b in zip(want_grads, grads):
      np.testing.assert_allclose(a, b[c], rtol=1e-5, atol=1e-6)
  assert expected[0].num_examples == 30 and expected[1].num_examples == 16


def test_tf_keras_chains_refuse_other_layers():
  """The tf_keras route (a written-out chain) refuses the first other layer
  and a graph that is not one chain."""
  with pytest.raises(functional.UnsupportedModel, match="Conv2D"):
    functional.stateless_forward(models.lenet5())
  # A Dense model whose layers are not one chain (a skip connection).
  inputs = tf.keras.Input(shape=(4,))
  h = tf.keras.layers.Dense(4)(inputs)
  skip = tf.keras.Model(inputs, tf.keras.layers.Dense(2)(tf.keras.layers.Add()([h, inputs])))
  with pytest.raises(functional.UnsupportedModel, match="Add"):
    functional.stateless_forward(skip)
  assert local_runner.resolve_client_batching("auto", "layer 'c' (Conv2D)", "/CPU:0") == \
      "sequential"
  with pytest.raises(ValueError, match=r"parallel for this model: layer 'c' \(Conv2D\); "
                     r"valid: auto or sequential"):
    local_runner.resolve_client_batching("parallel", "layer 'c' (Conv2D)", "/CPU:0")


def _refused(layer):
  inputs = tf.keras.Input(shape=(6, 6, 2))
  h = layer(inputs)
  return tf.keras.Model(inputs, tf.keras.layers.Dense(3)(tf.keras.layers.Flatten()(h)))


@pytest.mark.parametrize("layer,words", [
    (lambda: tf.keras.layers.Conv2D(4, 3, groups=2, name="grouped"),
     r"layer 'grouped' \(Conv2D\): grouped convolutions"),
    (lambda: tf.keras.layers.Conv2DTranspose(2, 3, name="up"),
     r"layer 'up' \(Conv2DTranspose\): op Conv2DBackpropInput has no side-by-side form"),
    (lambda: tf.keras.layers.Reshape((6, 12), name="r"), None),
])
def test_keras3_models_are_refused_naming_the_layer(layer, words):
  """A layer with no side-by-side form is named: read from its settings, or
  from the op TF's vectorizer stops at (traced with no loop over clients)."""
  model = _refused(layer())
  if words is None:  # a layer every step of which vectorizes
    functional.stateless_model(model)
    return
  with pytest.raises(functional.UnsupportedModel, match=words):
    functional.stateless_model(model)


def test_the_choice_is_recorded(cluster_data):
  task, data = cluster_data
  for batching, expected in (("auto", "sequential"), ("parallel", "parallel")):
    config = TrainingConfig(rounds=1, clients_per_round=2, local_epochs=1,
                                       batch_size=10, client_lr=0.01,
                                       runner=RunnerConfig(client_batching=batching))
    info = registry.build_driver("fedavg", task, data, config).describe()
    assert info["client_batching"] == expected
    assert ("chunk" in info) == (expected == "parallel")


def test_cli_refuses_an_invalid_batching_in_one_line(tmp_path, capsys):
  out_dir = tmp_path / "run"
  code, out, err = main_in_process(
      ["--algo=fedavg", "--task=fmnist", "--model=lenet5", "--client_batching=sideways",
       "--rounds=1", f"--data_dir={shared_data('fashion_mnist')}",
       f"--output_dir={out_dir}"], capsys)
  assert_one_line_error(code, err, out_dir, "--client_batching", "sideways",
                        "auto, sequential, parallel")


def test_cli_records_parallel_in_config(tmp_path, capsys):
  out_dir = tmp_path / "run"
  code, out, err = main_in_process(
      ["--algo=fedavg", "--task=synthetic", "--client_batching=parallel", "--rounds=2",
       "--num_clients=10", "--clients_per_round=4", f"--output_dir={out_dir}",
       "--progress=false"], capsys)
  assert code == 0, err
  config = json.loads((out_dir / "config.json").read_text())
  assert config["client_batching"] == "parallel"
  assert config["runner_info"]["client_batching"] == "parallel"


# -- Keras 3 models side by side: CNNs with BatchNorm and Dropout, LSTMs ------------

def _cnn_bn(input_dim=60, classes=10):
  """Convolution, BatchNorm, max-pool and Dropout on the features as a 6 x 10 image."""
  inputs = tf.keras.Input(shape=(input_dim,))
  h = tf.keras.layers.Reshape((6, input_dim // 6, 1))(inputs)
  h = tf.keras.layers.Conv2D(4, 3, padding="same")(h)
  h = tf.keras.layers.BatchNormalization()(h)
  h = tf.keras.layers.ReLU()(h)
  h = tf.keras.layers.MaxPool2D(2)(h)
  h = tf.keras.layers.Dropout(0.25, seed=1)(h)
  h = tf.keras.layers.Flatten()(h)
  return tf.keras.Model(inputs, tf.keras.layers.Dense(classes)(h))


def _lstm(input_dim=60, classes=10):
  """The features as 6 steps of 10, an LSTM of 8 units, a Dense head."""
  inputs = tf.keras.Input(shape=(input_dim,))
  h = tf.keras.layers.Reshape((6, input_dim // 6))(inputs)
  h = tf.keras.layers.LSTM(8)(h)
  return tf.keras.Model(inputs, tf.keras.layers.Dense(classes)(h))


def _embedding_lstm():
  """Sent140's shape, small: token ids, an Embedding, two stacked LSTMs, a
  sigmoid out (binary cross-entropy)."""
  inputs = tf.keras.Input(shape=(7,), dtype=tf.int32)
  h = tf.keras.layers.Embedding(30, 5)(inputs)
  h = tf.keras.layers.LSTM(6, return_sequences=True)(h)
  h = tf.keras.layers.LSTM(6)(h)
  return tf.keras.Model(inputs, tf.keras.layers.Dense(1, activation="sigmoid")(h))


class _Subclassed(tf.keras.Model):
  """A subclassed CNN (its forward pass is its own call()) with Dropout."""

  def __init__(self):
    super().__init__()
    self.reshape = tf.keras.layers.Reshape((6, 10, 1))
    self.conv = tf.keras.layers.Conv2D(3, 3, strides=2, padding="same", activation="relu")
    self.drop = tf.keras.layers.Dropout(0.5, seed=2)
    self.flat = tf.keras.layers.Flatten()
    self.head = tf.keras.layers.Dense(10)

  def call(self, x, training=False):
    return self.head(self.flat(self.drop(self.conv(self.reshape(x)), training=training)))


def _trainer_case(make, loss):
  rng = np.random.default_rng(5)
  model = make()
  if isinstance(model, _Subclassed):
    model = models.build_model(model, (60,))
  spec = models.model_input_spec(model)
  shape = (23,) + (tuple(spec.shape) if spec is not None else (60,))
  if loss == models.BINARY_PROBS:
    x = rng.integers(0, 30, shape).astype(np.int32)
    y = rng.integers(0, 2, 23).astype(np.float32)
  else:
    x = rng.normal(size=shape).astype(np.float32)
    y = rng.integers(0, 10, 23).astype(np.int32)
  return model, tf.constant(x), tf.constant(y)


@pytest.mark.slow
@pytest.mark.parametrize("make,loss", [
    (_cnn_bn, models.SPARSE_CE_LOGITS), (_lstm, models.SPARSE_CE_LOGITS),
    (_embedding_lstm, models.BINARY_PROBS), (_Subclassed, models.SPARSE_CE_LOGITS)],
    ids=["cnn_batchnorm_dropout", "lstm", "embedding_lstm", "subclassed_cnn_dropout"])
def test_keras3_models_side_by_side_equal_the_padded_trainer(make, loss):
  """Two clients of different lengths side by side, in one
  `tf.vectorized_map` with no loop over clients: each gets the Keras-variable
  trainer's deltas (BatchNorm's moving statistics included), losses and
  gradients (BatchNorm over each batch's real rows there, sliced to them
  here; the same Dropout masks from each client's seed)."""
  model, xs, ys = _trainer_case(make, loss)
  stateless = functional.stateless_model(model, tf.TensorSpec(xs.shape[1:], xs.dtype))
  start = models.get_weights(model)
  padded = trainers.PaddedTrainer(model, loss, xs, ys,
                                  exact_batches=models.has_batch_statistics(model))
  work = schedule.LocalWork(4, epochs=2)
  batches = schedule.stacked_padded_batches([15, 8], [0, 15], work, [7, 8], 8)
  one = [schedule.PaddedBatches(*[tf.constant(t[c]) for t in batches]) for c in (0, 1)]
  optimizer = optimizers.chain(optimizers.proximal(0.1), optimizers.heavy_ball(0.5))
  expected = [tf.function(lambda d=d: padded.train(start, d, 0.05, optimizer))() for d in one]
  want_grads = [tf.function(lambda d=d: padded.gradient(start, d, 0))()[0] for d in one]

  def both(c):
    trainer = functional.FunctionalTrainer(stateless, loss, xs, ys, bound=tf.constant(8))
    data = schedule.PaddedBatches(*[tf.gather(tf.constant(t), c) for t in batches])
    return trainer.train(start, data, 0.05, optimizer), trainer.gradient(start, data, 0)[0]

  out, grads = tf.function(lambda: tf.vectorized_map(both, tf.constant([0, 1]),
                                                     fallback_to_while_loop=False))()
  for c in (0, 1):
    for a, b in zip(expected[c].delta, out.delta):
      np.testing.assert_allclose(a, b[c], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(expected[c].loss_sum, out.loss_sum[c], rtol=1e-5)
    for a, b in zip(want_grads[c], grads):
      np.testing.assert_allclose(a, b[c], rtol=1e-4, atol=1e-6)
  # The two clients' Dropout masks differ (their seeds do), and training moved.
  assert max(float(np.max(np.abs(d))) for d in expected[0].delta) > 1e-3


def test_dropout_masks_are_each_clients_own():
  """A client's Dropout masks depend on its round seed alone: the same seed
  the same masks, another seed other masks; the kept share is 1 - rate."""
  from tff_cluster.learning import layer_forms
  a = layer_forms.hash_uniform(tf.constant([11, 0], tf.int64), 0, (200, 50))
  b = layer_forms.hash_uniform(tf.constant([11, 0], tf.int64), 0, (200, 50))
  c = layer_forms.hash_uniform(tf.constant([12, 0], tf.int64), 0, (200, 50))
  d = layer_forms.hash_uniform(tf.constant([11, 1], tf.int64), 0, (200, 50))
  e = layer_forms.hash_uniform(tf.constant([11, 0], tf.int64), 1, (200, 50))
  np.testing.assert_array_equal(a, b)
  for other in (c, d, e):
    assert np.mean((a.numpy() < 0.5) == (other.numpy() < 0.5)) < 0.55
  assert abs(float(np.mean(a.numpy() >= 0.25)) - 0.75) < 0.01
  assert 0.0 <= float(np.min(a)) and float(np.max(a)) < 1.0


def test_patch_convolution_equals_tf_convolution():
  """Convolutions as patches times a matrix: TF's values for 1-D and 2-D,
  'valid' and 'same', strides and dilations."""
  from tff_cluster.learning import layer_forms
  rng = np.random.default_rng(2)
  for shape, kernel, strides, padding, dilation in [
      ((2, 9, 8, 3), (3, 2, 3, 5), [1, 1], "valid", [1, 1]),
      ((2, 9, 8, 3), (5, 5, 3, 4), [2, 3], "same", [1, 1]),
      ((2, 9, 8, 3), (3, 3, 3, 2), [1, 1], "same", [2, 2]),
      ((2, 11, 3), (4, 3, 6), [2], "same", [1]),
      ((2, 11, 3), (3, 3, 6), [1], "valid", [3])]:
    x = rng.normal(size=shape).astype(np.float32)
    k = rng.normal(size=kernel).astype(np.float32)
    want = tf.nn.convolution(x, k, strides=strides, padding=padding.upper(),
                             dilations=dilation)
    got = layer_forms.patch_conv(tf.constant(x), tf.constant(k), strides, padding, dilation)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _conv_bn_lstm(input_dim=60, classes=10):
  """A CNN with BatchNorm feeding an LSTM, with Dropout: the features as a
  6 x 10 image, conv 4 'same' + BatchNorm + ReLU, its rows as 6 steps of 40
  into an LSTM of 8 units, Dropout 0.25, a Dense head."""
  inputs = tf.keras.Input(shape=(input_dim,))
  h = tf.keras.layers.Reshape((6, input_dim // 6, 1))(inputs)
  h = tf.keras.layers.Conv2D(4, 3, padding="same")(h)
  h = tf.keras.layers.BatchNormalization()(h)
  h = tf.keras.layers.ReLU()(h)
  h = tf.keras.layers.Reshape((6, 4 * input_dim // 6))(h)
  h = tf.keras.layers.LSTM(8)(h)
  h = tf.keras.layers.Dropout(0.25, seed=3)(h)
  return tf.keras.Model(inputs, tf.keras.layers.Dense(classes)(h))


KERAS3_RUN_MODELS = {"conv_batchnorm_lstm_dropout": _conv_bn_lstm, "lstm": _lstm,
                     "cnn_batchnorm_dropout": _cnn_bn}
# Every algorithm's parity case (as CASES) with a CNN, BatchNorm, an LSTM and
# Dropout in one model (Mime refuses BatchNorm: the LSTM alone for it; FedSoft
# too: its Adam's first steps are lr * sign(g), so the convolution's
# side-by-side rounding (~1e-7) flips the sign of near-zero gradients and
# moves those weights by +-lr: measured 5.9e-3 apart after 2 rounds with the
# CNN, 6e-8 with the LSTM); the mechanisms once more with the CNN alone:
# IFCA's keys, persistent momentum and client states, CFL-MGD's gradients
# and losses.
ADAM_OR_NO_BATCHNORM = ("mime", "fedsoft")
# With these layers in CI: plain SGD and FedRep's masked phases (BatchNorm's
# statistics in the masked layers, a personal part of the model kept as
# client state); and the mechanisms once more with the CNN alone: IFCA's
# keys, persistent momentum and client states, CFL-MGD's gradients and
# losses. The other client functions whose step touches the model's
# variables or batches in a way of their own, FedEM's per-example weights,
# APFL's output-mixing forward (two forwards, two Dropout draws) and
# Per-FedAvg's meta-steps (three batches a step), run side by side in CI
# with the parity model (CASES above) and with these layers in the slices
# (CI's time: 58-83 s each on 2 cores before a loop's values entered
# the vectorizer each client's own, `schedule.per_client`, about half since:
# FedGroup's case here 68.8 -> 33.0 s; most of it the side-by-side round's
# trace through tf.vectorized_map). The others' steps are one of these
# or add a term on the trainable weights only (FedProx, pFedMo, FedGroup's
# modes, Mime's server statistics, FedSoft's Adam, Ditto's and pFedMe's
# personal models: their side-by-side runs are in CASES); FedPer, LG-FedAvg
# and FedBN run FedRep's split definition in one phase; local-only Ditto's
# without the global model; FedAvg + FT Ditto's second training of a copy;
# the FedAvg family, WeCFL, FeSEM, CFL, FL+HC, PACFL, StoCFL and HypCluster
# FedAvg's or IFCA's with other server steps.
# The other algorithms here are exhaustive-only (CI runs a slice).
KERAS3_ALGOS = ("fedavg", "fedrep")
KERAS3_RUN_CASES = tiered([
    ("lstm" if algo in ADAM_OR_NO_BATCHNORM else "conv_batchnorm_lstm_dropout", algo, 0,
     solver)
    for algo, solver in CASES if algo not in SEQUENTIAL_ONLY],
    lambda c: c[1] in KERAS3_ALGOS) + [
    ("cnn_batchnorm_dropout", "ifca", 1, "steps_momentum_persist_decay"),
    ("cnn_batchnorm_dropout", "cfl_mgd", 1, "epochs")]


def test_the_keras3_cases_name_registered_algorithms():
  assert set(KERAS3_ALGOS) <= {a for a, _ in CASES}


# The conv + BatchNorm + LSTM + Dropout cases take 25-90 s each on CI's 2
# cores: both forms (side by side and one client at a time) of a recurrent
# model are traced per algorithm, which is the comparison; CI keeps the two
# above (KERAS3_ALGOS) and a slice of the others.
@pytest.mark.slow
@pytest.mark.parametrize("model,algo,case,solver", KERAS3_RUN_CASES)
def test_cnn_and_lstm_side_by_side_give_the_sequential_numbers(model, algo, case, solver,
                                                               cluster_data, tmp_path):
  """The parity cases with a CNN (BatchNorm, Dropout) and an LSTM in place of
  the task's model, for 2 rounds (CI's time): side by side (chunks of 3) gives
  the one-at-a-time run's rows, assignments and weights within the runner
  parity tolerance, for every algorithm."""
  import dataclasses
  task, data = cluster_data
  task = dataclasses.replace(task, model_fn=KERAS3_RUN_MODELS[model])
  runs = []
  for batching in ("sequential", "parallel"):
    options = dict(test_runners.PARITY_CASES[algo][case])
    options.pop("_model", None)  # this test's model instead
    options["_config"] = dict(options.get("_config", {}), client_batching=batching,
                              client_chunk=3)
    runs.append(test_runners._run(task, data, algo, options, "local", tmp_path / batching,
                                  test_runners.SOLVER_CASES[solver], rounds=2))
  test_runners.assert_same_run(*runs)
  assert len(runs[0][0]) == 2


def test_a_gpu_chunk_is_held_to_the_card_less_what_tf_holds(monkeypatch):
  """On a GPU the memory for a chunk is the card's total (nvidia-smi) less
  what TensorFlow's allocator holds; unknown (no nvidia-smi) is None, which
  leaves the chunk as asked."""
  import subprocess

  calls = []

  def smi(cmd, **kwargs):
    calls.append(cmd)
    return subprocess.CompletedProcess(cmd, 0, stdout="81559\n", stderr="")

  monkeypatch.setattr(local_runner.subprocess, "run", smi)
  monkeypatch.setattr(local_runner.tf.config.experimental, "get_memory_info",
                      lambda device: {"current": 3 * 2**30, "peak": 4 * 2**30})
  assert local_runner.available_memory("/GPU:1") == 81559 * 2**20 - 3 * 2**30
  assert "--id=1" in calls[0]

  def missing(cmd, **kwargs):
    raise FileNotFoundError(cmd[0])

  monkeypatch.setattr(local_runner.subprocess, "run", missing)
  assert local_runner.available_memory("/GPU:0") is None


@pytest.mark.parametrize("algo", ["fedavg", *SEQUENTIAL_ONLY])
def test_auto_runs_one_client_after_another_where_side_by_side_is_refused(algo, cluster_data,
                                                                          monkeypatch):
  """Where `auto` would choose side by side (a GPU's rule, forced here), an
  algorithm whose clients the side-by-side trainer cannot run (its
  definition's `sequential_only`) runs them one after another instead."""
  from tff_cluster import registry
  from tff_cluster.host.driver import TrainingConfig
  from tff_cluster.runners.config import RunnerConfig
  monkeypatch.setattr(local_runner, "auto_side_by_side", lambda model, device: True)
  task, data = cluster_data
  options = {k: v for k, v in test_runners.PARITY_CASES[algo][0].items() if not k.startswith("_")}
  config = TrainingConfig(rounds=1, clients_per_round=4, local_epochs=1, batch_size=10,
                          client_lr=0.02, seed=0,
                          runner=RunnerConfig("local", client_batching="auto"))
  driver = registry.build_driver(algo, task, data, config, **options)
  expected = "sequential" if algo in SEQUENTIAL_ONLY else "parallel"
  assert driver.runner.client_batching == expected
