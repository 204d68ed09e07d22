"""Shared pytest setup: quiet TensorFlow, paths (and `shared_data`, which skips a
test where ../shared/data is absent), the `tff` and `stack` markers, one TFF
worker per session on the TFF stack."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# The parity tests compare the runners to 1e-4 relative / 1e-6 absolute. On a
# CPU with AVX-512 and AMX, oneDNN's kernels for them sum in another order than
# its AVX2 ones: measured there (2 cores, TF 2.14), a pFedMo weight came 7.2e-6
# apart between the `tff` and `local` runners; with oneDNN capped at AVX2 it
# matches. The tests run with that cap (this process, the TFF worker and every
# run they start) so that their numbers do not depend on the CPU's vector
# width; a CPU without AVX-512 is not affected.
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

import pathlib  # noqa: E402

import pytest  # noqa: E402

from tff_cluster import stack  # noqa: E402  (imports neither TF nor TFF)

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
# The real data sets (FEMNIST, MNIST, Fashion-MNIST, Sent140) beside the
# checkout, as in CI; a fresh clone alone has none: tests that read them call
# `shared_data` and are skipped, saying why.
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


def shared_data(name: str) -> pathlib.Path:
  """`SHARED_DATA / name`; skips the calling test, with the reason, when it is
  absent (a checkout without ../shared/data beside it)."""
  path = SHARED_DATA / name
  if not path.exists():
    pytest.skip(f"needs the real data {path} (../shared/data beside the checkout), "
                "absent here")
  return path


def exhaustive() -> bool:
  """TFF_CLUSTER_EXHAUSTIVE=1: the tests that CI runs on a representative set
  of algorithms (for its time) run on every algorithm."""
  return os.environ.get("TFF_CLUSTER_EXHAUSTIVE", "") not in ("", "0")


TFF_PROBLEM = stack.tff_problem()

# The test files whose outcome depends on the TensorFlow / Keras version
# (models, training steps, the public API, data loading, the CLI, files written
# on one stack and read on another): marked `stack`. The TFF stack's phase runs
# `-m "tff or stack"`: the TFF tests and these; every other test is run on
# today's stack only (`-m "not tff"`).
STACK_SENSITIVE = frozenset({
    "test_aggregators.py", "test_api.py", "test_cli.py", "test_cross_stack.py",
    "test_data_loaders.py", "test_local_training.py", "test_models.py", "test_optimizers.py",
    "test_results.py", "test_stack.py", "test_tasks.py",
})


def pytest_collection_modifyitems(config, items):
  """A test run on the `tff` runner is a TFF test (`-m "not tff"` leaves it
  out), a test in a STACK_SENSITIVE file is a `stack` test, and every TFF test
  is skipped, with the reason, where TFF is missing."""
  del config
  for item in items:
    if item.path.name in STACK_SENSITIVE:
      item.add_marker(pytest.mark.stack)
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("runner") == "tff":
      item.add_marker(pytest.mark.tff)
    if TFF_PROBLEM is not None and item.get_closest_marker("tff") is not None:
      item.add_marker(pytest.mark.skip(reason="needs the TFF stack (tensorflow-federated "
                                              "0.87, Python 3.10/3.11)"))


@pytest.fixture(scope="session", autouse=True)
def tff_worker():
  """On the TFF stack: starts the TFF C++ worker from the main thread (so
  PR_SET_PDEATHSIG is tied to a thread that lives as long as the session) and
  stops it at the end. Elsewhere: nothing (None).

  Tests that stop it (in-process CLI runs leave `runtime.tff_runtime()`) get a
  fresh one lazily on the next computation.
  """
  if TFF_PROBLEM is not None:
    yield None
    return
  from tff_cluster.runners.tff import runtime
  active = runtime.start()
  yield active
  runtime.stop()
