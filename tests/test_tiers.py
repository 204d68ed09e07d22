"""The test tiers (tests/conftest.py, docs/install.md "Running the tests"):
every registered algorithm keeps its checks in the CI tier, and CI's slices
of the exhaustive-only cases cover each of them exactly once."""

from __future__ import annotations

import pathlib

import pytest

from tests import conftest
from tests.conftest import SLICES, in_ci_tier, select, slices_of
from tff_cluster import registry
from tff_cluster.runners import local_runner


def _values(case):
  """The parameter values of a `tiered` case (a tuple, a value, or a
  pytest.param of an exhaustive-only one)."""
  values = case.values if hasattr(case, "values") else case
  return values if isinstance(values, tuple) else (values,)


def _ci_algorithms(cases, keep=lambda values: True):
  return {_values(c)[0] for c in cases if in_ci_tier(c) and keep(_values(c))}


def test_every_algorithm_keeps_its_parity_and_resume_cases_in_the_ci_tier():
  """A new algorithm cannot slip out of CI: each registered one has a
  `tff` <-> `local` parity case and a `local` resume case outside the
  slices, and its declared flags' refusals."""
  from tests import test_reliability, test_runners
  algorithms = set(registry.ALGORITHMS)
  parity = _ci_algorithms(test_runners._parity_params())
  assert algorithms - parity == set(), "no tff <-> local parity case in the CI tier"
  resume = _ci_algorithms(test_reliability.RESUME_CASES, lambda v: v[1] == "local")
  assert algorithms - resume == set(), "no local resume case in the CI tier"
  flags = {d.name for spec in registry.ALGORITHMS.values() for d in spec.hparams
           if test_reliability._invalid_values(d)}  # (a bool flag takes every value)
  refused = {name for _, name, _ in test_reliability._flag_cases()}
  assert flags - refused == set(), "a declared flag without its refusal cases"


def test_every_kind_of_ray_actor_state_keeps_its_parity_case_in_the_ci_tier():
  pytest.importorskip("ray", reason="needs the ray extra (today's stack)")
  from tests import test_ray_runner
  kinds = set(test_ray_runner.RAY_KINDS)
  assert kinds <= set(registry.ALGORITHMS)
  assert kinds - _ci_algorithms(test_ray_runner.RAY_CASES) == set()
  # Every other algorithm is in a slice.
  assert {_values(c)[0] for c in test_ray_runner.RAY_CASES} == set(
      test_ray_runner.PARITY_CASES)


class _Item:
  """What `slices_of` and `select` read of a pytest item."""

  def __init__(self, file, function, param, marks=()):
    self.path = pathlib.Path("tests") / file
    self.originalname = function
    self.name = f"{function}[{param}]"
    self.nodeid = f"tests/{file}::{self.name}"
    self._marks = set(marks)

  def get_closest_marker(self, name):
    return name if name in self._marks else None


def _items():
  out = []
  for file, function, n in (("test_a.py", "test_parity", 37), ("test_a.py", "test_resume", 5),
                            ("test_b.py", "test_parity", 3), ("test_b.py", "test_one", 1)):
    out += [_Item(file, function, i, ["exhaustive_only"]) for i in range(n)]
    out += [_Item(file, function, f"ci{i}") for i in range(2)]
  out += [_Item("test_b.py", "test_slow", 0, ["slow"]),
          _Item("test_b.py", "test_slow_sliced", 0, ["slow", "exhaustive_only"])]
  return out


def test_the_ci_slices_cover_every_exhaustive_only_case_once():
  items = _items()
  exhaustive_only = {i.nodeid for i in items if i.get_closest_marker("exhaustive_only")}
  slices = slices_of(items)
  assert set(slices) == exhaustive_only
  assert set(slices.values()) <= set(range(SLICES))
  assert slices == slices_of(list(reversed(items))), "a slice depends on collection order"
  seen = []
  for k in range(SLICES):
    keep, drop = select(items, "ci", k, slices)
    assert len(keep) + len(drop) == len(items)
    assert {i.nodeid for i in keep} - exhaustive_only == {
        i.nodeid for i in items} - exhaustive_only, "a CI-tier case left out"
    seen += [i.nodeid for i in keep if i.nodeid in exhaustive_only]
  assert sorted(seen) == sorted(exhaustive_only), "a case in no slice, or in two"
  # Each slice takes a share of every function's cases: 37 cases, 4 or 5 a slice.
  per_slice = [sum(1 for n, s in slices.items() if "test_a.py::test_parity" in n and s == k)
               for k in range(SLICES)]
  assert sorted(per_slice) == [4, 4, 4, 5, 5, 5, 5, 5]


def test_the_quick_tier_leaves_out_slow_and_exhaustive_only_cases():
  items = _items()
  slices = slices_of(items)
  keep, _ = select(items, "quick", 0, slices)
  assert {i.nodeid for i in keep} == {
      i.nodeid for i in items
      if not i.get_closest_marker("slow") and not i.get_closest_marker("exhaustive_only")}
  keep, drop = select(items, "exhaustive", 0, slices)
  assert len(keep) == len(items) and not drop


@pytest.mark.parametrize("name,value,expected", [
    ("TFF_CLUSTER_TIER", "quick", "quick"), ("TFF_CLUSTER_TIER", "CI", "ci"),
    ("TFF_CLUSTER_EXHAUSTIVE", "1", "exhaustive"), ("TFF_CLUSTER_EXHAUSTIVE", "0", "ci")])
def test_the_tier_is_read_from_the_environment(name, value, expected, monkeypatch):
  monkeypatch.delenv("TFF_CLUSTER_TIER", raising=False)
  monkeypatch.delenv("TFF_CLUSTER_EXHAUSTIVE", raising=False)
  monkeypatch.setenv(name, value)
  assert conftest.tier() == expected


def test_a_bad_tier_or_slice_is_one_line(monkeypatch):
  monkeypatch.setenv("TFF_CLUSTER_TIER", "fast")
  with pytest.raises(pytest.UsageError, match="valid: quick, ci, exhaustive"):
    conftest.tier()
  monkeypatch.setenv("TFF_CLUSTER_SLICE", "8")
  conftest.ci_slice.cache_clear()
  try:
    with pytest.raises(pytest.UsageError, match="valid: 0..7"):
      conftest.ci_slice()
    monkeypatch.setenv("TFF_CLUSTER_SLICE", "2")
    conftest.ci_slice.cache_clear()
    assert conftest.ci_slice() == (2, "TFF_CLUSTER_SLICE")
  finally:
    monkeypatch.undo()
    conftest.ci_slice.cache_clear()


# The `local` runner's jit='auto' in this process (tests/conftest.py): no XLA
# in the quick and CI tiers but in tests marked `xla`; the library's choice in
# the exhaustive tier. A dense model on a CPU is where `auto` compiles.


def test_auto_jit_compiles_here_only_in_the_exhaustive_tier():
  assert local_runner.resolve_jit("auto", "dense", False, "/CPU:0") is conftest.exhaustive()
  assert local_runner.resolve_jit("on", "dense", False, "/CPU:0") is True
  with pytest.raises(ValueError, match="BatchNorm"):  # its refusals kept
    local_runner.resolve_jit("on", "dense", True, "/CPU:0")


@pytest.mark.xla
def test_auto_jit_compiles_in_a_test_marked_xla():
  assert local_runner.resolve_jit("auto", "dense", False, "/CPU:0") is True
  assert local_runner.resolve_jit("auto", "dense", True, "/CPU:0") is False
