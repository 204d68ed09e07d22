"""Run checkpoints: the whole state of a run, written atomically.

A checkpoint is `<run dir>/checkpoints/round-<NNNNNN>.pkl`: a pickle of plain
Python and numpy values (the driver's server state, per-client state, host
state such as group assignments and random generators, the sampling
generator, the metric rows so far and the best-round models). It is written
to a temporary file, fsynced and renamed, so a kill at any moment leaves
either the previous checkpoint or the new one; the last `keep` are kept.

Pickle runs code when loaded: load checkpoints of your own runs only.

Size: the server state (e.g. m + 1 models for FedGroup) plus whatever
per-client state the algorithm keeps (e.g. one momentum buffer per client that
has trained with `--client_momentum > 0 --client_state=persist`, so up to
N x model size), plus the best-round models.
"""

from __future__ import annotations

import os
import pickle
import re
from typing import Any, Dict, List, Optional, Tuple

DIRNAME = "checkpoints"
FORMAT = 1
_PATTERN = re.compile(r"^round-(\d{6,})\.pkl$")


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


def rounds(run_dir: str) -> List[int]:
  """The rounds of the checkpoints in `run_dir`, ascending."""
  try:
    names = os.listdir(directory(run_dir))
  except OSError:
    return []
  return sorted(int(m.group(1)) for m in map(_PATTERN.match, names) if m)


def save(run_dir: str, round_num: int, payload: Dict[str, Any], keep: int = 2) -> str:
  """Writes the checkpoint of `round_num`; removes all but the last `keep`."""
  os.makedirs(directory(run_dir), exist_ok=True)
  path = os.path.join(directory(run_dir), f"round-{round_num:06d}.pkl")
  atomic_write_bytes(path, pickle.dumps({"format": FORMAT, "round": round_num, **payload},
                                        protocol=pickle.HIGHEST_PROTOCOL))
  for old in rounds(run_dir)[:-keep]:
    try:
      os.remove(os.path.join(directory(run_dir), f"round-{old:06d}.pkl"))
    except OSError:
      pass
  return path


def load_latest(run_dir: str) -> Optional[Tuple[int, Dict[str, Any]]]:
  """(round, payload) of the newest readable checkpoint, or None."""
  for round_num in reversed(rounds(run_dir)):
    path = os.path.join(directory(run_dir), f"round-{round_num:06d}.pkl")
    try:
      with open(path, "rb") as f:
        payload = pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ValueError):
      continue  # a damaged file: fall back to the one before
    if payload.get("format") == FORMAT:
      return round_num, payload
  return None
