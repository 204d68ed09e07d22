"""The host layer: typed host states checkpointed whole (under the keys
checkpoints have always used), the client-state stores, the runner's
defaults, the model spec and one round with its evaluation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tff_cluster import models, registry
from tff_cluster.io import checkpoint
from tff_cluster.host import driver as driver_module
from tff_cluster.host import loop
from tff_cluster.host.driver import TrainingConfig
from tff_cluster.algorithms.cfl import cfl
from tff_cluster.algorithms.fedgroup import fedgroup
from tff_cluster.algorithms.ifca import ifca
from tff_cluster.algorithms.wecfl import wecfl
from tff_cluster.data.synthetic import generate_synthetic
from tff_cluster.learning import evaluation
from tff_cluster.learning.evaluation import Evaluator
from tff_cluster.host import round as host_round
from tff_cluster.host.model_spec import ModelSpec
from tff_cluster.host.state import HostState
from tff_cluster.runners.base import ClientStateStore, DictClientStore
from tff_cluster.runners.local_runner import LocalRunner


def _model():
  return models.mclr(60, 10)


SPEC = ModelSpec(_model, models.SPARSE_CE_LOGITS, "synthetic")


def _config(**kw):
  values = dict(rounds=3, clients_per_round=3, local_epochs=1, batch_size=10, client_lr=0.05)
  values.update(kw)
  return TrainingConfig(**values)


def _driver(algo, model, data, config, **values):
  """`algo`'s driver on `model` (a ModelSpec or a TaskSpec), as the API builds it."""
  return registry.build_driver(algo, model, data, config, **values)


@pytest.fixture(scope="module")
def data():
  return generate_synthetic(num_clients=6, seed=0)


# -- HostState ------------------------------------------------------------------


@dataclasses.dataclass
class _Host(HostState):
  assignment: np.ndarray
  rng: np.random.Generator
  count: int = 0


def _host():
  return _Host(assignment=np.array([0, -1, 2]), rng=np.random.default_rng(5))


def test_host_state_is_stored_under_its_field_names_and_restored_typed():
  host = _host()
  stored = host.to_dict()
  assert list(stored) == ["assignment", "rng", "count"]
  # Through the checkpoint's own encoding (no pickle) and back.
  back = _host().restored(checkpoint.loads(checkpoint.dumps(stored)))
  assert isinstance(back, _Host) and back.count == 0
  np.testing.assert_array_equal(back.assignment, [0, -1, 2])
  assert back.rng.integers(0, 1000) == np.random.default_rng(5).integers(0, 1000)


def test_restored_copies_keeps_missing_fields_and_refuses_unknown_keys():
  host = _host()
  values = {"assignment": np.array([1, 1, 1]), "count": 4}
  back = host.restored(values)
  values["assignment"][0] = 9  # the restored state holds its own copy
  np.testing.assert_array_equal(back.assignment, [1, 1, 1])
  assert back.count == 4 and back.rng is host.rng  # not in `values`: kept
  with pytest.raises(ValueError, match="'splits', not a field of _Host"):
    host.restored({"splits": 1})


def test_copy_is_deep():
  host = _host()
  copy = host.copy()
  host.assignment[0] = 7
  host.rng.integers(0, 10)
  assert copy.assignment[0] == 0
  assert copy.rng.integers(0, 1000) == np.random.default_rng(5).integers(0, 1000)


@pytest.mark.parametrize("cls, keys", [
    (fedgroup.FedGroupHost, ["assignment", "pretrained", "newcomers", "_rng", "_summary"]),
    (ifca.IFCAHost, ["assignment", "_rng", "_summary", "_forced_rng"]),
    (wecfl.ClusterModelsHost, ["assignment", "_summary"]),
    (cfl.CFLHost, ["assignment", "_summary", "splits", "refused"]),
])
def test_the_host_keys_of_earlier_checkpoints_map_onto_the_fields(cls, keys):
  # The attribute names the checkpoints of earlier versions hold, so they resume.
  assert sorted(checkpoint.renamed_host_keys(dict.fromkeys(keys))) == sorted(cls.field_names())


# -- client-state stores ----------------------------------------------------------


def test_dict_store_lends_stored_or_fresh_states_and_keeps_new_ones():
  store = DictClientStore()
  assert isinstance(store, ClientStateStore)
  states, args = store.lend([3, 5], lambda i: f"fresh{i}")
  assert states == ["fresh0", "fresh1"] and args == {}
  store.keep([3, 5], ["a", "b"])
  before = store.snapshot()
  states, _ = store.lend([5, 7], lambda i: f"fresh{i}")
  assert states == ["b", "fresh1"]
  store.keep([5, 7], ["b2", "c"])
  assert dict(store) == {3: "a", 5: "b2", 7: "c"} and before == {3: "a", 5: "b"}
  store.restore(before)
  assert dict(store) == {3: "a", 5: "b"} and len(store) == 2 and 7 not in store


def test_dict_store_numpy_items_converts_tensors():
  import tensorflow as tf
  store = DictClientStore({1: [tf.constant([1.0, 2.0])]})
  items = store.numpy_items(store.snapshot())
  assert isinstance(items[1][0], np.ndarray)
  np.testing.assert_array_equal(items[1][0], [1.0, 2.0])


def test_local_runner_defaults_an_in_memory_store_and_its_own_evaluator(data):
  runner = _driver("fedavg", SPEC, data, _config()).runner
  assert isinstance(runner, LocalRunner)
  assert type(runner.client_store()) is DictClientStore
  evaluator = runner.make_evaluator("train")
  assert isinstance(evaluator, Evaluator)
  w0 = driver_module.initial_weights(SPEC, 0)
  expected = Evaluator(SPEC.model_fn, SPEC.loss, data, split="train").mean_losses(w0)
  np.testing.assert_array_equal(evaluator.mean_losses(w0), expected)


def test_driver_keeps_client_states_in_the_runners_store(data):
  drv = _driver("fedavg", SPEC, data, _config(client_momentum=0.5))
  assert type(drv.client_states) is DictClientStore
  drv.setup()
  drv.run_round(1, np.array([0, 2, 4]))
  assert sorted(drv.client_states) == [0, 2, 4]
  kept = drv.snapshot()
  drv.run_round(2, np.array([1, 2]))
  assert sorted(drv.client_states) == [0, 1, 2, 4]
  drv.restore(drv.snapshot_numpy(kept))
  assert sorted(drv.client_states) == [0, 2, 4]


# -- the model spec ---------------------------------------------------------------


def test_model_spec_of_a_task_and_a_driver_built_on_either(data):
  from tff_cluster import tasks
  task = tasks.get_task("synthetic")
  spec = ModelSpec.of(task)
  assert (spec.model_fn, spec.loss, spec.name) == (task.model_fn, task.loss, "synthetic")
  assert ModelSpec.of(spec) == spec
  a = _driver("fedavg", task, data, _config())
  b = _driver("fedavg", spec, data, _config())
  assert a.model == b.model == spec
  for x, y in zip(a.w0, b.w0):
    np.testing.assert_array_equal(x, y)


# -- host state on a driver ---------------------------------------------------------


def test_driver_snapshot_restores_its_host_state_whole(data):
  drv = _driver("fedgroup", SPEC, data, _config(), num_groups=2, pretrain_iters=2)
  drv.setup()
  stored = drv.snapshot_numpy(drv.snapshot())
  assert sorted(stored["host"]) == sorted(fedgroup.FedGroupHost.field_names())
  before = drv.host.assignment.copy()
  draw = drv.host.copy().rng.integers(0, 10**9)
  drv.run_round(1, np.array([0, 1, 2]))
  drv.host.assignment[:] = 1
  drv.restore(stored)
  np.testing.assert_array_equal(drv.host.assignment, before)
  assert drv.host.rng.integers(0, 10**9) == draw
  assert drv.group_assignment() is drv.host.assignment


# -- one round ----------------------------------------------------------------------


class _FakeDriver:
  """A driver whose round gives fixed numbers: one model, every client on it."""

  def __init__(self, loss=0.5, weights=None):
    self.loss = loss
    self.weights = weights if weights is not None else [[np.ones(2, np.float32)]]

  def run_round(self, round_num, sampled):
    return {"train_loss": self.loss, "bytes_down": 8 * len(sampled)}

  def eval_models(self):
    return self.weights, np.zeros(3, np.int64)

  round_models = eval_models  # (`Driver`'s default)

  def round_eval_metrics(self, result):
    return {"mine": result.accuracy * 2}


def _FakeResult():
  # Four clients, the third without test data: accuracies 3/4, 1/4 and 9/10.
  return evaluation.EvalResult(
      0.75, 0.4, per_client_correct=np.array([3.0, 1.0, 0.0, 9.0]),
      per_client_count=np.array([4, 4, 0, 10]), per_client_loss_sum=np.zeros(4),
      client_model=np.zeros(4, np.int64), per_client_f1=np.array([0.6, 0.2, 0.0, 0.8]),
      client_weight=np.array([0.5, 0.25, 0.0, 0.25]))


class _FakeEvaluator:
  def evaluate(self, weights, client_model):
    return _FakeResult()


class _Ratio:
  def __init__(self, limit=100.0):
    self.limit = limit

  def check(self, round_num, train_loss, clients):
    ratio = train_loss / 0.25
    if ratio > self.limit:
      raise driver_module.Diverged(round_num, detail="past the limit")
    return ratio


def test_a_round_with_evaluation_writes_its_row_in_order():
  out = host_round.run_round(_FakeDriver(), 4, np.array([0, 2]), _FakeEvaluator(), _Ratio())
  assert list(out.row) == ["round", "train_loss", "bytes_down", "round_seconds", "loss_ratio",
                           *host_round.EVAL_METRICS, "mine", "eval_seconds"]
  assert out.row["round"] == 4 and out.row["loss_ratio"] == 2.0
  # clientavg 0.5*0.75 + 0.25*0.25 + 0.25*0.9; F1 0.5*0.6 + 0.25*0.2 + 0.25*0.8; the
  # client mean (0.75 + 0.25 + 0.9) / 3; percentiles of the sorted 0.25, 0.75, 0.9
  # at positions 0.2, 1 and 1.8: 0.25 + 0.2*0.5, 0.75, 0.75 + 0.8*0.15.
  expected = [0.75, 0.4, 0.6625, 0.55, 1.9 / 3, 0.35, 0.75, 0.87]
  assert [out.row[k] for k in host_round.EVAL_METRICS] == pytest.approx(expected, abs=1e-12)
  assert out.row["mine"] == 1.5 and out.row["bytes_down"] == 16
  assert out.metrics == pytest.approx(
      {"train_loss": 0.5, "bytes_down": 16, "loss_ratio": 2.0, "mine": 1.5,
       **dict(zip(host_round.EVAL_METRICS, expected))}, abs=1e-12)


def test_the_client_spread_of_an_evaluation_without_test_data_is_nan():
  result = evaluation.EvalResult(0.0, 0.0, np.zeros(2), np.zeros(2, np.int64), np.zeros(2))
  assert np.isnan(result.accuracy_client_mean) and np.isnan(result.accuracy_percentile(50))


def test_a_round_without_evaluation_or_check():
  out = host_round.run_round(_FakeDriver(), 1, np.array([1]))
  assert out.result is None and list(out.metrics) == ["train_loss", "bytes_down"]


@pytest.mark.parametrize("fake, match", [
    (_FakeDriver(loss=float("nan")), "the training loss is NaN"),
    (_FakeDriver(weights=[[np.array([np.inf], np.float32)]]), "a model is NaN"),
    (_FakeDriver(loss=100.0), "past the limit"),
])
def test_a_checked_round_raises_diverged(fake, match):
  with pytest.raises(driver_module.Diverged, match=match):
    host_round.run_round(fake, 3, np.array([0]), _FakeEvaluator(), _Ratio())


def test_the_eval_metric_names_are_the_rows_and_the_apis():
  assert set(host_round.EVAL_METRICS) <= set(loop.BASE_COLUMNS)
  assert list(host_round.eval_metrics(_FakeResult())) == list(host_round.EVAL_METRICS)


def test_run_status_of_each_way_a_run_ends():
  assert loop.run_status(driver_module.Diverged(3))["reason"] == "diverged"
  assert loop.run_status(KeyboardInterrupt())["reason"] == "interrupted"
  assert loop.run_status(SystemExit(143))["reason"] == "interrupted"
  assert loop.run_status(ValueError("x")) == {
      "completed": False, "reason": "error", "error": "ValueError: x"}


def test_the_context_reads_lazy_data_once_for_its_definition_and_driver(data):
  """`Context.materialized`: pFedMo's definition (its scoring batch) and its
  driver (its public set) both read every client's data on the host; with the
  ray runner's lazy data they share one reading."""
  calls = []

  def load():
    calls.append(1)
    return data

  from tff_cluster.data import federated
  from tff_cluster.host.driver import Context
  context = Context(SPEC, federated.reloading(data, load), None, None, [], 0, [])
  assert context.materialized is context.materialized and len(calls) == 1
