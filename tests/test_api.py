"""The public process object (`tff_cluster.api`): every algorithm through it,
equal to the training loop's numbers, and every misuse refused clearly."""

import numpy as np
import pytest
import tensorflow as tf

from tff_cluster import tasks
from tests.conftest import TFF_PROBLEM, tiered
from tests.test_runners import ALL_CLIENTS, PARITY_CASES, representative
from tff_cluster import api, models, registry, stack
from tff_cluster.host import loop
from tff_cluster.host.driver import TrainingConfig
from tff_cluster.learning import evaluation
from tff_cluster.spec.task import DataOptions

SCE = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def model_fn():
  return models.mclr(60, 10)


@pytest.fixture(scope="module")
def data():
  return tasks.get_task("synthetic_clusters").load_data(
      DataOptions(seed=1, num_clients=12, extra={"num_clusters": 2}))


def _options(algo):
  return {k: v for k, v in PARITY_CASES[algo][0].items() if not k.startswith("_")}


def _model_fn(algo):
  """The parity case's model (`_model`), else MCLR 60 -> 10."""
  name = PARITY_CASES[algo][0].get("_model")
  return tasks.get_task("synthetic_clusters").with_model(name).model_fn if name else model_fn


def _models_ignore_test_labels(p):
  """The models and each client's choice of one (`Driver.eval_models`) are
  fixed before any test label is read: with every test label replaced they
  are the same. (A rule such as IFCA's choice by test loss is returned as
  the rule, applied by the evaluation, and named so in the docs.)"""
  driver = p._driver  # noqa: SLF001
  before = driver.eval_models()
  test = driver.data.test
  saved = dict(test)
  try:
    for cid, (x, y) in saved.items():
      test[cid] = (x, (np.asarray(y) + 1) % 10)
    after = driver.eval_models()
  finally:
    test.update(saved)
  for a, b in zip(before[0], after[0]):
    for u, v in zip(a, b):
      np.testing.assert_array_equal(u, v)
  evaluation.deployment(before[1]).assert_same(after[1])  # exactly


# Every algorithm on today's stack with Keras 3. On the TFF stack, where the
# runner parity runs every algorithm's rounds on the `local` runner too, and
# under Keras 2 (scripts/test.sh's keras2 phase, where what differs is the
# model's Keras), the algorithms with clients of their own (test_runners'
# SAME_CLIENTS and HOST_STEPS_ONLY exhaustive-only; CI's time, CI runs a
# slice).
PROCESS_ALGOS = tiered(sorted(registry.ALGORITHMS),
                       lambda a: (TFF_PROBLEM is not None and not stack.legacy_keras_requested())
                       or representative(a))


@pytest.mark.parametrize("algo", PROCESS_ALGOS)
@pytest.mark.xla  # every algorithm's rounds compiled with XLA on this stack
def test_every_algorithm_runs_through_the_process(algo, data):
  p = api.build(algo, _model_fn(algo), SCE, client_lr=0.02, local_epochs=1, batch_size=10,
                seed=3, **_options(algo))
  state = p.initialize(data)
  clients = None if algo in ALL_CLIENTS else data.client_ids[:6]
  out = p.next(state, clients)
  out = p.next(out.state, clients)
  assert 0 <= out.metrics["test_accuracy"] <= 1 and np.isfinite(out.metrics["train_loss"])
  assert set(out.client_results) == set(data.client_ids)
  weights = p.get_model_weights(out.state)
  shapes = [tuple(v.shape) for v in _model_fn(algo)().trainable_variables]
  assert weights and all([w.shape for w in m.trainable] == shapes for m in weights)
  for r in out.client_results.values():
    assert -1 <= r["model"] < max(len(weights), 1)
  assert p.evaluate(out.state)["test_accuracy"] == pytest.approx(out.metrics["test_accuracy"])
  # The same data given to evaluate() (a FederatedData; a Keras-free check
  # of its arguments) scores the same.
  assert p.evaluate(out.state, data)["test_accuracy"] == pytest.approx(
      out.metrics["test_accuracy"])
  _models_ignore_test_labels(p)
  # Misuse, refused with the same clear messages by every algorithm's process.
  with pytest.raises(ValueError, match="invalid client index 12; valid: 0..11"):
    p.next(out.state, [0, 12])
  with pytest.raises(ValueError, match="unknown client 'x'"):
    p.next(out.state, ["x"])
  with pytest.raises(ValueError, match="twice"):
    p.next(out.state, [1, 1])
  with pytest.raises(TypeError, match="ProcessState"):
    p.next({"model": []})
  with pytest.raises(RuntimeError, match="already initialized"):
    p.initialize(data)
  with pytest.raises(ValueError, match=f"unknown setting 'no_such_setting' for {algo}"):
    api.build(algo, model_fn, SCE, client_lr=0.02, local_epochs=1, batch_size=10,
              no_such_setting=1)


def test_process_equals_the_training_loop(data):
  """FedAvg with every client each round: the same losses and weights as
  `loop.run_training` with the same settings."""
  p = api.build("fedavg", model_fn, "sparse_ce_logits", client_lr=0.05, local_epochs=2,
                batch_size=10, seed=7)
  state = p.initialize(data)
  losses = []
  for _ in range(3):
    out = p.next(state)
    state = out.state
    losses.append(out.metrics["train_loss"])
  task = tasks.get_task("synthetic_clusters")
  task = type(task)(**{**task.__dict__, "model_fn": model_fn})
  config = TrainingConfig(rounds=3, clients_per_round=data.num_clients,
                                     local_epochs=2, batch_size=10, client_lr=0.05, seed=7)
  driver = registry.build_driver("fedavg", task, data, config)
  rows = []

  class Rows:
    def write_round(self, row):
      rows.append(row)

    def write_groups(self, round_num, client_ids, groups):
      pass

    def write_summary(self, summary):
      pass

    def plot(self, title):
      pass

  loop.run_training(task, data, config, driver, Rows(), progress=False)
  np.testing.assert_allclose(losses, [r["train_loss"] for r in rows], rtol=1e-6)
  ours = p.get_model_weights(state)[0]
  for a, b in zip(ours.trainable, driver.model_weights()):
    np.testing.assert_allclose(a, b, rtol=1e-6)


def test_an_older_state_replays_exactly(data):
  p = api.build("ifca", model_fn, SCE, client_lr=0.02, local_epochs=1, batch_size=10,
                num_groups=2)
  s0 = p.initialize(data)
  s1 = p.next(s0, [0, 1, 2, 3]).state
  a = p.next(s1, [4, 5, 6])
  p.next(a.state, [7, 8])
  b = p.next(s1, [4, 5, 6])  # back to s1
  assert a.metrics["train_loss"] == b.metrics["train_loss"]
  for wa, wb in zip(p.get_model_weights(a.state), p.get_model_weights(b.state)):
    for x, y in zip(wa.trainable, wb.trainable):
      np.testing.assert_array_equal(x, y)


def test_initial_weights_are_seeded_or_given(data):
  def first(seed, initial=None):
    p = api.build("fedavg", model_fn, SCE, client_lr=0.02, local_epochs=1, batch_size=10,
                  seed=seed, initial_weights=initial)
    return p.get_model_weights(p.initialize(data))[0].trainable
  a, b, c = first(0), first(0), first(1)
  np.testing.assert_array_equal(a[0], b[0])
  assert not np.array_equal(a[0], c[0])
  given = [np.full((60, 10), 0.5, np.float32), np.zeros(10, np.float32)]
  np.testing.assert_array_equal(first(0, given)[0], given[0])


def test_fedgroup_state_has_been_through_the_cold_start(data):
  p = api.build("fedgroup", model_fn, SCE, client_lr=0.02, local_epochs=1, batch_size=10,
                num_groups=2, pretrain_scale=3.0)
  state = p.initialize(data)
  driver = p._driver  # noqa: SLF001 (white-box check of the host side)
  pretrained = np.flatnonzero(np.asarray(driver.host.assignment) >= 0)
  assert len(pretrained) == 6  # min(alpha m, N) clients took part in the cold start
  out = p.next(state, data.client_ids)
  assert all(0 <= r["model"] < 2 for r in out.client_results.values())


def test_misuse_is_refused_with_clear_messages(data):
  p = api.build("fedavg", model_fn, SCE, client_lr=0.02, local_epochs=1, batch_size=10)
  q = api.build("fedavg", model_fn, SCE, client_lr=0.02, local_epochs=1, batch_size=10)
  with pytest.raises(TypeError, match="another process"):
    p.next(q.initialize(data))
  state = p.initialize(data)
  with pytest.raises(RuntimeError, match="already initialized"):
    p.initialize(data)
  with pytest.raises(TypeError, match="ProcessState"):
    p.next({"model": []})
  with pytest.raises(ValueError, match="invalid client index 12; valid: 0..11"):
    p.next(state, [0, 12])
  with pytest.raises(ValueError, match="unknown client 'x'"):
    p.next(state, ["x"])
  with pytest.raises(ValueError, match="twice"):
    p.next(state, [1, 1])
  pf = api.build("pfedmo", model_fn, SCE, client_lr=0.02, local_steps=2, batch_size=10)
  with pytest.raises(ValueError, match="every client every round"):
    pf.next(pf.initialize(data), [0, 1])
  with pytest.raises(ValueError, match="unsupported loss"):
    api.build("fedavg", model_fn, tf.keras.losses.MeanSquaredError(), client_lr=0.1,
              local_epochs=1, batch_size=10)
  with pytest.raises(ValueError, match="from_logits"):
    api.build("fedavg", model_fn, tf.keras.losses.SparseCategoricalCrossentropy(),
              client_lr=0.1, local_epochs=1, batch_size=10)
  with pytest.raises(TypeError, match="Keras"):
    api.build("fedavg", lambda: object(), SCE, client_lr=0.1, local_epochs=1,
              batch_size=10)
  with pytest.raises(ValueError, match="unknown setting 'num_groups' for fedavg"):
    api.build("fedavg", model_fn, SCE, client_lr=0.1, local_epochs=1, batch_size=10,
              num_groups=3)
  with pytest.raises(ValueError, match="initial_weights have shapes"):
    api.build("fedavg", model_fn, SCE, client_lr=0.1, local_epochs=1, batch_size=10,
              initial_weights=[np.zeros(3)])
  with pytest.raises(ValueError, match="exactly one of local_epochs and local_steps"):
    api.build("fedavg", model_fn, SCE, client_lr=0.1, batch_size=10)
  with pytest.raises(KeyError, match="unknown algorithm"):
    api.build("fedsgd", model_fn, SCE, client_lr=0.1, local_epochs=1, batch_size=10)


def test_loss_kinds():
  assert models.loss_kind(SCE) == models.SPARSE_CE_LOGITS
  assert models.loss_kind(tf.keras.losses.BinaryCrossentropy()) == models.BINARY_PROBS
  with pytest.raises(ValueError):
    models.loss_kind(tf.keras.losses.BinaryCrossentropy(from_logits=True))


@pytest.mark.tff
def test_tff_runner_process_equals_the_local_one(data):
  from tff_cluster.runners.tff import runtime
  out = {}
  with runtime.tff_runtime():
    for runner in ("tff", "local"):
      p = api.build("ifca", model_fn, SCE, client_lr=0.02, local_epochs=1, batch_size=10,
                    num_groups=2, runner=runner, seed=5)
      state = p.initialize(data)
      for clients in ([0, 2, 4, 6], [1, 3, 5]):
        state = p.next(state, clients).state
      out[runner] = p.get_model_weights(state)
  for a, b in zip(out["tff"], out["local"]):
    for x, y in zip(a.trainable, b.trainable):
      np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)



@pytest.mark.tff
def test_build_fedavg_takes_a_keras_loss_and_seeds_its_initial_weights():
  """The TFF LearningProcess: a Keras loss object, no initial weights (seeded)."""
  from tff_cluster.learning import schedule
  from tff_cluster import models
  from tff_cluster.runners.tff import runtime
  from tff_cluster.algorithms.fedavg import fedavg
  spec = schedule.client_dataset(np.zeros((4, 60), np.float32),
                                       np.zeros(4, np.int64), 2, 1, 0).element_spec
  with runtime.tff_runtime():
    a = fedavg.build_fedavg(model_fn, SCE, spec, client_lr=0.1, seed=3)
    b = fedavg.build_fedavg(model_fn, "sparse_ce_logits", spec, client_lr=0.1, seed=3)
    wa = a.get_model_weights(a.initialize())
    wb = b.get_model_weights(b.initialize())
  np.testing.assert_array_equal(wa.trainable[0], wb.trainable[0])
  tf.keras.utils.set_random_seed(3)
  np.testing.assert_array_equal(wa.trainable[0], model_fn().get_weights()[0])
  with pytest.raises(ValueError, match="unsupported loss"):
    fedavg.build_fedavg(model_fn, tf.keras.losses.Hinge(), spec, client_lr=0.1)


@pytest.mark.parametrize("algo", ["fedgroup", "ditto"])
def test_a_state_as_bytes_restores_into_a_new_process(algo, data):
  """`state_to_bytes` keeps the server's, every client's (Ditto's personal
  models) and the host's state (FedGroup's groups, its generator): a new
  process with the same settings goes on from it as the first one does."""
  def process():
    return api.build(algo, _model_fn(algo), SCE, client_lr=0.05, local_epochs=1, batch_size=10,
                     seed=3, **_options(algo))

  first = process()
  state = first.initialize(data)
  for r in range(2):
    state = first.next(state, data.client_ids[r * 4:(r + 1) * 4]).state
  payload = first.state_to_bytes(state)
  assert isinstance(payload, bytes) and b"pickle" not in payload[:64]
  second = process()
  with pytest.raises(RuntimeError, match="initialize"):
    second.state_from_bytes(payload)
  second.initialize(data)
  restored = second.state_from_bytes(payload)
  assert restored.round_num == 2
  clients = data.client_ids[8:12]
  a, b = first.next(state, clients), second.next(restored, clients)
  assert a.metrics["train_loss"] == b.metrics["train_loss"]
  assert a.metrics["test_accuracy"] == b.metrics["test_accuracy"]
  for m, n in zip(first.get_model_weights(a.state), second.get_model_weights(b.state)):
    for x, y in zip(m.trainable, n.trainable):
      np.testing.assert_array_equal(x, y)
