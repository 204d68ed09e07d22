"""Sweeps (`tff_cluster.sweep`): the grid a file names, the refusals, the
report's numbers, and a sweep stopped twice (a killed driver, then SIGTERM)
that ends with the numbers of uninterrupted runs. The Ray cluster's tests are
in tests/test_sweep_ray.py."""

from __future__ import annotations

import csv
import fcntl
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.helpers import main_in_process
from tff_cluster.io import rundir
from tff_cluster.sweep import __main__ as sweep_main
from tff_cluster.sweep import cells, driver, report, spec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROG = "python -m tff_cluster.sweep: error: "

EXAMPLE = """
algos = ["fedavg", "ifca"]
tasks = ["synthetic_clusters", "synthetic"]
seeds = [0, 1]

[flags]
rounds = 3
client_lr = 1          # an integer for a float flag
task_arg = {}

[grid]
local_epochs = [1, 2]

[[when]]
algo = "ifca"
flags = {num_groups = 3}

[[when]]
task = "synthetic"
algo = "fedavg"
seeds = [1]

[[when]]
task = "synthetic"
algo = "ifca"
skip = true
"""


def _write(tmp_path, text, name="sweep.toml"):
  path = tmp_path / name
  path.write_text(text)
  return str(path)


def test_a_sweep_file_gives_its_cells_seed_by_seed_with_their_flags(tmp_path):
  sweep = spec.load(_write(tmp_path, EXAMPLE))
  got = [(c.path, c.argv()) for c in sweep.cells]
  common = ["--rounds=3", "--client_lr=1.0"]
  want = []
  for seed in (0, 1):
    for task, algo in (("synthetic_clusters", "fedavg"), ("synthetic_clusters", "ifca"),
                       ("synthetic", "fedavg")):
      if task == "synthetic" and seed == 0:
        continue  # its [[when]] keeps seed 1 only
      for e in (1, 2):
        extra = ["--num_groups=3"] if algo == "ifca" else []
        want.append((os.path.join(task, algo, f"local_epochs={e}", f"seed{seed}"),
                     [f"--algo={algo}", f"--task={task}", f"--seed={seed}", *common,
                      *extra, f"--local_epochs={e}"]))
  assert got == want
  assert sweep.grid_names == ("local_epochs",)


def test_the_commands_flags_make_the_same_sweep_as_a_file(tmp_path):
  data = spec.from_flags("fedavg,ifca", "synthetic_clusters", "0,1",
                         ["rounds=3", "client_lr=1", "task_arg=num_clusters=2"],
                         ["local_epochs=1,2"])
  flags_sweep = spec.from_dict(data)
  file_sweep = spec.load(_write(tmp_path, """
algos = ["fedavg", "ifca"]
tasks = ["synthetic_clusters"]
seeds = [0, 1]
[flags]
rounds = 3
client_lr = 1.0
task_arg = {num_clusters = 2}
[grid]
local_epochs = [1, 2]
"""))
  assert [c.argv() for c in flags_sweep.cells] == [c.argv() for c in file_sweep.cells]
  merged = spec.merge({"algos": ["fedavg"], "flags": {"rounds": 5, "client_lr": 0.1}},
                      {"algos": ["ifca"], "flags": {"rounds": "7"}})
  assert merged == {"algos": ["ifca"], "flags": {"rounds": "7", "client_lr": 0.1}}


def test_named_methods_and_settings_are_cells_of_their_own_with_their_flags(tmp_path):
  sweep = spec.load(_write(tmp_path, """
algos = ["ifca", "ifca_decay"]
tasks = ["few"]
seeds = [0]
[flags]
rounds = 3
lr_decay = 0.5
[methods.ifca_decay]
algo = "ifca"
flags = {lr_decay = 0.9, num_groups = 2}
[settings.few]
task = "synthetic_clusters"
flags = {num_clients = 40, rounds = 4}
[[when]]
algo = "ifca"          # the algorithm's name matches both methods
flags = {client_lr = 0.05}
[[when]]
algo = "ifca_decay"    # a method's name only itself
task = "few"
flags = {eval_every = 2}
"""))
  got = {c.path: (c.algo, c.task, dict(c.flags)) for c in sweep.cells}
  assert got == {
      os.path.join("few", "ifca", "seed0"): (
          "ifca", "synthetic_clusters",
          {"rounds": 4, "lr_decay": 0.5, "num_clients": 40, "client_lr": 0.05}),
      os.path.join("few", "ifca_decay", "seed0"): (
          "ifca", "synthetic_clusters",
          {"rounds": 4, "lr_decay": 0.9, "num_clients": 40, "num_groups": 2, "client_lr": 0.05,
           "eval_every": 2})}
  with pytest.raises(spec.SpecError, match=r"\[methods.fedavg\]: 'fedavg' is already the name "
                     "of algo 'fedavg'"):
    spec.from_dict({"algos": ["fedavg"], "tasks": ["synthetic"], "seeds": [0],
                    "methods": {"fedavg": {"algo": "ifca"}}})
  with pytest.raises(spec.SpecError, match=r"\[settings.s\]: no task"):
    spec.from_dict({"algos": ["fedavg"], "tasks": ["s"], "seeds": [0],
                    "settings": {"s": {"flags": {}}}})


BAD = [
    ("colour = 1", "unknown key 'colour'; valid: algos, tasks, seeds"),
    ('algos = ["fedav"]\ntasks = ["synthetic"]\nseeds = [0]', "unknown algo 'fedav'; valid:"),
    ('algos = ["fedavg"]\ntasks = ["synthetic"]\nseeds = "0"', "seeds = '0'; valid: a non-empty"),
    ('algos = ["fedavg"]\ntasks = ["synthetic"]', "no seeds; valid: seeds = [...]"),
    ('algos = ["fedavg"]\ntasks = ["synthetic"]\nseeds = [0]\n[flags]\nlr = 0.1',
     "[flags] lr: unknown flag 'lr'; valid:"),
    ('algos = ["fedavg"]\ntasks = ["synthetic"]\nseeds = [0]\n[flags]\nrounds = 2.5',
     "rounds = 2.5; valid: an integer"),
    ('algos = ["fedavg"]\ntasks = ["synthetic"]\nseeds = [0]\n[flags]\noutput_dir = "x"',
     "output_dir is set by the sweep itself"),
    ('algos = ["fedavg"]\ntasks = ["synthetic"]\nseeds = [0]\n[grid]\nclient_lr = [0.1, -1]',
     "cell task=synthetic algo=fedavg client_lr=-1.0 seed=0: invalid --client_lr=-1.0; "
     "valid: a number > 0"),
    ('algos = ["fedavg"]\ntasks = ["synthetic"]\nseeds = [0]\n[[when]]\nflags = {rounds = 2}',
     "[[when]] #1: names no algo or task"),
    ('algos = ["fedavg"]\ntasks = ["synthetic"]\nseeds = [0]\n[[when]]\nalgo = "fedavg"\n'
     'skip = true', "every cell is skipped"),
    ('algos = ["fedavg"\n', "not valid TOML"),
]


@pytest.mark.parametrize("text,needle", BAD, ids=[b[1][:30] for b in BAD])
def test_a_bad_sweep_file_gets_one_line_naming_the_key_and_runs_nothing(
    tmp_path, capsys, text, needle):
  out = tmp_path / "out"
  code = sweep_main.main([_write(tmp_path, text), f"--out={out}"])
  err = capsys.readouterr().err
  lines = [ln for ln in err.splitlines() if ln.strip()]
  assert code == 2 and len(lines) == 1 and lines[0].startswith(PROG), err
  assert needle in lines[0], lines[0]
  assert not out.exists()


def test_a_missing_file_and_a_bad_flag_are_one_line_too(tmp_path, capsys):
  assert sweep_main.main([str(tmp_path / "none.toml")]) == 2
  assert "none.toml: no such file; valid: a sweep file" in capsys.readouterr().err
  assert sweep_main.main(["--algos=fedavg", "--tasks=synthetic", "--seeds=0,x"]) == 2
  assert "--seeds=0,x; valid: a comma-separated list of integers" in capsys.readouterr().err
  assert sweep_main.main(["--algos=fedavg", "--tasks=synthetic", "--seeds=0",
                          f"--out={tmp_path / 'o'}", "--parallel=0"]) == 2
  assert "--parallel=0; valid: an integer >= 1" in capsys.readouterr().err


def _fake_run(run_dir, accuracy, seconds, completed=True, reason=None, ari=None):
  """A finished run's summary.json and metrics.jsonl, written by hand."""
  os.makedirs(run_dir, exist_ok=True)
  summary = {"completed": completed, "final_test_accuracy": accuracy,
             "final_test_accuracy_clientavg": None if accuracy is None else accuracy / 2,
             "rounds_completed": 2,
             "bytes_down": 3_000_000, "bytes_up": 1_000_000, "total_seconds": 9.5}
  if reason:
    summary["reason"] = reason
  if ari is not None:
    summary["ari"] = ari
  with open(os.path.join(run_dir, rundir.SUMMARY), "w") as f:
    json.dump(summary, f)
  with open(os.path.join(run_dir, rundir.METRICS_JSONL), "w") as f:
    for r, s in enumerate(seconds, 1):
      f.write(json.dumps({"round": r, "round_seconds": s}) + "\n")


def _small_sweep():
  return spec.from_dict({"algos": ["fedavg", "ifca"], "tasks": ["synthetic_clusters"],
                         "seeds": [0, 1, 2], "flags": {"rounds": 2}})


def test_the_report_is_each_cells_numbers_and_the_seeds_mean_and_sample_std(tmp_path):
  sweep = _small_sweep()
  out = str(tmp_path)
  base = os.path.join(out, "synthetic_clusters")
  _fake_run(os.path.join(base, "fedavg", "seed0"), 0.80, [5.0, 1.0, 2.0])
  _fake_run(os.path.join(base, "fedavg", "seed1"), 0.90, [4.0, 3.0])
  _fake_run(os.path.join(base, "fedavg", "seed2"), None, [1.0], completed=False,
            reason="diverged")
  _fake_run(os.path.join(base, "ifca", "seed0"), 0.7, [1.0], ari=0.5)
  _fake_run(os.path.join(base, "ifca", "seed1"), 0.6, [1.0], ari=1.0)
  rows = report.write(sweep, out, failures={"synthetic_clusters/ifca/seed2": "exit 1: boom"},
                      plots=False)
  with open(os.path.join(out, report.RESULTS_CSV)) as f:
    got = list(csv.DictReader(f))
  assert [r["status"] for r in got] == ["done", "done", "done", "done", "diverged", "failed"]
  first = got[0]  # fedavg seed 0
  assert float(first["final_test_accuracy"]) == 0.80
  assert float(first["mb_per_round"]) == 4_000_000 / 2 / 1e6
  assert float(first["seconds_per_round"]) == 2.0  # the median of 5, 1, 2
  assert got[-1]["message"] == "exit 1: boom"
  table = open(os.path.join(out, report.TABLE_MD)).read()
  # fedavg: 80 and 90 -> 85.00 ± 7.07 (sample std 7.0710...); clientavg 40, 45 -> 42.50 ± 3.53;
  # s/round: medians 2 and 3.5 -> 2.75 ± 1.06
  assert "| `fedavg` | 0,1 | 85.00 ± 7.07 | 42.50 ± 3.53 | – | 2.00 ± 0.00 | 2.75 ± 1.06 | 2 | – |" \
      in table, table
  # ifca: 70, 60 -> 65.00 ± 7.07; ARI 50, 100 -> 75.00 ± 35.35
  assert "| `ifca` | 0,1 | 65.00 ± 7.07 | 32.50 ± 3.53 | 75.00 ± 35.35 | 2.00 ± 0.00 | " \
      "1.00 ± 0.00 | – | 2 |" in table, table
  assert len(rows) == 6


def test_mean_std_cuts_never_rounds_up():
  assert report.mean_std([0.94569]) == "94.56"
  assert report.mean_std([0.9457]) == "94.57"
  assert report.mean_std([None, 0.5]) == "50.00"
  assert report.mean_std([]) == "–"
  assert report.truncated(float("nan"), 2) == "–"


def test_a_folder_holding_anything_but_this_sweep_is_refused_before_anything_is_written(
    tmp_path):
  sweep = _small_sweep()
  foreign = tmp_path / "mine"
  foreign.mkdir()
  (foreign / "notes.txt").write_text("keep")
  with pytest.raises(driver.SweepBusy, match="is not empty and holds no sweep"):
    driver.sweep(sweep, out=str(foreign), progress=False)
  assert sorted(os.listdir(foreign)) == ["notes.txt"]
  # A sweep whose cell ran here with other flags.
  other = tmp_path / "other"
  other.mkdir()
  recorded = spec.from_dict({"algos": ["fedavg"], "tasks": ["synthetic_clusters"],
                             "seeds": [0], "flags": {"rounds": 3}})
  (other / driver.RECORD).write_text(json.dumps(spec.union({}, recorded)))
  with pytest.raises(driver.SweepBusy, match="1 of its cells ran there with other flags"):
    driver.sweep(sweep, out=str(other), progress=False)


def test_a_second_sweep_into_a_running_sweeps_folder_is_refused(tmp_path):
  out = tmp_path / "out"
  out.mkdir()
  held = os.open(out / driver.LOCK, os.O_RDWR | os.O_CREAT)
  fcntl.flock(held, fcntl.LOCK_EX)
  os.write(held, b"pid 1 on elsewhere\n")
  try:
    with pytest.raises(driver.SweepBusy, match=r"being run by another sweep \(pid 1 on "
                       "elsewhere\\); valid: another --out"):
      driver.sweep(_small_sweep(), out=str(out), progress=False)
  finally:
    os.close(held)


def test_finished_cells_are_kept_and_a_sweep_may_add_cells(tmp_path):
  """Cells whose runs completed are not run again; a sweep with more seeds
  adds its cells to the folder's record."""
  out = str(tmp_path)
  one = spec.from_dict({"algos": ["fedavg"], "tasks": ["synthetic_clusters"], "seeds": [0],
                        "flags": {"rounds": 2}})
  with open(os.path.join(out, driver.RECORD), "w") as f:  # a sweep of seed 0 ran here
    json.dump(spec.union({}, one), f)
  _fake_run(os.path.join(out, "synthetic_clusters", "fedavg", "seed0"), 0.5, [1.0])
  _fake_run(os.path.join(out, "synthetic_clusters", "fedavg", "seed1"), 0.7, [1.0])
  seen = []
  result = driver.sweep(one, out=out, progress=False, plots=False,
                        on_cell=lambda cell, outcome: seen.append((cell.seed, outcome.ran)))
  assert seen == [(0, False)] and not result.failed
  two = spec.from_dict({"algos": ["fedavg"], "tasks": ["synthetic_clusters"], "seeds": [0, 1],
                        "flags": {"rounds": 2}})
  result = driver.sweep(two, out=out, progress=False, plots=False)
  assert [r["final_test_accuracy"] for r in result.rows] == [0.5, 0.7]
  with open(os.path.join(out, driver.RECORD)) as f:
    assert [c["seed"] for c in json.load(f)["cells"]] == [0, 1]


def test_output_log_is_a_runs_own_file_that_overwrite_keeps(tmp_path):
  from tff_cluster.io import results
  run = tmp_path / "run"
  run.mkdir()
  (run / rundir.LOG).write_text("== attempt\n")
  assert rundir.foreign_entries(str(run)) == []
  results.check_output_dir(str(run), overwrite=True)  # no refusal


# ---------------------------------------------------------------------------
# Real cells: processes, a killed driver, a stop signal.

STOPPED = """
algos = ["fedavg", "ifca"]
tasks = ["synthetic_clusters"]
seeds = [0]
[flags]
rounds = 20
clients_per_round = 10
checkpoint_every = 2
eval_every = 3
jit = "off"          # the reference runs in this process, where the tests choose `auto`'s XLA
[[when]]
algo = "ifca"
flags = {num_groups = 3}
"""
BROKEN = """
[[when]]
algo = "fedavg"
task = "mnist"
flags = {data_dir = "/nonexistent", data_source = "keras", rounds = 1}
[[when]]
algo = "ifca"
task = "mnist"
skip = true
"""


def _start(args):
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
  return subprocess.Popen([sys.executable, "-m", "tff_cluster.sweep", *args], cwd=ROOT,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _cell_processes(out: str) -> list:
  """pids of processes running a cell of the sweep in `out`."""
  found = []
  for pid in os.listdir("/proc"):
    if not pid.isdigit():
      continue
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmd = f.read().decode(errors="replace")
    except OSError:
      continue
    if "tff_cluster\0" in cmd and f"--output_dir={out}" in cmd:
      found.append(int(pid))
  return found


def _wait_for(predicate, timeout, what):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if predicate():
      return
    time.sleep(0.2)
  raise AssertionError(f"timed out waiting for {what}")


def _checkpoints(out, cell):
  from tff_cluster.io import checkpoint
  d = os.path.join(out, cell)
  return checkpoint.rounds(d) if os.path.isdir(os.path.join(d, rundir.CHECKPOINTS)) else []


@pytest.mark.slow
@pytest.mark.serial
def test_a_sweep_killed_then_stopped_finishes_with_the_uninterrupted_runs_numbers(
    tmp_path, capsys):
  """Kill -9 of the driver leaves no cell running (each dies with it); the
  same command again resumes; SIGTERM stops the cells as interrupted runs;
  the third start finishes: every metric equals the cells run without a
  stop, and the broken cell is one FAILED line while the others finish."""
  path = _write(tmp_path, STOPPED.replace('tasks = ["synthetic_clusters"]',
                                          'tasks = ["synthetic_clusters", "mnist"]') + BROKEN)
  out = str(tmp_path / "out")
  args = [path, f"--out={out}", "--parallel=2", "--progress=false"]
  ifca = os.path.join("synthetic_clusters", "ifca", "seed0")
  fedavg = os.path.join("synthetic_clusters", "fedavg", "seed0")

  proc = _start(args)
  _wait_for(lambda: any(r >= 2 for r in _checkpoints(out, fedavg) + _checkpoints(out, ifca)),
            240, "a first checkpoint")
  proc.kill()
  proc.wait()
  _wait_for(lambda: not _cell_processes(out), 10, "the cells to die with the driver")

  proc = _start(args)
  _wait_for(lambda: any(r >= 6 for r in _checkpoints(out, ifca)) or proc.poll() is not None,
            240, "the resumed cells to go on")
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 128 + signal.SIGTERM, err
  assert "stopped by SIGTERM" in err and "run the same command again" in err, err
  assert not _cell_processes(out)
  with open(os.path.join(out, ifca, rundir.SUMMARY)) as f:
    assert json.load(f)["reason"] == "interrupted"  # stopped as a run stops, resumable

  proc = _start(args)
  _, err = proc.communicate(timeout=400)
  assert proc.returncode == 1, err
  failed = [ln for ln in err.splitlines() if ln.startswith("FAILED")]
  assert len(failed) == 1 and failed[0].startswith("FAILED mnist/fedavg/seed0: exit 2: ") \
      and "/nonexistent does not exist" in failed[0], err
  assert "2/3 cells finished" in err

  for cell, flags in ((fedavg, ["--algo=fedavg"]), (ifca, ["--algo=ifca", "--num_groups=3"])):
    reference = str(tmp_path / ("ref_" + cell.replace(os.sep, "_")))
    code, _, ref_err = main_in_process(
        [*flags, "--task=synthetic_clusters", "--seed=0", "--rounds=20",
         "--clients_per_round=10", "--eval_every=3", "--jit=off", "--progress=false",
         f"--output_dir={reference}"], capsys)
    assert code == 0, ref_err
    _, want = rundir.read_metrics(reference)
    _, got = rundir.read_metrics(os.path.join(out, cell))
    skip = ("round_seconds", "eval_seconds")
    for a, b in zip(got, want, strict=True):
      for k in b:
        if k not in skip:
          np.testing.assert_equal(a[k], b[k], err_msg=f"{cell} round {b['round']} {k}")
  with open(os.path.join(out, report.RESULTS_CSV)) as f:
    rows = {r["run_dir"]: r for r in csv.DictReader(f)}
  assert rows[ifca]["status"] == "done" and rows["mnist/fedavg/seed0"]["status"] == "failed"
  os.remove(os.path.join(out, report.RESULTS_CSV))  # written again from the folder alone
  assert sweep_main.main([path, f"--out={out}", "--report_only"]) == 0
  with open(os.path.join(out, report.RESULTS_CSV)) as f:
    again = {r["run_dir"]: r for r in csv.DictReader(f)}
  assert again == rows  # (the failed cell's line kept in sweep.json)
  assert "no such" not in open(os.path.join(out, ifca, cells.LOG)).read().lower()
  assert os.path.exists(os.path.join(out, "curves_synthetic_clusters.png"))
