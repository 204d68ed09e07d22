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
import signal
import threading
from typing import Iterator, Optional

# The signals that stop a run (the CLI closes it as interrupted, exit 128 + signum).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

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


def raise_if_received() -> None:
  """Raises what a recorded stop signal (`note`) stands for: KeyboardInterrupt
  for SIGINT, SystemExit(128 + signum) otherwise; nothing when none is
  recorded. The training loop calls it after each round, in case code a
  signal interrupted (for instance TFF's asyncio execution) swallowed the
  handler's exception and carried on."""
  signum = received()
  if signum is None:
    return
  if signum == signal.SIGINT:
    raise KeyboardInterrupt
  raise SystemExit(128 + signum)


@contextlib.contextmanager
def handlers_kept() -> Iterator[None]:
  """Re-installs, when the body ends (however it ends), the stop signals'
  Python handlers that were in force when it began: the body may replace
  them, in Python or in C (`signal.signal` installs the handler in both). In
  a thread other than the main one, where handlers cannot be set, it does
  nothing."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
  try:
    yield
  finally:
    for sig, handler in saved.items():
      if handler is not None:  # None: installed from C, not known to Python
        signal.signal(sig, handler)


__all__ = ["STOP_SIGNALS", "are_deferred", "deferred", "handlers_kept", "note",
           "raise_if_received", "received"]
