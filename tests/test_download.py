"""Federated data fetched on first use (`tff_cluster.data.download`): femnist's
TFF EMNIST database and sent140's CSV and GloVe, served by a local HTTP server
on 127.0.0.1 from fixtures made of ../shared/data (download -> cache -> run,
then a run from the cache with the server stopped), and the failures: a wrong
checksum, a truncated body and a stopped server each give one line, exit 2
and an empty cache. The EMNIST reader (sqlite3 + TensorFlow's Example parser,
no TFF) is checked against the LEAF JSON it was made from."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import gzip
import hashlib
import http.client
import http.server
import io
import json
import lzma
import os
import socket
import sqlite3
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tff_cluster import tasks
from tests.conftest import SHARED_DATA
from tests.helpers import assert_one_line_error, main_in_process
from tff_cluster.data import download, emnist, leaf, sent140, tff_sqlite
from tff_cluster.data.federated import DataError
from tff_cluster.spec.hparams import HParamError
from tff_cluster.spec.task import DataOptions

FEMNIST_LEAF = SHARED_DATA / "femnist_leaf"
SENT140_PARTIAL = SHARED_DATA / "sent140_partial"
SHARDS = (0, 1)  # LEAF shard files of the fixture database: 11 writers


def need(path: Path) -> None:
  if not path.exists():
    pytest.skip(f"needs the shared data {path} (../shared/data)")


# ---------------------------------------------------------------------------
# Fixtures: files in the origins' formats, made from the shared data.


def leaf_writers(shards=SHARDS):
  """{split: {writer: (x list, y list)}} of LEAF FEMNIST shard files."""
  out = {}
  for split in ("train", "test"):
    files = [next((FEMNIST_LEAF / split).glob(f"all_data_{k}_*.json")) for k in shards]
    out[split] = {}
    for path in files:
      out[split].update(leaf.read_leaf_file(str(path)))
  return out


def write_tff_database(path: Path, writers) -> None:
  """TFF's layout: `examples` (split_name, client_id, serialized Example with
  pixels and label) and `client_metadata`; all_* and digits_only_* splits."""
  import tensorflow as tf

  def example(x, y):
    return tf.train.Example(features=tf.train.Features(feature={
        "pixels": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(y)]))}
    )).SerializeToString()

  con = sqlite3.connect(str(path))
  tff_sqlite.create_tables(con)
  for half in ("train", "test"):
    for prefix, keep in (("all", lambda y: True), ("digits_only", lambda y: y < 10)):
      split = f"{prefix}_{half}"
      for cid, (xs, ys) in writers[half].items():
        rows = [(split, cid, example(x, y)) for x, y in zip(xs, ys) if keep(y)]
        if rows:
          con.executemany("INSERT INTO examples VALUES (?, ?, ?)", rows)
          con.execute("INSERT INTO client_metadata VALUES (?, ?, ?)", (cid, split, len(rows)))
  con.commit()
  con.close()


def sent140_rows(min_tweets=5):
  """Rows of the shared partial CSV whose users have >= min_tweets tweets."""
  with open(SENT140_PARTIAL / "sent140_train_partial_union.csv", encoding="latin-1",
            newline="") as f:
    rows = list(csv.reader(f))
  counts = {}
  for row in rows:
    counts[row[4]] = counts.get(row[4], 0) + 1
  return [r for r in rows if counts[r[4]] >= min_tweets]


def zipped(members: dict) -> bytes:
  buf = io.BytesIO()
  with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
    for name, data in members.items():
      z.writestr(name, data)
  return buf.getvalue()


@pytest.fixture(scope="module")
def writers():
  need(FEMNIST_LEAF)
  return leaf_writers()


@pytest.fixture(scope="module")
def database(tmp_path_factory, writers):
  path = tmp_path_factory.mktemp("db") / "emnist_all.sqlite"
  write_tff_database(path, writers)
  return path


@pytest.fixture(scope="module")
def served(database):
  """name -> bytes the server holds: the origins' file names and formats."""
  need(SENT140_PARTIAL)
  db = database
  rows = sent140_rows()
  out = io.StringIO()
  csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
  words = {t for r in rows for t in leaf.tokenize(r[5])}
  with gzip.open(SENT140_PARTIAL / "glove.6B.50d.sent140_partial_vocab.txt.gz", "rt",
                 encoding="utf-8") as f:
    glove = "".join(line for line in f if line.split(" ", 1)[0] in words)
  return {
      download.EMNIST.archive: lzma.compress(db.read_bytes(), format=lzma.FORMAT_ALONE,
                                             preset=0),
      download.SENT140_CSV.archive: zipped({
          download.SENT140_CSV.name: out.getvalue().encode("latin-1"),
          "testdata.manual.2009.06.14.csv":
              (SENT140_PARTIAL / "testdata.manual.2009.06.14.csv").read_bytes()}),
      download.glove(50).archive: zipped({"glove.6B.50d.txt": glove.encode("utf-8")}),
  }


class _Handler(http.server.BaseHTTPRequestHandler):
  """GET /files/<name>: the file; /truncated/<name>: its full length
  announced, half of it sent, the connection closed; /more/<name>: no length
  announced, the file then 64 MiB more; /trickle/<name>: its length
  announced, then one byte every 0.2 s."""

  def do_GET(self):  # noqa: N802 (http.server's name)
    mode, _, name = self.path.lstrip("/").partition("/")
    body = self.server.files.get(name)
    if body is None or mode not in ("files", "truncated", "more", "trickle"):
      self.send_error(404)
      return
    self.send_response(200)
    if mode != "more":
      self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.close_connection = True
    try:
      if mode == "more":
        self.wfile.write(body)
        for _ in range(64):
          self.wfile.write(bytes(1 << 20))
      elif mode == "trickle":
        for i in range(len(body)):
          self.wfile.write(body[i:i + 1])
          self.wfile.flush()
          time.sleep(0.2)
      else:
        self.wfile.write(body if mode == "files" else body[:len(body) // 2])
    except OSError:
      pass  # the client stopped reading

  def log_message(self, *args):
    pass


@contextlib.contextmanager
def serving(files):
  """A server on 127.0.0.1 (only) holding `files`; yields its base URL."""
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
  server.files = files
  thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                            daemon=True)
  thread.start()
  try:
    yield f"http://127.0.0.1:{server.server_address[1]}"
  finally:
    server.shutdown()
    server.server_close()
    thread.join()


def closed_port_url() -> str:
  """A URL on 127.0.0.1 where nothing listens (a stopped server)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  return f"http://127.0.0.1:{port}/files"


@pytest.fixture
def cache(tmp_path, monkeypatch):
  """An empty cache root (not yet created) and a home without TFF's or
  Keras' caches; no mirror until a test sets one."""
  root = tmp_path / "cache" / "tff_cluster"
  monkeypatch.setenv(download.ENV_DATA, str(root))
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  monkeypatch.delenv("KERAS_HOME", raising=False)
  monkeypatch.delenv(download.ENV_MIRROR, raising=False)
  return root


def cache_files(root: Path):
  return sorted(p.name for p in root.iterdir()) if root.exists() else []


# ---------------------------------------------------------------------------
# Download -> cache -> run, then the cache alone.

FEMNIST_RUN = ["--algo=fedavg", "--task=femnist", "--rounds=1", "--clients_per_round=4",
               "--local_epochs=1", "--noprogress"]
SENT140_RUN = ["--algo=fedavg", "--task=sent140", "--task_arg=glove_dim=50", "--rounds=1",
               "--clients_per_round=4", "--local_epochs=1", "--noprogress"]


def test_femnist_fetch_then_run_then_cache_alone(served, writers, cache, tmp_path, monkeypatch,
                                                capsys):
  with serving(served) as base:
    monkeypatch.setenv(download.ENV_MIRROR, base + "/files")
    code, _, err = main_in_process([*FEMNIST_RUN, f"--output_dir={tmp_path / 'run1'}"],
                                   capsys)
    assert code == 0, err
  assert cache_files(cache) == [download.EMNIST.name]  # decompressed, no .lzma, no .part
  config = json.loads((tmp_path / "run1" / "config.json").read_text())
  assert str(cache) in config["data_description"] and config["num_clients_loaded"] == len(
      writers["train"])
  # The server is gone: the second run reads the cache only.
  code, _, err = main_in_process([*FEMNIST_RUN, f"--output_dir={tmp_path / 'run2'}"], capsys)
  assert code == 0, err
  assert json.loads((tmp_path / "run2" / "summary.json").read_text())["completed"]


def test_sent140_fetch_then_load_then_cache_alone(served, cache, monkeypatch):
  """The task's data and model from the fetched CSV and GloVe. (Not a CLI run:
  the LSTM's tracing would add 10-20 s; the CLI's fetch is the checksum case
  below, and its training on the CSV is test_sent140_csv's.)"""
  archive = served[download.SENT140_CSV.archive]
  monkeypatch.setattr(download, "SENT140_CSV", dataclasses.replace(
      download.SENT140_CSV, size=len(archive), sha256=hashlib.sha256(archive).hexdigest()))
  spec = tasks.registry()["sent140"]
  options = DataOptions(extra={"glove_dim": 50})
  with serving(served) as base:
    monkeypatch.setenv(download.ENV_MIRROR, base + "/files")
    data = spec.load_data(options)
  # Only the members read are kept, under their own names; no archive.
  assert cache_files(cache) == ["glove.6B.50d.txt", download.SENT140_CSV.name]
  assert str(cache) in data.description and "GloVe 50-d" in data.description
  x, _ = data.train[data.client_ids[0]]
  assert spec.model_fn()(x).shape == (len(x), 1)
  # The server is gone: the same data comes from the cache.
  again = spec.load_data(options)
  assert again.description == data.description
  np.testing.assert_array_equal(again.train[data.client_ids[0]][0], x)
  with pytest.raises(HParamError, match="glove_dim=64; valid: 50, 100, 200, 300"):
    spec.load_data(DataOptions(extra={"glove_dim": 64}))


# ---------------------------------------------------------------------------
# Failures: one line, exit 2, nothing in the cache.


@pytest.mark.parametrize("case", ["checksum", "truncated", "stopped"])
def test_failed_fetch_is_one_line_and_leaves_no_file(case, served, cache, tmp_path,
                                                     monkeypatch, capsys):
  with serving(served) as base:
    if case == "checksum":  # the fixture zip is not Stanford's: TFDS's SHA-256 differs
      args, remote, mirror = SENT140_RUN, download.SENT140_CSV, base + "/files"
      monkeypatch.setattr(download, "SENT140_CSV", dataclasses.replace(
          download.SENT140_CSV, size=len(served[remote.archive])))
      needle = f"is not {remote.sha256[:16]}"
    elif case == "truncated":
      args, remote, mirror = FEMNIST_RUN, download.EMNIST, base + "/truncated"
      needle = f"of the {len(served[remote.archive]):,} bytes announced"
    else:
      args, remote, mirror = FEMNIST_RUN, download.EMNIST, closed_port_url()
      needle = "Connection refused"
    monkeypatch.setenv(download.ENV_MIRROR, mirror)
    out = tmp_path / "out"
    start = time.perf_counter()
    code, _, err = main_in_process([*args, f"--output_dir={out}"], capsys)
    seconds = time.perf_counter() - start
  assert_one_line_error(code, err, out, f"could not fetch {remote.name}",
                        f"{mirror}/{remote.archive}", f"in {cache}", needle)
  assert not cache.exists() and not cache.parent.exists(), cache_files(cache.parent)
  assert seconds < 20, seconds  # offline fails at once, not after a long wait


def test_killed_fetch_leaves_nothing_that_looks_whole(served, cache, monkeypatch):
  """An interrupt mid-body (Ctrl-C) removes the partial file; a `.part` file a
  SIGKILL left behind is never taken for the file and is cleared when stale."""
  real_read, real_read1 = http.client.HTTPResponse.read, http.client.HTTPResponse.read1
  calls = []

  def read_then_interrupt(self, amt=None):
    calls.append(amt)
    if len(calls) > 1:
      raise KeyboardInterrupt
    return real_read(self, 4096)

  monkeypatch.setattr(http.client.HTTPResponse, "read", read_then_interrupt)
  monkeypatch.setattr(http.client.HTTPResponse, "read1", read_then_interrupt)
  with serving(served) as base:
    monkeypatch.setenv(download.ENV_MIRROR, base + "/files")
    with pytest.raises(KeyboardInterrupt):
      emnist.fetch_database()
  assert not cache.exists()
  monkeypatch.setattr(http.client.HTTPResponse, "read", real_read)
  monkeypatch.setattr(http.client.HTTPResponse, "read1", real_read1)
  cache.mkdir(parents=True)
  monkeypatch.setenv(download.ENV_MIRROR, closed_port_url())
  stale = cache / f".{download.EMNIST.name}.x1.part"
  stale.write_bytes(b"SQLite format 3\x00 half")
  os.utime(stale, (time.time() - 2 * download.STALE_PART_S,) * 2)
  with pytest.raises(download.DownloadError):
    emnist.fetch_database()
  assert cache_files(cache) == []


# ---------------------------------------------------------------------------
# Bounds: bytes downloaded, bytes decompressed, seconds.


def test_a_decompression_bomb_stops_at_the_bound_in_little_memory(cache, monkeypatch):
  """An LZMA stream of a few KB that decodes to 64 MiB, the output bound set
  to 1 MiB: refused in one line once 1 MiB is out, never holding the 64 MiB
  in memory, and the cache is left empty."""
  import tracemalloc
  bomb = lzma.compress(bytes(64 << 20), format=lzma.FORMAT_ALONE, preset=0)
  assert len(bomb) < 64 << 10
  monkeypatch.setattr(download, "EMNIST", dataclasses.replace(download.EMNIST,
                                                               max_output=1 << 20))
  with serving({download.EMNIST.archive: bomb}) as base:
    monkeypatch.setenv(download.ENV_MIRROR, base + "/files")
    tracemalloc.start()
    try:
      with pytest.raises(download.DownloadError, match=r"emnist_all\.sqlite decompressed is "
                         r"over 1,048,576 bytes, the stated maximum"):
        emnist.fetch_database()
      peak = tracemalloc.get_traced_memory()[1]
    finally:
      tracemalloc.stop()
  assert peak < 16 << 20, peak
  assert not cache.exists()


def test_a_download_stops_at_its_published_size(served, cache, monkeypatch):
  """Sentiment140's archive has a published size: a server that sends it
  and then more (no length announced) is cut off there; one announcing more
  is refused before its body. A zip member over the output bound is refused
  from its header."""
  archive = served[download.SENT140_CSV.archive]
  monkeypatch.setattr(download, "SENT140_CSV", dataclasses.replace(
      download.SENT140_CSV, size=len(archive), sha256=hashlib.sha256(archive).hexdigest()))
  with serving(served) as base:
    monkeypatch.setenv(download.ENV_MIRROR, base + "/more")
    with pytest.raises(download.DownloadError, match=f"the server sent more than the "
                       f"{len(archive):,} bytes of the size TensorFlow Datasets"):
      sent140.fetch_csv()
    monkeypatch.setattr(download, "SENT140_CSV", dataclasses.replace(
        download.SENT140_CSV, size=len(archive) - 1))
    monkeypatch.setenv(download.ENV_MIRROR, base + "/files")
    with pytest.raises(download.DownloadError, match=f"the server announces {len(archive):,} "
                       f"bytes, over the {len(archive) - 1:,} of the size"):
      sent140.fetch_csv()
    member = len(zipfile.ZipFile(io.BytesIO(served["glove.6B.zip"])).read("glove.6B.50d.txt"))
    monkeypatch.setattr(download, "glove", lambda dim: dataclasses.replace(
        download.Remote(name=f"glove.6B.{dim}d.txt", origin=download.GLOVE_ORIGIN,
                        packing="zip"), max_output=member - 1))
    with pytest.raises(download.DownloadError, match=f"says it has {member:,} bytes, over "
                       f"the stated maximum of {member - 1:,}"):
      sent140.fetch_glove(50)
  assert not cache.exists()


def test_a_trickling_server_meets_the_deadline_and_the_bar_moves(served, cache, monkeypatch):
  """One byte every 0.2 s (each read well within TIMEOUT_S): the fetch stops
  at DEADLINE_S (here 1.5 s), and the bar has moved with the bytes that came."""
  monkeypatch.setattr(download, "DEADLINE_S", 1.5)
  updates = []

  class Bar:
    leave = True

    def update(self, n):
      updates.append(n)

    def close(self):
      pass

  monkeypatch.setattr(download, "_progress", lambda total, name: Bar())
  outcome = {}

  def fetch():
    try:
      emnist.fetch_database()
    except download.DownloadError as e:
      outcome["error"] = str(e)

  with serving(served) as base:
    monkeypatch.setenv(download.ENV_MIRROR, base + "/trickle")
    start = time.perf_counter()
    thread = threading.Thread(target=fetch, daemon=True)
    thread.start()
    thread.join(timeout=20)
    seconds = time.perf_counter() - start
    assert not thread.is_alive(), "the fetch was still running after 20 s"
  assert "after 1.5 s, the most one file's fetch may take" in outcome["error"]
  assert seconds < 10 and len(updates) >= 3, (seconds, updates)
  assert not cache.exists()


def test_tff_and_keras_caches_are_used_where_they_are(served, cache, tmp_path, monkeypatch):
  monkeypatch.setenv(download.ENV_MIRROR, closed_port_url())  # no fetch may succeed
  tff_cache = tmp_path / "home" / ".tff"
  tff_cache.mkdir(parents=True)
  db = tff_cache / download.EMNIST.name
  db.write_bytes(lzma.decompress(served[download.EMNIST.archive]))
  assert emnist.fetch_database() == str(db)
  # Keras' cache: an archive there is unzipped from there (and checked).
  keras_home = tmp_path / "keras"
  (keras_home / "datasets").mkdir(parents=True)
  (keras_home / "datasets" / "glove.6B.zip").write_bytes(served["glove.6B.zip"])
  monkeypatch.setenv("KERAS_HOME", str(keras_home))
  path = sent140.fetch_glove(50)
  assert path == str(cache / "glove.6B.50d.txt") and cache_files(cache) == ["glove.6B.50d.txt"]
  with pytest.raises(download.DownloadError, match="holds no glove.6B.300d.txt"):
    sent140.fetch_glove(300)
  assert cache_files(cache) == ["glove.6B.50d.txt"]
  # Keras 3's extraction folder.
  (keras_home / "datasets" / "trainingandtestdata_extracted").mkdir()
  csv_path = keras_home / "datasets" / "trainingandtestdata_extracted" / download.SENT140_CSV.name
  csv_path.write_text('"0","1","d","q","u","t"\n', encoding="latin-1")
  assert sent140.fetch_csv() == str(csv_path)


def test_mirror_replaces_every_origin(monkeypatch):
  monkeypatch.setenv(download.ENV_MIRROR, "http://127.0.0.1:8000/data/")
  assert download.url(download.EMNIST) == "http://127.0.0.1:8000/data/emnist_all.sqlite.lzma"
  assert download.url(download.glove(300)) == "http://127.0.0.1:8000/data/glove.6B.zip"
  monkeypatch.delenv(download.ENV_MIRROR)
  assert download.url(download.SENT140_CSV) == download.SENT140_CSV.origin
  with pytest.raises(DataError, match="valid: 50, 100, 200, 300"):
    download.glove(64)


# ---------------------------------------------------------------------------
# The EMNIST reader, without TFF.


def test_reader_gives_the_leaf_arrays_back(database, writers):
  data = emnist.load_database(str(database))
  assert data.client_ids == sorted(writers["train"]) and data.num_classes == 62
  for cid in data.client_ids:
    for split, arrays in (("train", data.train), ("test", data.test)):
      x, y = arrays[cid]
      np.testing.assert_array_equal(x, np.asarray(writers[split][cid][0], np.float32))
      np.testing.assert_array_equal(y, writers[split][cid][1])
  digits = emnist.load_database(str(database), only_digits=True)
  assert digits.num_classes == 10 and all(
      digits.train[c][1].max() < 10 for c in digits.client_ids)
  sub = emnist.load_database(str(database), num_clients=3, seed=1)
  assert sub.client_ids == leaf.sample_clients(data, 3, 1).client_ids


def test_tasks_read_the_database_as_data_dir(database, tmp_path):
  registry = tasks.registry()
  renamed = tmp_path / "femnist.db"
  renamed.write_bytes(database.read_bytes())
  for data_dir in (database, database.parent, renamed):
    data = registry["femnist"].load_data(DataOptions(data_dir=str(data_dir), num_clients=4))
    assert data.num_clients == 4 and "Federated EMNIST" in data.description
  view = registry["femnist_digits"].load_data(DataOptions(data_dir=str(database)))
  assert view.num_classes == 10 and "digits" in view.description
  pooled = registry["femnist_fedprox"].load_data(DataOptions(data_dir=str(database),
                                                             num_clients=10))
  assert "TFF EMNIST" in pooled.description and pooled.num_clients == 10


def test_a_broken_database_is_one_line(tmp_path):
  bad = tmp_path / "emnist_all.sqlite"
  con = sqlite3.connect(str(bad))
  con.execute("CREATE TABLE examples (split_name TEXT, client_id TEXT)")
  con.commit()
  con.close()
  with pytest.raises(DataError, match="no column 'serialized_example_proto'") as e:
    tasks.registry()["femnist"].load_data(DataOptions(data_dir=str(bad)))
  assert "\n" not in str(e.value)
