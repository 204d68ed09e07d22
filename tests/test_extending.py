"""docs/extending.md's worked example: the package on the page is the algorithm
its text describes, both runners give the same numbers for it, and
`registry.register` takes it.

The page's two ```python blocks are written as `mylab/fedavg_clip/__init__.py`
(the spec) and `mylab/fedavg_clip/fedavg_clip.py` (the rule) in a temporary
directory on `sys.path` (the paths the page tells readers to use) and
registered for this module's tests only.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import sys

import numpy as np
import pytest

from tests import test_runners
from tests.conftest import REPO_ROOT
from tests.test_runners import SOLVER_CASES, cluster_data  # noqa: F401  (a fixture)
from tff_cluster import registry
from tff_cluster.host import loop
from tff_cluster.host.driver import TrainingConfig
from tff_cluster.spec.hparams import HParam

PAGE = REPO_ROOT / "docs" / "extending.md"
PACKAGE, FOLDER, MODULE = "mylab", "mylab.fedavg_clip", "mylab.fedavg_clip.fedavg_clip"
NAME = "fedavg_clip"


def example_sources():
  """The page's spec (`__init__.py`) and rule (`fedavg_clip.py`)."""
  blocks = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), re.S | re.M)
  assert len(blocks) == 2, f"docs/extending.md has {len(blocks)} python blocks, not 2"
  return blocks


@pytest.fixture(scope="module")
def example(tmp_path_factory):
  """The page's module, imported as mylab.fedavg_clip and registered."""
  root = tmp_path_factory.mktemp("extending")
  spec_source, rule_source = example_sources()
  (root / PACKAGE / "fedavg_clip").mkdir(parents=True)
  (root / PACKAGE / "__init__.py").write_text("")
  (root / PACKAGE / "fedavg_clip" / "__init__.py").write_text(spec_source)
  (root / PACKAGE / "fedavg_clip" / "fedavg_clip.py").write_text(rule_source)
  assert PACKAGE not in sys.modules, f"a module {PACKAGE!r} is already imported"
  sys.path.insert(0, str(root))
  try:
    folder = importlib.import_module(FOLDER)
    assert "tensorflow" not in folder.__dict__  # the spec imports no TensorFlow
    (spec,) = folder.SPECS
    assert spec.name == NAME and spec.module == MODULE
    registry.register(NAME, spec)
    try:
      yield folder
    finally:
      registry.ALGORITHMS.pop(NAME, None)
  finally:
    sys.path.remove(str(root))
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
      del sys.modules[name]


def test_the_registry_loads_the_example_by_its_dotted_path(example):
  spec = registry.get_algorithm(NAME)
  rule = importlib.import_module(MODULE)
  assert spec is example.SPECS[0] and spec.load_host() is rule.ClippedFedAvgDriver
  assert spec.load_definition() is rule.definition
  assert {d.name for d in spec.hparams} == {"server_lr", "clip_norm"}
  assert registry.all_hparams()["clip_norm"] is example.CLIP_NORM


def _one_line_error(call) -> str:
  with pytest.raises(ValueError) as info:
    call()
  message = str(info.value)
  assert message and "\n" not in message, message
  return message


def test_register_refuses_a_taken_name_and_bad_specs(example):
  before = dict(registry.ALGORITHMS)
  spec = example.SPECS[0]
  assert "already registered" in _one_line_error(lambda: registry.register(NAME, spec))
  assert "'fedavg' is already registered" in _one_line_error(
      lambda: registry.register("fedavg", dataclasses.replace(spec, name="fedavg")))
  assert "spec.name" in _one_line_error(lambda: registry.register("other_name", spec))
  # An option named like another algorithm's, with another type: refused, not kept.
  clash = dataclasses.replace(spec, name="clash", hparams=(
      HParam("server_lr", int, 1, "an integer server_lr"),))
  assert "--server_lr" in _one_line_error(lambda: registry.register("clash", clash))
  assert registry.ALGORITHMS == before
  registry.all_hparams()  # still consistent


def test_a_round_is_the_pages_rule(example, cluster_data, tmp_path):  # noqa: F811
  """2 rounds on the local runner; round 2 recomputed in numpy from each
  client's FedAvg update (its local work alone, from the same model, on the
  same batches): clip to C, weighted mean, server step eta_s."""
  task, data = cluster_data
  (case,) = registry.get_algorithm(NAME).parity
  server_lr, clip = case["server_lr"], case["clip_norm"]
  config = TrainingConfig(rounds=2, clients_per_round=8, local_epochs=2,
                                     batch_size=10, client_lr=0.02, seed=1)
  drv = registry.build_driver(NAME, task, data, config, server_lr=server_lr,
                                                 clip_norm=clip)
  assert isinstance(drv, importlib.import_module(MODULE).ClippedFedAvgDriver)
  rounds = []
  run_round = drv.run_round

  def recording(round_num, sampled):
    before = drv.model_weights()
    row = run_round(round_num, sampled)
    rounds.append((round_num, np.array(sampled), before, drv.model_weights(), row))
    return row

  drv.run_round = recording
  loop.run_training(task, data, config, drv, progress=False)
  assert [r[0] for r in rounds] == [1, 2]
  round_num, sampled, before, after, row = rounds[1]
  np.testing.assert_array_equal(before[0], rounds[0][3][0])  # round 1's model carried on

  reference = registry.build_driver("fedavg", task, data, config)
  t = reference.definition.num_trainable
  deltas, weights, losses = [], [], []
  for k in sampled:
    out = reference.runner.run("train", reference.definition.initial_state(before), [int(k)],
                               round_num, config.local_work, config.lr_at(round_num))
    n = float(out.summed["weight"])
    deltas.append([np.asarray(u, np.float64) / n for u in out.summed["update"]])
    weights.append(n)
    losses.append(float(out.summed["loss_sum"]))
  norms = np.array([np.sqrt(sum(np.sum(d ** 2) for d in delta[:t])) for delta in deltas])
  clipped = norms > clip
  assert 0 < clipped.sum() < len(norms), ("the case must clip some clients and not "
                                          f"others; norms {np.round(norms, 3)}")
  scales = np.minimum(1.0, clip / norms)
  total = sum(weights)
  mean = [sum(n * (s if i < t else 1.0) * delta[i]
              for n, s, delta in zip(weights, scales, deltas)) / total
          for i in range(len(before))]
  expected = [w + (server_lr if i < t else 1.0) * m
              for i, (w, m) in enumerate(zip(before, mean))]
  for i, (got, want) in enumerate(zip(after, expected)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"weight {i}")
  # Not FedAvg's step: the check sees the clipping and the server learning rate.
  fedavg_step = [w + sum(n * d[i] for n, d in zip(weights, deltas)) / total
                 for i, w in enumerate(before)]
  assert not np.allclose(after[0], fedavg_step[0], rtol=1e-3, atol=1e-5)
  assert row["clipped_fraction"] == pytest.approx(clipped.mean())
  assert row["train_loss"] == pytest.approx(sum(losses) / total, rel=1e-5)


@pytest.mark.tff
@pytest.mark.parametrize("solver", sorted(SOLVER_CASES))
def test_both_runners_give_the_same_numbers(example, solver, cluster_data, tmp_path,  # noqa: F811
                                            monkeypatch):
  """tests/test_runners.py's parity check, with the spec's case added to PARITY_CASES."""
  monkeypatch.setitem(test_runners.PARITY_CASES, NAME,
                      [dict(c) for c in registry.get_algorithm(NAME).parity])
  test_runners.test_runners_give_the_same_numbers(NAME, 0, solver, cluster_data, tmp_path)
