"""`python -m tff_cluster.runners.tff.worker --port=P`: a TFF worker on this host.

Becomes TFF 0.87's `worker_binary` (exec: the process id stays the same, so
stopping it by that id with SIGTERM leaves nothing behind), listening on
port P of every interface, with no TLS and no authentication: start it only
on a trusted network, or reach it through an SSH tunnel. Runs see it with
`--runner=tff --tff_workers=HOST:P,...`. `--die_with_parent` asks Linux to
kill the worker when the process that started it dies (what
`tff_cluster.runners.tff.workers.local_workers` uses). Imports neither TensorFlow nor
TFF.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import signal
import sys


def binary_path() -> str:
  spec = importlib.util.find_spec("tensorflow_federated")
  if spec is None or spec.origin is None:
    sys.exit("error: tensorflow-federated is not installed; valid: the TFF stack "
             "(pip install 'tff-cluster[tff]')")
  return os.path.join(os.path.dirname(spec.origin), "data", "worker_binary")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--port", type=int, required=True)
  p.add_argument("--die_with_parent", action="store_true")
  args = p.parse_args(argv)
  if not 0 < args.port < 65536:
    sys.exit(f"error: invalid --port={args.port}; valid: 1..65535")
  binary = binary_path()
  if not os.path.isfile(binary):
    sys.exit(f"error: the TFF worker binary is missing at {binary}; valid: reinstall "
             "tensorflow-federated==0.87.0")
  if args.die_with_parent and sys.platform.startswith("linux"):
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  os.execv(binary, [binary, f"--port={args.port}", "--max_concurrent_computation_calls=-1"])
  return 1  # not reached


if __name__ == "__main__":
  sys.exit(main())
