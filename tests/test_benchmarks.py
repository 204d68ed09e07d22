"""The benchmark tables' bookkeeping: recorded scores merge with runs on disk."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
import cflmgd_table2  # noqa: E402
import fedgroup_table3  # noqa: E402
import clustered_catalogue  # noqa: E402
import _sweep  # noqa: E402
import personalized_baselines  # noqa: E402
import pfedmo_table2  # noqa: E402
import private_clustered  # noqa: E402
import wecfl_table2  # noqa: E402
import xla_compile_growth  # noqa: E402
from tff_cluster.io import checkpoint  # noqa: E402
from tff_cluster.host.driver import TrainingConfig
from tff_cluster.runners.config import RunnerConfig


@pytest.fixture
def recorded(tmp_path, monkeypatch):
  monkeypatch.setattr(_sweep, "RECORDED", str(tmp_path / "recorded"))
  return tmp_path


def test_recorded_files_name_known_methods_and_fractions():
  for row in _sweep.load_recorded("wecfl_table2"):
    assert row["setting"] in wecfl_table2.TASKS and row["method"] in wecfl_table2.METHODS
    if not row.get("diverged_round"):
      assert 0 < float(row["accuracy"]) <= 1 and 0 < float(row["macro_f1"]) <= 1
  for row in _sweep.load_recorded("cflmgd_table2"):
    assert row["method"] in cflmgd_table2.METHODS
    if not row.get("diverged_round"):
      assert 0 < float(row["final_accuracy"]) <= 1
  for row in _sweep.load_recorded("clustered_catalogue"):
    assert 0 < float(row["accuracy"]) <= 1 and 0 < float(row["accuracy_clientavg"]) <= 1
    if row["ari"]:
      assert -1 <= float(row["ari"]) <= 1 and 0 < float(row["purity"]) <= 1
  for row in _sweep.load_recorded("clustered_catalogue_papers"):
    assert row["row"] in clustered_catalogue.PAPER_ROWS and 0 < float(row["accuracy"]) <= 1
  for row in _sweep.load_recorded("pfedmo_table2"):
    assert row["setting"] in pfedmo_table2.SETTINGS and row["method"] in pfedmo_table2.METHODS
    if not row.get("diverged_round"):
      assert 0 < float(row["global_accuracy"]) <= 1


def test_save_recorded_replaces_rows_with_the_same_key(recorded):
  fields = ("method", "seed", "value")
  _sweep.save_recorded("t", [dict(method="A", seed=0, value=1),
                                      dict(method="A", seed=1, value=2)], ("method", "seed"),
                                fields)
  _sweep.save_recorded("t", [dict(method="A", seed=1, value=3)], ("method", "seed"),
                                fields)
  rows = _sweep.load_recorded("t")
  assert [(r["seed"], r["value"]) for r in rows] == [("0", "1"), ("1", "3")]
  assert not os.path.exists(os.path.join(_sweep.RECORDED, "t.csv.tmp"))


def _finished_run(directory, accuracy, seconds):
  os.makedirs(directory)
  with open(os.path.join(directory, "summary.json"), "w") as f:
    json.dump({"completed": True, "final_test_accuracy": accuracy,
               "mean_round_seconds": seconds}, f)


def test_cflmgd_table_merges_recorded_seeds_with_runs_on_disk(recorded, monkeypatch):
  out = recorded / "runs"
  _sweep.save_recorded(
      "cflmgd_table2", [dict(method="IFCA", seed=0, final_accuracy=0.90, seconds_per_round=10),
                        dict(method="IFCA", seed=1, final_accuracy=0.10, seconds_per_round=99)],
      cflmgd_table2.RECORD_KEY, cflmgd_table2.RECORD_FIELDS)
  _finished_run(cflmgd_table2.run_dir(str(out), "IFCA", 1), 0.94, 12.0)  # replaces seed 1
  args = type("Args", (), dict(out=str(out), table=str(recorded / "table"), record=True))
  text = cflmgd_table2.write_table(args)
  assert ("| IFCA | uniform averaging, lr 0.1, no decay | 0,1 | 92.00 ± 2.82 | 92.60 ± 0.27 "
          "| 11.0 | – |") in text  # std 2.828..., cut
  with open(os.path.join(_sweep.RECORDED, "cflmgd_table2.csv"), newline="") as f:
    rows = {r["seed"]: r for r in csv.DictReader(f)}
  assert float(rows["1"]["final_accuracy"]) == 0.94 and float(rows["0"]["final_accuracy"]) == 0.9


def test_cflmgd_lead_is_split_into_momentum_and_schedule():
  """Per seed with CFL-MGD II, IFCA and IFCA decay 0.99 (none diverged): lead
  = II - IFCA = (II - IFCA decay) + (IFCA decay - IFCA), in points cut toward
  zero; the mean over those seeds; a diverged control leaves its seed out."""
  run = lambda accuracy, diverged=None: (accuracy, 10.0, 0.7, diverged)  # noqa: E731
  got = {"CFL-MGD II": {0: run(0.973025), 1: run(0.965425), 2: run(0.9658)},
         "IFCA": {0: run(0.9559), 1: run(0.944975), 2: run(0.9461)},
         "IFCA decay 0.99": {0: run(0.9368), 1: run(0.922375), 2: run(None, 40)},
         "FedAvg": {0: run(0.8941)}, "FedAvg decay 0.99": {0: run(0.8442)}}
  lines = cflmgd_table2.attribution(got).splitlines()
  assert lines[-3:] == [
      # 97.3025 - 95.59 = 1.7125; 97.3025 - 93.68 = 3.6225; 93.68 - 95.59 = -1.91;
      # FedAvg 84.42 - 89.41 = -4.99.
      "| 0 | +1.71 | +3.62 | -1.91 | -4.99 |",
      # 96.5425 - 94.4975 = 2.045; 96.5425 - 92.2375 = 4.305; 92.2375 - 94.4975 = -2.26.
      "| 1 | +2.04 | +4.30 | -2.26 | – |",
      # Means: 1.87875, 3.96375, -2.085.
      "| mean of 0,1 | +1.87 | +3.96 | -2.08 | |"]
  del got["IFCA decay 0.99"]
  assert cflmgd_table2.attribution(got) == ""


def test_table_cells_are_cut_never_rounded_up():
  assert _sweep.truncated(88.6575, 2) == "88.65"
  assert _sweep.truncated(100 * 0.9457, 2) == "94.57"  # float just below: kept
  assert _sweep.truncated(100 * 0.935970, 1) == "93.5"
  assert _sweep.truncated(float("nan"), 1) == "–"
  assert _sweep.mean_std([0.886575]) == "88.65"
  assert _sweep.mean_std([0.9, 0.94]) == "92.00 ± 2.82"  # sample std 2.828...
  assert _sweep.fmt([0.9, 0.94]) == "92.0 ± 2.8"
  assert _sweep.fmt([0.736842]) == "73.6"  # one seed: no "± 0.0"
  assert _sweep.mean_std([None]) == "–"


def test_pfedmo_table_merges_recorded_seeds_with_runs_on_disk(recorded):
  out = recorded / "runs"
  _sweep.save_recorded(
      "pfedmo_table2",
      [dict(setting="lenet5", method="FedNAG", seed=0, global_accuracy=0.90,
            personal_accuracy=0.80, seconds_per_round=1.0),
       dict(setting="lenet5", method="FedAvg", seed=0, global_accuracy=0.5,
            personal_accuracy="", seconds_per_round=2.0),
       # A cell re-entered from an earlier README (seed -1): superseded by real
       # seeds of the same method (FedNAG), shown alone otherwise (FedProx).
       dict(setting="lenet5", method="FedNAG", seed=-1, global_accuracy=0.10,
            personal_accuracy=0.10, seconds_per_round=9.0),
       dict(setting="lenet5", method="FedProx", seed=-1, global_accuracy=0.7,
            personal_accuracy="", seconds_per_round=1.0)],
      pfedmo_table2.RECORD_KEY, pfedmo_table2.RECORD_FIELDS)
  run = pfedmo_table2.run_dir(str(out), "lenet5", "FedNAG", 1)
  os.makedirs(run)
  with open(os.path.join(run, "summary.json"), "w") as f:
    json.dump({"completed": True}, f)
  with open(os.path.join(run, "metrics.jsonl"), "w") as f:
    for r, (g, p) in enumerate([(0.5, 0.5), (0.94, 0.86)], start=1):
      f.write(json.dumps({"round": r, "global_test_accuracy": g, "test_accuracy": p,
                          "round_seconds": 3.0}) + "\n")
  args = type("Args", (), dict(out=str(out), table=str(recorded / "table"), record=True))
  text = pfedmo_table2.write_table(args)
  # global: 0.90, 0.94 -> 92.00 ± 2.82 (std 2.828..., cut); personal: 0.80, 0.86 -> 83.00 ± 4.24
  assert "| FedNAG | 0,1 | 92.00 ± 2.82 | 83.00 ± 4.24 | 95.04 | 2.00 | – |" in text
  assert "| FedAvg | 0 | 50.00 | – | 93.31 | 2.00 | – |" in text
  assert "| FedProx | -1 | 70.00 | – |" in text
  rows = {(r["method"], r["seed"]): r for r in _sweep.load_recorded("pfedmo_table2")}
  assert float(rows[("FedNAG", "1")]["global_accuracy"]) == 0.94
  assert float(rows[("FedNAG", "1")]["personal_accuracy"]) == 0.86


def test_pfedmo_table_reads_back_a_recorded_diverged_run(recorded):
  """A diverged run has no round time: it is recorded as "–" and read back
  (the next --table_only or --record) without error."""
  out = recorded / "runs"
  stopped = pfedmo_table2.run_dir(str(out), "lenet5", "pFedMo (eq. 12)", 1)
  os.makedirs(stopped)
  with open(os.path.join(stopped, "summary.json"), "w") as f:
    json.dump({"completed": False, "reason": "diverged", "diverged_round": 18}, f)
  args = type("Args", (), dict(out=str(out), table=str(recorded / "table"), record=True))
  pfedmo_table2.write_table(args)
  rows = {(r["method"], r["seed"]): r for r in _sweep.load_recorded("pfedmo_table2")}
  assert rows[("pFedMo (eq. 12)", "1")]["seconds_per_round"] == "–"
  args.out = str(recorded / "elsewhere")  # only the recorded CSV now
  assert "| pFedMo (eq. 12) | 1 | diverged at round 18 (1/1 seeds) |" in \
      pfedmo_table2.write_table(args)
  assert _sweep.measured("–") != _sweep.measured("–")  # NaN


@pytest.mark.parametrize("method", ["FedAvg+", "WeCFL"])
def test_wecfl_table_scores_only_completed_runs(tmp_path, method):
  """A run in progress has rows but no final round: an ensemble's "last row"
  must not be scored until the run has completed."""
  run = tmp_path / "run"
  os.makedirs(run)
  with open(run / "metrics.csv", "w") as f:
    f.write("round,test_accuracy_clientavg,test_macro_f1\n")
    for r in range(1, 101):
      f.write(f"{r},{r / 200},{r / 400}\n")
  with open(run / "summary.json", "w") as f:
    json.dump({"completed": False, "rounds_completed": 100}, f)
  assert wecfl_table2.score(str(run), method) is None
  with open(run / "summary.json", "w") as f:
    json.dump({"completed": True}, f)
  expected = (0.5, 0.25) if method == "FedAvg+" else (0.495, 0.2475)  # round 100 / rounds 98-100
  assert wecfl_table2.score(str(run), method)[:2] == pytest.approx(expected)


def test_a_diverged_run_is_shown_as_diverged_and_recorded(recorded):
  """A run the divergence guard stopped is a result: the table says
  "diverged at round r (k/n seeds)", the recorded CSV keeps the round."""
  out = recorded / "runs"
  _finished_run(cflmgd_table2.run_dir(str(out), "FedAvg decay 0.99", 0), 0.9, 10.0)
  stopped = cflmgd_table2.run_dir(str(out), "FedAvg decay 0.99", 1)
  os.makedirs(stopped)
  with open(os.path.join(stopped, "summary.json"), "w") as f:
    json.dump({"completed": False, "reason": "diverged", "diverged_round": 7,
               "mean_round_seconds": 10.0}, f)
  args = type("Args", (), dict(out=str(out), table=str(recorded / "table"), record=True))
  text = cflmgd_table2.write_table(args)
  assert "| FedAvg decay 0.99 | one model, lr 0.1 decay 0.99 | 0,1 | diverged at round 7 (1/2 seeds) |" \
      in text
  rows = {r["seed"]: r for r in _sweep.load_recorded("cflmgd_table2")}
  assert rows["1"]["diverged_round"] == "7" and rows["1"]["final_accuracy"] == ""
  assert _sweep.diverged_cell([9, 7], 3) == "diverged at round 7 (2/3 seeds)"


def test_run_one_resumes_a_run_with_checkpoints_and_restarts_one_without(tmp_path, monkeypatch):
  """An interrupted run whose summary has no `checkpoint_round` (written before
  the field was recorded) still continues from its checkpoints, not from scratch."""
  calls = []
  monkeypatch.setattr(_sweep, "_resume", lambda d, r: calls.append(("resume", d)) or {})
  monkeypatch.setattr(_sweep, "_run",
                      lambda cmd, d, r, what: calls.append(("run", d)) or {})
  run = tmp_path / "run"
  os.makedirs(run / "checkpoints")
  with open(run / "summary.json", "w") as f:
    json.dump({"completed": False, "reason": "interrupted", "rounds_completed": 28}, f)
  _sweep.run_one([], str(run), 0, "local", None)
  assert calls == [("run", str(run))]  # no checkpoint file: a fresh run
  (run / "checkpoints" / "round-000020.npz").write_bytes(b"x")
  (run / "checkpoints" / "round-000020.npz.tmp").write_bytes(b"x")
  assert checkpoint.rounds(str(run)) == [20]  # the .tmp file is not a checkpoint
  _sweep.run_one([], str(run), 0, "local", None)
  assert calls[-1] == ("resume", str(run))
  with open(run / "summary.json", "w") as f:
    json.dump({"completed": True}, f)
  assert _sweep.run_one([], str(run), 0, "local", None) == {"completed": True}
  assert len(calls) == 2


def test_run_one_refuses_a_finished_run_of_other_rounds(tmp_path, monkeypatch):
  """`--rounds=300` over a directory holding an 800-round run stops with one
  line instead of reusing (or resuming) the 800-round run as the 300 asked for."""
  calls = []
  monkeypatch.setattr(_sweep, "_resume", lambda d, r: calls.append(("resume", d)) or {})
  monkeypatch.setattr(_sweep, "_run", lambda cmd, d, r, what: calls.append(("run", d)) or {})
  run = tmp_path / "run"
  os.makedirs(run / "checkpoints")
  with open(run / "config.json", "w") as f:
    json.dump({"rounds": 800}, f)
  with open(run / "summary.json", "w") as f:
    json.dump({"completed": True}, f)
  with pytest.raises(SystemExit, match="holds a run of 800 rounds, not the 300 asked for"):
    _sweep.run_one([], str(run), 0, "local", 300)
  with open(run / "summary.json", "w") as f:
    json.dump({"completed": False, "reason": "interrupted"}, f)
  (run / "checkpoints" / "round-000740.npz").write_bytes(b"x")
  with pytest.raises(SystemExit, match="800 rounds, not the 300"):
    _sweep.run_one([], str(run), 0, "local", 300)
  assert calls == []
  _sweep.run_one([], str(run), 0, "local", 800)  # the same length: resumed
  _sweep.run_one([], str(run), 0, "local", None)  # the task's T: resumed
  assert calls == [("resume", str(run))] * 2


HLO_TYPES = {"float32": "f32", "int32": "s32", "int64": "s64"}


def test_gpu_hlo_round_exports_the_round_with_its_inputs_in_parameter_order(tmp_path):
  import re

  import numpy as np

  import gpu_hlo_round
  out = tmp_path / "hlo"
  gpu_hlo_round.main(["export", f"--out={out}", "--clients=3", "--epochs=1", "--warmup=0",
                      "--repeats=1"])
  text = (out / "round.hlo.txt").read_text()
  entry = text[text.index("\nENTRY"):]
  params = {int(i): (t, shape) for t, shape, i in re.findall(
      r"= (\w+)\[([\d,]*)\](?:\{[\d,]*\})? parameter\((\d+)\)", entry)}
  with np.load(out / "inputs.npz") as z:
    inputs = [z[f"arr_{i}"] for i in range(len(z.files))]
  with np.load(out / "outputs.npz") as z:
    outputs = [z[f"arr_{i}"] for i in range(len(z.files))]
  assert sorted(params) == list(range(len(inputs)))
  for i, a in enumerate(inputs):
    assert params[i] == (HLO_TYPES[str(a.dtype)], ",".join(map(str, a.shape))), i
  root = re.search(r"ROOT \S+ = \(([^)]*)\) tuple", entry).group(1)
  returned = re.findall(r"(\w+)\[([\d,]*)\]", root)
  # The round's outputs first (summed update, per-client results), then the
  # model variables the compiled call writes back.
  assert [(HLO_TYPES[str(a.dtype)], ",".join(map(str, a.shape))) for a in outputs] == \
      returned[:len(outputs)]
  info = json.loads((out / "export.json").read_text())
  assert len(info["sampled"]) == 3 and info["tf_median_s"] > 0
  assert (out / "round.hlo.pb").stat().st_size > 0


def test_gpu_hlo_round_rewrites_copies_and_products_for_jax():
  import gpu_hlo_round
  text = ("%3 = mhlo.copy %2 : tensor<60x10xf32> loc(#loc4)\n"
          "%5 = stablehlo.dot %4, %arg1, precision = [DEFAULT, DEFAULT] : "
          "(tensor<10x60xf32>, tensor<60x10xf32>) -> tensor<10x10xf32>\n")
  same, copies, dots = gpu_hlo_round.rewrite_mlir(text, "default")
  assert (copies, dots) == (1, 1)
  assert "%3 = stablehlo.reshape %2 : (tensor<60x10xf32>) -> tensor<60x10xf32> loc(#loc4)" in same
  assert "mhlo.copy" not in same and "precision = [DEFAULT, DEFAULT]" in same
  highest, _, _ = gpu_hlo_round.rewrite_mlir(text, "highest")
  assert "precision = [HIGHEST, HIGHEST]" in highest and "DEFAULT" not in highest


def test_runner_speed_defaults_follow_the_stack(capsys):
  """runner_speed.py times the local modes on today's stack (no TFF) and
  refuses the tff runner and TFF's FedAvg there in one line; on the TFF stack
  it times all three and the baseline by default."""
  import runner_speed
  args = runner_speed.parse_args([])
  if runner_speed._tff_stack():  # noqa: SLF001
    assert args.runners == ["tff", "local_on", "local_off"]
    assert args.baselines == ["tff_learning"]
    return
  assert args.runners == ["local_on", "local_off"] and args.baselines == []
  for bad in (["--runners=tff,local_on"], ["--baselines=tff_learning"]):
    with pytest.raises(SystemExit) as e:
      runner_speed.parse_args(bad)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "needs TensorFlow Federated" in err and "valid here: --runners=local_on,local_off" in err


def _fedgroup_args(**kw):
  import argparse
  args = argparse.Namespace(
      tasks="synthetic,mnist", seeds="0,1,2", columns=",".join(fedgroup_table3.COLUMNS),
      newcomer_columns=True, ablation=False, runner="local", rounds=None, mnist_dir=None,
      femnist_dir=None, femnist_models="mclr,mlp", mnist_models="mclr,mlp", sent140_dir=None,
      min_tweets=None)
  vars(args).update(kw)
  return args


def test_fedgroup_table3_knows_the_mlp_and_lstm_rows():
  """Rows MNIST-MLP and Sent140-LSTM: their settings' flags in the sweep file
  and the paper's values."""
  t3 = fedgroup_table3
  args = _fedgroup_args(femnist_models="mlp", seeds="0", columns="FedAvg")
  rows = t3.rows_for(["mnist", "sent140", "femnist_fedprox"], args)
  assert [r["row"] for r in rows] == ["MNIST-MCLR", "MNIST-MLP", "Sent140-LSTM", "FEMNIST-MLP"]
  _, _, sweep = t3.plan(_fedgroup_args(tasks="mnist,sent140,femnist_fedprox",
                                       femnist_models="mlp", seeds="0", columns="FedAvg"))
  flags = {t3.ROW_OF[c.setting]: c.argv()[3:] for c in sweep.cells}
  shared = os.path.normpath(os.path.join(REPO_ROOT, "..", "shared", "data"))
  assert flags["MNIST-MLP"] == [f"--data_dir={shared}/mnist", "--model=mlp"]
  assert flags["MNIST-MCLR"] == [f"--data_dir={shared}/mnist"]  # as its recorded runs
  assert flags["Sent140-LSTM"] == [f"--data_dir={shared}/sent140_partial",
                                   f"--glove_path={shared}/sent140_partial",
                                   "--task_arg=min_tweets=5"]
  assert flags["FEMNIST-MLP"][-1] == "--model=mlp"
  # The command's data folders and --min_tweets replace the file's.
  _, _, sweep = t3.plan(_fedgroup_args(tasks="sent140", seeds="0", columns="FedAvg",
                                       sent140_dir="/s", min_tweets=3))
  assert sweep.cells[0].argv()[3:] == ["--data_dir=/s", "--glove_path=/s",
                                       "--task_arg=min_tweets=3"]
  with pytest.raises(SystemExit, match="no row MNIST-CNN"):
    t3.rows_for(["mnist"], _fedgroup_args(mnist_models="cnn"))
  assert t3.PAPER["MNIST-MLP"]["FG-EDC"] == 97.9 and t3.PAPER["MNIST-MLP"]["FedAvg"] == 95.3
  assert t3.PAPER["Sent140-LSTM"]["IFCA"] == 76.8 and t3.PAPER["Sent140-LSTM"]["FeSEM"] == 70.0


def test_fedgroup_table3_columns_can_be_shared_by_two_processes():
  """A row's columns split between two invocations run each column once."""
  t3 = fedgroup_table3

  def columns(**kw):
    kw = dict(dict(seeds="0", tasks="sent140", mnist_models="mlp", femnist_models="mlp"), **kw)
    sweep = t3.plan(_fedgroup_args(**kw))[2]
    return [] if sweep is None else [t3.COLUMN_OF[c.method] for c in sweep.cells]

  every = columns(columns=",".join(t3.COLUMNS))
  assert every == [*t3.COLUMNS, *t3.NEWCOMER_COLUMNS]  # added where FedGroup runs
  first = columns(columns="IFCA,FG-RCC-EDC,FedAvg", newcomer_columns=False)
  second = columns(columns="FG-EDC,FG-MADC,FG-EDC newcomer=flexcfl,FG-MADC newcomer=flexcfl")
  assert first == ["IFCA", "FG-RCC-EDC", "FedAvg"]
  assert second == ["FG-EDC", "FG-MADC", "FG-EDC newcomer=flexcfl", "FG-MADC newcomer=flexcfl"]
  # Synthetic pre-trains every client: no newcomer column there, even named.
  assert "FG-EDC newcomer=flexcfl" not in columns(
      tasks="synthetic", columns="FG-EDC,FG-EDC newcomer=flexcfl")
  assert columns(tasks="synthetic", columns="FG-EDC newcomer=flexcfl") == []
  # --ablation: its three columns, on Synthetic only.
  assert columns(tasks="synthetic,mnist", columns="FedAvg", ablation=True) == [
      "FedAvg", "FedAvg", *t3.ABLATION]
  with pytest.raises(SystemExit, match="unknown column 'FG-X'.*FG-MADC newcomer=flexcfl"):
    columns(columns="FG-X")


def test_fedgroup_table3_plans_the_sweep_files_cells():
  """Every row and column (--ablation too) is the sweep files' grid: 6 rows x
  12 columns x 3 seeds, less Synthetic's 2 newcomer columns, and 3 ablation
  columns on Synthetic; --rounds and --runner=tff are the cells' flags."""
  from tff_cluster.sweep import spec
  t3 = fedgroup_table3
  every = _fedgroup_args(tasks="synthetic,mnist,femnist_fedprox,sent140", ablation=True)
  cells = t3.plan(every)[2].cells
  assert len(cells) == 6 * 12 * 3 - 2 * 3 + 3 * 3 == 219
  files = {(c.setting, c.method, c.seed, c.flags) for p in (t3.PART, t3.ABLATION_PART)
           for c in spec.from_dict(p.data).cells}
  assert {(c.setting, c.method, c.seed, c.flags) for c in cells} == files
  assert len(t3.plan(_fedgroup_args())[2].cells) == 102  # the default: synthetic, mnist
  short = t3.plan(_fedgroup_args(tasks="sent140", seeds="0", rounds=300))[2]
  assert {dict(c.flags)["rounds"] for c in short.cells} == {300} and len(short.cells) == 12
  data = t3._narrowed(t3.PART.data, ["MNIST-MLP"], ["FedAvg"], [0],
                      _fedgroup_args(runner="tff"))
  assert data["flags"]["runner"] == "tff"


def test_fedgroup_table3_runs_its_cells_through_the_sweep(recorded, monkeypatch, capsys):
  """The table's cells run with the sweep (no process here: a cell's start
  is faked) into OUT/ROW/COLUMN/seedS; the table and --record read each
  finished cell's summary.json; --table_only and --dry_run run nothing."""
  from tff_cluster.sweep import cells
  ran = []

  def start(cell_dir, argv):
    ran.append(cell_dir)
    os.makedirs(cell_dir, exist_ok=True)
    with open(os.path.join(cell_dir, "summary.json"), "w") as f:
      json.dump(dict(completed=True, max_test_accuracy=0.75, max_test_accuracy_assigned=0.5,
                     mean_round_seconds=1.25), f)
    return cells.Outcome(cells.DONE, ran=True)

  monkeypatch.setattr(cells, "start", start)
  out = recorded / "runs"
  base = [f"--out={out}", f"--table={recorded}/t3", "--tasks=mnist", "--mnist_models=mlp",
          "--seeds=4", "--record"]
  fedgroup_table3.main(base + ["--columns=FedAvg,FG-EDC", "--no-newcomer_columns",
                               "--parallel=1"])
  assert [os.path.relpath(d, out) for d in ran] == ["MNIST-MLP/FedAvg/seed4",
                                                    "MNIST-MLP/FG-EDC/seed4"]
  rows = {(r["row"], r["column"], r["seeds"]): r["mean"]
          for r in _sweep.load_recorded("fedgroup_table3")}
  assert rows == {("MNIST-MLP", "FedAvg", "4"): "0.750000", ("MNIST-MLP", "FG-EDC", "4"): "0.500000"}
  assert "| FG-EDC | 50.0 | 97.9 | 1.250 |" in (recorded / "t3.md").read_text()
  ran.clear()
  fedgroup_table3.main(base + ["--columns=FedAvg,FG-EDC,FeSEM", "--table_only"])
  fedgroup_table3.main(base + ["--columns=FeSEM", "--dry_run"])
  assert ran == [] and "MNIST-MLP/FeSEM/seed4: --algo=fesem --task=mnist" in capsys.readouterr().out
  assert "FeSEM" not in (recorded / "t3.md").read_text()  # (not run: not in the table)


def test_fedgroup_table3_prints_diverged_runs_as_diverged(tmp_path, monkeypatch):
  """A run the divergence guard stopped is no accuracy: its cell says where it
  stopped, its recorded row has no score, and every row keeps its loss ratio."""
  import argparse
  import fedgroup_table3 as t3
  saved = {}
  monkeypatch.setattr(t3, "save_recorded", lambda name, rows, key, fields: saved.update(
      name=name, rows=rows, fields=fields))
  fine = dict(completed=True, max_test_accuracy=0.81, mean_round_seconds=1.25,
              max_loss_ratio=0.93)
  stopped = dict(completed=False, reason="diverged", diverged_round=7, max_test_accuracy=0.19,
                 mean_round_seconds=1.5, max_loss_ratio=4.2e30)
  results = {("MNIST-MLP", "FedAvg", 0): (fine, str(tmp_path)),
             ("MNIST-MLP", "FedAvg", 1): (stopped, str(tmp_path)),
             ("MNIST-MLP", "FedProx", 0): (fine, str(tmp_path))}
  args = argparse.Namespace(table=str(tmp_path / "t3"), runner="local", rounds=None, record=True)
  t3.write_table(results, [dict(row="MNIST-MLP")], [0, 1], args)
  table = (tmp_path / "t3.md").read_text()
  assert "| FedAvg | diverged at round 7 (1/2 seeds) |" in table
  assert "| FedProx | 81.0 |" in table
  assert "0.19" not in table and "19.0" not in table
  rows = {(r["column"], r["seeds"]): r for r in saved["rows"]}
  assert rows[("FedAvg", "1")]["mean"] == "" and rows[("FedAvg", "1")]["diverged_round"] == 7
  assert rows[("FedAvg", "1")]["max_loss_ratio"] == "4.2e+30"
  assert rows[("FedAvg", "0")]["mean"] == "0.810000" and rows[("FedAvg", "0")]["diverged_round"] == ""
  assert {"max_loss_ratio", "diverged_round"} <= set(saved["fields"])


def test_fedgroup_table3_names_rounds_other_than_the_tasks_T(tmp_path, monkeypatch):
  """A row whose runs trained fewer rounds than the task's T (`--rounds`) says
  so in its label and in the recorded note; a row at T adds nothing."""
  import argparse
  import fedgroup_table3 as t3
  saved = {}
  monkeypatch.setattr(t3, "save_recorded", lambda name, rows, key, fields: saved.update(rows=rows))
  args = _fedgroup_args(mnist_models="mlp", femnist_models="mlp")
  sent140, = t3.rows_for(["sent140"], args)
  mnist, = t3.rows_for(["mnist"], args)
  results = {}
  for row, rounds in ((sent140, 300), (mnist, t3.default_rounds(mnist))):
    d = tmp_path / row["row"]
    d.mkdir()
    (d / "config.json").write_text(json.dumps(dict(rounds=rounds, num_clients_loaded=124)))
    results[(row["row"], "FedAvg", 0)] = (dict(completed=True, max_test_accuracy=0.7,
                                               mean_round_seconds=3.2139), str(d))
  assert t3.default_rounds(sent140) == 800
  args = argparse.Namespace(table=str(tmp_path / "t3"), runner="local", rounds=300, record=True)
  t3.write_table(results, [sent140, mnist], [0], args)
  table = (tmp_path / "t3.md").read_text()
  assert ("**Sent140-LSTM** (not comparable: 124 users of a partial corpus, 50-d GloVe; the "
          "paper: 772 users, 300-d GloVe; 300 rounds, not the task's T = 800)") in table
  assert "**MNIST-MLP**\n" in table
  assert "| FedAvg | 70.0 | 72.2 | 3.213 |" in table  # seconds cut, as in the CSV
  assert {r["seconds_per_round"] for r in saved["rows"]} == {"3.213"}
  notes = {r["row"]: r["note"] for r in saved["rows"]}
  assert notes["Sent140-LSTM"].endswith("300 rounds, not the task's T = 800)")
  assert notes["MNIST-MLP"] == ""


def test_seconds_per_round_is_the_median_round(tmp_path):
  """A run paused for an hour has one long round; the tables' median ignores it."""
  with open(tmp_path / "metrics.csv", "w") as f:
    f.write("round,train_loss,round_seconds\n")
    for r, seconds in enumerate((0.5, 0.75, 3600.0, 0.25, 0.5)):
      f.write(f"{r + 1},0.1,{seconds}\n")
  assert _sweep.median_round_seconds(str(tmp_path)) == 0.5
  with open(tmp_path / "metrics.jsonl", "w") as f:  # read first where a run wrote it
    for seconds in (2.0, 1.0, 900.0):
      f.write(json.dumps({"round": 1, "round_seconds": seconds}) + "\n")
  assert _sweep.median_round_seconds(str(tmp_path)) == 2.0
  assert _sweep.median_round_seconds(str(tmp_path / "gone"), 0.3) == 0.3
  assert _sweep.median_round_seconds(str(tmp_path / "gone")) != 0.3  # NaN: none measured


def test_gpu_hlo_round_grouped_cnn_prototype_equals_the_sequential_round():
  """The side-by-side CNN prototype (grouped convolutions, batched dense
  products, no per-client loop) trains each client as the local runner's
  sequential round does: same batches, same rule; dropout off so both draw
  nothing at random. Compared as the round's summed update."""
  import argparse

  import numpy as np
  import tensorflow as tf

  import gpu_hlo_round
  from tests.conftest import SHARED_DATA
  femnist = SHARED_DATA / "femnist_leaf"
  if not femnist.is_dir():
    pytest.skip(f"needs the LEAF FEMNIST sample at {femnist}")
  from tff_cluster import registry
  from tff_cluster.host import loop
  from tff_cluster.learning import schedule
  args = argparse.Namespace(
      task="femnist", model="cnn_dropout", no_dropout=True, data_dir=str(femnist), seed=0,
      lr=0.1)
  task, data = gpu_hlo_round._load(args)
  config = TrainingConfig(rounds=1, clients_per_round=2, local_epochs=1,
                                     batch_size=20, client_lr=0.1, seed=0,
                                     runner=RunnerConfig("local", jit="off",
                                                         client_batching="sequential"))
  driver = registry.build_driver("fedavg", task, data, config)
  driver.setup()
  start = driver.model_weights()
  sampled = np.array([3, 17])
  out = driver.train_clients("train", driver.state, sampled, 1)
  sizes = data.num_train_samples()
  offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
  work = schedule.LocalWork(batch_size=20, epochs=1)
  steps = max(work.num_steps(int(n)) for n in sizes)
  batches = schedule.stacked_padded_batches(
      sizes[sampled], offsets[sampled], work,
      [schedule.client_seed(0, 1, int(k)) for k in sampled], steps)
  x = np.concatenate([data.train[c][0] for c in data.client_ids])
  y = np.concatenate([data.train[c][1] for c in data.client_ids])
  # Compiled as the export compiles it: outside XLA, TF's CPU kernel for a
  # grouped convolution's filter gradient (Conv2DBackpropFilter) refuses groups.
  update, weight, loss_sum, _, n = tf.function(
      gpu_hlo_round.grouped_round, jit_compile=True, autograph=False)(
      start, x, y, batches.indices, batches.sizes, batches.num_steps, np.float32(0.1),
      np.int32(0), False)
  assert float(weight) == float(out.summed["weight"]) == float(sizes[sampled].sum())
  np.testing.assert_allclose(float(loss_sum), float(out.summed["loss_sum"]), rtol=1e-4)
  # Another summation order (grouped against per-client convolutions) can
  # move a ReLU unit across zero in 17 steps at lr 0.1, so one filter may part
  # a little: each weight is compared by the norm of its difference (a wrong
  # grouping or transposition differs by O(1)).
  for got, want in zip(update, out.summed["update"]):
    assert np.linalg.norm(want) > 0
    assert np.linalg.norm(got.numpy() - want) <= 1e-2 * np.linalg.norm(want)


def test_clustered_catalogue_rounds_are_where_fedavg_stays_within_a_point(tmp_path):
  """The cut's rounds: the first evaluated round from which the test accuracy
  stays within 0.01 of the final one (a later dip past it moves the round)."""
  def write(accuracies):
    with open(tmp_path / "metrics.csv", "w") as f:
      f.write("round,train_loss,test_accuracy\n")
      for r, a in enumerate(accuracies):
        f.write(f"{r + 1},0.1,{'' if a is None else a}\n")
  write([0.5, 0.80, 0.895, None, 0.91, 0.90])
  assert clustered_catalogue.one_point_round(str(tmp_path)) == 3
  write([0.5, 0.80, 0.895, 0.85, 0.91, 0.90])
  assert clustered_catalogue.one_point_round(str(tmp_path)) == 5


def _table_cells(table):
  """{(algo, the table's task, seed): cell} of every cell of a table's sweep
  files (loading them runs every cell through the CLI's checks)."""
  from tff_cluster.sweep import spec
  return {(c.algo, p.label_of(c), c.seed): c for p in table.PARTS
          for c in spec.from_dict(p.data, source=p.stem).cells}


@pytest.mark.parametrize("table", [clustered_catalogue, personalized_baselines])
def test_every_recorded_row_is_a_cell_of_the_sweep_files(table):
  """Each row of benchmarks/recorded/<table>.csv is a cell of the table's
  sweep files (benchmarks/sweeps/<table>*.toml), run for the rounds the row
  records: the recorded table is the files' grid."""
  cells = _table_cells(table)
  rows = _sweep.load_recorded(table.NAME)
  assert rows
  for row in rows:
    key = (row["algo"], row["task"], int(row["seed"]))
    assert key in cells, key
    assert int(row["rounds"]) == dict(cells[key].flags)["rounds"], key


def _file_cells(part):
  from tff_cluster.sweep import spec
  return spec.from_dict(part.data, source=part.stem).cells


def test_every_recorded_paper_table_row_is_a_cell_of_its_sweep_files():
  """Each row of the CFL-MGD, WeCFL and pFedMo tables' recorded CSVs is a
  cell of the table's sweep files (method and setting by the row's names),
  and their phases / plans run only those files' cells."""
  cfl = {(c.method, c.seed) for c in _file_cells(cflmgd_table2.PART)}
  rows = _sweep.load_recorded("cflmgd_table2")
  assert rows and all((cflmgd_table2.METHODS[r["method"]], int(r["seed"])) in cfl
                      for r in rows)
  wecfl = {(c.setting, c.method, c.seed) for p in (wecfl_table2.PART, wecfl_table2.TEST_LOSS)
           for c in _file_cells(p)}
  rows = _sweep.load_recorded("wecfl_table2")
  assert rows
  for r in rows:
    key = (r["setting"], wecfl_table2.method_name(r["method"], int(r["K"])), int(r["seed"]))
    assert key in wecfl, key
  pfedmo = {(c.setting, c.method, c.seed) for c in _file_cells(pfedmo_table2.PART)}
  rows = _sweep.load_recorded("pfedmo_table2")
  assert rows and all((r["setting"], pfedmo_table2.METHODS[r["method"]], int(r["seed"])) in pfedmo
                      for r in rows)
  # The default plans are the files' grids: the phases (WeCFL), the two
  # plans (CFL-MGD), every setting and method (pFedMo).
  from tff_cluster.sweep import spec
  cells = lambda data: {(c.setting, c.method, c.seed, c.flags)  # noqa: E731
                        for c in spec.from_dict(data).cells}
  assert set().union(*map(cells, wecfl_table2.phases([0, 1, 2]).values())) == \
      cells(wecfl_table2.PART.data)
  assert cells(cflmgd_table2.plan([0, 1, 2])) | cells(cflmgd_table2.plan([0, 1, 2], "controls")) \
      == cells(cflmgd_table2.PART.data)
  assert cells(pfedmo_table2.plan(pfedmo_table2.SETTINGS, pfedmo_table2.METHODS, [0, 1, 2])) \
      == cells(pfedmo_table2.PART.data)


def test_every_recorded_fedgroup_row_is_a_cell_of_its_sweep_files():
  """Each row of benchmarks/recorded/fedgroup_table3.csv is a cell of the
  table's sweep files (row and column by their settings and methods), each
  seed of a row re-entered over seeds ("0,1,2") one cell."""
  t3 = fedgroup_table3
  cells = {(c.setting, c.method, c.seed): c
           for p in (t3.PART, t3.ABLATION_PART, t3.TEST_LOSS) for c in _file_cells(p)}
  rows = _sweep.load_recorded(t3.NAME)
  assert rows
  for row in rows:
    for seed in row["seeds"].split(","):
      key = (t3.ROWS[row["row"]], {v: k for k, v in t3.COLUMN_OF.items()}[row["column"]],
             int(seed))
      assert key in cells, key
  # The "IFCA (test loss)" file holds only the recorded rows' cells.
  test_loss = {(c.setting, c.seed) for c in _file_cells(t3.TEST_LOSS)}
  assert test_loss == {(t3.ROWS[r["row"]], int(s)) for r in rows
                       if r["column"] == "IFCA (test loss)" for s in r["seeds"].split(",")}


def test_paper_tables_run_their_cells_through_the_sweep(recorded, monkeypatch):
  """The CFL-MGD, WeCFL and pFedMo scripts run their plans' cells with the
  sweep (no process here: a cell's start is faked) into OUT/SETTING/METHOD/seedS."""
  from tff_cluster.sweep import cells
  ran = []
  monkeypatch.setattr(cells, "start", lambda d, argv: ran.append(d) or cells.Outcome(cells.DONE))
  out = recorded / "runs"
  cflmgd_table2.main([f"--out={out}/c", f"--table={recorded}/t", "--seeds=4",
                      "--methods=IFCA,CFL-MGD I"])
  wecfl_table2.main([f"--out={out}/w", f"--table={recorded}/t", "--seeds=4", "--phases=2,3",
                     "--methods=WeCFL"])
  pfedmo_table2.main([f"--out={out}/p", f"--table={recorded}/t", "--seeds=4",
                      "--settings=label3", "--methods=FedNAG"])
  assert [os.path.relpath(d, out) for d in ran] == [
      "c/rotated_mnist/CFL-MGD_I/seed4", "c/rotated_mnist/IFCA/seed4",
      "w/class/WeCFL_K10/seed4", "w/dir/WeCFL_K5/seed4", "p/label3/FedNAG/seed4"]


def test_every_recorded_paper_row_is_a_cell_of_its_sweep_file():
  from tff_cluster.sweep import spec
  papers = clustered_catalogue.PAPERS
  cells = {(c.algo, c.seed): c for c in spec.from_dict(papers.data, source=papers.stem).cells}
  rows = _sweep.load_recorded("clustered_catalogue_papers")
  assert rows
  for row in rows:
    cell = cells[clustered_catalogue.PAPER_ROWS[row["row"]][0], int(row["seed"])]
    assert int(row["rounds"]) == dict(cell.flags)["rounds"] and cell.task == "femnist"


def test_every_sweep_file_of_the_tables_loads(monkeypatch):
  """Every file under benchmarks/sweeps passes the sweep command's checks
  (each cell through the CLI's), run from the repository root as the files
  say, and the table scripts read every one of them."""
  from tff_cluster.sweep import spec
  monkeypatch.chdir(REPO_ROOT)
  folder = os.path.join("benchmarks", "sweeps")
  files = sorted(f for f in os.listdir(folder) if f.endswith(".toml"))
  read = {f"{p.stem}.toml" for t in (clustered_catalogue, personalized_baselines)
          for p in t.PARTS} | {f"{p.stem}.toml" for p in (
              clustered_catalogue.PAPERS, cflmgd_table2.PART, wecfl_table2.PART,
              wecfl_table2.TEST_LOSS, pfedmo_table2.PART, fedgroup_table3.PART,
              fedgroup_table3.ABLATION_PART, fedgroup_table3.TEST_LOSS)} | {
                  os.path.basename(private_clustered.SWEEP)}
  assert read == set(files)
  for name in files:
    sweep = spec.load(os.path.join(folder, name))
    # (the recorded IFCA (test loss) rows: in the WeCFL table's folder, where it reads them)
    # (and the FedGroup table's ablation and IFCA (test loss) cells: in its folder)
    out = {"wecfl_table2_ifca_test_loss": "wecfl_table2",
           "fedgroup_table3_ablation": "fedgroup_table3",
           "fedgroup_table3_ifca_test_loss": "fedgroup_table3"}.get(name[:-5], name[:-5])
    assert sweep.cells and sweep.out == f"results/{out}", name
    for cell in sweep.cells:
      for flag, value in cell.flags:
        if flag in ("data_dir", "glove_path"):
          assert value.startswith("../shared/data/"), (name, flag, value)


def test_clustered_catalogue_gives_each_clustered_algorithm_the_true_clusters():
  from tff_cluster import registry
  k = {"synthetic_clusters": 5, "rotated_mnist": 4, "fmnist_clusterwise_dir": 10}
  cells = _table_cells(clustered_catalogue)
  assert len(cells) == 94  # 72, then CFL-GP's, pFedGraph's and FedPAC's 4 each, FedGWC's and HCFL+'s 5
  unclustered = ("fedavg", "stocfl", "pfedgraph", "fedpac")  # no K to give
  for (algo, task, seed), cell in cells.items():
    flags = dict(cell.flags)
    assert flags.get("num_groups") == (None if algo in unclustered else k[task])
    assert (flags.get("client_momentum") == 0.0) == bool(registry.ALGORITHMS[algo].own_momentum)
    assert seed in clustered_catalogue.TASKS[task]["seeds"]
    if algo == "fedsoft":  # K: the round's clients over the clusters
      assert flags["fedsoft_k"] == flags["clients_per_round"] // k[task]
  assert not [c for c in cells if c[1] == "fmnist_clusterwise_dir"
              and c[0] in ("fedem", "fedrc", "fedsoft")]
  assert not [c for c in cells if c[1] == "rotated_mnist"
              and c[0] in ("pfedgraph", "cflgp", "fedpac")]


def test_a_tables_overrides_edit_its_sweep_files_keys():
  """--seeds, --rounds and --clients_per_round replace the files' values
  everywhere they are written (FedSoft's K follows the clients per round);
  --tasks and --algos narrow the grid, in the order given; a cross-silo
  algorithm (pFedMo) still takes every client."""
  p = clustered_catalogue._cells.parser("x", clustered_catalogue.TASKS, clustered_catalogue.ALGOS,
                                        "x")
  args = p.parse_args(["--tasks=rotated_mnist,synthetic_clusters", "--algos=fedsoft,fedavg",
                       "--seeds=4", "--rounds=3", "--clients_per_round=8"])
  [(_, sweep)] = clustered_catalogue._cells.sweeps("t", clustered_catalogue.PARTS, args)
  got = [(c.task, c.algo, c.seed, dict(c.flags)["rounds"], dict(c.flags)["clients_per_round"],
          dict(c.flags).get("fedsoft_k")) for c in sweep.cells]
  assert got == [("rotated_mnist", "fedsoft", 4, 3, 8, 2), ("rotated_mnist", "fedavg", 4, 3, 8, None),
                 ("synthetic_clusters", "fedsoft", 4, 3, 8, 1),
                 ("synthetic_clusters", "fedavg", 4, 3, 8, None)]
  args = p.parse_args(["--tasks=mnist_workers,pfedme_mnist", "--algos=pfedmo,pfedme",
                       "--clients_per_round=4"])
  got = {(pt.label_of(c), c.algo, c.seed): dict(c.flags).get("clients_per_round")
         for pt, sweep in personalized_baselines._cells.sweeps("t", personalized_baselines.PARTS,
                                                              args) for c in sweep.cells}
  assert got == {**{("mnist_workers", a, s): 4 if a == "pfedme" else None
                    for a in ("pfedmo", "pfedme") for s in (0, 1, 2)},
                 **{("pfedme_mnist", "pfedme", s): 4 for s in (0, 1, 2)}}


def test_personalized_baselines_cells_are_settings_the_cli_accepts():
  """Every cell of the personalized table resolves (the CLI's checks, no
  TensorFlow): the right algorithms get K, and the own-solver ones take no
  task momentum."""
  from tff_cluster import experiment as run_experiment
  from tff_cluster import registry
  num_groups = {"mnist_workers": 4, "fmnist_clientwise_class": 5, "femnist": 5}
  clustered = ("fedgroup", "hypcluster", "flhc")
  cells = _table_cells(personalized_baselines)
  assert len(cells) == 103  # 95, then pFedGraph's and FedPAC's 4 each
  for (algo, task, seed), cell in cells.items():
    flags = cell.argv()
    run_experiment.FLAGS.unparse_flags()
    run_experiment.FLAGS(["run_experiment.py", *flags])
    settings = run_experiment.resolve_settings(run_experiment._flag_values())
    spec = personalized_baselines.TASKS[task]
    assert settings["algo"] == algo and settings["task"] == spec.get("task", task)
    assert seed in spec["seeds"]
    if registry.ALGORITHMS[algo].own_momentum:
      assert settings["client_momentum"] == 0.0, (task, algo)
    assert (dict(cell.flags).get("num_groups") == num_groups.get(task)) == (
        algo in clustered or task not in num_groups), (task, algo)
    if algo == "pfedme":  # the README's row for the setting's model
      want = ((0.05, 30.0) if task not in personalized_baselines.SETTINGS else
              (0.1, 15.0) if task == "pfedme_mnist" else (0.01, 20.0))
      assert (settings["pfedme_personal_lr"], settings["pfedme_lambda"]) == want, task
    if task in ("pfedme_mnist", "pfedme_synthetic"):  # each its README fine-tuned row
      mnist = task == "pfedme_mnist"
      want = {"fedavg": (0.02, 20, None), "pfedme": (0.01, 20, None),
              "perfedavg": (0.03 if mnist else 0.02, 40, 0.003 if mnist else 0.002)}[algo]
      got = (settings["client_lr"], settings["local_steps"],
             settings["perfedavg_beta"] if algo == "perfedavg" else None)
      assert got == want, (task, algo)
  # Each paper setting runs its own method and FedAvg, nothing else.
  for name in personalized_baselines.SETTINGS:
    kept = {a for a, t, _ in cells if t == name}
    assert kept == set(personalized_baselines.TASKS[name]["algos"]) and "fedavg" in kept, name
  run_experiment.FLAGS.unparse_flags()


def test_personalized_baselines_table_shows_the_spread_over_clients(recorded):
  """Mean ± std over seeds of every score, in percent, truncated; seconds
  beside FedAvg's."""
  base = dict(task="femnist", rounds=50, bytes_per_round=2_000_000)
  _sweep.save_recorded("personalized_baselines", [
      dict(base, algo="fedavg", seed=0, accuracy=0.5, accuracy_clientavg=0.5,
           accuracy_client_mean=0.4, accuracy_p10=0.1, accuracy_p50=0.45, accuracy_p90=0.8,
           seconds_per_round=0.5),
      dict(base, algo="ditto", seed=0, accuracy=0.7, accuracy_clientavg=0.69,
           accuracy_client_mean=0.6, accuracy_p10=0.3, accuracy_p50=0.65, accuracy_p90=0.9,
           seconds_per_round=1.0),
      dict(base, algo="ditto", seed=1, accuracy=0.8, accuracy_clientavg=0.79,
           accuracy_client_mean=0.7, accuracy_p10=0.4, accuracy_p50=0.75, accuracy_p90=0.95,
           seconds_per_round=1.5)],
      personalized_baselines.RECORD_KEY, personalized_baselines.RECORD_FIELDS)
  text = personalized_baselines.markdown()
  assert "| `fedavg` | 0 | 50.00 | 50.00 | 40.00 | 10.00 | 45.00 | 80.00 | 2.00 | 0.50 | 1.0 |" \
      in text
  assert ("| `ditto` | 0,1 | 75.00 ± 7.07 | 74.00 ± 7.07 | 65.00 ± 7.07 | 35.00 ± 7.07 "
          "| 70.00 ± 7.07 | 92.50 ± 3.53 | 2.00 | 1.25 | 2.5 |") in text
  # A seed the divergence guard stopped is named, not averaged in.
  scores = dict(accuracy=0.6, accuracy_clientavg=0.6, accuracy_client_mean=0.6,
                accuracy_p10=0.2, accuracy_p50=0.6, accuracy_p90=0.9)
  _sweep.save_recorded("personalized_baselines", [
      dict(base, algo="pfedmo", seed=0, **{k: "" for k in scores}, seconds_per_round=1.0,
           diverged_round=20),
      dict(base, algo="pfedmo", seed=1, **scores, seconds_per_round=1.0),
      dict(base, algo="apfl", seed=0, **{k: "" for k in scores}, seconds_per_round=1.0,
           diverged_round=7)],
      personalized_baselines.RECORD_KEY, personalized_baselines.RECORD_FIELDS)
  text = personalized_baselines.markdown()
  assert ("| `pfedmo` | 0,1 | 60.00 (diverged at round 20 (1/2 seeds)) | 60.00 | 60.00 | 20.00 "
          "| 60.00 | 90.00 |") in text
  assert "| `apfl` | 0 | diverged at round 7 (1/1 seeds) | – | – | – | – | – |" in text


def test_a_diverged_run_is_recorded_with_its_round_and_no_scores(tmp_path):
  d = str(tmp_path / "run")
  os.makedirs(d)
  with open(os.path.join(d, "summary.json"), "w") as f:
    json.dump({"completed": False, "reason": "diverged", "diverged_round": 20}, f)
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump({"rounds": 25}, f)
  with open(os.path.join(d, "metrics.csv"), "w") as f:
    f.write("round,bytes_down,bytes_up,round_seconds,test_accuracy\n"
            "18,10,20,1.0,0.5\n19,10,20,3.0,0.4\n")
  got = personalized_baselines.score(d)
  assert got["diverged_round"] == 20 and got["rounds"] == 25 and got["accuracy"] == ""
  assert got["bytes_per_round"] == 30


def _fake_cells(monkeypatch, tmp_path):
  """A cell's run makes a finished run directory (no process); score reads
  its accuracy."""
  from tff_cluster.sweep import cells
  ran = []

  def start(cell_dir, argv):
    done = cells.finished(cell_dir)
    if done is not None:  # reused, as the sweep reuses a finished run
      return done
    ran.append(cell_dir)
    _finished_run(cell_dir, 0.5, 1.0)
    return cells.Outcome(cells.DONE, ran=True)

  def score(directory):
    if not os.path.isdir(directory):
      return None
    return dict(rounds=25, accuracy=0.5, accuracy_clientavg=0.5, accuracy_client_mean=0.5,
                accuracy_p10=0.5, accuracy_p50=0.5, accuracy_p90=0.5, bytes_per_round=1,
                seconds_per_round=1.0)

  monkeypatch.setattr(cells, "start", start)
  monkeypatch.setattr(personalized_baselines, "score", score)
  return ran


def test_a_table_records_each_cell_as_it_finishes_and_skips_recorded_ones(
    recorded, monkeypatch):
  """With --record each finished cell is in the CSV before the next starts
  (a session's finished cells outlive its run directories); with
  --skip_recorded a recorded cell is not run."""
  from tff_cluster.sweep import cells
  ran = _fake_cells(monkeypatch, recorded)
  seen_before_run = []
  start = cells.start
  monkeypatch.setattr(cells, "start", lambda *a: (
      seen_before_run.append(sorted(personalized_baselines._cells.recorded_cells(
          personalized_baselines.NAME))), start(*a))[1])
  out = str(recorded / "runs")
  base = ["--tasks=mnist_workers", "--seeds=0", f"--out={out}", "--record"]
  personalized_baselines.main(base + ["--algos=fedavg,ditto"])
  assert [os.path.basename(os.path.dirname(d)) for d in ran] == ["fedavg", "ditto"]
  assert seen_before_run == [[], [("fedavg", "mnist_workers", 0)]]
  with open(os.path.join(out, "sweep.json")) as f:  # a sweep's folder
    assert len(json.load(f)["cells"]) == 2

  # A new session: no run directories; fedavg and ditto recorded, the three
  # cells left run (fedrep, fedper, apfl: --algos order), two at a time.
  ran.clear()
  os.rename(out, out + ".old")
  algos = "--algos=fedavg,ditto,fedrep,fedper,apfl"
  personalized_baselines.main(base + [algos, "--skip_recorded", "--parallel=2"])
  assert [os.path.basename(os.path.dirname(d)) for d in ran] == ["fedrep", "fedper", "apfl"]
  assert personalized_baselines._cells.recorded_cells(personalized_baselines.NAME) == {
      (a, "mnist_workers", 0) for a in ("fedavg", "ditto", "fedrep", "fedper", "apfl")}
  # Without --skip_recorded a recorded cell runs again.
  personalized_baselines.main(base + ["--algos=fedavg"])
  assert os.path.basename(os.path.dirname(ran[-1])) == "fedavg"
  # A cell whose folder holds a run with other flags is refused in one line.
  with pytest.raises(SystemExit, match="other flags"):
    personalized_baselines.main(base + ["--algos=fedavg", "--rounds=3"])


def test_two_processes_recording_at_once_keep_every_row(tmp_path):
  """Two table processes recording 200 rows each into one CSV at
  once: the lock keeps every row (without it, a read-merge-write of one drops
  the other's rows)."""
  go = os.path.join(tmp_path, "go")  # both start writing together
  code = ("import os, sys, time; sys.path.insert(0, sys.argv[1]); import _sweep; "
          "_sweep.RECORDED = sys.argv[2]; first = int(sys.argv[3]); "
          f"[time.sleep(0.01) for _ in iter(lambda: os.path.exists({go!r}), True)]; "
          "[_sweep.save_recorded('t', [dict(k=i)], ('k',), ('k',)) "
          "for i in range(first, first + 200)]")
  procs = [subprocess.Popen([sys.executable, "-c", code, os.path.join(REPO_ROOT, "benchmarks"),
                             str(tmp_path), str(first)]) for first in (0, 1000)]
  time.sleep(2)
  open(go, "w").close()
  assert [p.wait() for p in procs] == [0, 0]
  with open(os.path.join(tmp_path, "t.csv"), newline="") as f:
    keys = {int(r["k"]) for r in csv.DictReader(f)}
  assert keys == set(range(200)) | set(range(1000, 1200))


def test_xla_compile_growth_slope_and_its_settings():
  """The per-function growth is a least-squares slope; too few readings or an
  unknown mode are refused in one line (no TensorFlow imported)."""
  assert xla_compile_growth.slope([(0, 1.0), (10, 6.0), (20, 11.0)]) == pytest.approx(0.5)
  assert xla_compile_growth.slope([(0, 2.0), (10, 2.0), (20, 2.0)]) == 0.0
  with pytest.raises(SystemExit):
    xla_compile_growth.main(["--functions=10", "--every=10"])
  with pytest.raises(SystemExit):
    xla_compile_growth.main(["--functions=100", "--every=10", "--modes=jit"])
