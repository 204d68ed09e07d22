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

import functools  # noqa: E402
import sys  # noqa: E402
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


# ---------------------------------------------------------------------------
# Tiers (docs/install.md, "Running the tests"):
#
#   quick       TFF_CLUSTER_TIER=quick (`scripts/test.sh quick`): the CI tier
#               less the tests marked `slow` and every exhaustive-only case
#   ci          the default (`scripts/test.sh`, CI): every test not marked
#               `exhaustive_only`, and one slice of those (below)
#   exhaustive  TFF_CLUSTER_TIER=exhaustive or TFF_CLUSTER_EXHAUSTIVE=1: all
#
# An exhaustive-only case is a parameter set of a test that CI runs on a
# subset (`tiered` below marks the others). CI runs slice k of SLICES of
# them, k = TFF_CLUSTER_SLICE, else int(commit[:8], 16) % SLICES of the
# checkout's commit; each test function's exhaustive-only cases, in node-id
# order, are dealt to the slices in turn from an offset of the function's
# name, so that every case is in exactly one slice and each slice takes a
# share of every such test.

TIERS = ("quick", "ci", "exhaustive")
SLICES = 8
EXHAUSTIVE_ONLY = pytest.mark.exhaustive_only


def tier() -> str:
  """The tier these tests run in: 'quick', 'ci' or 'exhaustive'."""
  value = os.environ.get("TFF_CLUSTER_TIER", "").strip().lower()
  if not value:
    return "exhaustive" if os.environ.get("TFF_CLUSTER_EXHAUSTIVE", "") not in ("", "0") \
        else "ci"
  if value not in TIERS:
    raise pytest.UsageError(f"TFF_CLUSTER_TIER={value!r} is not a tier; valid: "
                            f"{', '.join(TIERS)}")
  return value


def exhaustive() -> bool:
  """The exhaustive tier: every case of the tests that CI runs on a subset."""
  return tier() == "exhaustive"


def tiered(cases, in_ci):
  """`cases` for `pytest.mark.parametrize`, those where `in_ci(case)` is
  false marked exhaustive-only (a tuple case is one parameter set)."""
  out = []
  for case in cases:
    if in_ci(case):
      out.append(case)
    else:
      out.append(pytest.param(*(case if isinstance(case, tuple) else (case,)),
                              marks=EXHAUSTIVE_ONLY))
  return out


def in_ci_tier(case) -> bool:
  """Whether a case of `tiered`'s list runs in the CI tier (not in a slice)."""
  return not any(getattr(m, "name", None) == "exhaustive_only"
                 for m in getattr(case, "marks", ()))


@functools.lru_cache(maxsize=None)
def ci_slice() -> tuple:
  """(the slice of the exhaustive-only cases that the CI tier runs, where the
  number comes from)."""
  value = os.environ.get("TFF_CLUSTER_SLICE", "").strip()
  if value:
    if not value.isdigit() or int(value) >= SLICES:
      raise pytest.UsageError(f"TFF_CLUSTER_SLICE={value!r} is not a slice; valid: "
                              f"0..{SLICES - 1}")
    return int(value), "TFF_CLUSTER_SLICE"
  import subprocess
  try:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=30).stdout.strip()
    return int(commit[:8], 16) % SLICES, f"commit {commit[:8]}"
  except (OSError, ValueError, subprocess.SubprocessError):
    return 0, "no commit: the first"


def slices_of(items) -> dict:
  """nodeid -> slice of every exhaustive-only item (see above)."""
  import zlib
  groups = {}
  for item in items:
    if item.get_closest_marker("exhaustive_only") is not None:
      key = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
      groups.setdefault(key, []).append(item)
  out = {}
  for key, group in groups.items():
    offset = zlib.crc32(key.encode())
    for i, item in enumerate(sorted(group, key=lambda it: it.nodeid)):
      out[item.nodeid] = (offset + i) % SLICES
  return out


TFF_PROBLEM = stack.tff_problem()

# The test files whose outcome depends on the TensorFlow / Keras version
# (models, training steps, the public API, data loading, the CLI, files written
# on one stack and read on another): marked `stack`. The TFF stack's phase runs
# `-m "tff or stack"`: the TFF tests and these; every other test is run on
# today's stack only (`-m "not tff"`).
STACK_SENSITIVE = frozenset({
    "test_aggregators.py", "test_api.py", "test_cli.py", "test_cross_stack.py",
    "test_data_loaders.py", "test_local_training.py", "test_models.py", "test_optimizers.py",
    "test_results.py", "test_stack.py", "test_tasks.py", "test_untrusted_input.py",
})


_TIER_SUMMARY = []


def pytest_report_header(config):
  del config
  chosen, source = ci_slice()
  where = {"exhaustive": "every case",
           "ci": f"exhaustive-only cases of slice {chosen} of {SLICES} ({source})",
           "quick": "no test marked slow, no exhaustive-only case"}[tier()]
  return [f"tff-cluster tier: {tier()}: {where}"]


def pytest_terminal_summary(terminalreporter):
  for line in _TIER_SUMMARY:
    terminalreporter.write_line(line)


def pytest_collection_modifyitems(config, items):
  """A test run on the `tff` runner is a TFF test (`-m "not tff"` leaves it
  out), a test in a STACK_SENSITIVE file is a `stack` test, and every TFF test
  is skipped, with the reason, where TFF is missing. Then the tier's tests
  are kept, the others deselected (see `tier`)."""
  _mark(items)
  which = tier()
  if which == "exhaustive":
    return
  chosen, source = ci_slice()
  slices = slices_of(items)
  keep, drop = select(items, which, chosen, slices)
  if drop:
    config.hook.pytest_deselected(items=drop)
    items[:] = keep
  ran = sum(1 for i in keep if i.nodeid in slices)
  _TIER_SUMMARY[:] = [
      f"tff-cluster tier {which}: " + (
          f"{ran} exhaustive-only cases of slice {chosen} of {SLICES} ({source}) run, "
          f"{len(slices) - ran} of the other slices deselected" if which == "ci" else
          f"{len(drop)} tests deselected (marked slow, or exhaustive-only)")]


def select(items, which, chosen, slices):
  """(the items tier `which` runs, the others) in their order: quick, every
  item neither exhaustive-only (in `slices`, nodeid -> slice) nor marked
  `slow`; ci, every item not exhaustive-only and those of slice `chosen`;
  exhaustive, all."""
  keep, drop = [], []
  for item in items:
    if which == "quick":
      kept = item.nodeid not in slices and item.get_closest_marker("slow") is None
    elif which == "ci":
      kept = slices.get(item.nodeid, chosen) == chosen
    else:
      kept = True
    (keep if kept else drop).append(item)
  return keep, drop


def _mark(items):
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


# In the quick and CI tiers, the `local` runner's `jit='auto'` resolves to
# no XLA in this process, except in tests marked `xla` (those that test XLA's
# choice or its numbers, and runs long enough that compiling pays: the runner
# parity, every algorithm's round through the API, the cross-stack metrics,
# the docs' commands). Compiling a short run costs more than it saves (13 %
# of seven files' time, measured: docs/install.md). `jit='on'` and `'off'`
# are kept, and so are `auto`'s refusals; processes a test starts (the CLI,
# Ray's actors) choose as users' runs do. The exhaustive tier resolves `auto`
# as the library does everywhere. The switch is made once, after collection
# (so that a module-scoped fixture's run and its test's runs choose alike),
# and `xla_where_marked` lifts it for the tests marked `xla`.
_XLA = {"allowed": True}


def pytest_collection_finish(session):
  del session
  if exhaustive() or "tensorflow" not in sys.modules:
    return
  from tff_cluster.runners import local_runner
  resolve = local_runner.resolve_jit
  if getattr(resolve, "__wrapped__", None) is not None:
    return

  @functools.wraps(resolve)
  def resolve_jit(setting, family, exact_batches, device):
    on = resolve(setting, family, exact_batches, device)  # its refusals kept
    return on if setting == "on" or _XLA["allowed"] else False
  local_runner.resolve_jit = resolve_jit
  _XLA["allowed"] = False


@pytest.fixture(autouse=True)
def xla_where_marked(request):
  """Tests marked `xla` resolve `jit='auto'` as users' runs do (above)."""
  if request.node.get_closest_marker("xla") is None or _XLA["allowed"]:
    yield
    return
  _XLA["allowed"] = True
  try:
    yield
  finally:
    _XLA["allowed"] = False
