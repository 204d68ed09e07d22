"""The one client-data container every task returns.

A `FederatedData` holds each client's train and test arrays in memory (numpy),
in a fixed client order, plus each client's ground-truth cluster when the
partition defines one. `tff_cluster.data.client_data.train_client_data(data)`
and `test_client_data(data)` give the same data as
`tff.simulation.datasets.ClientData` for TFF pipelines; the algorithms read the
arrays directly to build their per-round datasets.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import stat
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tff_cluster.data import compact

Arrays = Tuple[np.ndarray, np.ndarray]  # (x, y)


class DataError(ValueError):
  """Bad or missing input data. The message is one line meant for the user:
  line breaks in it (from text quoted out of a file or an underlying error)
  are joined into one line."""

  def __init__(self, message: Any = "", *args):
    text = str(message)
    if "\n" in text or "\r" in text:
      text = " ".join(part.strip() for part in text.splitlines() if part.strip())
    super().__init__(text, *args)


@dataclasses.dataclass
class FederatedData:
  """Per-client train/test arrays.

  Attributes:
    client_ids: client ids, in the order every other per-client array uses.
    train: client id -> (x, y) training arrays.
    test: client id -> (x, y) test arrays (same ids as `train`).
    num_classes: number of labels (2 for binary tasks).
    true_clusters: int array aligned with `client_ids` (ground-truth cluster of
      each client), or None when the partition defines none.
    description: one line on where the data came from (provenance).
      A client whose training arrays are empty is test-only (`test_only()`):
      rounds never sample it, and it is tested with the model of lowest loss
      on its own test data.
    client_count_setting: the task setting that decided how many clients
      there are (e.g. "--task_arg=min_tweets=5"), named by the CLI when too
      few remain; None when only the data decides.
    public: (x, y) a public i.i.d. set held by the server (pFedMo's
      representation model trains on it), disjoint from the clients' data;
      None when the task defines none.
  """
  client_ids: List[str]
  train: Dict[str, Arrays]
  test: Dict[str, Arrays]
  num_classes: int
  true_clusters: Optional[np.ndarray] = None
  description: str = ""
  client_count_setting: Optional[str] = None
  public: Optional[Arrays] = None

  def __post_init__(self):
    if set(self.train) != set(self.client_ids) or set(self.test) != set(
        self.client_ids):
      raise DataError("train, test and client_ids must name the same clients")
    for split_name, split in (("train", self.train), ("test", self.test)):
      for cid, (x, y) in split.items():
        if len(x) != len(y):
          raise DataError(
              f"client {cid!r} {split_name}: {len(x)} inputs but {len(y)} labels")
        check_finite(x, f"client {cid!r} {split_name} inputs")
        check_finite(y, f"client {cid!r} {split_name} labels")
    if self.true_clusters is not None:
      self.true_clusters = np.asarray(self.true_clusters, dtype=np.int64)
      if self.true_clusters.shape != (len(self.client_ids),):
        raise DataError("true_clusters must have one entry per client")

  @property
  def num_clients(self) -> int:
    return len(self.client_ids)

  def training_clients(self) -> np.ndarray:
    """Indices of the clients with training data (the ones a round may sample)."""
    return np.flatnonzero(self.num_train_samples() > 0)

  @property
  def num_training_clients(self) -> int:
    return int((self.num_train_samples() > 0).sum())

  def example_input(self):
    """(one example's shape, dtype name) of the training inputs, read from the
    first client that has any; None when no client has training data."""
    for c in self.client_ids:
      x = np.asarray(self.train[c][0])
      if len(x):
        return tuple(x.shape[1:]), x.dtype.name
    return None

  def test_only(self) -> np.ndarray:
    """Bool per client: True for a test-only client (no training data: e.g.
    the rotated tasks' test clients, which pick a model by their own test
    loss and are never trained)."""
    return self.num_train_samples() == 0

  def num_train_samples(self) -> np.ndarray:
    return np.array([len(self.train[c][1]) for c in self.client_ids], np.int64)

  def num_test_samples(self) -> np.ndarray:
    return np.array([len(self.test[c][1]) for c in self.client_ids], np.int64)

  def subset(self, client_ids: Sequence[str]) -> "FederatedData":
    index = {c: i for i, c in enumerate(self.client_ids)}
    clusters = None
    if self.true_clusters is not None:
      clusters = self.true_clusters[[index[c] for c in client_ids]]
    return FederatedData(list(client_ids), {c: self.train[c] for c in client_ids},
                         {c: self.test[c] for c in client_ids}, self.num_classes,
                         clusters, self.description, public=self.public)


def packed(data: FederatedData) -> FederatedData:
  """`data` with each split's inputs as adjoining views of one aligned buffer
  in client order (`compact.pack`): the `local` runner then trains on that
  buffer itself, where it would otherwise hold a second copy of every
  client's training rows. The same values; `data`'s arrays are not changed."""
  ids = list(data.client_ids)
  splits = []
  for split in (data.train, data.test):
    xs = compact.pack([split[c][0] for c in ids])
    splits.append({c: (x, split[c][1]) for c, x in zip(ids, xs)})
  return dataclasses.replace(data, train=splits[0], test=splits[1])


def release_free_memory() -> None:
  """Hands memory the process has freed back to the system (glibc's
  `malloc_trim`), where a loader's intermediate arrays would otherwise stay
  in its resident size (e.g. 590 MB after FEMNIST's 3,400 writers are read
  and packed). Nothing where the C library has no such call."""
  import ctypes  # deferred: only where it runs
  import gc
  gc.collect()
  try:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
  except (OSError, AttributeError):
    pass


MAX_FILE_BYTES = 16 << 30  # a data file's stated maximum (emnist_all.sqlite: 4.7 GB)


def open_data_file(path: str, mode: str = "rb", max_bytes: int = MAX_FILE_BYTES,
                   expected: str = "a data file", **kwargs):
  """Opens a data file a user handed over, refusing (DataError, one line)
  what is not a regular file (a FIFO, which would block the read for ever,
  a device such as /dev/zero, which never ends; a link is followed to what
  it names) and a file over `max_bytes`. `mode` and `kwargs` as `open`'s."""
  kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
           (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
           (stat.S_ISDIR, "a directory"))

  def check(st) -> None:
    if not stat.S_ISREG(st.st_mode):
      kind = next((name for test, name in kinds if test(st.st_mode)), "not a regular file")
      raise DataError(f"{path}: {kind}, not a file; expected {expected}")
    if st.st_size > max_bytes:
      raise DataError(f"{path}: {st.st_size:,} bytes, over the {max_bytes:,} a data file "
                      f"may have; expected {expected}")

  try:
    check(os.stat(path))
    # O_NONBLOCK: a FIFO put in its place after the check cannot block the open.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
  except OSError as e:
    raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
  try:
    check(os.fstat(fd))
    os.set_blocking(fd, True)
    return open(fd, mode, **kwargs)
  except BaseException:
    os.close(fd)
    raise


def fingerprint(data) -> str:
  """A short hash of which clients a federation has and how many training
  and test samples each: what `--resume` compares with the run's to refuse
  resuming on other data (`FederatedData` or `LazyFederatedData`)."""
  payload = json.dumps([list(map(str, data.client_ids)),
                        [int(n) for n in data.num_train_samples()],
                        [int(n) for n in data.num_test_samples()]])
  return hashlib.sha256(payload.encode()).hexdigest()[:16]


def check_finite(values, what: str) -> None:
  """DataError (one line) when the float array `values` holds NaN or an
  infinity: a model's ReLU maps NaN to 0, so such data trains and scores
  without an error and its numbers mean nothing."""
  if compact.is_coded(values):  # its values are its table's
    values = values.table
  array = np.asarray(values)
  if array.dtype.kind in "fc" and array.size and not np.isfinite(array).all():
    bad = int((~np.isfinite(array)).sum())
    raise DataError(f"{what} hold {bad} NaN or infinite value(s); valid: finite numbers "
                    "(check the data files)")


@dataclasses.dataclass
class LazyFederatedData:
  """A federation described by its catalogue, its clients' arrays made on demand.

  What the host of a run needs of every client is small: its id, its numbers
  of training and test samples and its true cluster. `load(lo, hi)` makes the
  `FederatedData` of clients lo..hi-1 (each client's arrays depend on the
  client only, not on which clients are made together), so the `ray`
  runner's actors each make their own shard and the host holds no client
  arrays; `materialize()` makes them all (the `local` and `tff` runners).

  Attributes:
    client_ids, num_classes, true_clusters, description,
      client_count_setting: as `FederatedData`'s.
    train_counts, test_counts: each client's number of training / test samples.
    loader: `loader(lo, hi)` -> the `FederatedData` of clients lo..hi-1, with
      exactly the counts above (picklable: it travels to the actors).
  """
  client_ids: List[str]
  train_counts: np.ndarray
  test_counts: np.ndarray
  num_classes: int
  loader: Callable[[int, int], FederatedData]
  true_clusters: Optional[np.ndarray] = None
  description: str = ""
  client_count_setting: Optional[str] = None
  public = None

  def __post_init__(self):
    n = len(self.client_ids)
    self.train_counts = np.asarray(self.train_counts, np.int64)
    self.test_counts = np.asarray(self.test_counts, np.int64)
    if self.train_counts.shape != (n,) or self.test_counts.shape != (n,):
      raise DataError("train_counts and test_counts must have one entry per client")
    if self.true_clusters is not None:
      self.true_clusters = np.asarray(self.true_clusters, dtype=np.int64)
      if self.true_clusters.shape != (n,):
        raise DataError("true_clusters must have one entry per client")

  @property
  def num_clients(self) -> int:
    return len(self.client_ids)

  def num_train_samples(self) -> np.ndarray:
    return self.train_counts.copy()

  def num_test_samples(self) -> np.ndarray:
    return self.test_counts.copy()

  def training_clients(self) -> np.ndarray:
    return np.flatnonzero(self.train_counts > 0)

  @property
  def num_training_clients(self) -> int:
    return int((self.train_counts > 0).sum())

  def test_only(self) -> np.ndarray:
    return self.train_counts == 0

  @property
  def train(self):
    raise DataError("this federation's client arrays are made on demand "
                    "(LazyFederatedData): use load(lo, hi) or materialize()")

  test = train

  def shard_loader(self, lo: int, hi: int) -> Callable[[], FederatedData]:
    """A picklable `load(lo, hi)` carrying only that shard's catalogue."""
    return functools.partial(
        _load_checked, self.loader, lo, hi, list(self.client_ids[lo:hi]),
        self.train_counts[lo:hi], self.test_counts[lo:hi],
        None if self.true_clusters is None else self.true_clusters[lo:hi])

  def load(self, lo: int, hi: int) -> FederatedData:
    """Clients lo..hi-1 (their arrays made now), checked against the catalogue."""
    return self.shard_loader(lo, hi)()

  def materialize(self) -> FederatedData:
    """Every client's arrays, as one `FederatedData`."""
    whole = self.load(0, self.num_clients)
    whole.description = self.description
    whole.client_count_setting = self.client_count_setting
    if whole.public is None:
      whole.public = self.public
    return whole


def _load_checked(loader, lo: int, hi: int, client_ids, train_counts, test_counts,
                  true_clusters) -> FederatedData:
  shard = loader(lo, hi)
  if (list(shard.client_ids) != list(client_ids)
      or not np.array_equal(shard.num_train_samples(), train_counts)
      or not np.array_equal(shard.num_test_samples(), test_counts)):
    raise DataError(f"the loader's clients {lo}..{hi - 1} differ from the catalogue")
  shard.true_clusters = true_clusters
  return shard


def reloading(data: FederatedData, load: Callable[[], Any]) -> LazyFederatedData:
  """`data` as a catalogue whose shards `load()` makes again where they are
  needed: for a task read from files (or partitioned as a whole), `load()`
  rebuilds the whole federation (deterministic: same files, same seed) and
  keeps clients lo..hi-1, their arrays copied out of any larger array so the
  rest is freed. The caller drops `data`; the catalogue keeps the counts, the
  true clusters and the (small) public set."""
  lazy = LazyFederatedData(
      client_ids=list(data.client_ids), train_counts=data.num_train_samples(),
      test_counts=data.num_test_samples(), num_classes=data.num_classes,
      loader=functools.partial(_reloaded_shard, load), true_clusters=data.true_clusters,
      description=data.description,
      client_count_setting=getattr(data, "client_count_setting", None))
  lazy.public = data.public
  return lazy


def _reloaded_shard(load, lo: int, hi: int) -> FederatedData:
  whole = materialize(load())
  ids = list(whole.client_ids[lo:hi])
  shard = packed(FederatedData(ids, {c: whole.train[c] for c in ids},
                               {c: whole.test[c] for c in ids}, whole.num_classes,
                               description=whole.description))
  del whole
  release_free_memory()  # the rest of the federation, read to make the shard
  return shard


def materialize(data):
  """`data` with every client's arrays in memory (a `FederatedData` as is)."""
  return data.materialize() if isinstance(data, LazyFederatedData) else data


def split_counts(n: int, train_fraction: float = 0.9) -> Tuple[int, int]:
  """(train, test) sizes `split_train_test` gives a client of n samples."""
  n_train = int(train_fraction * n)
  if n >= 2:
    n_train = min(max(n_train, 1), n - 1)
  return n_train, n - n_train


def split_train_test(x: np.ndarray, y: np.ndarray, rng: np.random.Generator,
                     train_fraction: float = 0.9) -> Tuple[Arrays, Arrays]:
  """Shuffles one client's samples and splits them train/test (LEAF: 90/10).

  The training share is `int(train_fraction * n)`, moved so that each side
  gets at least one sample when n >= 2.
  """
  n = len(y)
  order = rng.permutation(n)
  n_train = int(train_fraction * n)
  if n >= 2:
    n_train = min(max(n_train, 1), n - 1)
  tr, te = order[:n_train], order[n_train:]
  return (x[tr], y[tr]), (x[te], y[te])
