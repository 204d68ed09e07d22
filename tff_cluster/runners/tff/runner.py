"""The `tff` runner: an algorithm's definition composed into TFF computations.

For each mode of a `Definition`, `build_round` makes one federated
computation

  round(state@SERVER, params@SERVER, data@CLIENTS, positions@CLIENTS[, keys@CLIENTS]
        [, client_state@CLIENTS])
    -> (new_state@SERVER, summed@SERVER, collected@SERVER)

  received  = federated_broadcast(federated_map(broadcast, (state, params)))
  selected  = federated_select(keys, K - 1, federated_map(database, state), row)
  out       = federated_map(client_work, (selected, keys, received, data, position,
                                          client_state))
  summed    = federated_sum(out.summed)
  collected = federated_aggregate(out.row, collect)   # (position, result[, new state]) rows
  new_state = federated_map(server_update, (state, summed))

The keys (a mode with `num_keys` > 0) are a CLIENTS-placed int32 value
beside the data: they select each client's `database` row (no select where
the mode's `database` is None) and reach `client_work` as its `key`.

Every output is placed at SERVER: the per-client results and new states come
back through the "collect" aggregation, each row carrying the client's
position, so TFF's mergeable (multi-worker) context runs the client work once
and returns the rows whatever order its workers finish in, and
`tff.program`'s native context accepts the computation. `build_round`
returns a `RoundComputation`, whose call passes positions 0..n-1 and gives
the results back per client, in order.

on TFF's C++ runtime (`tff_cluster.runners.tff.runtime` owns the worker and installs its
context when the first runner or computation is made). `build_computations`
gives every mode's computation of a definition: what TFF research pipelines
use (`tff_cluster.api.computations` builds the definition from an algorithm's
options).
"""

from __future__ import annotations

import collections
from typing import Any, Dict, List, NamedTuple, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_cluster import stack

stack.require_tff()  # one line naming the install routes, not a ModuleNotFoundError

import tensorflow_federated as tff  # noqa: E402

from tff_cluster import models
from tff_cluster.spec import hparams
from tff_cluster.learning import schedule
from tff_cluster.learning import trainers
from tff_cluster.runners.tff import runtime
from tff_cluster.runners.tff import types as tff_types
from tff_cluster.core.definition import round_params
from tff_cluster.runners.base import RoundOutput, Runner, check_keys, combine_clients, to_numpy

PARAMS_SPEC = collections.OrderedDict(lr=tf.TensorSpec([], tf.float32))
KEY_TYPE = tff.TensorType(np.int32, [1])
POSITION_TYPE = tff.TensorType(np.int32)  # a client's position in the call's client list


def _federated_round(body, state_type, params_type, data_type, key_type, client_state_type):
  """`body(state, params, data, positions, keys, client_states)` as a federated
  computation whose parameters are the ones this mode has: the keys
  (`key_type`) and the client states (`client_state_type`) only when not None."""
  at_server = lambda t: tff.FederatedType(t, tff.SERVER)  # noqa: E731
  at_clients = lambda t: tff.FederatedType(t, tff.CLIENTS)  # noqa: E731
  types = [at_server(state_type), at_server(params_type), at_clients(data_type),
           at_clients(POSITION_TYPE)]
  keyed, stateful = key_type is not None, client_state_type is not None
  if keyed:
    types.append(at_clients(key_type))
  if stateful:
    types.append(at_clients(client_state_type))

  if keyed and stateful:
    def round_fn(state, params, data, positions, keys, client_states):
      return body(state, params, data, positions, keys, client_states)
  elif keyed:
    def round_fn(state, params, data, positions, keys):
      return body(state, params, data, positions, keys, None)
  elif stateful:
    def round_fn(state, params, data, positions, client_states):
      return body(state, params, data, positions, None, client_states)
  else:
    def round_fn(state, params, data, positions):
      return body(state, params, data, positions, None, None)

  return tff.federated_computation(*types)(round_fn)


def build_round(definition, mode: str, model_fn, loss: str, element_spec):
  """The federated computation of one call of `mode` (see the module docstring).

  Args:
    definition: the algorithm's `Definition`.
    mode: one of `definition.modes`.
    model_fn: builds a fresh built Keras model (called inside computations).
    loss: `tff_cluster.models` loss kind, or the Keras loss object it names
      (`tff_cluster.models.loss_kind`).
    element_spec: element spec of a client's batched dataset (`{'x', 'y'}`).

  Keys are `int32[1]` per client, in 0..K-1 with K = `definition.num_keys(mode)`.
  """
  loss = models.loss_kind(loss)  # a Keras loss object or a kind; anything else: ValueError
  runtime.install()
  d = definition
  state_type = tff_types.to_tff_type(d.state_spec())
  params_type = tff_types.to_tff_type(PARAMS_SPEC)
  data_type = tff_types.sequence_type(element_spec)
  client_state_spec = d.client_state_spec(mode)
  stateful = client_state_spec is not None
  num_keys = d.num_keys(mode)
  keyed = num_keys > 0
  selecting = keyed and has_database(d, mode)

  @tff.tensorflow.computation(state_type, params_type)
  def broadcast_fn(state, params):
    return d.broadcast(state, params, mode)

  received_type = broadcast_fn.type_signature.result
  arg_types = []
  if selecting:
    @tff.tensorflow.computation(state_type)
    def database_fn(state):
      return d.database(state, mode)

    database_type = database_fn.type_signature.result

    @tff.tensorflow.computation(database_type, tff.TensorType(np.int32))
    def row_fn(database, key):
      return tf.nest.map_structure(lambda t: tf.gather(t, key), database)

    arg_types.append(tff.SequenceType(row_fn.type_signature.result))
  if keyed:
    arg_types.append(KEY_TYPE)
  arg_types += [received_type, data_type, POSITION_TYPE]
  if stateful:
    arg_types.append(tff_types.to_tff_type(client_state_spec))
  # The per-client results' and states' specs, recorded when the client
  # computation is traced (the host unflattens the collected rows with them).
  specs: Dict[str, Any] = {}
  client_fn = client_computation(d, mode, model_fn, loss, arg_types, selecting, keyed,
                                 stateful, specs)
  summed_type = client_fn.type_signature.result[0]
  collect = collect_aggregation(client_fn.type_signature.result[1])

  @tff.tensorflow.computation(state_type, summed_type)
  def server_fn(state, summed):
    return d.server_update(state, summed, mode)

  def body(state, params, data, positions, keys, client_states):
    received = tff.federated_broadcast(tff.federated_map(broadcast_fn, (state, params)))
    args = []
    if selecting:
      database = tff.federated_map(database_fn, state)
      args.append(tff.federated_select(
          keys, tff.federated_value(np.int32(num_keys - 1), tff.SERVER), database, row_fn))
    if keyed:
      args.append(keys)
    args += [received, data, positions]
    if stateful:
      args.append(client_states)
    out = tff.federated_map(client_fn, tuple(args))
    summed = tff.federated_sum(out[0])
    zero, accumulate, merge, report = collect
    collected = tff.federated_aggregate(out[1], zero(), accumulate, merge, report)
    if combines:  # the host combines the clients' deltas, then `server`
      return state, summed, collected
    new_state = tff.federated_map(server_fn, (state, summed))
    return new_state, summed, collected

  # An order statistic of the clients' deltas (`core.mechanisms`) is the
  # host's, from the collected rows; the server update is then its own call.
  combines = getattr(d, "combines", None) is not None and d.combines(mode)
  computation = _federated_round(body, state_type, params_type, data_type,
                                 KEY_TYPE if keyed else None,
                                 arg_types[-1] if stateful else None)
  return RoundComputation(computation, specs["per_client"], stateful,
                          server_fn if combines else None,
                          RoundParts(broadcast_fn, client_fn, server_fn))


def has_database(definition, mode: str) -> bool:
  """Whether `definition.database` gives rows in keyed `mode` (None: the
  clients receive only their keys), from a trace of it."""
  traced = tf.function(lambda state: definition.database(state, mode)).get_concrete_function(
      definition.state_spec())
  return traced.structured_outputs is not None


def client_computation(d, mode: str, model_fn, loss: str, arg_types, selecting: bool,
                       keyed: bool, stateful: bool, specs: Dict[str, Any]):
  """The client work of `d`'s `mode` as a TFF computation of one struct of
  `arg_types` ([selected,] [key,] received, dataset, position[,
  client_state]) returning (summed, the client's row of the collect
  aggregation). Tracing it records the per-client results' (and states')
  specs in `specs["per_client"]`."""
  names = ((["selected"] if selecting else []) + (["key"] if keyed else [])
           + ["received", "dataset", "position"] + (["client_state"] if stateful else []))

  def client_body(args):
    args = {name: tff.types.type_to_py_container(args[i], t)
            for i, (name, t) in enumerate(zip(names, arg_types))}
    trainer = trainers.DatasetTrainer(model_fn(), loss)

    # A tf.function inside the computation's graph: its automatic control
    # dependencies order the variable assignments and reads of local SGD.
    @tf.function
    def work(selected, key, received, dataset, position, client_state):
      if selected is not None:
        selected = selected.get_single_element()
      extra = {} if key is None else {"key": key[0]}
      out = d.client_work(trainer, selected, received, client_state, dataset, mode, **extra)
      per_client = (out.result, out.state) if stateful else (out.result,)
      specs["per_client"] = tf.nest.map_structure(
          lambda t: tf.TensorSpec(t.shape, t.dtype), per_client)
      # One row of the collect aggregation: the client's position, then its
      # result's (and state's) tensors, each with a leading axis of 1.
      row = [tf.reshape(tf.cast(position, tf.int32), [1])] + [
          tf.expand_dims(t, 0) for t in tf.nest.flatten(per_client)]
      return out.summed, row

    return work(args.get("selected"), args.get("key"), args["received"], args["dataset"],
                args["position"], args.get("client_state"))

  return tff.tensorflow.computation(tff.StructType(arg_types))(client_body)


def collect_aggregation(row_type):
  """(zero, accumulate, merge, report) of the "collect" aggregation: the
  clients' rows (`row_type`: tensors with a leading axis of 1) gathered into
  server-placed tensors with one row per client.

  The accumulator is (count, buffers); a buffer doubles when full, so the
  rows already gathered are copied O(log n) times, not once per client (TFF
  hands each accumulate call its own copy of the accumulator all the same);
  `report` cuts the buffers to `count` rows. The rows carry each client's
  position, so their order does not matter (`RoundComputation.unpack`
  sorts them)."""
  row_specs = [tf.TensorSpec([None, *t.shape[1:]], t.dtype) for t in row_type]

  def empty(spec):
    return tf.raw_ops.PlaceholderWithDefault(
        input=tf.zeros([0, *spec.shape[1:]], spec.dtype), shape=spec.shape)

  @tff.tensorflow.computation
  def zero():
    return (tf.constant(0, tf.int32), [empty(s) for s in row_specs])

  acc_type = zero.type_signature.result

  @tff.tensorflow.computation(acc_type, row_type)
  def accumulate(acc, row):
    count, buffers = acc[0], list(acc[1])
    capacity = tf.shape(buffers[0])[0]

    def grown(b):  # twice the rows (at least one); the row shape stays static
      return tf.concat([b, tf.zeros([tf.maximum(capacity, 1), *b.shape[1:]], b.dtype)], 0)

    full = count >= capacity
    out = []
    for b, r in zip(buffers, row):
      b = tf.cond(full, lambda b=b: grown(b), lambda b=b: tf.identity(b))
      out.append(tf.tensor_scatter_nd_update(b, [[count]], r))
    return (count + 1, out)

  @tff.tensorflow.computation(acc_type, acc_type)
  def merge(a, b):
    return (a[0] + b[0], [tf.concat([x[:a[0]], y[:b[0]]], 0) for x, y in zip(a[1], b[1])])

  @tff.tensorflow.computation(acc_type)
  def report(acc):
    return [b[:acc[0]] for b in acc[1]]

  return zero, accumulate, merge, report


class RoundParts(NamedTuple):
  """A round's TensorFlow computations, for composing the round another way
  (`tff_program.build_learning_process` with a `tff.aggregators` factory in
  place of the sum of the update parts): `broadcast(state, params)`,
  `client(args)` (`client_computation`'s: -> (summed, collect row)) and
  `server(state, summed)`."""
  broadcast: Any
  client: Any
  server: Any


class RoundComputation:
  """A round's federated computation (`build_round`) and how to read its
  collected per-client outputs.

  `computation(state, params, datasets, positions[, keys][, client_states])
  -> (new_state, summed, collected)`, every output at SERVER: `collected` is
  the clients' positions, then their results' (and new states') tensors,
  one row per client in any order. Calling this object passes positions
  0..n-1 and returns (new_state, summed, per-client results[, per-client
  states]) in the clients' order."""

  def __init__(self, computation, per_client_specs, stateful: bool, server=None,
               parts: Optional[RoundParts] = None):
    self.computation = computation
    self.parts = parts
    # The server update as its own computation where the host combines the
    # clients' deltas between the round and it (None: inside the round).
    self.server = server
    self.per_client_specs = per_client_specs
    self.stateful = stateful
    self.type_signature = computation.type_signature

  def unpack(self, collected, num_clients: int):
    """Per-client (results, states or None) from the collected rows."""
    flat = [np.asarray(t) for t in collected]
    positions = flat[0].astype(np.int64)
    if sorted(positions.tolist()) != list(range(num_clients)):
      raise RuntimeError(f"the collect aggregation returned positions {positions.tolist()} "
                         f"for {num_clients} clients")
    order = np.argsort(positions)
    rows = [[a[i] for a in flat[1:]] for i in order]
    per_client = [tf.nest.pack_sequence_as(self.per_client_specs, row) for row in rows]
    results = [p[0] for p in per_client]
    states = [p[1] for p in per_client] if self.stateful else None
    return results, states

  def __call__(self, state, params, datasets, *rest):
    positions = [np.int32(i) for i in range(len(datasets))]
    new_state, summed, collected = self.computation(state, params, datasets, positions, *rest)
    results, states = self.unpack(collected, len(datasets))
    if self.stateful:
      return new_state, summed, results, states
    return new_state, summed, results


def build_computations(definition, model_fn, loss, element_spec) -> Dict[str, Any]:
  """Every mode's federated computation of `definition` (`build_round`), by
  mode name: `{mode: round(state, params, data[, keys][, client_state])}`.

  The state starts as `definition.initial_state(...)`; `params` are
  `core.definition.round_params(lr)`; what the host does between the modes
  is the algorithm's driver's (`tff_cluster/algorithms/<name>.py`).
  """
  return {mode: build_round(definition, mode, model_fn, loss, element_spec)
          for mode in definition.modes}


class TffRunner(Runner):
  """Runs a `Definition` through `build_round`'s computations (one per mode).

  Args: as `local_runner.LocalRunner` (no jit: TFF's worker does not compile
  with XLA, and the clients' datasets are `tf.data` pipelines), and
    workers: "HOST:PORT,..." of TFF workers to split each call's clients over
      (`tff_cluster.runners.tff.workers`; default: the process's own worker);
    worker_grace: seconds a worker may stay unreachable (default 60);
    subround_timeout: seconds a worker may take for its share of a call.
  """

  name = "tff"

  def __init__(self, definition, model_fn, loss: str, data, seed: int, modes=None,
               workers: Optional[str] = None, worker_grace: Optional[float] = None,
               subround_timeout: Optional[float] = None):
    self.definition = definition
    self.model_fn, self.loss, self.data = model_fn, loss, data
    self._seed = seed
    first = data.client_ids[0]
    self._element_spec = schedule.client_dataset(
        *data.train[first], 1, 1, 0, rows=definition.example_rows).element_spec
    # Built now, not on first use: tracing a Keras model inside a TFF
    # computation invalidates Keras models made earlier outside it (such as
    # the evaluator's), so every computation is traced before those exist.
    self._computations: Dict[str, Any] = {
        mode: build_round(definition, mode, model_fn, loss, self._element_spec)
        for mode in (definition.modes if modes is None else modes)}
    # Other workers: each round's clients split over them (tff_cluster.runners.tff.workers).
    self.workers: Optional[List[str]] = None
    self._context = None  # the workers' context, entered around each call
    if not workers:
      runtime.use_own_worker()  # not the workers an earlier runner connected to
    else:
      from tff_cluster.runners.tff import workers as tff_workers
      self.workers = hparams.parse_host_ports(workers, "tff_workers")
      try:
        self._context = tff_workers.connect(
            self.workers, tff_workers.DEFAULT_GRACE_S if worker_grace is None else worker_grace,
            subround_timeout)
      except tff_workers.WorkerUnavailable as e:  # at start: a usage error (exit 2)
        raise ValueError(f"--tff_workers: {e}") from None

  def describe(self) -> Dict[str, Any]:
    if self.workers:
      return {"runner": self.name, "jit": False, "workers": list(self.workers),
              "device": f"TFF C++ runtime (CPU), {len(self.workers)} workers"}
    return {"runner": self.name, "device": "TFF C++ runtime (CPU)", "jit": False}

  def computation(self, mode: str):
    return self._computations[mode]

  def put_state(self, state):
    return state

  @staticmethod
  def numpy_state(state):
    return to_numpy(state)

  def datasets(self, clients: Sequence[int], round_num: int,
               work: schedule.LocalWork) -> List[tf.data.Dataset]:
    """The clients' seeded datasets (the batches `padded_batches` also gives)."""
    out = []
    for k in clients:
      x, y = self.data.train[self.data.client_ids[k]]
      out.append(schedule.work_dataset(
          x, y, work, schedule.client_seed(self._seed, round_num, int(k)),
          rows=self.definition.example_rows))
    return out

  def run(self, mode: str, state, clients: Sequence[int], round_num: int,
          work: schedule.LocalWork, lr: float,
          keys: Optional[Sequence[int]] = None,
          client_states: Optional[List[Any]] = None) -> RoundOutput:
    d = self.definition
    args = [state, round_params(lr), self.datasets(clients, round_num, work)]
    if d.num_keys(mode):
      check_keys(keys, d.num_keys(mode), len(clients))
      args.append([np.array([k], np.int32) for k in keys])
    stateful = d.client_state_spec(mode) is not None
    if stateful:
      args.append(list(client_states))
    if self._context is None:
      out = self.computation(mode)(*args)
    else:  # whatever the default context is now (the CLI installs the own worker's)
      with tff.framework.get_context_stack().install(self._context):
        out = self.computation(mode)(*args)
    results = [to_numpy(r) for r in out[2]]
    computation = self.computation(mode)
    total = to_numpy(out[1])
    new_state = out[0]
    if computation.server is not None:
      total, results = combine_clients(d, mode, total, results)
      new_state = computation.server(state, total)
    return RoundOutput(new_state, total, results,
                       [to_numpy(s) for s in out[3]] if stateful else None)
