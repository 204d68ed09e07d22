"""Runs that survive: checkpoints, resume, kill -9, divergence, saved models, bad input."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from tff_cluster import tasks
from tests.conftest import REPO_ROOT, shared_data, tiered
from tests.helpers import (SMALL_ARGS, assert_one_line_error, assert_workers_gone,
                           main_in_process,
                           metrics_rows_written, read_metrics_csv, run_watching_workers)
from tests.test_fedprox_nist import write_leaf
from tests.test_runners import (ALL_CLIENTS, OWN_MOMENTUM, PARITY_CASES, SAME_CLIENTS,
                                with_case_model)
from tests.test_sent140_csv import CLI_CASES as SENT140_CLI_CASES
from tff_cluster import interrupts, registry
from tff_cluster.io import checkpoint
from tff_cluster.host import loop
from tff_cluster.host.driver import Diverged, LossRatio, TrainingConfig
from tff_cluster.runners.config import RunnerConfig
from tff_cluster.learning import evaluation
from tff_cluster.spec import hparams as hp
from tff_cluster.io.results import ResultsWriter
from tff_cluster.spec.task import DataOptions

SCRIPT = str(REPO_ROOT / "run_experiment.py")
TIMING = ("round_seconds", "eval_seconds")


_main = main_in_process


def _without_timing(rows):
  return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


# ---------------------------------------------------------------------------
# Save at round k, restore into a fresh driver, finish: the same run.


@pytest.fixture(scope="module")
def small_clusters():
  task = tasks.get_task("synthetic_clusters")
  return task, task.load_data(DataOptions(seed=3, num_clients=20,
                                          extra={"num_clusters": 2}))


def _config(rounds, runner):
  return TrainingConfig(rounds=rounds, clients_per_round=6, local_epochs=1,
                                   batch_size=10, client_lr=0.02, seed=4,
                                   runner=RunnerConfig(runner),
                                   client_momentum=0.5)


def _train(task, data, algo, runner, rounds, run_dir, resume=None):
  task, options = with_case_model(task, {k: v for k, v in PARITY_CASES[algo][0].items()
                                         if k != "_config"})
  config = _config(rounds, runner)
  if algo in OWN_MOMENTUM:
    config = dataclasses.replace(config, client_momentum=0.0)
  if algo in ALL_CLIENTS:
    config = dataclasses.replace(config, clients_per_round=data.num_clients)
  driver = registry.build_driver(algo, task, data, config, **options)
  writer = ResultsWriter(str(run_dir), [*loop.BASE_COLUMNS, *driver.extra_columns],
                         overwrite=True, tensorboard=False, figures=False,
                         resume_rows=None if resume is None else resume["rows"])
  summary = loop.run_training(task, data, config, driver, writer, progress=False,
                                    checkpoint_dir=str(run_dir), checkpoint_every=2,
                                    resume=resume)
  writer.close()
  return writer.rows, summary, driver.eval_models()


# On the tff runner, whose resume goes through the same driver snapshot (the
# server state as numpy, the client states kept in this process), one
# algorithm of each kind of state: plain, a server optimizer's buffer, keys
# and cluster stacks, modes and host steps, splits, an [N, ...] server state,
# per-client mixtures, a personal model, and two modes a round with personal
# weights. On the local runner every algorithm.
TFF_RESUME = ("fedavg", "fedavgm", "ifca", "fedgroup", "cfl", "pfedmo", "fedem", "ditto",
              "fedrep")
RESUME_CASES = [(a, r) for a in sorted(registry.ALGORITHMS) for r in ("tff", "local")
                if r == "local" or a in TFF_RESUME]


@pytest.mark.slow
@pytest.mark.parametrize("algo,runner", RESUME_CASES)
def test_resume_from_a_checkpoint_gives_the_same_run(algo, runner, small_clusters, tmp_path):
  task, data = small_clusters
  whole, split = tmp_path / "whole", tmp_path / "split"
  rows, summary, (weights, client_model) = _train(task, data, algo, runner, 4, whole)
  # The same run stopped after its checkpoint of round 2 (its folder as the
  # round-4 checkpoint was written: without it, the rows after round 2
  # still there), restored into a fresh driver and finished.
  assert checkpoint.rounds(str(whole)) == [2, 4]
  shutil.copytree(whole, split)
  os.remove(checkpoint.path_of(str(split), 4))
  shutil.rmtree(checkpoint.clients_dir(str(split), 4), ignore_errors=True)
  round_num, payload = checkpoint.load_latest(str(split))
  assert round_num == 2 and len(payload["rows"]) == 2
  rows2, summary2, (weights2, client_model2) = _train(task, data, algo, runner, 4,
                                                      tmp_path / "split", resume=payload)
  assert _without_timing(rows2) == _without_timing(rows)
  assert rows2[:2] == rows[:2], "rounds 1-2 trained again: their rows are the checkpoint's"
  evaluation.deployment(client_model).assert_same(client_model2)  # exactly
  for a, b in zip(weights, weights2):
    for x, y in zip(a, b):
      np.testing.assert_array_equal(x, y)
  assert summary2["completed"] and summary2.get("final_assignment") == \
      summary.get("final_assignment")
  assert checkpoint.rounds(str(tmp_path / "split")) == [2, 4]  # the last two kept


def test_the_tff_resume_set_names_registered_algorithms():
  assert set(TFF_RESUME) <= set(registry.ALGORITHMS)


def test_checkpoints_are_atomic_and_fall_back_when_damaged(tmp_path):
  for r in (0, 5, 10):
    checkpoint.save(str(tmp_path), r, {"rows": [r]})
  assert checkpoint.rounds(str(tmp_path)) == [5, 10]
  assert not [n for n in os.listdir(checkpoint.directory(str(tmp_path))) if ".tmp" in n]
  newest = os.path.join(checkpoint.directory(str(tmp_path)), "round-000010.npz")
  with open(newest, "r+b") as f:
    f.truncate(10)
  assert checkpoint.load_latest(str(tmp_path)) == (
      5, {"format": checkpoint.FORMAT, "round": 5, "rows": [5]})


def test_checkpoint_values_round_trip_without_pickle(tmp_path):
  """Every kind of value a run state holds comes back equal and of its type,
  from an archive numpy reads with allow_pickle=False."""
  import collections
  import zipfile
  gen = np.random.default_rng(np.random.SeedSequence([3, 7]))
  gen.random(5)  # mid-stream
  legacy = np.random.RandomState(4)
  legacy.rand(3)
  state = {
      "state": collections.OrderedDict([("w", [np.arange(6, dtype=np.float32).reshape(2, 3),
                                               np.zeros((0,), np.float32)]),
                                        ("round", np.int64(3)), ("b", np.array(True))]),
      "client_states": {0: (np.float32(2.5), np.ones(2)), 17: None},
      "host": {"assignment": np.array([0, -1, 2]), "_rng": gen, "_legacy": legacy,
               "splits": [(1, 2)], "refused": {3, 1}, "name": "x", "__odd": 1},
      "rows": [{"round": 1, "train_loss": float("nan"), "test_loss": float("inf"),
                "x": -float("inf"), "big": 2**70, "ok": True, "none": None}],
  }
  path = checkpoint.save(str(tmp_path), 1, state)
  assert path.endswith("round-000001.npz")
  with zipfile.ZipFile(path) as archive:
    assert all(name.endswith(".npy") for name in archive.namelist())
  with np.load(path, allow_pickle=False) as archive:  # every entry reads without pickle
    assert all(archive[name].dtype != object for name in archive.files)
  round_num, back = checkpoint.load_latest(str(tmp_path))
  assert round_num == 1 and back["format"] == checkpoint.FORMAT
  s = back["state"]
  assert type(s) is collections.OrderedDict and list(s) == ["w", "round", "b"]
  np.testing.assert_array_equal(s["w"][0], state["state"]["w"][0])
  assert s["w"][0].dtype == np.float32 and s["w"][1].shape == (0,)
  assert type(s["round"]) is np.int64 and s["round"] == 3
  assert s["b"].shape == () and bool(s["b"])
  assert set(back["client_states"]) == {0, 17} and back["client_states"][17] is None
  scalar, ones = back["client_states"][0]
  assert type(scalar) is np.float32 and scalar == 2.5 and ones.dtype == np.float64
  host = back["host"]
  assert host["splits"] == [(1, 2)] and host["refused"] == {1, 3} and host["__odd"] == 1
  np.testing.assert_array_equal(host["assignment"], [0, -1, 2])
  np.testing.assert_array_equal(host["_rng"].random(4), gen.random(4))  # the same stream
  np.testing.assert_array_equal(host["_legacy"].rand(4), legacy.rand(4))
  row = back["rows"][0]
  assert math.isnan(row["train_loss"]) and row["test_loss"] == math.inf
  assert row["x"] == -math.inf and row["big"] == 2**70 and row["ok"] is True
  assert row["none"] is None


def test_a_checkpoint_refuses_what_it_cannot_hold_and_pickled_archives(tmp_path):
  class Opaque:
    pass

  with pytest.raises(checkpoint.CheckpointError, match="Opaque"):
    checkpoint.save(str(tmp_path), 1, {"host": Opaque()})
  with pytest.raises(checkpoint.CheckpointError, match="object array"):
    checkpoint.save(str(tmp_path), 1, {"host": np.array([{"a": 1}], dtype=object)})
  assert checkpoint.rounds(str(tmp_path)) == []  # nothing half-written
  # An archive with a pickled (object) entry is never unpickled: not a checkpoint.
  checkpoint.save(str(tmp_path), 1, {"rows": [1]})
  path = checkpoint.path_of(str(tmp_path), 2)
  np.savez(path, __tree__=np.frombuffer(b'{"__array__": "a0"}', np.uint8),
           a0=np.array([{"pickled": 1}], dtype=object))
  assert checkpoint.load_latest(str(tmp_path))[0] == 1


def test_resumed_writer_drops_rows_after_the_checkpoint_and_torn_lines(tmp_path):
  writer = ResultsWriter(str(tmp_path), ["round", "train_loss"], tensorboard=False)
  for r in (1, 2, 3):
    writer.write_round({"round": r, "train_loss": 1.0 / r})
  writer.close()
  with open(tmp_path / "metrics.csv", "a") as f:
    f.write("4,0.2")  # a torn row
  writer = ResultsWriter(str(tmp_path), ["round", "train_loss"], tensorboard=False,
                         resume_rows=writer.rows[:2])
  writer.write_round({"round": 3, "train_loss": 0.5})
  writer.close()
  assert [r["round"] for r in read_metrics_csv(tmp_path / "metrics.csv")] == [1, 2, 3]
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(l)["round"] for l in lines] == [1, 2, 3]
  assert b"\r" not in (tmp_path / "metrics.csv").read_bytes()


# ---------------------------------------------------------------------------
# kill -9 in the middle, then --resume: exactly the uninterrupted run.


def _cli(out_dir, *extra):
  return [sys.executable, SCRIPT, *SMALL_ARGS, "--rounds=16", "--checkpoint_every=3",
          "--seed=5", f"--output_dir={out_dir}", *extra]


def _kill_when(cmd, ready, timeout=240):
  """Starts `cmd`, SIGKILLs it once `ready()` holds; returns its return code."""
  proc = subprocess.Popen(cmd, cwd=str(REPO_ROOT), stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
  deadline = time.monotonic() + timeout
  while proc.poll() is None and not ready():
    assert time.monotonic() < deadline, "the run never got far enough"
    time.sleep(0.02)
  proc.send_signal(signal.SIGKILL)
  return proc.wait(timeout=30)


def _assert_whole_rows(path):
  with open(path, newline="") as f:
    lines = list(csv.reader(f))
  assert all(len(line) == len(lines[0]) for line in lines), "a torn metrics row"


# The tff runner's case (FedGroup) is exhaustive-only (CI's time, about 64 s;
# CI runs it in one slice): its worker going down with a killed run is
# tests/test_runtime.py's test_killed_run_takes_its_worker_down, and its
# resume through the driver's snapshot test_resume_from_a_checkpoint_gives_the_same_run.
@pytest.mark.slow
@pytest.mark.parametrize("algo,runner", tiered([("fedprox", "local"), ("fedgroup", "tff")],
                                               lambda c: c[1] == "local"))
# The local case takes about 45 s: three command-line processes (the
# uninterrupted run, the run killed with SIGKILL mid-round, its resume); a kill
# -9 can only be tested on a process.
def test_kill_9_then_resume_equals_the_uninterrupted_run(algo, runner, tmp_path):
  extra = (f"--algo={algo}", f"--runner={runner}", "--num_groups=3")
  killed = tmp_path / "killed"
  if runner == "tff":
    code, _, _, seen = run_watching_workers(
        _cli(killed, *extra), send_signal=signal.SIGKILL, timeout=240,
        ready=lambda: metrics_rows_written(killed / "metrics.csv") >= 8, cwd=str(REPO_ROOT))
    assert_workers_gone(seen, timeout=5)  # the kernel takes the worker down too
  else:
    code = _kill_when(_cli(killed, *extra),
                      lambda: metrics_rows_written(killed / "metrics.csv") >= 8)
  assert code == -signal.SIGKILL
  written = metrics_rows_written(killed / "metrics.csv")
  assert 8 <= written < 16
  _assert_whole_rows(killed / "metrics.csv")
  summary = json.loads((killed / "summary.json").read_text())
  assert summary["completed"] is False and summary["reason"] == "running"
  assert checkpoint.rounds(str(killed))[-1] in (6, 9, 12, 15)

  resumed = subprocess.run([sys.executable, SCRIPT, "--resume", f"--output_dir={killed}",
                            "--progress=false"], cwd=str(REPO_ROOT), capture_output=True,
                           text=True, timeout=240)
  assert resumed.returncode == 0, resumed.stderr
  whole = subprocess.run(_cli(tmp_path / "whole", *extra), cwd=str(REPO_ROOT),
                         capture_output=True, text=True, timeout=240)
  assert whole.returncode == 0, whole.stderr
  assert _without_timing(read_metrics_csv(killed / "metrics.csv")) == \
      _without_timing(read_metrics_csv(tmp_path / "whole" / "metrics.csv"))
  for name in sorted(os.listdir(tmp_path / "whole" / "models" / "final")):
    if name.endswith(".keras"):
      a = tf.keras.models.load_model(killed / "models" / "final" / name, compile=False)
      b = tf.keras.models.load_model(tmp_path / "whole" / "models" / "final" / name,
                                     compile=False)
      for x, y in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(x, y)
  final = json.loads((killed / "summary.json").read_text())
  assert final["completed"] is True and final["rounds_completed"] == 16


def test_resume_refuses_changed_settings_and_fewer_rounds(tmp_path, capsys):
  out = tmp_path / "run"
  assert _main([*SMALL_ARGS, "--rounds=2", f"--output_dir={out}", "--runner=local"],
               capsys)[0] == 0
  for args, needle in [(["--client_lr=0.5"], "client_lr=0.5 differs from the run's"),
                       (["--algo=fedprox"], "algo=fedprox differs"),
                       (["--rounds=1"], "--rounds=1 is fewer than the run's 2")]:
    code, _, err = _main(["--resume", f"--output_dir={out}", *args], capsys)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
  code, _, err = _main(["--resume", f"--output_dir={tmp_path / 'none'}"], capsys)
  assert code == 2 and "config.json" in err
  code, _, err = _main(["--resume", f"--output_dir={out}", "--rounds=3"], capsys)
  assert code == 0, err
  assert len(read_metrics_csv(out / "metrics.csv")) == 3


# ---------------------------------------------------------------------------
# Divergence.


@pytest.mark.parametrize("algo,round_num", [("fedavg", 1), ("fedgroup", 0)])
def test_divergence_stops_with_exit_3_and_checkpoints_the_last_good_state(
    algo, round_num, tmp_path, capsys):
  out = tmp_path / "run"
  code, _, err = _main([*SMALL_ARGS, f"--algo={algo}", "--rounds=5", "--client_lr=3e38",
                        "--num_groups=2", "--runner=local", f"--output_dir={out}"], capsys)
  lines = [l for l in err.splitlines() if l.startswith("run_experiment.py")]
  assert code == 3 and len(lines) == 1, err
  stage = "the set-up" if round_num == 0 else f"round {round_num}"
  assert f"diverged in {stage}" in lines[0] and "clients" in lines[0]
  assert "Traceback" not in err
  summary = json.loads((out / "summary.json").read_text())
  assert summary["completed"] is False and summary["reason"] == "diverged"
  assert summary["diverged_round"] == round_num and summary["diverged_clients"]
  assert read_metrics_csv(out / "metrics.csv") == []  # no NaN row was written
  if round_num:
    assert checkpoint.rounds(str(out)) == [round_num - 1]


def test_an_exploding_but_finite_loss_is_diverged(tmp_path, capsys):
  """--client_lr=1e30 on Synthetic trains to finite losses near 1e30: stopped in
  round 1 by the loss-ratio rule (exit 3, summary says so); --divergence_ratio=0
  lets the same run finish, as before the rule existed."""
  args = ["--algo=fedavg", "--task=synthetic", "--rounds=3", "--seed=0", "--client_lr=1e30",
          "--progress=false"]
  out = tmp_path / "run"
  code, _, err = _main([*args, f"--output_dir={out}"], capsys)
  lines = [l for l in err.splitlines() if l.startswith("run_experiment.py")]
  assert code == 3 and len(lines) == 1, err
  assert "diverged in round 1: the training loss" in lines[0]
  assert "above --divergence_ratio=100" in lines[0]
  summary = json.loads((out / "summary.json").read_text())
  assert summary["reason"] == "diverged" and summary["diverged_round"] == 1
  assert checkpoint.rounds(str(out)) == [0] and read_metrics_csv(out / "metrics.csv") == []
  off = tmp_path / "off"
  code, _, err = _main([*args, "--divergence_ratio=0", f"--output_dir={off}"], capsys)
  assert code == 0, err
  summary = json.loads((off / "summary.json").read_text())
  assert summary["completed"] and summary["max_loss_ratio"] > 1e25


def test_loss_ratio_by_hand():
  """A zero MCLR predicts uniformly: its loss is ln(10) on every example, so
  the reference is ln(10) whatever clients; 5 ln(10) is ratio 5, refused above 4."""
  from tff_cluster import models
  from tff_cluster.data.federated import FederatedData
  from tff_cluster.spec.task import TaskSpec
  rng = np.random.default_rng(0)
  sizes = [3, 5, 0, 4]
  ids = [f"c{i}" for i in range(4)]
  train = {c: (rng.normal(size=(n, 6)).astype(np.float32), rng.integers(0, 10, n))
           for c, n in zip(ids, sizes)}
  test = {c: (rng.normal(size=(2, 6)).astype(np.float32), rng.integers(0, 10, 2)) for c in ids}
  data = FederatedData(ids, train, test, 10)
  task = TaskSpec(name="t", description="", load_data=None, model_fn=lambda: models.mclr(6, 10),
                  loss=models.SPARSE_CE_LOGITS, defaults={})
  zero = [np.zeros((6, 10), np.float32), np.zeros(10, np.float32)]
  rule = LossRatio(task, data, zero, limit=4.0)
  assert rule.reference([0, 3]) == pytest.approx(np.log(10), rel=1e-6)
  assert rule.check(7, 2.0 * np.log(10), [0, 1, 3]) == pytest.approx(2.0, rel=1e-6)
  with pytest.raises(Diverged, match=r"round 7: the training loss 11.51 is 5 times "
                                                r"the initial model's loss .*2.303.*ratio=4"):
    rule.check(7, 5.0 * np.log(10), [1])
  # A model whose loss differs per client: the reference weights by training samples.
  bias = [np.zeros((6, 10), np.float32), np.eye(10, dtype=np.float32)[0] * 5]
  per = LossRatio(task, data, bias, limit=0)
  losses = {}
  for k in (0, 1):
    y = train[ids[k]][1]
    logp0, logp = 5 - np.log(np.exp(5) + 9), -np.log(np.exp(5) + 9)
    losses[k] = -np.mean(np.where(y == 0, logp0, logp))
  assert per.reference([0, 1]) == pytest.approx((3 * losses[0] + 5 * losses[1]) / 8, rel=1e-5)
  assert per.check(1, 1e30, [0]) > 1e29  # limit 0: recorded, never raised


# ---------------------------------------------------------------------------
# Saved models and --eval_only.


def test_saved_models_load_and_eval_only_reproduces_the_run(tmp_path, capsys):
  out = tmp_path / "run"
  assert _main([*SMALL_ARGS, "--algo=fedgroup", "--num_groups=2", "--rounds=3",
                "--runner=local", f"--output_dir={out}"], capsys)[0] == 0
  summary = json.loads((out / "summary.json").read_text())
  clients = json.loads((out / "models" / "final" / "clients.json").read_text())
  assert clients["num_models"] == 3  # 2 groups + the auxiliary model
  assert {int(j) for j in clients["client_model"].values()} <= {0, 1, 2}
  model = tf.keras.models.load_model(out / "models" / "final" / "model_0.keras")
  assert model.output_shape == (None, 10)
  code, _, err = _main(["--eval_only", f"--output_dir={out}"], capsys)
  assert code == 0, err
  report = json.loads((out / "eval_synthetic.json").read_text())
  assert report["final"]["test_accuracy"] == summary["final_test_accuracy"]
  assert report["best"]["test_accuracy"] == summary["max_test_accuracy"]
  assert report["best"]["round"] == summary["max_round"]
  # The .npz weights (what --eval_only reads, on any stack) are the .keras ones;
  # without the .keras files the report is the same.
  from tff_cluster import models

  final = out / "models" / "final"
  with np.load(final / "model_0.npz", allow_pickle=False) as archive:
    saved = [archive[f"w{i}"] for i in range(len(archive.files))]
  for a, b in zip(saved, models.get_weights(model)):
    np.testing.assert_array_equal(a, b)
  for which in ("final", "best"):
    for path in (out / "models" / which).glob("*.keras"):
      path.unlink()
  os.remove(out / "eval_synthetic.json")
  code, _, err = _main(["--eval_only", f"--output_dir={out}"], capsys)
  assert code == 0, err
  assert json.loads((out / "eval_synthetic.json").read_text()) == report
  # `python -m tff_cluster.evaluate RUN_DIR` is the same evaluation.
  from tff_cluster import evaluate
  os.remove(out / "eval_synthetic.json")
  assert evaluate.main(["evaluate", str(out)]) == 0
  assert json.loads((out / "eval_synthetic.json").read_text()) == report
  assert evaluate.main(["evaluate"]) == 2
  assert "usage: python -m tff_cluster.evaluate RUN_DIR" in capsys.readouterr().err
  # Weights that do not fit the task's model: one line naming both.
  np.savez(final / "model_1.npz", w0=np.zeros((3, 3), np.float32))
  code, _, err = _main(["--eval_only", f"--output_dir={out}"], capsys)
  assert_one_line_error(code, err, tmp_path / "none", "model_1", "do not fit --task=synthetic",
                        "valid: the run's model")


# ---------------------------------------------------------------------------
# Bad input: one line, what is valid, non-zero exit, no traceback, nothing written.


def _invalid_values(decl):
  if decl.choices:
    return ["bogus"]
  if decl.type is bool:
    return []
  values = []
  if decl.low is not None:
    values.append(decl.low if decl.low_open else
                  (decl.low - 1 if decl.type is int else decl.low - 0.5))
  if decl.high is not None:
    values.append(decl.high if decl.high_open else
                  (decl.high + 1 if decl.type is int else decl.high + 0.5))
  values += ["nan", "inf", "-inf"] if decl.type is float else ["1.5", "abc"]
  return [str(v) for v in values]


def _flag_cases():
  cases = []
  for decl in (*hp.TRAINING, hp.RUNNER, hp.JIT):
    cases += [("fedavg", decl.name, v) for v in _invalid_values(decl)]
  for name, decl in sorted(registry.all_hparams().items()):
    algo = next(a for a, spec in sorted(registry.ALGORITHMS.items())
                if any(d.name == name for d in spec.hparams))
    spec_decl = next(d for d in registry.ALGORITHMS[algo].hparams if d.name == name)
    cases += [(algo, name, v) for v in _invalid_values(spec_decl)]
  return cases


@pytest.mark.parametrize("algo,flag,value", _flag_cases())
def test_every_declared_flag_rejects_invalid_values(algo, flag, value, tmp_path, capsys):
  out = tmp_path / "out"
  code, _, err = _main([f"--algo={algo}", f"--{flag}={value}", f"--output_dir={out}"],
                       capsys)
  assert_one_line_error(code, err, out, f"--{flag}", "valid")


def _femnist_copy(tmp_path, damage):
  src = shared_data("femnist_leaf")
  dst = tmp_path / "femnist"
  shutil.copytree(src, dst)
  path = sorted((dst / "train").glob("*.json"))[0]
  damage(path)
  return dst


def _fmnist_truncated(tmp_path):
  src = shared_data("fashion_mnist")
  dst = tmp_path / "fmnist"
  shutil.copytree(src, dst)
  path = dst / "train-labels-idx1-ubyte.gz"
  data = path.read_bytes()
  path.write_bytes(data[:len(data) // 2])
  return dst


def _idx_files_only(tmp_path):
  """A folder of MNIST's file names (IDX files, no LEAF train/*.json)."""
  folder = tmp_path / "idx"
  folder.mkdir()
  for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
               "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
    (folder / name).write_bytes(b"")
  return folder


def _leaf_digits_only(tmp_path):
  write_leaf(tmp_path / "digits", [0, 1, 2, 3, 10, 50])  # no letter a-j (36..45)
  return tmp_path / "digits"


DATA_CASES = {
    "truncated_json": lambda t: (["--task=femnist", "--data_dir={}".format(_femnist_copy(
        t, lambda p: p.write_bytes(p.read_bytes()[:1000])))], ".json"),
    "json_missing_key": lambda t: (["--task=femnist", "--data_dir={}".format(_femnist_copy(
        t, lambda p: p.write_text(json.dumps({"users": ["a"]}))))], "user_data"),
    "truncated_idx_gz": lambda t: (["--task=fmnist", f"--data_dir={_fmnist_truncated(t)}"],
                                   "train-labels-idx1-ubyte.gz"),
    "wrong_files": lambda t: (["--task=femnist", f"--data_dir={_idx_files_only(t)}"],
                              "train/*.json"),
    "missing_dir": lambda t: (["--task=fmnist", f"--data_dir={t / 'nowhere'}"], "nowhere"),
    "too_many_clients": lambda t: (["--task=synthetic", "--num_clients=5",
                                    "--clients_per_round=6"], "--clients_per_round=6"),
    "num_clients_above_data": lambda t: (
        ["--task=femnist", f"--data_dir={shared_data('femnist_leaf')}", "--num_clients=60"],
        "--num_clients=60"),
    "task_arg_not_integer": lambda t: (["--task=synthetic_clusters",
                                        "--task_arg=num_clusters=4.5"], "num_clusters=4.5"),
    "task_arg_zero": lambda t: (["--task=synthetic_clusters", "--task_arg=num_clusters=0"],
                                "num_clusters=0"),
    "task_arg_twice": lambda t: (["--task=synthetic_clusters", "--task_arg=num_clusters=3",
                                  "--task_arg=num_clusters=4"], "twice"),
    "task_arg_unknown": lambda t: (["--task=femnist", "--task_arg=num_clusters=3"],
                                   "not a setting of --task=femnist"),
    "unknown_model": lambda t: (["--task=femnist", "--model=cnn"], "--model=cnn"),
    "both_local_works": lambda t: (["--local_epochs=2", "--local_steps=3"], "--local_steps"),
    "pretrain_scale_too_small": lambda t: (["--algo=fedgroup", "--pretrain_scale=0.01"],
                                           "invalid --pretrain_scale=0.01"),
    "newcomers_leave_too_few": lambda t: (["--algo=fedgroup", "--num_clients=20",
                                           "--clients_per_round=2", "--newcomer_fraction=0.9",
                                           "--num_groups=5"],
                                          "invalid --newcomer_fraction=0.9"),
    "pretrain_iters_and_epochs": lambda t: (["--algo=fedgroup", "--pretrain_iters=5",
                                             "--pretrain_epochs=1"], "--pretrain_epochs=1"),
    "nist_without_letters": lambda t: (["--task=femnist_fedprox",
                                        f"--data_dir={_leaf_digits_only(t)}"],
                                       "no lower-case a-j images"),
    "mnist_too_many_devices": lambda t: (["--task=mnist", f"--data_dir={shared_data('mnist')}",
                                          "--num_clients=20000", "--clients_per_round=5"],
                                         "use at most"),
    "reuse_prefix_not_bool": lambda t: (["--task=femnist_fedprox",
                                         f"--data_dir={t}",  # refused before any read
                                         "--task_arg=reuse_prefix=maybe"],
                                        "reuse_prefix=maybe"),
    "seed_too_large": lambda t: (["--seed=4294967296"], "--seed=4294967296"),
    "cfl_mgd_with_client_momentum": lambda t: (
        ["--algo=cfl_mgd", "--client_momentum=0.5"],
        ["invalid --client_momentum", "--cfl_mgd_beta"]),
    "mime_lite_with_client_momentum": lambda t: (
        ["--algo=mime_lite", "--client_momentum=0.5"],
        ["invalid --client_momentum", "--mime_momentum"]),
    "pfedmo_with_client_momentum": lambda t: (
        ["--algo=pfedmo", "--client_momentum=0.5"],
        ["invalid --client_momentum", "--nag_momentum"]),
    "pfedmo_partial_participation": lambda t: (
        ["--algo=pfedmo", "--task=synthetic", "--num_clients=8", "--clients_per_round=4"],
        ["invalid --clients_per_round=4", "every worker"]),
    "fednag_partial_participation": lambda t: (
        ["--algo=fednag", "--task=synthetic", "--num_clients=8", "--clients_per_round=4"],
        ["invalid --clients_per_round=4", "valid: 8"]),
    "mnist_workers_quantity_not_4": lambda t: (
        ["--algo=fedavg", "--task=mnist_workers", f"--data_dir={shared_data('mnist')}",
         "--task_arg=split=quantity", "--num_clients=5", "--clients_per_round=5"],
        ["invalid --num_clients=5", "split=quantity"]),
    "mnist_workers_unknown_split": lambda t: (
        ["--task=mnist_workers", "--task_arg=split=pathological"],
        ["split=pathological", "iid"]),
    "wecfl_fewer_round_clients_than_groups": lambda t: (
        ["--algo=wecfl", "--num_groups=5", "--clients_per_round=3"],
        ["invalid --clients_per_round=3", "--num_groups=5"]),
    "fesem_more_groups_than_clients": lambda t: (
        ["--algo=fesem", "--num_groups=30", "--num_clients=20", "--clients_per_round=20"],
        "invalid --num_groups=30"),
    "jit_on_batchnorm": lambda t: (["--task=fmnist", f"--data_dir={shared_data('fashion_mnist')}",
                                    "--runner=local", "--jit=on", "--num_clients=20"],
                                   "--jit=on"),
}




def _sent140_case(make):
  def case(tmp_path):
    data_dir, glove, extra, needles = make(tmp_path)
    return (["--task=sent140", f"--data_dir={data_dir}", f"--glove_path={glove}",
             "--rounds=1", *extra], needles)
  return case


# Malformed Sentiment140 CSV / GloVe files and task settings (built in
# tests/test_sent140_csv.py, which tests the reader itself).
DATA_CASES.update({f"sent140_{name}": _sent140_case(make)
                   for name, make in SENT140_CLI_CASES.items()})


@pytest.mark.parametrize("case", sorted(DATA_CASES))
def test_bad_data_and_settings_give_one_line(case, tmp_path, capsys):
  args, needles = DATA_CASES[case](tmp_path)
  out = tmp_path / "out"
  code, _, err = _main([*args, f"--output_dir={out}"], capsys)
  needles = [needles] if isinstance(needles, str) else needles
  assert_one_line_error(code, err, out, *needles)


@pytest.mark.parametrize("path", ["", "{file}/sub", "/proc/tff_cluster_results"])
def test_unwritable_output_dir_is_refused_before_data_loads(path, tmp_path, capsys):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  out = path.format(file=blocker)
  code, _, err = _main([*SMALL_ARGS, "--rounds=1", f"--output_dir={out}"], capsys)
  assert_one_line_error(code, err, tmp_path / "never", "--output_dir")


def test_flags_a_task_ignores_are_warned(tmp_path, capsys):
  code, _, err = _main([*SMALL_ARGS, "--rounds=1", "--runner=local", "--data_dir=/tmp",
                        "--glove_path=g.txt", f"--output_dir={tmp_path / 'o'}"], capsys)
  assert code == 0, err
  assert "warning: --data_dir, --glove_path ignored by --task=synthetic" in err


@pytest.mark.serial  # within 2 s: alone on the machine
def test_help_and_rejected_flags_answer_fast_without_tensorflow():
  for args in (["--help"], ["--rounds=0"], ["--algo=nope"]):
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-X", "importtime", SCRIPT, *args],
                         cwd=str(REPO_ROOT), capture_output=True, text=True, timeout=60)
    seconds = time.monotonic() - start
    assert seconds < 2.0, (args, seconds)
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines()
                if line.startswith("import time:")}
    assert "tensorflow" not in imported and "tensorflow_federated" not in imported, args


def test_help_shows_task_models_and_task_args(capsys):
  code, out, _ = _main(["--help"], capsys)
  assert code == 0
  assert "models: mlp, mclr; task_arg: none" in out
  assert "task_arg: num_clusters=5" in out and "defaults: rounds=200" in out
  for name in ("--checkpoint_every", "--[no]resume", "--[no]eval_only", "--runner", "--jit",
               "--local_steps", "--client_momentum", "--lr_decay", "--num_groups"):
    assert name in out, name


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_closes_a_local_run_with_one_line_and_a_summary(sig, tmp_path):
  out = tmp_path / "run"
  proc = subprocess.Popen(
      [sys.executable, SCRIPT, *SMALL_ARGS, "--rounds=500", "--runner=local",
       f"--output_dir={out}"], cwd=str(REPO_ROOT), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
  deadline = time.monotonic() + 120
  while metrics_rows_written(out / "metrics.csv") < 2:
    assert proc.poll() is None and time.monotonic() < deadline
    time.sleep(0.05)
  proc.send_signal(sig)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 128 + sig, err
  lines = [l for l in err.splitlines() if l.startswith("run_experiment.py")]
  assert len(lines) == 1 and "interrupted; partial results" in lines[0], err
  assert "Traceback" not in err
  summary = json.loads((out / "summary.json").read_text())
  assert summary["completed"] is False and summary["reason"] == "interrupted"
  _assert_whole_rows(out / "metrics.csv")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_whose_exception_is_swallowed_still_stops_the_run_after_that_round(
    small_clusters, tmp_path, sig):
  """Code a handler's exception interrupts (TFF's asyncio execution, say) may
  swallow it: the run still stops at the end of that round, as interrupted,
  and its closing summary names the checkpoint a resume continues from."""
  task, data = small_clusters
  config = _config(6, "local")
  driver = registry.build_driver("fedavg", task, data, config)
  real = driver.run_round

  def run_round(round_num, sampled):
    if round_num == 3:
      interrupts.note(sig)  # the handler ran; its exception was lost
    return real(round_num, sampled)

  driver.run_round = run_round
  writer = ResultsWriter(str(tmp_path), [*loop.BASE_COLUMNS, *driver.extra_columns],
                         tensorboard=False)
  expected = KeyboardInterrupt if sig == signal.SIGINT else SystemExit
  try:
    with pytest.raises(expected) as raised:
      loop.run_training(task, data, config, driver, writer, progress=False,
                              checkpoint_dir=str(tmp_path), checkpoint_every=2)
  finally:
    interrupts.note(None)
    writer.close()
  if sig != signal.SIGINT:
    assert raised.value.code == 128 + sig
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["completed"] is False and summary["reason"] == "interrupted"
  assert summary["rounds_completed"] == 3
  assert summary["checkpoint_round"] == 2 == checkpoint.load_latest(str(tmp_path))[0]
  assert [r["round"] for r in read_metrics_csv(tmp_path / "metrics.csv")] == [1.0, 2.0, 3.0]


def test_a_signal_whose_exception_surfaces_transformed_still_closes_as_interrupted(
    small_clusters, tmp_path):
  """A handler's SystemExit raised inside TensorFlow's Python code can come out
  as another exception (e.g. a TypeError): the run is still 'interrupted'."""
  task, data = small_clusters
  config = _config(3, "local")
  driver = registry.build_driver("fedavg", task, data, config)
  calls = {"n": 0}
  real = driver.run_round

  def run_round(round_num, sampled):
    calls["n"] += 1
    if round_num == 2:
      interrupts.note(signal.SIGTERM)
      raise TypeError("Expected `context` argument in EagerTensor constructor")
    return real(round_num, sampled)

  driver.run_round = run_round
  writer = ResultsWriter(str(tmp_path), [*loop.BASE_COLUMNS, *driver.extra_columns],
                         tensorboard=False)
  try:
    with pytest.raises(TypeError):
      loop.run_training(task, data, config, driver, writer, progress=False)
  finally:
    interrupts.note(None)
    writer.close()
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["completed"] is False and summary["reason"] == "interrupted"
  assert summary["rounds_completed"] == 1 and calls["n"] == 2
  # Without a signal the same failure is an error.
  driver.run_round = lambda r, s: (_ for _ in ()).throw(TypeError("boom"))
  other = ResultsWriter(str(tmp_path / "b"), [*loop.BASE_COLUMNS], tensorboard=False)
  with pytest.raises(TypeError):
    loop.run_training(task, data, config, driver, other, progress=False)
  other.close()
  assert json.loads((tmp_path / "b" / "summary.json").read_text())["reason"] == "error"


def test_client_states_are_saved_beside_the_checkpoint_part_by_part(tmp_path, monkeypatch):
  """Per-client states go to round-N.clients/part-*.npz, a few clients per
  part, no pickle; they come back key by key, old rounds' directories are
  removed with their archives, and a damaged part makes the load fall back
  to the checkpoint before."""
  monkeypatch.setattr(checkpoint, "CLIENTS_PER_PART", 2)
  run = str(tmp_path)
  states = {k: {"velocity": [np.full(3, k, np.float32)]} for k in (0, 4, 7, 9, 12)}
  for r in (1, 2, 3):
    checkpoint.save(run, r, {"driver": {"state": None, "host": {}}, "rows": [r]},
                    client_states={k: {"velocity": [v["velocity"][0] + r]}
                                   for k, v in states.items()})
  names = sorted(os.listdir(checkpoint.directory(run)))
  assert names == ["round-000002.clients", "round-000002.npz",
                   "round-000003.clients", "round-000003.npz"]
  parts = sorted(os.listdir(checkpoint.clients_dir(run, 3)))
  assert parts == ["part-000000.npz", "part-000001.npz", "part-000002.npz"]
  for part in parts:  # plain archives, readable without pickle
    with np.load(os.path.join(checkpoint.clients_dir(run, 3), part), allow_pickle=False) as a:
      assert "__tree__" in a.files
  round_num, payload = checkpoint.load_latest(run)
  loaded = payload["driver"]["client_states"]
  assert round_num == 3 and len(loaded) == 5 and "client_state_parts" not in payload
  back = dict(loaded.items())
  assert sorted(back) == sorted(states)
  for k, v in back.items():
    np.testing.assert_array_equal(v["velocity"][0], np.full(3, k + 3, np.float32))
  # A damaged part: the round before is loaded.
  with open(os.path.join(checkpoint.clients_dir(run, 3), "part-000001.npz"), "r+b") as f:
    f.truncate(8)
  round_num, payload = checkpoint.load_latest(run)
  assert round_num == 2
  np.testing.assert_array_equal(
      dict(payload["driver"]["client_states"].items())[9]["velocity"][0],
      np.full(3, 11, np.float32))
  # No per-client states: nothing beside the archive, an empty dict back.
  checkpoint.save(str(tmp_path / "none"), 1, {"driver": {"state": None, "host": {}}})
  assert checkpoint.load_latest(str(tmp_path / "none"))[1]["driver"]["client_states"] == {}
  assert os.listdir(checkpoint.directory(str(tmp_path / "none"))) == ["round-000001.npz"]


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT])
def test_a_signal_during_the_rounds_records_is_raised_after_them(sig, tmp_path, monkeypatch,
                                                                  capsys):
  """A stop signal that lands while a round's records are written (TensorBoard's
  summary ops, where raising its exception can crash TensorFlow: a SIGHUP did,
  with a segmentation fault inside `tf.summary.scalar`) is recorded and raised
  once the round is written whole and checkpointed: exit 128 + sig, summary
  interrupted, rounds 1-2 on disk, round 2 in the checkpoint."""
  from tff_cluster.io import results
  write_round = results.ResultsWriter.write_round
  reached = []

  def write_round_and_signal(self, row):
    if row["round"] == 2:
      os.kill(os.getpid(), sig)  # the handler runs here, inside the records
      time.sleep(0.05)
      reached.append(row["round"])  # nothing was raised in here
    return write_round(self, row)

  monkeypatch.setattr(results.ResultsWriter, "write_round", write_round_and_signal)
  out = tmp_path / "run"
  code, _, err = main_in_process(
      [*SMALL_ARGS, "--rounds=6", "--checkpoint_every=1", f"--output_dir={out}"], capsys)
  assert reached == [2]
  assert code == 128 + sig, err
  lines = [l for l in err.splitlines() if l.startswith("run_experiment.py")]
  assert len(lines) == 1 and "interrupted; partial results" in lines[0], err
  summary = json.loads((out / "summary.json").read_text())
  assert summary["completed"] is False and summary["reason"] == "interrupted"
  assert metrics_rows_written(out / "metrics.csv") == 2
  _assert_whole_rows(out / "metrics.csv")
  assert checkpoint.rounds(str(out))[-1] == 2
