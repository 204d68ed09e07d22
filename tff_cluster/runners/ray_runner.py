"""The `ray` runner: the `local` runner's client loop sharded over Ray actors.

The clients are cut into `num_workers` contiguous shards (sizes differ by at
most one). Each shard lives in one Ray actor (`ShardHost`), which holds its
clients' training arrays and runs a `LocalRunner` over them on its own
device (a GPU when the actor's host has one; the actor asks Ray for one when
the cluster has GPUs). A round:

  1. the driver puts the server state in Ray's object store once; every
     actor with sampled clients gets the same reference;
  2. each actor runs the definition's broadcast and database on it and
     trains its sampled clients, in the order they were sampled, as the
     `local` runner does (the same batches: a client's shuffles are seeded by
     its index in the whole federation, not in its shard);
  3. each actor returns its clients' partial sum, their per-client results
     and new states, and nothing else;
  4. the driver adds the partial sums in shard order (a fixed order: the same
     numbers for the same seed) and runs the server update.

The definitions do not change. Parity tests hold this runner to `local`
(the sums are added in another order, so weights agree to float32 rounding,
assignments exactly).

Ray: `address=None` starts a Ray instance on this machine with
`num_workers` CPUs (stopped by `close()`); an address joins an existing
cluster (`ray start --head` on one host, `ray start --address=...` on the
others), which `close()` leaves running. When Ray is already initialised in
the process (a notebook, a test session), that instance is used and left
running. Actors are kept in a pool per Ray instance and reused by the next
runner of the process (their TensorFlow is imported once).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_cluster import local_training, stack
from tff_cluster.runners import local_runner
from tff_cluster.runners.base import RoundOutput, WorkerLost, check_keys

# How long a call to an unreachable `--ray_address` may take before it fails.
CONNECT_TIMEOUT_S = 30


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


def shard_bounds(num_clients: int, num_workers: int) -> List[int]:
  """Start offsets (and the end) of `num_workers` contiguous shards of
  `num_clients` clients whose sizes differ by at most one."""
  if num_workers < 1:
    raise ValueError(f"invalid number of Ray workers {num_workers}; valid: >= 1")
  if num_clients < 1:
    raise ValueError("no clients to shard; valid: data with at least one client")
  workers = min(num_workers, num_clients)
  base, extra = divmod(num_clients, workers)
  sizes = [base + (1 if w < extra else 0) for w in range(workers)]
  return [0, *np.cumsum(sizes).tolist()]


class _ShardData:
  """The part of a `FederatedData` a `LocalRunner` reads: the client ids
  and their training arrays."""

  def __init__(self, client_ids, train):
    self.client_ids = list(client_ids)
    self.train = train


class ShardHost:
  """A Ray actor's body: holds shards of clients of any number of runners
  (keyed by the runner's id) and trains their sampled clients."""

  def __init__(self):
    self._shards: Dict[str, Any] = {}

  def load(self, key: str, definition, model_fn, loss: str, client_ids, train,
           client_index, seed: int, jit: str) -> Dict[str, Any]:
    """Builds a `LocalRunner` over this shard; returns its description."""
    runner = local_runner.LocalRunner(definition, model_fn, loss,
                                      _ShardData(client_ids, train), seed, jit=jit,
                                      client_index=client_index)
    self._shards[key] = runner
    out = dict(runner.describe())
    out.update(pid=os.getpid(), host=_host_name())
    return out

  def drop(self, key: str) -> None:
    self._shards.pop(key, None)

  def train(self, key: str, mode: str, state, clients, round_num: int, work, lr: float,
            keys, client_states, pad_to: int):
    """(partial sum, per-client results, per-client new states or None,
    seconds spent training)."""
    start = time.perf_counter()
    out = self._shards[key].train_clients(mode, state, clients, round_num, work, lr,
                                          keys, client_states, pad_to=pad_to)
    return (*out, time.perf_counter() - start)


def _host_name() -> str:
  import socket
  return socket.gethostname()


class _Pool:
  """The actors of one Ray instance, reused by the runners of this process."""

  def __init__(self):
    self.actors: List[Any] = []
    self.owns_ray = False
    self.address: Optional[str] = None


_POOL: Optional[_Pool] = None


def _worker_env() -> Dict[str, str]:
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


def connect(num_workers: int, address: Optional[str]) -> _Pool:
  """The pool of this process's Ray instance, starting or joining Ray."""
  global _POOL
  ray = import_ray()
  if _POOL is not None and ray.is_initialized():
    if address is not None and _POOL.address not in (None, address):
      raise RayUnavailable(f"--ray_address={address}: this process is already connected "
                           f"to the Ray cluster at {_POOL.address}")
    return _POOL
  pool = _Pool()
  if not ray.is_initialized():
    if address is None:
      kwargs = init_kwargs(num_cpus=num_workers)
    else:
      check_reachable(address)
      kwargs = init_kwargs(address=address)
    try:
      ray.init(**kwargs)
    except (ConnectionError, TimeoutError, RuntimeError, ValueError) as e:
      raise RayUnavailable(f"--ray_address={address}: cannot connect to a Ray cluster "
                           f"({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                           ) from None
    pool.owns_ray = True
    pool.address = address
  _POOL = pool
  return pool


def init_kwargs(num_cpus: Optional[int] = None, address: Optional[str] = None
                ) -> Dict[str, Any]:
  """`ray.init`'s arguments for the ray runner: no dashboard, the actors'
  output shown here, and this process's import path given to the actors."""
  # Ray starts its workers at niceness 15 by default: the actors, which do the
  # training, would yield the CPU to everything else on the host.
  os.environ.setdefault("RAY_worker_niceness", "0")
  kwargs: Dict[str, Any] = dict(
      include_dashboard=False, configure_logging=False, log_to_driver=True,
      runtime_env={"env_vars": _worker_env()})
  if address is not None:
    kwargs["address"] = address
  else:
    kwargs["num_cpus"] = num_cpus
  return kwargs


def check_reachable(address: str) -> None:
  """Fails within CONNECT_TIMEOUT_S (RayUnavailable) when no Ray head answers
  at `address` (host:port; 'auto' and ray:// addresses are left to Ray)."""
  if address == "auto" or "://" in address:
    return
  import socket
  host, _, port = address.rpartition(":")
  if not host or not port.isdigit():
    raise RayUnavailable(f"invalid --ray_address={address}; valid: HOST:PORT of a Ray "
                         "head (ray start --head), or auto")
  try:
    with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
      pass
  except OSError as e:
    raise RayUnavailable(f"--ray_address={address}: no Ray cluster answers there "
                         f"({e.strerror or type(e).__name__})") from None


@contextlib.contextmanager
def session():
  """Stops this process's actors (and a Ray it started) on leaving."""
  try:
    yield
  finally:
    if _POOL is not None:
      shutdown()


def shutdown() -> None:
  """Stops this process's actors, and Ray when this module started it."""
  global _POOL
  pool, _POOL = _POOL, None
  if pool is None:
    return
  ray = import_ray()
  if not ray.is_initialized():
    return
  for actor in pool.actors:
    try:
      ray.kill(actor)
    except Exception:  # noqa: BLE001  (already gone)
      pass
  if pool.owns_ray:
    ray.shutdown()


def _actor_options(ray) -> Dict[str, Any]:
  """One CPU (and one GPU where the cluster has GPUs) per actor, the actors
  spread over the cluster's hosts (one per host while there are hosts to
  spare). TensorFlow's thread pools in an actor keep their defaults (sized to
  the host's cores, whatever Ray reserved)."""
  gpus = ray.cluster_resources().get("GPU", 0)
  return {"num_cpus": 1, "scheduling_strategy": "SPREAD", **({"num_gpus": 1} if gpus else {})}


class RayRunner(local_runner.ServerSide):
  """Runs a `Definition` with its clients sharded over Ray actors (see the
  module docstring). Same interface as `LocalRunner`.

  Args:
    definition, model_fn, loss, data, seed, jit: as `LocalRunner`.
    num_workers: the number of shards (actors); default: the machine's CPU
      count (capped at the number of clients).
    address: a Ray cluster's address, or None for a Ray instance started on
      this machine.
  """

  name = "ray"

  def __init__(self, definition, model_fn, loss: str, data, seed: int,
               jit: str = "auto", num_workers: Optional[int] = None,
               address: Optional[str] = None):
    ray = import_ray()
    self._ray = ray
    self.definition = definition
    self.num_workers = int(num_workers or os.cpu_count() or 1)
    self._pool = connect(self.num_workers, address)
    self.address = address
    num_clients = len(data.client_ids)
    self._bounds = shard_bounds(num_clients, self.num_workers)
    shards = len(self._bounds) - 1
    remote = ray.remote(ShardHost)
    cpus = int(ray.cluster_resources().get("CPU", 0))
    if len(self._pool.actors) < shards and cpus < shards:
      raise RayUnavailable(f"--ray_workers={shards}: the Ray cluster has {cpus} CPUs, one "
                           f"per actor is needed; valid: --ray_workers <= {cpus}")
    while len(self._pool.actors) < shards:
      self._pool.actors.append(remote.options(**_actor_options(ray)).remote())
    self._actors = self._pool.actors[:shards]
    self._key = f"{os.getpid()}-{id(self)}-{time.monotonic_ns()}"
    self._shard_of = np.zeros(num_clients, np.int64)
    loads = []
    for w in range(shards):
      lo, hi = self._bounds[w], self._bounds[w + 1]
      self._shard_of[lo:hi] = w
      ids = data.client_ids[lo:hi]
      loads.append(self._actors[w].load.remote(
          self._key, definition, model_fn, loss, ids, {c: data.train[c] for c in ids},
          list(range(lo, hi)), seed, jit))
    self._shard_info = self._get(loads)
    # The server side (broadcast, database, server update) on the driver.
    self.device = local_runner.choose_device()
    self._server: Dict[str, Any] = {}
    first = self._shard_info[0]
    self.jit = first["jit"]
    self.model_family = first["model_family"]
    self.exact_batches = first["exact_batches"]

  def _get(self, refs):
    """ray.get, with a lost actor named in one line (`WorkerLost`)."""
    ray = self._ray
    try:
      return ray.get(refs)
    except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError) as e:
      text = _lost_actor_text(e, self)
      # The pool's actors are not reused after a loss: the next runner of
      # this process starts fresh ones.
      for actor in self._pool.actors:
        try:
          ray.kill(actor)
        except Exception:  # noqa: BLE001  (already gone)
          pass
      self._pool.actors = []
      raise WorkerLost(text) from None

  def describe(self) -> Dict[str, Any]:
    """What `config.json` records about this runner: Ray, its actors and
    their client counts."""
    ray = self._ray
    return {"runner": self.name, "ray_version": ray.__version__,
            "ray_address": self.address or "local",
            "ray_workers": len(self._actors), "device": self.device, "jit": self.jit,
            "model_family": self.model_family, "exact_batches": self.exact_batches,
            "actors": [{"clients": self._bounds[w + 1] - self._bounds[w],
                        "first_client": self._bounds[w], "host": info["host"],
                        "pid": info["pid"], "device": info["device"]}
                       for w, info in enumerate(self._shard_info)]}


  def run(self, mode: str, state, clients: Sequence[int], round_num: int,
          work: local_training.LocalWork, lr: float,
          keys: Optional[Sequence[int]] = None,
          client_states: Optional[List[Any]] = None) -> RoundOutput:
    """One call of `mode` for `clients` (indices into the data's clients)."""
    clients = [int(k) for k in clients]
    num_keys = self.definition.num_keys(mode)
    if num_keys:
      check_keys(keys, num_keys, len(clients))
    # Each shard's sampled clients, in the order they were sampled.
    positions: Dict[int, List[int]] = {}
    for i, k in enumerate(clients):
      positions.setdefault(int(self._shard_of[k]), []).append(i)
    if not positions:  # no client: the first actor returns the zero sum
      positions[0] = []
    state_ref = self._ray.put(self.numpy_state(state))
    order = sorted(positions)
    calls = []
    for w in order:
      idx = positions[w]
      calls.append(self._actors[w].train.remote(
          self._key, mode, state_ref, [clients[i] - self._bounds[w] for i in idx], round_num,
          work, lr, None if not num_keys else [keys[i] for i in idx],
          None if client_states is None else [client_states[i] for i in idx],
          # The most clients this shard can get in a call of this size: one
          # compiled round per mode and round size, however they fall.
          min(len(clients), self._bounds[w + 1] - self._bounds[w])))
    parts = self._get(calls)
    # Each actor's training time in this call (the scale-out benchmark's
    # per-shard times).
    self.last_shard_seconds = {w: part[3] for w, part in zip(order, parts)}
    total = parts[0][0]
    for part in parts[1:]:
      total = tf.nest.map_structure(lambda a, b: np.asarray(a + b, a.dtype), total, part[0])
    results: List[Any] = [None] * len(clients)
    states: Optional[List[Any]] = None if client_states is None else [None] * len(clients)
    for w, (_, shard_results, shard_states, _) in zip(order, parts):
      for j, i in enumerate(positions[w]):
        results[i] = shard_results[j]
        if states is not None:
          states[i] = shard_states[j]
    new_state = self.server_update(mode, state, total)
    return RoundOutput(new_state, total, results, states)

  def close(self) -> None:
    """Frees this runner's shards in the actors (the actors stay pooled)."""
    for actor in getattr(self, "_actors", []):
      try:
        actor.drop.remote(self._key)
      except Exception:  # noqa: BLE001  (Ray already stopped)
        pass


def _lost_actor_text(error, runner: RayRunner) -> str:
  actor_id = getattr(error, "actor_id", None)
  for w, actor in enumerate(runner._actors):  # noqa: SLF001
    if actor_id is not None and actor._actor_id.hex() == actor_id:  # noqa: SLF001
      info = runner._shard_info[w] if hasattr(runner, "_shard_info") else {}  # noqa: SLF001
      return (f"Ray worker {w} (clients {runner._bounds[w]}..{runner._bounds[w + 1] - 1}"  # noqa: SLF001
              f", pid {info.get('pid', '?')} on {info.get('host', '?')}) was lost")
  return f"a Ray worker was lost ({type(error).__name__})"
