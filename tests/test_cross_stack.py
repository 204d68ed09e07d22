"""The `local` runner gives the same numbers on both stacks, and a run
checkpointed on one stack (or runner) resumes on the other.

* The metric check runs small CLI experiments in-process and compares every
  per-round metric with `tests/data/cross_stack_reference.json`, written on
  the TFF stack (TensorFlow 2.14.1, tf_keras 2.14, numpy 1.25) by

      .venv-tff/bin/python -m tests.test_cross_stack --write

  On that stack it checks that the runs are reproducible; on today's stack
  (TensorFlow 2.21 with Keras 3, or tf_keras with TF_USE_LEGACY_KERAS=1) that
  nothing moved by more than `TOLERANCE`.
* The resume checks need both stacks' interpreters: the one running the tests
  and the other, named by TFF_CLUSTER_TODAY_PYTHON (today's stack, which
  `scripts/test.sh` gives the TFF stack's phase) or TFF_CLUSTER_TFF_PYTHON
  (the TFF stack); without it they are skipped.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT, SHARED_DATA

REFERENCE = REPO_ROOT / "tests" / "data" / "cross_stack_reference.json"
TOLERANCE = 1e-5  # per metric and round, absolute
# Keras 3's BatchNormalization trains with tf.nn.moments and
# tf.nn.batch_normalization where tf_keras calls TensorFlow's fused batch-norm
# kernel: other rounding. Measured on the WeCFL case (2 rounds): 3.04e-5 on
# mean_update_norm (an update norm of 1.19), 8.5e-6 on train_loss, equal
# accuracies; with tf_keras on TensorFlow 2.21, at most 8.4e-7.
KERAS3_BATCHNORM_TOLERANCE = 1e-4
BATCHNORM_CASES = ("wecfl_fmnist_cnn",)
TFF_PYTHON = os.environ.get("TFF_CLUSTER_TFF_PYTHON", "")
TODAY_PYTHON = os.environ.get("TFF_CLUSTER_TODAY_PYTHON", "")

SMALL = ("--num_clients=20", "--clients_per_round=5", "--local_epochs=1",
         "--progress=false")
FMNIST = str(SHARED_DATA / "fashion_mnist")
SENT140 = SHARED_DATA / "sent140_partial"
CASES = {
    # MCLR; FedGroup's cold start, groups and host random generator.
    "fedavg_synthetic": ("--algo=fedavg", "--task=synthetic", *SMALL, "--rounds=3"),
    "fedgroup_synthetic": ("--algo=fedgroup", "--task=synthetic", *SMALL, "--rounds=4"),
    # Clusters chosen by loss, persistent client momentum.
    "ifca_momentum": ("--algo=ifca", "--task=synthetic_clusters", *SMALL, "--rounds=3",
                      "--num_groups=2", "--client_momentum=0.9"),
    # A CNN with BatchNorm statistics among the weights.
    "wecfl_fmnist_cnn": ("--algo=wecfl", "--task=fmnist_clusterwise_class",
                         f"--data_dir={FMNIST}", "--num_clients=20",
                         "--task_arg=num_clusters=2", "--clients_per_round=20",
                         "--local_steps=2", "--rounds=2", "--progress=false"),
    # The LSTM (Keras 3 adds random-generator state to its variables).
    "fedavg_sent140_lstm": ("--algo=fedavg", "--task=sent140", f"--data_dir={SENT140}",
                            f"--glove_path={SENT140}", "--task_arg=min_tweets=5",
                            "--clients_per_round=10", "--local_epochs=1", "--rounds=1",
                            "--progress=false"),
}
NEEDS = {"wecfl_fmnist_cnn": SHARED_DATA / "fashion_mnist",
         "fedavg_sent140_lstm": SENT140}


def _metrics(rows):
  """Each round's numbers, timings left out."""
  return [{k: v for k, v in row.items() if not k.endswith("_seconds")} for row in rows]


def _read_rows(run_dir):
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    return _metrics([json.loads(line) for line in f])


def run_case(name: str, out_dir: str):
  """Runs CASES[name] in this process; its metric rows."""
  from tff_cluster import experiment as run_experiment
  argv = ["run_experiment.py", *CASES[name], f"--output_dir={out_dir}"]
  assert run_experiment.main(argv) == 0
  return _read_rows(out_dir)


def assert_rows_close(rows, expected, tolerance=TOLERANCE, what=""):
  assert [r["round"] for r in rows] == [r["round"] for r in expected], what
  for row, ref in zip(rows, expected):
    assert set(row) == set(ref), f"{what} round {ref['round']}: columns differ"
    for key, value in ref.items():
      got = row[key]
      if isinstance(value, (int, float)) and not isinstance(value, bool) and \
          got is not None and value is not None:
        assert math.isclose(got, value, rel_tol=0, abs_tol=tolerance), \
            f"{what} round {ref['round']} {key}: {got} vs reference {value}"
      else:
        assert got == value, f"{what} round {ref['round']} {key}: {got} vs {value}"


def _reference():
  with open(REFERENCE) as f:
    return json.load(f)


# ---------------------------------------------------------------------------
# The local runner's metrics on this stack against the TFF stack's.


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.xla  # the reference's runs resolved jit='auto' as users' runs do
def test_local_runner_metrics_equal_the_tff_stacks(name, tmp_path):
  if name in NEEDS and not NEEDS[name].exists():
    pytest.skip(f"{NEEDS[name]} not found")
  reference = _reference()
  assert list(reference["cases"][name]["args"]) == [
      a.replace(str(SHARED_DATA), "<shared>") for a in CASES[name]], \
      "the case changed: write the reference again on the TFF stack"
  rows = run_case(name, str(tmp_path / name))
  tolerance = (KERAS3_BATCHNORM_TOLERANCE if name in BATCHNORM_CASES and _keras3()
               else TOLERANCE)
  assert_rows_close(rows, reference["cases"][name]["rows"], tolerance, what=name)


def _keras3() -> bool:
  """Whether tf.keras is Keras 3 here (not tf_keras, not TF 2.14's Keras 2)."""
  from importlib import metadata

  import tensorflow as tf
  return (tf.keras.Model.__module__.split(".")[0] == "keras"
          and int(metadata.version("keras").split(".")[0]) >= 3)


# ---------------------------------------------------------------------------
# Checkpoints across stacks and runners (scripts/test.sh's tff phase).


def _pythons() -> dict[str, str]:
  """The interpreters of the two stacks: this one and the other one named in
  the environment ("" where it is not)."""
  from tff_cluster import stack
  if stack.tff_problem() is None:
    return {"tff-stack": sys.executable, "today": TODAY_PYTHON}
  return {"tff-stack": TFF_PYTHON, "today": sys.executable}


def _cli(python, case, out_dir, *extra):
  """CASES[case] (then `extra`), checkpointing every round: in this process
  where `python` is this interpreter (its Keras as the tests run it), else in
  a subprocess of `python` (without TF_USE_LEGACY_KERAS)."""
  args = [*CASES[case], "--checkpoint_every=1", f"--output_dir={out_dir}", *extra]
  if python == sys.executable and not os.environ.get("TF_USE_LEGACY_KERAS"):
    from tff_cluster import experiment as run_experiment
    assert run_experiment.main(["run_experiment.py", *args]) == 0
    return
  argv = [python, str(REPO_ROOT / "run_experiment.py"), *args]
  env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
  done = subprocess.run(argv, cwd=str(REPO_ROOT), capture_output=True, text=True,
                        timeout=600, env=env, stdin=subprocess.DEVNULL)
  assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("case,first,then", [
    # FedGroup: groups, pre-training flags and the host's random generator.
    ("fedgroup_synthetic", "tff-stack", "today"),
    ("fedgroup_synthetic", "today", "tff-stack"),
    # IFCA with persistent client momentum, rounds 1-2 on the tff runner.
    ("ifca_momentum", "tff-stack --runner=tff", "today"),
])
def test_a_checkpoint_resumes_on_the_other_stack(case, first, then, tmp_path):
  """The first rounds on one stack (and runner), stopped after round 2, the
  rest resumed on the other with the local runner: the metrics of the TFF
  stack's uninterrupted run. Today's stack runs Keras 3 here, whatever
  TF_USE_LEGACY_KERAS says."""
  pythons = _pythons()
  if not all(pythons.values()):
    pytest.skip("needs the other stack's interpreter: TFF_CLUSTER_TODAY_PYTHON on the TFF "
                "stack, TFF_CLUSTER_TFF_PYTHON on today's; scripts/test.sh's tff phase sets the first")
  first_python, *first_flags = first.split()
  out = tmp_path / "run"
  rounds = next(a for a in CASES[case] if a.startswith("--rounds="))
  _cli(pythons[first_python], case, out, *first_flags, "--rounds=2")
  saved = sorted(os.listdir(out / "checkpoints"))
  assert [n for n in saved if n.endswith(".npz")] == ["round-000001.npz", "round-000002.npz"]
  if case == "ifca_momentum":  # the clients' momentum buffers beside each archive
    assert [n for n in saved if n.endswith(".clients")] == ["round-000001.clients",
                                                             "round-000002.clients"]
  _cli(pythons[then], case, out, "--resume", "--runner=local", rounds)
  config = json.loads((out / "config.json").read_text())
  assert config["resumed_from_round"] == 2 and config["runner"] == "local"
  assert config["resumed_from"]["runner"] == ("tff" if first_flags else "local")
  assert (config["resumed_from"]["versions"]["tensorflow"] == "2.14.1") == (
      first_python == "tff-stack")
  assert_rows_close(_read_rows(out), _reference()["cases"][case]["rows"],
                    what=f"{first} -> {then}")
  summary = json.loads((out / "summary.json").read_text())
  assert summary["completed"] and summary["rounds_completed"] == int(rounds.split("=")[1])


# ---------------------------------------------------------------------------
# Writing the reference (on the TFF stack only).


def write_reference() -> None:
  import tempfile

  from tff_cluster import stack
  if stack.tff_problem() is not None:
    sys.exit("write the reference on the TFF stack (.venv-tff/bin/python -m "
             "tests.test_cross_stack --write)")
  cases = {}
  with tempfile.TemporaryDirectory() as tmp:
    for name in sorted(CASES):
      rows = run_case(name, os.path.join(tmp, name))
      cases[name] = {"args": [a.replace(str(SHARED_DATA), "<shared>") for a in CASES[name]],
                     "rows": rows}
  REFERENCE.parent.mkdir(exist_ok=True)
  with open(REFERENCE, "w") as f:
    json.dump({"written_on": stack.versions(), "tolerance": TOLERANCE, "cases": cases}, f,
              indent=1, sort_keys=True)
    f.write("\n")
  print(f"wrote {REFERENCE}")


if __name__ == "__main__":
  if sys.argv[1:] != ["--write"]:
    sys.exit("usage: python -m tests.test_cross_stack --write")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  write_reference()
