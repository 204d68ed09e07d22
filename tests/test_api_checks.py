"""`api.build` checks every setting with the declaration the CLI checks its
flag with, and `initialize` checks the model against the data before any
training: each refusal one line in the API's words (issue 40, item 8)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from tff_cluster import api, models
from tff_cluster.host.driver import Diverged, TrainingConfig
from tff_cluster.spec import hparams as hp
from tff_cluster.data.federated import FederatedData

SCE = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
BCE = tf.keras.losses.BinaryCrossentropy()
FEATURES, CLASSES = 6, 10
SETTINGS = dict(client_lr=0.05, local_epochs=1, batch_size=4)


def federation(classes: int = CLASSES, features: int = FEATURES) -> FederatedData:
  rng = np.random.default_rng(0)
  ids = ["c0", "c1", "c2"]

  def arrays(n):
    return (rng.normal(size=(n, features)).astype(np.float32),
            np.arange(n, dtype=np.int64) % classes)
  return FederatedData(ids, {c: arrays(12) for c in ids}, {c: arrays(4) for c in ids},
                       classes)


@pytest.fixture(scope="module")
def data():
  return federation()


def mclr():
  return models.mclr(FEATURES, CLASSES)


def one_line(error) -> str:
  message = str(error.value)
  assert "\n" not in message and "--" not in message, message
  return message


@pytest.mark.parametrize("name, value, valid", [
    ("batch_size", 0, hp.BATCH_SIZE.valid_text()),
    ("batch_size", 2.7, hp.BATCH_SIZE.valid_text()),
    ("local_epochs", 0, hp.LOCAL_EPOCHS.valid_text()),
    ("client_momentum", 1.5, hp.CLIENT_MOMENTUM.valid_text()),
    ("client_state", "bogus", "'persist', 'reset'"),
    ("client_lr", math.inf, hp.CLIENT_LR.valid_text()),
    ("client_lr", None, hp.CLIENT_LR.valid_text()),
    ("jit", "maybe", "'auto', 'on', 'off'"),
    ("client_chunk", 0, hp.CLIENT_CHUNK.valid_text()),
    ("lr_decay", 0, hp.LR_DECAY.valid_text()),
    ("seed", -1, hp.SEED.valid_text()),
    ("rounds", True, hp.ROUNDS.valid_text()),
    ("runner", "gpu", "'local', 'tff', 'ray'"),
    ("evaluate", "yes", "True or False"),
])
def test_every_setting_is_checked_by_its_declaration(name, value, valid):
  settings = dict(SETTINGS, **{name: value})
  with pytest.raises(ValueError) as e:
    api.build("fedavg", mclr, SCE, **settings)
  assert one_line(e) == f"invalid {name}={value!r}; valid: {valid}"


def test_algorithm_options_are_refused_in_the_api_words():
  with pytest.raises(ValueError) as e:
    api.build("ifca", mclr, SCE, num_groups=0, **SETTINGS)
  assert one_line(e) == f"invalid num_groups=0; valid: {hp.NUM_GROUPS.valid_text()}"


def frozen_mclr():
  model = mclr()
  model.trainable = False
  return model


def frozen_sequential():  # weights made only at initialize, for the data
  return tf.keras.Sequential([tf.keras.layers.Dense(CLASSES, trainable=False)])


def test_a_model_with_nothing_to_train_is_refused(data):
  with pytest.raises(ValueError) as e:
    api.build("fedavg", frozen_mclr, SCE, **SETTINGS)
  assert one_line(e).startswith("model_fn's model has no trainable variables")
  process = api.build("fedavg", frozen_sequential, SCE, **SETTINGS)
  with pytest.raises(ValueError) as e:
    process.initialize(data)
  assert one_line(e).startswith("model_fn's model has no trainable variables")


def test_output_width_against_the_classes_is_refused_before_training(data):
  process = api.build("fedavg", lambda: models.mclr(FEATURES, 3), SCE, **SETTINGS)
  with pytest.raises(ValueError) as e:
    process.initialize(data)
  assert one_line(e) == (
      "initialize(): model_fn's model has 3 outputs but the data has 10 classes (labels "
      "0..9); valid: a model with 10 outputs, one logit per class, for "
      "SparseCategoricalCrossentropy(from_logits=True)")


def test_input_width_against_the_data_names_both(data):
  process = api.build("fedavg", lambda: models.mclr(FEATURES + 1, CLASSES), SCE, **SETTINGS)
  with pytest.raises(ValueError) as e:
    process.initialize(data)
  assert one_line(e) == (
      "initialize(): model_fn's model takes inputs of shape (7,) per example but the "
      "data's examples have shape (6,) (float32); valid: a model whose input matches "
      "the data")


def binary(units: int = 1, activation: str = "sigmoid", bias: float = 0.0):
  return lambda: tf.keras.Sequential([
      tf.keras.Input((FEATURES,)),
      tf.keras.layers.Dense(units, activation=activation, kernel_initializer="zeros",
                            bias_initializer=tf.keras.initializers.Constant(bias))])


def test_binary_loss_needs_one_sigmoid_output_and_labels_0_or_1(data):
  with pytest.raises(ValueError) as e:
    api.build("fedavg", binary(), BCE, **SETTINGS).initialize(data)
  assert one_line(e) == ("initialize(): client 'c0' has training label 2; valid: 0 or 1 "
                         "for BinaryCrossentropy(from_logits=False)")
  two = federation(classes=2)
  with pytest.raises(ValueError) as e:
    api.build("fedavg", binary(units=2), BCE, **SETTINGS).initialize(two)
  assert one_line(e).startswith("initialize(): model_fn's model has 2 outputs; valid: one "
                                "sigmoid output")
  with pytest.raises(ValueError) as e:
    api.build("fedavg", binary(activation=None, bias=5.0), BCE, **SETTINGS).initialize(two)
  assert one_line(e).startswith("initialize(): model_fn's model outputs 5, not a "
                                "probability")
  api.build("fedavg", binary(), BCE, **SETTINGS).initialize(two)  # the fitting model


def test_labels_outside_num_classes_are_refused():
  bad = federation()
  x, y = bad.test["c1"]
  bad.test["c1"] = (x, np.where(y == 0, 12, y))
  with pytest.raises(ValueError) as e:
    api.build("fedavg", mclr, SCE, **SETTINGS).initialize(bad)
  assert one_line(e) == ("initialize(): client 'c1' has test label 12; valid: integers "
                         "0..9 (the data's num_classes=10)")


def test_the_api_takes_every_training_and_runner_setting_of_the_cli():
  """The CLI's training and runner flags are the settings `build` takes
  (but clients_per_round: `next` is given its clients), so that the two
  cannot drift apart; both build them with `TrainingConfig.checked`."""
  from tff_cluster import cli, experiment
  defined = {f.name for f in experiment.FLAGS.get_flags_for_module(experiment)}
  settings = defined - set(cli.GENERAL) - set(cli.ALGO_HPARAMS)
  assert settings - {"clients_per_round"} == set(api.SETTINGS)
  config = api.training_config(runner="tff", tff_workers="h1:8000,h2:8000",
                               tff_worker_grace=3.0, tff_subround_timeout=9.0, eval_every=2,
                               divergence_ratio=5.0, **SETTINGS)
  assert config == TrainingConfig.checked(
      rounds=api.DEFAULT_ROUNDS, runner="tff", tff_workers="h1:8000,h2:8000",
      tff_worker_grace=3.0, tff_subround_timeout=9.0, eval_every=2, divergence_ratio=5.0,
      **SETTINGS)
  assert (config.runner.name, config.runner.tff_worker_grace, config.eval_every) == ("tff", 3.0, 2)
  with pytest.raises(ValueError) as e:
    api.build("fedavg", mclr, SCE, tff_worker_grace=3.0, **SETTINGS)
  assert one_line(e) == ("tff_worker_grace given with runner=local; valid: runner=tff with "
                         "them, or neither")
  with pytest.raises(ValueError) as e:
    api.build("fedavg", mclr, SCE, clients_per_round=2, **SETTINGS)
  assert one_line(e).startswith("unknown setting 'clients_per_round' for fedavg; valid: ")


def test_eval_every_and_divergence_ratio_apply_to_a_process(data):
  process = api.build("fedavg", mclr, SCE, rounds=3, eval_every=2, **SETTINGS)
  state = process.initialize(data)
  evaluated = []
  for _ in range(3):
    out = process.next(state)
    state = out.state
    evaluated.append("test_accuracy" in out.metrics)
  assert evaluated == [False, True, True]  # every 2nd round, and the last
  process = api.build("fedavg", mclr, SCE, divergence_ratio=1e-9, **SETTINGS)
  with pytest.raises(Diverged, match="divergence_ratio=1e-09"):
    process.next(process.initialize(data))
