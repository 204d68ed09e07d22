"""Ray's set-up, without TensorFlow: whether Ray is installed, how a process
joins or starts it (`init_kwargs`, `check_reachable`) and what its workers
need of this process's environment. The `ray` runner's actors and the
sweeps' cells (`tff_cluster.sweep`) both start Ray through here.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, Optional

from tff_cluster import stack

# How long a call to an unreachable `--ray_address` may take before it fails.
CONNECT_TIMEOUT_S = 30
# Where a cluster of this machine alone (no `--ray_address`) listens.
LOOPBACK = "127.0.0.1"


class RayUnavailable(ValueError):
  """Ray cannot be used (not installed, the cluster cannot be reached, too
  few CPUs for the actors); the message is one line."""


def import_ray():
  """Ray, or one clear `RayUnavailable`."""
  try:
    import ray  # noqa: PLC0415  (an optional dependency)
  except ImportError:
    raise RayUnavailable(stack.RAY_MISSING) from None
  return ray


def loopback_only() -> bool:
  """Whether this process's network namespace has no interface but `lo`
  (read from /proc/self/net/dev, which is per namespace; /sys/class/net is
  not remounted by `unshare -n`). The tests and the scale-out benchmark run
  Ray only in such a namespace on a machine that has other interfaces."""
  try:
    with open("/proc/self/net/dev") as f:
      names = {line.split(":", 1)[0].strip() for line in f.readlines()[2:] if ":" in line}
  except OSError:
    return False
  return names <= {"lo"}


def worker_env() -> Dict[str, str]:
  """What an actor's process needs of this one's environment: the import
  path (a checkout's `tff_cluster` and task modules) and TF's settings."""
  env = {k: v for k, v in os.environ.items()
         if k.startswith(("TF_", "TFF_CLUSTER_")) or k in ("CUDA_VISIBLE_DEVICES",)}
  paths = [p for p in sys.path if p and os.path.isdir(p) and "site-packages" not in p
           and not p.startswith(sys.base_prefix)]
  if os.getcwd() not in paths:
    paths.insert(0, os.getcwd())
  env["PYTHONPATH"] = os.pathsep.join(paths)
  return env


def init_kwargs(num_cpus: Optional[int] = None, address: Optional[str] = None
                ) -> Dict[str, Any]:
  """`ray.init`'s arguments for the ray runner: no dashboard, the actors'
  output shown here, and this process's import path given to the actors."""
  # Ray starts its workers at niceness 15 by default: the actors, which do the
  # training, would yield the CPU to everything else on the host.
  os.environ.setdefault("RAY_worker_niceness", "0")
  kwargs: Dict[str, Any] = dict(
      include_dashboard=False, configure_logging=False, log_to_driver=True,
      runtime_env={"env_vars": worker_env()})
  if address is not None:
    kwargs["address"] = address
  else:
    # A new instance ("local") even where `ray.init()` with no address would
    # join another: the one named in the address file that a `ray start`, or
    # a test cluster killed before it stopped, left in Ray's temporary folder.
    kwargs["address"] = "local"
    kwargs["num_cpus"] = num_cpus
    # A cluster of this machine alone: its processes bind to the loopback
    # address, and none asks an outside host for this machine's address
    # (Ray's processes otherwise connect a socket towards 8.8.8.8 to find it;
    # the variable turns that off in every process Ray starts from here).
    kwargs["_node_ip_address"] = LOOPBACK
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
  return kwargs


def address_from_environment(address: Optional[str]) -> Optional[str]:
  """`address`, else Ray's RAY_ADDRESS where set (Ray's convention: a program
  started on a cluster, a Ray job's, joins it), else None (a Ray instance of
  this machine alone)."""
  return address if address is not None else (os.environ.get("RAY_ADDRESS") or None)


def given(address: str) -> str:
  """How the user gave `address`: the flag, or RAY_ADDRESS."""
  from_env = os.environ.get("RAY_ADDRESS") == address
  return f"RAY_ADDRESS={address}" if from_env else f"--ray_address={address}"


def check_reachable(address: str) -> None:
  """Fails within CONNECT_TIMEOUT_S (RayUnavailable) when no Ray head answers
  at `address` (host:port; 'auto' and ray:// addresses are left to Ray)."""
  if address == "auto" or "://" in address:
    return
  import socket
  host, _, port = address.rpartition(":")
  if not host or not port.isdigit():
    raise RayUnavailable(f"invalid {given(address)}; valid: HOST:PORT of a Ray "
                         "head (ray start --head), or auto")
  try:
    with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
      pass
  except OSError as e:
    raise RayUnavailable(f"{given(address)}: no Ray cluster answers there "
                         f"({e.strerror or type(e).__name__})") from None
