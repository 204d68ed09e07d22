"""The `tff` runner: an algorithm's definition composed into TFF computations.

For each mode of a `Definition`, `build_round` makes one federated
computation

  round(state@SERVER, params@SERVER, data@CLIENTS[, keys@CLIENTS][, client_state@CLIENTS])
    -> (new_state@SERVER, summed@SERVER, results@CLIENTS[, new_client_state@CLIENTS])

  received  = federated_broadcast(federated_map(broadcast, (state, params)))
  selected  = federated_select(keys, K - 1, federated_map(database, state), row)
  out       = federated_map(client_work, (selected, received, data, client_state))
  summed    = federated_sum(out.summed)
  new_state = federated_map(server_update, (state, summed))

on TFF's C++ runtime (`tff_cluster.runtime` owns the worker and installs its
context when the first runner or computation is made). `build_computations`
gives every mode's computation of a definition: what TFF research pipelines
use (`tff_cluster.api.computations` builds the definition from an algorithm's
options).
"""

from __future__ import annotations

import collections
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_cluster import stack

stack.require_tff()  # one line naming the install routes, not a ModuleNotFoundError

import tensorflow_federated as tff  # noqa: E402

from tff_cluster import local_training, models, runtime, tff_types
from tff_cluster.core.definition import round_params
from tff_cluster.runners.base import RoundOutput, check_keys, to_numpy

PARAMS_SPEC = collections.OrderedDict(lr=tf.TensorSpec([], tf.float32))
KEY_TYPE = tff.TensorType(np.int32, [1])


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
  selecting = num_keys > 0

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
  arg_types += [received_type, data_type]
  if stateful:
    arg_types.append(tff_types.to_tff_type(client_state_spec))

  def client_body(selected, received, dataset, client_state):
    trainer = local_training.DatasetTrainer(model_fn(), loss, momentum=d.momentum,
                                             nesterov=d.nesterov)

    # A tf.function inside the computation's graph: its automatic control
    # dependencies order the variable assignments and reads of local SGD.
    @tf.function
    def work(selected, received, dataset, client_state):
      if selected is not None:
        selected = selected.get_single_element()
      out = d.client_work(trainer, selected, received, client_state, dataset, mode)
      return (out.summed, out.result, out.state) if stateful else (out.summed, out.result)

    return work(selected, received, dataset, client_state)

  if selecting and stateful:
    def client_args(selected, received, dataset, client_state):
      return client_body(selected, received, dataset, client_state)
  elif selecting:
    def client_args(selected, received, dataset):
      return client_body(selected, received, dataset, None)
  elif stateful:
    def client_args(received, dataset, client_state):
      return client_body(None, received, dataset, client_state)
  else:
    def client_args(received, dataset):
      return client_body(None, received, dataset, None)

  client_fn = tff.tensorflow.computation(*arg_types)(client_args)
  summed_type = client_fn.type_signature.result[0]

  @tff.tensorflow.computation(state_type, summed_type)
  def server_fn(state, summed):
    return d.server_update(state, summed, mode)

  def body(state, params, data, keys, client_states):
    received = tff.federated_broadcast(tff.federated_map(broadcast_fn, (state, params)))
    args = []
    if selecting:
      database = tff.federated_map(database_fn, state)
      args.append(tff.federated_select(
          keys, tff.federated_value(np.int32(num_keys - 1), tff.SERVER), database, row_fn))
    args += [received, data]
    if stateful:
      args.append(client_states)
    out = tff.federated_map(client_fn, tuple(args))
    summed = tff.federated_sum(out[0])
    new_state = tff.federated_map(server_fn, (state, summed))
    if stateful:
      return new_state, summed, out[1], out[2]
    return new_state, summed, out[1]

  at_server = lambda t: tff.FederatedType(t, tff.SERVER)  # noqa: E731
  at_clients = lambda t: tff.FederatedType(t, tff.CLIENTS)  # noqa: E731
  types = [at_server(state_type), at_server(params_type), at_clients(data_type)]
  if selecting:
    types.append(at_clients(KEY_TYPE))
  if stateful:
    types.append(at_clients(arg_types[-1]))

  if selecting and stateful:
    def round_fn(state, params, data, keys, client_states):
      return body(state, params, data, keys, client_states)
  elif selecting:
    def round_fn(state, params, data, keys):
      return body(state, params, data, keys, None)
  elif stateful:
    def round_fn(state, params, data, client_states):
      return body(state, params, data, None, client_states)
  else:
    def round_fn(state, params, data):
      return body(state, params, data, None, None)

  return tff.federated_computation(*types)(round_fn)


def build_computations(definition, model_fn, loss, element_spec) -> Dict[str, Any]:
  """Every mode's federated computation of `definition` (`build_round`), by
  mode name: `{mode: round(state, params, data[, keys][, client_state])}`.

  The state starts as `definition.initial_state(...)`; `params` are
  `core.definition.round_params(lr)`; what the host does between the modes
  is the algorithm's driver's (`tff_cluster/algorithms/<name>.py`).
  """
  return {mode: build_round(definition, mode, model_fn, loss, element_spec)
          for mode in definition.modes}


class TffRunner:
  """Runs a `Definition` through `build_round`'s computations (one per mode).

  Args: as `local_runner.LocalRunner` (no jit: TFF's worker does not compile
  with XLA, and the clients' datasets are `tf.data` pipelines).
  """

  name = "tff"

  def __init__(self, definition, model_fn, loss: str, data, seed: int, modes=None):
    self.definition = definition
    self._model_fn = model_fn
    self._loss = loss
    self._data = data
    self._seed = seed
    first = data.client_ids[0]
    self._element_spec = local_training.client_dataset(
        *data.train[first], 1, 1, 0).element_spec
    # Built now, not on first use: tracing a Keras model inside a TFF
    # computation invalidates Keras models made earlier outside it (such as
    # the evaluator's), so every computation is traced before those exist.
    self._computations: Dict[str, Any] = {
        mode: build_round(definition, mode, model_fn, loss, self._element_spec)
        for mode in (definition.modes if modes is None else modes)}

  def describe(self) -> Dict[str, Any]:
    return {"runner": self.name, "device": "TFF C++ runtime (CPU)", "jit": False}

  def computation(self, mode: str):
    return self._computations[mode]

  def put_state(self, state):
    return state

  @staticmethod
  def numpy_state(state):
    return to_numpy(state)

  def datasets(self, clients: Sequence[int], round_num: int,
               work: local_training.LocalWork) -> List[tf.data.Dataset]:
    """The clients' seeded datasets (the batches `padded_batches` also gives)."""
    out = []
    for k in clients:
      x, y = self._data.train[self._data.client_ids[k]]
      out.append(local_training.work_dataset(
          x, y, work, local_training.client_seed(self._seed, round_num, int(k))))
    return out

  def run(self, mode: str, state, clients: Sequence[int], round_num: int,
          work: local_training.LocalWork, lr: float,
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
    out = self.computation(mode)(*args)
    results = [to_numpy(r) for r in out[2]]
    return RoundOutput(out[0], to_numpy(out[1]), results,
                       list(out[3]) if stateful else None)
