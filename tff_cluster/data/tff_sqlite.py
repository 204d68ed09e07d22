"""TFF's federated data sets in its sqlite layout, read without TFF: the checks
every reader here shares (EMNIST's, Shakespeare's, CIFAR-100's, CelebA's), and
the image data sets' reader.

TFF's `SqlClientData` files (`tff.simulation.datasets`; its
simulation/datasets/sql_client_data.py) hold two tables:

* `examples` (split_name TEXT, client_id TEXT, serialized_example_proto
  BLOB): one row per example, a serialized `tf.train.Example`;
* `client_metadata` (client_id TEXT, split_name TEXT, num_examples INTEGER):
  the clients of each split and how many examples each has.

TFF lists a split's clients sorted by id and gives a client's examples in row
order. The image data sets among them (CIFAR-100's `cifar100.sqlite`,
CelebA's `celeba.sqlite`) keep each image as an int64 feature of fixed shape
with values 0..255, and their labels as int64 scalars.

`read_clients` reads the named clients of the named splits in one pass over
the table with Python's `sqlite3` (the rows of other clients and splits are
passed over without their examples being read) and TensorFlow's Example
parser. Each
split's images go into one uint8 array allocated up front from
`client_metadata`'s counts, each client a contiguous block in TFF's order
(clients sorted, a client's examples in row order), so that the memory held is
one byte a pixel and no larger copy is ever made; a batch of at most
`BATCH_BYTES` of parsed int64 pixels is the only transient. The float32 model
input is `CodedArray(images, compact.UNIT)`: k/255, the same values a float
conversion of TFF's pixels divided by 255 gives.

A file that is not such a database, a client whose rows disagree with its
`client_metadata` count, a pixel outside 0..255 or an example that does not
parse is a `DataError` (one line naming the file and what is wrong).
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import urllib.parse
from typing import Dict, List, Mapping, Sequence, Tuple

import numpy as np

from tff_cluster import stack
from tff_cluster.data import compact
from tff_cluster.data.federated import DataError, open_data_file

TABLES = {"examples": ("split_name", "client_id", "serialized_example_proto"),
          "client_metadata": ("client_id", "split_name", "num_examples")}
SQLITE_MAGIC = b"SQLite format 3\x00"
BATCH_BYTES = 64 << 20  # parsed int64 pixels held at once


@dataclasses.dataclass(frozen=True)
class Source:
  """One TFF image database.

  Attributes:
    title: what it is, for messages ("TFF's federated CIFAR-100").
    name: the kept file's name (`download.Remote.name`).
    origin: the URL it is the decompressed form of.
    image_shape: the `image` feature's shape (height, width, channels); ()
      for a data set of other examples (EMNIST's pixels, Shakespeare's text).
    labels: the int64 scalar features read with each image.
    splits: the split names the file must list in `client_metadata`.
    max_bytes: the largest file opened as this database.
    tables: the tables and the columns each must have.
    unit: what a client is, for messages ("clients", "writers", "roles").
  """
  title: str
  name: str
  origin: str
  image_shape: Tuple[int, ...]
  labels: Tuple[str, ...]
  splits: Tuple[str, ...]
  max_bytes: int
  tables: Mapping[str, Tuple[str, ...]] = dataclasses.field(default_factory=lambda: TABLES)
  unit: str = "clients"


@dataclasses.dataclass
class Block:
  """One split's clients read: `images[lo:hi]`, `labels[name][lo:hi]` of each
  client, with (lo, hi) = `spans[client]`."""
  images: np.ndarray  # uint8 [n, *image_shape]
  labels: Dict[str, np.ndarray]  # int64 [n] each
  spans: Dict[str, Tuple[int, int]]


def is_database(path: str) -> bool:
  """Whether `path` is an SQLite file (by its header, whatever its name)."""
  try:
    with open(path, "rb") as f:
      return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
  except OSError:
    return False


def not_source(path: str, source: Source, why: str) -> DataError:
  return DataError(f"{path}: not {source.title} database ({why}); expected "
                   f"{source.name}, the decompressed {source.origin}")


def connect(path: str, source: Source) -> sqlite3.Connection:
  """A read-only connection (a reader never changes or creates the file); a
  FIFO, a device or a file over `source.max_bytes` is refused first."""
  open_data_file(path, "rb", max_bytes=source.max_bytes,
                 expected=f"{source.name} (an SQLite database)").close()
  return sqlite3.connect(f"file:{urllib.parse.quote(os.path.abspath(path))}?mode=ro",
                         uri=True)


def check_database(path: str, source: Source) -> None:
  """DataError (one line) unless `path` opens as `source`: both tables with
  their columns, and every split of `source.splits` in `client_metadata`."""
  open_data_file(path, "rb", max_bytes=source.max_bytes,  # missing, a FIFO, too big
                 expected=f"{source.name} (an SQLite database)").close()
  if not is_database(path):
    raise not_source(path, source, "no SQLite header")
  try:
    con = connect(path, source)
    try:
      tables = {r[0] for r in con.execute(
          "SELECT name FROM sqlite_master WHERE type = 'table'")}
      for table, columns in source.tables.items():
        if table not in tables:
          raise not_source(path, source, f"no table {table!r}")
        have = {r[1] for r in con.execute(f"PRAGMA table_info({table})")}
        missing = [c for c in columns if c not in have]
        if missing:
          raise not_source(path, source, f"table {table!r} has no column {missing[0]!r}")
      splits = {r[0] for r in con.execute("SELECT DISTINCT split_name FROM client_metadata")}
    finally:
      con.close()
  except sqlite3.Error as e:
    raise not_source(path, source, f"{type(e).__name__}: {e}") from None
  missing = [s for s in source.splits if s not in splits]
  if missing:
    raise not_source(path, source, f"no {source.unit} under the split name "
                     f"{missing[0]!r}; valid splits: {', '.join(source.splits)}")


def example_rows(path: str, source: Source, splits: Sequence[str],
                 clients=None, batch: int = 4096):
  """Batches (lists) of at most `batch` rows (split, client id, serialized
  example) of `examples` under `splits`, in row order, each row checked (a
  text id, a BLOB); `clients` (a set) keeps only those clients' rows. One
  pass over the table; an SQLite error is a DataError (one line)."""
  con = connect(path, source)
  try:
    cursor = con.execute(
        "SELECT split_name, client_id, serialized_example_proto FROM examples "
        f"WHERE split_name IN ({', '.join('?' * len(splits))})", tuple(splits))
    while True:
      rows = cursor.fetchmany(batch)
      if not rows:
        break
      if clients is not None:
        rows = [r for r in rows if r[1] in clients]
        if not rows:
          continue
      for r in rows:
        if not isinstance(r[1], str) or not isinstance(r[2], bytes):
          raise not_source(path, source, f"a row of examples has client_id {r[1]!r} and a "
                           f"serialized_example_proto of type {type(r[2]).__name__}; "
                           "valid: text and a BLOB")
      yield rows
  except sqlite3.Error as e:
    raise not_source(path, source, f"{type(e).__name__}: {e}") from None
  finally:
    con.close()


SCHEMA = ("CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, "
          "serialized_example_proto BLOB NOT NULL)",
          "CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL, "
          "num_examples INTEGER NOT NULL)")


def create_tables(con: sqlite3.Connection) -> None:
  """Creates TFF's two tables in an empty database (what the tests' fixtures
  and the benchmarks' full-size layouts write into)."""
  for statement in SCHEMA:
    con.execute(statement)


def database_path(data_dir, source: Source, fetch) -> str:
  """The database a task reads: `data_dir` naming one (any file name) or a
  folder holding `source.name`; without `data_dir`, `fetch()` (a cache's
  copy, or downloaded)."""
  if not data_dir:
    return fetch()
  path = os.path.expanduser(str(data_dir))
  if os.path.isdir(path):
    path = os.path.join(path, source.name)
  return path


def ids_in_both(path: str, source: Source, train: str, test: str) -> List[str]:
  """The clients `client_metadata` lists under both `train` and `test`, sorted
  (TFF's order); a client id that is not text is a DataError (one line)."""
  con = connect(path, source)
  try:
    ids = [{r[0] for r in con.execute(
        "SELECT DISTINCT client_id FROM client_metadata WHERE split_name = ?", (split,))}
        for split in (train, test)]
  except sqlite3.Error as e:
    raise not_source(path, source, f"{type(e).__name__}: {e}") from None
  finally:
    con.close()
  bad = next((c for half in ids for c in half if not isinstance(c, str)), "")
  if bad != "":
    raise not_source(path, source, f"a client_id of client_metadata is {bad!r}, not text")
  return sorted(ids[0] & ids[1])


def client_counts(path: str, source: Source, split: str) -> Dict[str, int]:
  """client id -> its number of examples in `split`, as `client_metadata`
  says, in TFF's order (sorted ids)."""
  con = connect(path, source)
  try:
    rows = con.execute("SELECT client_id, num_examples FROM client_metadata "
                       "WHERE split_name = ?", (split,)).fetchall()
  except sqlite3.Error as e:
    raise not_source(path, source, f"{type(e).__name__}: {e}") from None
  finally:
    con.close()
  counts: Dict[str, int] = {}
  for cid, n in rows:
    if not isinstance(cid, str) or isinstance(n, bool) or not isinstance(n, int) or n < 0:
      raise not_source(path, source, f"a row of client_metadata has client_id {cid!r} and "
                       f"num_examples {n!r}; valid: text and an integer >= 0")
    if cid in counts:
      raise not_source(path, source, f"client {cid!r} is listed twice under {split!r} in "
                       "client_metadata")
    counts[cid] = n
  return dict(sorted(counts.items()))


def _allocate(source: Source, wanted: Mapping[str, Sequence[str]],
              counts: Mapping[str, Mapping[str, int]]):
  """(split -> an empty `Block` sized by `counts` for the clients `wanted`,
  split -> client -> the row its next example goes to)."""
  shape = tuple(source.image_shape)
  blocks: Dict[str, Block] = {}
  cursor_at: Dict[str, Dict[str, int]] = {}
  for split, ids in wanted.items():
    sizes = np.array([counts[split][c] for c in ids], np.int64)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    total = int(ends[-1]) if len(ends) else 0
    blocks[split] = Block(compact.aligned_empty((total, *shape), np.uint8),
                          {name: np.empty(total, np.int64) for name in source.labels},
                          {c: (int(a), int(b)) for c, a, b in zip(ids, starts, ends)})
    cursor_at[split] = {c: int(a) for c, a in zip(ids, starts)}
  return blocks, cursor_at


def read_clients(path: str, source: Source, wanted: Mapping[str, Sequence[str]],
                 counts: Mapping[str, Mapping[str, int]]) -> Dict[str, Block]:
  """split -> `Block` of the clients `wanted[split]` (in that order), read in
  one pass over `examples`; `counts[split][client]` (from `client_counts`)
  sizes each client's block, and the rows must fill it exactly."""
  tf = stack.import_tensorflow()
  shape = tuple(source.image_shape)
  blocks, cursor_at = _allocate(source, wanted, counts)
  features = {"image": tf.io.FixedLenFeature(shape, tf.int64),
              **{name: tf.io.FixedLenFeature((), tf.int64) for name in source.labels}}
  per_batch = max(1, BATCH_BYTES // (8 * int(np.prod(shape))))
  splits = [s for s in wanted if wanted[s]]
  if not splits:
    return blocks

  def flush(protos: List[bytes], places: List[Tuple[str, int]]) -> None:
    try:
      parsed = tf.io.parse_example(tf.constant(protos, tf.string), features)
    except (tf.errors.InvalidArgumentError, ValueError) as e:
      reason = str(e).splitlines()[0] if str(e) else type(e).__name__
      raise not_source(path, source, f"an example does not parse as image {list(shape)} "
                       f"and {', '.join(source.labels)}: {reason[:200]}") from None
    image = parsed["image"]
    low, high = int(tf.reduce_min(image)), int(tf.reduce_max(image))
    if low < 0 or high > 255:
      raise not_source(path, source, f"a pixel is {low if low < 0 else high}; valid: 0..255")
    pixels = tf.cast(image, tf.uint8).numpy()
    del parsed["image"], image
    labels = {name: parsed[name].numpy() for name in source.labels}
    for split in splits:
      rows = [i for i, (s, _) in enumerate(places) if s == split]
      if not rows:
        continue
      at = np.array([places[i][1] for i in rows], np.int64)
      blocks[split].images[at] = pixels[rows]
      for name in source.labels:
        blocks[split].labels[name][at] = labels[name][rows]

  con = connect(path, source)
  try:
    # The clients asked for, in a table of the connection's own (temporary,
    # in memory): rows of other clients are passed over by SQLite without
    # their examples being read from the file.
    con.execute("PRAGMA temp_store = MEMORY")
    con.execute("CREATE TEMP TABLE wanted (split_name TEXT, client_id TEXT, "
                "PRIMARY KEY (split_name, client_id))")
    con.executemany("INSERT OR IGNORE INTO temp.wanted VALUES (?, ?)",
                    ((split, cid) for split in splits for cid in wanted[split]))
    cursor = con.execute(
        "SELECT split_name, client_id, serialized_example_proto FROM examples AS e "
        f"WHERE split_name IN ({', '.join('?' * len(splits))}) AND EXISTS (SELECT 1 FROM "
        "temp.wanted AS w WHERE w.split_name = e.split_name AND w.client_id = e.client_id)",
        tuple(splits))
    protos: List[bytes] = []
    places: List[Tuple[str, int]] = []
    while True:
      rows = cursor.fetchmany(per_batch)
      if not rows:
        break
      for split, cid, blob in rows:
        at = cursor_at[split].get(cid)
        if at is None:
          if not isinstance(cid, str):
            raise not_source(path, source, f"a row of examples has client_id {cid!r}; "
                             "valid: text")
          continue  # a client not asked for
        if not isinstance(blob, bytes):
          raise not_source(path, source, "a row of examples has a serialized_example_proto "
                           f"of type {type(blob).__name__}; valid: a BLOB")
        if at >= blocks[split].spans[cid][1]:
          raise not_source(path, source, f"client {cid!r} has more examples under {split!r} "
                           f"than the {counts[split][cid]} client_metadata gives it")
        cursor_at[split][cid] = at + 1
        protos.append(blob)
        places.append((split, at))
      if len(protos) >= per_batch:
        flush(protos, places)
        protos, places = [], []
    if protos:
      flush(protos, places)
  except sqlite3.Error as e:
    raise not_source(path, source, f"{type(e).__name__}: {e}") from None
  finally:
    con.close()
  for split in splits:
    for cid, (lo, hi) in blocks[split].spans.items():
      if cursor_at[split][cid] != hi:
        raise not_source(path, source, f"client {cid!r} has {cursor_at[split][cid] - lo} "
                         f"examples under {split!r}, not the {hi - lo} client_metadata "
                         "gives it")
  return blocks


def sample_ids(ids: Sequence[str], num_clients, seed: int, what: str) -> List[str]:
  """A seeded random subset of `num_clients` of `ids`, kept in their order
  (all of them when `num_clients` is None or not smaller)."""
  ids = list(ids)
  if num_clients is None or num_clients >= len(ids):
    return ids
  if num_clients < 1:
    raise DataError(f"--num_clients must be >= 1, got {num_clients}; valid: 1..{len(ids)} "
                    f"{what}")
  pick = np.sort(np.random.default_rng(seed).choice(len(ids), num_clients, replace=False))
  return [ids[i] for i in pick]
