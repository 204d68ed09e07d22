"""Upper limits of the sizes, refused in one line before any work, and a run
resumed on another runner than the one it started on.

The limits are checked with the flags: `run` (the data, TensorFlow, the
rounds) is replaced by one that fails the test, so a limit that let a value
through would show at once instead of running for days. The cross-runner
resumes: the settings a resumed run inherits from config.json, a `ray` run's
config.json resumed on `local` from the command line, and (opt-in, it starts
Ray) one run whose rounds go local, then ray, then local, against a run never
interrupted; Ray talks over loopback only, so that test runs inside
`unshare -n` (this module re-executes itself there, as
tests/test_ray_runner.py does)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tff_cluster import experiment as run_experiment
from tests.helpers import (SMALL_ARGS, assert_one_line_error, main_in_process,
                           read_metrics_csv)
from tff_cluster.spec import hparams as hp
from tff_cluster.io import results
from tff_cluster import cli as settings_module



@pytest.fixture
def no_work(monkeypatch):
  """Any run that gets past the checks fails the test (it would start work)."""
  def run(settings):
    raise AssertionError(f"a run started with {settings['rounds']} rounds, "
                         f"{settings['num_clients']} clients")
  monkeypatch.setattr(run_experiment, "run", run)
  # A fixed machine: 8 GiB free, whatever this one has.
  monkeypatch.setattr(settings_module, "available_memory", lambda: 8 * 2**30,
                      raising=False)


@pytest.mark.parametrize("flags, needles", [
    (["--rounds=99999999999999999999999"],
     ["--rounds=99999999999999999999999", "valid: an integer >= 1, at most 1000000"]),
    (["--rounds=1000001"], ["--rounds=1000001", "at most 1000000"]),
    (["--num_clients=100000000"], ["--num_clients=100000000", "at most 1000000"]),
    (["--clients_per_round=1000001", "--num_clients=10"],
     ["--clients_per_round=1000001", "at most 1000000"]),
    (["--local_epochs=10001"], ["--local_epochs=10001", "at most 10000"]),
    (["--local_steps=10000001"], ["--local_steps=10000001", "at most 10000000"]),
    (["--batch_size=1000001"], ["--batch_size=1000001", "at most 1000000"]),
    (["--eval_every=1000001"], ["--eval_every=1000001", "at most 1000000"]),
    (["--checkpoint_every=1000001"], ["--checkpoint_every=1000001", "at most 1000000"]),
    (["--client_chunk=10001"], ["--client_chunk=10001", "at most 10000"]),
    (["--runner=ray", "--ray_workers=10001"], ["--ray_workers=10001", "at most 10000"]),
    (["--algo=ifca", "--num_groups=10001"], ["--num_groups=10001", "at most 10000"]),
    (["--algo=ifca", "--ifca_warm_rounds=1000001"],
     ["--ifca_warm_rounds=1000001", "an integer >= 0, at most 1000000"]),
    (["--algo=fedgroup", "--pretrain_iters=10000001"],
     ["--pretrain_iters=10000001", "at most 10000000"]),
    # Any integer setting without a limit of its own: 2**31 - 1.
    (["--task=synthetic_clusters", "--task_arg=num_clusters=2147483648"],
     ["--task_arg=num_clusters=2147483648", "valid: an integer >= 1, at most 2147483647"]),
    # A generated task that cannot fit in memory: its estimate, what fits here.
    (["--num_clients=1000000"],
     ["--num_clients=1000000", "--task=synthetic", "GB of memory", "8.0 GB available",
      "valid: --num_clients <= 25588 here"]),
    (["--num_clients=1000", "--task_arg=samples_per_client=100000000"],
     ["samples_per_client=100000000", "8.0 GB available",
      "valid: --task_arg=samples_per_client <= 11734877 for one client here"]),
])
def test_each_size_limit_is_refused_in_one_line_before_any_work(flags, needles, no_work,
                                                                tmp_path, capsys):
  out = tmp_path / "run"
  base = ["--algo=fedavg", "--task=synthetic", "--progress=false", f"--output_dir={out}"]
  code, _, err = main_in_process([*base, *flags], capsys)  # a later --algo/--task wins
  assert_one_line_error(code, err, out, *needles)


def test_limits_let_the_largest_valid_values_through():
  for decl, top in ((hp.ROUNDS, 1_000_000), (hp.CLIENTS_PER_ROUND, 1_000_000),
                    (hp.LOCAL_EPOCHS, 10_000), (hp.LOCAL_STEPS, 10_000_000),
                    (hp.BATCH_SIZE, 1_000_000), (hp.EVAL_EVERY, 1_000_000),
                    (hp.RAY_WORKERS, 10_000), (hp.CLIENT_CHUNK, 10_000),
                    (hp.NUM_GROUPS, 10_000)):
    assert decl.check(top) == top
  with pytest.raises(hp.HParamError, match="at most 1000000"):
    hp.ROUNDS.check(10**6 + 1)


def test_a_resume_extending_past_the_limit_is_refused(tmp_path, capsys, monkeypatch):
  """--resume --rounds=... goes through the same checks as a new run."""
  run_dir = _config_dir(tmp_path, runner="local")
  monkeypatch.setattr(run_experiment, "run", lambda s: pytest.fail("a run started"))
  code, _, err = main_in_process(["--resume", f"--output_dir={run_dir}",
                                  "--rounds=99999999999999999999999"], capsys)
  assert code == 2 and err.count("\n") == 1, err
  assert ("invalid --rounds=99999999999999999999999; valid: an integer >= 1, at most "
          "1000000") in err


def _config_dir(tmp_path, runner, **runner_flags):
  """A run directory holding the config.json a run on `runner` writes."""
  values = {name: None for name in settings_module.flag_names()}
  values.update(algo="fedavg", task="synthetic", num_clients=20, clients_per_round=5,
                local_epochs=1, rounds=2, progress=False, runner="local",
                output_dir=str(tmp_path / f"run-{runner}"))
  # Made as for local (the ray and tff runners need their stacks), then named.
  resolved = settings_module.resolve_settings(values)
  resolved.update(runner=runner, **runner_flags)
  os.makedirs(resolved["output_dir"])
  with open(os.path.join(resolved["output_dir"], "config.json"), "w") as f:
    json.dump(results.to_jsonable(resolved), f)
  return resolved["output_dir"]


# `started_on`, not `runner`: conftest marks a test with runner="tff" as one
# that needs TFF, and these only read settings.
@pytest.mark.parametrize("started_on, flags, to", [
    ("ray", {"ray_workers": 2, "ray_address": "10.0.0.1:6379"}, "local"),
    ("tff", {"tff_workers": "h1:8000,h2:8000", "tff_worker_grace": 3.0}, "local"),
])
def test_resume_on_another_runner_does_not_inherit_the_old_runners_flags(
    started_on, flags, to, tmp_path, capsys):
  """The run's --ray_* / --tff_* values came from config.json, not from the
  command line: they are dropped, not refused, when the runner changes."""
  run_dir = _config_dir(tmp_path, started_on, **flags)
  for resume, eval_only in ((True, False), (False, True)):
    got = settings_module.run_dir_settings(run_dir, {"runner": to}, resume, eval_only)
    assert got["runner"] == to
    assert all(got[name] is None for name in flags), got
  _, err = capsys.readouterr()
  assert "warning" not in err, err
  # Typed on the command line, they are still refused.
  typed = {name: value for name, value in flags.items() if name.endswith("workers")}
  with pytest.raises(settings_module.UsageError, match=f"--{next(iter(typed))} given with "
                     f"--runner={to}"):
    settings_module.run_dir_settings(run_dir, {"runner": to, **typed}, True, False)


# --- Resumed on another runner, end to end. ----------------------------------

FLAGS = ["--algo=fedavg", *SMALL_ARGS, "--num_clients=6", "--clients_per_round=3",
         "--checkpoint_every=1", "--jit=off"]


def _assert_same_metrics(whole, run, rounds):
  a, b = read_metrics_csv(whole / "metrics.csv"), read_metrics_csv(run / "metrics.csv")
  assert len(a) == len(b) == rounds
  for row_a, row_b in zip(a, b):
    for name, x in row_a.items():
      if name.endswith("seconds") or x is None:
        continue
      # The ray runner adds the shards' partial sums in another order.
      np.testing.assert_allclose(row_b[name], x, rtol=1e-4, atol=1e-6, err_msg=name)


def _main(args, capsys):
  code, _, err = main_in_process(args, capsys)
  assert code in (0, None), err
  return err


def test_a_ray_runs_config_resumes_on_local_from_the_command_line(tmp_path, capsys):
  """`--resume --runner=local` of a run whose config.json says `ray` with
  `--ray_workers=2` (as a ray run writes it; the checkpoint is the same on
  every runner, tests/test_ray_runner.py checks a ray run's against local's):
  the run goes on, with the metrics of a run never interrupted."""
  whole, run = tmp_path / "whole", tmp_path / "run"
  _main([*FLAGS, "--rounds=3", f"--output_dir={whole}"], capsys)
  _main([*FLAGS, "--rounds=2", f"--output_dir={run}"], capsys)
  config = json.loads((run / "config.json").read_text())
  config.update(runner="ray", ray_workers=2, ray_address=None)
  (run / "config.json").write_text(json.dumps(config))
  _main(["--resume", f"--output_dir={run}", "--rounds=3", "--runner=local"], capsys)
  resumed = json.loads((run / "config.json").read_text())
  assert resumed["runner"] == "local" and resumed["ray_workers"] is None
  assert resumed["resumed_from"]["runner"] == "ray"
  _assert_same_metrics(whole, run, 3)

