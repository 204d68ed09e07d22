"""Run checkpoints: the whole state of a run, written atomically, readable on any stack.

A checkpoint is `<run dir>/checkpoints/round-<NNNNNN>.npz`: one numpy archive
holding every array of the run state (the driver's server state, the
best-round models) as its own entry, and `__tree__`, the UTF-8 JSON of
everything else with each array replaced by its entry's name: the metric rows
so far, host state such as group assignments, and random generators as their
`bit_generator.state`. The per-client states (e.g. each client's momentum
buffer) are beside it, in `round-<NNNNNN>.clients/part-<i>.npz`, the same
format, `CLIENTS_PER_PART` clients per file, keyed by client: they are
written and read a part at a time (the `ray` runner's actors hand theirs over
in chunks and take them back on resume, however the clients are sharded
then). Nothing holds a pickle (read with `allow_pickle=False`), so a
checkpoint written under TensorFlow 2.14 / numpy 1 resumes under TensorFlow
2.21 / numpy 2 and back, and loading one runs no code. Checkpoints of format
2 (per-client states inside the archive) are still read.

Each file is written to a temporary name, fsynced and renamed (the client
states' directory before the archive that names it), so a kill at any moment
leaves either the previous checkpoint or the new one; the last `keep` are
kept. A write that fails (a full disk, any `OSError`) removes what it had
written and raises `WriteFailed`, one line naming the file, the reason and
the space it needed; the checkpoint before stays the latest. Temporary files a
kill left behind are removed by `remove_temporary` (at a run's next start or
resume).

A run's metric rows are not in the checkpoint (rewriting every row at every
checkpoint grows with the square of the rounds): the checkpoint names how many
rows of the run's `metrics.csv` and `metrics.jsonl` are its own and their
SHA-256 (`"rows_file"`), and `load_latest` reads them back from there.

`load_latest` reads what a resume will load before choosing a checkpoint: the
CRC-32 of every entry of the archive and of every client-state part, the
JSON tree and the arrays it names, the rows' digests. A damaged checkpoint is
skipped for the one before, with one warning line naming the damaged file.

Size: the server state (e.g. m + 1 models for FedGroup) plus whatever
per-client state the algorithm keeps (e.g. one momentum buffer per client that
has trained with `--client_momentum > 0 --client_state=persist`, so up to
N x model size), plus the best-round models.
"""

from __future__ import annotations

import collections
import io
import json
import math
import errno
import hashlib
import os
import re
import shutil
import sys
import zipfile
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from tff_cluster.io import rundir

# 4: the rows in the run's metrics files; 3: per-client states beside the
# archive; 2: inside it
FORMAT = 4
READABLE_FORMATS = (2, 3, 4)
SUFFIX = ".npz"
CLIENTS_SUFFIX = ".clients"
CLIENTS_PER_PART = 1024
_PATTERN = re.compile(r"^round-(\d{6,})\.npz$")
_CLIENTS = re.compile(r"^round-(\d{6,})\.clients$")
_LEGACY = re.compile(r"^round-(\d{6,})\.pkl$")  # FORMAT 1: pickles (tff-cluster 0.1)
_TREE = "__tree__"
METRICS_FILES = (rundir.METRICS_CSV, rundir.METRICS_JSONL)


class CheckpointError(ValueError):
  """A value a checkpoint cannot hold, or a file that is not a checkpoint."""


class WriteFailed(OSError):
  """A run's record or checkpoint that could not be written (one line: the
  file, the reason, the space it needed where known). What the write had
  begun is removed."""

  def __str__(self) -> str:
    return self.args[0] if self.args else "a write failed"


def write_failed(path: str, error: OSError, needed: Optional[int] = None) -> WriteFailed:
  """`error`, raised writing `path` (`needed` bytes), as a one-line `WriteFailed`."""
  if isinstance(error, WriteFailed):
    return error
  reason = error.strerror or str(error) or type(error).__name__
  space = ""
  if error.errno in (errno.ENOSPC, errno.EDQUOT):
    try:
      free = shutil.disk_usage(os.path.dirname(path) or ".").free
    except OSError:
      free = None
    parts = ([f"{_size(needed)} needed"] if needed is not None else []) + (
        [f"{_size(free)} free"] if free is not None else [])
    space = f" ({', '.join(parts)})" if parts else ""
  failed = WriteFailed(f"could not write {path}: {reason}{space}")
  failed.errno = error.errno
  return failed


def _size(n: int) -> str:
  for unit in ("bytes", "KB", "MB", "GB"):
    if n < 1024 or unit == "GB":
      return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
    n /= 1024
  return f"{n} bytes"


def _remove(path: str) -> None:
  """Removes a file or a directory tree, quietly."""
  if os.path.isdir(path) and not os.path.islink(path):
    shutil.rmtree(path, ignore_errors=True)
  else:
    try:
      os.remove(path)
    except OSError:
      pass


def remove_temporary(run_dir: str) -> List[str]:
  """Removes the temporary files and directories that a killed run left in
  `run_dir`, its checkpoints and its saved models (only names a run writes
  exactly: `rundir.is_temporary`), without following a link to a folder;
  returns their paths."""
  removed = []
  for rel in rundir.TEMPORARY_FOLDERS:
    folder = os.path.join(run_dir, rel) if rel else run_dir
    parts = rel.split("/") if rel else []
    if any(os.path.islink(os.path.join(run_dir, *parts[:i + 1])) for i in range(len(parts))):
      continue  # a link in the run's place: not the run's folder
    try:
      names = os.listdir(folder)
    except OSError:
      continue
    for name in names:
      if rundir.is_temporary(name, rel):
        _remove(os.path.join(folder, name))
        removed.append(os.path.join(folder, name))
  return removed


def directory(run_dir: str) -> str:
  return rundir.path_of(run_dir, rundir.CHECKPOINTS)


def _fsync_dir(path: str) -> None:
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:
    return
  try:
    os.fsync(fd)
  except OSError:
    pass
  finally:
    os.close(fd)


def atomic_write_bytes(path: str, payload: bytes) -> None:
  """Writes `payload` to `path` so that a crash leaves the old file or the new;
  a failed write leaves the old file and no temporary one, and raises
  `WriteFailed`."""
  tmp = f"{path}.tmp-{os.getpid()}"
  try:
    with open(tmp, "wb") as f:
      f.write(payload)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except OSError as e:
    _remove(tmp)
    raise write_failed(path, e, len(payload)) from None
  _fsync_dir(os.path.dirname(path) or ".")


# ---------------------------------------------------------------------------
# Values <-> (JSON tree, arrays). Tagged JSON objects carry what JSON lacks:
# {"__array__": name}, {"__tuple__": [...]}, {"__dict__": [[key, value], ...]}
# (keys that are not strings), {"__odict__": [...]}, {"__set__": [...]},
# {"__float__": "nan"|"inf"|"-inf"}, {"__generator__": state},
# {"__random_state__": state}. A plain JSON object is a dict with string keys.


def encode(value: Any, arrays: Dict[str, np.ndarray]) -> Any:
  """`value` as a JSON tree; its arrays (and numpy scalars) go into `arrays`."""
  if value is None or isinstance(value, (bool, str)):
    return value
  if isinstance(value, int) and not isinstance(value, np.integer):
    return value
  if isinstance(value, float) and not isinstance(value, np.floating):
    return value if math.isfinite(value) else {"__float__": repr(value)}
  if isinstance(value, (np.ndarray, np.generic)):
    array = np.asarray(value)
    if array.dtype.hasobject:
      raise CheckpointError(f"cannot checkpoint an object array (dtype {array.dtype})")
    name = f"a{len(arrays)}"
    arrays[name] = array
    return {"__array__" if isinstance(value, np.ndarray) else "__scalar__": name}
  if isinstance(value, np.random.Generator):
    return {"__generator__": encode(value.bit_generator.state, arrays)}
  if isinstance(value, np.random.RandomState):
    return {"__random_state__": encode(value.get_state(legacy=False), arrays)}
  if isinstance(value, collections.OrderedDict):
    return {"__odict__": [[encode(k, arrays), encode(v, arrays)] for k, v in value.items()]}
  if isinstance(value, dict):
    if all(isinstance(k, str) and not k.startswith("__") for k in value):
      return {k: encode(v, arrays) for k, v in value.items()}
    return {"__dict__": [[encode(k, arrays), encode(v, arrays)] for k, v in value.items()]}
  if isinstance(value, list):
    return [encode(v, arrays) for v in value]
  if type(value) is tuple:  # noqa: E721 - a namedtuple would come back a tuple
    return {"__tuple__": [encode(v, arrays) for v in value]}
  if isinstance(value, (set, frozenset)):
    return {"__set__": [encode(v, arrays) for v in sorted(value)]}
  if hasattr(value, "numpy") and callable(value.numpy):  # a tensor
    return encode(np.asarray(value.numpy()), arrays)
  raise CheckpointError(f"cannot checkpoint a {type(value).__module__}."
                        f"{type(value).__qualname__}")


BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")


def decode(tree: Any, arrays) -> Any:
  """The value `encode` turned into `tree` (arrays read from `arrays`)."""
  if isinstance(tree, list):
    return [decode(v, arrays) for v in tree]
  if not isinstance(tree, dict):
    return tree
  if len(tree) == 1:
    (tag, inner), = tree.items()
    if tag == "__array__":
      return np.asarray(arrays[inner])
    if tag == "__scalar__":
      return np.asarray(arrays[inner])[()]
    if tag == "__float__":
      return float(inner)
    if tag == "__tuple__":
      return tuple(decode(v, arrays) for v in inner)
    if tag == "__set__":
      return set(decode(v, arrays) for v in inner)
    if tag in ("__dict__", "__odict__"):
      pairs = [(_hashable(decode(k, arrays)), decode(v, arrays)) for k, v in inner]
      return collections.OrderedDict(pairs) if tag == "__odict__" else dict(pairs)
    if tag == "__generator__":
      state = decode(inner, arrays)
      # Only numpy's bit generators, by name: a file names nothing to call.
      name = state.get("bit_generator") if isinstance(state, dict) else None
      if name not in BIT_GENERATORS:
        raise CheckpointError(f"a generator's bit_generator is {name!r}; valid: "
                              f"{', '.join(BIT_GENERATORS)}")
      bit_generator = getattr(np.random, name)()
      bit_generator.state = state
      return np.random.Generator(bit_generator)
    if tag == "__random_state__":
      random_state = np.random.RandomState()
      random_state.set_state(decode(inner, arrays))
      return random_state
  return {k: decode(v, arrays) for k, v in tree.items()}


def _hashable(key):
  return key.item() if isinstance(key, np.generic) else key


def dumps(value: Any) -> bytes:
  """`value` as the bytes of an `.npz` archive (no pickle)."""
  arrays: Dict[str, np.ndarray] = {}
  tree = encode(value, arrays)
  text = json.dumps(tree, allow_nan=False, separators=(",", ":"))
  buffer = io.BytesIO()
  np.savez(buffer, **{_TREE: np.frombuffer(text.encode(), np.uint8)}, **arrays)
  return buffer.getvalue()


def loads(payload) -> Any:
  """The value of `dumps` bytes (or a path / file object of them).
  CheckpointError for what no `dumps` wrote: an array whose header claims
  more than its entry holds, a tree nested too deeply, a generator of
  another kind."""
  source = io.BytesIO(payload) if isinstance(payload, (bytes, bytearray)) else payload
  try:
    _check_array_sizes(source)
    with np.load(source, allow_pickle=False) as archive:
      if _TREE not in archive.files:
        raise CheckpointError("not a tff-cluster archive (no __tree__ entry)")
      tree = json.loads(archive[_TREE].tobytes().decode())
      return decode(tree, archive)
  except RecursionError:
    raise CheckpointError("not a tff-cluster archive (its tree is nested too deeply)") from None
  except MemoryError:
    raise CheckpointError("not a tff-cluster archive (an array larger than memory)") from None


def _check_array_sizes(source) -> None:
  """CheckpointError when an `.npy` entry's header claims more bytes than the
  entry holds (np.load would allocate what the header says first)."""
  try:
    archive = zipfile.ZipFile(source)
  except zipfile.BadZipFile:
    return  # np.load says what it is
  with archive:
    for info in archive.infolist():
      if not info.filename.endswith(".npy"):
        continue
      with archive.open(info) as f:
        try:
          version = np.lib.format.read_magic(f)
          shape, _, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                             else np.lib.format.read_array_header_2_0(f))
        except ValueError as e:
          raise CheckpointError(f"entry {info.filename}: not an array ({e})") from None
        header = f.tell()
      size = dtype.itemsize
      for n in shape:
        size *= int(n)
      if size > info.file_size - header:
        raise CheckpointError(f"entry {info.filename}: its header says {size:,} bytes, "
                              f"it holds {info.file_size - header:,}")
  if hasattr(source, "seek"):
    source.seek(0)


# ---------------------------------------------------------------------------
# Checkpoint files.


def rounds(run_dir: str) -> List[int]:
  """The rounds of the checkpoints in `run_dir`, ascending."""
  try:
    names = os.listdir(directory(run_dir))
  except OSError:
    return []
  return sorted(int(m.group(1)) for m in map(_PATTERN.match, names) if m)


def legacy_rounds(run_dir: str) -> List[int]:
  """Rounds of pickled checkpoints (FORMAT 1, written by tff-cluster 0.1),
  which this version does not read."""
  try:
    names = os.listdir(directory(run_dir))
  except OSError:
    return []
  return sorted(int(m.group(1)) for m in map(_LEGACY.match, names) if m)


def path_of(run_dir: str, round_num: int) -> str:
  return os.path.join(directory(run_dir), f"round-{round_num:06d}{SUFFIX}")


def clients_dir(run_dir: str, round_num: int) -> str:
  """Where the per-client states of round `round_num`'s checkpoint are."""
  return os.path.join(directory(run_dir), f"round-{round_num:06d}{CLIENTS_SUFFIX}")


def save(run_dir: str, round_num: int, payload: Dict[str, Any], keep: int = 2,
         client_states=None) -> str:
  """Writes the checkpoint of `round_num`; removes all but the last `keep`.

  `client_states` (anything with `items()` and `len()`: a dict, or states
  read back from workers chunk by chunk) go to `round-<NNNNNN>.clients/`,
  `CLIENTS_PER_PART` (key, state) entries per `part-<i>.npz` (no pickle), in
  the order `items()` gives them, keyed by the driver's keys (client
  indices): a resume puts each state wherever its client lives then.
  The directory is complete (written and renamed) before the checkpoint
  that names it. A write that fails raises `WriteFailed` and leaves the
  checkpoints as they were (nothing of this round, no temporary file)."""
  try:
    os.makedirs(directory(run_dir), exist_ok=True)
  except OSError as e:
    raise write_failed(directory(run_dir), e) from None
  path = path_of(run_dir, round_num)
  final = clients_dir(run_dir, round_num)
  parts = count = 0
  wrote_clients = False
  if client_states is not None and len(client_states):
    tmp = f"{final}.tmp-{os.getpid()}"
    _remove(tmp)
    chunk: Dict[Any, Any] = {}

    def flush():
      nonlocal parts, chunk
      part = os.path.join(tmp, f"part-{parts:06d}{SUFFIX}")
      data = dumps(chunk)
      try:
        with open(part, "wb") as f:
          f.write(data)
          f.flush()
          os.fsync(f.fileno())
      except OSError as e:  # named where it was going
        raise write_failed(os.path.join(final, os.path.basename(part)), e,
                           len(data)) from None
      parts += 1
      chunk = {}

    try:
      os.makedirs(tmp)
      for key, value in client_states.items():
        chunk[key] = value
        count += 1
        if len(chunk) >= CLIENTS_PER_PART:
          flush()
      if chunk:
        flush()
      _fsync_dir(tmp)
      _remove(final)
      os.replace(tmp, final)
    except BaseException as e:  # noqa: B036 - nothing half-written is left
      _remove(tmp)
      if isinstance(e, OSError):
        raise write_failed(final, e) from None
      raise
    _fsync_dir(directory(run_dir))
    wrote_clients = True
  try:
    atomic_write_bytes(path, dumps({"format": FORMAT, "round": round_num,
                                    "client_state_parts": parts,
                                    "client_state_count": count, **payload}))
  except WriteFailed:
    if wrote_clients and not os.path.exists(path):
      _remove(final)  # states no archive names
    raise
  kept = set(rounds(run_dir)[-keep:])
  for old in rounds(run_dir):
    if old not in kept:
      try:
        os.remove(path_of(run_dir, old))
      except OSError:
        pass
  for name in os.listdir(directory(run_dir)):  # the states of removed rounds
    m = _CLIENTS.match(name)
    if m and int(m.group(1)) not in kept:
      shutil.rmtree(os.path.join(directory(run_dir), name), ignore_errors=True)
  return path


class Damaged(CheckpointError):
  """A checkpoint file that does not hold what it should (one line naming it)."""


def _array_names(tree: Any, out: List[str]) -> List[str]:
  if isinstance(tree, list):
    for v in tree:
      _array_names(v, out)
  elif isinstance(tree, dict):
    if len(tree) == 1:
      (tag, inner), = tree.items()
      if tag in ("__array__", "__scalar__") and isinstance(inner, str):
        out.append(inner)
        return out
    for v in tree.values():
      _array_names(v, out)
  return out


_READ_ERRORS = (OSError, EOFError, ValueError, KeyError, TypeError, IndexError,
                AttributeError, RecursionError, MemoryError,
                zipfile.BadZipFile, UnicodeDecodeError, zipfile.LargeZipFile)


def check_archive(path: str, name: Optional[str] = None) -> Any:
  """The JSON tree of the archive at `path`, after checking the CRC-32 of
  every entry and that every array the tree names is there. Raises `Damaged`
  naming the file (`name`, default `path`) and what is wrong."""
  name = name or path
  try:
    with zipfile.ZipFile(path) as archive:
      bad = archive.testzip()
      if bad is not None:
        raise Damaged(f"{name}: entry {bad} fails its CRC-32 check")
      entries = {n[:-4] if n.endswith(".npy") else n for n in archive.namelist()}
      if _TREE not in entries:
        raise Damaged(f"{name}: not a tff-cluster archive (no {_TREE} entry)")
    _check_array_sizes(path)
    with np.load(path, allow_pickle=False) as archive:
      tree = json.loads(archive[_TREE].tobytes().decode())
  except Damaged:
    raise
  except FileNotFoundError:
    raise Damaged(f"{name}: missing") from None
  except _READ_ERRORS as e:
    raise Damaged(f"{name}: unreadable ({type(e).__name__}: {e})") from None
  missing = sorted(set(_array_names(tree, [])) - entries)
  if missing:
    raise Damaged(f"{name}: names arrays it does not hold ({', '.join(missing[:3])})")
  return tree


class ClientStateFiles:
  """The per-client states of a checkpoint (`save`'s `client_states`), read
  back part by part: `items()` yields (key, state) pairs, `len()` counts
  them."""

  def __init__(self, path: str, parts: int, count: int):
    self.path = path
    self.parts = parts
    self.count = count

  def __len__(self) -> int:
    return self.count

  def _part(self, i: int) -> Dict[Any, Any]:
    return loads(os.path.join(self.path, f"part-{i:06d}{SUFFIX}"))

  def items(self):
    for i in range(self.parts):
      yield from self._part(i).items()

  def check(self, name: Optional[str] = None) -> None:
    """Every part there, whole (the CRC-32 of each entry) and holding the
    client states it should; raises `Damaged` naming the first that is not."""
    name = name or self.path
    total = 0
    for i in range(self.parts):
      part = f"part-{i:06d}{SUFFIX}"
      tree = check_archive(os.path.join(self.path, part), f"{name}/{part}")
      if isinstance(tree, dict) and set(tree) == {"__dict__"}:
        entries = tree["__dict__"]
      elif isinstance(tree, dict) and not any(k.startswith("__") for k in tree):
        entries = tree
      else:
        raise Damaged(f"{name}/{part}: not a part of client states")
      total += len(entries)
    if total != self.count:
      raise Damaged(f"{name}: {total} client states of {self.count}")


def _read_lines(path: str, count: int) -> List[bytes]:
  lines = []
  with open(path, "rb") as f:
    for _ in range(count):
      line = f.readline()
      if not line.endswith(b"\n"):
        break
      lines.append(line)
  return lines


def rows_digest(csv_lines, jsonl_lines) -> Dict[str, str]:
  """The SHA-256 of a run's metrics.csv lines (header first) and metrics.jsonl
  lines, as a checkpoint records them."""
  out = {}
  for name, lines in zip(METRICS_FILES, (csv_lines, jsonl_lines)):
    digest = hashlib.sha256()
    for line in lines:
      digest.update(line)
    out[name] = digest.hexdigest()
  return out


def read_rows(run_dir: str, spec: Dict[str, Any]) -> List[Dict[str, Any]]:
  """The first `spec["count"]` rows of the run's metrics files, as the run
  held them: keys and values from metrics.jsonl, non-finite values (null
  there) from metrics.csv's `nan`/`inf`/`-inf` cells. Raises `Damaged` when
  the files' lines do not match the digests `spec` records."""
  import csv
  count = int(spec["count"])
  lines = {}
  for name, n in zip(METRICS_FILES, (count + 1, count)):
    path = os.path.join(run_dir, name)
    try:
      lines[name] = _read_lines(path, n)
    except OSError as e:
      raise Damaged(f"{path}: unreadable ({e.strerror or e})") from None
    if len(lines[name]) != n:
      raise Damaged(f"{path}: {max(len(lines[name]) - (name == 'metrics.csv'), 0)} "
                    f"rows of the checkpoint's {count}")
  digest = rows_digest(lines["metrics.csv"], lines["metrics.jsonl"])
  for name in METRICS_FILES:
    if digest[name] != spec.get(name):
      raise Damaged(f"{os.path.join(run_dir, name)}: its first {count} rows differ "
                    "from the ones the checkpoint recorded")
  try:
    cells = list(csv.reader([l.decode() for l in lines["metrics.csv"]]))
    header = cells[0]
    rows = []
    for line, csv_cells in zip(lines["metrics.jsonl"], cells[1:]):
      row = json.loads(line)
      for field in row.pop("nonfinite", []):
        if field in header and row.get(field) is None:
          row[field] = float(csv_cells[header.index(field)])
      rows.append(row)
  except _READ_ERRORS as e:
    raise Damaged(f"{os.path.join(run_dir, 'metrics.csv')}: unreadable rows "
                  f"({type(e).__name__}: {e})") from None
  return rows


# Server state keys renamed since a checkpoint was written: old name -> new.
# `buffer`: the server optimizer's state (FedAvg's family, IFCA, HypCluster),
# the same flat list under its new name.
RENAMED_STATE_KEYS = {"buffer": "server_opt_state"}


def _rename_server_state_keys(payload: Dict[str, Any]) -> None:
  """The driver's server state of an older checkpoint with its keys renamed
  (`RENAMED_STATE_KEYS`), in place, their order kept."""
  driver = payload.get("driver")
  state = driver.get("state") if isinstance(driver, dict) else None
  if isinstance(state, dict) and any(k in state for k in RENAMED_STATE_KEYS):
    renamed = [(RENAMED_STATE_KEYS.get(k, k), v) for k, v in state.items()]
    driver["state"] = type(state)(renamed) if isinstance(state, collections.OrderedDict) \
        else dict(renamed)


# Host-state keys of checkpoints written before the fields took their own
# names (the driver's attribute names of tff-cluster 0.1): old key -> field.
RENAMED_HOST_KEYS = {"_rng": "rng", "_summary": "summary", "_forced_rng": "forced_rng"}


def renamed_host_keys(host: Dict[str, Any]) -> Dict[str, Any]:
  """A checkpoint's host state with its old keys renamed (`RENAMED_HOST_KEYS`)."""
  return {RENAMED_HOST_KEYS.get(k, k): v for k, v in host.items()}


def _load_checked(run_dir: str, round_num: int) -> Dict[str, Any]:
  path = path_of(run_dir, round_num)
  name = os.path.relpath(path, run_dir)
  check_archive(path, name)
  try:
    payload = loads(path)
  except _READ_ERRORS as e:
    raise Damaged(f"{name}: unreadable ({type(e).__name__}: {e})") from None
  if not isinstance(payload, dict) or payload.get("format") not in READABLE_FORMATS:
    raise Damaged(f"{name}: not a checkpoint of a readable format "
                  f"({', '.join(map(str, READABLE_FORMATS))})")
  if "driver" in payload and not isinstance(payload["driver"], dict):
    raise Damaged(f"{name}: malformed driver state")
  if "sampling_rng" in payload and not isinstance(payload["sampling_rng"],
                                                   np.random.Generator):
    raise Damaged(f"{name}: malformed sampling_rng")
  if payload["format"] >= 3:
    parts = payload.pop("client_state_parts", 0)
    count = payload.pop("client_state_count", 0)
    if not isinstance(parts, int) or not isinstance(count, int):
      raise Damaged(f"{name}: malformed client_state_parts/client_state_count")
    files = ClientStateFiles(clients_dir(run_dir, round_num), parts, count)
    files.check(os.path.relpath(files.path, run_dir))
    if isinstance(payload.get("driver"), dict):
      payload["driver"]["client_states"] = files if parts else {}
  _rename_server_state_keys(payload)
  if isinstance(payload.get("driver"), dict) and isinstance(payload["driver"].get("host"), dict):
    payload["driver"]["host"] = renamed_host_keys(payload["driver"]["host"])
  if "rows_file" in payload:
    spec = payload.pop("rows_file")
    if not isinstance(spec, dict) or not isinstance(spec.get("count"), int):
      raise Damaged(f"{name}: malformed rows_file")
    payload["rows"] = read_rows(run_dir, spec)
  return payload


def load_latest(run_dir: str) -> Optional[Tuple[int, Dict[str, Any]]]:
  """(round, payload) of the newest complete checkpoint, or None.

  Everything a resume loads is read first (`check_archive` of the archive and
  of every client-state part, the rows' digests); a damaged checkpoint is
  skipped for the one before, and one warning line on stderr names what was
  damaged."""
  damaged = []
  found = None
  for round_num in reversed(rounds(run_dir)):
    try:
      found = round_num, _load_checked(run_dir, round_num)
      break
    except Damaged as e:
      damaged.append(str(e))
  if damaged:
    then = (f"resuming from the checkpoint of round {found[0]}" if found else
            "no complete checkpoint before it")
    print(f"warning: damaged checkpoint skipped: {'; '.join(damaged)}; {then}",
          file=sys.stderr)
  return found
