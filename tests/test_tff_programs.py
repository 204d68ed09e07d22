"""TFF's own program machinery drives the library's processes: a
`tff.program` data source over the library's data, `tff.learning.programs.
train_model` with TFF's `FileProgramStateManager`, resume after a stop equal
to an uninterrupted program, and equality with the `tff` runner's rounds.
The TFF stack only (marked `tff`)."""

from __future__ import annotations

import asyncio
import copy

import numpy as np
import pytest
import tensorflow as tf

from tff_cluster import models, tasks
from tff_cluster.spec.task import DataOptions

pytestmark = pytest.mark.tff

LR, BATCH, PER_ROUND, SEED = 0.1, 10, 3, 4


@pytest.fixture(scope="module")
def data():
  return tasks.get_task("synthetic_clusters").load_data(
      DataOptions(seed=1, num_clients=8, extra={"num_clusters": 2}))


def _model():
  return models.mclr(60, 10)


def _initial(seed=SEED):
  tf.keras.utils.set_random_seed(seed)
  return models.get_weights(_model())


def _source(data):
  from tff_cluster.tff_program import ClientDataSource
  return ClientDataSource(data, batch_size=BATCH, epochs=1, seed=SEED)


def test_the_data_source_draws_the_training_loops_clients_and_batches(data):
  from tff_cluster.host.driver import sample_clients
  from tff_cluster.learning import schedule
  source = _source(data)
  it = source.iterator()
  rng = np.random.default_rng(np.random.SeedSequence([SEED, 7]))  # the loop's generator
  for round_num in (1, 2, 3):
    ids = it.selected_clients(PER_ROUND)
    got = it.select(PER_ROUND)
    want = sample_clients(rng, data.training_clients(), PER_ROUND)
    assert ids == [data.client_ids[k] for k in want]
    for ds, k in zip(got, want):
      ref = schedule.client_dataset(*data.train[data.client_ids[k]], BATCH, 1,
                                    schedule.client_seed(SEED, round_num, int(k)))
      for a, b in zip(ds.as_numpy_iterator(), ref.as_numpy_iterator()):
        np.testing.assert_array_equal(a["y"], b["y"])
        np.testing.assert_array_equal(a["x"], b["x"])
  # A copy and a serialized iterator continue the same draws; neither holds data.
  twin = copy.deepcopy(it)
  back = type(it).from_bytes(it.to_bytes())
  assert twin == it and back == it and len(it.to_bytes()) < 1000
  assert twin.selected_clients(PER_ROUND) == back.selected_clients(PER_ROUND) == \
      it.selected_clients(PER_ROUND)
  it.select(PER_ROUND)
  assert twin != it and twin.round_num == 3 and it.round_num == 4
  with pytest.raises(ValueError, match="valid: 1..8"):
    it.select(9)
  from tff_cluster.tff_program import ClientDataSourceIterator
  with pytest.raises(TypeError, match="create the source first"):
    ClientDataSourceIterator.from_bytes(it.to_bytes())


def _fedavg_process(source):
  from tff_cluster.algorithms.fedavg import fedavg
  return fedavg.build_fedavg(_model, models.SPARSE_CE_LOGITS, source.element_spec, _initial(),
                             client_lr=LR)


def _train_model(data, root, rounds, make_process=_fedavg_process):
  """`make_process(source)` under `tff.learning.programs.train_model`, its
  state in a `FileProgramStateManager` at `root`; returns the released
  metrics by round, the last saved version and the final model weights."""
  import tensorflow_federated as tff
  from tff_cluster.runners.tff import runtime
  source = _source(data)
  process = make_process(source)
  metrics = tff.program.MemoryReleaseManager()
  released = tff.program.MemoryReleaseManager()
  manager = tff.program.FileProgramStateManager(str(root))
  context = tff.program.NativeFederatedContext(runtime.async_context())

  async def program():
    await tff.learning.programs.train_model(
        train_process=process, train_data_source=source, train_per_round_clients=PER_ROUND,
        train_total_rounds=rounds, program_state_manager=manager,
        model_output_manager=released, train_metrics_manager=metrics,
        evaluation_manager=None, evaluation_periodicity=1)
    initial = await tff.program.materialize_value(process.initialize())
    return await manager.load_latest(
        tff.learning.programs.ProgramState(initial, 0, 0, source.iterator()))

  with tff.framework.get_context_stack().install(context):
    state, version = asyncio.run(program())
  weights = process.get_model_weights(state.state)
  return (dict(metrics.values()), version,
          [np.asarray(w) for w in list(weights.trainable) + list(weights.non_trainable)],
          state.state)


def test_train_model_runs_fedavg_and_resumes_exactly(data, tmp_path):
  whole, version, weights, _ = _train_model(data, tmp_path / "whole", 3)
  assert version == 3 and sorted(whole) == [1, 2, 3]
  # tff.learning's metrics layout: the release finds client_work/train and
  # hands it on as model_metrics.
  assert set(whole[3]["model_metrics"]) == {"loss", "loss_sum", "num_examples"}
  # Stopped after round 2, restarted asking for 3: the same model and metrics.
  _train_model(data, tmp_path / "stopped", 2)
  rest, version, resumed, _ = _train_model(data, tmp_path / "stopped", 3)
  assert version == 3 and sorted(rest) == [3]
  assert rest[3] == whole[3]
  for a, b in zip(resumed, weights):
    np.testing.assert_array_equal(a, b)
  # The same three rounds on the `tff` runner (the API's process on the
  # clients the source draws): the same model, and the same mean loss.
  process = _api_process("fedavg", initial_weights=_initial())
  state = _same_rounds(process, process.initialize(data), data, whole)
  (runner_weights,) = process.get_model_weights(state)
  for a, b in zip(list(runner_weights.trainable) + list(runner_weights.non_trainable),
                  weights):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _same_rounds(process, state, data, released):
  """The API `process`'s rounds 1.. on the clients the data source draws,
  each round's mean training loss equal to the program's released one;
  returns the last state."""
  it = _source(data).iterator()
  for round_num in sorted(released):
    out = process.next(state, it.next_clients(PER_ROUND))
    state = out.state
    np.testing.assert_allclose(out.metrics["train_loss"],
                               released[round_num]["model_metrics"]["loss"], rtol=1e-5)
  return state


def _api_process(algo, runner="tff", **options):
  from tff_cluster import api
  return api.build(algo, _model, models.SPARSE_CE_LOGITS, client_lr=LR, local_epochs=1,
                   batch_size=BATCH, seed=SEED, runner=runner, **options)


def test_train_model_runs_ifca_and_resumes_exactly(data, tmp_path):
  """IFCA's round as a LearningProcess: K = 2 cluster models in its state,
  each client picking its cluster; stopped and restarted equal to
  uninterrupted; both models equal the `tff` runner's IFCA rounds."""
  from tff_cluster.tff_program import build_learning_process
  reference = _api_process("ifca", num_groups=2)
  state = reference.initialize(data)
  start = [list(m.trainable) + list(m.non_trainable)
           for m in reference.get_model_weights(state)]

  def ifca(source):
    return build_learning_process("ifca", _model, models.SPARSE_CE_LOGITS, source.element_spec,
                                  start, LR, {"num_groups": 2})

  whole, version, first, final = _train_model(data, tmp_path / "whole", 3, ifca)
  assert version == 3 and set(whole[3]["model_metrics"]) == {"loss", "loss_sum",
                                                             "num_examples"}
  _train_model(data, tmp_path / "stopped", 2, ifca)
  rest, _, _, resumed = _train_model(data, tmp_path / "stopped", 3, ifca)
  assert rest[3] == whole[3]
  for a, b in zip(resumed["models"], final["models"]):
    np.testing.assert_array_equal(a, b)
  # get_model_weights gives cluster 0 (model_index); the state keeps both.
  np.testing.assert_array_equal(first[0], final["models"][0][0])
  # (A fresh process: the first one's models predate the computations' graphs.)
  reference = _api_process("ifca", num_groups=2)
  state = reference.initialize(data)
  for m, w in zip(reference.get_model_weights(state), start):
    np.testing.assert_array_equal(m.trainable[0], w[0])
  state = _same_rounds(reference, state, data, whole)
  for j, m in enumerate(reference.get_model_weights(state)):
    for a, b in zip(list(m.trainable) + list(m.non_trainable), final["models"]):
      np.testing.assert_allclose(a, b[j], rtol=1e-5, atol=1e-6)
  assert not np.allclose(final["models"][0][0], final["models"][0][1])  # two clusters


# The algorithms whose round is TensorFlow end to end (no per-client keys or
# states from the host), with what their definitions need besides options.
LEARNING_PROCESSES = {"fedavg": {}, "fedavgm": {}, "fedmom": {}, "slowmo": {},
                      "fedprox": {"mu": 0.1}, "mime": {}, "mime_lite": {},
                      "ifca": {"num_groups": 2}, "cfl_mgd": {"num_groups": 2}}


@pytest.mark.parametrize("algo", sorted(LEARNING_PROCESSES))
def test_every_end_to_end_round_runs_under_train_model(algo, data, tmp_path):
  from tff_cluster.tff_program import build_learning_process
  extra = {"data": data} if algo == "cfl_mgd" else {}  # its definition reads the clients

  k = LEARNING_PROCESSES[algo].get("num_groups")
  start = [_initial(SEED + j) for j in range(k)] if k else _initial()  # K different models

  def process(source):
    return build_learning_process(algo, _model, models.SPARSE_CE_LOGITS, source.element_spec,
                                  start, LR, LEARNING_PROCESSES[algo], **extra)

  metrics, version, weights, _ = _train_model(data, tmp_path, 2, process)
  assert version == 2 and sorted(metrics) == [1, 2]
  train = metrics[2]["model_metrics"]
  assert float(train["num_examples"]) > 0 and np.isfinite(float(train["loss"]))
  assert any(np.abs(w - w0).max() > 1e-4 for w, w0 in zip(weights, _initial()))


def test_a_round_that_needs_the_host_is_refused_in_one_line(data):
  from tff_cluster.tff_program import build_learning_process
  spec = _source(data).element_spec
  for algo, options in (("fesem", {"num_groups": 2}), ("wecfl", {"num_groups": 2})):
    with pytest.raises(ValueError, match=f"{algo}'s train round takes per-client keys"):
      build_learning_process(algo, _model, models.SPARSE_CE_LOGITS, spec, _initial(), LR,
                             options)
  # FedGroup's state holds no model a LearningProcess gives: its rounds need
  # the host (pre-training, newcomers), and it says what to use instead.
  with pytest.raises(ValueError, match=r"fedgroup's rounds need the host's steps between its "
                     r"computations \(pretrain, newcomer, warm\).*valid: train_program\("
                     r"api.build\('fedgroup', ..., runner='tff'\)"):
    build_learning_process("fedgroup", _model, models.SPARSE_CE_LOGITS, spec, _initial(), LR,
                           {"num_groups": 2})
  two = [_initial(SEED), _initial(SEED + 1)]
  with pytest.raises(ValueError, match="valid: 0..1"):
    build_learning_process("ifca", _model, models.SPARSE_CE_LOGITS, spec, two, LR,
                           {"num_groups": 2}, model_index=2)
  # K identical starting models (or one model's weights for K = 2): every
  # client's choice would tie to model 0.
  for same in (_initial(), [_initial(), _initial()]):
    with pytest.raises(ValueError, match="the 2 starting models of ifca are identical"):
      build_learning_process("ifca", _model, models.SPARSE_CE_LOGITS, spec, same, LR,
                             {"num_groups": 2})
  # A start other than K given models is the host's work before round 1.
  with pytest.raises(ValueError, match="ifca_init='fedavg_warm' is a host step before round 1"):
    build_learning_process("ifca", _model, models.SPARSE_CE_LOGITS, spec, two, LR,
                           {"num_groups": 2, "ifca_init": "fedavg_warm"})


def _program(data, root, rounds, algo, options, runner="tff", per_round=PER_ROUND):
  """`train_program` of `algo` into a `FileProgramStateManager` at `root`;
  returns the released metrics by round and the final state's models."""
  import collections
  import tensorflow_federated as tff
  from tff_cluster.tff_program import ProcessBytes, train_program
  process = _api_process(algo, runner=runner, **options)
  metrics = tff.program.MemoryReleaseManager()
  manager = tff.program.FileProgramStateManager(str(root))
  source = _source(data)
  asyncio.run(train_program(process, data, train_data_source=source,
                            train_per_round_clients=per_round, train_total_rounds=rounds,
                            program_state_manager=manager, train_metrics_manager=metrics))
  saved, version = asyncio.run(manager.load_latest(collections.OrderedDict(
      round=0, data=source.iterator(), process=ProcessBytes())))
  assert version == rounds and int(saved["round"]) == rounds
  return dict(metrics.values()), process, process.state_from_bytes(saved["process"].payload)


def test_the_fedgroup_program_resumes_exactly_and_equals_the_tff_runner(data, tmp_path):
  """FedGroup's cold start, clustering and newcomers run inside the program;
  stopped after round 2 and started again, it ends as an uninterrupted one."""
  options = {"num_groups": 2}
  whole, process, final = _program(data, tmp_path / "whole", 3, "fedgroup", options)
  assert sorted(whole) == [1, 2, 3] and all(np.isfinite(m["train_loss"]) for m in whole.values())
  _program(data, tmp_path / "stopped", 2, "fedgroup", options)
  rest, resumed_process, resumed = _program(data, tmp_path / "stopped", 3, "fedgroup", options)
  assert sorted(rest) == [3] and rest[3] == whole[3]
  for m, n in zip(process.get_model_weights(final), resumed_process.get_model_weights(resumed)):
    for a, b in zip(m.trainable, n.trainable):
      np.testing.assert_array_equal(a, b)
  # The same rounds driven by hand on the tff runner, on the source's clients.
  reference = _api_process("fedgroup", runner="tff", **options)
  state = reference.initialize(data)
  it = _source(data).iterator()
  for round_num in (1, 2, 3):
    out = reference.next(state, it.next_clients(PER_ROUND))
    state = out.state
    assert out.metrics["train_loss"] == whole[round_num]["train_loss"]
  for m, n in zip(process.get_model_weights(final), reference.get_model_weights(state)):
    for a, b in zip(m.trainable, n.trainable):
      np.testing.assert_array_equal(a, b)


# The algorithms with host steps between or around their rounds' computations.
PROGRAMS = ("fedgroup", "fedgrouprox", "wecfl", "fesem", "cfl", "flhc", "pacfl", "stocfl",
            "fedsoft", "hypcluster", "pfedmo")


@pytest.mark.parametrize("algo", PROGRAMS)
def test_every_host_step_algorithm_runs_as_a_program_and_resumes(algo, data, tmp_path):
  """2 rounds; stopped after round 1 and started again, round 2 the same."""
  from tff_cluster import registry
  spec = registry.get_algorithm(algo)
  names = {h.name for h in spec.hparams}
  options = {k: v for k, v in (("num_groups", 2), ("mu", 0.1)) if k in names}
  per_round = data.num_training_clients if spec.all_clients else PER_ROUND
  metrics, process, state = _program(data, tmp_path / "whole", 2, algo, options,
                                     per_round=per_round)
  assert sorted(metrics) == [1, 2] and all(np.isfinite(m["train_loss"]) for m in metrics.values())
  assert state.round_num == 2 and process.get_model_weights(state)
  _program(data, tmp_path / "stopped", 1, algo, options, per_round=per_round)
  rest, _, _ = _program(data, tmp_path / "stopped", 2, algo, options, per_round=per_round)
  assert sorted(rest) == [2]
  differ = {k for k in metrics[2]  # (an empty group's accuracy is NaN on both)
            if not np.array_equal(rest[2][k], metrics[2][k], equal_nan=True)}
  assert not differ, {k: (rest[2][k], metrics[2][k]) for k in differ}


def test_train_models_evaluation_manager_evaluates_the_process_model(data, tmp_path):
  """`train_model`'s evaluation manager takes the LearningProcess's model as
  it is: TFF's own federated evaluation (`build_fed_eval` over the Keras
  model) sets it with `set_model_weights` and releases its metrics."""
  import datetime
  import tensorflow_federated as tff
  from tff_cluster.runners.tff import runtime
  from tff_cluster.tff_program import build_learning_process
  source = _source(data)
  process = build_learning_process("fedavg", _model, models.SPARSE_CE_LOGITS,
                                   source.element_spec, _initial(), LR)

  def tff_model():
    return tff.learning.models.from_keras_model(
        _model(), loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=source.element_spec,
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])

  evaluation = tff.learning.algorithms.build_fed_eval(tff_model)
  per_round = tff.program.MemoryReleaseManager()
  totals = tff.program.MemoryReleaseManager()
  manager = tff.learning.programs.EvaluationManager(
      data_source=source, aggregated_metrics_manager=totals,
      create_state_manager_fn=lambda key: tff.program.FileProgramStateManager(
          str(tmp_path / "eval" / key)),
      create_process_fn=lambda key: (evaluation, per_round),
      cohort_size=4, duration=datetime.timedelta(0))  # one evaluation round each
  context = tff.program.NativeFederatedContext(runtime.async_context())
  with tff.framework.get_context_stack().install(context):
    asyncio.run(tff.learning.programs.train_model(
        train_process=process, train_data_source=source, train_per_round_clients=PER_ROUND,
        train_total_rounds=2, program_state_manager=tff.program.FileProgramStateManager(
            str(tmp_path / "train")),
        model_output_manager=tff.program.MemoryReleaseManager(),
        train_metrics_manager=None, evaluation_manager=manager, evaluation_periodicity=1))
  released = dict(totals.values())
  assert sorted(released) == [1, 2]  # one evaluation per training round
  # Round 1's evaluation is of round 1's model (the same program without the
  # evaluation), on the first cohort a fresh iterator of the source draws.
  _, _, weights, _ = _train_model(data, tmp_path / "one_round", 1)
  model = _model()
  model.set_weights(weights)
  batches = [b for ds in _source(data).iterator().select(4) for b in ds.as_numpy_iterator()]
  x = np.concatenate([b["x"] for b in batches])
  y = np.concatenate([b["y"] for b in batches])
  accuracy = float(np.mean(np.argmax(model(x).numpy(), axis=1) == y))
  got = released[1]["model_metrics"]
  assert int(got["num_examples"]) == len(y)
  np.testing.assert_allclose(float(got["sparse_categorical_accuracy"]), accuracy, rtol=1e-6)
