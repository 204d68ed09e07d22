"""The shape of an algorithm, as plain TensorFlow functions (no TFF).

An algorithm subclasses `Definition` and writes its round once:

  state            = initial_state(w0)                 server state (numpy)
  database         = database(state, mode)             [K, ...] stacks, or None
  received         = broadcast(state, params, mode)    what every client receives
  out              = client_work(trainer, selected, received, client_state, data, mode
                                 [, key=key_k])
                     -> ClientOutput(summed, result, state)
  new_state        = server_update(state, sum_k out.summed, mode)

In a mode with keys (`num_keys(mode)` = K > 0) the host gives every client
a key in 0..K-1 (its cluster, group or worker index); the runners pass it
to `client_work` as `key`, a scalar int32 tensor, and `selected` is row
`key` of `database` (the client's cluster model), or None where `database`
is None (the client needs only its key). In a mode without keys `selected`
is None and no `key` is passed (a definition whose modes have no keys need
not take the argument). `params` holds the round's values (`lr`, the
decayed client learning rate).
`trainer.train(start, data, lr, optimizer, opt_state)` is the runner's local
training (`trainers.DatasetTrainer` under TFF, `PaddedTrainer` or
`FunctionalTrainer` in-process): the definition never sees how batches are
held. The optimizer is a value of `learning.optimizers` (a chain of
gradient transforms ending in a step) that the definition owns
(`client_optimizer`, built from its options and the solver's
`--client_momentum`); `local_update` threads its persisted state through the
client state. `result` goes back to the host per client (e.g. its group);
`state` is the client's new per-client state, kept by the driver between
rounds.

`out.summed` is added up over the round's clients (one federated sum,
`aggregators.Sum`); per-cluster weighted means ride on that sum as
`aggregators.ClusterMean` contributions in the row of the client's key (or
of the cluster the client chose itself, as IFCA's estimate), which
`server_update` divides with `ClusterMean.mean`; `aggregators.ClusterSum`
places a value per key without dividing. Server optimizers are the same
`learning.optimizers` chains as the clients' (`optimizers.server_sgd`,
`server_heavy_ball`, `server_fedopt`, ...), run as
`opt.update(pseudo_gradient, state, weights, lr)`: they turn a
pseudo-gradient into the next server model, their state kept flat in the
server state (`server_opt_state`).

A definition may have several `modes` (e.g. FedGroup's group cold start
`pretrain`, and rounds with or without clients that are not yet in a group):
each mode is compiled separately by the runners, and the host picks one per
call. The runners:

* `tff_cluster.runners.tff.runner` composes these functions into one TFF
  computation per mode (`federated_broadcast`, `federated_select`,
  `federated_map`, `federated_sum`);
* `tff_cluster.runners.local_runner` runs them in-process, the client work
  compiled as one function per client (XLA where it pays).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
from typing import Any, List, NamedTuple, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tff_cluster.core import cluster_ops
from tff_cluster.learning import trainers
from tff_cluster.learning import optimizers


class ClientOutput(NamedTuple):
  """summed: a structure of float32 tensors summed over the round's clients;
  result: a (small) structure returned to the host for each client;
  state: the client's new per-client state (None if the algorithm keeps none)."""
  summed: Any
  result: Any
  state: Any = None


class UpdateParts(NamedTuple):
  """Where a definition's `summed` holds its clients' updates in a mode (the
  aggregation slot, `tff_cluster.core.mechanisms`): `updates` the keys (each
  a list of tensors, or one tensor) of w x delta (in the row of the client's
  key for a clustered definition), `weight` the key of w (a scalar, or w in
  the key's row of a [K] vector)."""
  updates: Tuple[str, ...]
  weight: str


def round_params(lr: float) -> "collections.OrderedDict[str, np.ndarray]":
  """The per-round values a definition's `broadcast` receives."""
  return collections.OrderedDict(lr=np.float32(lr))


@dataclasses.dataclass(frozen=True)
class LocalSolver:
  """The clients' local solver the run sets (`--client_momentum`,
  `--client_state`): heavy-ball momentum `momentum` (0 = plain SGD), its
  buffer kept by each client between rounds when `persist`; or `optimizer`,
  a step (or chain ending in one) in its place (a TFF client optimizer as
  `optimizers.from_tff` gives it, its learning rate its own)."""
  momentum: float = 0.0
  persist: bool = False
  optimizer: Any = None

  def step(self):
    """The local step: `optimizer`, or `optimizers.heavy_ball(momentum)`."""
    if self.optimizer is not None:
      return self.optimizer
    return optimizers.heavy_ball(self.momentum)


class Definition:
  """Base class; see the module docstring.

  Args:
    weights_spec: `tf.TensorSpec` per model weight (trainable first).
    num_trainable: how many of them are trainable.
    solver: the run's `LocalSolver`: `local_step` is its step; with
      `solver.persist` (and momentum > 0) each client keeps its momentum
      buffer between rounds (the client state's `velocity`), otherwise it
      starts at zero every round.

  `client_optimizer` is the chain `local_update` trains with by default: the
  solver's `local_step` alone here; a subclass puts its own transforms in
  front (FedProx's proximal term) or its own step in place (an algorithm
  whose spec names its `own_momentum` is given the default, plain SGD,
  solver).
  """

  modes: Tuple[str, ...] = ("train",)
  # The aggregation slot (`--aggregator`, `tff_cluster.core.mechanisms`): a
  # definition whose server reads only sums of its clients' deltas sets
  # `aggregation_slot` and says where they are (`update_parts`); one whose
  # host reads each client's update says which step does
  # (`individual_updates`, a phrase), and refuses every aggregator but mean.
  aggregation_slot: bool = False
  individual_updates: str = ""
  # A definition whose client code the side-by-side trainer cannot run says
  # why (`--client_batching=parallel` is refused; `auto` runs it one client
  # after another wherever it would choose side by side).
  sequential_only: str = ""
  # A definition whose client code reads each example's row in the client's
  # data (per-example state: `trainers.ExampleWeights.rows`) sets it; the
  # runners then give each batch its rows.
  example_rows: bool = False

  def __init__(self, weights_spec: Sequence[tf.TensorSpec], num_trainable: int,
               solver: LocalSolver = LocalSolver()):
    self.weights_spec = [tf.TensorSpec(s.shape, s.dtype) for s in weights_spec]
    self.num_trainable = int(num_trainable)
    self.local_step = solver.step()
    self.client_optimizer = optimizers.chain(self.local_step)
    self.persist_momentum = bool(solver.persist) and float(solver.momentum) > 0

  @property
  def trainable_spec(self) -> List[tf.TensorSpec]:
    """`tf.TensorSpec` per trainable weight."""
    return list(self.weights_spec[:self.num_trainable])

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
    every one (`selected`), or None when the mode's clients need only their
    key. Only called when `num_keys(mode)` > 0."""
    del state, mode
    return None

  def num_keys(self, mode: str) -> int:
    """K: the number of rows of `database` (valid keys are 0..K-1)."""
    del mode
    return 0

  def broadcast(self, state, params, mode: str):
    raise NotImplementedError

  def client_work(self, trainer, selected, received, client_state, data,
                  mode: str, key=None) -> ClientOutput:
    """One client's work. `key`: its key (a scalar int32 tensor) in a mode
    with keys, else None."""
    raise NotImplementedError

  def server_update(self, state, summed, mode: str):
    raise NotImplementedError

  def update_parts(self, mode: str):
    """The `UpdateParts` of `mode`'s `summed` (None: the mode sends no
    update, e.g. a cluster choice only)."""
    del mode
    return None

  def with_server_optimizer(self, optimizer: optimizers.Chain) -> "Definition":
    """A copy of this definition whose server optimizer is `optimizer` (a
    chain, e.g. `optimizers.from_tff` of a TFF optimizer); refused in one
    line by a definition without one."""
    if not hasattr(self, "server_optimizer"):
      raise ValueError(f"{type(self).__name__} has no server optimizer; valid: the "
                       "definitions with one (FedAvg's family, IFCA, HypCluster)")
    new = copy.copy(self)
    new.server_optimizer = optimizer
    return new

  # -- per-client state ----------------------------------------------------

  def client_state_spec(self, mode: str):
    """`tf.TensorSpec` structure of one client's state, or None if it has none."""
    del mode
    if not self.persist_momentum:
      return None
    return collections.OrderedDict(velocity=tf.nest.flatten(
        self.client_optimizer.state_spec(self.trainable_spec)))

  def initial_client_state(self, mode: str):
    spec = self.client_state_spec(mode)
    if spec is None:
      return None
    return tf.nest.map_structure(
        lambda s: np.zeros(s.shape, s.dtype.as_numpy_dtype), spec)

  # -- helpers for subclasses ----------------------------------------------

  def local_update(self, trainer, start, data, lr, client_state,
                   optimizer=None) -> Tuple[trainers.TrainResult, Any]:
    """Local steps from `start` with `optimizer` (default
    `client_optimizer`); threads the client's persisted optimizer state (the
    client state's `velocity`, the state as one flat list).

    Returns the training result and the client's new state (None when the
    algorithm keeps no client state).
    """
    opt = self.client_optimizer if optimizer is None else optimizers.as_chain(optimizer)
    opt_state = None
    if client_state is not None and "velocity" in client_state:
      opt_state = opt.unflat_state(client_state["velocity"], self.trainable_spec)
    out = trainer.train(start, data, lr, opt, opt_state)
    if client_state is None:
      return out, None
    new_state = collections.OrderedDict(client_state)
    if opt_state is not None:
      new_state["velocity"] = opt.flat_state(out.opt_state)
    return out, new_state


def flat_norm(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
  """Euclidean norm of a list of tensors taken as one vector."""
  return tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(t)) for t in tensors]))


class HostModelsDefinition(Definition):
  """K models stacked in the server state (`models`, [K, ...] per weight):
  a client receives its key's row and the round's learning rate, and sends
  back what `client_work` (a subclass's) returns; the models change on the
  host only (its driver puts the new state), never in `server_update`."""

  def __init__(self, weights_spec, num_trainable: int, num_models: int,
               solver: LocalSolver = LocalSolver()):
    super().__init__(weights_spec, num_trainable, solver)
    self.k = int(num_models)

  def initial_state(self, initial_weights):
    return collections.OrderedDict(models=cluster_ops.stack_models(initial_weights, self.k))

  def num_keys(self, mode):
    return self.k

  def database(self, state, mode):
    return list(state["models"])

  def broadcast(self, state, params, mode):
    return collections.OrderedDict(lr=params["lr"])

  def server_update(self, state, summed, mode):
    return collections.OrderedDict(models=list(state["models"]))
