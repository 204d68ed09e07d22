"""FedGroup maths and wiring: group-wise FedAvg, cold starts, newcomers, ARI."""

import collections

import numpy as np
import pytest
import tensorflow as tf

import tasks
from tff_cluster import clustering, experiment, local_training, models
from tff_cluster.algorithms import fedgroup
from tff_cluster.algorithms.definition import round_params
from tff_cluster.data.synthetic import generate_synthetic
from tff_cluster.task import DataOptions, TaskSpec

LR = 0.05


def _mclr():
  return models.mclr(60, 10)


def _data(num_clients=6, seed=0):
  return generate_synthetic(num_clients=num_clients, seed=seed)


def _spec(data):
  return local_training.client_dataset(*data.train[data.client_ids[0]], 10, 1, 0).element_spec


def _datasets(data, clients, seed=0, epochs=1):
  return [local_training.client_dataset(*data.train[data.client_ids[k]], 10, epochs,
                                        seed + k) for k in clients]


def _local(weights, dataset, mu=0.0):
  model = _mclr()
  out = build_local_sgd_cache(model)(weights, dataset, LR, mu)
  return [d.numpy() for d in out["delta"]], float(out["num_examples"])


_LOCAL_SGD = {}


def build_local_sgd_cache(model):
  # One tf.function per test session keeps the in-process reference fast.
  if "fn" not in _LOCAL_SGD:
    _LOCAL_SGD["model"] = model
    _LOCAL_SGD["fn"] = local_training.build_local_sgd(model, models.SPARSE_CE_LOGITS)
  return _LOCAL_SGD["fn"]


def _random_state(m, seed=0):
  rng = np.random.default_rng(seed)
  w0 = [v.numpy() for v in local_training.model_variables(_mclr())]
  group_models = [np.stack([w + rng.normal(0, 0.1, w.shape).astype(np.float32)
                            for _ in range(m)]) for w in w0]
  group_updates = [rng.normal(0, 0.1, g.shape).astype(np.float32) for g in group_models]
  aux = [g.mean(0) for g in group_models]
  return collections.OrderedDict(group_models=group_models, group_updates=group_updates,
                                 aux_model=aux)


def test_initial_state_is_member_mean():
  w0 = [np.zeros((2, 2), np.float32), np.ones(3, np.float32)]
  updates = [[np.full((2, 2), v, np.float32), np.full(3, -v, np.float32)]
             for v in (1.0, 3.0, 10.0)]
  state = fedgroup.cold_start_state(w0, updates, np.array([0, 0, 1]), 2)
  np.testing.assert_allclose(state["group_models"][0][0], np.full((2, 2), 2.0))
  np.testing.assert_allclose(state["group_models"][1][1], np.full(3, 1.0 - 10.0))
  np.testing.assert_allclose(state["group_models"][1][0], np.full(3, 1.0 - 2.0))
  np.testing.assert_allclose(state["group_updates"][0][1], np.full((2, 2), 10.0))
  np.testing.assert_allclose(state["aux_model"][0], np.full((2, 2), 6.0))


def test_server_update_hand_example():
  # Two groups of 1-d "models"; group 0 gets clients with n = 1 and n = 3.
  models_ = [tf.constant([[1.0], [5.0]])]
  updates = [tf.constant([[0.5], [0.25]])]
  sums = [tf.constant([[1 * 2.0 + 3 * 6.0], [0.0]])]
  weights = tf.constant([4.0, 0.0])
  new_models, new_updates, aux = fedgroup.group_server_update(
      models_, updates, sums, weights, 0.0)
  np.testing.assert_allclose(new_models[0].numpy(), [[1.0 + 5.0], [5.0]])
  # Group 1 had no member: it keeps its model and its previous latest update.
  np.testing.assert_allclose(new_updates[0].numpy(), [[5.0], [0.25]])
  np.testing.assert_allclose(aux[0].numpy(), [(6.0 + 5.0) / 2])


def test_server_update_applies_inter_group_step():
  rng = np.random.default_rng(3)
  flat = rng.normal(size=(3, 4)).astype(np.float32)
  models_ = [tf.constant(flat[:, :1]), tf.constant(flat[:, 1:])]
  zeros = [tf.zeros_like(t) for t in models_]
  new_models, new_updates, _ = fedgroup.group_server_update(
      models_, zeros, zeros, tf.constant([1.0, 1.0, 0.0]), 0.3)
  expected = clustering.inter_group_step_np(flat.astype(np.float64), 0.3)
  got = np.concatenate([t.numpy() for t in new_models], axis=1)
  np.testing.assert_allclose(got, expected, atol=1e-5)
  # Groups with members record the change (the inter-group step included).
  np.testing.assert_allclose(np.concatenate([t.numpy() for t in new_updates], 1)[:2],
                             (expected - flat)[:2], atol=1e-5)


def test_direction_choice_matches_numpy_rule():
  rng = np.random.default_rng(0)
  directions = rng.normal(size=(4, 7)).astype(np.float32)
  for target in range(4):
    update = 3.0 * directions[target] + rng.normal(0, 0.1, 7).astype(np.float32)
    got = fedgroup.direction_choice([tf.constant(update[:3]), tf.constant(update[3:])],
                                    [tf.constant(directions[:, :3]),
                                     tf.constant(directions[:, 3:])])
    assert int(got) == target == clustering.assign_by_direction(update, directions)


def test_round_is_groupwise_fedavg():
  """Each group's new model = FedAvg of its own members only (unequal sizes)."""
  data = _data(6)
  m = 3
  comps = fedgroup.build_fedgroup(_mclr, models.SPARSE_CE_LOGITS, _spec(data), m)
  state = _random_state(m)
  clients = [0, 1, 2, 3, 4]
  groups = [0, 0, 1, 0, 1]  # group 2 has no sampled member
  datasets = _datasets(data, clients, seed=5)
  keys = [np.array([g], np.int32) for g in groups]
  new_state, summed, returned = comps.warm(state, round_params(LR), datasets, keys)
  assert [int(r["group"]) for r in returned] == groups
  for j in range(m):
    start = [layer[j] for layer in state["group_models"]]
    members = [i for i, g in enumerate(groups) if g == j]
    got = [np.asarray(layer[j]) for layer in new_state["group_models"]]
    if not members:
      for a, b in zip(got, start):
        np.testing.assert_array_equal(a, b)
      continue
    deltas, weights = zip(*[_local(start, _datasets(data, [clients[i]], seed=5)[0])
                            for i in members])
    expected = [s + sum(w * d[l] for d, w in zip(deltas, weights)) / sum(weights)
                for l, s in enumerate(start)]
    for a, b in zip(got, expected):
      np.testing.assert_allclose(a, b, atol=1e-5)
  aux = [np.asarray(a) for a in new_state["aux_model"]]
  for l, a in enumerate(aux):
    np.testing.assert_allclose(a, np.asarray(new_state["group_models"][l]).mean(0), atol=1e-6)
  drifts = [np.sqrt(sum(np.sum(d ** 2) for d in _local(
      [layer[groups[i]] for layer in state["group_models"]],
      _datasets(data, [c], seed=5)[0])[0])) for i, c in enumerate(clients)]
  assert summed["update_norm_sum"] / summed["num_clients"] == pytest.approx(
      np.mean(drifts), rel=1e-4)


def test_cold_client_trains_from_aux_and_joins_matching_group():
  data = _data(4)
  m = 3
  comps = fedgroup.build_fedgroup(_mclr, models.SPARSE_CE_LOGITS, _spec(data), m)
  state = _random_state(m, seed=1)
  dataset = _datasets(data, [2], seed=9)[0]
  delta, weight = _local(list(state["aux_model"]), dataset)
  flat = clustering.flatten_weights(delta)
  # Make group 1's latest update point along this client's update.
  directions = np.stack([np.random.default_rng(4).normal(size=flat.shape),
                         flat * 2.0 + 0.01, -flat])
  sizes = [w.size for w in delta]
  splits = np.cumsum(sizes)[:-1]
  state["group_updates"] = [
      np.stack([np.split(row, splits)[l].reshape(w.shape) for row in directions]).astype(np.float32)
      for l, w in enumerate(delta)]
  expected_group = clustering.assign_by_direction(flat, directions)
  assert expected_group == 1
  new_state, _, returned = comps.cold(
      state, round_params(LR), [_datasets(data, [2], seed=9)[0]], [np.array([m], np.int32)])
  assert int(returned[0]["group"]) == expected_group
  # Its update (trained from the auxiliary model) counts toward group 1.
  for l in range(len(delta)):
    np.testing.assert_allclose(np.asarray(new_state["group_models"][l][1]),
                               state["group_models"][l][1] + delta[l], atol=1e-5)
    np.testing.assert_array_equal(np.asarray(new_state["group_models"][l][0]),
                                  state["group_models"][l][0])


def _cluster_task(num_clusters=4):
  return TaskSpec(
      name="clusters", description="", model_fn=_mclr, loss=models.SPARSE_CE_LOGITS,
      defaults={}, load_data=lambda o: tasks.get_task("synthetic_clusters").load_data(o))


@pytest.mark.parametrize("measure", ["edc", "madc"])
def test_end_to_end_recovers_true_clusters(measure):
  data = tasks.get_task("synthetic_clusters").load_data(
      DataOptions(seed=1, num_clients=40, extra={"num_clusters": 4}))
  config = experiment.TrainingConfig(rounds=3, clients_per_round=10, local_epochs=2,
                                     batch_size=10, client_lr=0.01, seed=0)
  runner = fedgroup.make_driver(_cluster_task(), data, config, num_groups=4,
                                measure=measure, pretrain_scale=20)
  summary = experiment.run_training(_cluster_task(), data, config, runner, progress=False)
  assert summary["cold_start_clients"] == 40
  assert summary["ari"] >= 0.9, summary["ari"]
  assert summary["purity"] >= 0.9


def test_rcc_rac_and_newcomers():
  data = _data(30, seed=2)
  config = experiment.TrainingConfig(rounds=10, clients_per_round=6, local_epochs=1,
                                     batch_size=10, client_lr=0.01, seed=0)
  task = _cluster_task()
  # RCC: exactly m pre-trained clients, each one group's centre.
  rcc = fedgroup.make_driver(task, data, config, num_groups=3, cold_start="rcc")
  rcc.setup()
  assert sorted(rcc.assignment[rcc.assignment >= 0].tolist()) == [0, 1, 2]
  # RAC: cold clients get a group before training (none stays cold after a round).
  rac = fedgroup.make_driver(task, data, config, num_groups=3, cold_start="rac",
                             pretrain_scale=2)
  rac.setup()
  cold_before = rac.assignment < 0
  assert cold_before.sum() == 30 - 6
  out = rac.run_round(1, np.arange(6, 12))
  assert out["num_cold_clients"] == 0 and (rac.assignment[6:12] >= 0).all()
  # Newcomers: held out of pre-training and of the first 10% of rounds, then
  # they join through client cold start (and pay for the m directions).
  runner = fedgroup.make_driver(task, data, config, num_groups=3, pretrain_scale=20,
                                newcomer_fraction=0.2)
  runner.setup()
  assert runner.newcomers.sum() == 6 and runner.newcomer_rounds == 1
  assert (runner.assignment[runner.newcomers] == -1).all()
  assert (runner.assignment[~runner.newcomers] >= 0).all()
  first = runner.run_round(1, np.flatnonzero(runner.newcomers))
  assert first["num_cold_clients"] == 0  # resampled without newcomers
  later = runner.run_round(2, np.flatnonzero(runner.newcomers))
  assert later["num_cold_clients"] == 6
  assert (runner.assignment[runner.newcomers] >= 0).all()
  p = runner.num_params * 4
  assert later["bytes_down"] == 6 * p + 6 * 3 * p and later["bytes_up"] == 6 * p
