"""Results worth reading: NaN conventions, groups.csv, TensorBoard tags and
HParams, config.json provenance, the plot tool (`python -m tff_cluster.io.plot`),
groups.png and summary.json's final ARI and purity."""

from __future__ import annotations

import csv
import glob
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO_ROOT
from tests.helpers import read_metrics_csv
from tff_cluster.learning import evaluation
from tff_cluster.host.driver import client_groups
from tff_cluster.learning.evaluation import CHOOSE_BY_TEST_LOSS
from tff_cluster.io import plot
from tff_cluster.io import results
from tff_cluster.io import rundir
from tff_cluster.io.results import ResultsWriter

COLUMNS = ["round", "train_loss", "test_accuracy", "test_loss", "round_seconds",
           "eval_seconds", "bytes_down", "bytes_up", "mean_update_norm", "group_0_accuracy",
           "group_0_size", "num_clusters", "ari", "purity", "num_changed"]
SMALL = ("--num_clients=20", "--clients_per_round=5", "--local_epochs=1", "--rounds=3",
         "--runner=local", "--progress=false")


def _rows_of(path):
  with open(path, newline="") as f:
    return list(csv.reader(f))


# ---------------------------------------------------------------------------
# Non-finite numbers: `nan`/`inf` in CSV; null + "nonfinite" in JSON(L).


def test_nan_and_inf_are_written_as_such_in_csv_and_listed_in_jsonl(tmp_path):
  writer = ResultsWriter(str(tmp_path), ["round", "train_loss", "test_accuracy",
                                         "test_loss", "ari"], tensorboard=False)
  writer.write_round({"round": 1, "train_loss": np.float32(0.5), "test_accuracy": None,
                      "test_loss": math.nan, "ari": np.float64(math.inf)})
  writer.write_round({"round": 2, "train_loss": -math.inf, "test_accuracy": 0.75,
                      "test_loss": 0.25})
  writer.write_round({"round": 3, "train_loss": 0.125})
  writer.close()
  raw = (tmp_path / "metrics.csv").read_bytes()
  assert b"\r" not in raw
  assert raw.decode().splitlines() == ["round,train_loss,test_accuracy,test_loss,ari",
                                       "1,0.5,,nan,inf", "2,-inf,0.75,0.25,", "3,0.125,,,"]
  lines = (tmp_path / "metrics.jsonl").read_bytes().decode()
  assert "\r" not in lines and "NaN" not in lines and "Infinity" not in lines
  jsonl = [json.loads(line) for line in lines.splitlines()]
  assert jsonl[0] == {"round": 1, "train_loss": 0.5, "test_accuracy": None,
                      "test_loss": None, "ari": None, "nonfinite": ["ari", "test_loss"]}
  assert jsonl[1]["nonfinite"] == ["train_loss"] and jsonl[1]["train_loss"] is None
  assert "nonfinite" not in jsonl[2]  # only when there are any
  # The repository's readers: NaN and infinities come back, empty cells as None.
  rows = read_metrics_csv(tmp_path / "metrics.csv")
  assert math.isnan(rows[0]["test_loss"]) and rows[0]["ari"] == math.inf
  assert rows[0]["test_accuracy"] is None and rows[1]["train_loss"] == -math.inf
  columns, plotted = rundir.read_metrics(str(tmp_path))
  assert columns[0] == "round" and math.isnan(plotted[0]["test_loss"])
  os.remove(tmp_path / "metrics.csv")  # the JSONL reader: null, unless listed
  _, from_jsonl = rundir.read_metrics(str(tmp_path))
  assert math.isnan(from_jsonl[0]["test_loss"]) and from_jsonl[0]["test_accuracy"] is None
  # writer.rows stays JSON-ready (None for non-finite values).
  assert writer.rows[0]["test_loss"] is None


def test_resumed_writer_keeps_nan_cells(tmp_path):
  rows = [{"round": 1, "train_loss": 0.5, "test_loss": math.nan},
          {"round": 2, "train_loss": 0.25, "test_loss": 1.0}]
  writer = ResultsWriter(str(tmp_path), ["round", "train_loss", "test_loss"],
                         tensorboard=False, resume_rows=rows)  # rows as a checkpoint has them
  writer.close()
  assert (tmp_path / "metrics.csv").read_text().splitlines()[1:] == ["1,0.5,nan", "2,0.25,1.0"]
  assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])[
      "nonfinite"] == ["test_loss"]


def test_summary_json_lists_nonfinite_fields(tmp_path):
  results.write_json(str(tmp_path / "summary.json"),
                     {"final_test_accuracy": math.nan, "ok": 1.0,
                      "group_accuracy": [0.5, math.inf], "nested": {"a": -math.inf}})
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["final_test_accuracy"] is None and summary["group_accuracy"] == [0.5, None]
  assert summary["nonfinite"] == ["final_test_accuracy", "group_accuracy[1]", "nested.a"]
  results.write_json(str(tmp_path / "clean.json"), {"a": 1.0})
  assert "nonfinite" not in json.loads((tmp_path / "clean.json").read_text())


# ---------------------------------------------------------------------------
# TensorBoard: grouped tags and the HParams plugin.


def test_tensorboard_tags_are_grouped():
  assert results.tensorboard_tag("test_accuracy") == "metrics/test_accuracy"
  assert results.tensorboard_tag("test_macro_f1") == "metrics/test_macro_f1"
  assert results.tensorboard_tag("mean_update_norm") == "metrics/mean_update_norm"
  assert results.tensorboard_tag("global_test_loss") == "metrics/global_test_loss"
  for name in ("group_3_accuracy", "group_0_size", "group_discrepancy", "num_clusters",
               "ari", "purity", "num_changed", "num_assigned", "kmeans_objective"):
    assert results.tensorboard_tag(name) == f"groups/{name}", name
  # An algorithm's own diagnostics, named after it: CFL's.
  assert results.tensorboard_tag("cfl_splits", "cfl") == "groups/cfl_splits"
  assert results.tensorboard_tag("cfl_splits") == "metrics/cfl_splits"
  assert results.tensorboard_tag("bytes_up") == "comm/bytes_up"
  assert results.tensorboard_tag("round_seconds") == "time/round_seconds"
  assert results.tensorboard_tag("eval_seconds") == "time/eval_seconds"


def _events(run_dir):
  """(tag -> {step: value}, hparams of the session start) of a run's events."""
  import tensorflow as tf
  scalars, hparams = {}, None
  for path in glob.glob(os.path.join(str(run_dir), "tensorboard", "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.metadata.plugin_data.plugin_name == "hparams":
          from tensorboard.plugins.hparams import plugin_data_pb2
          data = plugin_data_pb2.HParamsPluginData.FromString(
              value.metadata.plugin_data.content)
          if data.HasField("session_start_info"):
            hparams = {k: getattr(v, v.WhichOneof("kind"))
                       for k, v in data.session_start_info.hparams.items()}
          continue
        scalars.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
  return scalars, hparams


def test_tensorboard_events_hold_grouped_tags_and_hparams(tmp_path):
  writer = ResultsWriter(str(tmp_path), COLUMNS)
  writer.write_config({"algo": "ifca", "task": "synthetic_clusters", "model": "mclr",
                       "seed": 3, "client_lr": 0.01, "rounds": 2, "batch_size": 10,
                       "local_epochs": 1, "local_steps": None, "runner": "local",
                       "algo_options": {"num_groups": 2, "ifca_init": "random",
                                        "ifca_good_init_threshold": None},
                       "task_args": {}, "task_args_applied": {"num_clusters": 2},
                       "runner_info": {"device": "/CPU:0"}, "versions": {"numpy": "1"}})
  for r in (1, 2):
    writer.write_round({"round": r, "train_loss": 1.0 / r, "test_accuracy": 0.5 + r / 10,
                        "test_loss": math.nan, "round_seconds": 0.1, "eval_seconds": 0.01,
                        "bytes_down": 400, "bytes_up": 200, "mean_update_norm": 0.3,
                        "group_0_accuracy": 0.9, "group_0_size": 7, "num_clusters": 2,
                        "ari": 1.0, "purity": 1.0, "num_changed": 0})
  writer.close()
  scalars, hparams = _events(tmp_path)
  assert set(scalars) == {
      "metrics/train_loss", "metrics/test_accuracy", "metrics/mean_update_norm",
      "groups/group_0_accuracy", "groups/group_0_size", "groups/num_clusters",
      "groups/ari", "groups/purity", "groups/num_changed", "comm/bytes_down",
      "comm/bytes_up", "time/round_seconds", "time/eval_seconds"}  # NaN test_loss: left out
  assert scalars["metrics/test_accuracy"] == {1: pytest.approx(0.6), 2: pytest.approx(0.7)}
  assert hparams == {"algo": "ifca", "task": "synthetic_clusters", "model": "mclr",
                     "seed": 3, "client_lr": 0.01, "rounds": 2, "batch_size": 10,
                     "local_epochs": 1, "runner": "local", "num_groups": 2,
                     "ifca_init": "random", "task_arg.num_clusters": 2}


def test_without_the_tensorboard_package_the_rest_is_written(tmp_path, monkeypatch):
  """tf.summary needs the tensorboard package (TensorFlow 2.21 does not bring
  it; tff-cluster declares it): an install without it writes everything but
  tensorboard/."""
  import importlib.util
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "tensorboard" else real(name, *a))
  writer = ResultsWriter(str(tmp_path), COLUMNS)
  writer.write_config({"algo": "fedavg", "task": "synthetic"})
  writer.write_round({"round": 1, "train_loss": 0.5, "test_accuracy": 0.25})
  writer.close()
  assert not (tmp_path / "tensorboard").exists()
  assert [r["test_accuracy"] for r in read_metrics_csv(tmp_path / "metrics.csv")] == [0.25]
  assert json.loads((tmp_path / "config.json").read_text())["algo"] == "fedavg"


# ---------------------------------------------------------------------------
# groups.csv


def test_client_groups_values():
  aux = 3  # FedGroup tests a client in no group with model m (the auxiliary one)
  assignment = np.array([0, -1, 2, -1])
  client_model = np.where(assignment >= 0, assignment, aux)
  np.testing.assert_array_equal(
      client_groups(client_model, None, assignment, 4), [0, -1, 2, -1])
  np.testing.assert_array_equal(  # no assignment kept: the indices as given
      client_groups(np.array([0, 0, 0, 0]), None, None, 4), [0, 0, 0, 0])
  chosen = np.array([1, 0, 1, 1])
  np.testing.assert_array_equal(client_groups(
      CHOOSE_BY_TEST_LOSS, chosen, assignment, 4), chosen)
  assert client_groups(CHOOSE_BY_TEST_LOSS, None, assignment, 4) is None
  np.testing.assert_array_equal(
      client_groups(evaluation.Ensemble("logits"), None, None, 4), [-1, -1, -1, -1])


def test_groups_csv_keeps_the_checkpointed_rounds_on_resume(tmp_path):
  writer = ResultsWriter(str(tmp_path), ["round"], tensorboard=False)
  for r in (1, 2, 3):
    writer.write_round({"round": r})
    writer.write_groups(r, ["a", "b"], [r % 2, -1])
  writer.close()
  with open(tmp_path / "groups.csv", "a") as f:
    f.write("4,1")  # a torn line
  writer = ResultsWriter(str(tmp_path), ["round"], tensorboard=False,
                         resume_rows=[{"round": 1}, {"round": 2}])
  writer.write_groups(3, ["a", "b"], None)  # chosen at evaluation, not evaluated
  writer.close()
  assert (tmp_path / "groups.csv").read_bytes() == b"round,a,b\n1,1,-1\n2,0,-1\n3,,\n"


def test_groups_csv_long_writes_the_changes_and_resumes_from_them(tmp_path):
  """--groups_format=long: round,client,group for every client on the first
  round, then only for clients whose group changed; a round without known
  groups writes nothing; a resume keeps the checkpointed rounds' lines and
  goes on comparing with the groups they leave."""
  ids = ["a", "b", "c"]
  writer = ResultsWriter(str(tmp_path), ["round"], tensorboard=False, groups_format="long")
  for r, groups in ((1, [0, 1, -1]), (2, [0, 1, -1]), (3, None), (4, [1, 1, 0])):
    writer.write_round({"round": r})
    writer.write_groups(r, ids, groups)
  writer.close()
  assert (tmp_path / "groups.csv").read_text() == (
      "round,client,group\n1,a,0\n1,b,1\n1,c,-1\n4,a,1\n4,c,0\n")
  with open(tmp_path / "groups.csv", "a") as f:
    f.write("5,b")  # a torn line
  writer = ResultsWriter(str(tmp_path), ["round"], tensorboard=False, groups_format="long",
                         resume_rows=[{"round": r} for r in (1, 2, 3)])
  writer.write_groups(4, ids, [0, 2, -1])  # round 4 again, after the checkpoint of round 3
  writer.close()
  assert (tmp_path / "groups.csv").read_text() == (
      "round,client,group\n1,a,0\n1,b,1\n1,c,-1\n4,b,2\n")
  with pytest.raises(ValueError, match="valid: wide, long"):
    ResultsWriter(str(tmp_path / "x"), ["round"], tensorboard=False, groups_format="tall")


def _run(out_dir, *args):
  from tff_cluster import experiment as run_experiment
  code = run_experiment.main(["run_experiment.py", *SMALL, f"--output_dir={out_dir}", *args])
  assert code == 0
  return out_dir


@pytest.fixture(scope="module")
def ifca_run(tmp_path_factory):
  return _run(tmp_path_factory.mktemp("ifca") / "run", "--algo=ifca", "--num_groups=2",
              "--task=synthetic_clusters", "--task_arg=num_clusters=2", "--seed=1")


@pytest.fixture(scope="module")
def fedgroup_run(tmp_path_factory):
  # 2 of 20 clients pre-trained: the others join a group when first sampled.
  return _run(tmp_path_factory.mktemp("fedgroup") / "run", "--algo=fedgroup",
              "--num_groups=2", "--pretrain_scale=1", "--task=synthetic_clusters",
              "--seed=2", "--rounds=4", "--checkpoint_every=2")


def test_groups_csv_of_ifca_is_the_evaluation_choice(ifca_run):
  lines = _rows_of(ifca_run / "groups.csv")
  summary = json.loads((ifca_run / "summary.json").read_text())
  clients = list(summary["last_training_cluster"])
  assert lines[0][0] == "round" and sorted(lines[0][1:]) == sorted(clients)
  assert len(lines[0]) == 21 and [int(l[0]) for l in lines[1:]] == [1, 2, 3]
  groups = np.array([[int(v) for v in line[1:]] for line in lines[1:]])
  assert set(groups.ravel()) <= {0, 1}
  metrics = read_metrics_csv(ifca_run / "metrics.csv")
  for row, g in zip(metrics, groups):  # group_<j>_size counts the evaluation's choice
    assert [int(row[f"group_{j}_size"]) for j in (0, 1)] == list(np.bincount(g, minlength=2))
  final = json.loads((ifca_run / "models" / "final" / "clients.json").read_text())
  assert {c: int(g) for c, g in zip(lines[0][1:], groups[-1])} == final["client_model"]


def test_groups_csv_of_fedgroup_marks_unassigned_clients(fedgroup_run):
  lines = _rows_of(fedgroup_run / "groups.csv")
  assert [int(l[0]) for l in lines[1:]] == [1, 2, 3, 4]
  groups = np.array([[int(v) for v in line[1:]] for line in lines[1:]])
  assert set(groups.ravel()) <= {-1, 0, 1}
  assert (groups[0] == -1).any(), "most clients join after round 1"
  assert ((groups >= 0).sum(axis=1) == np.maximum.accumulate(
      (groups >= 0).sum(axis=1))).all()  # a client once in a group stays in one
  metrics = read_metrics_csv(fedgroup_run / "metrics.csv")
  for row, g in zip(metrics, groups):
    assert int(row["num_assigned"]) == (g >= 0).sum()
    assert [int(row[f"group_{j}_size"]) for j in (0, 1)] == [(g == 0).sum(), (g == 1).sum()]
  summary = json.loads((fedgroup_run / "summary.json").read_text())
  assert dict(zip(lines[0][1:], groups[-1].tolist())) == summary["final_assignment"]


def test_groups_csv_after_resume_equals_the_uninterrupted_run(fedgroup_run, tmp_path):
  import shutil

  from tff_cluster.io import checkpoint
  run = tmp_path / "run"
  shutil.copytree(fedgroup_run, run)
  whole = (run / "groups.csv").read_bytes()
  # As if killed after round 3: no checkpoint of round 4, a torn line at the end.
  os.remove(os.path.join(checkpoint.directory(str(run)), "round-000004.npz"))
  with open(run / "groups.csv", "ab") as f:
    f.write(b"5,0,1")
  from tff_cluster import experiment as run_experiment
  assert run_experiment.main(["run_experiment.py", "--resume", f"--output_dir={run}",
                              "--progress=false"]) == 0
  assert (run / "groups.csv").read_bytes() == whole
  assert [r["round"] for r in read_metrics_csv(run / "metrics.csv")] == [1, 2, 3, 4]


# ---------------------------------------------------------------------------
# config.json: provenance and the task arguments as applied.


def test_config_records_commit_versions_and_applied_task_args(ifca_run, fedgroup_run):
  from importlib import metadata
  config = json.loads((ifca_run / "config.json").read_text())
  assert config["git_commit"] is None or re.fullmatch(r"[0-9a-f]{40}", config["git_commit"])
  assert config["git_dirty"] in (None, True, False)
  assert (config["git_commit"] is None) == (config["git_dirty"] is None)
  def installed(name):
    try:
      return metadata.version(name)
    except metadata.PackageNotFoundError:
      return None

  assert config["versions"] == {
      "python": sys.version.split()[0], "numpy": np.__version__,
      "tensorflow": metadata.version("tensorflow"), "keras": installed("keras"),
      "tf_keras": installed("tf-keras"),
      "tf_use_legacy_keras": os.environ.get("TF_USE_LEGACY_KERAS") == "1",
      "tensorflow_federated": installed("tensorflow-federated")}
  assert config["task_args"] == {"num_clusters": 2}
  assert config["task_args_applied"] == {"num_clusters": 2, "samples_per_client": 0}
  from tff_cluster import tasks
  default = {d.name: d.default for d in tasks.get_task("synthetic_clusters").task_args}
  config = json.loads((fedgroup_run / "config.json").read_text())
  assert config["task_args"] == {} and config["task_args_applied"] == default


def test_git_state_is_none_outside_a_checkout_and_without_git(tmp_path, monkeypatch):
  assert results.git_state(str(tmp_path)) == {"git_commit": None, "git_dirty": None}
  git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
  subprocess.run([*git, "init", "-q"], check=True)
  (tmp_path / "f.txt").write_text("1")
  subprocess.run([*git, "add", "f.txt"], check=True)
  subprocess.run([*git, "commit", "-q", "-m", "c"], check=True)
  head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True,
                        text=True).stdout.strip()
  assert results.git_state(str(tmp_path)) == {"git_commit": head, "git_dirty": False}
  (tmp_path / "f.txt").write_text("2")
  assert results.git_state(str(tmp_path))["git_dirty"] is True
  sub = tmp_path / "sub"  # inside the work tree but not its top: not our checkout
  sub.mkdir()
  assert results.git_state(str(sub))["git_commit"] is None
  monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
  assert results.git_state(str(tmp_path)) == {"git_commit": None, "git_dirty": None}


# ---------------------------------------------------------------------------
# The plot tool.


def _fake_run(path, algo, seed, accuracy, groups=0, **settings):
  """A run directory as run_experiment.py writes it, without training."""
  columns = ["round", "train_loss", "test_accuracy", *[f"group_{j}_accuracy" for j in
                                                        range(groups)],
             *[f"group_{j}_size" for j in range(groups)]]
  writer = ResultsWriter(str(path), columns, tensorboard=False)
  config = {"algo": algo, "task": "synthetic_clusters", "model": "mclr", "seed": seed,
            "client_lr": 0.01, "local_epochs": 1, "local_steps": None, "runner": "local",
            "rounds": len(accuracy), "batch_size": 10, "clients_per_round": 5,
            "output_dir": str(path), "num_train_samples": 100 + seed,
            "algo_options": ({"num_groups": groups, "ifca_init": "random"} if groups
                             else {"client_weighting": "processed"}),
            "task_args": {}, "task_args_applied": {"num_clusters": 2}, **settings}
  writer.write_config(config)
  for r, acc in enumerate(accuracy, start=1):
    row = {"round": r, "train_loss": 1.0 / r, "test_accuracy": acc}
    for j in range(groups):
      row[f"group_{j}_accuracy"] = acc - 0.05 * j
      row[f"group_{j}_size"] = 10
    writer.write_round(row)
  writer.close()
  return str(path)


def test_labels_name_algorithm_task_seeds_and_the_settings_that_differ(tmp_path):
  runs = [plot.load_run(_fake_run(tmp_path / "a", "ifca", 0, [0.5, 0.6], groups=2)),
          plot.load_run(_fake_run(tmp_path / "b", "ifca", 1, [0.4, 0.7], groups=2)),
          plot.load_run(_fake_run(tmp_path / "c", "fedavg", 0, [0.3, 0.4]))]
  groups = plot.group_runs(runs)
  assert [len(g.runs) for g in groups] == [2, 1]  # same settings but the seed
  title, labels = plot.describe(groups)
  assert title == "synthetic_clusters, mclr, lr=0.01, E=1, runner=local"
  assert labels == ["ifca, groups=2, mean ± std of 2 seeds (0, 1)", "fedavg, seed 0"]
  rounds, mean, std, n = plot.series(groups[0], "test_accuracy")
  np.testing.assert_allclose(mean, [0.45, 0.65])
  np.testing.assert_allclose(std, [np.std([0.5, 0.4], ddof=1), np.std([0.6, 0.7], ddof=1)])
  assert list(rounds) == [1, 2] and list(n) == [2, 2]
  # One group: everything in the title, seeds included.
  title, labels = plot.describe(plot.group_runs(runs[:1]))
  assert title.startswith("ifca on synthetic_clusters, mclr, groups=2, lr=0.01, E=1, "
                          "runner=local") and title.endswith("seed 0")
  # Two settings of one algorithm: the differing option is named.
  other = plot.load_run(_fake_run(tmp_path / "d", "ifca", 0, [0.5, 0.5], groups=3,
                                  client_lr=0.1))
  _, labels = plot.describe(plot.group_runs([runs[0], other]))
  assert labels == ["ifca, groups=2, lr=0.01, seed 0", "ifca, groups=3, lr=0.1, seed 0"]
  _, labels = plot.describe(plot.group_runs(runs[:2], separate_seeds=True))
  assert labels == ["ifca, seed 0", "ifca, seed 1"]


def test_plot_cli_draws_two_seeds_and_another_setting(tmp_path, capsys):
  dirs = [_fake_run(tmp_path / "ifca0", "ifca", 0, [0.5, 0.6, 0.8], groups=2),
          _fake_run(tmp_path / "ifca1", "ifca", 1, [0.4, 0.7, 0.75], groups=2),
          _fake_run(tmp_path / "fedavg0", "fedavg", 0, [0.3, 0.4, math.nan])]
  out = tmp_path / "cmp.png"
  assert plot.main([*dirs, f"--out={out}"]) == 0
  assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
  assert "3 runs in 2 curves" in capsys.readouterr().err
  import matplotlib
  single = tmp_path / "one.svg"  # one run: the per-group panel; any matplotlib format
  with matplotlib.rc_context({"svg.fonttype": "none"}):  # text as text
    assert plot.main([dirs[0], "--out", str(single), "--metric=train_loss"]) == 0
  text = single.read_text()
  assert "test accuracy per group" in text and "group 1 (10 clients)" in text


def test_runs_accuracy_png_is_drawn_by_the_plot_module(ifca_run):
  png = (ifca_run / "accuracy.png").read_bytes()
  assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


def test_a_writer_without_figures_draws_no_png(tmp_path):
  """`figures=False` (the tests' runs that read rows only): no PNG; the
  default draws accuracy.png from the same rows."""
  for figures in (False, True):
    run = tmp_path / str(figures)
    writer = ResultsWriter(str(run), ["round", "train_loss", "test_accuracy"],
                           tensorboard=False, figures=figures)
    for r in (1, 2):
      writer.write_round({"round": r, "train_loss": 1.0 / r, "test_accuracy": 0.4 * r})
    drawn = writer.plot("t")
    writer.close()
    assert sorted(p.name for p in run.glob("*.png")) == ([] if not figures else ["accuracy.png"])
    assert (drawn is None) == (not figures)


def _one_line_error(code, err, *needles):
  assert code == 2, err
  lines = [line for line in err.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith("python -m tff_cluster.io.plot: error: "), err
  assert "Traceback" not in err
  for needle in needles:
    assert needle in lines[0], (needle, lines[0])


def test_plot_cli_errors_are_one_line(tmp_path, capsys):
  good = _fake_run(tmp_path / "good", "fedavg", 0, [0.3, 0.4])
  cases = [
      ([str(tmp_path / "missing")], ("does not exist", "missing")),
      ([str(tmp_path / "good" / "config.json")], ("is not a directory",)),
      ([str(tmp_path)], ("has no metrics.csv or metrics.jsonl",)),
      ([good, "--metric=accuracy"], ("--metric=accuracy", "valid:", "test_accuracy")),
      ([good, "--out=x.nope"], ("--out=x.nope", "valid:", ".png")),
      ([good, f"--out={tmp_path / 'no' / 'dir.png'}"], ("does not exist",)),
      ([], ("RUN_DIR",)),
      ([good, "--bogus"], ("--bogus",)),
  ]
  for argv, needles in cases:
    code = plot.main(argv)
    _one_line_error(code, capsys.readouterr().err, *needles)
  (tmp_path / "empty").mkdir()
  ResultsWriter(str(tmp_path / "empty"), ["round", "test_accuracy"],
                tensorboard=False).close()
  _one_line_error(plot.main([str(tmp_path / "empty")]), capsys.readouterr().err,
                  "no rows yet")
  # The module as a program, as users run it.
  proc = subprocess.run([sys.executable, "-m", "tff_cluster.io.plot", str(tmp_path / "nope")],
                        cwd=str(REPO_ROOT), capture_output=True, text=True, timeout=120)
  _one_line_error(proc.returncode, proc.stderr, "does not exist")


# ---------------------------------------------------------------------------
# groups.png and the final ARI and purity in summary.json


def _hand_ari_purity(truth, pred):
  """ARI (Hubert & Arabie) and purity from the contingency table, counted
  here: the clients with a group (pred >= 0) only."""
  truth, pred = np.asarray(truth), np.asarray(pred)
  truth, pred = truth[pred >= 0], pred[pred >= 0]
  n = len(truth)
  pairs = lambda m: m * (m - 1) / 2  # noqa: E731
  cells = {}
  for t, p in zip(truth.tolist(), pred.tolist()):
    cells[(t, p)] = cells.get((t, p), 0) + 1
  index = sum(pairs(v) for v in cells.values())
  rows = sum(pairs(sum(v for (t, _), v in cells.items() if t == a)) for a in set(truth.tolist()))
  cols = sum(pairs(sum(v for (_, p), v in cells.items() if p == b)) for b in set(pred.tolist()))
  expected = rows * cols / pairs(n)
  ari = (index - expected) / ((rows + cols) / 2 - expected)
  purity = sum(max(v for (_, p), v in cells.items() if p == b)
               for b in set(pred.tolist())) / n
  return ari, purity


def test_hand_ari_purity_of_a_small_case():
  # Contingency (true, group): (0,0)=2, (0,1)=1, (1,1)=3: index 1+0+3 = 4; true
  # pairs 3+3 = 6; group pairs 1+6 = 7; expected 6*7/15 = 2.8; ARI (4-2.8)/(6.5-2.8).
  ari, purity = _hand_ari_purity([0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, -1])
  assert ari == pytest.approx(12 / 37) and purity == pytest.approx(5 / 6)


def test_summary_carries_the_last_evaluated_ari_and_purity():
  rows = [{"round": 1, "test_accuracy": 0.5, "ari": 0.2, "purity": 0.6},
          {"round": 2, "test_accuracy": 0.6, "ari": 0.4, "purity": 0.7},
          {"round": 3, "test_accuracy": None}]  # not evaluated
  summary = results.summarize(rows, 3)
  assert (summary["ari"], summary["purity"]) == (0.4, 0.7)
  assert "ari" not in results.summarize([{"round": 1, "test_accuracy": 0.5}], 1)


GROUP_COLUMNS = ["round", "test_accuracy", "group_0_size", "group_1_size", "ari", "purity"]
GROUPS_CONFIG = {"algo": "ifca", "task": "synthetic_clusters", "model": "mclr", "seed": 0,
                 "client_lr": 0.01, "local_epochs": 1, "algo_options": {"num_groups": 2}}
# Clients a..d over 3 rounds; round 2 not known (chosen at evaluation, none).
HAND_GROUPS = ((1, [0, -1, 1, -1], 0.25), (2, None, None), (3, [1, 0, 1, -1], 0.5))


def _groups_run(path, columns=GROUP_COLUMNS, groups_format="wide"):
  writer = ResultsWriter(str(path), columns, tensorboard=False, groups_format=groups_format)
  writer.write_config(GROUPS_CONFIG)
  for r, groups, ari in HAND_GROUPS:
    row = {"round": r, "test_accuracy": 0.5}
    if "ari" in columns:
      row.update(ari=ari, purity=None if ari is None else 0.75)
    writer.write_round(row)
    writer.write_groups(r, ["a", "b", "c", "d"], groups)
  return writer


def test_groups_png_of_a_hand_made_groups_csv(tmp_path, monkeypatch):
  import matplotlib
  from matplotlib import image
  titles = []
  draw = plot.groups_figure
  monkeypatch.setattr(plot, "groups_figure",
                      lambda table, title="": titles.append(title) or draw(table, title))
  writer = _groups_run(tmp_path)
  assert writer.plot() == str(tmp_path / "accuracy.png")
  writer.close()
  png = image.imread(str(tmp_path / "groups.png"))
  assert png.shape == (500, 800, 4)  # 8 x 5 inches at 100 dpi
  assert titles == ["ifca on synthetic_clusters, mclr, groups=2, lr=0.01, E=1, seed 0\n"
                    "each client's group per round; final ARI 0.500, purity 0.750 against "
                    "the true clusters"]
  table = plot.read_groups(str(tmp_path / "groups.csv"))
  assert table.client_ids == ["a", "b", "c", "d"] and list(table.rounds) == [1, 2, 3]
  np.testing.assert_array_equal(table.groups, [[0, -2, 1], [-1, -2, 0], [1, -2, 1],
                                               [-1, -2, -1]])
  # Rows sorted by the last round's group, then the one before: b (0), a (1, was
  # 0), c (1, was 1), d (no group).
  c0, c1 = matplotlib.colormaps["tab10"].colors[:2]
  grey, white = plot.NO_GROUP_COLOR, plot.NOT_KNOWN_COLOR
  expected = [[grey, white, c0], [c0, white, c1], [c1, white, c1], [grey, white, grey]]
  fig, ax = draw(table, titles[0])  # the same layout: where each cell's centre is
  fig.canvas.draw()
  for i, row in enumerate(expected):
    for t, color in enumerate(row):
      x, y = ax.transData.transform((t + 1, i))  # (round, row)
      np.testing.assert_allclose(png[int(round(500 - y)), int(round(x)), :3], color,
                                 atol=2 / 255, err_msg=f"row {i}, round {t + 1}")
  matplotlib.pyplot.close(fig)


def test_groups_csv_long_reads_as_the_wide_one_with_its_rule(tmp_path):
  _groups_run(tmp_path, groups_format="long").close()
  table = plot.read_groups(str(tmp_path / "groups.csv"), rounds=[1, 2, 3])
  assert table.client_ids == ["a", "b", "c", "d"] and list(table.rounds) == [1, 2, 3]
  # Round 2 wrote no line: every client keeps its round-1 group.
  np.testing.assert_array_equal(table.groups, [[0, 0, 1], [-1, -1, 0], [1, 1, 1],
                                               [-1, -1, -1]])


def test_groups_png_only_for_clustered_runs_and_ari_only_with_true_clusters(tmp_path,
                                                                            monkeypatch):
  plain = tmp_path / "plain"  # no group_<j>_size: not a clustered algorithm's run
  writer = _groups_run(plain, columns=["round", "test_accuracy"])
  writer.plot()
  writer.close()
  assert (plain / "groups.csv").exists() and (plain / "accuracy.png").exists()
  assert not (plain / "groups.png").exists()
  titles = []
  draw = plot.groups_figure
  monkeypatch.setattr(plot, "groups_figure",
                      lambda table, title="": titles.append(title) or draw(table, title))
  writer = _groups_run(tmp_path / "unscored", columns=GROUP_COLUMNS[:4])
  assert writer.plot_groups() == str(tmp_path / "unscored" / "groups.png")
  writer.close()
  assert titles[0].endswith("\neach client's group per round")


def test_groups_png_of_a_large_table_is_thinned(tmp_path):
  import time
  clients, rounds = 450, 500
  rng = np.random.default_rng(0)
  groups = np.repeat(rng.integers(-1, 3, (clients, 1)), rounds, axis=1)
  path = tmp_path / "groups.csv"
  with open(path, "w") as f:
    f.write(",".join(["round"] + [f"c{i}" for i in range(clients)]) + "\n")
    for r in range(rounds):
      f.write(",".join(map(str, [r + 1, *groups[:, r]])) + "\n")
  start = time.perf_counter()
  table = plot.read_groups(str(path))
  assert len(table.rounds) == plot.MAX_GROUP_ROUNDS and table.total_rounds == rounds
  assert table.rounds[0] == 1 and table.rounds[-1] == rounds
  assert plot.plot_groups(str(path), str(tmp_path / "groups.png")) is not None
  assert time.perf_counter() - start < 10
  # The rows drawn: evenly spaced in the sorted order, so the blocks keep their shares.
  order = plot.groups_order(table.groups)
  shown = table.groups[order[plot.spread(clients, plot.MAX_GROUP_CLIENTS)], -1]
  assert len(shown) == plot.MAX_GROUP_CLIENTS
  keys = np.where(shown >= 0, shown, 3)
  assert (np.diff(keys) >= 0).all()
  for g in (-1, 0, 1, 2):
    assert abs((shown == g).mean() - (groups[:, -1] == g).mean()) < 0.01


@pytest.fixture(scope="module")
def ifca_three_clusters_run(tmp_path_factory):
  # Three true clusters, two models: an assignment that is neither perfect nor trivial.
  return _run(tmp_path_factory.mktemp("ifca3") / "run", "--algo=ifca", "--num_groups=2",
              "--task=synthetic_clusters", "--task_arg=num_clusters=3", "--seed=0",
              "--num_clients=12", "--clients_per_round=4", "--rounds=2")


def _true_clusters(seed, num_clients, **task_args):
  from tff_cluster import tasks
  from tff_cluster.spec.task import DataOptions
  return tasks.get_task("synthetic_clusters").load_data(DataOptions(
      seed=seed, num_clients=num_clients, extra=task_args)).true_clusters


def test_ifca_summary_has_the_final_ari_and_purity_and_a_groups_png(ifca_three_clusters_run):
  run = ifca_three_clusters_run
  lines = _rows_of(run / "groups.csv")
  final = np.array([int(v) for v in lines[-1][1:]])
  assert lines[-1][0] == "2" and (final >= 0).all()  # --ifca_eval=assigned: every client
  ari, purity = _hand_ari_purity(_true_clusters(0, 12, num_clusters=3), final)
  assert 0 < ari < 1 and purity < 1, (ari, purity)  # neither trivial nor perfect
  summary = json.loads((run / "summary.json").read_text())
  assert summary["ari"] == pytest.approx(ari, abs=1e-12)
  assert summary["purity"] == pytest.approx(purity, abs=1e-12)
  from matplotlib import image
  assert image.imread(str(run / "groups.png")).shape == (500, 800, 4)


def test_fedgroup_summary_scores_only_the_clients_in_a_group(fedgroup_run):
  summary = json.loads((fedgroup_run / "summary.json").read_text())
  clients = _rows_of(fedgroup_run / "groups.csv")[0][1:]
  final = np.array([summary["final_assignment"][c] for c in clients])
  assert (final == -1).any()
  ari, purity = _hand_ari_purity(_true_clusters(2, 20), final)  # 5 clusters
  assert summary["ari"] == pytest.approx(ari, abs=1e-12)
  assert summary["purity"] == pytest.approx(purity, abs=1e-12)
  assert (fedgroup_run / "groups.png").exists()
