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
runner of the process (their TensorFlow is imported once). Starting Ray keeps
the process's stop-signal handlers (`interrupts.handlers_kept`), so SIGTERM,
SIGINT and SIGHUP stop a `ray` run as they stop a `local` one.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import os
import signal
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_cluster import interrupts, stack
from tff_cluster.learning import evaluation
from tff_cluster.learning import schedule
from tff_cluster.data.federated import FederatedData, LazyFederatedData
from tff_cluster.runners import local_runner
from tff_cluster.runners.ray_setup import (  # noqa: F401  (re-exported)
    CONNECT_TIMEOUT_S, RayUnavailable, address_from_environment, check_reachable, given, import_ray,
    init_kwargs, loopback_only)
from tff_cluster.runners.base import (ClientStateStore, RoundOutput, WorkerLost, check_keys,
                                      client_summary, combine_clients, to_numpy)

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


class _Shard:
  """One runner's shard in an actor: its clients' data, a `LocalRunner` over
  them, evaluators made on first use, and the per-client states it holds
  (keyed as the driver keys them), with the snapshots the driver took."""

  def __init__(self, runner, data, model_fn, loss: str):
    self.runner = runner
    self.data = data
    self.model_fn = model_fn
    self.loss = loss
    self.evaluators: Dict[str, Any] = {}
    self.states: Dict[int, Any] = {}
    self.snapshots: "collections.OrderedDict[int, Dict[int, Any]]" = collections.OrderedDict()

  def evaluator(self, split: str):
    if split not in self.evaluators:
      self.evaluators[split] = evaluation.Evaluator(self.model_fn, self.loss, self.data,
                                                    split=split)
    return self.evaluators[split]


class ShardHost:
  """A Ray actor's body: holds shards of clients of any number of runners
  (keyed by the runner's id) and trains, evaluates and keeps the states of
  their clients."""

  def __init__(self):
    self._shards: Dict[str, _Shard] = {}

  def load(self, key: str, definition, model_fn, loss: str, make_data,
           client_index, seed: int, jit: str,
           client_batching: str = "auto", chunk=None) -> Dict[str, Any]:
    """Builds a `LocalRunner` over this shard (`make_data()`: its clients'
    `FederatedData`, arrays given or made here); returns its description."""
    data = make_data()
    runner = local_runner.LocalRunner(definition, model_fn, loss, data, seed, jit=jit,
                                      client_index=client_index,
                                      client_batching=client_batching, chunk=chunk)
    self._shards[key] = _Shard(runner, data, model_fn, loss)
    out = dict(runner.describe())
    out.update(pid=os.getpid(), host=_host_name(), node=_node_id(), memory=_rss_bytes())
    return out

  def drop(self, key: str) -> None:
    self._shards.pop(key, None)

  def train(self, key: str, mode: str, state, clients, round_num: int, work, lr: float,
            keys, client_states, pad_to: int, state_keys=None):
    """(partial sum, per-client results, per-client new states or None,
    seconds spent training). With `state_keys`, a None in `client_states` is
    the state this actor holds under that key, and the new states are kept
    under them."""
    start = time.perf_counter()
    shard = self._shards[key]
    if state_keys is not None:
      client_states = [shard.states[s] if c is None else c
                       for c, s in zip(client_states, state_keys)]
    out = shard.runner.train_clients(mode, state, clients, round_num, work, lr,
                                     keys, client_states, pad_to=pad_to)
    if state_keys is not None:
      shard.states.update(zip(state_keys, out[2]))
    return (*out, time.perf_counter() - start)

  def evaluate(self, key: str, split: str, weights, client_model):
    """This shard's per-client test (`split`) sums with `client_model` (its
    clients' rows of the `evaluation.Deployment`): correct, count, loss sum,
    macro-F1 and the model each was tested with."""
    result = self._shards[key].evaluator(split).evaluate(weights, client_model)
    return (result.per_client_correct, result.per_client_count,
            result.per_client_loss_sum, result.per_client_f1,
            np.asarray(result.client_model))

  def mean_losses(self, key: str, split: str, weights, clients=None):
    return self._shards[key].evaluator(split).mean_losses(weights, clients)

  def summaries(self, key: str, fn, clients, split: str):
    """`fn(x, y)` of each of this shard's `clients` (indices in the shard)."""
    data = self._shards[key].data
    return [client_summary(data, fn, int(k), split) for k in clients]

  # -- per-client states ---------------------------------------------------------

  def get_states(self, key: str, state_keys, token=None):
    shard = self._shards[key]
    source = shard.states if token is None else shard.snapshots[token]
    return [source[s] for s in state_keys]

  def put_states(self, key: str, items) -> None:
    self._shards[key].states.update(items)

  def delete_states(self, key: str, state_keys) -> None:
    states = self._shards[key].states
    for s in state_keys:
      states.pop(s, None)

  def snapshot_states(self, key: str, token: int, keep: int) -> None:
    """Keeps the states now under `token` (references: states are never
    changed in place); the `keep` latest snapshots are kept."""
    snapshots = self._shards[key].snapshots
    snapshots[token] = dict(self._shards[key].states)
    while len(snapshots) > keep:
      snapshots.popitem(last=False)

  def restore_states(self, key: str, token: int) -> bool:
    shard = self._shards[key]
    if token not in shard.snapshots:
      return False
    shard.states = dict(shard.snapshots[token])
    return True

  def memory(self) -> int:
    return _rss_bytes()


def _rss_bytes() -> int:
  """This process's resident memory (bytes), from /proc (0 where unknown)."""
  try:
    with open("/proc/self/statm") as f:
      return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
  except (OSError, ValueError, IndexError):
    return 0


def _host_name() -> str:
  import socket
  return socket.gethostname()


def _node_id() -> str:
  """The Ray node this actor runs on (one host may hold several)."""
  return import_ray().get_runtime_context().get_node_id()


class _Pool:
  """The actors of one Ray instance, reused by the runners of this process."""

  def __init__(self):
    self.actors: List[Any] = []
    self.owns_ray = False
    self.address: Optional[str] = None


_POOL: Optional[_Pool] = None


def connect(num_workers: int, address: Optional[str]) -> _Pool:
  """The pool of this process's Ray instance, starting or joining Ray."""
  global _POOL
  ray = import_ray()
  address = address_from_environment(address)
  if _POOL is not None and ray.is_initialized():
    if address is not None and _POOL.address not in (None, address):
      raise RayUnavailable(f"{given(address)}: this process is already connected "
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
      with _run_handlers_kept(ray, defer=address is None):
        ray.init(**kwargs)
    except SystemExit as e:
      if isinstance(e.code, int) and e.code > 128:  # the run's own handler
        raise
      # A handler of Ray's (one `_run_handlers_kept` could not keep out) took
      # a SIGTERM: it exits with 1 or 15; closed as the run's handler closes one.
      interrupts.note(signal.SIGTERM)
      raise _signal_exit(signal.SIGTERM) from None
    except (ConnectionError, TimeoutError, RuntimeError, ValueError) as e:
      what = ("cannot start a Ray instance on this machine" if address is None
              else f"{given(address)}: cannot connect to a Ray cluster")
      raise RayUnavailable(f"{what} "
                           f"({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                           ) from None
    pool.owns_ray = True
    pool.address = address
    atexit.register(_shutdown_pool, pool)  # a run that stops before `session()`
  _POOL = pool
  if pool.owns_ray and interrupts.received() is not None:  # noted while Ray started
    shutdown()  # Ray first, then the run
    raise _signal_exit(interrupts.received())
  return pool


def _signal_exit(signum: int) -> BaseException:
  """What the run's handler raises for stop signal `signum`: KeyboardInterrupt
  for SIGINT, else SystemExit(128 + signum)."""
  return KeyboardInterrupt() if signum == signal.SIGINT else SystemExit(128 + signum)


@contextlib.contextmanager
def _run_handlers_kept(ray, defer: bool):
  """Keeps the run's stop-signal handlers in force while `ray.init` runs.

  `ray.init` installs Python SIGTERM handlers of Ray's (one kills the
  processes Ray has started so far, then exits with 1) and its C++ core a
  fatal-signal handler on SIGTERM, which aborted a run's SIGTERM (exit 134, a
  stack dump). Ray's Python handlers are not installed here (its
  `set_sigterm_handler` does nothing meanwhile), and the run's handlers are
  put back over the C++ one afterwards. With `defer` (Ray started on this
  machine), a stop signal is only noted while Ray starts (`interrupts`): a
  Ray stopped half-way left its agent processes running (measured), so
  `connect` stops the started Ray, then the run."""
  utils = getattr(getattr(ray, "_private", None), "utils", None)
  original = getattr(utils, "set_sigterm_handler", None)
  with contextlib.ExitStack() as kept:
    kept.enter_context(interrupts.handlers_kept())
    if defer:
      kept.enter_context(interrupts.deferred())
    if original is not None:
      utils.set_sigterm_handler = lambda handler: None
      kept.callback(setattr, utils, "set_sigterm_handler", original)
    yield


def _shutdown_pool(pool: _Pool) -> None:
  """At exit: stops `pool`'s actors and Ray if the run did not (`session`)."""
  if _POOL is pool:
    shutdown()


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
    definition, model_fn, loss, data, seed, jit, client_batching, chunk: as `LocalRunner`.
    num_workers: the number of shards (actors); default: the machine's CPU
      count (capped at the number of clients).
    address: a Ray cluster's address, or None for a Ray instance started on
      this machine.
  """

  name = "ray"

  def __init__(self, definition, model_fn, loss: str, data, seed: int,
               jit: str = "auto", num_workers: Optional[int] = None,
               address: Optional[str] = None, client_batching: str = "auto",
               chunk: Optional[int] = None):
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
      if isinstance(data, LazyFederatedData):  # each actor makes its own clients
        make_data = data.shard_loader(lo, hi)
      else:
        make_data = functools.partial(_given, data.subset(data.client_ids[lo:hi]))
      loads.append(self._actors[w].load.remote(
          self._key, definition, model_fn, loss, make_data, list(range(lo, hi)), seed, jit,
          client_batching, chunk))
    self._shard_info = self._get(loads)
    self._num_clients = num_clients
    self._train_counts = data.num_train_samples()
    self._test_counts = data.num_test_samples()
    # The server side (broadcast, database, server update) on the driver.
    self.device = local_runner.choose_device()
    self._server: Dict[str, Any] = {}
    first = self._shard_info[0]
    self.jit = first["jit"]
    self.client_batching = first["client_batching"]
    self.chunk = first.get("chunk")
    self.model_family = first["model_family"]
    self.exact_batches = first["exact_batches"]

  def _get(self, refs):
    """ray.get, with a lost actor named in one line (`WorkerLost`) and a stop
    signal's exception kept (`_signal_exit`)."""
    ray = self._ray
    try:
      return ray.get(refs)
    except SystemExit:
      # A stop signal's handler that raises inside ray.get: Ray turns its
      # SystemExit(128 + signum) into SystemExit(1) (measured), which would end
      # the run with no line; the handler noted the signal.
      if interrupts.received() is None:
        raise
      raise _signal_exit(interrupts.received()) from None
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
            "ray_workers": len(self._actors),
            # the distinct Ray nodes the actors run on (each actor's `node` below)
            "ray_nodes": len({info.get("node") for info in self._shard_info}),
            "device": self.device, "jit": self.jit,
            "client_batching": self.client_batching,
            **({"chunk": self.chunk} if self.chunk else {}), "model_family": self.model_family, "exact_batches": self.exact_batches,
            "actors": [{"clients": self._bounds[w + 1] - self._bounds[w],
                        "first_client": self._bounds[w], "host": info["host"],
                        "node": info.get("node"),
                        "pid": info["pid"], "device": info["device"],
                        # resident bytes after making its clients
                        "memory": info.get("memory")}
                       for w, info in enumerate(self._shard_info)]}


  # -- evaluation and per-client states in the actors -----------------------------

  def make_evaluator(self, split: str = "test") -> "ShardedEvaluator":
    """An `Evaluator` of the whole federation whose work runs in the actors,
    each on its own clients."""
    return ShardedEvaluator(self, split)

  def client_summaries(self, fn, clients, split: str = "train"):
    """`Runner.client_summaries`, each actor on its own clients."""
    clients = [int(k) for k in clients]
    positions: Dict[int, List[int]] = {}
    for i, k in enumerate(clients):
      positions.setdefault(int(self._shard_of[k]), []).append(i)
    order = sorted(positions)
    parts = self._get([self._actors[w].summaries.remote(
        self._key, fn, [clients[i] - self._bounds[w] for i in positions[w]], split)
        for w in order])
    out: List[Any] = [None] * len(clients)
    for w, part in zip(order, parts):
      for i, value in zip(positions[w], part):
        out[i] = value
    return out

  def client_store(self) -> "ActorClientStates":
    """Where the driver's per-client states live: with the actor that owns
    each client (the driver keeps only which keys exist)."""
    return ActorClientStates(self)

  def shard_of_key(self, state_key: int) -> int:
    """The actor holding state key `state_key` (client `key mod N`: a
    driver may keep several states per client, e.g. an ensemble's members)."""
    return int(self._shard_of[int(state_key) % self._num_clients])

  def memory(self) -> List[int]:
    """Each actor's resident memory now (bytes)."""
    return self._get([actor.memory.remote() for actor in self._actors])

  def run(self, mode: str, state, clients: Sequence[int], round_num: int,
          work: schedule.LocalWork, lr: float,
          keys: Optional[Sequence[int]] = None,
          client_states: Optional[List[Any]] = None,
          state_keys: Optional[Sequence[int]] = None) -> RoundOutput:
    """One call of `mode` for `clients` (indices into the data's clients).
    With `state_keys` (one per client), a None in `client_states` is the
    state the client's actor holds under that key, and the actors keep the
    new states under those keys (`client_store`)."""
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
          min(len(clients), self._bounds[w + 1] - self._bounds[w]),
          None if state_keys is None else [int(state_keys[i]) for i in idx]))
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
    total, results = combine_clients(self.definition, mode, total, results)
    new_state = self.server_update(mode, state, total)
    return RoundOutput(new_state, total, results, states)

  def close(self) -> None:
    """Frees this runner's shards in the actors (the actors stay pooled)."""
    for actor in getattr(self, "_actors", []):
      try:
        actor.drop.remote(self._key)
      except Exception:  # noqa: BLE001  (Ray already stopped)
        pass


def _given(data: FederatedData) -> FederatedData:
  return data


class ShardedEvaluator:
  """`evaluation.Evaluator`'s interface over the ray runner's actors: each
  actor evaluates its own clients (every choice a client's test makes is
  its own) and returns per-client sums; the client weights of the averaged
  metrics are the whole federation's."""

  def __init__(self, runner: RayRunner, split: str):
    if split not in ("test", "train"):
      raise ValueError(f"invalid split {split!r}; valid: test, train")
    self._runner = runner
    self._split = split
    counts = runner._test_counts if split == "test" else runner._train_counts  # noqa: SLF001
    self._counts = np.asarray(counts, np.int64)
    self._weight = evaluation.client_weights(runner._train_counts, self._counts)  # noqa: SLF001

  def _per_shard(self, method: str, weights, client_model=None):
    r = self._runner
    ref = r._ray.put([[np.asarray(a) for a in w] for w in weights]  # noqa: SLF001
                     if method == "evaluate" else [np.asarray(a) for a in weights])
    calls = []
    for w, actor in enumerate(r._actors):  # noqa: SLF001
      lo, hi = r._bounds[w], r._bounds[w + 1]  # noqa: SLF001
      if method == "evaluate":
        part = client_model.rows(lo, hi)
        calls.append(actor.evaluate.remote(r._key, self._split, ref, part))  # noqa: SLF001
      else:
        calls.append(actor.mean_losses.remote(r._key, self._split, ref))  # noqa: SLF001
    return r._get(calls)  # noqa: SLF001

  def evaluate(self, weights, client_model) -> evaluation.EvalResult:
    parts = self._per_shard("evaluate", weights, evaluation.deployment(client_model))
    correct, count, loss_sum, f1, chosen = (np.concatenate(a) for a in zip(*parts))
    total = count.sum()
    return evaluation.EvalResult(float(correct.sum() / total), float(loss_sum.sum() / total),
                                 correct, count, loss_sum, client_model=chosen,
                                 per_client_f1=f1, client_weight=self._weight.copy())

  def mean_losses(self, weights, clients=None) -> np.ndarray:
    """Each client's mean loss under `weights` (`Evaluator.mean_losses`);
    `clients`: only these, each asked of the actor that holds it."""
    if clients is None:
      return np.concatenate(self._per_shard("mean_losses", weights))
    r = self._runner
    clients = np.asarray(clients, np.int64)
    ref = r._ray.put([np.asarray(a) for a in weights])  # noqa: SLF001
    calls, places = [], []
    for w, actor in enumerate(r._actors):  # noqa: SLF001
      lo, hi = r._bounds[w], r._bounds[w + 1]  # noqa: SLF001
      mine = np.flatnonzero((clients >= lo) & (clients < hi))
      if len(mine):
        calls.append(actor.mean_losses.remote(r._key, self._split, ref,  # noqa: SLF001
                                              clients[mine] - lo))
        places.append(mine)
    out = np.full(len(clients), np.nan)
    for mine, losses in zip(places, r._get(calls)):  # noqa: SLF001
      out[mine] = losses
    return out


class ActorClientStates(ClientStateStore):
  """The driver's per-client states (`Driver.client_states`) held by the
  actors: each state lives with the actor that owns its client; the driver
  keeps the set of keys. Reading or writing an entry is a call to its actor
  (`update` and `items_in_chunks` batch them per actor); the runner's
  training calls use and keep the states in place (`lend` passes
  `RayRunner.run` the `state_keys`). `snapshot()` is cheap (each actor keeps
  references), and the `SNAPSHOTS` latest snapshots can be restored or read
  back."""

  SNAPSHOTS = 3

  def __init__(self, runner: RayRunner):
    self._runner = runner
    self._keys: set = set()
    self._next_token = 0

  def _call(self, w: int, method: str, *args):
    r = self._runner
    return getattr(r._actors[w], method).remote(r._key, *args)  # noqa: SLF001

  def _by_shard(self, keys) -> Dict[int, List[int]]:
    out: Dict[int, List[int]] = {}
    for s in keys:
      out.setdefault(self._runner.shard_of_key(s), []).append(int(s))
    return out

  def __contains__(self, key) -> bool:
    return int(key) in self._keys

  def __len__(self) -> int:
    return len(self._keys)

  def __iter__(self):
    return iter(sorted(self._keys))

  def __getitem__(self, key):
    if int(key) not in self._keys:
      raise KeyError(key)
    w = self._runner.shard_of_key(key)
    return self._runner._get(self._call(w, "get_states", [int(key)]))[0]  # noqa: SLF001

  def __setitem__(self, key, value) -> None:
    self.update({int(key): value})

  def __delitem__(self, key) -> None:
    if int(key) not in self._keys:
      raise KeyError(key)
    self._runner._get(self._call(self._runner.shard_of_key(key), "delete_states",  # noqa: SLF001
                                 [int(key)]))
    self._keys.discard(int(key))

  def update(self, items=(), chunk: int = 4096) -> None:  # noqa: D102
    pairs = items.items() if hasattr(items, "items") else items
    pending: Dict[int, Dict[int, Any]] = {}
    calls = []
    for key, value in pairs:
      w = self._runner.shard_of_key(key)
      pending.setdefault(w, {})[int(key)] = to_numpy(value)
      self._keys.add(int(key))
      if len(pending[w]) >= chunk:
        calls.append(self._call(w, "put_states", pending.pop(w)))
    calls += [self._call(w, "put_states", part) for w, part in pending.items()]
    self._runner._get(calls)  # noqa: SLF001

  def clear(self) -> None:
    calls = [self._call(w, "delete_states", keys)
             for w, keys in self._by_shard(self._keys).items()]
    self._runner._get(calls)  # noqa: SLF001
    self._keys = set()

  def lend(self, keys, fresh):
    """A None for each key with a state (its actor passes the one it holds),
    `fresh(i)` for the others; the call's actors keep the new states under
    `keys`."""
    keys = [int(s) for s in keys]
    return ([None if s in self._keys else fresh(i) for i, s in enumerate(keys)],
            {"state_keys": keys})

  def keep(self, keys, states) -> None:
    """The actors kept the call's states under `keys` already."""
    del states
    self._keys.update(int(k) for k in keys)

  def snapshot(self) -> "ActorStatesSnapshot":
    token = self._next_token
    self._next_token += 1
    r = self._runner
    # Ray runs an actor's calls from one caller in order: the snapshot holds
    # the states of every training call made before it.
    for w in range(len(r._actors)):  # noqa: SLF001
      self._call(w, "snapshot_states", token, self.SNAPSHOTS)
    return ActorStatesSnapshot(self, token, frozenset(self._keys))

  def items_in_chunks(self, token: Optional[int] = None, keys=None, chunk: int = 4096):
    """(key, numpy state) of every key (of snapshot `token`), fetched from
    the actors `chunk` states at a time."""
    keys = sorted(self._keys if keys is None else keys)
    for w, shard_keys in sorted(self._by_shard(keys).items()):
      for i in range(0, len(shard_keys), chunk):
        part = shard_keys[i:i + chunk]
        try:
          values = self._runner._get(self._call(w, "get_states", part, token))  # noqa: SLF001
        except Exception as e:  # the snapshot is gone (only the latest are kept)
          if isinstance(e, WorkerLost):
            raise
          raise ValueError("these per-client states are no longer held by the Ray workers "
                           f"(they keep the {self.SNAPSHOTS} latest snapshots)") from None
        yield from zip(part, values)

  def numpy_items(self, snapshot: "ActorStatesSnapshot") -> "ActorStatesSnapshot":
    """The snapshot itself: its `items()` read numpy states from the actors."""
    return snapshot

  def restore(self, states) -> None:
    """Back to `states`: a snapshot of this store (the actors still hold it),
    or any (key, state) pairs with `items()`, sent to the actors."""
    if isinstance(states, ActorStatesSnapshot) and states.store is self:
      self._restore_snapshot(states)
    else:
      self.clear()
      self.update(states.items())

  def _restore_snapshot(self, snapshot: "ActorStatesSnapshot") -> None:
    r = self._runner
    done = r._get([self._call(w, "restore_states", snapshot.token)  # noqa: SLF001
                   for w in range(len(r._actors))])  # noqa: SLF001
    if not all(done):
      raise ValueError("these per-client states are no longer held by the Ray workers "
                       f"(they keep the {self.SNAPSHOTS} latest snapshots); valid: one of "
                       "the latest states")
    self._keys = set(snapshot.keys)


class ActorStatesSnapshot:
  """The per-client states at one moment, held by the actors (see
  `ActorClientStates.snapshot`); `items()` reads them back in chunks."""

  def __init__(self, store: ActorClientStates, token: int, keys):
    self.store = store
    self.token = token
    self.keys = keys

  def __len__(self) -> int:
    return len(self.keys)

  def items(self):
    return self.store.items_in_chunks(self.token, self.keys)


def _lost_actor_text(error, runner: RayRunner) -> str:
  actor_id = getattr(error, "actor_id", None)
  for w, actor in enumerate(runner._actors):  # noqa: SLF001
    if actor_id is not None and actor._actor_id.hex() == actor_id:  # noqa: SLF001
      info = runner._shard_info[w] if hasattr(runner, "_shard_info") else {}  # noqa: SLF001
      return (f"Ray worker {w} (clients {runner._bounds[w]}..{runner._bounds[w + 1] - 1}"  # noqa: SLF001
              f", pid {info.get('pid', '?')} on {info.get('host', '?')}) was lost")
  return f"a Ray worker was lost ({type(error).__name__})"
