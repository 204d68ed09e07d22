"""A writer thread: a run's records written off the training loop's path.

`Background.submit(fn, *args)` queues a call for one thread that runs the
calls in order; the queue is bounded (`maxsize`), so a loop that outruns the
disk waits instead of holding rows without end. The first call that raises
stops the thread's work: the error is raised in the caller's thread at its
next `submit`, `drain` or `close` (the calls after it are dropped, as a
failed write leaves the run failing anyway). `drain()` returns once every
queued call has run: what must be on disk before a checkpoint names it.
A killed process loses at most the queued calls: rows written after the
last checkpoint, which a resumed run drops anyway.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Optional


class Background:
  """One thread running submitted calls in order (see the module's doc)."""

  def __init__(self, name: str = "tff-cluster-writer", maxsize: int = 64):
    self._queue: "queue.Queue[Optional[tuple]]" = queue.Queue(maxsize)
    self._error: Optional[BaseException] = None
    self._closed = False
    self._thread = threading.Thread(target=self._work, name=name, daemon=True)
    self._thread.start()

  def _work(self) -> None:
    while True:
      item = self._queue.get()
      try:
        if item is None:
          return
        if self._error is None:
          fn, args = item
          try:
            fn(*args)
          except BaseException as e:  # noqa: B036 - raised in the caller's thread
            self._error = e
      finally:
        self._queue.task_done()

  def _raise(self) -> None:
    error, self._error = self._error, None
    if error is not None:
      raise error

  def submit(self, fn: Callable[..., Any], *args: Any) -> None:
    """Queues `fn(*args)` (waits while the queue is full); raises the error
    of an earlier call, if one failed."""
    self._raise()
    if self._closed:
      raise RuntimeError("the writer thread is closed")
    self._queue.put((fn, args))

  def drain(self) -> None:
    """Waits until every queued call has run; raises a failed call's error."""
    if not self._closed:
      self._queue.join()
    self._raise()

  def close(self) -> None:
    """Runs what is queued, stops the thread; raises a failed call's error."""
    if not self._closed:
      self._closed = True
      self._queue.put(None)
      self._thread.join()
    self._raise()
