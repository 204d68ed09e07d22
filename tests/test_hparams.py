"""Hyper-parameter declarations: checks, defaults, and the CLI flags made from them."""

from __future__ import annotations

import math

import pytest

from tff_cluster import experiment as run_experiment
from tff_cluster import registry
from tff_cluster import cli
from tff_cluster.spec import hparams as hp


@pytest.mark.parametrize("decl,value,ok", [
    (hp.CLIENT_LR, 0.1, True), (hp.CLIENT_LR, 0.0, False), (hp.CLIENT_LR, -1.0, False),
    (hp.CLIENT_LR, math.inf, False), (hp.CLIENT_LR, math.nan, False),
    (hp.CLIENT_MOMENTUM, 0.0, True), (hp.CLIENT_MOMENTUM, 0.99, True),
    (hp.CLIENT_MOMENTUM, 1.0, False), (hp.LR_DECAY, 1.0, True), (hp.LR_DECAY, 0.0, False),
    (hp.LR_DECAY, 1.01, False), (hp.ROUNDS, 1, True), (hp.ROUNDS, 0, False),
    (hp.ROUNDS, 2.5, False), (hp.ROUNDS, True, False), (hp.SEED, 2**31, False),
    (hp.CLIENT_STATE, "reset", True), (hp.CLIENT_STATE, "keep", False),
    (hp.RUNNER, "local", True), (hp.RUNNER, "gpu", False),
])
def test_check_accepts_valid_and_names_what_is_valid(decl, value, ok):
  if ok:
    assert decl.check(value) == value
  else:
    with pytest.raises(hp.HParamError) as e:
      decl.check(value)
    message = str(e.value)
    assert message.startswith(f"invalid --{decl.name}=") and "; valid: " in message
    assert "\n" not in message


def test_valid_text_states_the_range():
  assert hp.CLIENT_LR.valid_text() == "a number > 0"
  assert hp.CLIENT_MOMENTUM.valid_text() == "a number in [0, 1)"
  assert hp.SEED.valid_text() == "an integer in 0..2147483647"
  assert hp.CLIENT_STATE.valid_text() == "persist, reset"


def test_defaults_per_task_then_task_then_declaration():
  assert hp.NUM_GROUPS.default_for("mnist") == 3  # declared override (FedGroup: m = 3)
  assert hp.NUM_GROUPS.default_for("synthetic") == 5
  assert hp.MU.default_for("synthetic", {"mu": 1.0}) == 1.0  # the task's own default
  resolved = hp.resolve([hp.ROUNDS, hp.LR_DECAY], {"rounds": None}, "t", {"rounds": 7})
  assert resolved == {"rounds": 7, "lr_decay": 1.0}


def test_shared_names_are_declared_once():
  declared = registry.all_hparams()
  assert declared["num_groups"] is hp.NUM_GROUPS  # FedGroup uses the shared declaration
  assert declared["mu"].name == "mu"
  for spec in registry.ALGORITHMS.values():
    names = [d.name for d in spec.hparams]
    assert len(names) == len(set(names)), spec.name


def test_cli_flags_are_exactly_the_declarations():
  """run_experiment.py hand-writes no algorithm or training flag."""
  defined = {f.name for f in run_experiment.FLAGS.get_flags_for_module(run_experiment)}
  declared = ({d.name for d in (*hp.TRAINING, *cli.RUNNER_HPARAMS)}
              | set(registry.all_hparams()))
  assert defined == declared | set(run_experiment._GENERAL)


def test_mnist_takes_three_groups_by_default():
  run_experiment.FLAGS.unparse_flags()
  run_experiment.FLAGS(["x", "--algo=fedgroup", "--task=mnist"])
  settings = run_experiment.resolve_settings(run_experiment._flag_values())
  assert settings["num_groups"] == 3 and settings["algo_options"]["num_groups"] == 3
