"""The `tff-cluster` command's entry point (`python -m tff_cluster`, and
`python run_experiment.py` in a checkout): a signal while the command's
modules load ends it with one line, then `tff_cluster.experiment.main` runs.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Optional


def _quiet_exit(signum, frame):
  del frame
  name = os.path.basename(sys.argv[0] or "tff-cluster")
  print(f"{name}: error: interrupted before the run started; nothing was written",
        file=sys.stderr)
  os._exit(128 + signum)


def main(argv0: Optional[str] = None) -> int:
  """Runs the command on `sys.argv` (its first item replaced by `argv0`).

  A run that returns ends the process at once (`os._exit`) once its output is
  flushed: everything the run opened is closed by then (files, TensorBoard,
  TFF's workers, a Ray session), and the interpreter's own teardown of
  TensorFlow took 0.86-0.93 s a process on 2 cores, for nothing. An error
  leaves as usual, and so does a run under a profiler or a coverage tool (a
  trace or profile function is set: they write their results at exit) or
  with TFF_CLUSTER_NO_FAST_EXIT=1 set."""
  # Until the run's own handlers are set, a signal (Ctrl-C during the
  # imports) ends the process with one line instead of a traceback.
  for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, _quiet_exit)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  from tff_cluster import experiment, timing
  code = experiment.main([argv0 or sys.argv[0], *sys.argv[1:]], timing.process_start())
  if (os.environ.get("TFF_CLUSTER_NO_FAST_EXIT") or sys.gettrace() is not None
      or sys.getprofile() is not None):
    return code
  import logging
  logging.shutdown()
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  os._exit(code)
