"""Stretches of code that a stop signal's exception must not break into.

A stop signal's Python handler runs wherever the main thread happens to be.
Raising its exception from inside TensorFlow's eager C++ code (measured: a
SIGHUP's `SystemExit` raised while `tf.summary.scalar` converted its value,
during a round's TensorBoard write) can crash the process with a segmentation
fault instead of closing the run. Inside `deferred()` the library's handlers
(the CLI's, `runtime.tff_runtime`'s) only record the signal (`note`); the
training loop raises it at its next check, right after the stretch.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

_DEPTH = [0]
_RECEIVED = {"signum": None}


def note(signum: Optional[int]) -> None:
  """Records that stop signal `signum` arrived (None clears it)."""
  _RECEIVED["signum"] = signum


def received() -> Optional[int]:
  """The stop signal recorded since the last clearing, or None."""
  return _RECEIVED["signum"]


@contextlib.contextmanager
def deferred() -> Iterator[None]:
  """While the body runs, `are_deferred()` is True (nesting allowed)."""
  _DEPTH[0] += 1
  try:
    yield
  finally:
    _DEPTH[0] -= 1


def are_deferred() -> bool:
  """Whether a stop signal's handler must record the signal and return."""
  return _DEPTH[0] > 0


__all__ = ["are_deferred", "deferred", "note", "received"]
