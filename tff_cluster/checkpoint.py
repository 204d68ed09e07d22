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
kept.

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
import os
import re
import shutil
import zipfile
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

DIRNAME = "checkpoints"
FORMAT = 3  # 3: per-client states beside the archive; 2: inside it
READABLE_FORMATS = (2, 3)
SUFFIX = ".npz"
CLIENTS_SUFFIX = ".clients"
CLIENTS_PER_PART = 1024
_PATTERN = re.compile(r"^round-(\d{6,})\.npz$")
_CLIENTS = re.compile(r"^round-(\d{6,})\.clients$")
_LEGACY = re.compile(r"^round-(\d{6,})\.pkl$")  # FORMAT 1: pickles (tff-cluster 0.1)
_TREE = "__tree__"


class CheckpointError(ValueError):
  """A value a checkpoint cannot hold, or a file that is not a checkpoint."""


def directory(run_dir: str) -> str:
  return os.path.join(run_dir, DIRNAME)


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
  """Writes `payload` to `path` so that a crash leaves the old file or the new."""
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "wb") as f:
    f.write(payload)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
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
      bit_generator = getattr(np.random, state["bit_generator"])()
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
  """The value of `dumps` bytes (or a path / file object of them)."""
  source = io.BytesIO(payload) if isinstance(payload, (bytes, bytearray)) else payload
  with np.load(source, allow_pickle=False) as archive:
    if _TREE not in archive.files:
      raise CheckpointError("not a tff-cluster archive (no __tree__ entry)")
    tree = json.loads(archive[_TREE].tobytes().decode())
    return decode(tree, archive)


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
  that names it."""
  os.makedirs(directory(run_dir), exist_ok=True)
  path = path_of(run_dir, round_num)
  parts = count = 0
  if client_states is not None and len(client_states):
    final = clients_dir(run_dir, round_num)
    tmp = f"{final}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    chunk: Dict[Any, Any] = {}

    def flush():
      nonlocal parts, chunk
      with open(os.path.join(tmp, f"part-{parts:06d}{SUFFIX}"), "wb") as f:
        f.write(dumps(chunk))
        f.flush()
        os.fsync(f.fileno())
      parts += 1
      chunk = {}

    for key, value in client_states.items():
      chunk[key] = value
      count += 1
      if len(chunk) >= CLIENTS_PER_PART:
        flush()
    if chunk:
      flush()
    _fsync_dir(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    _fsync_dir(directory(run_dir))
  atomic_write_bytes(path, dumps({"format": FORMAT, "round": round_num,
                                  "client_state_parts": parts,
                                  "client_state_count": count, **payload}))
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

  def check(self) -> None:
    """Every part readable (a damaged one raises, as a damaged checkpoint)."""
    total = 0
    for i in range(self.parts):
      with np.load(os.path.join(self.path, f"part-{i:06d}{SUFFIX}"),
                   allow_pickle=False) as archive:
        if _TREE not in archive.files:
          raise CheckpointError(f"{self.path}: part {i} is not a tff-cluster archive")
        total += 1
    if total != self.parts:
      raise CheckpointError(f"{self.path}: {total} of {self.parts} parts")


def load_latest(run_dir: str) -> Optional[Tuple[int, Dict[str, Any]]]:
  """(round, payload) of the newest readable checkpoint, or None."""
  for round_num in reversed(rounds(run_dir)):
    try:
      payload = loads(path_of(run_dir, round_num))
    except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile,
            UnicodeDecodeError):
      continue  # a damaged file: fall back to the one before
    if not isinstance(payload, dict) or payload.get("format") not in READABLE_FORMATS:
      continue
    if payload.get("format") == FORMAT:
      parts = int(payload.pop("client_state_parts", 0))
      files = ClientStateFiles(clients_dir(run_dir, round_num), parts,
                               int(payload.pop("client_state_count", 0)))
      try:
        files.check()
      except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile,
              UnicodeDecodeError):
        continue  # its client states are damaged or missing: the one before
      if isinstance(payload.get("driver"), dict):
        payload["driver"]["client_states"] = files if parts else {}
    return round_num, payload
  return None
