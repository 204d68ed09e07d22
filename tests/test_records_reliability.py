"""Nothing lost, nothing run from data: --overwrite, a full disk, checkpoint
size and damaged checkpoints."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import zipfile

import numpy as np
import pytest

from tff_cluster import experiment as run_experiment
from tff_cluster import tasks
from tests.helpers import SMALL_ARGS, main_in_process, read_metrics_csv
from tff_cluster import registry
from tff_cluster.io import checkpoint
from tff_cluster.host import loop
from tff_cluster.host.driver import TrainingConfig
from tff_cluster.io import results
from tff_cluster.io.results import ResultsWriter
from tff_cluster.spec.task import DataOptions

TIMING = ("round_seconds", "eval_seconds")
# The CLI's one line for a failed write (`run_experiment._main`).
CLI_MAPS_WRITE_FAILED = "WriteFailed" in open(run_experiment.__file__).read()


def _without_timing(rows):
  return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def _tree(path):
  """Every file under `path` with its bytes."""
  out = {}
  for root, _, files in os.walk(path):
    for name in files:
      full = os.path.join(root, name)
      with open(full, "rb") as f:
        out[os.path.relpath(full, path)] = f.read()
  return out


def _temporaries(path):
  return [os.path.join(root, n) for root, dirs, files in os.walk(path)
          for n in dirs + files if ".tmp" in n]


# ---------------------------------------------------------------------------
# --overwrite removes only what a run wrote.


def _fake_run(path):
  """A previous run's directory, as the writer and checkpoints leave it."""
  writer = ResultsWriter(str(path), ["round", "train_loss"], tensorboard=False)
  writer.write_config({"algo": "fedavg", "task": "synthetic", "seed": 0, "rounds": 2})
  writer.write_round({"round": 1, "train_loss": 0.5})
  writer.write_summary({"completed": True})
  writer.close()
  checkpoint.save(str(path), 1, {"rows": []}, client_states={0: np.ones(2)})
  os.makedirs(path / "models" / "final")
  (path / "models" / "final" / "model_0.npz").write_bytes(b"x")
  (path / "models" / "final" / "clients.json").write_text("{}")
  (path / "eval_synthetic.json").write_text("{}")
  (path / "metrics.csv.tmp-12345").write_bytes(b"")  # a kill's leftover


def test_overwrite_refuses_a_users_files_and_changes_nothing(tmp_path, capsys):
  user = tmp_path / "user"
  (user / "models").mkdir(parents=True)
  (user / "checkpoints").mkdir()
  (user / "models" / "my_model.h5").write_bytes(b"weights")
  (user / "checkpoints" / "ckpt.txt").write_text("mine")
  (user / "notes.txt").write_text("notes")
  before = _tree(user)
  code, _, err = main_in_process([*SMALL_ARGS, "--rounds=1", f"--output_dir={user}",
                                  "--overwrite"], capsys)
  lines = [l for l in err.splitlines() if l.strip()]
  assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
  assert "which no run wrote" in lines[0] and "nothing was changed" in lines[0]
  assert _tree(user) == before
  # Without --overwrite the error says what --overwrite would do.
  code, _, err = main_in_process([*SMALL_ARGS, "--rounds=1", f"--output_dir={user}"], capsys)
  assert code == 2 and "replaces only a previous run's own files" in err, err
  assert _tree(user) == before


def test_overwrite_replaces_a_previous_run_unless_it_holds_anything_else(tmp_path):
  run = tmp_path / "run"
  _fake_run(run)
  # A user's file anywhere in it: refused, nothing removed.
  for extra in ("notes.txt", "models/final/mine.h5", "checkpoints/ckpt.txt",
                "checkpoints/round-000001.clients/extra.bin"):
    (run / extra).write_text("mine")
    before = _tree(run)
    with pytest.raises(results.OutputDirError, match="which no run wrote"):
      ResultsWriter(str(run), ["round"], overwrite=True, tensorboard=False)
    assert _tree(run) == before
    assert extra in results.foreign_entries(str(run))
    (run / extra).unlink()
  # Without a run's config.json nothing in it is a run's.
  (run / "config.json").write_text('{"algo": "fedavg"}')
  with pytest.raises(results.OutputDirError, match="which no run wrote"):
    results.check_output_dir(str(run), overwrite=True)
  (run / "config.json").write_text(json.dumps(
      {"algo": "fedavg", "task": "synthetic", "seed": 0, "rounds": 2}))
  assert results.foreign_entries(str(run)) == []
  writer = ResultsWriter(str(run), ["round"], overwrite=True, tensorboard=False)
  writer.close()
  assert sorted(os.listdir(run)) == ["metrics.csv", "metrics.jsonl"]


# ---------------------------------------------------------------------------
# A full disk: one line, nothing half-written, the last checkpoint resumable.


@pytest.fixture(scope="module")
def small():
  task = tasks.get_task("synthetic_clusters")
  data = task.load_data(DataOptions(seed=3, num_clients=12, extra={"num_clusters": 2}))
  return task, data


def _train(task, data, run_dir, rounds=4, resume=None, algo="fedavg"):
  config = TrainingConfig(rounds=rounds, clients_per_round=4, local_epochs=1,
                                     batch_size=10, client_lr=0.02, seed=4,
                                     client_momentum=0.5, client_state="persist",
                                     eval_every=2)
  driver = registry.build_driver(algo, task, data, config)
  writer = ResultsWriter(str(run_dir), [*loop.BASE_COLUMNS, *driver.extra_columns],
                         overwrite=True, tensorboard=False,
                         resume_rows=None if resume is None else resume["rows"])
  try:
    return loop.run_training(task, data, config, driver, writer, progress=False,
                                   checkpoint_dir=str(run_dir), checkpoint_every=2,
                                   resume=resume)
  finally:
    writer.close()


@pytest.fixture(scope="module")
def whole(small, tmp_path_factory):
  """The uninterrupted run (4 rounds, checkpoints at 0, 2, 4): its directory
  and summary."""
  run = tmp_path_factory.mktemp("whole") / "run"
  summary = _train(*small, run)
  return run, summary


def _copy(run, tmp_path):
  shutil.copytree(run, tmp_path / "run")
  return tmp_path / "run"


class _Disk:
  """A disk that fills up: a 2 MB tmpfs filled by a file where this process
  may mount one, else `os.fsync` failing with ENOSPC (every write of the
  records and checkpoints ends in one)."""

  def __init__(self, path, monkeypatch):
    self.root = path
    self.path = str(path)
    os.makedirs(self.path)
    self.monkeypatch = monkeypatch
    self.mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", self.path],
        capture_output=True).returncode == 0
    self.filler = os.path.join(self.path, "filler")

  def fill(self):
    if self.mounted:
      with open(self.filler, "wb", buffering=0) as f:
        try:
          while f.write(b"\0" * 4096):
            pass
        except OSError:
          pass
    else:
      def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
      self.monkeypatch.setattr(os, "fsync", fsync)

  def free(self):
    if self.mounted:
      os.remove(self.filler)
    else:
      self.monkeypatch.undo()

  def close(self):
    if self.mounted:
      subprocess.run(["umount", "-l", self.path], capture_output=True)


@pytest.fixture
def disk(tmp_path, monkeypatch):
  d = _Disk(tmp_path / "disk", monkeypatch)
  yield d
  d.close()


def test_a_full_disk_stops_the_run_cleanly_and_the_last_checkpoint_resumes(
    small, whole, disk, monkeypatch):
  task, data = small
  whole, whole_summary = whole
  run = disk.root / "run"
  write_round = ResultsWriter.write_round

  def write_round_then_fill(self, row):
    write_round(self, row)
    if row["round"] == 3:
      disk.fill()  # full from round 3's groups line on: the checkpoint of 2 is the last

  monkeypatch.setattr(ResultsWriter, "write_round", write_round_then_fill)
  with pytest.raises(OSError) as failed:
    _train(task, data, run)
  message = str(failed.value)
  assert "\n" not in message and message.startswith("could not write ")
  assert "No space left on device" in message
  assert str(run) in message
  monkeypatch.setattr(ResultsWriter, "write_round", write_round)
  assert _temporaries(disk.path) == []
  assert isinstance(failed.value, checkpoint.WriteFailed)
  assert checkpoint.rounds(str(run)) == [0, 2]
  disk.free()
  summary = json.loads((run / "summary.json").read_text())
  assert summary["completed"] is False and summary["checkpoint_round"] == 2
  if disk.mounted:  # summary.json could not be written: the checkpoint's says running
    assert summary["reason"] in ("running", "error")
  found = checkpoint.load_latest(str(run))
  assert found[0] == 2
  resumed = _train(task, data, run, resume=found[1])
  assert resumed["completed"] is True
  assert _without_timing(read_metrics_csv(run / "metrics.csv")) == \
      _without_timing(read_metrics_csv(whole / "metrics.csv"))
  for key in ("final_test_accuracy", "max_test_accuracy", "max_round", "rounds_completed"):
    assert resumed[key] == whole_summary[key]


def test_a_write_that_fails_says_so_in_summary_json_and_leaves_no_temporary(
    small, tmp_path, monkeypatch):
  """A failing checkpoint write (an OSError raised by the write itself) with
  space left for summary.json: the run stops, summary.json says error and why."""
  task, data = small
  run = tmp_path / "run"
  opened = open

  def failing_open(path, mode="r", *args, **kwargs):
    if "round-000004" in str(path) and "w" in mode:
      f = opened(path, mode, *args, **kwargs)
      f.write(b"partial")
      f.close()
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return opened(path, mode, *args, **kwargs)

  monkeypatch.setattr("builtins.open", failing_open)
  with pytest.raises(OSError, match="round-000004.*No space left on device"):
    _train(task, data, run)
  monkeypatch.undo()
  summary = json.loads((run / "summary.json").read_text())
  assert summary["reason"] == "error" and "round-000004" in summary["error"]
  assert summary["checkpoint_round"] == 2
  assert _temporaries(str(run)) == []
  assert checkpoint.rounds(str(run)) == [0, 2]
  assert not os.path.exists(checkpoint.clients_dir(str(run), 4))


def test_temporary_files_of_a_killed_run_are_removed_at_resume(tmp_path):
  run = tmp_path / "run"
  _fake_run(run)
  left = [run / "summary.json.tmp-999", run / "checkpoints" / "round-000004.npz.tmp-999",
          run / "models" / "final" / "model_0.tmp.keras"]
  for path in left:
    path.write_bytes(b"half")
  (run / "checkpoints" / "round-000004.clients.tmp-999").mkdir()
  found = checkpoint.load_latest(str(run))
  ResultsWriter(str(run), ["round"], tensorboard=False, resume_rows=found[1]["rows"]).close()
  assert _temporaries(str(run)) == []
  assert checkpoint.rounds(str(run)) == [1]


@pytest.mark.skipif(not CLI_MAPS_WRITE_FAILED,
                    reason="run_experiment.py does not map checkpoint.WriteFailed to one line yet")
def test_the_cli_says_a_full_disk_in_one_line(disk, capsys):
  if not disk.mounted:
    pytest.skip("mount -t tmpfs is not allowed here (needs root)")
  disk.fill()
  out = os.path.join(disk.path, "run")
  code, _, err = main_in_process([*SMALL_ARGS, "--rounds=2", f"--output_dir={out}"], capsys)
  lines = [l for l in err.splitlines() if l.strip() and not l.startswith("warning:")]
  assert code == 5 and "Traceback" not in err, err
  assert len(lines) == 1 and "No space left on device" in lines[0], err
  assert _temporaries(disk.path) == []
  assert not os.path.exists(out) or os.listdir(out) == []


# ---------------------------------------------------------------------------
# Checkpoints do not carry the rows; damaged ones fall back, with one line.


def test_checkpoints_name_the_rows_on_disk_instead_of_holding_them(whole, tmp_path, capsys):
  run = _copy(whole[0], tmp_path)
  payload = checkpoint.loads(checkpoint.path_of(str(run), 4))
  assert "rows" not in payload and payload["rows_file"]["count"] == 4
  early = checkpoint.loads(checkpoint.path_of(str(run), 2))
  assert len(checkpoint.dumps({"rows_file": early["rows_file"]})) == \
      len(checkpoint.dumps({"rows_file": payload["rows_file"]}))
  rows = checkpoint.load_latest(str(run))[1]["rows"]
  assert [r["round"] for r in rows] == [1, 2, 3, 4]
  assert json.loads((run / "metrics.jsonl").read_text().splitlines()[3]) == rows[3]
  # A row changed on disk after the checkpoint of round 2: that one is used.
  lines = (run / "metrics.csv").read_text().splitlines(keepends=True)
  lines[4] = lines[4].replace(",", ",9", 1)
  (run / "metrics.csv").write_text("".join(lines))
  capsys.readouterr()
  assert checkpoint.load_latest(str(run))[0] == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "metrics.csv" in err[0] and "round 2" in err[0]


def _flip_last_data_byte(path, entry=None):
  """Flips the last byte of an entry's data (the largest by default)."""
  with zipfile.ZipFile(path) as archive:
    infos = archive.infolist()
    info = (max(infos, key=lambda i: i.file_size) if entry is None
            else archive.getinfo(entry))
  with open(path, "r+b") as f:
    f.seek(info.header_offset + 26)
    name_len, extra_len = np.frombuffer(f.read(4), "<u2")
    at = info.header_offset + 30 + int(name_len) + int(extra_len) + info.file_size - 1
    f.seek(at)
    byte = f.read(1)
    f.seek(at)
    f.write(bytes([byte[0] ^ 0xFF]))
  return info.filename


@pytest.mark.parametrize("where", ["part", "archive"])
def test_a_damaged_checkpoint_falls_back_with_one_warning(small, whole, tmp_path, capsys,
                                                          where):
  task, data = small
  run = _copy(whole[0], tmp_path)
  if where == "part":
    damaged = os.path.join(checkpoint.clients_dir(str(run), 4), "part-000000.npz")
  else:
    damaged = checkpoint.path_of(str(run), 4)
  _flip_last_data_byte(damaged)
  capsys.readouterr()
  round_num, payload = checkpoint.load_latest(str(run))
  err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
  assert round_num == 2
  assert len(err) == 1 and err[0].startswith("warning: ") and "CRC" in err[0], err
  assert os.path.relpath(damaged, run) in err[0] and "round 2" in err[0]
  # The run resumes from round 2 and ends as the uninterrupted one.
  _train(task, data, run, rounds=4, resume=payload)
  assert _without_timing(read_metrics_csv(run / "metrics.csv")) == \
      _without_timing(read_metrics_csv(whole[0] / "metrics.csv"))


def test_hand_edited_checkpoints_give_one_line(small, whole, tmp_path, capsys):
  task, data = small
  run = _copy(whole[0], tmp_path)
  path = checkpoint.path_of(str(run), 4)
  payload = checkpoint.loads(path)
  # Contents that are not a run state: skipped, one warning line.
  checkpoint.atomic_write_bytes(path, checkpoint.dumps({**payload, "driver": 5}))
  capsys.readouterr()
  assert checkpoint.load_latest(str(run))[0] == 2
  assert len(capsys.readouterr().err.strip().splitlines()) == 1
  # A driver state that reads but does not fit: one line, no traceback.
  payload["driver"] = {"state": {"nonsense": 1}}
  checkpoint.atomic_write_bytes(path, checkpoint.dumps(payload))
  found = checkpoint.load_latest(str(run))
  assert found[0] == 4
  with pytest.raises(checkpoint.CheckpointError) as failed:
    _train(task, data, run, rounds=6, resume=found[1])
  assert "\n" not in str(failed.value) and "does not fit this run" in str(failed.value)
