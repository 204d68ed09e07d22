"""What a user can be handed: a run folder, a data folder or a download from
someone else. Nothing in them runs, nothing of the user's outside a run's own
names is removed, every read is bounded, and each refusal is one line.

Runs on every stack (a STACK_SENSITIVE file, and in the keras2 phase): under
Keras 2 a whole-model load of a stranger's `.keras` file runs the Python its
`Lambda` layer stores.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tff_cluster import cli
from tff_cluster.io import checkpoint, results, rundir


def _run_config(path):
  path.mkdir(parents=True, exist_ok=True)
  (path / "config.json").write_text(json.dumps(
      {"algo": "fedavg", "task": "synthetic", "seed": 0, "rounds": 2}))


# ---------------------------------------------------------------------------
# A stranger's saved model


def _keras2():
  """Keras 2 (tf_keras, or the TFF stack's tf.keras), or None."""
  try:
    import tf_keras
    return tf_keras
  except ImportError:
    import keras  # the TFF stack's Keras 2.14 is tf.keras
    return None if keras.__version__.startswith("3") else keras


def test_a_saved_model_is_read_as_weights_only_and_no_stored_code_runs(tmp_path):
  """An HDF5 file named model_0.keras whose Lambda layer writes a file when
  loaded (what Keras 2's whole-model load runs): refused in one line, the
  file is never written. A zipped `.keras` of the task's model is read."""
  import tensorflow as tf
  from tff_cluster.host import loop
  from tff_cluster import models

  task = cli.TASKS["synthetic"]
  directory = tmp_path / "models" / "final"
  directory.mkdir(parents=True)
  marker = tmp_path / "payload-ran"
  keras2 = _keras2()
  if keras2 is not None:
    inputs = keras2.Input(shape=(60,))
    hidden = keras2.layers.Lambda(lambda x, p=str(marker): (open(p, "w").close(), x)[1])(inputs)
    payload = keras2.Model(inputs, keras2.layers.Dense(10)(hidden))
    payload.save(str(tmp_path / "payload.h5"))
    os.replace(tmp_path / "payload.h5", directory / "model_0.keras")
    marker.unlink()  # building the model called the Lambda once
  else:  # no Keras 2 here: any file that is not a Keras zip archive
    (directory / "model_0.keras").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 64)
  with pytest.raises(loop.WeightsMismatch, match=r"model_0\.keras is not a Keras zip "
                     r"archive .* refusing to read it"):
    loop.load_model_weights(task, str(directory), 0)
  assert not marker.exists()

  # A run's own zipped model_1.keras (no .npz): its weights, into the task's model.
  model = task.model_fn()
  weights = [np.full(w.shape, i + 0.5, np.float32)
             for i, w in enumerate(models.get_weights(model))]
  models.set_weights(model, weights)
  model.save(str(directory / "model_1.keras"))
  read = loop.load_model_weights(task, str(directory), 1)
  assert [w.tolist() for w in read] == [w.tolist() for w in weights]
  del tf


# ---------------------------------------------------------------------------
# --overwrite, --resume and the writability check remove and write only a run's own names


def test_overwrite_refuses_a_folder_of_files_named_like_temporaries(tmp_path):
  """A folder holding only `backup.tmp-2023/thesis.tex` (no config.json) is
  the user's: refused, nothing removed."""
  out = tmp_path / "out"
  (out / "backup.tmp-2023").mkdir(parents=True)
  (out / "backup.tmp-2023" / "thesis.tex").write_text("chapter 1")
  with pytest.raises(results.OutputDirError, match=r"holds backup\.tmp-2023/, which no run"):
    results.check_output_dir(str(out), overwrite=True)
  assert (out / "backup.tmp-2023" / "thesis.tex").read_text() == "chapter 1"


def test_clean_ups_remove_only_the_temporaries_a_run_writes(tmp_path):
  """Inside a run: `models/final/old.tmp-7/`, `checkpoints/keep.tmp-99/` and
  `archive.tmp-1/` are the user's (`--overwrite` refuses, a resume's clean-up
  keeps them); a killed write's `summary.json.tmp-9`,
  `checkpoints/round-000002.npz.tmp-9`, `.../round-000002.clients.tmp-9/` and
  `models/best/model_0.tmp.keras` are the run's and go."""
  run = tmp_path / "run"
  _run_config(run)
  users = [run / "models" / "final" / "old.tmp-7" / "a.txt",
           run / "checkpoints" / "keep.tmp-99" / "b.txt",
           run / "archive.tmp-1" / "results_2023.csv",
           run / "notes.tmp-3"]
  runs = [run / "summary.json.tmp-9", run / "checkpoints" / "round-000002.npz.tmp-9",
          run / "checkpoints" / "round-000002.clients.tmp-9" / "part-000000.npz",
          run / "models" / "best" / "model_0.tmp.keras",
          run / "models" / "best" / "clients.json.tmp-4"]
  for path in users + runs:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x")
  assert rundir.foreign_entries(str(run)) == [
      "archive.tmp-1/", "checkpoints/keep.tmp-99/", "models/final/old.tmp-7/", "notes.tmp-3"]
  with pytest.raises(results.OutputDirError, match="which no run wrote there"):
    results.check_output_dir(str(run), overwrite=True)
  removed = checkpoint.remove_temporary(str(run))  # what --resume does first
  assert sorted(removed) == sorted(
      str(p if "clients.tmp" not in str(p) else p.parent) for p in runs)
  assert all(p.read_text() == "x" for p in users)
  assert not any(p.exists() for p in runs)


def test_clean_up_follows_no_link(tmp_path):
  """`checkpoints` a link to a folder elsewhere: its temporaries-like names
  there stay, and --overwrite refuses the link."""
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  (elsewhere / "round-000001.npz.tmp-5").write_text("keep")
  run = tmp_path / "run"
  _run_config(run)
  os.symlink(elsewhere, run / "checkpoints")
  assert checkpoint.remove_temporary(str(run)) == []
  assert (elsewhere / "round-000001.npz.tmp-5").read_text() == "keep"
  assert rundir.foreign_entries(str(run)) == ["checkpoints"]


@pytest.mark.parametrize("with_run", [False, True])
def test_a_write_test_link_never_empties_the_file_it_points_to(tmp_path, with_run):
  """`.write-test` a link to a file outside: refused in one line (with or
  without a finished run in the folder) and the file keeps its bytes."""
  outside = tmp_path / "precious.txt"
  outside.write_text("41 bytes that must stay where they are....")
  out = tmp_path / "out"
  out.mkdir()
  if with_run:
    _run_config(out)
    (out / "metrics.csv").write_text("round\n1\n")
  os.symlink(outside, out / ".write-test")
  with pytest.raises(cli.UsageError, match=r"holds \.write-test, which no run wrote there"):
    cli.prepare_output_dir(str(out), overwrite=True, resume=False)
  assert outside.read_text() == "41 bytes that must stay where they are...."
  assert os.path.islink(out / ".write-test")
  # A killed run's own .write-test (a plain file) is no obstacle.
  os.remove(out / ".write-test")
  (out / ".write-test").write_text("")
  assert cli.prepare_output_dir(str(out), overwrite=True, resume=False) is False
  assert not os.path.lexists(out / ".write-test")


# ---------------------------------------------------------------------------
# One writer at a time


def test_a_second_writer_overwrite_and_resume_are_refused_while_a_run_writes(tmp_path, capsys):
  """A run's writer holds the folder's lock: a second writer, `--overwrite`
  and `--resume` of it each refuse in one line naming the holder; once the
  run closes, the lock file is gone. A lock a killed run left (its file, no
  holder) is taken over."""
  from tests.helpers import main_in_process
  from tff_cluster.io import lock
  run = tmp_path / "run"
  first = results.ResultsWriter(str(run), ["round"], tensorboard=False, figures=False)
  first.write_config({"algo": "fedavg", "task": "synthetic", "seed": 0, "rounds": 2})
  try:
    holder = f"pid {os.getpid()}"
    with pytest.raises(results.OutputDirError, match=f"is being written by another run "
                       f"\\({holder} on "):
      results.ResultsWriter(str(run), ["round"], overwrite=True, tensorboard=False,
                            figures=False)
    for flags in (["--overwrite"], ["--resume", "--rounds=3"]):
      code, _, err = main_in_process([*flags, f"--output_dir={run}", "--algo=fedavg",
                                      "--task=synthetic", "--rounds=2"], capsys)
      lines = [l for l in err.splitlines() if l.strip()]
      assert code == 2 and len(lines) == 1 and "being written by another run" in lines[0], err
    assert (run / "config.json").exists() and (run / "metrics.csv").exists()
  finally:
    first.close()
  assert not (run / lock.NAME).exists()
  # A killed run's lock file (no process holds it): taken over.
  (run / lock.NAME).write_text(json.dumps({"pid": 2 ** 22 + 7, "host": "elsewhere"}))
  again = results.ResultsWriter(str(run), ["round"], overwrite=True, tensorboard=False,
                                figures=False)
  assert lock.read(str(run / lock.NAME))["pid"] == os.getpid()
  again.close()


# ---------------------------------------------------------------------------
# --resume on other data


def _leaf_dir(path, writers):
  """A LEAF FEMNIST folder: one train and one test file per writer."""
  for split in ("train", "test"):
    (path / split).mkdir(parents=True, exist_ok=True)
  for w, label in writers.items():
    for split, n in (("train", 6), ("test", 2)):
      x = [[label / 100.0] * 784 for _ in range(n)]
      (path / split / f"all_data_{w}.json").write_text(json.dumps(
          {"users": [w], "num_samples": [n], "user_data": {w: {"x": x, "y": [label] * n}}}))


def test_resume_refuses_other_data_in_the_same_folder(tmp_path, capsys):
  """Half of --data_dir's files removed (the same path): the resume is
  refused in one line and the run's files are left as they were."""
  from tests.helpers import main_in_process
  data = tmp_path / "leaf"
  _leaf_dir(data, {f"w{i}": i for i in range(4)})
  run = tmp_path / "run"
  common = ["--algo=fedavg", "--task=femnist", "--model=mlp", f"--data_dir={data}",
            "--clients_per_round=2", "--batch_size=2", "--local_epochs=1",
            "--checkpoint_every=1", "--noprogress", f"--output_dir={run}"]
  code, _, err = main_in_process([*common, "--rounds=1"], capsys)
  assert code == 0, err
  config = json.loads((run / "config.json").read_text())
  assert len(config["data_fingerprint"]) == 16
  before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
  for split in ("train", "test"):
    for w in ("w2", "w3"):
      os.remove(data / split / f"all_data_{w}.json")
  code, _, err = main_in_process([*common, "--resume", "--rounds=2"], capsys)
  lines = [l for l in err.splitlines() if l.strip()]
  assert code == 2 and len(lines) == 1, err
  assert "--resume: the data differs from the run's (2 clients, 12 train and 4 test " \
         "samples now; the run had 4, 24, 8;" in lines[0], lines[0]
  assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


# ---------------------------------------------------------------------------
# Non-finite inputs


def test_nan_or_infinite_inputs_are_refused_wherever_they_enter(tmp_path):
  from tests.helpers import write_emnist_sqlite
  from tff_cluster.data import emnist, leaf
  from tff_cluster.data.federated import DataError, FederatedData
  x = np.ones((3, 2), np.float32)
  bad = x.copy()
  bad[1, 0] = np.nan
  y = np.zeros(3, np.int64)
  with pytest.raises(DataError, match=r"client 'b' test inputs hold 1 NaN or infinite "
                     r"value\(s\); valid: finite numbers"):
    FederatedData(["a", "b"], {"a": (x, y), "b": (x, y)}, {"a": (x, y), "b": (bad, y)}, 2)
  db = tmp_path / "emnist_all.sqlite"
  clients = {split: {"f0": [1, 2], "f1": [3, 4]} for split in
             ("all_train", "all_test", "digits_only_train", "digits_only_test")}
  write_emnist_sqlite(db, clients, pixel=lambda label, i: np.nan if label == 3 else 0.5)
  with pytest.raises(DataError, match="client 'f1' train inputs hold 784 NaN"):
    emnist.load_database(str(db))
  for value, what in (("nan", "nan"), ("1e39", "beyond float32")):
    glove = tmp_path / f"glove.{what}.txt"
    glove.write_text(f"the 0.1 0.2\ncat 0.3 {value}\n")
    with pytest.raises(DataError, match=r"line 2: the vector of 'cat' has NaN or infinite "
                       r"values \(or numbers beyond float32's 3.4e38\)"):
      leaf.load_glove(str(glove))


# ---------------------------------------------------------------------------
# Files that are not what they are named


def test_data_files_that_are_not_files_or_are_huge_are_refused_at_once(tmp_path):
  """A LEAF file that is a FIFO (whose read would block for ever), a link to
  /dev/zero (which never ends) or a 64 GiB sparse file: one line each, at
  once."""
  import threading
  from tff_cluster.data import leaf
  from tff_cluster.data.federated import DataError
  cases = {}
  fifo = tmp_path / "fifo" / "train" / "x.json"
  fifo.parent.mkdir(parents=True)
  os.mkfifo(fifo)
  cases[fifo] = "a FIFO, not a file"
  zero = tmp_path / "zero" / "train" / "x.json"
  zero.parent.mkdir(parents=True)
  os.symlink("/dev/zero", zero)
  cases[zero] = "a character device, not a file"
  sparse = tmp_path / "sparse" / "train" / "x.json"
  sparse.parent.mkdir(parents=True)
  with open(sparse, "wb") as f:
    f.truncate(64 << 30)
  cases[sparse] = f"{64 << 30:,} bytes, over the {leaf.LEAF_JSON_MAX_BYTES:,}"
  for path, needle in cases.items():
    outcome = {}

    def read(path=path, outcome=outcome):
      try:
        leaf.read_leaf_file(str(path))
      except DataError as e:
        outcome["error"] = str(e)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive(), f"reading {path} still blocks after 10 s"
    assert needle in outcome.get("error", ""), (path, outcome)


@pytest.mark.parametrize("statement,message", [
    ("UPDATE examples SET serialized_example_proto = 5 WHERE rowid = 1",
     "serialized_example_proto of type int; valid: text and a BLOB"),
    ("UPDATE client_metadata SET client_id = NULL WHERE rowid = 1",
     "a client_id of client_metadata is None, not text")])
def test_an_odd_emnist_database_is_one_line(statement, message, tmp_path):
  """An INTEGER where a serialized Example belongs, a NULL client_id."""
  import sqlite3
  from tests.helpers import write_emnist_sqlite
  from tff_cluster.data import emnist
  from tff_cluster.data.federated import DataError
  clients = {split: {"f0": [1, 2]} for split in
             ("all_train", "all_test", "digits_only_train", "digits_only_test")}
  db = tmp_path / "emnist.sqlite"
  write_emnist_sqlite(db, clients)
  con = sqlite3.connect(str(db))
  con.execute(statement)
  con.commit()
  con.close()
  with pytest.raises(DataError, match=message):
    emnist.load_database(str(db))


def _rewrite(payload: bytes, edit) -> bytes:
  """A checkpoint archive with `edit(entries)` applied (name -> bytes)."""
  import io
  import zipfile
  out = io.BytesIO()
  with zipfile.ZipFile(io.BytesIO(payload)) as src, zipfile.ZipFile(out, "w") as dst:
    entries = {n: src.read(n) for n in src.namelist()}
    for name, data in edit(entries).items():
      dst.writestr(name, data)
  return out.getvalue()


def _npy(array) -> bytes:
  import io
  buf = io.BytesIO()
  np.save(buf, array)
  return buf.getvalue()


def test_a_crafted_checkpoint_is_refused_and_calls_nothing(tmp_path):
  """A generator naming `seed` (numpy.random.seed would reseed the global
  generator), an array header claiming 10**12 elements, a tree nested
  100,000 deep: CheckpointError each, numpy's global state untouched; a
  resume takes such a file for a damaged checkpoint."""
  import io
  payload = checkpoint.dumps({"rng": np.random.default_rng(0), "w": np.ones(3, np.float32)})

  def tree_edit(fn):
    def edit(entries):
      tree = np.load(io.BytesIO(entries["__tree__.npy"])).tobytes().decode()
      return {**entries, "__tree__.npy": _npy(np.frombuffer(fn(tree).encode(), np.uint8))}
    return edit

  np.random.seed(123)
  state = np.random.get_state()[1].copy()
  bad_generator = _rewrite(payload, tree_edit(lambda t: t.replace('"PCG64"', '"seed"')))
  with pytest.raises(checkpoint.CheckpointError, match="bit_generator is 'seed'; valid: PCG64"):
    checkpoint.loads(bad_generator)
  np.testing.assert_array_equal(np.random.get_state()[1], state)

  def huge(entries):
    name = next(n for n in entries if n != "__tree__.npy")
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (10 ** 12,)})
    return {**entries, name: header.getvalue() + b"\0" * 12}

  with pytest.raises(checkpoint.CheckpointError, match="its header says 4,000,000,000,000 "
                     "bytes, it holds 12"):
    checkpoint.loads(_rewrite(payload, huge))
  deep = _rewrite(payload, tree_edit(lambda t: "[" * 100_000 + "]" * 100_000))
  with pytest.raises(checkpoint.CheckpointError, match="nested too deeply"):
    checkpoint.loads(deep)
  # What a resume reads first: such a file is a damaged checkpoint (skipped).
  for name, archive in (("huge", _rewrite(payload, huge)), ("deep", deep)):
    path = tmp_path / f"{name}.npz"
    path.write_bytes(archive)
    with pytest.raises(checkpoint.Damaged, match=f"{name}.npz: unreadable"):
      checkpoint.check_archive(str(path))


def test_a_config_json_of_the_wrong_kinds_is_one_line(tmp_path, capsys):
  from tests.helpers import main_in_process
  for key, value, kind in (("task", ["synthetic"], "a list"),
                           ("task_args", ["num_clusters=2"], "a list"),
                           ("algo", {"name": "fedavg"}, "an object")):
    run = tmp_path / key
    _run_config(run)
    config = json.loads((run / "config.json").read_text())
    config[key] = value
    (run / "config.json").write_text(json.dumps(config))
    for flag in ("--eval_only", "--resume"):
      code, _, err = main_in_process([flag, f"--output_dir={run}"], capsys)
      lines = [l for l in err.splitlines() if l.strip()]
      assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
      assert f"config.json: {key} is {kind}; valid: a run's config.json" in lines[0], lines[0]


def test_evaluating_a_run_folder_that_cannot_be_written_is_one_line(tmp_path, capsys,
                                                                    monkeypatch):
  """A read-only run folder (EROFS: root ignores permissions, so the write
  itself is made to fail): `python -m tff_cluster.evaluate` and
  `--eval_only` say so in one line, exit 2, and do not suggest --resume."""
  import errno
  from tests.helpers import main_in_process
  from tff_cluster import evaluate
  run = tmp_path / "run"
  code, _, err = main_in_process(["--algo=fedavg", "--task=synthetic", "--rounds=1",
                                  "--noprogress", f"--output_dir={run}"], capsys)
  assert code == 0, err

  def read_only(path, payload):
    raise checkpoint.write_failed(path, OSError(errno.EROFS, "Read-only file system"))

  monkeypatch.setattr(results, "atomic_write_bytes", read_only)
  assert evaluate.main(["evaluate", str(run)]) == 2
  err = capsys.readouterr().err
  lines = [l for l in err.splitlines() if l.strip() and not l.startswith("wrote")]
  assert len(lines) == 1 and "Read-only file system" in lines[0], err
  code, _, err = main_in_process(["--eval_only", f"--output_dir={run}"], capsys)
  lines = [l for l in err.splitlines() if l.strip()]
  assert code == 2 and len(lines) == 1 and "--resume" not in lines[0], err
  assert "valid: a run directory this user can write" in lines[0]


def test_without_flock_the_recorded_holder_decides(tmp_path, monkeypatch):
  """On a file system without flock: a lock file naming a live process of
  this host holds the folder; one naming a process that is gone does not."""
  import socket
  from tff_cluster.io import lock
  monkeypatch.setattr(lock, "_flock", lambda fd, exclusive: None)
  (tmp_path / lock.NAME).write_text(json.dumps({"pid": os.getpid(),
                                                "host": socket.gethostname()}))
  with pytest.raises(lock.LockHeld, match=f"pid {os.getpid()} on {socket.gethostname()}"):
    lock.check(str(tmp_path))
  (tmp_path / lock.NAME).write_text(json.dumps({"pid": 2 ** 22 + 7,
                                                "host": socket.gethostname()}))
  lock.check(str(tmp_path))
  held = lock.RunLock(str(tmp_path)).acquire()
  assert lock.read(str(tmp_path / lock.NAME))["pid"] == os.getpid()
  held.release()
  assert not (tmp_path / lock.NAME).exists()
