"""The run directory (`tff_cluster.io.rundir`): its readers, which entries
belong to a run, and the values derived from declarations and column names
(TensorBoard sections, maximised columns, the settings that TensorBoard's
HParams and the plot's labels name), checked against the literal lists they
replace for every registered algorithm."""

from __future__ import annotations

import json
import math
import os
import re

import numpy as np
import pytest

from tff_cluster import registry
from tff_cluster.host.driver import TrainingConfig
from tff_cluster.io import plot
from tff_cluster.io import results
from tff_cluster.io import rundir

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The lists the derivations replace, as they were written out by hand.
OLD_GROUP_TAGS = re.compile(r"^(group_|cfl_)|^(num_clusters|ari|purity|num_changed|"
                            r"num_assigned|num_cold_clients|kmeans_objective)$")
OLD_MAXIMIZED = ("test_accuracy_assigned", "test_accuracy_client_mean", "test_accuracy_clientavg",
                 "test_accuracy_p10", "test_accuracy_p50", "test_accuracy_p90", "test_macro_f1")
OLD_HPARAM_KEYS = ("algo", "task", "model", "seed", "rounds", "clients_per_round",
                   "batch_size", "client_lr", "local_epochs", "local_steps", "lr_decay",
                   "client_momentum", "client_state", "eval_every", "num_clients", "runner",
                   "jit", "client_batching", "client_chunk",
                   # The aggregation slot's settings (docs/privacy.md), added since.
                   "aggregator", "clip", "noise_multiplier", "dp_epsilon", "dp_delta",
                   "clip_quantile", "clip_lr", "clip_count_stddev", "trim_fraction")
OLD_KEY_SETTINGS = (("algo", ""), ("task", ""), ("model", ""), ("num_groups", "groups"),
                    ("client_lr", "lr"), ("local_epochs", "E"), ("local_steps", "steps"),
                    ("runner", "runner"))
OLD_OTHER_SETTINGS = ("batch_size", "clients_per_round", "rounds", "num_clients", "lr_decay",
                      "client_momentum", "client_state", "eval_every",
                      # The aggregation slot's settings, added since.
                      "aggregator", "clip", "noise_multiplier", "dp_epsilon", "dp_delta",
                      "clip_quantile", "clip_lr", "clip_count_stddev", "trim_fraction", "jit",
                      "client_batching", "synthetic_alpha", "synthetic_beta", "data_dir",
                      "glove_path")


def _old_tag(column):
  if column in ("bytes_down", "bytes_up"):
    return f"comm/{column}"
  if column.endswith("_seconds"):
    return f"time/{column}"
  if OLD_GROUP_TAGS.search(column):
    return f"groups/{column}"
  return f"metrics/{column}"


def _old_format(value):
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, float):
    return f"{value:g}"
  return str(value)


def _old_run_settings(config):
  out = {}
  for name, _ in OLD_KEY_SETTINGS:
    if config.get(name) is not None:
      out[name] = config[name]
  for name, value in sorted((config.get("algo_options") or {}).items()):
    if value is not None and name not in out:
      out[name] = value
  for name in OLD_OTHER_SETTINGS:
    if config.get(name) is not None:
      out[name] = config[name]
  for name, value in sorted((config.get("task_args_applied") or {}).items()):
    out[f"task_arg.{name}"] = value
  return out


# ---------------------------------------------------------------------------
# Derived values equal the literal lists, for every registered algorithm.


@pytest.fixture(scope="module")
def algorithm_columns():
  """{algo: its metrics columns}, from a driver of each registered algorithm
  (its first parity case's options) on a task with true clusters."""
  from tests.test_runners import ALL_CLIENTS, PARITY_CASES, with_case_model
  from tff_cluster import tasks
  from tff_cluster.host import loop
  from tff_cluster.spec.task import DataOptions
  task = tasks.get_task("synthetic_clusters")
  data = task.load_data(DataOptions(seed=2, num_clients=12, extra={"num_clusters": 3}))
  out = {}
  for algo in registry.ALGORITHMS:
    algo_task, options = with_case_model(task, PARITY_CASES[algo][0])
    config = TrainingConfig.checked(**{
        "rounds": 2, "batch_size": 10, "client_lr": 0.02, "local_epochs": 1,
        "clients_per_round": data.num_clients if algo in ALL_CLIENTS else 4, "seed": 1,
        "runner": "local", **options.pop("_config", {})})
    driver = registry.build_driver(algo, algo_task, data, config, **options)
    out[algo] = [*loop.BASE_COLUMNS, *driver.extra_columns]
  return out


# The algorithms of the old list; later ones are held to the documented rule.
OLD_ALGORITHMS = {"cfl", "cfl_mgd", "fedavg", "fedavg_plus", "fedavgm", "fedgroup",
                  "fedgrouprox", "fedmom", "fednag", "fedprox", "fedprox_plus", "fesem", "ifca",
                  "mime", "mime_lite", "pfedmo", "slowmo", "wecfl"}


def _documented_tag(column, algo):
  """docs/outputs.md: groups/ for group_*, counts num_*, ari, purity, *_objective
  and an algorithm's own <algo>_* diagnostics."""
  if column.startswith("bytes_"):
    return f"comm/{column}"
  if column.endswith("_seconds"):
    return f"time/{column}"
  if (column.startswith(("group_", "num_", f"{algo}_")) or column in ("ari", "purity")
      or column.endswith("_objective")):
    return f"groups/{column}"
  return f"metrics/{column}"


def test_tensorboard_sections_equal_the_old_list_for_every_algorithm(algorithm_columns):
  assert set(algorithm_columns) == set(registry.ALGORITHMS)
  for algo, columns in algorithm_columns.items():
    for column in columns:
      want = _old_tag(column) if algo in OLD_ALGORITHMS else _documented_tag(column, algo)
      assert results.tensorboard_tag(column, algo) == want, (algo, column)
  assert results.tensorboard_tag("stocfl_merges", "stocfl") == "groups/stocfl_merges"
  # The columns that named an algorithm or a method in the old list.
  assert "cfl_splits" in algorithm_columns["cfl"]
  assert "kmeans_objective" in algorithm_columns["wecfl"]


def _documented_list(name: str) -> set:
  """The `--algo` names of docs/outputs.md's "- <name> list (...): ..." line."""
  text = open(os.path.join(REPO_ROOT, "docs", "outputs.md")).read()
  line = next(l for l in text.splitlines() if l.startswith(f"- {name} list ("))
  return set(re.findall(r"`([a-z0-9_]+)`", line.split("): ", 1)[1]))


def test_outputs_doc_lists_the_algorithms_that_write_groups_and_cluster_scores(
    algorithm_columns):
  """docs/outputs.md's lists, against what each algorithm's rows hold on a
  task with true clusters: `group_<j>_size` (groups.png) and `ari`."""
  groups = {a for a, cols in algorithm_columns.items()
            if any(re.fullmatch(r"group_\d+_size", c) for c in cols)}
  scored = {a for a, cols in algorithm_columns.items() if "ari" in cols and "purity" in cols}
  assert "flhc" in groups and "flhc" in scored
  assert _documented_list("Groups") == groups
  assert _documented_list("ARI") == scored


def test_maximized_columns_equal_the_old_list_for_every_algorithm(algorithm_columns):
  for algo, columns in algorithm_columns.items():
    assert results.maximized_columns(columns) == [c for c in OLD_MAXIMIZED
                                                  if c in columns], algo
  assert "test_accuracy_assigned" in results.maximized_columns(algorithm_columns["fedgroup"])
  # pFedMo's global model's accuracy is a metric, not one of the run's scores.
  assert "global_test_accuracy" in algorithm_columns["pfedmo"]
  assert "global_test_accuracy" not in results.maximized_columns(algorithm_columns["pfedmo"])


def test_summary_maximizes_the_derived_columns():
  rows = [{"round": 1, "test_accuracy": 0.5, "test_accuracy_assigned": 0.7,
           "test_macro_f1": 0.2, "global_test_accuracy": 0.9, "test_loss": 0.1},
          {"round": 2, "test_accuracy": 0.6, "test_accuracy_assigned": 0.65,
           "test_macro_f1": math.nan, "global_test_accuracy": 0.95, "test_loss": 0.05}]
  summary = results.summarize(rows, 2)
  assert summary["max_test_accuracy_assigned"] == 0.7
  assert summary["max_test_accuracy_assigned_round"] == 1
  assert summary["final_test_accuracy_assigned"] == 0.65
  assert summary["max_test_macro_f1"] == 0.2 and summary["final_test_macro_f1"] == 0.2
  assert not any(k.endswith(("global_test_accuracy", "test_loss")) for k in summary)


def test_hparams_and_plot_settings_equal_the_old_lists():
  assert len(rundir.HYPERPARAMETERS) == len(set(rundir.HYPERPARAMETERS))
  assert set(rundir.HYPERPARAMETERS) == set(OLD_HPARAM_KEYS)
  assert plot.KEY_SETTINGS == tuple(n for n, _ in OLD_KEY_SETTINGS)
  assert plot.OTHER_SETTINGS == OLD_OTHER_SETTINGS
  assert {n: s for n, s in OLD_KEY_SETTINGS if s and s != n} == {
      n: s for n, s in plot.SHORT_NAMES.items() if n in plot.KEY_SETTINGS}
  assert plot.SHORT_NAMES["batch_size"] == "B"
  assert plot.SHORT_NAMES["clients_per_round"] == "clients/round"


@pytest.mark.parametrize("algo", sorted(registry.ALGORITHMS))
def test_plot_labels_equal_the_old_ones_for_every_algorithm(algo):
  """Two runs of `algo` at its options' defaults, one with another learning
  rate and a float option, the other with a float decay: the settings, the
  title and the legends are what the old lists gave."""
  options = {d.name: d.default for d in registry.ALGORITHMS[algo].hparams}
  base = {"algo": algo, "task": "synthetic", "model": "mclr", "seed": 0, "rounds": 20,
          "batch_size": 10, "clients_per_round": 5, "client_lr": 0.01, "local_epochs": 1,
          "runner": "local", "jit": "auto", "client_batching": "auto", "client_chunk": 4,
          "lr_decay": 1.0, "synthetic_alpha": 0.5, "algo_options": options,
          "task_args_applied": {"samples_per_client": 0}}
  other = dict(base, client_lr=1.0, lr_decay=0.5, seed=1)
  for config in (base, other):
    assert plot.run_settings(config) == _old_run_settings(config)
  runs = [plot.Run(f"r{i}", c, [], []) for i, c in enumerate((base, other))]
  groups = (f", groups={_old_format(options['num_groups'])}" if "num_groups" in options
            else "")
  title, labels = plot.describe(plot.group_runs(runs))
  assert title == f"{algo} on synthetic, mclr{groups}, E=1, runner=local"
  assert labels == [f"{algo}, lr=0.01, lr_decay=1, seed 0",
                    f"{algo}, lr=1, lr_decay=0.5, seed 1"]
  single = plot.describe(plot.group_runs(runs[:1]))[0]
  assert single == (f"{algo} on synthetic, mclr{groups}, lr=0.01, E=1, runner=local, B=10, "
                    "clients/round=5, rounds=20, seed 0")


def test_label_values_are_the_old_format():
  for value in (True, False, 0.01, 1.0, 1e-5, 0.30000000000000004, 3, "auto", None):
    assert plot._label_value(value) == _old_format(value)


# ---------------------------------------------------------------------------
# The readers.


def test_every_run_file_is_named_in_docs_outputs():
  text = open(os.path.join(REPO_ROOT, "docs", "outputs.md")).read()
  for name in (*rundir.RUN_FILES, *(f"{d}/" for d in rundir.RUN_DIRS), rundir.CLIENTS_JSON,
               *(f"{k}/" for k in rundir.MODEL_KINDS)):
    assert f"`{name}`" in text, name
  assert "eval_<task>.json" in text


def test_read_config_and_summary(tmp_path):
  run = str(tmp_path)
  assert rundir.read_config(run, missing_ok=True) == {}
  assert rundir.read_summary(run) is None
  with pytest.raises(rundir.RunDirError, match=r"cannot read .*config\.json \(FileNotFound"):
    rundir.read_config(run)
  (tmp_path / "config.json").write_text('{"algo": "ifca", "runner_info": {"runner": "local"}}')
  assert rundir.read_config(run)["runner_info"] == {"runner": "local"}
  (tmp_path / "summary.json").write_text('{"completed": true}')
  assert rundir.read_summary(run) == {"completed": True}
  (tmp_path / "config.json").write_text("[1, 2]")
  with pytest.raises(rundir.RunDirError, match="is not a JSON object"):
    rundir.read_config(run)
  (tmp_path / "summary.json").write_text("{")
  with pytest.raises(rundir.RunDirError, match=r"summary\.json \(JSONDecodeError\)"):
    rundir.read_summary(run)


def test_read_metrics_prefers_the_file_asked_for(tmp_path):
  (tmp_path / "metrics.csv").write_text("round,test_loss\n1,nan\n2,\n3,0.5")  # torn: kept
  (tmp_path / "metrics.jsonl").write_text(
      json.dumps({"round": 1, "test_loss": None, "nonfinite": ["test_loss"]}) + "\n"
      + json.dumps({"round": 2, "test_loss": 0.25}) + "\n{\"round\": 3")  # torn: skipped
  columns, rows = rundir.read_metrics(str(tmp_path))
  assert columns == ["round", "test_loss"] and len(rows) == 3
  assert math.isnan(rows[0]["test_loss"]) and rows[1]["test_loss"] is None
  _, rows = rundir.read_metrics(str(tmp_path), first=rundir.METRICS_JSONL)
  assert len(rows) == 2 and math.isnan(rows[0]["test_loss"]) and rows[1]["test_loss"] == 0.25
  with pytest.raises(ValueError, match="unknown metrics file"):
    rundir.read_metrics(str(tmp_path), first="groups.csv")
  with pytest.raises(rundir.RunDirError, match="has no metrics.csv or metrics.jsonl"):
    rundir.read_metrics(str(tmp_path / "gone"))


def test_saved_models_are_read_back(tmp_path):
  directory = rundir.models_dir(str(tmp_path), "best")
  assert directory == os.path.join(str(tmp_path), "models", "best")
  with pytest.raises(ValueError, match="valid: final, best"):
    rundir.models_dir(str(tmp_path), "last")
  os.makedirs(directory)
  weights = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(3, np.float32)]
  np.savez(rundir.model_stem(directory, 0) + ".npz",
           **{f"w{i}": w for i, w in enumerate(weights)})
  read = rundir.read_model_npz(directory, 0)
  assert [w.tolist() for w in read] == [w.tolist() for w in weights]
  assert rundir.read_model_npz(directory, 1) is None
  with pytest.raises(rundir.RunDirError, match=r"clients\.json"):
    rundir.read_clients(directory)
  (tmp_path / "models" / "best" / "clients.json").write_text('{"round": 3}')
  with pytest.raises(rundir.RunDirError, match="lacks round, num_models or client_model"):
    rundir.read_clients(directory)
  info = {"round": 3, "num_models": 1, "client_model": {"a": 0}}
  (tmp_path / "models" / "best" / "clients.json").write_text(json.dumps(info))
  assert rundir.read_clients(directory) == info
  assert rundir.eval_path("run", "mnist") == os.path.join("run", "eval_mnist.json")


def test_foreign_entries_follow_the_run_entries(tmp_path):
  """A run's directory: its files, checkpoints, models and eval reports are
  its own; anything else is named (folders with a slash)."""
  (tmp_path / "config.json").write_text(json.dumps(
      {"algo": "fedavg", "task": "synthetic", "seed": 0, "rounds": 3}))
  for name in ("metrics.csv", "summary.json", "eval_mnist.json", "groups.png",
               "checkpoints/round-000003.npz", "checkpoints/round-000003.clients/part-000000.npz",
               "models/final/model_0.npz", "models/best/clients.json",
               "tensorboard/events.out.tfevents.1", "summary.json.tmp-12"):
    os.makedirs(os.path.dirname(tmp_path / name), exist_ok=True)
    (tmp_path / name).write_text("")
  assert rundir.foreign_entries(str(tmp_path)) == []
  (tmp_path / "notes.txt").write_text("")
  (tmp_path / "models" / "final" / "other.bin").write_text("")
  os.makedirs(tmp_path / "data")
  assert rundir.foreign_entries(str(tmp_path)) == ["data/", "models/final/other.bin",
                                                   "notes.txt"]
  (tmp_path / "config.json").write_text('{"algo": "fedavg"}')  # not a run's config
  assert "config.json" in rundir.foreign_entries(str(tmp_path))



def test_evaluate_reads_and_writes_the_run_dir_it_is_given(tmp_path, monkeypatch):
  """A run directory moved or copied elsewhere: `python -m tff_cluster.evaluate
  RUN_DIR` evaluates RUN_DIR's models, not those of the directory its
  config.json recorded."""
  from tff_cluster import evaluate
  (tmp_path / "config.json").write_text(json.dumps(
      {"algo": "fedavg", "task": "synthetic", "seed": 0, "rounds": 2,
       "output_dir": str(tmp_path / "elsewhere")}))
  seen = {}
  monkeypatch.setattr(evaluate, "evaluate_saved",
                      lambda settings, present=(): seen.update(settings))
  assert evaluate.main(["evaluate", str(tmp_path)]) == 0
  assert seen["output_dir"] == str(tmp_path) and seen["task"] == "synthetic"
