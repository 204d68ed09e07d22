"""The `local` runner: an algorithm's definition executed in-process.

No TFF. The clients' training arrays are placed on the device once
(concatenated, with each client's offset); each round, every sampled client's
batches are index batches into them (`local_training.padded_batches`: the
same batches, in the same order, as the `tff` runner's datasets). A client's
whole local training is one call of a compiled function: a `tf.while_loop`
over its batches, with no host round trip inside, XLA-compiled (`jit`) where
that is faster:

  jit='auto'  on a GPU: yes; on a CPU: dense models (MCLR, MLP) yes,
              convolutional and recurrent models no (TF 2.14's XLA makes CNN
              steps 13-30x slower on CPU, see benchmarks/runner_speed.py);
              models with BatchNorm: no (their batches are sliced to the real
              size, a dynamic shape XLA cannot compile).
  jit='on'    always (refused for BatchNorm models, see above);
  jit='off'   never.

The server-side functions run as `tf.function`s on the same device.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_cluster import experiment, local_training
from tff_cluster.algorithms.definition import round_params
from tff_cluster.runners import RoundOutput, check_keys

JIT_CHOICES = ("auto", "on", "off")


def choose_device() -> str:
  """'/GPU:0' when TensorFlow sees a GPU, else '/CPU:0'."""
  return "/GPU:0" if tf.config.list_physical_devices("GPU") else "/CPU:0"


def resolve_jit(setting: str, family: str, exact_batches: bool, device: str) -> bool:
  """Whether to XLA-compile the client loop (see the module docstring)."""
  if setting not in JIT_CHOICES:
    raise ValueError(f"invalid --jit={setting}; valid: {', '.join(JIT_CHOICES)}")
  if setting == "on" and exact_batches:
    raise ValueError("invalid --jit=on for a model with BatchNorm: its batches must keep "
                     "their real size, which XLA cannot compile; valid: auto or off")
  if setting != "auto":
    return setting == "on"
  if exact_batches:
    return False
  return device.startswith("/GPU") or family == "dense"


def _to_numpy(structure):
  return tf.nest.map_structure(lambda t: np.asarray(t), structure)


class LocalRunner:
  """Runs a `Definition` in-process (see the module docstring).

  Args:
    definition: the algorithm's `Definition`.
    model_fn: builds a fresh built Keras model.
    loss: `tff_cluster.models` loss kind.
    data: the `FederatedData` (training arrays of every client).
    seed: the run's seed (fixes each client's shuffles, as the tff runner).
    jit: 'auto', 'on' or 'off'.
    device: a TF device string; default `choose_device()`.
  """

  name = "local"

  def __init__(self, definition, model_fn, loss: str, data, seed: int,
               jit: str = "auto", device: Optional[str] = None):
    self.definition = definition
    self._data = data
    self._seed = seed
    self.device = device or choose_device()
    with tf.device(self.device):
      self._model = model_fn()
    self.model_family = local_training.model_family(self._model)
    self.exact_batches = local_training.has_batch_statistics(self._model)
    self.jit = resolve_jit(jit, self.model_family, self.exact_batches, self.device)
    self._loss = loss
    xs = [data.train[c][0] for c in data.client_ids]
    ys = [data.train[c][1] for c in data.client_ids]
    self._sizes = np.array([len(y) for y in ys], np.int64)
    self._offsets = np.concatenate([[0], np.cumsum(self._sizes)[:-1]]).astype(np.int64)
    with tf.device(self.device):
      self._x = tf.constant(np.concatenate(xs))
      self._y = tf.constant(np.concatenate(ys))
    self._fns: Dict[str, Any] = {}
    self._steps_cache: Dict[local_training.LocalWork, int] = {}

  def _max_steps(self, work: local_training.LocalWork) -> int:
    """The largest step count of any client: every client's index batches are
    padded to it, so each mode compiles once."""
    if work not in self._steps_cache:
      self._steps_cache[work] = max(1, max(work.num_steps(int(n)) for n in self._sizes))
    return self._steps_cache[work]

  def describe(self) -> Dict[str, Any]:
    """What `config.json` records about this runner."""
    return {"runner": self.name, "device": self.device, "jit": self.jit,
            "model_family": self.model_family, "exact_batches": self.exact_batches}

  def _compiled(self, mode: str):
    if mode in self._fns:
      return self._fns[mode]
    d = self.definition
    model, loss = self._model, self._loss

    @tf.function
    def broadcast_fn(state, params):
      return d.broadcast(state, params, mode)

    @tf.function
    def database_fn(state):
      return d.database(state, mode)

    @tf.function(jit_compile=self.jit)
    def client_fn(database, key, received, client_state, indices, sizes, num_steps,
                  x, y):
      trainer = local_training.PaddedTrainer(
          model, loss, x, y, momentum=d.momentum, exact_batches=self.exact_batches)
      selected = None if database is None else tf.nest.map_structure(
          lambda t: tf.gather(t, key), database)
      data = local_training.PaddedBatches(indices, sizes, num_steps)
      out = d.client_work(trainer, selected, received, client_state, data, mode)
      return out.summed, out.result, out.state

    @tf.function
    def server_fn(state, summed):
      return d.server_update(state, summed, mode)

    self._fns[mode] = (broadcast_fn, database_fn, client_fn, server_fn)
    return self._fns[mode]

  def put_state(self, state):
    """The server state as tensors on this runner's device."""
    with tf.device(self.device):
      return tf.nest.map_structure(tf.convert_to_tensor, state)

  @staticmethod
  def numpy_state(state):
    return _to_numpy(state)

  def run(self, mode: str, state, clients: Sequence[int], round_num: int,
          work: local_training.LocalWork, lr: float,
          keys: Optional[Sequence[int]] = None,
          client_states: Optional[List[Any]] = None) -> RoundOutput:
    """One call of `mode` for `clients` (indices into the data's clients)."""
    broadcast_fn, database_fn, client_fn, server_fn = self._compiled(mode)
    d = self.definition
    with tf.device(self.device):
      state = self.put_state(state)
      received = broadcast_fn(state, round_params(lr))
      database = None
      if d.num_keys(mode):
        database = database_fn(state)
        check_keys(keys, d.num_keys(mode), len(clients))
      total, results, new_states = None, [], []
      for i, k in enumerate(clients):
        batches = local_training.padded_batches(
            int(self._sizes[k]), int(self._offsets[k]), work,
            experiment.client_seed(self._seed, round_num, int(k)),
            total_steps=self._max_steps(work))
        key = np.int32(keys[i]) if database is not None else np.int32(0)
        summed, result, new_state = client_fn(
            database, key, received, None if client_states is None else client_states[i],
            batches.indices, batches.sizes, batches.num_steps, self._x, self._y)
        total = summed if total is None else tf.nest.map_structure(tf.add, total, summed)
        results.append(result)
        new_states.append(new_state)
      new_server_state = server_fn(state, total)
    return RoundOutput(new_server_state, _to_numpy(total),
                       [_to_numpy(r) for r in results],
                       new_states if client_states is not None else None)

