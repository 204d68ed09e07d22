"""A plain `pip install` of the checkout, as Colab and pip users do it.

Run by scripts/test.sh in environments made for it, never in the suite's own:

* `colab`: Python 3.13 holding Colab's packages (.ci/colab-constraints.txt),
  the library not installed; the notebook's first cell, in "hosted" mode,
  `pip install`s the checkout, which must leave TensorFlow, Keras, numpy and
  the rest as Colab has them;
* `pip`: a fresh Python 3.12 venv into which the script ran
  `pip install '.[legacy-keras]'`, resolving today's TensorFlow from PyPI.

Then, with the installed package (imported from outside the checkout): a
3-round CLI run on the default runner, and `api.build` training a Keras 3
model and, with TF_USE_LEGACY_KERAS=1, a tf_keras model, to the same numbers.
Elsewhere every test here is skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO_ROOT

MODE = os.environ.get("TFF_CLUSTER_PIP_PHASE", "")
pytestmark = pytest.mark.skipif(MODE not in ("colab", "pip"), reason=(
    "needs an environment made by scripts/test.sh's colab or pip phase "
    "(TFF_CLUSTER_PIP_PHASE)"))


def _python(code, cwd, **env):
  """`code` in a fresh interpreter of this environment, outside the checkout."""
  full = {k: v for k, v in os.environ.items() if k not in ("TF_USE_LEGACY_KERAS",
                                                          "PYTHONPATH")}
  full.update(env)
  done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=str(cwd),
                        capture_output=True, text=True, timeout=900, env=full,
                        stdin=subprocess.DEVNULL)
  assert done.returncode == 0, done.stderr[-3000:]
  return done.stdout


def _freeze(cwd):
  """Installed distributions: normalised name -> version (pip's own list)."""
  out = subprocess.run([sys.executable, "-m", "pip", "list", "--format=json",
                        "--disable-pip-version-check"], cwd=str(cwd), capture_output=True,
                       text=True, check=True).stdout
  return {d["name"].lower().replace("_", "-"): d["version"] for d in json.loads(out)}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
  """The library installed in this environment (by the notebook's first cell
  in the colab phase); the packages before and after. The notebook runs from
  a folder outside the checkout, on the installed library."""
  outside = tmp_path_factory.mktemp("outside")
  before = _freeze(outside)
  hosted = {}
  if MODE == "colab":
    assert "tff-cluster" not in before, "the colab phase starts without the library"
    hosted = {"COLAB_RELEASE_TAG": "colab-like", "TFF_CLUSTER_SOURCE": str(REPO_ROOT)}
  nb_dir = tmp_path_factory.mktemp("content")  # not the checkout: `..` is no help
  shutil.copy(REPO_ROOT / "notebooks" / "quickstart.ipynb", nb_dir)
  import nbclient
  import nbformat
  nb = nbformat.read(nb_dir / "quickstart.ipynb", as_version=4)
  saved = {k: os.environ.get(k) for k in hosted}
  os.environ.update(hosted)
  try:
    nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": str(nb_dir)}}).execute()
  finally:
    for k, v in saved.items():
      os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
  outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                    for o in c.get("outputs", []))
  assert "round 20: test accuracy" in outputs and "ARI" in outputs
  assert "site-packages" in outputs  # the installed library ran, not the checkout
  return before, _freeze(outside), outside


def test_install_keeps_the_runtimes_packages_and_brings_no_tff(installed):
  before, after, _ = installed
  assert "tff-cluster" in after and after["tff-cluster"] == "0.2.0"
  assert "tensorflow-federated" not in after
  major, minor = (int(x) for x in after["tensorflow"].split(".")[:2])
  assert (major, minor) >= (2, 16)
  assert int(after["keras"].split(".")[0]) >= 3
  if MODE == "colab":  # pip left Colab's stack as it was
    changed = {k: (before.get(k), v) for k, v in after.items()
               if k != "tff-cluster" and before.get(k) != v}
    assert not changed, changed
    assert after["tensorflow"] == "2.20.0" and after["numpy"] == "2.1.3"


def _outside_env():
  return {k: v for k, v in os.environ.items() if k not in ("TF_USE_LEGACY_KERAS", "PYTHONPATH")}


def test_the_installed_command_runs_outside_the_checkout(installed, tmp_path):
  """`tff-cluster` (the console script pip installed) from a folder outside
  the checkout: two rounds on the default runner, its first line naming the
  device that trained (recorded in config.json too); `python -m tff_cluster
  --help` prints the command's help."""
  _, _, outside = installed
  command = shutil.which("tff-cluster", path=os.path.dirname(sys.executable))
  assert command, "pip installed no tff-cluster command beside this interpreter"
  out = tmp_path / "run"
  done = subprocess.run([command, "--algo=fedavg", "--task=synthetic", "--rounds=2",
                         "--noprogress", f"--output_dir={out}"],
                        cwd=str(outside), capture_output=True, text=True, timeout=900,
                        stdin=subprocess.DEVNULL, env=_outside_env())
  assert done.returncode == 0, done.stderr[-3000:]
  summary = json.loads((out / "summary.json").read_text())
  config = json.loads((out / "config.json").read_text())
  assert summary["completed"] and summary["rounds_completed"] == 2
  assert config["runner"] == "local" and config["versions"]["tensorflow_federated"] is None
  device = config["runner_info"]["device"]
  assert f"runner local on {device})" in done.stderr, done.stderr[-2000:]
  helped = subprocess.run([sys.executable, "-m", "tff_cluster", "--help"], cwd=str(outside),
                          capture_output=True, text=True, timeout=300, env=_outside_env())
  assert helped.returncode == 0 and "Algorithms (--algo):" in helped.stdout, helped.stderr


@pytest.mark.skipif(MODE != "pip", reason="the pip phase's environment has the build tools")
def test_building_the_package_prints_no_setuptools_warning(tmp_path):
  """The package's metadata builds (setuptools' own build hook, into a temporary
  folder: nothing is written in the checkout) without setuptools' warnings
  (an SPDX `project.license`)."""
  done = subprocess.run([sys.executable, "-W", "always", "-c",
                         "import setuptools.build_meta as b, sys; "
                         "b.prepare_metadata_for_build_wheel(sys.argv[1])", str(tmp_path)],
                        cwd=str(REPO_ROOT), capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  assert list(tmp_path.glob("*.dist-info")), "no metadata was built"
  log = done.stdout + done.stderr
  assert "SetuptoolsDeprecationWarning" not in log and "SetuptoolsWarning" not in log, [
      line for line in log.splitlines() if "Warning" in line][:5]


@pytest.mark.skipif(MODE != "colab", reason="Colab's runtime has ipywidgets")
def test_a_notebook_shows_the_training_bar_as_a_widget(installed, tmp_path):
  """In a notebook (a kernel run by nbclient, Colab's packages) a run's
  progress bar is tqdm's widget, not text."""
  import nbclient
  import nbformat
  _, _, outside = installed
  nb = nbformat.v4.new_notebook()
  nb.cells = [nbformat.v4.new_code_cell(textwrap.dedent(f"""
      from tff_cluster import experiment
      code = experiment.main(["tff-cluster", "--algo=fedavg", "--task=synthetic",
                              "--rounds=2", "--output_dir={tmp_path / 'run'}"])
      assert code == 0, code
      """))]
  nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                          resources={"metadata": {"path": str(outside)}}).execute()
  outputs = nb.cells[0].outputs
  widgets = [o for o in outputs if o.get("output_type") == "display_data"
             and "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
  assert widgets, [o.get("output_type") for o in outputs]


API_RUN = """
    import json, numpy as np, tensorflow as tf, tff_cluster
    from tff_cluster import api, models, tasks
    from tff_cluster.spec.task import DataOptions
    data = tasks.get_task("synthetic_clusters").load_data(DataOptions(seed=0, num_clients=12))
    def model_fn():
      inputs = tf.keras.Input(shape=(60,))
      return tf.keras.Model(inputs, tf.keras.layers.Dense(10)(inputs))
    process = api.build("ifca", model_fn,
                        tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                        client_lr=0.05, local_epochs=1, batch_size=10, num_groups=2)
    state = process.initialize(data)
    for _ in range(2):
      out = process.next(state, data.client_ids[:6])
      state = out.state
    print(json.dumps({"keras": type(model_fn()).__module__.split(".")[0],
                      "library": tff_cluster.__file__,
                      "accuracy": out.metrics["test_accuracy"],
                      "loss": out.metrics["test_loss"]}))
"""


def test_api_trains_keras3_and_tf_keras_models_alike(installed):
  _, _, outside = installed
  keras3 = json.loads(_python(API_RUN, outside).splitlines()[-1])
  legacy = json.loads(_python(API_RUN, outside, TF_USE_LEGACY_KERAS="1").splitlines()[-1])
  assert keras3["keras"] == "keras" and legacy["keras"] == "tf_keras"
  for run in (keras3, legacy):
    assert "site-packages" in run["library"]  # the installed package
  assert keras3["accuracy"] == legacy["accuracy"]
  assert abs(keras3["loss"] - legacy["loss"]) <= 1e-5
