"""A pytest plugin that says where the tests' time goes, by kind of cost
(`scripts/test.sh` loads it with `-p tests.timing`; `scripts/test_durations.py`
prints what it wrote).

With TFF_CLUSTER_TIMING_OUT=PATH set, each test's seconds (setup, call and
teardown) are split into the kinds below and written to PATH as JSON:
`{"tests": seconds of every test, KIND: seconds, ..., "per_test": {nodeid:
{KIND: seconds}}}` (under pytest-xdist, one file per worker: `output_path`). A kind is timed where the tests call it, outermost only
(a data set built inside a TFF computation's call counts as TFF):

  subprocess: CLI / Python   a Python process a test starts and waits for
                             (the CLI, `python -c`), its TensorFlow import
                             included
  subprocess: pytest         a test file re-run in a loopback-only namespace
  subprocess: pip            an install in the colab / pip phases
  tf.function: XLA compile   a first call of an XLA-compiled tf.function (its
                             trace, compilation and first run)
  tf.function: trace         a first call of any other tf.function
  TFF                        the worker's start, building the runner's TFF
                             computations and running any TFF computation
  Ray start-up               starting (or joining) Ray and the runner's actors
  data building              a task's `load_data`

The rest of a test's time (compiled code running, Keras, numpy, Python) is
"other". Without TFF_CLUSTER_TIMING_OUT nothing is patched.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import subprocess
import sys
import threading
import time

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
_OUT = os.environ.get("TFF_CLUSTER_TIMING_OUT", "")
_local = threading.local()
_current = collections.Counter()  # this test's kinds
_per_test = {}
_totals = collections.Counter()


def _add(kind, seconds):
  _current[kind] += seconds


def timed(kind, fn):
  """`fn`, its time added to `kind` when no other kind is being timed."""
  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    if getattr(_local, "depth", 0):
      return fn(*args, **kwargs)
    _local.depth = 1
    start = time.perf_counter()
    try:
      return fn(*args, **kwargs)
    finally:
      _local.depth = 0
      _add(kind, time.perf_counter() - start)
  wrapper.__tff_cluster_timed__ = True
  return wrapper


class _TimedValue:
  """A data loader, timed as `timed` times it; pickled (Ray ships a task's
  loader to its actors) as the loader itself."""

  def __init__(self, kind, fn):
    self._fn, self._call = fn, timed(kind, fn)

  def __call__(self, *args, **kwargs):
    return self._call(*args, **kwargs)

  def __reduce__(self):
    return functools.partial, (self._fn,)


def _patch(owner, name, kind):
  fn = getattr(owner, name, None)
  if fn is None or getattr(fn, "__tff_cluster_timed__", False):
    return
  setattr(owner, name, timed(kind, fn))


def _patch_tf_function():
  """First calls of tf.functions: a call during which the function traced
  (or the first call of an XLA-compiled one: its compilation happens there)."""
  from tensorflow.python.eager.polymorphic_function import polymorphic_function as pf
  call = pf.Function.__call__
  if getattr(call, "__tff_cluster_timed__", False):
    return

  def __call__(self, *args, **kwargs):
    if getattr(_local, "depth", 0):
      return call(self, *args, **kwargs)
    before = self.experimental_get_tracing_count()
    first = not getattr(self, "_tff_cluster_called", False)
    _local.depth = 1
    start = time.perf_counter()
    try:
      return call(self, *args, **kwargs)
    finally:
      _local.depth = 0
      spent = time.perf_counter() - start
      try:
        self._tff_cluster_called = True
      except AttributeError:
        pass
      xla = bool(getattr(self, "_jit_compile", False))
      if self.experimental_get_tracing_count() > before or (xla and first):
        _add("tf.function: XLA compile" if xla else "tf.function: trace", spent)
  __call__.__tff_cluster_timed__ = True
  pf.Function.__call__ = __call__


def _from_tests():
  """Whether the code starting a process is a test's (not Ray's or TFF's)."""
  frame = sys._getframe(2)
  while frame is not None and frame.f_code.co_filename == subprocess.__file__:
    frame = frame.f_back
  return frame is not None and frame.f_code.co_filename.startswith(TESTS_DIR)


def _patch_subprocess():
  popen = subprocess.Popen
  if getattr(popen.__init__, "__tff_cluster_timed__", False):
    return
  init = popen.__init__

  def __init__(self, args, *rest, **kwargs):
    self._tff_cluster_start = None
    if _from_tests():
      words = [str(a) for a in (args if isinstance(args, (list, tuple)) else [args])]
      text = " ".join(words)
      kind = ("subprocess: pytest" if "-m pytest" in text or words[:1] == ["unshare"] else
              "subprocess: pip" if "-m pip " in text or "pip install" in text else
              "subprocess: CLI / Python")
      self._tff_cluster_kind = kind
      self._tff_cluster_start = time.perf_counter()
    init(self, args, *rest, **kwargs)
  __init__.__tff_cluster_timed__ = True

  def ended(fn):
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
      try:
        return fn(self, *args, **kwargs)
      finally:
        start = getattr(self, "_tff_cluster_start", None)
        if start is not None and self.returncode is not None:
          self._tff_cluster_start = None
          _add(self._tff_cluster_kind, time.perf_counter() - start)
    return wrapper

  popen.__init__ = __init__
  for name in ("wait", "poll", "communicate"):
    setattr(popen, name, ended(getattr(popen, name)))


def _patch_library():
  from tff_cluster import stack
  from tff_cluster.spec import task as task_spec
  get = task_spec.TaskSpec.__getattribute__

  def __getattribute__(self, name):
    value = get(self, name)
    return _TimedValue("data building", value) if name == "load_data" else value
  task_spec.TaskSpec.__getattribute__ = __getattribute__
  if stack.tff_problem() is None:
    from tensorflow_federated.python.core.impl.computation import computation_impl
    from tff_cluster.runners.tff import runner, runtime
    _patch(runtime.TffRuntime, "_get_stub", "TFF")
    _patch(runner, "build_computations", "TFF")
    _patch(runner.RoundComputation, "__call__", "TFF")
    _patch(computation_impl.ConcreteComputation, "__call__", "TFF")
  try:
    from tff_cluster.runners import ray_runner
    ray_runner.import_ray()
  except Exception:  # noqa: BLE001  (no Ray on this stack)
    return
  _patch(ray_runner, "connect", "Ray start-up")
  _patch(ray_runner.RayRunner, "__init__", "Ray start-up")


def pytest_configure(config):
  del config
  if not _OUT:
    return
  _patch_subprocess()
  _patch_tf_function()
  _patch_library()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  del nextitem
  if not _OUT:
    yield
    return
  _current.clear()
  start = time.perf_counter()
  yield
  spent = time.perf_counter() - start
  kinds = {k: round(v, 3) for k, v in _current.items() if v > 0}
  kinds["tests"] = round(spent, 3)
  _per_test[item.nodeid] = kinds
  for k, v in kinds.items():
    _totals[k] += v


def output_path(path, worker):
  """Where a process writes its timings: `path`, or under pytest-xdist each
  worker its own file (`NAME.gw0.kinds.json` for `NAME.kinds.json`)."""
  if not worker:
    return path
  stem = path[:-len(".kinds.json")] if path.endswith(".kinds.json") else path
  return f"{stem}.{worker}.kinds.json"


def pytest_sessionfinish(session):
  del session
  if not _OUT or not _per_test:  # (pytest-xdist's controller runs no test)
    return
  out = {k: round(v, 1) for k, v in sorted(_totals.items())}
  out["per_test"] = _per_test
  path = output_path(_OUT, os.environ.get("PYTEST_XDIST_WORKER", ""))
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(out, f, indent=1, sort_keys=True)
  os.replace(tmp, path)
