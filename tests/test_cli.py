"""run_experiment.py: input validation, results files, determinism, honesty."""

from __future__ import annotations

import glob
import json
import os
import shlex
import sys

import numpy as np
import pytest
import tensorflow as tf

from tff_cluster import experiment as run_experiment
from tff_cluster import tasks
from tests.conftest import REPO_ROOT
from tests.helpers import (SMALL_ARGS, assert_workers_gone, main_in_process,
                           read_metrics_csv, run_watching_workers)
from tff_cluster import registry
from tff_cluster.host import loop
from tff_cluster.host.driver import TrainingConfig
from tff_cluster import models
from tff_cluster.learning.evaluation import Evaluator
from tff_cluster.io.results import ResultsWriter
from tff_cluster.spec.task import DataOptions

SCRIPT = str(REPO_ROOT / "run_experiment.py")
TIMING = ("round_seconds", "eval_seconds")
ALL_TASKS = sorted(tasks.registry())
ALL_ALGOS = sorted(registry.ALGORITHMS)


_main = main_in_process


def _assert_usage_error(code, err, *needles):
  assert code == 2, err
  lines = [line for line in err.splitlines() if line.strip()]
  assert len(lines) == 1, err
  assert lines[0].startswith("run_experiment.py: error: ")
  assert "Traceback" not in err
  for needle in needles:
    assert needle in lines[0], (needle, lines[0])


# ---------------------------------------------------------------------------
# Bad input: exit 2, one line naming the value and what is valid, no files.

BAD_INPUTS = {
    "unknown_algo": (["--algo=fedfoo"], ["--algo=fedfoo", *ALL_ALGOS]),
    "unknown_task": (["--task=mnist_foo"], ["--task=mnist_foo", *ALL_TASKS]),
    "unknown_flag": (["--roundz=3"], ["--roundz", "--rounds", "--clients_per_round"]),
    "rounds_not_int": (["--rounds=abc"], ["--rounds=abc", "an integer"]),
    "zero_clients_per_round": (["--clients_per_round=0"],
                               ["--clients_per_round=0", ">= 1"]),
    "more_per_round_than_clients": (["--num_clients=10", "--clients_per_round=11"],
                                    ["--clients_per_round=11", "1..10"]),
    "negative_lr": (["--client_lr=-0.5"], ["--client_lr=-0.5", "> 0"]),
    "negative_mu": (["--algo=fedprox", "--mu=-1"], ["--mu=-1", ">= 0"]),
    "zero_eval_every": (["--eval_every=0"], ["--eval_every=0", ">= 1"]),
    "positional": (["3"], ["'3'", "--name=value"]),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_exits_2_with_one_line(case, tmp_path, capsys):
  args, needles = BAD_INPUTS[case]
  out_dir = tmp_path / "out"
  # --rounds=2 first: should validation let a case through, it stays short
  # (a later --rounds=abc overrides it).
  code, _, err = _main([*SMALL_ARGS, "--rounds=2", f"--output_dir={out_dir}", *args],
                       capsys)
  _assert_usage_error(code, err, *needles)
  assert not out_dir.exists()


def test_unknown_flag_exits_2_in_a_real_process(tmp_path):
  # absl's own app.run would exit 1 and print usage; ours exits 2, one line.
  out_dir = tmp_path / "out"
  code, out, err, seen = run_watching_workers(
      [sys.executable, SCRIPT, "--roundz=3", f"--output_dir={out_dir}"],
      cwd=str(tmp_path), timeout=120)
  _assert_usage_error(code, err, "--roundz", "--rounds")
  assert out == ""
  assert not out_dir.exists()
  assert not seen  # no worker for a run that never started


def test_non_empty_output_dir_refused_in_a_real_process(tmp_path):
  """Refused before TensorFlow is imported (a second, not its import's 15)."""
  out_dir = tmp_path / "out"
  out_dir.mkdir()
  (out_dir / "notes.txt").write_text("keep me\n")
  code, _, err, seen = run_watching_workers(
      [sys.executable, "-X", "importtime", SCRIPT, *SMALL_ARGS, "--rounds=1",
       f"--output_dir={out_dir}"], cwd=str(tmp_path), timeout=120)
  imported = {line.split("|")[-1].strip() for line in err.splitlines()
              if line.startswith("import time:")}
  assert "tensorflow" not in imported, "TensorFlow imported before the refusal"
  err = "\n".join(line for line in err.splitlines() if not line.startswith("import time:"))
  _assert_usage_error(code, err, f"--output_dir={out_dir}", "--overwrite")
  assert sorted(os.listdir(out_dir)) == ["notes.txt"]
  assert (out_dir / "notes.txt").read_text() == "keep me\n"
  assert not seen


def test_overwrite_replaces_a_previous_runs_results_and_nothing_else(tmp_path, capsys):
  out_dir = tmp_path / "out"
  args = [*SMALL_ARGS, "--rounds=1", f"--output_dir={out_dir}"]
  code, _, err = _main(args, capsys)
  assert code == 0, err
  code, _, err = _main([*SMALL_ARGS, "--rounds=2", f"--output_dir={out_dir}"], capsys)
  _assert_usage_error(code, err, "--overwrite")
  assert [r["round"] for r in read_metrics_csv(out_dir / "metrics.csv")] == [1.0]

  code, _, err = _main([*SMALL_ARGS, "--rounds=2", f"--output_dir={out_dir}", "--overwrite"],
                       capsys)
  assert code == 0, err
  assert [r["round"] for r in read_metrics_csv(out_dir / "metrics.csv")] == [1.0, 2.0]
  # A file no run wrote: --overwrite refuses and changes nothing.
  (out_dir / "notes.txt").write_text("keep me\n")
  code, _, err = _main([*SMALL_ARGS, "--rounds=1", f"--output_dir={out_dir}", "--overwrite"],
                       capsys)
  _assert_usage_error(code, err, "notes.txt")
  assert (out_dir / "notes.txt").read_text() == "keep me\n"
  assert [r["round"] for r in read_metrics_csv(out_dir / "metrics.csv")] == [1.0, 2.0]


def _resolve(args):
  run_experiment.FLAGS.unparse_flags()
  run_experiment.FLAGS(["run_experiment.py", *args])
  return run_experiment.resolve_settings(run_experiment._flag_values())


def test_flags_an_algorithm_ignores_are_reported_not_silently_dropped(capsys):
  settings = _resolve(["--algo=fedavg", "--mu=0.5", "--num_groups=3"])
  err = capsys.readouterr().err
  assert "mu" not in settings and "num_groups" not in settings
  assert settings["algo_options"] == {d.name: d.default for d in
                                      registry.get_algorithm("fedavg").hparams}
  assert "warning: --mu, --num_groups ignored by --algo=fedavg" in err
  # FedProx uses --mu, and takes the task default (Synthetic: 1.0) when unset.
  assert _resolve(["--algo=fedprox", "--mu=0.5"])["mu"] == 0.5
  assert _resolve(["--algo=fedprox"])["mu"] == tasks.registry()["synthetic"].defaults["mu"]
  assert capsys.readouterr().err == ""


def test_a_tasks_client_momentum_does_not_apply_to_an_algorithms_own_solver(capsys):
  """The WeCFL FMNIST tasks' default momentum 0.9 is FedAvg's, not the local
  solver of FedEM (plain SGD) or pFedMe (its own steps); given, it is refused
  at the driver, naming the solver."""
  fmnist = ["--task=fmnist_clientwise_class", "--data_dir=/nonexistent"]
  assert _resolve(["--algo=fedavg", *fmnist])["client_momentum"] == 0.9
  for algo in ("fedem", "pfedme", "cfl_mgd"):
    assert _resolve([f"--algo={algo}", *fmnist])["client_momentum"] == 0.0
  assert _resolve(["--algo=fedem", "--client_momentum=0.5", *fmnist])["client_momentum"] == 0.5
  capsys.readouterr()


def test_help_lists_every_algorithm_and_task(capsys):
  code, out, _ = _main(["--help"], capsys)
  assert code == 0
  for name in ALL_ALGOS + ALL_TASKS:
    assert f"  {name} " in out, name
  for flag in ("--rounds", "--clients_per_round", "--mu", "--output_dir",
               "--[no]overwrite", "--[no]progress"):
    assert flag in out


# ---------------------------------------------------------------------------
# A passing run, as a shell pipeline `python run_experiment.py ... | cat`.


def _watched_run(out_dir, *extra):
  """A 3-round FedAvg run in a subprocess, piped through `cat`: its output dir,
  result and the TFF workers it started."""
  cmd = " ".join(shlex.quote(a) for a in [
      sys.executable, SCRIPT, *SMALL_ARGS, "--rounds=3", "--seed=3",
      f"--output_dir={out_dir}", *extra])
  # If a worker kept the pipe to `cat` open, communicate() would time out.
  code, out, err, seen = run_watching_workers(
      ["bash", "-c", f"set -o pipefail; {cmd} | cat"], cwd=str(REPO_ROOT),
      timeout=180)
  return out_dir, code, out, err, seen


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
  """One 3-round FedAvg run on the default runner (local)."""
  return _watched_run(tmp_path_factory.mktemp("cli") / "run")


def _assert_passing_run(code, out, err):
  assert code == 0, err
  assert "Traceback" not in err
  assert out == ""  # everything human-readable goes to stderr
  lines = err.strip().splitlines()
  assert len(lines) == 2, err  # what runs where, then the summary: no TF start-up notes
  summary_line = json.loads(lines[-1])
  assert 0.0 <= summary_line["final_test_accuracy"] <= 1.0


@pytest.mark.slow
def test_passing_run_exits_0_and_starts_no_worker(cli_run):
  _, code, out, err, seen = cli_run
  _assert_passing_run(code, out, err)
  assert "runner local" in err
  assert not seen, "the local runner (the default) starts no TFF worker"


@pytest.mark.tff
def test_passing_tff_run_exits_0_and_leaves_no_worker(tmp_path):
  _, code, out, err, seen = _watched_run(tmp_path / "run", "--runner=tff")
  _assert_passing_run(code, out, err)
  assert seen, "the run should have started a TFF worker"
  assert_workers_gone(seen)


def test_results_files(cli_run):
  out_dir, code, _, err, _ = cli_run
  assert code == 0, err
  config = json.loads((out_dir / "config.json").read_text())
  expected = {"algo": "fedavg", "task": "synthetic", "rounds": 3,
              "clients_per_round": 5, "local_epochs": 1, "num_clients": 20,
              "seed": 3, "eval_every": 1, "output_dir": str(out_dir),
              # task defaults, resolved
              "batch_size": 10, "client_lr": 0.01, "num_clients_loaded": 20,
              "runner": "local", "model": "mclr", "local_steps": None, "lr_decay": 1.0}
  for key, value in expected.items():
    assert config[key] == value, key
  assert "mu" not in config  # FedAvg has no proximal term
  assert config["runner_info"]["runner"] == "local"

  rows = read_metrics_csv(out_dir / "metrics.csv")
  with open(out_dir / "metrics.jsonl") as f:
    jsonl = [json.loads(line) for line in f]
  assert [r["round"] for r in rows] == [1, 2, 3]
  assert [r["round"] for r in jsonl] == [1, 2, 3]
  for row, jrow in zip(rows, jsonl):
    for column in ("train_loss", "test_accuracy", "round_seconds", "eval_seconds"):
      assert row[column] is not None
      assert row[column] == pytest.approx(jrow[column], rel=1e-12)
    assert 0.0 <= row["test_accuracy"] <= 1.0
    assert row["train_loss"] > 0
    assert row["round_seconds"] > 0 and row["eval_seconds"] > 0

  summary = json.loads((out_dir / "summary.json").read_text())
  accuracies = [r["test_accuracy"] for r in rows]
  assert summary["rounds"] == 3 and summary["completed"] is True
  assert summary["final_test_accuracy"] == pytest.approx(accuracies[-1], rel=1e-12)
  assert summary["max_test_accuracy"] == pytest.approx(max(accuracies), rel=1e-12)
  assert summary["max_test_accuracy"] >= summary["final_test_accuracy"]
  best = rows[int(summary["max_round"]) - 1]
  assert best["test_accuracy"] == pytest.approx(summary["max_test_accuracy"], rel=1e-12)
  assert summary["total_seconds"] >= sum(r["round_seconds"] for r in rows)

  events = glob.glob(str(out_dir / "tensorboard" / "events.out.tfevents.*"))
  assert len(events) == 1
  logged = {}
  for event in tf.compat.v1.train.summary_iterator(events[0]):
    for value in event.summary.value:
      if value.tag == "metrics/test_accuracy":
        logged[event.step] = float(tf.make_ndarray(value.tensor))
  assert sorted(logged) == [1, 2, 3]
  for row in rows:
    assert logged[int(row["round"])] == pytest.approx(row["test_accuracy"], abs=1e-6)

  png = (out_dir / "accuracy.png").read_bytes()
  assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000


def _comparable(rows):
  return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def test_same_seed_same_metrics_different_seed_different(cli_run, tmp_path, capsys):
  out_dir, code, _, err, _ = cli_run
  assert code == 0, err
  reference = _comparable(read_metrics_csv(out_dir / "metrics.csv"))
  runs = {}
  for seed in (3, 4):
    run_dir = tmp_path / f"seed{seed}"
    code, _, err = _main([*SMALL_ARGS, "--rounds=3", f"--seed={seed}",
                          f"--output_dir={run_dir}"], capsys)
    assert code == 0, err
    runs[seed] = _comparable(read_metrics_csv(run_dir / "metrics.csv"))
  # Same seed, other process: identical up to float noise.
  assert len(runs[3]) == len(reference) == 3
  for a, b in zip(runs[3], reference):
    assert a.keys() == b.keys()
    for key in a:
      if a[key] is None:
        assert b[key] is None
      else:
        assert a[key] == pytest.approx(b[key], abs=1e-6), key
  # Another seed: other data, init and sampling.
  assert all(abs(a["train_loss"] - b["train_loss"]) > 1e-4
             for a, b in zip(runs[4], reference))
  assert any(abs(a["test_accuracy"] - b["test_accuracy"]) > 1e-4
             for a, b in zip(runs[4], reference))


def test_eval_every_evaluates_even_rounds_and_the_last(tmp_path, capsys):
  out_dir = tmp_path / "out"
  code, _, err = _main([*SMALL_ARGS, "--rounds=5", "--eval_every=2",
                        f"--output_dir={out_dir}"], capsys)
  assert code == 0, err
  rows = read_metrics_csv(out_dir / "metrics.csv")
  evaluated = [int(r["round"]) for r in rows if r["test_accuracy"] is not None]
  assert evaluated == [2, 4, 5]
  for r in rows:
    assert r["train_loss"] is not None
    assert (r["eval_seconds"] is None) == (r["test_accuracy"] is None)
  summary = json.loads((out_dir / "summary.json").read_text())
  assert summary["final_test_accuracy"] == pytest.approx(rows[4]["test_accuracy"])


# ---------------------------------------------------------------------------
# test_accuracy is what it says: all clients' test splits, the current model.


def _brute_force_accuracy(model, data, weights_per_client):
  correct = total = 0
  for k, cid in enumerate(data.client_ids):
    x, y = data.test[cid]
    models.set_weights(model, weights_per_client[k])
    logits = model.predict(x, batch_size=len(x), verbose=0)
    correct += int(np.sum(np.argmax(logits, axis=1) == y))
    total += len(y)
  return correct / total, total


def test_recorded_accuracy_matches_brute_force_predict(tmp_path):
  task = tasks.registry()["synthetic"]
  data = task.load_data(DataOptions(seed=2, num_clients=20))
  config = TrainingConfig(rounds=2, clients_per_round=5, local_epochs=1,
                                     batch_size=10, client_lr=0.05, seed=2)
  runner = registry.build_driver("fedavg", task, data, config)
  writer = ResultsWriter(str(tmp_path / "out"), loop.BASE_COLUMNS,
                         tensorboard=False, figures=False)
  try:
    loop.run_training(task, data, config, runner, writer, progress=False)
  finally:
    writer.close()
  rows = read_metrics_csv(tmp_path / "out" / "metrics.csv")

  weights, client_model = runner.eval_models()
  accuracy, total = _brute_force_accuracy(
      task.model_fn(), data, [weights[m] for m in client_model])
  assert total == data.num_test_samples().sum()
  assert rows[-1]["test_accuracy"] == pytest.approx(accuracy, abs=1e-9)


def test_evaluator_gives_each_client_its_model():
  task = tasks.registry()["synthetic"]
  data = task.load_data(DataOptions(seed=5, num_clients=12))
  model = task.model_fn()
  rng = np.random.default_rng(0)
  candidates = [[rng.normal(size=w.shape).astype(np.float32)
                 for w in models.get_weights(model)] for _ in range(3)]
  assignment = np.array([k % 3 for k in range(data.num_clients)])
  result = Evaluator(task.model_fn, task.loss, data, batch_size=7).evaluate(
      candidates, assignment)
  accuracy, _ = _brute_force_accuracy(
      model, data, [candidates[m] for m in assignment])
  assert result.accuracy == pytest.approx(accuracy, abs=1e-12)
  # Per client, and the mean cross-entropy, against numpy.
  loss_sum = 0.0
  for k, cid in enumerate(data.client_ids):
    x, y = data.test[cid]
    w, b = candidates[assignment[k]]
    z = x.astype(np.float64) @ w + b
    z -= z.max(axis=1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    assert result.per_client_count[k] == len(y)
    assert result.per_client_correct[k] == np.sum(np.argmax(z, axis=1) == y)
    loss_sum += -log_p[np.arange(len(y)), y].sum()
  assert result.loss == pytest.approx(loss_sum / data.num_test_samples().sum(), rel=1e-5)
  # A different assignment changes the result (the choice is honoured).
  other = Evaluator(task.model_fn, task.loss, data).evaluate(
      candidates, np.zeros(data.num_clients, np.int64))
  assert other.accuracy != result.accuracy
