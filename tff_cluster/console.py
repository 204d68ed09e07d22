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
  """Runs the command on `sys.argv` (its first item replaced by `argv0`)."""
  # Until the run's own handlers are set, a signal (Ctrl-C during the
  # imports) ends the process with one line instead of a traceback.
  for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, _quiet_exit)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  from tff_cluster import experiment
  return experiment.main([argv0 or sys.argv[0], *sys.argv[1:]])
