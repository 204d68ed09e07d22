"""Round computations on several TFF workers (`worker_binary` processes, on
this host or others), through TFF 0.87's mergeable execution context.

TFF splits a computation's clients into contiguous chunks, one sub-round per
worker, runs each chunk up to its aggregations, merges the partial
aggregates and runs the rest once. As shipped, its contexts call the workers
one after another, merge the partial aggregates in the order the workers
finish (so the rounding of a sum can change from run to run) and retry a lost
worker forever, logging only at INFO. This module keeps TFF's compiler,
executors and workers, and adds:

* each worker's context on its own thread (`ThreadedContext`): the
  sub-rounds run at the same time;
* an ordered context (`OrderedMergeableContext`): sub-rounds gathered and
  merged in partition order, so the same clients give the same numbers;
* a fail-fast stub (`FailFastStub`): a worker that stays unreachable for
  `grace_s` seconds ends the call with `WorkerUnavailable` (one line), and
  the worker is marked dead at the first expired grace;
* an optional sub-round timeout (`WorkerTimeout`) for a frozen host, whose
  TCP connection stays open while it answers nothing.

Our round computations return everything at SERVER (the per-client rows come
back through the collect aggregation), so the clients' work runs once.

A worker listens on every interface of its host, with no TLS and no
authentication, and runs any computation it is sent: keep workers on a
trusted network (or reach them through SSH tunnels).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import Iterator, List, Optional, Sequence

from tff_cluster import stack

stack.require_tff()

import grpc  # noqa: E402
import portpicker  # noqa: E402
import tensorflow_federated as tff  # noqa: E402
from tensorflow_federated.python.common_libs import structure  # noqa: E402
from tensorflow_federated.python.core.backends.native import (  # noqa: E402
    mergeable_comp_compiler,
)
from tensorflow_federated.python.core.impl.context_stack import context_base  # noqa: E402
from tensorflow_federated.python.core.impl.execution_contexts import (  # noqa: E402
    mergeable_comp_execution_context as _mergeable,
)
from tensorflow_federated.python.core.impl.execution_contexts import (  # noqa: E402
    sync_execution_context,
)
from tensorflow_federated.python.core.impl.executors import (  # noqa: E402
    executors_errors,
    remote_executor,
    remote_executor_grpc_stub,
    remote_executor_stub,
)
from tensorflow_federated.python.core.impl.executor_stacks import (  # noqa: E402
    python_executor_stacks,
)
from tensorflow_federated.python.core.impl.types import (  # noqa: E402
    placements,
    type_analysis,
    type_conversions,
)

from tff_cluster.runners.tff import runtime  # noqa: E402
from tff_cluster.runners.base import WorkerLost  # noqa: E402

DEFAULT_GRACE_S = 60.0


class WorkerUnavailable(WorkerLost):
  """A TFF worker did not answer for longer than its grace; one line."""


class WorkerTimeout(WorkerLost):
  """A TFF worker did not finish a sub-round within the timeout; one line."""


class FailFastStub(remote_executor_stub.RemoteExecutorStub):
  """A worker's gRPC stub that turns "unreachable for `grace_s` seconds"
  into `WorkerUnavailable`; a worker back within the grace lets TFF retry
  the sub-round, as it would."""

  def __init__(self, address: str, grace_s: float):
    self.address = address
    self.grace_s = grace_s
    self.dead = False
    self.channel = grpc.insecure_channel(address, runtime.GRPC_OPTIONS)
    self._stub = remote_executor_grpc_stub.RemoteExecutorGrpcStub(self.channel)

  def _call(self, name: str, request):
    if self.dead:
      raise WorkerUnavailable(f"TFF worker {self.address} is unreachable (marked dead after "
                              f"{self.grace_s:g} s)")
    try:
      return getattr(self._stub, name)(request)
    except executors_errors.RetryableGRPCError as e:
      try:
        grpc.channel_ready_future(self.channel).result(timeout=self.grace_s)
      except grpc.FutureTimeoutError:
        self.dead = True
        detail = e.args[0] if e.args else e
        code = detail.code().name if hasattr(detail, "code") else type(detail).__name__
        raise WorkerUnavailable(f"TFF worker {self.address} unreachable for "
                                f"{self.grace_s:g} s ({code})") from None
      raise  # back within the grace: TFF retries the sub-round

  def get_executor(self, request):
    return self._call("get_executor", request)

  def create_value(self, request):
    return self._call("create_value", request)

  def create_struct(self, request):
    return self._call("create_struct", request)

  def create_call(self, request):
    return self._call("create_call", request)

  def create_selection(self, request):
    return self._call("create_selection", request)

  def compute(self, request):
    return self._call("compute", request)

  def _release(self, name: str, request):
    """A clean-up call (TFF makes them from finalizers, at exit too): nothing
    to release on a dead or unreachable worker, and no error to raise."""
    if self.dead:
      return None
    try:
      return getattr(self._stub, name)(request)
    except (executors_errors.RetryableGRPCError, grpc.RpcError):
      return None

  def dispose(self, request):
    return self._release("dispose", request)

  def dispose_executor(self, request):
    return self._release("dispose_executor", request)

  @property
  def is_ready(self) -> bool:
    return self._stub.is_ready


def _sync_context(stub: FailFastStub):
  """TFF's synchronous context over one worker (as `runtime` builds its own)."""

  def stack_fn(cardinalities):
    cardinalities.setdefault(placements.CLIENTS, 0)
    executor = remote_executor.RemoteExecutor(stub)
    executor.set_cardinalities(cardinalities)
    return executor

  factory = python_executor_stacks.ResourceManagingExecutorFactory(executor_stack_fn=stack_fn)
  return sync_execution_context.SyncExecutionContext(**runtime.context_args(factory))


class ThreadedContext(context_base.AsyncContext):
  """A worker's synchronous context run on a thread of its own, so several
  workers' sub-rounds run at once; `timeout_s` bounds a sub-round (a frozen
  host): the channel is closed, which frees the blocked thread."""

  def __init__(self, stub: FailFastStub, timeout_s: Optional[float] = None):
    self.stub = stub
    self._context = _sync_context(stub)
    self._pool = concurrent.futures.ThreadPoolExecutor(1)
    self._timeout_s = timeout_s

  async def invoke(self, comp, arg):
    future = asyncio.get_running_loop().run_in_executor(self._pool, self._context.invoke,
                                                        comp, arg)
    try:
      return await asyncio.wait_for(future, self._timeout_s)
    except asyncio.TimeoutError:
      self.stub.dead = True
      self.stub.channel.close()
      raise WorkerTimeout(f"TFF worker {self.stub.address} did not answer a sub-round within "
                          f"{self._timeout_s:g} s") from None


async def _invoke_in_partition_order(comp, arg, contexts: Sequence[ThreadedContext]):
  """`comp` (a mergeable form) over `contexts`: sub-round i on context i, all
  at once; the partial aggregates merged in partition order on the first
  context; the part after the merge run once when its result is all at
  SERVER (ours), else on every context and concatenated in partition order."""
  parts = (arg.value() if arg is not None else [None] * len(contexts))
  partials = await asyncio.gather(*[
      c.invoke(comp.up_to_merge, part) for part, c in zip(parts, contexts)])
  merged = partials[0]
  for partial in partials[1:]:
    merged = await contexts[0].invoke(
        comp.merge, structure.Struct.unnamed(merged, partial))

  def after(part, context):
    return context.invoke(comp.after_merge, merged if part is None else
                          structure.Struct.unnamed(part, merged))

  result_type = comp.after_merge.type_signature.result
  if type_analysis.contains_only(
      result_type, lambda t: not isinstance(t, tff.FederatedType) or t.all_equal):
    return await after(parts[0], contexts[0])
  outputs = await asyncio.gather(*[after(p, c) for p, c in zip(parts, contexts)])
  return _mergeable._repackage_partitioned_values(  # noqa: SLF001
      list(outputs), result_type_spec=result_type)


class OrderedMergeableContext(_mergeable.MergeableCompExecutionContext):
  """TFF's mergeable context whose sub-rounds run at once and are merged in
  partition order (see `_invoke_in_partition_order`)."""

  def __init__(self, contexts: Sequence[ThreadedContext]):
    super().__init__(contexts, compiler_fn=mergeable_comp_compiler.compile_to_mergeable_comp_form,
                     num_subrounds=len(contexts))
    self.contexts = list(contexts)

  def invoke(self, comp, arg=None):
    comp = self._compiler_pipeline.compile(comp)
    if arg is not None:
      arg = _mergeable.MergeableCompExecutionContextValue(
          arg, comp.up_to_merge.type_signature.parameter, len(self.contexts))
    result = self._async_runner.run_coro_and_return_result(
        _invoke_in_partition_order(comp, arg, self.contexts))
    return type_conversions.type_to_py_container(result, comp.after_merge.type_signature.result)


def _answers(address: str, timeout_s: float) -> bool:
  """Whether a gRPC server answers at `address` within `timeout_s` seconds."""
  channel = grpc.insecure_channel(address, runtime.GRPC_OPTIONS)
  try:
    grpc.channel_ready_future(channel).result(timeout=timeout_s)
    return True
  except grpc.FutureTimeoutError:
    return False
  finally:
    channel.close()


def check_ready(addresses: Sequence[str], grace_s: float) -> None:
  """Every worker answers within `grace_s` seconds, else `WorkerUnavailable`
  naming the first that does not."""
  for address in addresses:
    if not _answers(address, grace_s):
      raise WorkerUnavailable(f"TFF worker {address} did not answer within {grace_s:g} s "
                              "(is `python -m tff_cluster.runners.tff.worker --port=P` running there?)")


def connect(addresses: Sequence[str], grace_s: float = DEFAULT_GRACE_S,
            subround_timeout_s: Optional[float] = None) -> OrderedMergeableContext:
  """Makes the workers at `addresses` TFF's default context (after a
  readiness check) and returns it; `runtime.use_own_worker()` goes back to
  the process's own worker."""
  check_ready(addresses, grace_s)
  contexts = [ThreadedContext(FailFastStub(a, grace_s), subround_timeout_s) for a in addresses]
  context = OrderedMergeableContext(contexts)
  runtime.install()  # our computations are traced under the runtime's context
  tff.framework.set_default_context(context)
  return context


@contextlib.contextmanager
def local_workers(n: int, log_dir: Optional[str] = None) -> Iterator[List[str]]:
  """Starts n workers on free ports of this host (each stopped by SIGTERM at
  the end, and by the kernel if this process dies) and yields their
  `127.0.0.1:P` addresses. The binary listens on every interface: tests run
  it inside a loopback-only network namespace."""
  processes = []
  try:
    for i in range(n):
      port = portpicker.pick_unused_port()
      out = (open(os.path.join(log_dir, f"worker-{i}.log"), "ab") if log_dir
             else subprocess.DEVNULL)
      try:
        processes.append((port, subprocess.Popen(
            [sys.executable, "-m", "tff_cluster.runners.tff.worker", f"--port={port}", "--die_with_parent"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)))
      finally:
        if out is not subprocess.DEVNULL:
          out.close()
    addresses = [f"127.0.0.1:{port}" for port, _ in processes]
    deadline = time.monotonic() + runtime.STARTUP_TIMEOUT_S
    for address, (_, process) in zip(addresses, processes):
      if not _answers(address, max(deadline - time.monotonic(), 0.1)):
        raise RuntimeError(f"TFF worker {address} did not start (exit code {process.poll()})")
    yield addresses
  finally:
    for _, process in processes:
      if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    for _, process in processes:
      try:
        process.wait(timeout=10)
      except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
