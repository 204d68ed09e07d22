"""Shared pytest setup: quiet TensorFlow, paths, one TFF worker per session."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pathlib  # noqa: E402

import pytest  # noqa: E402

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session", autouse=True)
def tff_worker():
  """Starts the TFF C++ worker from the main thread (so PR_SET_PDEATHSIG is
  tied to a thread that lives as long as the session) and stops it at the end.

  Tests that stop it (in-process CLI runs leave `runtime.tff_runtime()`) get a
  fresh one lazily on the next computation.
  """
  from tff_cluster import runtime
  active = runtime.start()
  yield active
  runtime.stop()
