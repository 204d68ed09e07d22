"""Every file the federated tasks download: where from, how it is checked, where it is kept.

Files (kept under this name  <-  fetched from; checks):

* `emnist_all.sqlite` (femnist, its views, femnist_fedprox)  <-
  https://storage.googleapis.com/tff-datasets-public/emnist_all.sqlite.lzma,
  TFF's federated EMNIST (what `tff.simulation.datasets.emnist.load_data`
  fetches). No checksum is published (TFF's own downloader checks none), so:
  the body must have the length the server announces, the LZMA stream must
  decode to its end marker, and the result must open as a database with TFF's
  tables (`tff_cluster.data.emnist.check_database`).
* `shakespeare.sqlite` (shakespeare)  <-
  https://storage.googleapis.com/tff-datasets-public/shakespeare.sqlite.lzma,
  TFF's federated Shakespeare (what `tff.simulation.datasets.shakespeare.
  load_data` fetches). No checksum is published: checked as
  `emnist_all.sqlite` is, the database by
  `tff_cluster.data.shakespeare.check_database` (its tables, the
  `train`/`test` splits).
* `cifar100.sqlite` (cifar100_tff)  <-
  https://storage.googleapis.com/tff-datasets-public/cifar100.sqlite.lzma,
  TFF's federated CIFAR-100 (what `tff.simulation.datasets.cifar100.load_data`
  fetches). TFF checks no checksum; FedJAX, which reads the same file, records
  its size (153,019,920 bytes) and SHA-256 (`fedjax/datasets/cifar100.py`):
  both are checked, then the database (`tff_cluster.data.cifar100_tff`).
* `celeba.sqlite` (celeba)  <-
  https://storage.googleapis.com/tff-datasets-public/celeba.sqlite.lzma,
  TFF's federated CelebA (what `tff.simulation.datasets.celeba.load_data`
  fetches). No size or checksum is published: checked as `emnist_all.sqlite`
  is, the database by `tff_cluster.data.celeba`.
* `training.1600000.processed.noemoticon.csv` (sent140)  <-
  http://cs.stanford.edu/people/alecmgo/trainingandtestdata.zip, the
  Sentiment140 archive LEAF's `data/sent140/preprocess/get_data.sh` fetches:
  the archive's size (81,363,704 bytes) and SHA-256 as TensorFlow Datasets
  publishes them (`tensorflow_datasets/text/sentiment140/checksums.tsv`), then
  the member's CRC-32 while it is unzipped.
* `glove.6B.<d>d.txt`, d = 50, 100, 200 or 300 (sent140)  <-
  http://nlp.stanford.edu/data/glove.6B.zip, the GloVe release LEAF's
  `get_embs.sh` fetches. Stanford publishes no checksum: the announced length,
  the member's CRC-32 while it is unzipped, and a first line of a word and d
  numbers (`tff_cluster.data.leaf.check_glove`).

Cache: `$TFF_CLUSTER_DATA` (default `~/.cache/tff_cluster`). Files sit directly
in it, under the names above: a compressed download is kept decompressed, and
of a zip only the member a task reads is kept (under its own name; the archive
is deleted, so another GloVe dimension downloads glove.6B.zip again). A file
is written to a hidden `.<name>.<random>.part` beside its place and renamed
into place only when it is complete and checked, so a killed download never
leaves a file that looks whole (a `.part` file older than an hour is deleted
by the next fetch); a failed one leaves nothing, and a cache folder this fetch
created is removed again. A file already in TFF's cache (`~/.tff`) or Keras'
(`$KERAS_HOME` or `~/.keras`, under `datasets/`, or in the `<stem>_extracted/`
folder Keras 3 unzips into) is read where it is; an archive found there is
unzipped from there.

`$TFF_CLUSTER_DATA_MIRROR`, when set, is a base URL that replaces every
origin's directory (the same file names beneath it): air-gapped sites and
the tests serve the files from their own server (a `file://` folder works
too).

Bounds: a download stops at its published size where one is published
(Sentiment140), else at a stated maximum (`Remote.max_size`); what it
decompresses or unzips to is counted as it is written and stops at
`Remote.max_output`; the whole fetch of one file stops after `DEADLINE_S`
(besides `TIMEOUT_S` without a byte). The body is read as it arrives, so the
bar moves with every packet.

Any failure is a `DownloadError` (a `DataError`: one line, exit status 2 in
the CLI) naming the file, the URL and the folder to place the file in.
A progress bar (tqdm.auto: a widget in a notebook, text on a terminal) is
drawn on a terminal or in a notebook, not into a log file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.client
import lzma
import os
import socket
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from typing import Callable, List, Optional, Tuple

from tff_cluster.data.federated import DataError
from tff_cluster.progress import progress_bar

ENV_DATA = "TFF_CLUSTER_DATA"
ENV_MIRROR = "TFF_CLUSTER_DATA_MIRROR"
DEFAULT_ROOT = "~/.cache/tff_cluster"
TFF_CACHE = "~/.tff"  # tff.simulation.datasets' default cache_dir
TIMEOUT_S = 30.0  # no byte for this long: the fetch fails
DEADLINE_S = 2 * 3600.0  # one file's whole fetch (822 MB at 115 KB/s)
MiB, GiB = 1 << 20, 1 << 30
CHUNK = 1 << 20
STALE_PART_S = 3600.0

# The kept file opens as what its reader expects; raises DataError otherwise.
Check = Callable[[str], None]


class DownloadError(DataError):
  """A file could not be fetched or failed its checks. One line, naming the
  file, the URL and where to place the file by hand."""


@dataclasses.dataclass(frozen=True)
class Remote:
  """One file a task fetches.

  Attributes:
    name: the file kept in the cache (the decompressed file, or the zip member).
    origin: its URL; the last path component is the download's name.
    packing: "lzma" (decompressed while it downloads), "zip" (`name` is
      unzipped from it) or "plain".
    size: the download's published size in bytes, or None.
    sha256: the download's published SHA-256, or None.
    published_by: where `size` and `sha256` come from.
    max_size: the most bytes the download may have where no size is
      published (a stated bound above the file's size when it was added).
    max_output: the most bytes `name` may have once decompressed or unzipped.
  """
  name: str
  origin: str
  packing: str
  size: Optional[int] = None
  sha256: Optional[str] = None
  published_by: str = ""
  max_size: int = 2 * GiB
  max_output: int = 8 * GiB

  def size_bound(self) -> Tuple[int, str]:
    """The most bytes the download may have, and what says so."""
    if self.size is not None:
      return self.size, f"the size {self.published_by} publishes"
    return self.max_size, "the stated maximum for this file"

  @property
  def archive(self) -> str:
    """The download's file name (the origin's last path component)."""
    return urllib.parse.urlsplit(self.origin).path.rsplit("/", 1)[-1]

  def by_hand(self) -> str:
    """What a user does with the download to place `name` by hand."""
    if self.packing == "lzma":
      return f"decompress it (xz -d) and place {self.name}"
    if self.packing == "zip":
      return f"unzip {self.name} from it and place it"
    return f"place {self.name}"


EMNIST = Remote(
    name="emnist_all.sqlite",
    origin="https://storage.googleapis.com/tff-datasets-public/emnist_all.sqlite.lzma",
    packing="lzma", max_size=256 * MiB, max_output=6 * GiB)  # 171 MB -> 4.7 GB

# TFF publishes no size for it; a third-party downloader records 1,329,828
# bytes, and a database of TFF's counts (18,424 snippets) built from synthetic
# text is about 6 MB (benchmarks/shakespeare_full_round.py): bounds far above.
SHAKESPEARE = Remote(
    name="shakespeare.sqlite",
    origin="https://storage.googleapis.com/tff-datasets-public/shakespeare.sqlite.lzma",
    packing="lzma", max_size=32 * MiB, max_output=512 * MiB)

# The size and SHA-256 FedJAX records for TFF's file (google/fedjax
# fedjax/datasets/cifar100.py at 17ba8cf8a442df066685643e6fd4705e2be38d23, its
# _TFF_SQLITE_COMPRESSED_*). Decompressed: 60,000 examples of 3,072 int64
# pixels (about 5 KB each as protobuf varints), some 0.3 GB: bound 1 GiB.
CIFAR100 = Remote(
    name="cifar100.sqlite",
    origin="https://storage.googleapis.com/tff-datasets-public/cifar100.sqlite.lzma",
    packing="lzma", size=153_019_920,
    sha256="23d3916c9caa33395737ee560cc7cb77bbd05fc7b73647ee7be3a7e764172939",
    published_by="FedJAX's fedjax/datasets/cifar100.py", max_output=1 * GiB)

# No size is published for it. TFF's documentation: 200,288 examples, each in
# two split groups (split_by_clients_*, split_by_examples_*), an image of
# 84 x 84 x 3 int64 pixels (21,168 varints of one or two bytes) and 40 int64
# attributes: some 13-17 GB decompressed (estimated, not downloaded here):
# bounds 32 GiB decompressed, 16 GiB downloaded.
CELEBA = Remote(
    name="celeba.sqlite",
    origin="https://storage.googleapis.com/tff-datasets-public/celeba.sqlite.lzma",
    packing="lzma", max_size=16 * GiB, max_output=32 * GiB)

SENT140_CSV = Remote(
    name="training.1600000.processed.noemoticon.csv",
    origin="http://cs.stanford.edu/people/alecmgo/trainingandtestdata.zip",
    packing="zip", size=81_363_704,
    sha256="004a3772c8a7ff9bbfeb875880f47f0679d93fc63e5cf9cff72d54a8a6162e57",
    published_by="TensorFlow Datasets' sentiment140 checksums.tsv",
    max_output=512 * MiB)  # the CSV: 239 MB

GLOVE_ORIGIN = "http://nlp.stanford.edu/data/glove.6B.zip"
GLOVE_DIMS = (50, 100, 200, 300)


def glove(dim: int) -> Remote:
  """GloVe 6B vectors of dimension `dim` (one of GLOVE_DIMS), from glove.6B.zip."""
  if dim not in GLOVE_DIMS:
    raise DataError(f"no GloVe 6B file of dimension {dim}; valid: "
                    f"{', '.join(map(str, GLOVE_DIMS))}")
  # glove.6B.zip: 822 MB; its largest member (300-d) 1.04 GB.
  return Remote(name=f"glove.6B.{dim}d.txt", origin=GLOVE_ORIGIN, packing="zip",
                max_size=1 * GiB, max_output=3 * GiB // 2)


# ---------------------------------------------------------------------------
# Where files are.


def cache_root() -> str:
  """`$TFF_CLUSTER_DATA`, or ~/.cache/tff_cluster, with `~` expanded."""
  return os.path.abspath(os.path.expanduser(os.environ.get(ENV_DATA) or DEFAULT_ROOT))


def url(remote: Remote) -> str:
  """The origin, or the same file name under `$TFF_CLUSTER_DATA_MIRROR`."""
  mirror = os.environ.get(ENV_MIRROR)
  if not mirror:
    return remote.origin
  return mirror.rstrip("/") + "/" + urllib.parse.quote(remote.archive)


def other_caches(remote: Remote) -> List[str]:
  """Folders of TFF's and Keras' caches that may hold `remote`'s files."""
  keras = os.path.join(os.path.expanduser(os.environ.get("KERAS_HOME") or "~/.keras"),
                       "datasets")
  folders = [os.path.expanduser(TFF_CACHE), keras]
  if remote.packing == "zip":  # Keras 3's get_file(extract=True) unzips here
    folders.append(os.path.join(keras, remote.archive.split(".")[0] + "_extracted"))
  return folders


def find_cached(remote: Remote, root: Optional[str] = None,
                other: bool = True) -> Optional[str]:
  """The kept file in the cache root, TFF's or Keras' cache (`other`), or None."""
  root = root or cache_root()
  for folder in [root, *(other_caches(remote) if other else [])]:
    path = os.path.join(folder, remote.name)
    if os.path.isfile(path):
      return path
  return None


# ---------------------------------------------------------------------------
# Fetching.


def fetch(remote: Remote, check: Optional[Check] = None,
          root: Optional[str] = None, other: bool = True) -> str:
  """The path of `remote.name`: found in a cache, or downloaded, checked and
  kept in `root` (default `cache_root()`). `other=False`: TFF's and Keras'
  caches are not searched. Raises DownloadError (one line)."""
  root = os.path.abspath(os.path.expanduser(root)) if root else cache_root()
  found = find_cached(remote, root, other)
  if found is not None:
    return found
  archive = None
  if remote.packing == "zip" and other:
    archive = next((os.path.join(folder, remote.archive)
                    for folder in other_caches(remote)
                    if os.path.isfile(os.path.join(folder, remote.archive))), None)
  source = archive or url(remote)
  created = _make_folder(root, source, remote)
  final = os.path.join(root, remote.name)
  temps: List[str] = []
  try:
    _remove_stale_parts(root)
    part = _temp(root, remote.name, temps)
    if archive is not None:
      _check_archive(archive, remote, source, root)
      _unzip(archive, remote, part, source, root)
    elif remote.packing == "zip":
      zipped = _temp(root, remote.archive, temps)
      _download(source, remote, zipped, None, root)
      _unzip(zipped, remote, part, source, root)
      os.remove(zipped)
    else:
      _download(source, remote, part,
                lzma.LZMADecompressor() if remote.packing == "lzma" else None, root)
    if check is not None:
      try:
        check(part)
      except DataError as e:
        raise _failure(remote, source, root, f"the file does not open: {e}") from None
    os.chmod(part, 0o666 & ~_umask())  # mkstemp's 0600 -> what a plain write gives
    os.replace(part, final)
    temps.remove(part)
  except BaseException as e:
    for path in temps:
      _remove(path)
    for folder in created:  # deepest first
      try:
        os.rmdir(folder)
      except OSError:
        break
    if isinstance(e, OSError):  # the cache folder: read-only, full, gone
      raise _failure(remote, source, root, f"{type(e).__name__}: {e.strerror or e}") from None
    raise
  return final


def _failure(remote: Remote, source: str, root: str, reason: str) -> DownloadError:
  reason = " ".join(str(reason).split())  # one line
  return DownloadError(
      f"could not fetch {remote.name} from {source} ({reason}); download "
      f"{remote.archive} where there is network, {remote.by_hand()} in {root}, "
      f"or set ${ENV_MIRROR} to a server holding {remote.archive}")


def _make_folder(root: str, source: str, remote: Remote) -> List[str]:
  # Creates `root`; returns the folders it created, deepest first.
  missing = []
  folder = root
  while not os.path.isdir(folder):
    missing.append(folder)
    parent = os.path.dirname(folder)
    if parent == folder:
      break
    folder = parent
  try:
    os.makedirs(root, exist_ok=True)
  except OSError as e:
    raise _failure(remote, source, root,
                   f"cannot create the cache folder: {e.strerror or e}") from None
  return missing


def _temp(root: str, name: str, temps: List[str]) -> str:
  fd, path = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=root)
  os.close(fd)
  temps.append(path)
  return path


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


def _remove(path: str) -> None:
  try:
    os.remove(path)
  except OSError:
    pass


def _remove_stale_parts(root: str) -> None:
  # `.part` files of a killed fetch; a running one writes every second.
  now = time.time()
  for name in os.listdir(root):
    path = os.path.join(root, name)
    if name.startswith(".") and name.endswith(".part"):
      try:
        if now - os.path.getmtime(path) > STALE_PART_S:
          os.remove(path)
      except OSError:
        pass


def _progress(total: Optional[int], name: str):
  return progress_bar(total=total, desc=f"fetching {name}", unit="B", unit_scale=True,
                      unit_divisor=1024, dynamic_ncols=True, disable=None)


class _Bounded:
  """Writes to `out`, failing once more than `bound` bytes were written."""

  def __init__(self, out, bound: int, fail: Callable[[str], Exception], what: str):
    self.out, self.bound, self.fail, self.what, self.written = out, bound, fail, what, 0

  def write(self, data: bytes) -> None:
    self.written += len(data)
    if self.written > self.bound:
      raise self.fail(f"{self.what} is over {self.bound:,} bytes, the stated maximum; "
                      "the file is not the one expected")
    self.out.write(data)


def _download(source: str, remote: Remote, path: str,
              decompressor: Optional["lzma.LZMADecompressor"], root: str) -> None:
  """Streams `source` into `path` (decompressed when `decompressor` is given),
  checking the announced length, the size bound, the published size and
  SHA-256, the decompressed size and the deadline as it goes."""
  digest = hashlib.sha256()
  got = 0
  announced = None
  bar = None
  finished = False
  bound, bound_source = remote.size_bound()
  deadline = time.monotonic() + DEADLINE_S

  def fail(reason: str) -> DownloadError:
    return _failure(remote, source, root, reason)

  try:
    with urllib.request.urlopen(source, timeout=TIMEOUT_S) as response, \
        open(path, "wb") as raw_out:
      out = _Bounded(raw_out, remote.max_output, fail, f"{remote.name} decompressed")
      length = response.headers.get("Content-Length")
      announced = int(length) if length and length.isdigit() else None
      if announced is not None and announced > bound:
        raise fail(f"the server announces {announced:,} bytes, over the {bound:,} of "
                   f"{bound_source}")
      bar = _progress(announced or remote.size, remote.archive)
      read = getattr(response, "read1", response.read)  # what has arrived, up to CHUNK
      while True:
        chunk = read(CHUNK)
        if not chunk:
          break
        got += len(chunk)
        if got > bound:
          raise fail(f"the server sent more than the {bound:,} bytes of {bound_source}")
        if time.monotonic() > deadline:
          raise fail(f"{got:,} bytes after {DEADLINE_S:g} s, the most one file's fetch "
                     "may take")
        digest.update(chunk)
        if decompressor is None:
          out.write(chunk)
        else:  # at most CHUNK bytes out per call: a small bomb cannot fill memory
          data = chunk
          while True:
            out.write(decompressor.decompress(data, max_length=CHUNK))
            data = b""
            if decompressor.eof or decompressor.needs_input:
              break
        bar.update(len(chunk))
    finished = announced is None or got == announced
  except DownloadError:
    raise
  except urllib.error.HTTPError as e:
    raise fail(f"HTTP {e.code} {e.reason}") from None
  except urllib.error.URLError as e:
    raise fail(f"URLError: {e.reason}") from None
  except http.client.IncompleteRead as e:
    raise fail(f"the body ended after {got + len(e.partial):,} of the "
               f"{announced or 0:,} bytes announced") from None
  except (socket.timeout, TimeoutError):
    raise fail(f"no data for {TIMEOUT_S:g} s") from None
  except lzma.LZMAError as e:
    raise fail(f"not an LZMA stream: {e}") from None
  except (http.client.HTTPException, ConnectionError) as e:
    raise fail(f"{type(e).__name__}: {e}") from None
  except OSError as e:  # writing: disk full, permissions
    raise fail(f"{type(e).__name__}: {e.strerror or e}") from None
  finally:
    if bar is not None:
      bar.leave = finished  # on failure the error line stands alone
      bar.close()
  if announced is not None and got != announced:
    raise fail(f"the body ended after {got:,} of the {announced:,} bytes announced")
  _check_digest(remote, source, root, got, digest.hexdigest())
  if decompressor is not None and not decompressor.eof:
    raise fail("the LZMA stream ends before its end marker")


def _check_digest(remote: Remote, source: str, root: str, size: int, sha256: str):
  if remote.size is not None and size != remote.size:
    raise _failure(remote, source, root, f"{size:,} bytes, not the {remote.size:,} "
                   f"of {remote.published_by}")
  if remote.sha256 is not None and sha256 != remote.sha256:
    raise _failure(remote, source, root, f"SHA-256 {sha256[:16]}... is not "
                   f"{remote.sha256[:16]}... of {remote.published_by}")


def _check_archive(archive: str, remote: Remote, source: str, root: str) -> None:
  # An archive found in another cache gets the download's size and SHA-256 checks.
  if remote.size is None and remote.sha256 is None:
    return
  digest = hashlib.sha256()
  with open(archive, "rb") as f:
    for chunk in iter(lambda: f.read(CHUNK), b""):
      digest.update(chunk)
  _check_digest(remote, source, root, os.path.getsize(archive), digest.hexdigest())


def _unzip(archive: str, remote: Remote, path: str, source: str, root: str) -> None:
  """Writes the member named `remote.name` (at any depth) of `archive` to
  `path`; zipfile checks its CRC-32 when the member has been read."""
  try:
    with zipfile.ZipFile(archive) as z:
      members = [m for m in z.namelist()
                 if m.rsplit("/", 1)[-1] == remote.name and not m.endswith("/")]
      if not members:
        raise _failure(remote, source, root,
                       f"{remote.archive} holds no {remote.name}")
      info = z.getinfo(members[0])
      if info.file_size > remote.max_output:
        raise _failure(remote, source, root,
                       f"{remote.name} in {remote.archive} says it has {info.file_size:,} "
                       f"bytes, over the stated maximum of {remote.max_output:,}")
      with z.open(info) as member, open(path, "wb") as raw_out:
        out = _Bounded(raw_out, remote.max_output,
                       lambda reason: _failure(remote, source, root, reason),
                       f"{remote.name} unzipped")
        for chunk in iter(lambda: member.read(CHUNK), b""):
          out.write(chunk)
  except DownloadError:
    raise
  except (zipfile.BadZipFile, zlib.error, EOFError) as e:
    raise _failure(remote, source, root, f"not a complete zip archive: {e}") from None
  except OSError as e:
    raise _failure(remote, source, root, f"{type(e).__name__}: {e.strerror or e}") from None
