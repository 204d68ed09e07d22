"""Which model a client is tested with (`evaluation.Deployment`): each kind's
rows, groups and comparison by hand, and no dispatch over the kinds outside
`learning/evaluation.py`."""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

from tff_cluster.learning import evaluation
from tff_cluster.learning.evaluation import (CHOOSE_BY_TEST_LOSS, Assigned, ChooseByTestLoss,
                                             Ensemble, Mixture, OutputMix, deployment)

ROOT = pathlib.Path(__file__).resolve().parents[1]
KINDS = {"Deployment", "Assigned", "ChooseByTestLoss", "Ensemble", "Mixture", "OutputMix"}
HOME = ROOT / "tff_cluster" / "learning" / "evaluation.py"


def _names(node):
  """The names a class argument of isinstance mentions (`a.B` as `B`)."""
  return {n.id if isinstance(n, ast.Name) else n.attr
          for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))}


def kind_dispatches(path: pathlib.Path):
  """(line, source) of each isinstance/issubclass call in `path` whose class
  argument names a deployment kind."""
  tree = ast.parse(path.read_text(), str(path))
  return [(node.lineno, ast.unparse(node)) for node in ast.walk(tree)
          if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
          and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2
          and _names(node.args[1]) & KINDS]


def test_the_scan_finds_a_dispatch_over_deployment_kinds(tmp_path):
  source = tmp_path / "x.py"
  source.write_text("if isinstance(cm, (evaluation.Mixture, OutputMix)):\n  pass\n"
                    "ok = isinstance(cm, np.ndarray)\n")
  assert kind_dispatches(source) == [(1, "isinstance(cm, (evaluation.Mixture, OutputMix))")]


def test_no_isinstance_over_deployment_kinds_outside_evaluation():
  """A new kind is one class in learning/evaluation.py: hosts, runners and
  tests call the `Deployment` members instead."""
  found = {str(p.relative_to(ROOT)): hits
           for folder in ("tff_cluster", "tests", "benchmarks", "scripts")
           for p in sorted((ROOT / folder).rglob("*.py")) if p != HOME
           for hits in [kind_dispatches(p)] if hits}
  assert found == {}
  assert kind_dispatches(HOME)  # the scan sees the dispatch where it belongs


def test_deployment_wraps_indices_and_refuses_a_string():
  wrapped = deployment([2, 0, 1])
  assert type(wrapped) is Assigned and not wrapped.rule and wrapped.per_client
  np.testing.assert_array_equal(wrapped.index, [2, 0, 1])
  mix = Mixture(np.eye(2))
  assert deployment(mix) is mix
  with pytest.raises(TypeError, match="client_model must be indices"):
    deployment("test_loss")


def test_which_kinds_are_rules_and_per_client():
  kinds = [Assigned(np.array([0])), CHOOSE_BY_TEST_LOSS, Ensemble("logits"),
           Mixture(np.ones((1, 1))), OutputMix(np.array([0]), np.array([0.5]))]
  assert [k.rule for k in kinds] == [False, True, True, True, True]
  assert [k.per_client for k in kinds] == [True, False, False, True, True]


def test_rows_are_a_shard_s_clients():
  np.testing.assert_array_equal(Assigned(np.array([3, 1, 4, 1, 5])).rows(1, 3).index, [1, 4])
  weights = np.arange(12.0).reshape(4, 3)
  np.testing.assert_array_equal(Mixture(weights).rows(2, 4).weights, weights[2:4])
  part = OutputMix(np.array([0, -1, 2]), np.array([0.1, 0.2, 0.3]), shared=1).rows(1, 3)
  np.testing.assert_array_equal(part.personal, [-1, 2])
  np.testing.assert_array_equal(part.alpha, [0.2, 0.3])
  assert part.shared == 1
  assert CHOOSE_BY_TEST_LOSS.rows(0, 2) is CHOOSE_BY_TEST_LOSS
  assert Ensemble("probs").rows(0, 2) == Ensemble("probs")


def test_groups_for_groups_csv():
  index = Assigned(np.array([0, 1, 2, 1]))
  np.testing.assert_array_equal(index.groups(None, np.array([0, -1, 2, -1]), 4), [0, -1, 2, -1])
  np.testing.assert_array_equal(index.groups(None, None, 4), [0, 1, 2, 1])
  np.testing.assert_array_equal(index.groups(None, np.array([-1, 0]), 4), [0, 1, 2, 1])
  assert index.groups(None, None, 4).dtype == np.int64
  np.testing.assert_array_equal(CHOOSE_BY_TEST_LOSS.groups(np.array([1, 0]), None, 2), [1, 0])
  assert CHOOSE_BY_TEST_LOSS.groups(None, None, 2) is None
  for rule in (Ensemble("logits"), Mixture(np.full((3, 2), 0.5)),
               OutputMix(np.array([0, 1, 2]), np.full(3, 0.5))):
    np.testing.assert_array_equal(rule.groups(np.array([0, 1, 1]), None, 3), [-1, -1, -1])


def test_assert_same_accepts_the_same_deployment():
  deployment(np.array([0, 1])).assert_same([0, 1])
  Mixture(np.array([[0.5, 0.5]])).assert_same(Mixture(np.array([[0.5, 0.5 + 1e-9]])),
                                              rtol=0, atol=1e-8)
  OutputMix(np.array([0, -1]), np.array([0.3, 0.4])).assert_same(
      OutputMix(np.array([0, -1]), np.array([0.3, 0.4 + 1e-9])), rtol=1e-6, atol=0)
  ChooseByTestLoss().assert_same(CHOOSE_BY_TEST_LOSS)
  Ensemble("logits").assert_same(Ensemble("logits"))


@pytest.mark.parametrize("a,b,message", [
    (Assigned(np.array([0, 1])), np.array([0, 2]), "each client's model"),
    (Assigned(np.array([0, 1])), CHOOSE_BY_TEST_LOSS, "deployments Assigned and ChooseByTestLoss"),
    (Mixture(np.array([[0.5, 0.5]])), Mixture(np.array([[0.4, 0.6]])), "mixture weights"),
    (Mixture(np.array([[0.5, 0.5]])), np.array([0]), "deployments Mixture and Assigned"),
    (OutputMix(np.array([0, 1]), np.array([0.3, 0.4])),
     OutputMix(np.array([0, -1]), np.array([0.3, 0.4])), "personal model"),
    (OutputMix(np.array([0, 1]), np.array([0.3, 0.4])),
     OutputMix(np.array([0, 1]), np.array([0.3, 0.5])), "alpha"),
    (OutputMix(np.array([0]), np.array([0.3])), OutputMix(np.array([0]), np.array([0.3]), 1),
     "shared model"),
    (Ensemble("logits"), Ensemble("probs"), "votes"),
    (CHOOSE_BY_TEST_LOSS, Ensemble("logits"), "deployments ChooseByTestLoss and Ensemble"),
])
def test_assert_same_raises_on_a_different_deployment(a, b, message):
  with pytest.raises(AssertionError, match=message):
    a.assert_same(b, rtol=1e-6, atol=1e-6)


def test_a_new_kind_is_one_class():
  """Every kind the evaluation knows implements the whole protocol."""
  kinds = {c.__name__ for c in evaluation.Deployment.__subclasses__()}
  assert kinds == KINDS - {"Deployment"}
  assert all(not getattr(c, "__abstractmethods__", None)
             for c in evaluation.Deployment.__subclasses__())
