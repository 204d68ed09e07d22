"""The run directory's lock: one writer at a time.

A run holds `RUN_DIR/.lock` while it writes (`RunLock`): an advisory
`flock` on the file, which the kernel drops when the process ends however it
ends (a kill -9 leaves no stale lock), and in the file the holder's pid, host
and start time for the message a second writer gets. A second run into the
same folder, `--overwrite` of it and `--resume` of it each refuse in one line
(`LockHeld`) while the lock is held. The file is removed when the run ends;
one a killed run left is taken over. Where the file system has no `flock`
(some network file systems), the file's pid and host decide: a lock of this
host whose pid is gone is stale.
"""

from __future__ import annotations

import datetime
import errno
import json
import os
import socket
from typing import Any, Dict, Optional

from tff_cluster.io import rundir

try:
  import fcntl
except ImportError:  # not POSIX
  fcntl = None

NAME = rundir.LOCK


class LockHeld(ValueError):
  """The run directory is being written by another run (one line)."""


def _holder_text(path: str) -> str:
  info = read(path) or {}
  who = f"pid {info.get('pid', '?')} on {info.get('host', '?')}"
  since = f" since {info['started']}" if info.get("started") else ""
  return who + since


def read(path: str) -> Optional[Dict[str, Any]]:
  """The holder recorded in the lock file `path` (None: none or unreadable)."""
  try:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
  except OSError:
    return None
  try:
    with os.fdopen(fd, "rb") as f:
      value = json.loads(f.read(4096).decode() or "null")
  except (OSError, ValueError, UnicodeDecodeError):
    return None
  return value if isinstance(value, dict) else None


def _message(run_dir: str, path: str) -> str:
  return (f"--output_dir={run_dir} is being written by another run ({_holder_text(path)}); "
          "valid: another --output_dir, or wait until that run ends (or stop it; a run "
          f"that was killed leaves no hold, and {path} can then be removed)")


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def _flock(fd: int, exclusive: bool) -> Optional[bool]:
  """Tries a non-blocking flock: True (taken), False (another holds it), None
  (this file system has none)."""
  if fcntl is None:
    return None
  try:
    fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
  except OSError as e:
    if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
      return False
    return None  # ENOLCK, EOPNOTSUPP, EINVAL: no flock here
  return True


def _holder_alive(path: str) -> bool:
  """Where there is no flock: whether the recorded holder is a live process
  of this host (another host's cannot be told: taken as alive)."""
  info = read(path) or {}
  if "pid" not in info:
    return False
  if info.get("host") != socket.gethostname():
    return True
  try:
    return _pid_alive(int(info["pid"]))
  except (TypeError, ValueError):
    return False


def check(run_dir: str) -> None:
  """Raises LockHeld when a writer holds `run_dir`'s lock (another process's,
  or another writer's in this one); no side effects."""
  path = os.path.join(run_dir, NAME)
  if not os.path.lexists(path):
    return
  if os.path.islink(path):
    raise LockHeld(f"--output_dir={run_dir}: {NAME} is a link, which no run writes; "
                   "valid: a run directory (remove the link)")
  try:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
  except OSError:
    return
  try:
    taken = _flock(fd, exclusive=False)
    if taken is False or (taken is None and _holder_alive(path)):
      raise LockHeld(_message(run_dir, path))
  finally:
    os.close(fd)  # (and a shared flock with it)


class RunLock:
  """Holds `run_dir`'s lock from `acquire()` to `release()`."""

  def __init__(self, run_dir: str):
    self.run_dir = run_dir
    self.path = os.path.join(run_dir, NAME)
    self._file = None

  def acquire(self) -> "RunLock":
    """Takes the lock (the folder must exist); LockHeld when another holds it."""
    if os.path.islink(self.path):
      check(self.run_dir)  # raises
    for _ in range(10):
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
      try:
        taken = _flock(fd, exclusive=True)
        if taken is False or (taken is None and _holder_alive(self.path)):
          raise LockHeld(_message(self.run_dir, self.path))
        # The file may have been removed (its holder ended) between the open
        # and the flock: then the lock is on a file no one sees.
        try:
          same = os.stat(self.path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
          same = False
      except BaseException:
        os.close(fd)
        raise
      if not same:
        os.close(fd)
        continue
      try:
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({
            "pid": os.getpid(), "host": socket.gethostname(),
            "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        }).encode())
      except BaseException:  # e.g. a full disk: no lock file is left behind
        os.close(fd)
        try:
          os.remove(self.path)
        except OSError:
          pass
        raise
      # A file object: a writer dropped without `release` lets go when collected.
      self._file = os.fdopen(fd, "r+b", buffering=0)
      return self
    raise LockHeld(_message(self.run_dir, self.path))

  def release(self) -> None:
    """Removes the lock file and lets go (idempotent)."""
    if self._file is None:
      return
    try:
      os.remove(self.path)
    except OSError:
      pass
    self._file.close()  # the flock goes with the descriptor
    self._file = None
