"""Clients side by side (`--client_batching=parallel`) against one at a time."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from tests import test_runners
from tests.conftest import shared_data
from tests.helpers import assert_one_line_error, main_in_process
from tff_cluster import models
from tff_cluster.host import loop
from tff_cluster.learning import functional
from tff_cluster.learning import schedule
from tff_cluster.learning import trainers
from tff_cluster.algorithms import fedavg
from tff_cluster.learning import optimizers
from tff_cluster.runners import local_runner

cluster_data = test_runners.cluster_data  # the parity cases' data (module fixture)

# One parity case per algorithm (its first), the solver cases taken in turn so
# that both are covered; chunks of 3 clients, so a round of 8 clients is three
# chunks of different lengths, the last padded.
SOLVERS = sorted(test_runners.SOLVER_CASES)
CASES = [(algo, SOLVERS[i % len(SOLVERS)])
         for i, algo in enumerate(sorted(test_runners.PARITY_CASES))]


def _run(cluster_data, algo, solver, batching, tmp_path, case=0, chunk=3):
  task, data = cluster_data
  options = dict(test_runners.PARITY_CASES[algo][case])
  options["_config"] = dict(options.get("_config", {}), client_batching=batching,
                            client_chunk=chunk)
  return test_runners._run(task, data, algo, options, "local", tmp_path / batching,
                           test_runners.SOLVER_CASES[solver])


def test_every_algorithm_is_covered():
  assert {a for a, _ in CASES} == set(test_runners.PARITY_CASES)


@pytest.mark.parametrize("algo,solver", CASES)
def test_parallel_clients_give_the_sequential_numbers(algo, solver, cluster_data, tmp_path):
  """Identical assignments and accuracies, losses and weights within rtol
  1e-4 / atol 1e-6 (the runner parity tolerance)."""
  sequential = _run(cluster_data, algo, solver, "sequential", tmp_path)
  parallel = _run(cluster_data, algo, solver, "parallel", tmp_path)
  test_runners.assert_same_run(sequential, parallel)
  assert sequential[0][-1]["train_loss"] < sequential[0][0]["train_loss"] * 1.5


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
  forward = functional.stateless_forward(model)
  side = functional.FunctionalTrainer(
      forward, len(start), len(start), models.SPARSE_CE_LOGITS, xs, ys)
  work = schedule.LocalWork(4, epochs=2)
  # Two clients: rows 0..14 and 15..22 (fewer steps), padded to the same P.
  batches = schedule.stacked_padded_batches([15, 8], [0, 15], work, [7, 8], 8)
  one = [schedule.PaddedBatches(*[tf.constant(t[c]) for t in batches]) for c in (0, 1)]
  expected = [tf.function(lambda d=d: padded.train(start, d, 0.1, **extra))() for d in one]
  got = tf.function(lambda: side.train(start, one[1], 0.1, **extra))()
  for a, b in zip(expected[1].delta, got.delta):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

  def both(c):
    trainer = functional.FunctionalTrainer(
        forward, len(start), len(start), models.SPARSE_CE_LOGITS, xs, ys,
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


def test_models_without_a_stateless_forward_are_refused():
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
  with pytest.raises(ValueError, match=r"parallel for this model: layer 'c' \(Conv2D\) is "
                     r"not supported side by side .* valid: auto or sequential"):
    local_runner.resolve_client_batching("parallel", "layer 'c' (Conv2D)", "/CPU:0")


def test_the_choice_is_recorded(cluster_data):
  task, data = cluster_data
  for batching, expected in (("auto", "sequential"), ("parallel", "parallel")):
    config = loop.TrainingConfig(rounds=1, clients_per_round=2, local_epochs=1,
                                       batch_size=10, client_lr=0.01,
                                       client_batching=batching)
    info = fedavg.make_driver(task, data, config).describe()
    assert info["client_batching"] == expected
    assert ("chunk" in info) == (expected == "parallel")


def test_cli_refuses_parallel_for_a_cnn_in_one_line(tmp_path, capsys):
  out_dir = tmp_path / "run"
  code, out, err = main_in_process(
      ["--algo=fedavg", "--task=fmnist", "--model=lenet5", "--client_batching=parallel",
       "--rounds=1", f"--data_dir={shared_data('fashion_mnist')}",
       f"--output_dir={out_dir}"], capsys)
  assert_one_line_error(code, err, out_dir, "--client_batching=parallel", "Conv2D",
                        "valid: auto or sequential")


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
