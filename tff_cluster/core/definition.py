"""The shape of an algorithm, as plain TensorFlow functions (no TFF).

An algorithm subclasses `Definition` and writes its round once:

  state            = initial_state(w0)                 server state (numpy)
  database         = database(state, mode)             [K, ...] stacks, or None
  received         = broadcast(state, params, mode)    what every client receives
  out              = client_work(trainer, selected, received, client_state, data, mode)
                     -> ClientOutput(summed, result, state)
  new_state        = server_update(state, sum_k out.summed, mode)

`selected` is row `key_k` of `database` (the client's cluster model, chosen
by its key) or None when the algorithm selects nothing. `params` holds the
round's values (`lr`, the decayed client learning rate). `trainer.train(...)`
is the runner's local SGD (`local_training.DatasetTrainer` under TFF,
`PaddedTrainer` in-process): the definition never sees how batches are held.
`result` goes back to the host per client (e.g. its group); `state` is the
client's new per-client state, kept by the driver between rounds.

A definition may have several `modes` (e.g. FedGroup's group cold start
`pretrain`, and rounds with or without clients that are not yet in a group):
each mode is compiled separately by the runners, and the host picks one per
call. The runners:

* `tff_cluster.runners.tff_runner` composes these functions into one TFF
  computation per mode (`federated_broadcast`, `federated_select`,
  `federated_map`, `federated_sum`);
* `tff_cluster.runners.local_runner` runs them in-process, the client work
  compiled as one function per client (XLA where it pays).
"""

from __future__ import annotations

import collections
from typing import Any, List, NamedTuple, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tff_cluster import local_training


class ClientOutput(NamedTuple):
  """summed: a structure of float32 tensors summed over the round's clients;
  result: a (small) structure returned to the host for each client;
  state: the client's new per-client state (None if the algorithm keeps none)."""
  summed: Any
  result: Any
  state: Any = None


def round_params(lr: float) -> "collections.OrderedDict[str, np.ndarray]":
  """The per-round values a definition's `broadcast` receives."""
  return collections.OrderedDict(lr=np.float32(lr))


class Definition:
  """Base class; see the module docstring.

  Args:
    weights_spec: `tf.TensorSpec` per model weight (trainable first).
    num_trainable: how many of them are trainable.
    momentum: heavy-ball beta of local SGD (0 = plain SGD).
    persist_momentum: keep each client's momentum buffer between rounds (the
      client state holds it); otherwise it starts at zero every round.
  """

  modes: Tuple[str, ...] = ("train",)
  # Local steps are Nesterov's (x, y) form (`local_training.sgd_step`), the
  # client state's or the definition's `velocity` being the look-ahead point.
  nesterov: bool = False

  def __init__(self, weights_spec: Sequence[tf.TensorSpec], num_trainable: int, *,
               momentum: float = 0.0, persist_momentum: bool = False):
    self.weights_spec = [tf.TensorSpec(s.shape, s.dtype) for s in weights_spec]
    self.num_trainable = int(num_trainable)
    self.momentum = float(momentum)
    self.persist_momentum = bool(persist_momentum) and self.momentum > 0

  # -- server --------------------------------------------------------------

  def initial_state(self, initial_weights: Sequence[np.ndarray]):
    raise NotImplementedError

  def state_spec(self):
    """`tf.TensorSpec` structure of the server state."""
    zeros = [np.zeros(s.shape, s.dtype.as_numpy_dtype) for s in self.weights_spec]
    return tf.nest.map_structure(lambda a: tf.TensorSpec(np.shape(a), np.asarray(a).dtype),
                                 self.initial_state(zeros))

  def database(self, state, mode: str):
    """A structure of stacked tensors [K, ...]; a client receives row `key` of
    every one (`selected`). Only called when `num_keys(mode)` > 0."""
    del state, mode
    return None

  def num_keys(self, mode: str) -> int:
    """K: the number of rows of `database` (valid keys are 0..K-1)."""
    del mode
    return 0

  def broadcast(self, state, params, mode: str):
    raise NotImplementedError

  def client_work(self, trainer, selected, received, client_state, data,
                  mode: str) -> ClientOutput:
    raise NotImplementedError

  def server_update(self, state, summed, mode: str):
    raise NotImplementedError

  # -- per-client state ----------------------------------------------------

  def client_state_spec(self, mode: str):
    """`tf.TensorSpec` structure of one client's state, or None if it has none."""
    del mode
    if not self.persist_momentum:
      return None
    return collections.OrderedDict(
        velocity=list(self.weights_spec[:self.num_trainable]))

  def initial_client_state(self, mode: str):
    spec = self.client_state_spec(mode)
    if spec is None:
      return None
    return tf.nest.map_structure(
        lambda s: np.zeros(s.shape, s.dtype.as_numpy_dtype), spec)

  # -- helpers for subclasses ----------------------------------------------

  def local_update(self, trainer, start, data, lr, client_state, mu: float = 0.0,
                   anchor=None) -> Tuple[local_training.TrainResult, Any]:
    """Local SGD from `start`; threads the persistent momentum buffer.

    `anchor`: the proximal term's centre (default `start`). Returns the
    training result and the client's new state (None when the algorithm
    keeps no client state).
    """
    velocity = None
    if client_state is not None and "velocity" in client_state:
      velocity = list(client_state["velocity"])
    out = trainer.train(start, data, lr, mu=mu, velocity=velocity, anchor=anchor)
    if client_state is None:
      return out, None
    new_state = collections.OrderedDict(client_state)
    if velocity is not None:
      new_state["velocity"] = out.velocity
    return out, new_state


def flat_norm(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
  """Euclidean norm of a list of tensors taken as one vector."""
  return tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(t)) for t in tensors]))


def weighted_mean_update(model: Sequence[tf.Tensor], update_sum: Sequence[tf.Tensor],
                         weight_sum: tf.Tensor) -> List[tf.Tensor]:
  """w + sum_k n_k Delta_k / sum_k n_k; w unchanged when the weight is 0."""
  safe = tf.where(weight_sum > 0, weight_sum, 1.0)
  return [w + s / safe for w, s in zip(model, update_sum)]
