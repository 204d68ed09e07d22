"""Both stacks: TFF missing is one line naming the routes, `local` is the
default runner, Keras 3 models train, the other Keras is named, TensorFlow's
start-up notes stay off the CLI's output."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys

import numpy as np
import pytest

from tests.helpers import SMALL_ARGS, assert_one_line_error, main_in_process
from tff_cluster.spec import hparams as hp
from tff_cluster.host.driver import TrainingConfig
from tff_cluster import models, stack


ROUTES = ("uv sync --extra tff", "requirements-tff.txt", "0.1.0", "local runner")


@pytest.fixture
def no_tff(monkeypatch):
  """This process as if TFF were not installed (package metadata says so)."""
  real = stack._version
  monkeypatch.setattr(stack, "_version",
                      lambda name: None if name == "tensorflow-federated" else real(name))


def test_tff_problem_names_both_install_routes(no_tff, monkeypatch):
  problem = stack.tff_problem()
  assert "TensorFlow Federated is not installed" in problem and "\n" not in problem
  for needle in ROUTES:
    assert needle in problem, needle
  assert stack.tff_problem() is not None
  with pytest.raises(stack.TffUnavailableError, match="uv sync --extra tff"):
    stack.require_tff()
  # The trap on Python 3.12+: `pip install tensorflow-federated` gives 0.1.0.
  monkeypatch.setattr(stack, "_version", lambda name: "0.1.0")
  monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
  assert stack.tff_problem().startswith("tensorflow-federated 0.1.0 is installed, but the "
                                        "tff runner needs 0.87.0")


def test_tff_runner_without_tff_is_one_line_in_cli_and_api(no_tff, tmp_path, capsys):
  out = tmp_path / "out"
  code, _, err = main_in_process([*SMALL_ARGS, "--runner=tff", f"--output_dir={out}"],
                                 capsys)
  assert_one_line_error(code, err, out, "--runner=tff", *ROUTES, "--runner=local")
  from tff_cluster import api
  with pytest.raises(stack.TffUnavailableError, match="requirements-tff.txt"):
    api.build("fedavg", lambda: models.mclr(4, 2), models.SPARSE_CE_LOGITS, client_lr=0.1,
              local_epochs=1, batch_size=2, runner="tff")
  from tff_cluster.algorithms.fedavg import fedavg
  with pytest.raises(stack.TffUnavailableError, match="uv sync --extra tff"):
    fedavg.build_fedavg(lambda: models.mclr(4, 2), models.SPARSE_CE_LOGITS, None,
                        client_lr=0.1)


def test_tff_files_without_tff_are_a_data_error(no_tff, tmp_path):
  from tff_cluster.data import emnist
  from tff_cluster.data.federated import DataError
  with pytest.raises(DataError, match=r"emnist_all.sqlite needs TensorFlow Federated.*"
                                      r"LEAF FEMNIST JSON"):
    emnist.load_emnist(cache_dir=str(tmp_path))


def test_local_is_the_default_runner(tmp_path, capsys):
  from tff_cluster.host import loop
  assert hp.RUNNER.default == "local" and TrainingConfig(
      rounds=1, clients_per_round=1, local_epochs=1, batch_size=1, client_lr=0.1).runner.name == "local"
  out = tmp_path / "out"
  code, _, err = main_in_process([*SMALL_ARGS, "--rounds=1", f"--output_dir={out}"], capsys)
  assert code == 0, err
  config = json.loads((out / "config.json").read_text())
  assert config["runner"] == "local" and config["runner_info"]["runner"] == "local"
  assert config["versions"]["keras"] is not None


def test_model_weights_are_the_float_variables():
  """Keras 3 keeps its LSTM's random-generator state (int64) among the
  non-trainable variables; the weights are the float ones, as with tf_keras:
  embedding 1 (frozen) + 2 LSTMs x 3 + 2 dense x 2 = 11."""
  import tensorflow as tf
  model = models.sent140_lstm(np.random.default_rng(0).normal(size=(7, 5)), seq_len=4)
  variables = models.model_variables(model)
  assert len(variables) == 11 and len(model.trainable_variables) == 10
  assert all(tf.as_dtype(v.dtype).is_floating for v in variables)
  others = [v for v in model.non_trainable_variables if not tf.as_dtype(v.dtype).is_floating]
  assert len(model.non_trainable_variables) == 1 + len(others)
  weights = [np.full(v.shape, i, np.float32) for i, v in enumerate(variables)]
  models.set_weights(model, weights)
  for a, b in zip(models.get_weights(model), weights):
    np.testing.assert_array_equal(a, b)
  # BatchNorm statistics stay weights.
  assert len(models.model_variables(models.fmnist_cnn())) == 14


def test_a_model_of_the_other_keras_is_named():
  """tf.keras is Keras 3 unless TF_USE_LEGACY_KERAS=1 (then tf_keras): a model
  built with the other package is refused with one line naming the setting."""
  import tensorflow as tf
  from tff_cluster import api
  mine = api._keras_package(tf.keras.Model)
  other = {"keras": "tf_keras", "tf_keras": "keras"}[mine]
  if importlib.util.find_spec(other) is None or (
      other == "keras" and not _keras3_installed()):
    pytest.skip(f"{other} is not installed beside tf.keras ({mine})")
  package = __import__(other)

  def model_fn():
    inputs = package.Input(shape=(4,))
    return package.Model(inputs, package.layers.Dense(2)(inputs))

  with pytest.raises(TypeError) as e:
    api.build("fedavg", model_fn, models.SPARSE_CE_LOGITS, client_lr=0.1, local_epochs=1,
              batch_size=2)
  message = str(e.value)
  assert "\n" not in message and "TF_USE_LEGACY_KERAS" in message
  assert ("Keras 2 (`tf_keras`) model" in message) == (other == "tf_keras")


def _keras3_installed():
  from importlib import metadata
  try:
    return int(metadata.version("keras").split(".")[0]) >= 3
  except metadata.PackageNotFoundError:
    return False


def test_tensorflow_start_up_notes_are_dropped_and_the_rest_kept():
  text = "\n".join([
      "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
      "I0000 00:00:1795567029.301503   30790 port.cc:153] oneDNN custom operations are on.",
      "I0000 00:00:1795567029.302366   30790 cudart_stub.cc:31] Could not find cuda drivers",
      "I0000 00:00:1795567029.40   30790 cpu_feature_guard.cc:227] This TensorFlow binary is",
      "To enable the following instructions: AVX2 FMA, in other operations, rebuild it.",
      "E0000 00:00:1795567029.5   30790 cuda_dnn.cc:8579] Unable to register cuDNN factory",
      "a line of someone else's",
  ])
  assert stack.without_import_notes(text) == [
      "E0000 00:00:1795567029.5   30790 cuda_dnn.cc:8579] Unable to register cuDNN factory",
      "a line of someone else's"]



def test_requirements_tff_is_the_locks_export():
  """requirements-tff.txt (the pip route to the TFF stack) is uv.lock's export."""
  import subprocess

  from tests.conftest import REPO_ROOT
  command = ["python3", "-m", "uv", "export", "--frozen", "--extra", "tff", "--no-hashes",
             "--no-emit-project", "--no-header"]
  try:
    done = subprocess.run(command, cwd=str(REPO_ROOT), capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
  except OSError:
    pytest.skip("no python3 here to run uv")
  if done.returncode != 0 and "No module named uv" in done.stderr:
    pytest.skip("uv is not installed")
  assert done.returncode == 0, done.stderr
  lines = (REPO_ROOT / "requirements-tff.txt").read_text().splitlines()
  assert [line for line in lines if not line.startswith("#")] == \
      done.stdout.splitlines()


def test_base_dependencies_are_the_packages_the_library_imports():
  """pyproject's dependencies: each one imported by the library or the CLI, and
  no TFF, jax or tensorflow-datasets (today's stack installs without them)."""
  import ast
  import re

  from tests.conftest import REPO_ROOT
  tomllib = pytest.importorskip("tomllib")
  project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
  names = {re.match(r"[A-Za-z0-9_.-]+", d).group(0).lower() for d in project["dependencies"]}
  module_of = {"scikit-learn": "sklearn", "absl-py": "absl"}
  imported = set()
  for path in [REPO_ROOT / "run_experiment.py", *(REPO_ROOT / "tff_cluster").rglob("*.py")]:
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        imported |= {a.name.split(".")[0] for a in node.names}
      elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        imported.add(node.module.split(".")[0])
  assert {module_of.get(n, n) for n in names} <= imported, sorted(names)
  assert not names & {"tensorflow-federated", "jax", "jaxlib", "tensorflow-datasets"}
  assert project["requires-python"] == ">=3.10,<3.14"


def test_legacy_keras_without_a_matching_tf_keras_is_one_line(monkeypatch, tmp_path, capsys):
  installed = {"tensorflow": "2.21.0", "tf-keras": None}
  monkeypatch.setattr(stack, "_version", lambda name: installed.get(name))
  monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
  assert stack.keras_problem() is None  # Keras 3: nothing to check
  monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
  assert stack.keras_problem().startswith("TF_USE_LEGACY_KERAS=1 asks TensorFlow 2.21.0 for "
                                          "Keras 2, but tf-keras is not installed")
  assert "tf-keras~=2.21.0" in stack.keras_problem()
  out = tmp_path / "out"
  code, _, err = main_in_process([*SMALL_ARGS, f"--output_dir={out}"], capsys)
  assert_one_line_error(code, err, out, "TF_USE_LEGACY_KERAS=1", "legacy-keras")
  installed["tf-keras"] = "2.20.1"
  assert "tf-keras 2.20.1 does not match TensorFlow 2.21.0" in stack.keras_problem()
  installed["tf-keras"] = "2.21.0"
  assert stack.keras_problem() is None
  installed.update({"tensorflow": "2.14.1", "tf-keras": None})  # Keras 2 already
  assert stack.keras_problem() is None


def test_stack_sensitive_files_exist():
  """The TFF stack's phase runs `-m "tff or stack"`: a renamed test file left
  in STACK_SENSITIVE would drop out of that phase without a word."""
  from tests.conftest import STACK_SENSITIVE
  tests_dir = pathlib.Path(__file__).resolve().parent
  assert sorted(n for n in STACK_SENSITIVE if not (tests_dir / n).is_file()) == []
