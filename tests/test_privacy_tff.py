"""The aggregation slot against TFF's own aggregators (the TFF stack only,
marked `tff`; docs/privacy.md):

* `build_learning_process(..., model_aggregator=factory)`: a `tff.aggregators`
  factory in place of the sum of the update parts, IFCA's and FedAvg's round
  under `tff.learning.programs.train_model`; TFF's DP-FedAvg without noise
  gives our `--aggregator=dp_fixed`'s models, TFF's weighted mean the
  algorithm's own (each cluster's weighted mean), the robust aggregator runs;
* our mechanism against TFF's aggregation processes on fixed client records:
  `gaussian_fixed` without noise, `gaussian_adaptive`'s clip trajectory and
  means, and the noise's first two moments (a statistical test);
* `--aggregator=dp_fixed` (noise on) and `median` give the same IFCA run on
  the `tff` and `local` runners.
"""

from __future__ import annotations

import asyncio
import collections

import numpy as np
import pytest
import tensorflow as tf

from tff_cluster import models, tasks
from tff_cluster.core import mechanisms

from tests.test_tff_programs import BATCH, LR, SEED

pytestmark = pytest.mark.tff

CLIP = 0.5  # an L2 clip that acts on these updates (the DP test checks it)


# The TFF programs' data (8 clients in 2 clusters), model and data source.
from tests.test_tff_programs import _initial, _model, _source, data  # noqa: E402,F401,I001


def _api_process(algo, runner="local", **settings):
  from tff_cluster import api
  if runner == "local":
    settings["jit"] = "off"
  return api.build(algo, _model, models.SPARSE_CE_LOGITS, client_lr=LR, local_epochs=1,
                   batch_size=BATCH, seed=SEED, runner=runner, **settings)


def _flat(weights):
  return [np.asarray(w) for w in list(weights.trainable) + list(weights.non_trainable)]


def _train_model(data, root, rounds, per_round, make_process):
  """`make_process(source)` under `tff.learning.programs.train_model` for
  `rounds` rounds of `per_round` clients, its state in a
  `FileProgramStateManager` at `root`; returns the released metrics by
  round and the process state saved after each round (1..rounds)."""
  import tensorflow_federated as tff
  from tff_cluster.runners.tff import runtime
  source = _source(data)
  process = make_process(source)
  metrics = tff.program.MemoryReleaseManager()
  manager = tff.program.FileProgramStateManager(str(root))
  context = tff.program.NativeFederatedContext(runtime.async_context())

  async def program():
    await tff.learning.programs.train_model(
        train_process=process, train_data_source=source, train_per_round_clients=per_round,
        train_total_rounds=rounds, program_state_manager=manager,
        model_output_manager=tff.program.MemoryReleaseManager(),
        train_metrics_manager=metrics, evaluation_manager=None, evaluation_periodicity=1)
    initial = await tff.program.materialize_value(process.initialize())
    structure = tff.learning.programs.ProgramState(initial, 0, 0, source.iterator())
    return [(await manager.load(version, structure)).state
            for version in range(1, rounds + 1)]

  with tff.framework.get_context_stack().install(context):
    states = asyncio.run(program())
  return dict(metrics.values()), states, process


def _dp_fixed_rounds(algo, data, clip, rounds, options, extra):
  """Our `--aggregator=dp_fixed` (noise multiplier 0, m the number of
  clients) on the local runner: `rounds` rounds of every client (as the data
  source draws them); returns each round's models (a weight list per
  cluster) and the start (a list per cluster for IFCA, one list for FedAvg)."""
  process = _api_process(algo, aggregator="dp_fixed", clip=clip, noise_multiplier=0.0,
                         **options, **extra)
  state = process.initialize(data)
  start = [_flat(m) for m in process.get_model_weights(state)]
  n = data.num_training_clients
  it = _source(data).iterator()
  out = []
  for _ in range(rounds):
    state = process.next(state, it.next_clients(n)).state
    out.append([_flat(m) for m in process.get_model_weights(state)])
  return out, (start if algo == "ifca" else start[0])


def _assert_models(lp_state, ours, key):
  """The LearningProcess state's models (`key`: 'models', K stacked, or
  'model') equal `ours` (a weight list per model) to float tolerance."""
  if key == "model":
    (ours,) = ours
    for a, b in zip(lp_state["model"], ours):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    return
  for j, weights in enumerate(ours):
    for a, b in zip(lp_state["models"], weights):
      np.testing.assert_allclose(a[j], b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("algo", ["ifca", "fedavg"])
def test_tffs_dp_fedavg_without_noise_is_our_dp_fixed(algo, data, tmp_path):
  """TFF's `DifferentiallyPrivateFactory.gaussian_fixed(0, N, C)` as IFCA's
  (K = 2) and FedAvg's aggregator under `train_model`, every client
  training every round (N of them: TFF's denominator N is our m): after
  rounds 1 and 2 its models are our `--aggregator=dp_fixed` run's with
  noise multiplier 0 (`mechanisms.Aggregated`, local runner) on the same
  clients and batches. The clip acts (without it round 1 ends elsewhere),
  so clipping and the cohort-normalised mean of every row are compared."""
  import tensorflow_federated as tff
  from tff_cluster.tff_program import AGGREGATOR_STATE, build_learning_process
  n = data.num_training_clients
  options = {"num_groups": 2} if algo == "ifca" else {}
  extra = {} if algo == "ifca" else {"initial_weights": _initial()}
  # Our runs first: tracing the TFF computations invalidates Keras models
  # made before them (the local runner's).
  ours, start = _dp_fixed_rounds(algo, data, CLIP, 2, options, extra)
  unclipped, _ = _dp_fixed_rounds(algo, data, 1e6, 1, options, extra)
  # The clip acts: without it (C = 1e6) round 1 ends elsewhere.
  assert max(np.abs(a - b).max() for m, o in zip(ours[0], unclipped[0])
             for a, b in zip(m, o)) > 1e-3
  factory = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
      noise_multiplier=0.0, clients_per_round=float(n), clip=CLIP)

  def make(source):
    return build_learning_process(algo, _model, models.SPARSE_CE_LOGITS, source.element_spec,
                                  start, LR, options, model_aggregator=factory)

  metrics, states, process = _train_model(data, tmp_path, 2, n, make)
  assert sorted(metrics) == [1, 2]
  assert set(metrics[2]["aggregator"]) == {"dp_query_metrics", "dp"}
  key = "models" if algo == "ifca" else "model"
  for lp_state, our_models in zip(states, ours):
    _assert_models(lp_state, our_models, key)
  # The aggregator's state rides beside the model(s); get/set_model_weights
  # still give and take one model.
  final = states[-1]
  assert set(final) == {key, AGGREGATOR_STATE}
  weights = process.get_model_weights(final)
  again = process.set_model_weights(final, weights)
  for a, b in zip(_flat(process.get_model_weights(again)), _flat(weights)):
    np.testing.assert_array_equal(a, b)


PER_ROUND = 3


def _ifca_start(data):
  """IFCA's two starting models as the API's seeded set-up draws them (a
  list per cluster), from a process built and dropped before any TFF
  computation is traced."""
  process = _api_process("ifca", num_groups=2)
  return [_flat(m) for m in process.get_model_weights(process.initialize(data))]


def test_tffs_weighted_mean_factory_gives_each_clusters_weighted_mean(data, tmp_path):
  """`tff.aggregators.MeanFactory()` (weighted by each client's w) as IFCA's
  aggregator: its result is sum_i w_i delta_i / W over all the round's
  clients, each delta in its cluster's row; times W and divided by the
  cluster's W_k it is the cluster's own weighted mean, so 2 rounds of 3
  clients give the plain IFCA run's models (local runner, same clients and
  batches)."""
  import tensorflow_federated as tff
  from tff_cluster.tff_program import build_learning_process
  start = _ifca_start(data)
  plain = _api_process("ifca", num_groups=2)
  state = plain.initialize(data)
  it = _source(data).iterator()
  ours = []
  for _ in range(2):
    state = plain.next(state, it.next_clients(PER_ROUND)).state
    ours.append([_flat(m) for m in plain.get_model_weights(state)])

  def make(source):
    return build_learning_process("ifca", _model, models.SPARSE_CE_LOGITS, source.element_spec,
                                  start, LR, {"num_groups": 2},
                                  model_aggregator=tff.aggregators.MeanFactory())

  metrics, states, _ = _train_model(data, tmp_path, 2, PER_ROUND, make)
  assert sorted(metrics) == [1, 2]
  for lp_state, our_models in zip(states, ours):
    _assert_models(lp_state, our_models, "models")
  assert not np.allclose(states[-1]["models"][0][0], states[-1]["models"][0][1])


def test_tffs_robust_aggregator_runs_ifca_under_train_model(data, tmp_path):
  """`tff.learning.robust_aggregator()` (adaptive zeroing and clipping, then
  the weighted mean) as IFCA's aggregator: 2 rounds under `train_model`;
  its measurements are the metrics' `aggregator`, its state the state's
  `model_aggregator`, and get/set_model_weights give and take one model."""
  import tensorflow_federated as tff
  from tff_cluster.tff_program import AGGREGATOR_STATE, build_learning_process
  start = _ifca_start(data)

  def make(source):
    return build_learning_process("ifca", _model, models.SPARSE_CE_LOGITS, source.element_spec,
                                  start, LR, {"num_groups": 2},
                                  model_aggregator=tff.learning.robust_aggregator())

  metrics, states, process = _train_model(data, tmp_path, 2, PER_ROUND, make)
  assert sorted(metrics) == [1, 2]
  assert np.isfinite(float(metrics[2]["model_metrics"]["loss"]))
  measured = metrics[2]["aggregator"]
  assert float(measured["zeroing_norm"]) > 0 and float(measured["zeroing"]["clipping_norm"]) > 0
  final = states[-1]
  assert set(final) == {"models", AGGREGATOR_STATE}
  assert all(np.isfinite(w).all() for w in final["models"])
  assert any(np.abs(w[j] - s[layer]).max() > 1e-4
             for layer, w in enumerate(final["models"]) for j, s in enumerate(start))
  weights = process.get_model_weights(final)
  moved = [w + 1.0 for w in _flat(weights)]
  again = process.set_model_weights(final, tff.learning.models.ModelWeights(
      trainable=moved[:len(weights.trainable)], non_trainable=moved[len(weights.trainable):]))
  for a, b in zip(_flat(process.get_model_weights(again)), moved):
    np.testing.assert_array_equal(a, b)
  # The other cluster's model and the aggregator's state are kept.
  np.testing.assert_array_equal(again["models"][0][1], final["models"][0][1])
  kept = zip(tf.nest.flatten(again[AGGREGATOR_STATE]), tf.nest.flatten(final[AGGREGATOR_STATE]))
  assert all(np.array_equal(a, b) for a, b in kept)


def test_an_algorithm_without_update_parts_or_a_non_factory_is_refused(data):
  import tensorflow_federated as tff
  from tff_cluster.tff_program import build_learning_process
  spec = _source(data).element_spec
  dp = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
      noise_multiplier=0.0, clients_per_round=3.0, clip=1.0)
  with pytest.raises(ValueError) as e:
    build_learning_process("mime", _model, models.SPARSE_CE_LOGITS, spec, _initial(), LR,
                           model_aggregator=dp)
  assert "\n" not in str(e.value)
  assert str(e.value).startswith("model_aggregator with mime: its server does not read only "
                                 "sums of its clients' updates")
  assert "valid: model_aggregator=None, or an algorithm with the aggregation slot" in str(e.value)
  for wrong in ("dp_fixed", mechanisms.Mechanism("dp_fixed")):
    with pytest.raises(ValueError, match=r"^invalid model_aggregator=.*; valid: None, or a "
                       r"tff.aggregators factory: an UnweightedAggregationFactory") as e:
      build_learning_process("fedavg", _model, models.SPARSE_CE_LOGITS, spec, _initial(), LR,
                             model_aggregator=wrong)
    assert "\n" not in str(e.value)


# -- the mechanism against TFF's aggregation processes ----------------------
#
# Six clients' records (deltas) of length 50, norms from well below to well
# above the clips, each with its number of examples (which the private
# mechanisms ignore: uniform weights).
NORMS = (0.09, 0.11, 0.13, 0.5, 2.0, 10.0)
EXAMPLES = (1, 2, 3, 5, 8, 13)
DIM = 50
M = float(len(NORMS))  # the cohort: every client, so TFF's denominator is our m


def _records():
  rng = np.random.default_rng(0)
  directions = rng.normal(size=(len(NORMS), DIM))
  directions /= np.linalg.norm(directions, axis=1, keepdims=True)
  return (directions * np.array(NORMS)[:, None]).astype(np.float32)


def _round(d, state, clients):
  """One round of our wrapper `d` by hand (tests/test_privacy.py's)."""
  from tests.test_privacy import _round as one_round
  return one_round(d, state, clients)


def _ours(mechanism):
  """Our mechanism around FedAvg whose clients' deltas are the records
  (tests/test_privacy.py's `GivenFedAvg`): (the wrapper, its state with a
  zero model, the clients' data)."""
  from tests.test_privacy import GivenFedAvg, _tensors
  d = mechanisms.Aggregated(GivenFedAvg([tf.TensorSpec([DIM], tf.float32)], 1, mu=0.0,
                                        weighting="processed"), mechanism)
  state = _tensors(d.initial_state([np.zeros(DIM, np.float32)]))
  return d, state, [(r, n) for r, n in zip(_records(), EXAMPLES)]


def _tff_process(factory):
  import tensorflow_federated as tff
  from tff_cluster.runners.tff import runtime
  runtime.install()
  return factory.create(tff.TensorType(np.float32, [DIM]))


def _clipped_mean(clip):
  """By hand: sum_i min(1, C / ||r_i||) r_i / m."""
  r = _records().astype(np.float64)
  scale = np.minimum(1.0, clip / np.linalg.norm(r, axis=1))
  return (scale[:, None] * r).sum(axis=0) / M


def test_gaussian_fixed_without_noise_is_our_clip_and_sum_over_m():
  """TFF's `gaussian_fixed(0, m, C)` and our dp_fixed (z = 0, m = 6) on the
  same six records, C = 1 (three records clipped): the same mean, and both
  the hand-computed sum_i min(1, C/||r_i||) r_i / m, to 1e-6."""
  import tensorflow_federated as tff
  process = _tff_process(tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
      noise_multiplier=0.0, clients_per_round=M, clip=1.0))
  theirs = np.asarray(process.next(process.initialize(), list(_records())).result)
  d, state, clients = _ours(mechanisms.Mechanism("dp_fixed", clip=1.0, noise_multiplier=0.0,
                                                 clients_per_round=M))
  new, _ = _round(d, state, clients)
  ours = new["model"][0].numpy()
  np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(ours, _clipped_mean(1.0), rtol=1e-6, atol=1e-6)


def test_gaussian_adaptive_without_noise_follows_our_clip_trajectory():
  """TFF's `gaussian_adaptive(0, m, initial clip 0.1, quantile 0.5, lr 0.2)`
  (noise multiplier 0: its clipped-count stddev is 0 too) and our
  dp_adaptive (z = 0, count stddev 1e-12) for 5 rounds on the same records:
  each round the same mean (clipped at the clip before the round's update)
  and the same new clip, TFF's as its measurements report it
  (`dp_query_metrics/clip`). The clip grows from 0.1 and passes the
  record of norm 0.11 in round 3, so the unclipped fraction goes from 1/6
  to 2/6 along the way."""
  import tensorflow_federated as tff
  clip, lr, quantile = 0.1, 0.2, 0.5
  process = _tff_process(tff.aggregators.DifferentiallyPrivateFactory.gaussian_adaptive(
      noise_multiplier=0.0, clients_per_round=M, initial_l2_norm_clip=clip,
      target_unclipped_quantile=quantile, learning_rate=lr))
  d, state, clients = _ours(mechanisms.Mechanism(
      "dp_adaptive", clip=clip, noise_multiplier=0.0, clients_per_round=M,
      clip_quantile=quantile, clip_lr=lr, clip_count_stddev=1e-12))
  tff_state = process.initialize()
  clips, expected = [], clip
  for _ in range(5):
    out = process.next(tff_state, list(_records()))
    tff_state = out.state
    new, _ = _round(d, state, clients)
    np.testing.assert_allclose(new["model"][0].numpy(), np.asarray(out.result),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(new["model"][0].numpy(), _clipped_mean(expected),
                               rtol=1e-6, atol=1e-6)
    ours = float(new[mechanisms.STATE_KEY]["clip"])
    theirs = float(out.measurements["dp_query_metrics"]["clip"])
    # By hand: the unclipped fraction b; C <- C exp(-lr (b - q)).
    b = np.mean(np.array(NORMS) <= expected)
    expected *= np.exp(-lr * (b - quantile))
    assert ours == pytest.approx(theirs, rel=1e-6) and ours == pytest.approx(expected, rel=1e-6)
    clips.append(ours)
    state = collections.OrderedDict(new)
    state["model"] = [tf.zeros([DIM])]  # each round's mean alone
  assert clips[0] < 0.11 < clips[1]  # round 3 (at clips[1]) left two records unclipped


DRAWS = 400


def test_gaussian_fixed_noise_has_the_documented_moments():
  """Noise on: TFF's `gaussian_fixed(1, m, 1)` and our dp_fixed (z = 1,
  C = 1, m = 6) on the same records, DRAWS = 400 releases each. Each
  coordinate's result minus the noiseless one is N(0, sigma^2),
  sigma = C z / m = 1/6, independent over the 50 coordinates and the draws:
  n = 20000 samples per implementation. Bounds at 6 standard errors
  (two-sided normal tail 2e-9 each, so the test does not flake):
    pooled sample mean: |mean| <= 6 sigma / sqrt(n) = 0.00707;
    sample variance s^2 (n - 1 degrees of freedom): (n - 1) s^2 / sigma^2
      is chi-square(n - 1), mean n - 1 and variance 2 (n - 1), nearly
      normal at this n, so |s^2 / sigma^2 - 1| <= 6 sqrt(2 / (n - 1)) =
      0.060.
  TFF draws its noise unseeded (`tf.random_normal_initializer`, a new draw
  each call); ours is stateless, one draw per release counter (the state's
  `releases`, advanced by each round)."""
  import tensorflow_federated as tff
  z, clip = 1.0, 1.0
  sigma = clip * z / M
  noiseless = _clipped_mean(clip)
  process = _tff_process(tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
      noise_multiplier=z, clients_per_round=M, clip=clip))
  tff_state = process.initialize()
  records = list(_records())
  theirs = np.stack([np.asarray(process.next(tff_state, records).result) - noiseless
                     for _ in range(DRAWS)])
  d, state, clients = _ours(mechanisms.Mechanism("dp_fixed", clip=clip, noise_multiplier=z,
                                                 clients_per_round=M, seed=SEED))
  _, total = _round(d, state, clients)  # the clients' clipped sum, once
  server = tf.function(lambda s, t: d.server_update(s, t, "train"))
  ours = []
  for release in range(DRAWS):
    state[mechanisms.STATE_KEY]["releases"] = tf.constant(release, tf.int32)
    ours.append(server(state, total)["model"][0].numpy() - noiseless)
  ours = np.stack(ours)
  n = DRAWS * DIM
  for name, noise in (("tff", theirs), ("ours", ours)):
    assert noise.shape == (DRAWS, DIM)
    mean, var = noise.mean(), noise.var(ddof=1)
    assert abs(mean) <= 6 * sigma / np.sqrt(n), (name, mean)
    assert abs(var / sigma ** 2 - 1) <= 6 * np.sqrt(2 / (n - 1)), (name, var / sigma ** 2)
  # Ours differs release by release (a new draw each).
  assert not np.allclose(ours[0], ours[1])


# -- the runners ------------------------------------------------------------


def _runner_run(data, runner, tmp_path, **settings):
  """IFCA (K = 2) for 2 rounds of 5 clients on `runner` (the local one
  without XLA), as tests/test_runners.py's parity runs: (rows, summary,
  final models, client model)."""
  from tff_cluster import registry
  from tff_cluster.host import loop
  from tff_cluster.host.driver import TrainingConfig
  from tff_cluster.io.results import ResultsWriter
  task = tasks.get_task("synthetic_clusters")
  config = TrainingConfig.checked(**{
      "rounds": 2, "batch_size": BATCH, "client_lr": LR, "clients_per_round": 5,
      "local_epochs": 1, "seed": 1, "runner": runner,
      **({"jit": "off"} if runner == "local" else {}), **settings})
  driver = registry.build_driver("ifca", task, data, config, num_groups=2)
  writer = ResultsWriter(str(tmp_path / runner), loop.columns(driver), tensorboard=False, figures=False)
  summary = loop.run_training(task, data, config, driver, writer, progress=False)
  writer.close()
  weights, client_model = driver.eval_models()
  return writer.rows, summary, weights, client_model


@pytest.mark.parametrize("settings", [
    {"aggregator": "dp_fixed", "clip": CLIP, "noise_multiplier": 0.5},
    {"aggregator": "median"}], ids=["dp_fixed", "median"])
def test_the_tff_and_local_runners_give_the_same_private_and_robust_run(settings, data,
                                                                       tmp_path):
  """--aggregator=dp_fixed with noise (stateless draws from the seed and the
  release counter: the same on both runners) and median (the host's
  coordinate-wise median per cluster) on IFCA: the same rows (clip and
  epsilon included), assignments and models on the `tff` and `local`
  runners (tests/test_runners.py's tolerances)."""
  from tests.test_runners import assert_same_run
  out = {r: _runner_run(data, r, tmp_path, **settings) for r in ("tff", "local")}
  assert_same_run(out["tff"], out["local"])
  rows, summary = out["tff"][0], out["tff"][1]
  assert len(rows) == 2 and summary["aggregator"] == settings["aggregator"]
  if settings["aggregator"] == "dp_fixed":
    assert summary["dp_releases"] == 2 and 0 < rows[0]["dp_epsilon"] < rows[1]["dp_epsilon"]
