"""FedGroup maths and wiring: group-wise FedAvg, cold starts, newcomers, ARI."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tff_cluster import tasks
from tests import references
from tff_cluster import api, models, registry
from tff_cluster.host import loop
from tff_cluster.host.driver import TrainingConfig
from tff_cluster.runners.config import RunnerConfig
from tff_cluster.learning import schedule
from tff_cluster.algorithms.fedgroup import fedgroup
from tff_cluster.core.definition import round_params
from tff_cluster.data.synthetic import generate_synthetic
from tff_cluster.spec.task import DataOptions, TaskSpec

LR = 0.05


def _mclr():
  return models.mclr(60, 10)


def _data(num_clients=6, seed=0):
  return generate_synthetic(num_clients=num_clients, seed=seed)


def _spec(data):
  return schedule.client_dataset(*data.train[data.client_ids[0]], 10, 1, 0).element_spec


def _datasets(data, clients, seed=0, epochs=1):
  return [schedule.client_dataset(*data.train[data.client_ids[k]], 10, epochs,
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
    _LOCAL_SGD["fn"] = references.build_local_sgd(model, models.SPARSE_CE_LOGITS)
  return _LOCAL_SGD["fn"]


def _random_state(m, seed=0):
  rng = np.random.default_rng(seed)
  w0 = [v.numpy() for v in models.model_variables(_mclr())]
  group_models = [np.stack([w + rng.normal(0, 0.1, w.shape).astype(np.float32)
                            for _ in range(m)]) for w in w0]
  group_updates = [rng.normal(0, 0.1, g.shape).astype(np.float32) for g in group_models]
  aux = [g.mean(0) for g in group_models]
  return collections.OrderedDict(group_models=group_models, group_updates=group_updates,
                                 group_active=np.ones(m, np.float32), aux_model=aux)


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
  new_models, new_updates, aux, active = fedgroup.group_server_update(
      models_, updates, sums, weights, 0.0, None, "alg2")
  np.testing.assert_allclose(new_models[0].numpy(), [[1.0 + 5.0], [5.0]])
  # Group 1 had no member: it keeps its model and its previous latest update.
  np.testing.assert_allclose(new_updates[0].numpy(), [[5.0], [0.25]])
  # The auxiliary model averages only the groups that have had members.
  np.testing.assert_allclose(active.numpy(), [1.0, 0.0])
  np.testing.assert_allclose(aux[0].numpy(), [6.0])
  _, _, aux, active = fedgroup.group_server_update(
      models_, updates, sums, weights, 0.0, group_active=tf.constant([0.0, 1.0]),
      group_agg_rule="alg2")
  np.testing.assert_allclose(active.numpy(), [1.0, 1.0])
  np.testing.assert_allclose(aux[0].numpy(), [(6.0 + 5.0) / 2])


def test_server_update_applies_inter_group_step():
  rng = np.random.default_rng(3)
  flat = rng.normal(size=(3, 4)).astype(np.float32)
  models_ = [tf.constant(flat[:, :1]), tf.constant(flat[:, 1:])]
  zeros = [tf.zeros_like(t) for t in models_]
  new_models, new_updates, _, _ = fedgroup.group_server_update(
      models_, zeros, zeros, tf.constant([1.0, 1.0, 0.0]), 0.3, None, "alg2")
  expected = references.inter_group_step_np(flat.astype(np.float64), 0.3)
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
    assert int(got) == target == references.assign_by_direction(update, directions)


@pytest.mark.tff
def test_round_is_groupwise_fedavg():
  """Each group's new model = FedAvg of its own members only (unequal sizes)."""
  data = _data(6)
  m = 3
  _, comps = api.computations("fedgroup", _mclr, models.SPARSE_CE_LOGITS, _spec(data),
                              dict(num_groups=m))
  state = _random_state(m)
  clients = [0, 1, 2, 3, 4]
  groups = [0, 0, 1, 0, 1]  # group 2 has no sampled member
  datasets = _datasets(data, clients, seed=5)
  keys = [np.array([g], np.int32) for g in groups]
  new_state, summed, returned = comps["warm"](state, round_params(LR), datasets, keys)
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


def _driver_case(runner, rule, seed=0, **options):
  """A 12-client FedGroup driver after its cold start (3 of 12 pre-trained)."""
  data = _data(12, seed=seed)
  config = TrainingConfig(rounds=10, clients_per_round=2, local_epochs=1,
                                     batch_size=10, client_lr=LR, seed=0,
                                     runner=RunnerConfig(runner))
  options = {"num_groups": 3, "pretrain_scale": 1.0, "newcomer_rule": rule,
             "pretrain_iters": 7, **options}
  driver = registry.build_driver("fedgroup", _cluster_task(), data, config, **options)
  driver.setup()
  return data, config, driver


def _flat(weights):
  return np.concatenate([np.asarray(w, np.float64).ravel() for w in weights])


def _unflat(flat, like):
  out, i = [], 0
  for w in like:
    out.append(flat[i:i + w.size].reshape(w.shape).astype(np.float32))
    i += w.size
  return out


@pytest.mark.parametrize("runner", ["tff", "local"])
@pytest.mark.parametrize("rule", ["paper", "flexcfl"])
def test_newcomer_trains_from_its_chosen_group_and_lands_there(rule, runner):
  data, config, driver = _driver_case(runner, rule)
  warm = int(np.flatnonzero(driver.host.assignment >= 0)[0])
  warm_group = int(driver.host.assignment[warm])
  target = (warm_group + 1) % 3  # the group the newcomer must choose
  cold = int(np.flatnonzero(driver.host.assignment < 0)[0])
  state = driver.runner.numpy_state(driver.state)
  round_num = 1
  # The newcomer pre-trains from the rule's start model with the cold-start
  # setting (7 steps), its shuffle seeded apart from the round's training.
  start = state["aux_model"] if rule == "paper" else driver.w0
  x, y = data.train[data.client_ids[cold]]
  pre = schedule.work_dataset(x, y, driver.pretrain_work, schedule.client_seed(
      0, fedgroup.NEWCOMER_SHUFFLE_BASE + round_num, cold))
  pre_delta, _ = _local(list(start), pre)
  # Point the target group's direction along the pre-training update and the
  # others against it; the rule's directions are the only ones it may read.
  flat = _flat(pre_delta)
  rng = np.random.default_rng(1)
  directions = np.stack([-flat + rng.normal(0, 0.01, flat.shape) for _ in range(3)])
  directions[target] = flat
  field = "group_updates" if rule == "paper" else "init_updates"
  decoy = "init_updates" if rule == "paper" else "group_updates"
  state[field] = [np.stack([_unflat(row, pre_delta)[l] for row in directions])
                  for l in range(len(pre_delta))]
  if decoy in state:
    state[decoy] = [np.stack([_unflat(-row, pre_delta)[l] for row in directions])
                    for l in range(len(pre_delta))]
  driver.state = driver.runner.put_state(state)
  row = driver.run_round(round_num, np.array(sorted([warm, cold])))
  assert row["num_cold_clients"] == 1
  assert driver.host.assignment[cold] == target
  new = driver.runner.numpy_state(driver.state)["group_models"]
  # Its round's update was computed from w_target and is the target's only one.
  group_start = [layer[target] for layer in state["group_models"]]
  train = schedule.work_dataset(x, y, config.local_work,
                                      schedule.client_seed(0, round_num, cold))
  delta, _ = _local(group_start, train)
  for l, layer in enumerate(new):
    np.testing.assert_allclose(layer[target], group_start[l] + delta[l], atol=1e-5)
  untouched = ({0, 1, 2} - {target, warm_group}).pop()
  for l, layer in enumerate(new):
    np.testing.assert_array_equal(layer[untouched], state["group_models"][l][untouched])
  # Bytes: the newcomer also downloads the start model and m directions.
  p = driver.num_params * 4
  assert row["bytes_down"] == 2 * p + (1 + 3) * p and row["bytes_up"] == 2 * p


def test_rac_redraws_every_round_rac_once_keeps_the_first_draw():
  _, _, rac = _driver_case("local", "paper", cold_start="rac")
  pretrained = np.flatnonzero(rac.host.pretrained)
  kept = rac.host.assignment[pretrained].copy()
  others = np.flatnonzero(~rac.host.pretrained)[:2]
  sampled = np.sort(np.concatenate([others, pretrained[:1]]))
  history = []
  for t in range(1, 9):
    row = rac.run_round(t, sampled)
    assert row["num_cold_clients"] == 0  # nobody goes through the newcomer rule
    history.append(rac.host.assignment[others].copy())
  history = np.array(history)
  # Each non-pre-trained client drew again every round: several groups, and
  # the draws are the driver's uniform ones (not a function of the previous).
  assert all(len(set(history[:, i])) > 1 for i in range(2)), history
  np.testing.assert_array_equal(rac.host.assignment[pretrained], kept)
  # Tested with the last group it drew.
  _, client_model = rac.eval_models()
  np.testing.assert_array_equal(client_model[others], history[-1])

  _, _, once = _driver_case("local", "paper", cold_start="rac_once")
  first = None
  for t in range(1, 5):
    once.run_round(t, others)
    first = once.host.assignment[others].copy() if first is None else first
    np.testing.assert_array_equal(once.host.assignment[others], first)


def _eta_models():
  # Three groups of two one-weight layers: w_0 = (3, 4), w_1 = (0, 2), w_2 = (1, 0).
  return [tf.constant([[3.0], [0.0], [1.0]]), tf.constant([[4.0], [2.0], [0.0]])]


def _eta_update(rule, members):
  models_ = _eta_models()
  zeros = [tf.zeros_like(t) for t in models_]
  new, _, _, _ = fedgroup.group_server_update(models_, zeros, zeros, tf.constant(members),
                                              0.5, None, group_agg_rule=rule)
  return np.concatenate([t.numpy() for t in new], axis=1)


def test_inter_group_rules_on_a_hand_computed_three_group_example():
  s13, s20, s5 = np.sqrt(13.0), np.sqrt(20.0), np.sqrt(5.0)
  # alg2: w_j + 0.5 sum_{l != j} (w_l - w_j) / ||w_l - w_j||, for every group.
  alg2 = [[3 - 0.5 * (3 / s13 + 2 / s20), 4 - 0.5 * (2 / s13 + 4 / s20)],
          [0 + 0.5 * (3 / s13 + 1 / s5), 2 + 0.5 * (2 / s13 - 2 / s5)],
          [1 + 0.5 * (2 / s20 - 1 / s5), 0 + 0.5 * (4 / s20 + 2 / s5)]]
  np.testing.assert_allclose(_eta_update("alg2", [1.0, 1.0, 1.0]), alg2, rtol=1e-6)
  np.testing.assert_allclose(_eta_update("alg2", [1.0, 1.0, 0.0]), alg2, rtol=1e-6)
  # authors: a_l = 0.5 / ||w_l|| = (0.1, 0.25, 0.5);
  # w_j <- (w_j + sum_{l != j} a_l w_l) / (1 + sum_{l != j} a_l).
  authors = [[3.5 / 1.75, 4.5 / 1.75], [0.8 / 1.6, 2.4 / 1.6], [1.3 / 1.35, 0.9 / 1.35]]
  np.testing.assert_allclose(_eta_update("authors", [1.0, 1.0, 1.0]), authors, rtol=1e-6)
  # Group 2 without members: it neither moves nor contributes.
  authors_2_empty = [[3.0 / 1.25, 4.5 / 1.25], [0.3 / 1.1, 2.4 / 1.1], [1.0, 0.0]]
  np.testing.assert_allclose(_eta_update("authors", [1.0, 1.0, 0.0]), authors_2_empty,
                             rtol=1e-6)


def test_assigned_accuracy_leaves_out_clients_never_assigned():
  from tff_cluster.learning.evaluation import EvalResult
  result = EvalResult(accuracy=(1 + 3 + 2) / (4 + 4 + 2), loss=0.0,
                      per_client_correct=np.array([1.0, 3.0, 2.0]),
                      per_client_count=np.array([4.0, 4.0, 2.0]),
                      per_client_loss_sum=np.zeros(3))
  assert fedgroup.assigned_accuracy(result, np.array([-1, 0, 2])) == pytest.approx(5 / 6)
  assert fedgroup.assigned_accuracy(result, np.array([1, 0, 2])) == pytest.approx(0.6)
  assert np.isnan(fedgroup.assigned_accuracy(result, np.array([-1, -1, -1])))


def test_assigned_accuracy_column_and_summary_in_a_run():
  data, config, driver = _driver_case("local", "paper")
  driver = registry.build_driver("fedgroup", _cluster_task(), data, config, num_groups=3,
                                pretrain_scale=1.0, pretrain_iters=7)
  summary = loop.run_training(_cluster_task(), data, config, driver, progress=False)
  assert "max_test_accuracy_assigned" in summary
  assert 0.0 <= summary["max_test_accuracy_assigned"] <= 1.0


def test_group_discrepancy_by_hand():
  # Two groups of 1-d models; three clients.
  before = [np.array([[0.0, 0.0], [10.0, 10.0]])]
  after = [np.array([[1.0, 0.0], [10.0, 12.0]])]
  results = [{"group": 0, "delta": [np.array([3.0, 4.0])]},   # ||(3,4)-(1,0)|| = sqrt(20)
             {"group": 0, "delta": [np.array([-1.0, 0.0])]},  # ||(-1,0)-(1,0)|| = 2
             {"group": 1, "delta": [np.array([0.0, 2.0])]}]   # 0
  # sum_j (c_j / sum c) * mean over group j = (2/3)(sqrt(20)+2)/2 + (1/3) 0
  assert fedgroup.group_discrepancy(before, after, results) == pytest.approx(
      (2 / 3) * (np.sqrt(20.0) + 2) / 2)


def test_pretraining_length_options():
  assert fedgroup.pretrain_work(10, None, None).steps == 50
  assert fedgroup.pretrain_work(10, 7, None).steps == 7
  assert fedgroup.pretrain_work(10, None, 1).epochs == 1
  with pytest.raises(ValueError, match="--pretrain_iters=7 with --pretrain_epochs=1"):
    fedgroup.pretrain_work(10, 7, 1)


def _cluster_task(num_clusters=4):
  return TaskSpec(
      name="clusters", description="", model_fn=_mclr, loss=models.SPARSE_CE_LOGITS,
      defaults={}, load_data=lambda o: tasks.get_task("synthetic_clusters").load_data(o))


@pytest.mark.parametrize("measure", ["edc", "madc"])
def test_end_to_end_recovers_true_clusters(measure):
  data = tasks.get_task("synthetic_clusters").load_data(
      DataOptions(seed=1, num_clients=40, extra={"num_clusters": 4}))
  config = TrainingConfig(rounds=3, clients_per_round=10, local_epochs=2,
                                     batch_size=10, client_lr=0.01, seed=0)
  runner = registry.build_driver("fedgroup", _cluster_task(), data, config, num_groups=4,
                                measure=measure, pretrain_scale=20)
  summary = loop.run_training(_cluster_task(), data, config, runner, progress=False)
  assert summary["cold_start_clients"] == 40
  assert summary["ari"] >= 0.9, summary["ari"]
  assert summary["purity"] >= 0.9


def test_rcc_rac_and_newcomers():
  data = _data(30, seed=2)
  config = TrainingConfig(rounds=10, clients_per_round=6, local_epochs=1,
                                     batch_size=10, client_lr=0.01, seed=0)
  task = _cluster_task()
  # RCC: exactly m pre-trained clients, each one group's centre.
  rcc = registry.build_driver("fedgroup", task, data, config, num_groups=3, cold_start="rcc")
  rcc.setup()
  assert sorted(rcc.host.assignment[rcc.host.assignment >= 0].tolist()) == [0, 1, 2]
  # RAC once: cold clients get a group before training (none stays cold after a round).
  rac = registry.build_driver("fedgroup", task, data, config, num_groups=3, cold_start="rac_once",
                             pretrain_scale=2)
  rac.setup()
  cold_before = rac.host.assignment < 0
  assert cold_before.sum() == 30 - 6
  out = rac.run_round(1, np.arange(6, 12))
  assert out["num_cold_clients"] == 0 and (rac.host.assignment[6:12] >= 0).all()
  # Newcomers: held out of pre-training and of the first 10% of rounds, then
  # they join through client cold start (and pay for the m directions).
  runner = registry.build_driver("fedgroup", task, data, config, num_groups=3, pretrain_scale=20,
                                newcomer_fraction=0.2)
  runner.setup()
  assert runner.host.newcomers.sum() == 6 and runner.newcomer_rounds == 1
  assert (runner.host.assignment[runner.host.newcomers] == -1).all()
  assert (runner.host.assignment[~runner.host.newcomers] >= 0).all()
  first = runner.run_round(1, np.flatnonzero(runner.host.newcomers))
  assert first["num_cold_clients"] == 0  # resampled without newcomers
  later = runner.run_round(2, np.flatnonzero(runner.host.newcomers))
  assert later["num_cold_clients"] == 6
  assert (runner.host.assignment[runner.host.newcomers] >= 0).all()
  p = runner.num_params * 4
  assert later["bytes_down"] == 6 * p + 6 * (1 + 3) * p and later["bytes_up"] == 6 * p
