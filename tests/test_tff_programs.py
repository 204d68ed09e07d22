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


def _initial():
  tf.keras.utils.set_random_seed(SEED)
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


def _train_model(data, root, rounds):
  """FedAvg (`build_fedavg`) under `tff.learning.programs.train_model`, its
  state in a `FileProgramStateManager` at `root`; returns the released
  metrics by round and the final model weights."""
  import tensorflow_federated as tff
  from tff_cluster.algorithms import fedavg
  from tff_cluster.runners.tff import runtime
  source = _source(data)
  process = fedavg.build_fedavg(_model, models.SPARSE_CE_LOGITS, source.element_spec,
                                _initial(), client_lr=LR)
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
          [np.asarray(w) for w in list(weights.trainable) + list(weights.non_trainable)])


def test_train_model_runs_fedavg_and_resumes_exactly(data, tmp_path):
  whole, version, weights = _train_model(data, tmp_path / "whole", 3)
  assert version == 3 and sorted(whole) == [1, 2, 3]
  # tff.learning's metrics layout: the release finds client_work/train and
  # hands it on as model_metrics.
  assert set(whole[3]["model_metrics"]) == {"loss", "loss_sum", "num_examples"}
  # Stopped after round 2, restarted asking for 3: the same model and metrics.
  _train_model(data, tmp_path / "stopped", 2)
  rest, version, resumed = _train_model(data, tmp_path / "stopped", 3)
  assert version == 3 and sorted(rest) == [3]
  assert rest[3] == whole[3]
  for a, b in zip(resumed, weights):
    np.testing.assert_array_equal(a, b)
  # The same three rounds on the `tff` runner (the API's process on the
  # clients the source draws): the same model, and the same mean loss.
  from tff_cluster import api
  process = api.build("fedavg", _model, models.SPARSE_CE_LOGITS, client_lr=LR,
                      local_epochs=1, batch_size=BATCH, seed=SEED, runner="tff",
                      initial_weights=_initial())
  state = process.initialize(data)
  it = _source(data).iterator()
  for round_num in (1, 2, 3):
    out = process.next(state, it.selected_clients(PER_ROUND))
    it.select(PER_ROUND)
    state = out.state
    np.testing.assert_allclose(out.metrics["train_loss"], whole[round_num]["model_metrics"]["loss"],
                               rtol=1e-5)
  (runner_weights,) = process.get_model_weights(state)
  for a, b in zip(list(runner_weights.trainable) + list(runner_weights.non_trainable),
                  weights):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
