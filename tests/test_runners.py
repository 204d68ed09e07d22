"""The two runners: same batches, same maths, same numbers; device and jit choice."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from tff_cluster import tasks
from tests.conftest import REPO_ROOT, tiered
from tff_cluster import models, registry
from tff_cluster.host import loop
from tff_cluster.host.driver import TrainingConfig, initial_weights
from tff_cluster.runners.config import RunnerConfig
from tff_cluster.learning import evaluation, schedule
from tff_cluster.learning import trainers
from tff_cluster.algorithms.fedavg import fedavg
from tff_cluster.core.definition import Definition
from tff_cluster.io.results import ResultsWriter
from tff_cluster.learning import optimizers
from tff_cluster.runners import local_runner
from tff_cluster.spec.task import DataOptions, TaskSpec

# ---------------------------------------------------------------------------
# Parity: every registered algorithm, both runners, same seed -> same numbers.
# A new algorithm must add its case here (test_every_algorithm_has_a_parity_case).

# Each algorithm's runner-parity cases, declared on its spec
# (`AlgorithmSpec.parity`, beside its rule). A case's keys starting with "_"
# are the test's own: `_config` (settings of the run), `_model` (a model of
# the task instead of its MCLR) and `_weights_atol`.
PARITY_CASES = {name: [dict(case) for case in spec.parity]
                for name, spec in registry.ALGORITHMS.items()}
# Local-solver settings every algorithm shares, run on both runners too.
SOLVER_CASES = {
    "epochs": dict(local_epochs=2),
    "steps_momentum_persist_decay": dict(local_epochs=None, local_steps=7,
                                         client_momentum=0.9, client_state="persist",
                                         lr_decay=0.9),
}
ROUNDS = 4
RTOL, ATOL = 1e-4, 1e-6


def test_every_algorithm_has_a_parity_case():
  assert set(PARITY_CASES) == set(registry.ALGORITHMS), (
      "every registered algorithm needs a runner parity case in PARITY_CASES")


@pytest.fixture(scope="module")
def cluster_data():
  task = tasks.get_task("synthetic_clusters")
  data = task.load_data(DataOptions(seed=2, num_clients=24, extra={"num_clusters": 3}))
  return task, data


# Algorithms whose momentum is their own (CFL-MGD's beta): --client_momentum
# is refused for them, the rest of a solver case applies.
OWN_MOMENTUM = {a for a, spec in registry.ALGORITHMS.items() if spec.own_momentum}


# Algorithms where every client takes part in every round (cross-silo).
ALL_CLIENTS = {a for a, spec in registry.ALGORITHMS.items() if spec.all_clients}


def with_case_model(task, options):
  """(task, options) with a case's `_model` (if any) in place of the task's
  model, and the options without `_model` and `_weights_atol` (the test's
  own keys)."""
  options = dict(options)
  options.pop("_weights_atol", None)
  name = options.pop("_model", None)
  if name is None:
    return task, options
  return task.with_model(name), options


def solver_for(algo, solver):
  if algo in OWN_MOMENTUM:
    return {k: v for k, v in solver.items() if k not in ("client_momentum", "client_state")}
  return solver


def _run(task, data, algo, options, runner, tmp_path, solver, rounds=ROUNDS):
  settings = solver_for(algo, solver)
  task, options = with_case_model(task, options)
  config = TrainingConfig.checked(**{
      "rounds": rounds, "batch_size": 10, "client_lr": 0.02,
      "clients_per_round": data.num_clients if algo in ALL_CLIENTS else 8,
      "seed": 1, "runner": runner, **settings, **options.pop("_config", {})})
  driver = registry.build_driver(algo, task, data, config, **options)
  writer = ResultsWriter(str(tmp_path / runner), loop.columns(driver), tensorboard=False,
                         figures=False)
  summary = loop.run_training(task, data, config, driver, writer, progress=False)
  writer.close()
  weights, client_model = driver.eval_models()
  return writer.rows, summary, weights, client_model


def _assert_same_rows(rows_a, rows_b):
  assert len(rows_a) == len(rows_b)
  for a, b in zip(rows_a, rows_b):
    assert set(a) == set(b)
    for key in a:
      if key in ("round_seconds", "eval_seconds"):
        continue
      if key.endswith("accuracy") and a[key] is not None and np.isnan(a[key]):
        assert b[key] is None or np.isnan(b[key]), key
      elif key.endswith(("accuracy", "_size")) or key.startswith(("num_", "bytes")) \
          or key in ("round", "ari", "purity"):
        assert a[key] == b[key], (a["round"], key, a[key], b[key])
      else:
        np.testing.assert_allclose(a[key], b[key], rtol=RTOL, atol=ATOL, err_msg=key)


def assert_same_run(a, b, weights_atol=ATOL):
  """Two `_run` results: the same rows, group assignments and final
  assignment, weights within RTOL / `weights_atol`."""
  rows_a, summary_a, weights_a, model_a = a
  rows_b, summary_b, weights_b, model_b = b
  _assert_same_rows(rows_a, rows_b)
  evaluation.deployment(model_a).assert_same(model_b, rtol=RTOL, atol=ATOL)
  if "final_assignment" in summary_a:
    assert summary_a["final_assignment"] == summary_b["final_assignment"]
  for wa, wb in zip(weights_a, weights_b):
    for x, y in zip(wa, wb):
      np.testing.assert_allclose(x, y, rtol=RTOL, atol=weights_atol)


# Algorithms whose clients run another one's client function: the server-
# momentum variants (FedAvgM, FedMom, SlowMo, FedAdam, FedYogi, FedAdagrad: a
# server step only) and the ensembles FedAvg's or FedProx's; FedPer, LG-FedAvg
# and FedBN FedRep's split definition in one phase; local-only and FedAvg + FT
# Ditto's two trainings; FedGrouProx FedGroup's with FedProx's clients; WeCFL,
# FeSEM, CFL, FL+HC, PACFL, StoCFL and HypCluster FedAvg's or IFCA's with
# other server or host steps. The local solvers' settings (steps, momentum kept
# per client, decay) live in those client functions and the client-state
# store, so these run them through their own parity case with the first solver
# only (CI's time; TFF_CLUSTER_EXHAUSTIVE=1 runs both).
SAME_CLIENTS = ("fedavgm", "fedmom", "slowmo", "fedadam", "fedyogi", "fedadagrad",
                "fedavg_plus", "fedprox_plus", "fedper", "lg_fedavg", "fedbn", "local_only",
                "fedavg_ft")
HOST_STEPS_ONLY = ("fedgrouprox", "wecfl", "fesem", "cfl", "flhc", "pacfl", "stocfl",
                   "hypcluster")


def representative(algo):
  """Whether CI runs a per-algorithm check for `algo` outside its slices: it
  has a client function, client state or per-client result of its own (not
  in SAME_CLIENTS or HOST_STEPS_ONLY)."""
  return algo not in SAME_CLIENTS + HOST_STEPS_ONLY


# Algorithms whose local optimizer starts afresh every round (pFedGraph's,
# FedPAC's and FedGWC's, as their authors' code builds a new SGD each round) or that take
# one gradient (CFL-GP's default): the persisted-momentum solver case runs
# the client code the epochs case runs, so CI keeps the first solver only.
FRESH_SOLVER = ("cflgp", "pfedgraph", "fedpac", "fedgwc", "hcflplus")


# The second solver (steps, momentum kept per client across rounds, decay)
# in CI for the algorithms whose clients keep more than one model's or
# optimizer's state, or whose local step is an optimizer of their own over
# the persisted momentum: FedAvg's one model, IFCA's chosen cluster model,
# FedEM's K, Ditto's personal and global, FedRep's two phases, Mime's server
# statistics beside the client momentum, pFedMo's momentum. The other
# representative algorithms run it in the slices (CI's time: 10-15 s a case
# on the TFF stack); their first solver is in CI.
SECOND_SOLVER_KINDS = ("fedavg", "ifca", "fedem", "ditto", "fedrep", "mime", "pfedmo")


def _parity_params():
  """Every case with both local solvers. In the CI tier: each algorithm's
  first case with the first solver, and with the second for
  SECOND_SOLVER_KINDS; the others exhaustive-only (CI runs a slice)."""
  first = sorted(SOLVER_CASES)[0]
  return tiered([(a, i, s) for a, cases in sorted(PARITY_CASES.items())
                 for i in range(len(cases)) for s in sorted(SOLVER_CASES)],
                lambda c: c[1] == 0 and (c[2] == first or c[0] in SECOND_SOLVER_KINDS))


def test_the_representative_sets_name_registered_algorithms():
  assert set(SAME_CLIENTS + HOST_STEPS_ONLY) <= set(PARITY_CASES)
  assert all(representative(a) and a not in FRESH_SOLVER for a in SECOND_SOLVER_KINDS)


@pytest.mark.parametrize("algo,case,solver", _parity_params())
@pytest.mark.tff
@pytest.mark.xla
def test_runners_give_the_same_numbers(algo, case, solver, cluster_data, tmp_path):
  task, data = cluster_data
  options = PARITY_CASES[algo][case]
  out = {r: _run(task, data, algo, options, r, tmp_path, SOLVER_CASES[solver])
         for r in ("tff", "local")}
  assert_same_run(out["tff"], out["local"], options.get("_weights_atol", ATOL))
  assert len(out["tff"][0]) == ROUNDS
  # The run trained: the models moved away from their start.
  rows_tff = out["tff"][0]
  assert rows_tff[-1]["train_loss"] < rows_tff[0]["train_loss"] * 1.5


def _bn_task():
  rng = np.random.default_rng(0)

  def load(options):
    from tff_cluster.data.federated import FederatedData
    ids = [f"c{i}" for i in range(4)]
    sizes = [13, 7, 20, 11]  # partial last batches
    train = {c: (rng.random((n, 784), np.float32), rng.integers(0, 10, n).astype(np.int32))
             for c, n in zip(ids, sizes)}
    test = {c: (rng.random((5, 784), np.float32), rng.integers(0, 10, 5).astype(np.int32))
            for c in ids}
    return FederatedData(ids, train, test, 10, description="random images")

  return TaskSpec(name="bn", description="", load_data=load, model_fn=models.fmnist_cnn,
                  loss=models.SPARSE_CE_LOGITS, defaults={})


@pytest.mark.tff
def test_batchnorm_model_parity_with_partial_batches(tmp_path):
  """BatchNorm's batch statistics see only a batch's real examples on both runners."""
  task = _bn_task()
  data = task.load_data(None)
  out = {}
  for runner in ("tff", "local"):
    config = TrainingConfig(rounds=2, clients_per_round=3, local_epochs=1,
                                       batch_size=5, client_lr=0.01, seed=0,
                                       runner=RunnerConfig(runner))
    driver = registry.build_driver("fedavg", task, data, config)
    if runner == "local":
      assert driver.describe()["exact_batches"] and driver.describe()["jit"] is False
    loop.run_training(task, data, config, driver, progress=False)
    out[runner] = driver.model_weights()
  for a, b in zip(out["tff"], out["local"]):  # moving mean/variance included
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=1e-5)


@pytest.mark.tff
def test_fedavg_learning_process_equals_the_tff_runner():
  """`build_fedavg` (LearningProcess) and the tff runner share the client work."""
  data = tasks.get_task("synthetic").load_data(DataOptions(seed=0, num_clients=6))
  model_fn = lambda: models.mclr(60, 10)  # noqa: E731
  init = models.get_weights(model_fn())
  work = schedule.LocalWork(10, epochs=2)
  clients = [0, 2, 3]
  element_spec = schedule.client_dataset(
      *data.train[data.client_ids[0]], 10, 1, 0).element_spec
  process = fedavg.build_fedavg(model_fn, models.SPARSE_CE_LOGITS, element_spec, init,
                                0.01, mu=0.3)
  from tff_cluster.runners.tff import runner as tff_runner
  specs = models.weights_type_spec(model_fn())
  runner = tff_runner.TffRunner(fedavg.FedAvgDefinition(specs, 2, mu=0.3, weighting="processed"), model_fn,
                                models.SPARSE_CE_LOGITS, data, seed=0)
  state = process.next(process.initialize(), runner.datasets(clients, 1, work)).state
  out = runner.run("train", fedavg.FedAvgDefinition(specs, 2, mu=0.0, weighting="processed").initial_state(init), clients,
                   1, work, 0.01)
  lp = process.get_model_weights(state)
  for a, b in zip(list(lp.trainable) + list(lp.non_trainable), out.state["model"]):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------------------
# Same batches.


@pytest.mark.parametrize("n,work", [
    (25, schedule.LocalWork(10, epochs=3)),
    (25, schedule.LocalWork(10, steps=7)),
    (30, schedule.LocalWork(10, steps=2)),
    (4, schedule.LocalWork(10, epochs=2)),
])
def test_padded_batches_are_the_datasets_batches(n, work):
  x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
  y = np.arange(n, dtype=np.int32)
  offset = 11
  expected = list(schedule.work_dataset(x, y, work, seed=5).as_numpy_iterator())
  padded = schedule.padded_batches(n, offset, work, seed=5, total_steps=40)
  assert int(padded.num_steps) == len(expected) == work.num_steps(n)
  assert padded.indices.shape == (40, work.batch_size) and len(padded.sizes) == 40
  for i, batch in enumerate(expected):
    size = int(padded.sizes[i])
    assert size == len(batch["y"])
    np.testing.assert_array_equal(padded.indices[i, :size] - offset, batch["y"])
  assert not padded.sizes[len(expected):].any()


def test_local_steps_cycle_through_reshuffled_epochs():
  n, work = 25, schedule.LocalWork(10, steps=7)
  y = np.arange(n, dtype=np.int32)
  batches = [b["y"] for b in schedule.work_dataset(
      np.zeros((n, 1), np.float32), y, work, seed=3).as_numpy_iterator()]
  assert [len(b) for b in batches] == [10, 10, 5, 10, 10, 5, 10]
  first, second = np.concatenate(batches[:3]), np.concatenate(batches[3:6])
  assert sorted(first) == sorted(second) == list(range(n))
  assert list(first) != list(second)  # each pass reshuffled


# ---------------------------------------------------------------------------
# Local SGD maths.


def _softmax_grad(w, b, x, y):
  logits = x @ w + b
  p = np.exp(logits - logits.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  p[np.arange(len(y)), y] -= 1.0
  return x.T @ p / len(y), p.mean(0)


@pytest.mark.parametrize("trainer_kind", ["dataset", "padded"])
def test_heavy_ball_steps_match_hand_computation(trainer_kind):
  """v <- beta v + g; w <- w - lr v, over 3 steps, from a given velocity."""
  rng = np.random.default_rng(0)
  n, d, c, lr, beta = 6, 4, 3, 0.5, 0.9
  x = rng.normal(size=(n, d)).astype(np.float32)
  y = rng.integers(0, c, n).astype(np.int32)
  model = models.mclr(d, c)
  w0 = [rng.normal(size=(d, c)).astype(np.float32), rng.normal(size=c).astype(np.float32)]
  v0 = [rng.normal(size=(d, c)).astype(np.float32), rng.normal(size=c).astype(np.float32)]
  work = schedule.LocalWork(2, steps=3)
  if trainer_kind == "dataset":
    trainer = trainers.DatasetTrainer(model, models.SPARSE_CE_LOGITS)
    data = schedule.work_dataset(x, y, work, seed=1)
  else:
    trainer = trainers.PaddedTrainer(model, models.SPARSE_CE_LOGITS, tf.constant(x),
                                           tf.constant(y))
    data = schedule.PaddedBatches(*[tf.constant(t) for t in
                                          schedule.padded_batches(n, 0, work, 1)])
  out = tf.function(lambda: trainer.train(w0, data, lr, optimizers.heavy_ball(beta), (v0,)))()
  order = [b["y"] for b in schedule.work_dataset(
      np.zeros((n, 1), np.float32), np.arange(n, dtype=np.int32), work, 1).as_numpy_iterator()]
  w, b = [t.astype(np.float64) for t in w0]
  vw, vb = [t.astype(np.float64) for t in v0]
  for rows in order:
    gw, gb = _softmax_grad(w, b, x[rows], y[rows])
    vw, vb = beta * vw + gw, beta * vb + gb
    w, b = w - lr * vw, b - lr * vb
  np.testing.assert_allclose(out.delta[0], w - w0[0], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(out.delta[1], b - w0[1], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(out.velocity[0], vw, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(out.velocity[1], vb, rtol=1e-4, atol=1e-5)


def test_client_momentum_buffer_persists_or_resets(cluster_data):
  task, data = cluster_data
  base = dict(rounds=2, clients_per_round=24, local_epochs=1, batch_size=10,
              client_lr=0.02, seed=0, client_momentum=0.5)
  runs = {}
  for state in ("persist", "reset"):
    config = TrainingConfig(client_state=state, **base)
    driver = registry.build_driver("fedavg", task, data, config)
    driver.setup()
    driver.run_round(1, np.arange(24))
    kept = dict(driver.client_states)
    driver.run_round(2, np.arange(24))
    runs[state] = (kept, driver.model_weights())
  kept, _ = runs["persist"]
  assert sorted(kept) == list(range(24))
  assert all(np.abs(np.asarray(s["velocity"][0])).sum() > 0 for s in kept.values())
  assert runs["reset"][0] == {}
  # Round 1 is the same; round 2 starts from the kept buffers, so differs.
  assert any(not np.allclose(a, b) for a, b in zip(runs["persist"][1], runs["reset"][1]))


def test_learning_rate_decays_per_round():
  config = TrainingConfig(rounds=3, clients_per_round=1, local_epochs=1,
                                     batch_size=1, client_lr=0.1, lr_decay=0.5)
  assert [config.lr_at(t) for t in (0, 1, 2, 3)] == [0.1, 0.1, 0.05, 0.025]


@pytest.mark.parametrize("runner", ["tff", "local"])
def test_runners_reject_out_of_range_keys(runner, cluster_data):
  task, data = cluster_data
  config = TrainingConfig(rounds=1, clients_per_round=2, local_epochs=1,
                                     batch_size=10, client_lr=0.01,
                                     runner=RunnerConfig(runner))
  driver = registry.build_driver("fedgroup", task, data, config,
                                                            num_groups=2)
  state = driver.definition.initial_state(initial_weights(task, 0))
  with pytest.raises(ValueError, match=r"invalid client keys \[2\]; valid: 0..1"):
    driver.runner.run("warm", state, [0, 1], 1, config.local_work, 0.01, keys=[0, 2])


# ---------------------------------------------------------------------------
# Device and jit choice; no TFF where it is not needed.


@pytest.mark.xla
def test_gpu_is_chosen_when_tensorflow_sees_one(monkeypatch, cluster_data):
  real = tf.config.list_physical_devices
  fake_gpu = tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")
  monkeypatch.setattr(tf.config, "list_physical_devices",
                      lambda kind=None: [fake_gpu] if kind == "GPU" else real(kind))
  assert local_runner.choose_device() == "/GPU:0"
  # On a GPU, XLA pays for every model without batch statistics.
  assert local_runner.resolve_jit("auto", "cnn", False, "/GPU:0") is True
  task, data = cluster_data
  config = TrainingConfig(rounds=1, clients_per_round=2, local_epochs=1,
                                     batch_size=10, client_lr=0.01)
  info = registry.build_driver("fedavg", task, data, config).describe()
  assert info["device"] == "/GPU:0" and info["jit"] is True


@pytest.mark.xla
def test_jit_choice_on_cpu():
  assert local_runner.choose_device() == "/CPU:0"
  assert local_runner.resolve_jit("auto", "dense", False, "/CPU:0") is True
  assert local_runner.resolve_jit("auto", "cnn", False, "/CPU:0") is False
  assert local_runner.resolve_jit("auto", "rnn", False, "/CPU:0") is False
  assert local_runner.resolve_jit("auto", "cnn", True, "/GPU:0") is False
  assert local_runner.resolve_jit("off", "dense", False, "/GPU:0") is False
  with pytest.raises(ValueError, match="--jit=on for a model with BatchNorm"):
    local_runner.resolve_jit("on", "cnn", True, "/CPU:0")
  assert models.model_family(models.fmnist_cnn()) == "cnn"
  assert models.has_batch_statistics(models.fmnist_cnn())
  assert not models.has_batch_statistics(models.lenet5())
  assert models.model_family(models.mlp(4, 3, 2)) == "dense"


@pytest.mark.xla
def test_a_process_near_the_kernels_map_limit_refuses_an_xla_runner(monkeypatch, cluster_data):
  """Refused in one line, not compiled into a segmentation fault: TensorFlow
  keeps XLA's code for the life of the process, about 10.5 maps a function."""
  check = local_runner.check_map_headroom
  check((65530 - local_runner.MAP_HEADROOM, 65530))  # exactly the headroom: allowed
  with pytest.raises(local_runner.CompiledCodeLimit) as e:
    check((65530 - local_runner.MAP_HEADROOM + 1, 65530))
  assert "61,531 of the 65,530 memory maps" in str(e.value)
  assert "jit='off'" in str(e.value) and "\n" not in str(e.value)
  check(None)  # a system that does not say: no check
  held, limit = local_runner.memory_maps()  # Linux: this process's maps, the limit
  assert 0 < held < limit
  task, data = cluster_data
  monkeypatch.setattr(local_runner, "memory_maps", lambda: (limit - 10, limit))
  config = dict(rounds=1, clients_per_round=2, local_epochs=1, batch_size=10,
                client_lr=0.01)
  with pytest.raises(local_runner.CompiledCodeLimit):  # MCLR: XLA on a CPU
    registry.build_driver("fedavg", task, data, TrainingConfig(**config))
  info = registry.build_driver(
      "fedavg", task, data,
      TrainingConfig(**config, runner=RunnerConfig(jit="off"))).describe()
  assert info["jit"] is False  # nothing to compile: allowed


def _python(code: str) -> str:
  out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=str(REPO_ROOT),
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  return out.stdout


def test_declarations_import_without_tensorflow():
  out = _python("""
      import sys
      from tff_cluster import registry
      from tff_cluster.spec import hparams
      registry.all_hparams()
      print(sorted(m for m in ("tensorflow", "tensorflow_federated") if m in sys.modules))
      """)
  assert out.strip() == "[]"


def flags_of(algo):
  return {d.name for d in registry.get_algorithm(algo).hparams}


class _NoTff:
  """A `sys.meta_path` finder that refuses to import TFF, naming the module."""

  def find_spec(self, name, path=None, target=None):
    del path, target
    if name.split(".")[0] == "tensorflow_federated":
      raise ImportError(f"{name} imported by a local-runner run")
    return None


@pytest.mark.parametrize("algo", sorted(registry.ALGORITHMS))
def test_every_algorithm_runs_a_local_round_through_the_cli_without_tff(
    algo, tmp_path, capsys, monkeypatch):
  """One round of every algorithm through the CLI (in this process) on the
  `local` runner, with TFF's import refused: its results written, TFF never
  imported (this phase's interpreter has not imported it: the tests' modules
  import every algorithm's). The quick tier's round of every algorithm."""
  from tests.helpers import main_in_process
  if "tensorflow_federated" in sys.modules:
    pytest.skip("TFF is imported in this process already (the TFF stack's phase)")
  monkeypatch.setattr(sys, "meta_path", [_NoTff(), *sys.meta_path])
  args = [f"--algo={algo}", "--runner=local", "--rounds=1", "--num_clients=12",
          "--local_epochs=1", "--progress=false", f"--output_dir={tmp_path / algo}"]
  if algo not in ALL_CLIENTS:  # every client every round for pFedMo and FedNAG
    args.append("--clients_per_round=3")
  name = PARITY_CASES[algo][0].get("_model")  # where MCLR has no layers to split
  if name:
    args.append(f"--model={name}")
  if "num_groups" in flags_of(algo):
    args.append("--num_groups=2")
  code, _, err = main_in_process(args, capsys)
  assert code == 0, err
  assert "tensorflow_federated" not in sys.modules
  summary = json.loads((tmp_path / algo / "summary.json").read_text())
  assert summary["completed"] and summary["rounds_completed"] == 1


def test_stacked_client_states_equal_numpy_stack_with_shared_and_strided_memory():
  base = np.arange(12, dtype=np.float32).reshape(3, 4)
  # base[:, 0] and base[0, :3] start at the same address with other strides;
  # base[0] is shared by two clients; one leaf is a tensor, one a copy.
  vectors = [base[:, 0], base[0, :3], base[:, 0], tf.constant([7., 8., 9.]),
             base[0, :3].copy() + 1]
  scalars = [np.float32(k) for k in range(5)]
  rows = [base[0], base[0], base[2], base[2].copy(), base[1]]
  states = [{"v": [v, s], "row": r} for v, s, r in zip(vectors, scalars, rows)]
  out = local_runner.stack_client_states(states)
  np.testing.assert_array_equal(out["v"][0].numpy(), np.stack([np.asarray(v) for v in vectors]))
  np.testing.assert_array_equal(out["v"][1].numpy(), np.arange(5, dtype=np.float32))
  np.testing.assert_array_equal(out["row"].numpy(), np.stack(rows))


def test_new_clients_share_one_set_of_initial_state_arrays(cluster_data):
  task, data = cluster_data
  config = TrainingConfig(rounds=1, clients_per_round=2, local_epochs=1,
                                     batch_size=10, client_lr=0.02, seed=0,
                                     client_momentum=0.5, client_state="persist")
  driver = registry.build_driver("fedavg", task, data, config)
  a, b = driver.fresh_client_state("train", 0), driver.fresh_client_state("train", 1)
  assert a is not b
  leaves = list(zip(tf.nest.flatten(a), tf.nest.flatten(b)))
  assert leaves and all(x is y and not np.any(x) for x, y in leaves)
