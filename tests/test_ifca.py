"""IFCA: the cluster estimate (argmin and its tie rule), per-cluster averaging, test-loss choice."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tests.test_fedgroup import LR, _data, _datasets, _local, _mclr, _spec
from tff_cluster import api, models, registry
from tff_cluster.host.driver import TrainingConfig
from tff_cluster.learning import schedule
from tff_cluster.algorithms.ifca import ifca
from tff_cluster.core.definition import round_params
from tff_cluster.learning.evaluation import CHOOSE_BY_TEST_LOSS, Evaluator


def test_argmin_takes_the_lowest_loss_and_the_lowest_index_on_ties():
  assert int(ifca.argmin_cluster(tf.constant([0.9, 0.2, 0.5]))) == 1
  assert int(ifca.argmin_cluster(tf.constant([0.7, 0.3, 0.3]))) == 1  # FedBase would take 2
  assert int(ifca.argmin_cluster(tf.constant([0.4, 0.4, 0.4]))) == 0


def _mean_loss(weights, dataset):
  model = _mclr()
  models.set_weights(model, weights)
  total, count = 0.0, 0
  for batch in dataset:
    per = models.per_example_loss(models.SPARSE_CE_LOGITS, batch["y"],
                                  model(batch["x"], training=False))
    total += float(tf.reduce_sum(per))
    count += int(tf.shape(per)[0])
  return total / count


@pytest.mark.tff
@pytest.mark.parametrize("aggregation", ["uniform", "num_examples"])
def test_a_round_averages_each_cluster_over_the_clients_that_chose_it(aggregation):
  data = _data(4)
  definition, comps = api.computations("ifca", _mclr, models.SPARSE_CE_LOGITS, _spec(data),
                                       dict(num_groups=3, ifca_agg=aggregation))
  rng = np.random.default_rng(0)
  w0 = models.get_weights(_mclr())
  starts = [[w + rng.normal(0, s, w.shape).astype(np.float32) for w in w0]
            for s in (3.0, 0.0, 1.5)]
  state = definition.initial_state(starts)
  clients = [0, 1, 2, 3]
  new, summed, results = comps["train"](state, round_params(LR),
                                        _datasets(data, clients, seed=3))
  chosen = []
  for i, r in zip(clients, results):
    expected = [_mean_loss(m, _datasets(data, [i], seed=3)[0]) for m in starts]
    np.testing.assert_allclose(np.asarray(r["losses"]), expected, rtol=1e-4)
    assert int(r["cluster"]) == int(np.argmin(expected))
    chosen.append(int(r["cluster"]))
  assert len(set(chosen)) < 3  # some cluster is left without clients in this case
  for j in range(3):
    members = [i for i, c in zip(clients, chosen) if c == j]
    got = [np.asarray(layer[j]) for layer in new["models"]]
    if not members:  # nobody chose it: unchanged
      for a, b in zip(got, starts[j]):
        np.testing.assert_array_equal(a, b)
      continue
    deltas, sizes = zip(*[_local(starts[j], _datasets(data, [i], seed=3)[0]) for i in members])
    a = np.ones(len(members)) if aggregation == "uniform" else np.array(sizes)
    expected = [s + sum(w * d[l] for w, d in zip(a, deltas)) / a.sum()
                for l, s in enumerate(starts[j])]
    for x, y in zip(got, expected):
      np.testing.assert_allclose(x, y, atol=1e-5)


@pytest.mark.tff
def test_one_full_batch_is_the_loss_on_every_pass_of_the_schedule():
  """Clients whose batch holds their whole training set (the rotated tasks:
  batch 100 = 100 images) and 3 passes: the loss on 1 batch
  (--ifca_loss_batches=1) equals the loss on the whole schedule (0), which
  repeats the same data 3 times, and the loss on the data once."""
  data = _data(3)
  biggest = max(len(data.train[c][1]) for c in data.client_ids)
  rng = np.random.default_rng(1)
  w0 = models.get_weights(_mclr())
  starts = [[w + rng.normal(0, s, w.shape).astype(np.float32) for w in w0] for s in (2.0, 0.5)]
  clients = [0, 1, 2]
  datasets = [schedule.client_dataset(*data.train[data.client_ids[k]], biggest, 3, k)
              for k in clients]
  spec = datasets[0].element_spec
  losses = {}
  for batches in (0, 1):
    definition, comps = api.computations("ifca", _mclr, models.SPARSE_CE_LOGITS, spec,
                                         dict(num_groups=2, ifca_loss_batches=batches))
    _, _, results = comps["assign"](definition.initial_state(starts), round_params(LR),
                                    datasets)
    losses[batches] = np.array([np.asarray(r["losses"]) for r in results])
  np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
  once = [[_mean_loss(m, datasets[i].take(1)) for m in starts] for i in clients]
  np.testing.assert_allclose(losses[1], once, rtol=1e-5)


def test_the_test_loss_choice_takes_each_clients_lowest_test_loss_model():
  """`--ifca_eval=test_loss` and test-only clients: the evaluator's choice."""
  data = _data(5)
  evaluator = Evaluator(_mclr, models.SPARSE_CE_LOGITS, data)
  rng = np.random.default_rng(1)
  w0 = models.get_weights(_mclr())
  candidates = [[w + rng.normal(0, 2.0, w.shape).astype(np.float32) for w in w0]
                for _ in range(3)]
  every = [evaluator.evaluate(candidates, np.full(data.num_clients, j)) for j in range(3)]
  mean_loss = np.stack([r.per_client_loss_sum / r.per_client_count for r in every])
  result = evaluator.evaluate(candidates, CHOOSE_BY_TEST_LOSS)
  np.testing.assert_array_equal(result.client_model, np.argmin(mean_loss, axis=0))
  direct = evaluator.evaluate(candidates, result.client_model)
  assert result.accuracy == pytest.approx(direct.accuracy)
  assert result.loss == pytest.approx(direct.loss)
  assert result.loss <= min(r.loss for r in every) + 1e-12


def test_good_init_redraws_until_every_cluster_gets_its_share(monkeypatch):
  from tff_cluster import tasks
  from tff_cluster.host import loop
  from tff_cluster.spec.task import DataOptions
  task = tasks.get_task("synthetic_clusters")
  data = task.load_data(DataOptions(seed=0, num_clients=20, extra={"num_clusters": 2}))
  config = TrainingConfig(rounds=1, clients_per_round=10, local_epochs=1,
                                     batch_size=10, client_lr=0.01, seed=0)
  driver = registry.build_driver("ifca", task, data, config, num_groups=2, ifca_init="good_init")
  driver.setup()
  assert driver.threshold == 0.35
  assert driver.host.summary["good_init_smallest_share"] >= 0.35
  # The accepted draw really splits a fresh check of the same sample that way.
  clients = np.sort(np.random.default_rng(np.random.SeedSequence([0, 13]))
                    .choice(20, 10, replace=False))
  out = driver.train_clients("assign", driver.state, clients, 0, persist=False)
  counts = np.bincount([int(r["cluster"]) for r in out.results], minlength=2)
  assert counts.min() / 10 == driver.host.summary["good_init_smallest_share"]
  # An impossible threshold: the best of the allowed draws, with a warning.
  monkeypatch.setattr(ifca, "GOOD_INIT_ATTEMPTS", 3)
  strict = registry.build_driver("ifca", task, data, config, num_groups=2, ifca_init="good_init",
                            ifca_good_init_threshold=0.9)
  with pytest.warns(UserWarning, match="no draw in 3"):
    strict.setup()
  assert strict.host.summary["init_attempts"] == 3


def test_the_torch_start_draws_each_kernel_and_bias_within_one_over_root_fan_in():
  """--ifca_init_dist=torch (the authors' MNIST start): every Dense kernel and
  bias uniform in +-1/sqrt(fan_in), K different draws, the same for the same
  seed; Keras's start has zero biases."""
  from tff_cluster import tasks
  from tff_cluster.spec.task import DataOptions
  task = tasks.get_task("synthetic_clusters")
  data = task.load_data(DataOptions(seed=0, num_clients=10, extra={"num_clusters": 2}))
  config = TrainingConfig(rounds=1, clients_per_round=4, local_epochs=1, batch_size=10,
                          client_lr=0.01, seed=3)
  task = dataclasses.replace(task, model_fn=lambda: models.mlp(60, 7, 10))
  draw = lambda dist: registry.build_driver(  # noqa: E731
      "ifca", task, data, config, num_groups=3, ifca_init_dist=dist)._draw(0)
  torch, again, keras = draw("torch"), draw("torch"), draw("keras")
  bounds = [1 / np.sqrt(60), 1 / np.sqrt(60), 1 / np.sqrt(7), 1 / np.sqrt(7)]
  for j in range(3):
    for w, b, k in zip(torch[j], bounds, keras[j]):
      assert w.shape == k.shape and np.abs(w).max() <= b
      assert w.size < 50 or np.abs(w).max() > 0.9 * b  # uniform over the whole range
    np.testing.assert_array_equal(np.concatenate([w.ravel() for w in torch[j]]),
                                  np.concatenate([w.ravel() for w in again[j]]))
    assert not np.any(keras[j][1]) and np.all(torch[j][1] != 0)  # biases: zero vs drawn
  assert not np.array_equal(torch[0][0], torch[1][0])
  with pytest.raises(ValueError, match="LSTM"):
    lstm = tf.keras.Sequential([tf.keras.Input((3, 2)), tf.keras.layers.LSTM(2)])
    models.fan_in_uniform_weights(lstm, np.random.default_rng(0))


def _two_class_task():
  """Clients whose training labels and test labels disagree: client 0 trains
  on class 0 and is tested on class 1, client 1 the other way round; client 2
  is test-only (class 1). Model 0 predicts class 0, model 1 class 1."""
  from tff_cluster.data.federated import FederatedData
  from tff_cluster.spec.task import TaskSpec
  rng = np.random.default_rng(0)
  x = lambda n: rng.normal(size=(n, 4)).astype(np.float32)  # noqa: E731
  ids = ["c0", "c1", "c2"]
  train = {"c0": (x(6), np.zeros(6, np.int64)), "c1": (x(6), np.ones(6, np.int64)),
           "c2": (x(0), np.zeros(0, np.int64))}
  test = {"c0": (x(4), np.ones(4, np.int64)), "c1": (x(4), np.zeros(4, np.int64)),
          "c2": (x(4), np.ones(4, np.int64))}
  data = FederatedData(ids, train, test, 2, true_clusters=np.array([0, 1, 1]))
  task = TaskSpec(name="two", description="", load_data=None,
                  model_fn=lambda: models.mclr(4, 2), loss=models.SPARSE_CE_LOGITS,
                  defaults={})
  kernel = np.zeros((4, 2), np.float32)
  favour = [[kernel, np.array([5.0, -5.0], np.float32)],
            [kernel, np.array([-5.0, 5.0], np.float32)]]
  return task, data, favour


@pytest.mark.parametrize("ifca_eval", ["assigned", "test_loss"])
def test_a_training_client_is_scored_with_its_assignment_not_its_test_labels(ifca_eval):
  """Default `assigned`: a client with training data is tested with the model
  its training loss picks (never sampled: the argmin over the K models, no
  training; once sampled: its latest choice), whatever its test labels would
  prefer; `test_loss` lets its test labels choose. Test-only clients choose by
  test loss under both. ARI counts the assigned choices only."""
  from tff_cluster.host import loop
  from tff_cluster.learning.evaluation import Evaluator
  task, data, favour = _two_class_task()
  config = TrainingConfig(rounds=2, clients_per_round=1, local_epochs=1,
                                     batch_size=6, client_lr=1e-6, seed=0)
  driver = registry.build_driver("ifca", task, data, config, num_groups=2, ifca_eval=ifca_eval)
  driver.setup()
  driver.state = driver.runner.put_state(driver.definition.initial_state(favour))
  evaluator = Evaluator(task.model_fn, task.loss, data)
  weights, client_model = driver.eval_models()
  result = evaluator.evaluate(weights, client_model)
  if ifca_eval == "assigned":
    np.testing.assert_array_equal(client_model, [0, 1, -1])  # argmin of training loss
    np.testing.assert_array_equal(result.client_model, [0, 1, 1])
    assert result.accuracy == pytest.approx(4 / 12)  # only the test-only client is right
  else:
    assert client_model == CHOOSE_BY_TEST_LOSS
    np.testing.assert_array_equal(result.client_model, [1, 0, 1])
    assert result.accuracy == 1.0
  metrics = driver.round_eval_metrics(result)
  assert metrics["ari"] == 1.0 and metrics["purity"] == 1.0  # c0 -> 0, c1 -> 1: truth
  # Sampled once, a client keeps its latest choice even when the models move.
  driver.run_round(1, np.array([0]))
  assert driver.host.assignment[0] == 0
  driver.state = driver.runner.put_state(driver.definition.initial_state(favour[::-1]))
  _, client_model = driver.eval_models()
  if ifca_eval == "assigned":
    np.testing.assert_array_equal(client_model, [0, 0, -1])  # c1 re-chooses: unsampled


def test_a_round_without_evaluation_leaves_the_never_sampled_clients_argmin_out(monkeypatch):
  """After a round that is not evaluated (`--eval_every`), what groups.csv
  shows (`round_models`) is the cluster each sampled client trained and -1
  for the others: the argmin of every never-sampled client's training loss
  (on a task of thousands of clients it costs more than the round) is left to
  the evaluated rounds, which still show it."""
  from tff_cluster.host import loop, round as host_round
  from tff_cluster.learning.evaluation import Evaluator
  task, data, favour = _two_class_task()
  config = TrainingConfig(rounds=2, clients_per_round=1, local_epochs=1,
                                     batch_size=6, client_lr=1e-6, seed=0)
  driver = registry.build_driver("ifca", task, data, config, num_groups=2)
  driver.setup()
  driver.state = driver.runner.put_state(driver.definition.initial_state(favour))
  made = []
  real = driver.make_evaluator
  monkeypatch.setattr(driver, "make_evaluator",
                      lambda *a, **k: made.append(a) or real(*a, **k))
  out = host_round.run_round(driver, 1, np.array([0]))
  np.testing.assert_array_equal(out.client_model, [0, -1, -1])
  assert made == []  # no client's training loss was scored
  out = host_round.run_round(driver, 2, np.array([0]),
                             evaluator=Evaluator(task.model_fn, task.loss, data))
  np.testing.assert_array_equal(out.client_model, [0, 1, -1])  # c1's argmin
  assert made == [("train",)]


@pytest.mark.tff
def test_round_outputs_are_server_placed_and_read_back_in_client_order():
  """The round computation returns everything at SERVER (the per-client
  results through the collect aggregation, each row with its client's
  position), so TFF's mergeable context need not re-run the clients; rows
  that come back in another order (as from several workers) are put back
  in the clients' order, and a missing row is refused."""
  import tensorflow_federated as tff
  data = _data(5)
  definition, comps = api.computations("ifca", _mclr, models.SPARSE_CE_LOGITS, _spec(data),
                                       dict(num_groups=3))
  comp = comps["train"]
  assert all(t.placement is tff.SERVER for t in comp.computation.type_signature.result)
  rng = np.random.default_rng(1)
  starts = [[w + rng.normal(0, s, w.shape).astype(np.float32) for w in models.get_weights(_mclr())]
            for s in (2.0, 0.0, 1.0)]
  state = definition.initial_state(starts)
  clients = [4, 0, 3, 1, 2]
  datasets = _datasets(data, clients, seed=3)
  positions = [np.int32(i) for i in range(len(clients))]
  _, _, collected = comp.computation(state, round_params(LR), datasets, positions)
  np.testing.assert_array_equal(np.sort(np.asarray(collected[0])), np.arange(5))
  in_order, _ = comp.unpack(collected, 5)
  for i, k in enumerate(clients):  # each result is its own client's
    expected = [_mean_loss(m, _datasets(data, [k], seed=3)[0]) for m in starts]
    np.testing.assert_allclose(np.asarray(in_order[i]["losses"]), expected, rtol=1e-4)
  shuffled = [np.asarray(t)[[3, 0, 4, 2, 1]] for t in collected]
  again, _ = comp.unpack(shuffled, 5)
  for a, b in zip(in_order, again):
    np.testing.assert_array_equal(np.asarray(a["losses"]), np.asarray(b["losses"]))
  with pytest.raises(RuntimeError, match="positions"):
    comp.unpack([np.asarray(t)[:4] for t in collected], 5)


@pytest.mark.tff
@pytest.mark.parametrize("algo", ["ifca", "cfl_mgd"])
def test_forced_rounds_train_the_clusters_of_the_keys_on_tff_as_locally(algo):
  """forced: each client's key (the runner's `key`) is its cluster: it is
  the cluster it reports, trains and lands in; the TFF computation equals
  the local runner's round (IFCA and CFL-MGD)."""
  from tff_cluster.runners import local_runner
  data = _data(4)
  options = dict(num_groups=3)
  definition, comps = api.computations(algo, _mclr, models.SPARSE_CE_LOGITS, _spec(data),
                                       options, data=data)
  rng = np.random.default_rng(6)
  w0 = models.get_weights(_mclr())
  state = definition.initial_state([[w + rng.normal(0, s, w.shape).astype(np.float32)
                                     for w in w0] for s in (1.0, 0.5, 2.0)])
  keys, clients = [2, 0, 2, 0], [0, 1, 2, 3]
  work = schedule.LocalWork(10, epochs=1)
  datasets = [schedule.work_dataset(*data.train[data.client_ids[k]], work,
                                          schedule.client_seed(0, 1, k)) for k in clients]
  rest = [[np.array([k], np.int32) for k in keys]]
  client_states = None
  if definition.client_state_spec("forced") is not None:
    client_states = [definition.initial_client_state("forced") for _ in clients]
    rest.append(client_states)
  out = comps["forced"](state, round_params(LR), datasets, *rest)
  assert [int(r["cluster"]) for r in out[2]] == keys
  runner = local_runner.LocalRunner(definition, _mclr, models.SPARSE_CE_LOGITS, data, seed=0)
  local = runner.run("forced", state, clients, 1, work, LR, keys, client_states)
  assert [int(r["cluster"]) for r in local.results] == keys
  for a, b in zip(tf.nest.flatten(runner.numpy_state(local.state)), tf.nest.flatten(out[0])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  for layer, w in enumerate(state["models"]):  # no client's key is 1: cluster 1 kept
    np.testing.assert_array_equal(np.asarray(out[0]["models"][layer][1]), w[1])
    assert not np.array_equal(np.asarray(out[0]["models"][layer][2]), w[2])
