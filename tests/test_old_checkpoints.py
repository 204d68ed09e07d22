"""Run folders written by tff-cluster 0.2.0 before algorithms became specs
(commit d079314) resume: their checkpoints hold the server optimizer's state
as `buffer`, the host state under the driver's old attribute names (`_rng`,
`_summary`, `_forced_rng`) and the clients' momentum as `velocity`;
`io/checkpoint.py` maps them in one place.

tests/data/checkpoints-0.2.0/<algo> is such a folder (2 of 4 rounds, its
checkpoints, config and rows; made by that commit's `run_experiment.py` with
the flags below). `--resume --rounds=4` on it gives the rows of an
uninterrupted 4-round run of today's code.
"""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import REPO_ROOT, tiered
from tests.helpers import main_in_process, read_metrics_csv

DATA = REPO_ROOT / "tests" / "data" / "checkpoints-0.2.0"
COMMON = ("--task=synthetic_clusters", "--num_clients=12", "--clients_per_round=4",
          "--local_epochs=1", "--batch_size=10", "--client_lr=0.05", "--client_momentum=0.5",
          "--client_state=persist", "--seed=3", "--progress=false")
# Each folder's own flags: IFCA's forced and warm rounds (three generators in
# its host state), HypCluster's per-cluster server momentum, FedAvgM's buffer.
FLAGS = {
    "ifca": ("--num_groups=2", "--ifca_init=fedavg_warm", "--ifca_warm_rounds=1",
             "--ifca_forced_rounds=1"),
    "hypcluster": ("--num_groups=2", "--hypcluster_server_momentum=0.5"),
    "fedavgm": (),
}
TIMING = ("round_seconds", "eval_seconds")


def _rows(run_dir):
  return [{k: v for k, v in row.items() if k not in TIMING}
          for row in read_metrics_csv(run_dir / "metrics.csv")]


@pytest.mark.parametrize("algo", tiered(sorted(FLAGS), lambda a: a == "ifca"))
def test_a_checkpoint_of_0_2_0_resumes_as_the_uninterrupted_run(algo, tmp_path, capsys):
  old = tmp_path / "old"
  shutil.copytree(DATA / algo, old)
  args = (f"--algo={algo}", *COMMON, *FLAGS[algo], "--rounds=4")
  code, out, err = main_in_process([*args, f"--output_dir={old}", "--resume"], capsys)
  assert code == 0, err[-2000:]
  assert "resum" in (out + err).lower()
  code, _, err = main_in_process([*args, f"--output_dir={tmp_path / 'new'}"], capsys)
  assert code == 0, err[-2000:]
  resumed, whole = _rows(old), _rows(tmp_path / "new")
  assert [r["round"] for r in resumed] == [r["round"] for r in whole] == [1, 2, 3, 4]
  assert resumed[:2] == _rows(DATA / algo)  # the folder's own rows, carried over
  # Rounds 3 and 4 are today's code resumed from 0.2.0's state, rounds 1 and 2
  # of the uninterrupted run today's code from the start: both 0.2.0's numbers
  # to the runners' parity tolerance (the folder's rounds ran in a process of
  # their own, under XLA, and the suite's processes sum in their own thread
  # order; a state not resumed, a generator restarted or an optimizer state
  # dropped moves them by far more).
  assert _same(resumed, whole, rtol=1e-4), (resumed, whole)


def _same(a, b, rtol) -> bool:
  return all(set(r) == set(w) and all(
      r[k] == w[k] or (r[k] != r[k] and w[k] != w[k])  # NaN, NaN
      or (r[k] is not None and w[k] is not None and abs(r[k] - w[k]) <= rtol * abs(w[k]))
      for k in r) for r, w in zip(a, b))


def test_an_option_the_old_run_lacks_may_only_keep_its_default(tmp_path, capsys):
  """HypCluster's run of 0.2.0 predates --server_optimizer: resuming it at
  the option's default (sgd) is the same run, another value is refused."""
  old = tmp_path / "old"
  shutil.copytree(DATA / "hypcluster", old)
  args = ("--algo=hypcluster", *COMMON, *FLAGS["hypcluster"], "--rounds=4",
          f"--output_dir={old}", "--resume", "--server_optimizer=adam")
  code, _, err = main_in_process(args, capsys)
  assert code == 2 and "--resume: algo_options=" in err and "'server_optimizer': 'adam'" in err
