"""Shared pytest setup: quiet TensorFlow, paths, the `tff` marker, one TFF worker
per session on the TFF stack."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pathlib  # noqa: E402

import pytest  # noqa: E402

from tff_cluster import stack  # noqa: E402  (imports neither TF nor TFF)

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
TFF_PROBLEM = stack.tff_problem()


def pytest_collection_modifyitems(config, items):
  """A test run on the `tff` runner is a TFF test (`-m "not tff"` leaves it
  out), and every TFF test is skipped, with the reason, where TFF is missing."""
  del config
  for item in items:
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
  from tff_cluster import runtime
  active = runtime.start()
  yield active
  runtime.stop()
