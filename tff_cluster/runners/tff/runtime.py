"""Owns the TFF C++ execution context and the `worker_binary` process behind it.

TFF 0.87's default context starts a C++ `worker_binary` subprocess lazily and
never stops it: the worker outlives Python, keeps inherited stdout/stderr pipes
open (so shell pipelines and CI jobs hang) and piles up across runs. This module
starts the worker itself, from the main thread, with

* its stdout/stderr sent to a log file or /dev/null (never the parent's pipes),
* `PR_SET_PDEATHSIG = SIGKILL` on Linux (set by a tiny exec shim, never in a
  forked copy of this multi-threaded process), so the kernel kills it if
  Python dies without running any cleanup (SIGKILL, a crash),
* an `atexit` hook and SIGTERM/SIGHUP handlers that stop it on normal exit, on
  exceptions and on signals (SIGINT already raises `KeyboardInterrupt`).

Use it as a context manager::

    with tff_cluster.runners.tff.runtime.tff_runtime():
        process.next(state, data)

or call `start()` once (notebooks); `stop()` or interpreter exit ends the worker.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Iterator, Optional

from tff_cluster import interrupts, stack

stack.require_tff()  # one line naming the install routes, not a ModuleNotFoundError

import grpc  # noqa: E402
import portpicker  # noqa: E402
import tensorflow_federated as tff  # noqa: E402

# Internal TFF modules: the public API offers no way to own the worker process.
# They are stable within the pinned tensorflow-federated==0.87.0.
from tensorflow_federated.python.core.backends.native import compiler as _compiler
from tensorflow_federated.python.core.environments.tensorflow_frontend import (
    tensorflow_computation as _tf_computation,
)
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
from tensorflow_federated.python.core.impl.execution_contexts import (
    async_execution_context,
    sync_execution_context,
)
from tensorflow_federated.python.core.impl.executor_stacks import (
    executor_factory as _tff_executor_factory,
)
from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks
from tensorflow_federated.python.core.impl.executors import remote_executor
from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub
from tensorflow_federated.python.core.impl.types import placements

STARTUP_TIMEOUT_S = 60.0
GRPC_OPTIONS = [
    ("grpc.max_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
]


def context_args(executor_fn):
  """The arguments of a TFF execution context over `executor_fn` (a factory
  of executors talking to a worker): TFF's native compiler and its
  TensorFlow argument and result conversions."""
  return dict(executor_fn=executor_fn,
              compiler_fn=_compiler.desugar_and_transform_to_native,
              transform_args=_tf_computation.transform_args,
              transform_result=_tf_computation.transform_result)


def worker_binary_path() -> str:
  """Path of the `worker_binary` shipped inside the installed TFF package."""
  return os.path.join(
      os.path.dirname(_tff_executor_factory.__file__), "..", "..", "..", "..",
      "data", "worker_binary")


# Run by a fresh (single-threaded) Python between fork and the worker's exec:
# ask Linux to SIGKILL the worker when its parent dies, then become the worker.
# (`preexec_fn` would do this inside the forked copy of our multi-threaded
# process, which can deadlock before exec: TF and gRPC threads hold locks.)
_EXEC_SHIM = """
import ctypes, os, signal, sys
parent = int(sys.argv[1])
if sys.platform.startswith("linux"):
  try:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except OSError:
    pass
if os.getppid() != parent:  # the parent died before prctl took effect
  sys.exit(1)
os.execv(sys.argv[2], sys.argv[2:])
"""


class TffRuntime:
  """One C++ worker and the synchronous TFF context that talks to it."""

  def __init__(self, log_path: Optional[str] = None):
    self._log_path = log_path
    self._process: Optional[subprocess.Popen] = None
    self._stub = None
    self._lock = threading.Lock()

  @property
  def pid(self) -> Optional[int]:
    return self._process.pid if self._process is not None else None

  @property
  def running(self) -> bool:
    return self._process is not None and self._process.poll() is None

  def _launch(self) -> None:
    binary = worker_binary_path()
    if not os.path.isfile(binary):
      raise RuntimeError(
          f"TFF worker binary not found at {binary}; reinstall "
          "tensorflow-federated==0.87.0 (see README).")
    port = portpicker.pick_unused_port()
    out = open(self._log_path, "ab") if self._log_path else subprocess.DEVNULL
    try:
      # start_new_session: the worker leaves the terminal's process group, so
      # Ctrl-C reaches Python, which then stops the worker in order.
      self._process = subprocess.Popen(
          [sys.executable, "-c", _EXEC_SHIM, str(os.getpid()), binary,
           f"--port={port}", "--max_concurrent_computation_calls=-1"],
          stdin=subprocess.DEVNULL, stdout=out, stderr=out,
          start_new_session=True, close_fds=True)
    finally:
      if out is not subprocess.DEVNULL:
        out.close()
    channel = grpc.insecure_channel(f"localhost:{port}", GRPC_OPTIONS)
    self._stub = remote_executor_grpc_stub.RemoteExecutorGrpcStub(channel)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not self._stub.is_ready:
      if self._process.poll() is not None:
        raise RuntimeError(
            f"TFF worker exited with code {self._process.returncode} at start")
      if time.monotonic() > deadline:
        self.stop()
        raise RuntimeError("TFF worker did not become ready within "
                           f"{STARTUP_TIMEOUT_S:.0f} s")
      time.sleep(0.05)

  def _get_stub(self):
    with self._lock:
      if not self.running:
        self._launch()
      return self._stub

  def _context_args(self):
    """What a TFF execution context over this runtime's worker is made of."""

    def stack_fn(cardinalities):
      cardinalities.setdefault(placements.CLIENTS, 0)
      executor = remote_executor.RemoteExecutor(self._get_stub())
      executor.set_cardinalities(cardinalities)
      return executor

    return context_args(python_executor_stacks.ResourceManagingExecutorFactory(
        executor_stack_fn=stack_fn))

  def install(self) -> "TffRuntime":
    """Makes this runtime TFF's default context; the worker starts on first use.

    Registers `stop` at exit once per runtime.
    """
    context = sync_execution_context.SyncExecutionContext(**self._context_args())
    context_stack_impl.context_stack.set_default_context(context)
    atexit.register(self.stop)
    return self

  def async_context(self):
    """An asynchronous TFF context over this runtime's worker (what
    `tff.program.NativeFederatedContext` wraps); the worker stays this
    runtime's, stopped with it."""
    atexit.register(self.stop)
    return async_execution_context.AsyncExecutionContext(**self._context_args())

  def start(self) -> "TffRuntime":
    """Installs this runtime and starts its worker now (from this thread)."""
    self.install()
    self._get_stub()
    return self

  def stop(self) -> None:
    """Stops the worker (SIGINT, then SIGKILL after 5 s). Idempotent."""
    process, self._process = self._process, None
    if process is None:
      return
    if process.poll() is None:
      try:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=5)
      except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
      except ProcessLookupError:
        pass


# The process-wide runtime. Nothing is installed at import: `install()` (called
# by the tff runner and every TFF builder) or `start()` replaces TFF's default
# context (whose worker would never be stopped) with this one. Its worker
# starts lazily on the first computation, or eagerly with `start()`.
_ACTIVE = TffRuntime()
_INSTALLED = False


def install() -> TffRuntime:
  """Makes the process-wide runtime TFF's default context (idempotent)."""
  global _INSTALLED
  if not _INSTALLED:
    _ACTIVE.install()
    _INSTALLED = True
  return _ACTIVE


def use_own_worker() -> TffRuntime:
  """Makes the process-wide runtime TFF's default context again (after
  `tff_cluster.runners.tff.workers.connect` made other workers the default)."""
  global _INSTALLED
  _ACTIVE.install()
  _INSTALLED = True
  return _ACTIVE


def installed() -> bool:
  return _INSTALLED


def start(log_path: Optional[str] = None) -> TffRuntime:
  """Starts the process-wide runtime's worker. Stopped at interpreter exit."""
  global _ACTIVE, _INSTALLED
  if log_path != _ACTIVE._log_path and not _ACTIVE.running:
    _ACTIVE = TffRuntime(log_path)
    _INSTALLED = False
  install()
  return _ACTIVE.start()


def async_context():
  """An asynchronous TFF context over the process-wide runtime's worker (for
  `tff.program.NativeFederatedContext`; see `TffRuntime.async_context`)."""
  return _ACTIVE.async_context()


def stop() -> None:
  """Stops the worker; a later computation starts a fresh one."""
  _ACTIVE.stop()


class _Terminated(SystemExit):
  pass


@contextlib.contextmanager
def tff_runtime(log_path: Optional[str] = None) -> Iterator[TffRuntime]:
  """Runs the body with a private TFF worker; stops it however the body ends.

  SIGTERM and SIGHUP are turned into `SystemExit(128 + signum)` while the body
  runs so that the `finally` clause (and so `stop()`) executes; SIGINT raises
  `KeyboardInterrupt` as usual. A handler installed before (the CLI's, which
  records the signal so that the training loop stops at its next check even
  when the exception is swallowed, e.g. raised inside a garbage-collection
  callback) runs first.
  """
  previous = {}

  def handler(signum, frame):
    caller = previous.get(signum)
    if callable(caller) and caller not in (signal.default_int_handler,):
      caller(signum, frame)  # may raise (the CLI's raises SystemExit(128 + signum))
    if interrupts.are_deferred():
      interrupts.note(signum)  # the training loop raises it after the stretch
      return
    raise _Terminated(128 + signum)

  if threading.current_thread() is threading.main_thread():
    for sig in (signal.SIGTERM, signal.SIGHUP):
      previous[sig] = signal.signal(sig, handler)
  try:
    # Inside the try: a signal while the worker starts must stop it too (and
    # restore the handlers).
    runtime = start(log_path)
    yield runtime
  finally:
    stop()
    for sig, old in previous.items():
      signal.signal(sig, old)


__all__ = ["TffRuntime", "install", "installed", "start", "stop", "tff_runtime",
           "worker_binary_path"]
del tff  # imported only to make sure TFF's own import-time setup ran first
