"""Federated Shakespeare as TFF publishes it (`shakespeare.sqlite`), read
without TFF, as next-character sequences.

The file: TFF's `tff.simulation.datasets.shakespeare.load_data` fetches
`shakespeare.sqlite.lzma` and reads its decompressed database
(`tff_cluster.data.download.SHAKESPEARE` fetches the same file): LEAF's
Shakespeare, one client per speaking role of a play, 715 roles, 16,068 train
/ 2,356 test snippets by TFF's documentation, every role in both splits. Its
layout is TFF's `SqlClientData` (federated EMNIST's):

* table `examples` (split_name, client_id, serialized_example_proto): one row
  per snippet (a contiguous run of the role's lines), a serialized
  `tf.train.Example` with one feature, `snippets` (one bytes string);
* table `client_metadata` (client_id, split_name, num_examples).

Split names `train` and `test`. Roles come in TFF's order (sorted ids), each
role's snippets in row order.

Characters to ids, as TFF's Shakespeare baseline does
(`simulation/baselines/shakespeare/char_prediction_preprocessing.py` of
tensorflow_federated v0.87.0, the same at the repository's head):

* the vocabulary `CHAR_VOCAB` (86 characters, that file's `CHAR_VOCAB`, the
  one of TFF's "Federated Learning for Text Generation" tutorial): character
  i has id i + 1; 0 is padding (PAD), 87 out-of-vocabulary (OOV), 88
  beginning (BOS), 89 end (EOS): 90 ids (`VOCAB_SIZE`, its `VOCAB_LENGTH`);
* a snippet is split into bytes, not Unicode characters (each byte of a
  multi-byte UTF-8 character is one OOV id), and becomes
  [BOS] + ids + [EOS], padded with PAD to a multiple of SEQ_LEN + 1 = 81;
* cut into rows of 81 ids; row r gives the input r[:80] and the target
  r[1:] (the next character at every position). A row never spans two
  snippets, and its padding only trails.

TFF's own pipeline shuffles snippets (a buffer of 50) before cutting them; here
the rows are a client's examples, which the runners shuffle each epoch.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tff_cluster import stack
from tff_cluster.data import download, tff_sqlite
from tff_cluster.data.federated import MAX_FILE_BYTES, DataError, FederatedData

DB_FILE = download.SHAKESPEARE.name
URL = download.SHAKESPEARE.origin
SPLITS = ("train", "test")
TABLES = {"examples": ("split_name", "client_id", "serialized_example_proto"),
          "client_metadata": ("client_id", "split_name")}
FEATURE = "snippets"

CHAR_VOCAB = ("dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#'/37;?bfjnrvzBFJNRVZ\"&*.26:\n"
              "aeimquyAEIMQUY]!%)-159\r")
PAD, OOV, BOS, EOS = 0, len(CHAR_VOCAB) + 1, len(CHAR_VOCAB) + 2, len(CHAR_VOCAB) + 3
VOCAB_SIZE = len(CHAR_VOCAB) + 4  # 90
SEQ_LEN = 80  # McMahan et al.'s, TFF's DEFAULT_SEQUENCE_LENGTH

_BATCH = 4096  # examples parsed at once

# byte -> id: the vocabulary's characters (all ASCII) 1..86, every other byte OOV.
_IDS = np.full(256, OOV, np.int32)
_IDS[np.frombuffer(CHAR_VOCAB.encode("ascii"), np.uint8)] = np.arange(
    1, len(CHAR_VOCAB) + 1, dtype=np.int32)

Arrays = Tuple[np.ndarray, np.ndarray]


SOURCE = tff_sqlite.Source(title="TFF's federated Shakespeare", name=DB_FILE, origin=URL,
                           image_shape=(), labels=(), splits=SPLITS,
                           max_bytes=MAX_FILE_BYTES, tables=TABLES, unit="roles")
is_database = tff_sqlite.is_database


def _not_shakespeare(path: str, why: str) -> DataError:
  return tff_sqlite.not_source(path, SOURCE, why)


def check_database(path: str) -> None:
  """Raises a DataError (one line) unless `path` opens as TFF's federated
  Shakespeare: both tables with their columns, and the split names."""
  tff_sqlite.check_database(path, SOURCE)


def role_ids(path: str) -> List[str]:
  """The roles with snippets in both splits, sorted (TFF's order)."""
  return tff_sqlite.ids_in_both(path, SOURCE, *SPLITS)


def _parse(protos: Sequence[bytes], path: str) -> List[bytes]:
  """Serialized Examples -> their `snippets` byte strings."""
  tf = stack.import_tensorflow()
  try:
    parsed = tf.io.parse_example(tf.constant(list(protos), tf.string),
                                 {FEATURE: tf.io.FixedLenFeature((), tf.string)})
  except (tf.errors.InvalidArgumentError, ValueError) as e:
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise _not_shakespeare(path, f"an example does not parse as one {FEATURE!r} string: "
                           f"{reason[:200]}") from None
  return list(parsed[FEATURE].numpy())


def read_snippets(path: str, roles: Optional[Sequence[str]] = None
                  ) -> Dict[str, Dict[str, List[bytes]]]:
  """split name -> role -> its snippets (row order), in one pass over the
  table; `roles` limits the roles read (None: all)."""
  wanted = None if roles is None else set(roles)
  out: Dict[str, Dict[str, List[bytes]]] = {s: {} for s in SPLITS}
  for rows in tff_sqlite.example_rows(path, SOURCE, SPLITS, wanted, _BATCH):
    for (split, role, _), snippet in zip(rows, _parse([r[2] for r in rows], path)):
      out[split].setdefault(role, []).append(snippet)
  return out


def to_ids(snippet: bytes) -> np.ndarray:
  """A snippet's bytes as vocabulary ids (int32), without BOS/EOS."""
  return _IDS[np.frombuffer(snippet, np.uint8)]


def snippet_rows(snippets: Sequence[bytes], seq_len: int = SEQ_LEN) -> Arrays:
  """Snippets -> (inputs [n, seq_len], targets [n, seq_len]) int32: each
  snippet [BOS] + ids + [EOS], padded with PAD to a multiple of seq_len + 1,
  cut into rows of seq_len + 1; a row's input is its first seq_len ids, its
  target its last seq_len (the module docstring)."""
  width = seq_len + 1
  sizes = [len(s) + 2 for s in snippets]
  rows = np.zeros((sum(-(-n // width) for n in sizes), width), np.int32)
  flat = rows.reshape(-1)
  start = 0
  for snippet, n in zip(snippets, sizes):
    flat[start] = BOS
    flat[start + 1:start + n - 1] = to_ids(snippet)
    flat[start + n - 1] = EOS
    start += -(-n // width) * width
  return np.ascontiguousarray(rows[:, :-1]), np.ascontiguousarray(rows[:, 1:])


def load_database(path: str, num_clients: Optional[int] = None, seed: int = 0,
                  seq_len: int = SEQ_LEN) -> FederatedData:
  """TFF's federated Shakespeare file -> FederatedData, one client per role:
  x, y int32 [rows, seq_len] (the module docstring); num_classes VOCAB_SIZE.

  Args:
    path: the database (`shakespeare.sqlite`).
    num_clients: keep a seeded random subset of this many roles (None: all),
      drawn from TFF's role order; only those are read.
    seed: seed of that subset.
    seq_len: positions per example (80, TFF's and FedAvg's).
  """
  check_database(path)
  ids = role_ids(path)
  if not ids:
    raise _not_shakespeare(path, f"no role in both {' and '.join(SPLITS)}")
  if num_clients is not None and num_clients < len(ids):
    if num_clients < 1:
      raise DataError(f"--num_clients must be >= 1, got {num_clients}")
    pick = np.sort(np.random.default_rng(seed).choice(len(ids), num_clients, replace=False))
    ids = [ids[i] for i in pick]
  read = read_snippets(path, ids)
  train, test = {}, {}
  for cid in ids:
    train[cid] = snippet_rows(read["train"].get(cid, []), seq_len)
    test[cid] = snippet_rows(read["test"].get(cid, []), seq_len)
  return FederatedData(ids, train, test, VOCAB_SIZE, description=(
      f"Federated Shakespeare (TFF's {path}), {len(ids)} roles, sequences of {seq_len} "
      f"characters"))


def fetch_database() -> str:
  """The path of `shakespeare.sqlite`: from a cache, or downloaded (DownloadError)."""
  return download.fetch(download.SHAKESPEARE, check_database)
