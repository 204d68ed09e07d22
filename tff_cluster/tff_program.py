"""TFF's program machinery over the library (the TFF stack): a data source,
`LearningProcess`es, and programs for the algorithms with host steps.

* `ClientDataSource`: a `tff.program.FederatedDataSource` (below).
* `build_learning_process(algo, ...)`: the round of an algorithm whose round
  is TensorFlow end to end as a `tff.learning.templates.LearningProcess` that
  `tff.learning.programs.train_model` drives (`tff.learning`'s metrics layout),
  optionally with a `tff.aggregators` factory (`model_aggregator`: TFF's
  DP-FedAvg, robust or mean aggregators) combining the clients' updates.
* `train_program(process, data, ...)`: any algorithm, host steps included, in
  `tff.program`'s style, resuming from its program state.

`ClientDataSource` is a `tff.program.FederatedDataSource` over a
`FederatedData` (a pair of TFF `ClientData` goes through
`tff_cluster.data.client_data.from_client_data` first). Each `select(k)` of its
iterator draws k distinct clients with training data as the library's training
loop draws a round's clients (`host.driver.sample_clients`, from the generator
seeded by (seed, 7)) and gives each client that round's batches as every runner
shuffles them (`schedule.client_dataset`, seeded by (seed, round, client)); so
a `LearningProcess` driven by `tff.learning.programs.train_model` over it sees
the clients and batches of the same run on the `tff` runner.

The iterator holds the round and the generator's state only, never the data:
`copy.deepcopy` (which `train_model` does every round) shares the source's
arrays, and `to_bytes` / `from_bytes` (TFF's `FileProgramStateManager`) write
and read a few hundred bytes. A restored iterator continues the same draws,
so a stopped program resumes exactly. `from_bytes` reads into the iterator
class of the source it was made from: create the source (same data, same
settings) before the program state manager loads its state.
"""

from __future__ import annotations

import collections
import copy
import json
from typing import List, Optional

import numpy as np
import tensorflow as tf

from tff_cluster import seeds
from tff_cluster import stack

stack.require_tff()
import tensorflow_federated as tff  # noqa: E402
# What `FileProgramStateManager` saves by `to_bytes` (TFF 0.87 does not export it).
from tensorflow_federated.python.common_libs import serializable  # noqa: E402

from tff_cluster import api  # noqa: E402
from tff_cluster.algorithms.fedavg import fedavg  # noqa: E402
from tff_cluster.core import mechanisms  # noqa: E402
from tff_cluster.core.definition import round_params  # noqa: E402
from tff_cluster.data.federated import FederatedData  # noqa: E402
from tff_cluster.host.driver import sample_clients  # noqa: E402
from tff_cluster.learning import schedule  # noqa: E402
from tff_cluster.runners.tff import types as tff_types  # noqa: E402


class ClientDataSourceIterator(tff.program.FederatedDataSourceIterator):
  """An iterator of a `ClientDataSource` (made by its `iterator()`): the
  round it is at and its sampling generator."""

  source: "ClientDataSource"  # set on each source's own subclass

  def __init__(self, round_num: int = 0, rng_state: Optional[dict] = None):
    self._round = int(round_num)
    self._rng = seeds.generator(self.source.seed, "client_sampling")
    if rng_state is not None:
      self._rng.bit_generator.state = rng_state

  @property
  def round_num(self) -> int:
    """Rounds selected so far (the next `select` is round `round_num + 1`)."""
    return self._round

  @property
  def federated_type(self) -> tff.FederatedType:
    return self.source.federated_type

  def _next(self, k) -> np.ndarray:
    """The next round's `k` clients (indices, sorted); advances the round."""
    limit = len(self.source.training_clients)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= limit:
      raise ValueError(f"invalid number of clients to select: {k!r}; valid: 1..{limit} (the "
                       "clients with training data)")
    clients = sample_clients(self._rng, self.source.training_clients, int(k))
    self._round += 1
    return clients

  def select(self, k: Optional[int] = None) -> List[tf.data.Dataset]:
    """The next round's `k` clients' datasets, in client order."""
    return [self.source.dataset(int(c), self._round) for c in self._next(k)]

  def next_clients(self, k: int) -> List[str]:
    """The ids `select(k)` would give, advancing as it does (no datasets made)."""
    return [self.source.data.client_ids[int(c)] for c in self._next(k)]

  def selected_clients(self, k: int) -> List[str]:
    """The ids the next `select(k)` would give, without advancing."""
    return copy.deepcopy(self).next_clients(k)

  def to_bytes(self) -> bytes:
    return json.dumps({"round": self._round,
                       "rng": self._rng.bit_generator.state}).encode()

  @classmethod
  def from_bytes(cls, buffer: bytes) -> "ClientDataSourceIterator":
    if cls is ClientDataSourceIterator:
      raise TypeError("from_bytes reads into a ClientDataSource's own iterator class: "
                      "create the source first (type(source.iterator()).from_bytes)")
    saved = json.loads(bytes(buffer).decode())
    return cls(saved["round"], saved["rng"])

  def __deepcopy__(self, memo) -> "ClientDataSourceIterator":
    return type(self)(self._round, self._rng.bit_generator.state)

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, ClientDataSourceIterator):
      return NotImplemented
    return (other.source is self.source and other._round == self._round
            and other._rng.bit_generator.state == self._rng.bit_generator.state)


class ClientDataSource(tff.program.FederatedDataSource):
  """A `tff.program.FederatedDataSource` over `data`'s training sets.

  Args:
    data: a `FederatedData`.
    batch_size, epochs, steps: each selected client's local work
      (`schedule.LocalWork`: `epochs` reshuffled passes, or the first `steps`
      batches of them).
    seed: the run's seed (the client draws and the shuffles).
  """

  def __init__(self, data: FederatedData, batch_size: int, epochs: int = 1,
               steps: Optional[int] = None, seed: int = 0):
    if not isinstance(data, FederatedData):
      raise TypeError(f"data must be a FederatedData, got {type(data).__name__} (a pair of "
                      "TFF ClientData: tff_cluster.data.client_data.from_client_data first)")
    self.data = data
    self.work = schedule.LocalWork(batch_size, epochs=None if steps else epochs, steps=steps)
    self.seed = int(seed)
    self.training_clients = np.asarray(data.training_clients())
    if not len(self.training_clients):
      raise ValueError("no client has training data; valid: data with at least one "
                       "client holding training samples")
    first = data.train[data.client_ids[int(self.training_clients[0])]]
    self.element_spec = schedule.client_dataset(*first, batch_size, 1, 0).element_spec
    self._federated_type = tff.FederatedType(tff_types.sequence_type(self.element_spec),
                                             tff.CLIENTS)
    self._iterator_class = type("ClientDataSourceIterator", (ClientDataSourceIterator,),
                                {"source": self})

  @property
  def federated_type(self) -> tff.FederatedType:
    return self._federated_type

  def iterator(self) -> ClientDataSourceIterator:
    return self._iterator_class()

  def dataset(self, client: int, round_num: int) -> tf.data.Dataset:
    """Client `client`'s (an index into `data.client_ids`) batches in round
    `round_num`, as the runners give them."""
    x, y = self.data.train[self.data.client_ids[client]]
    return schedule.work_dataset(x, y, self.work,
                                 schedule.client_seed(self.seed, round_num, client))


# Options whose other values make the host run steps before round 1, which
# a LearningProcess (the round computation only) cannot: value -> the one it runs.
HOST_STEP_OPTIONS = {"ifca_init": "random"}

# The modes a round runs, in order, on the same clients, where not just
# `train` (full Mime: the clients' full-batch gradients, then the local steps).
ROUND_MODES = {"mime": ("gradient", "train")}


def build_learning_process(algo: str, model_fn, loss, element_spec, initial_weights,
                           client_lr: float, options=None, *, modes=None,
                           model_index: int = 0, data=None,
                           client_momentum: float = 0.0, server_optimizer=None,
                           client_optimizer=None, model_aggregator=None):
  """`algo`'s round as a `tff.learning.templates.LearningProcess` that
  `tff.learning.programs.train_model` drives.

  For the algorithms whose round is TensorFlow end to end: its modes (`modes`,
  default `ROUND_MODES`' or `train`, run in order on the same clients) take
  no per-client keys and no per-client state from the host (the FedAvg
  family, the server-optimizer variants, FedProx, Mime and MimeLite, IFCA,
  CFL-MGD).
  The process state is the definition's (`definition.initial_state` of
  `initial_weights`: every cluster model for a clustered one, the server
  optimizer's state); `next` runs the round computation of
  `tff_cluster.api.computations` with `client_lr`, and its metrics follow
  `tff.learning`'s layout: `client_work/train/{loss, loss_sum, num_examples}`
  (`num_examples`: the FedAvg family's summed aggregation weights, the
  examples under the default `client_weighting`).
  `get_model_weights` gives one model: the state's model, or for a clustered
  state (K stacked models) model `model_index` (every cluster's is in the
  state, `state['models']`); `set_model_weights` sets that one.

  `server_optimizer` / `client_optimizer`: a `tff.learning.optimizers`
  optimizer (`build_sgdm`, `build_adam`, `build_yogi`, `build_adagrad`) run
  as the library's chain of the same rule and numbers (`optimizers.from_tff`),
  in place of the definition's server optimizer (per cluster for IFCA and
  HypCluster: its state stacked) / of the clients' local step; anything
  else is refused in one line.

  `model_aggregator`: a `tff.aggregators` factory combining the clients'
  updates (each client's delta in its cluster's row, with its weight for a
  weighted factory) in place of the library's sum, for the algorithms with
  the aggregation slot; the rule: `_aggregated_process`, docs/privacy.md.

  Args: as `api.computations` (options by name, `data` and
  `client_momentum` to the definition), plus the clients' learning rate and `initial_weights`: one
  model's weight list, or for a clustered one a list per cluster (K equal
  models would tie every client's choice to cluster 0).
  """
  _check_host_steps(algo, options)
  _check_factory(model_aggregator)
  definition, computations = api.computations(algo, model_fn, loss, element_spec, options,
                                              data=data, client_momentum=client_momentum,
                                              server_optimizer=server_optimizer,
                                              client_optimizer=client_optimizer)
  initial = definition.initial_state(tf.nest.map_structure(np.asarray, list(initial_weights)))
  _check_process_algorithm(algo, computations, initial)
  modes = tuple(modes or ROUND_MODES.get(algo, ("train",)))
  _check_modes(algo, definition, computations, modes)
  _check_distinct_models(algo, initial)
  if model_aggregator is not None:
    _check_aggregation_slot(algo, definition, modes)
    return _aggregated_process(definition, computations[modes[0]], modes[0], initial,
                               model_aggregator, client_lr, model_index)
  rounds = [computations[mode].computation for mode in modes]
  round_comp = rounds[-1]
  state_type, data_type = (round_comp.type_signature.parameter[i] for i in (0, 2))
  params = tf.nest.map_structure(np.asarray, round_params(client_lr))
  weights_of, with_weights = _model_access(initial, definition.num_trainable, model_index)

  @tff.tensorflow.computation
  def initial_state():
    return tf.nest.map_structure(tf.constant, initial)

  @tff.federated_computation
  def initialize():
    return tff.federated_eval(initial_state, tff.SERVER)

  @tff.tensorflow.computation(data_type.member)
  def position(dataset):
    del dataset  # every row of the collected results is dropped here
    return tf.constant(0, tf.int32)

  summed_type = round_comp.type_signature.result[1].member

  @tff.tensorflow.computation(summed_type)
  def metrics(summed):
    # The FedAvg family sums its aggregation weights ("weight": the examples
    # under the default weighting) instead of the examples.
    n = summed["num_examples"] if "num_examples" in summed else summed["weight"]
    return collections.OrderedDict(client_work=collections.OrderedDict(
        train=fedavg.train_metrics(summed["loss_sum"], n)))

  @tff.federated_computation(state_type, data_type)
  def next_fn(state, data):
    positions = tff.federated_map(position, data)
    for comp in rounds:
      state, summed, _ = comp(state, tff.federated_value(params, tff.SERVER), data, positions)
    return tff.learning.templates.LearningProcessOutput(state, tff.federated_map(metrics, summed))

  get_model_weights = tff.tensorflow.computation(weights_of, state_type.member)
  model_type = get_model_weights.type_signature.result
  set_model_weights = tff.tensorflow.computation(with_weights, state_type.member, model_type)
  return tff.learning.templates.LearningProcess(initialize, next_fn, get_model_weights,
                                                set_model_weights)


# The state's entry of a `model_aggregator`'s process state.
AGGREGATOR_STATE = "model_aggregator"
FACTORIES = ("a tff.aggregators factory: an UnweightedAggregationFactory (e.g. "
             "tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(...)) or a "
             "WeightedAggregationFactory (e.g. tff.aggregators.MeanFactory(), "
             "tff.learning.robust_aggregator())")


def _check_factory(model_aggregator) -> None:
  """ValueError (one line) for a `model_aggregator` that is not a factory."""
  if model_aggregator is None or isinstance(
      model_aggregator, (tff.aggregators.UnweightedAggregationFactory,
                         tff.aggregators.WeightedAggregationFactory)):
    return
  raise ValueError(f"invalid model_aggregator={model_aggregator!r} (a "
                   f"{type(model_aggregator).__name__}); valid: None, or {FACTORIES}")


def _check_aggregation_slot(algo: str, definition, modes) -> None:
  """ValueError (one line) for a round whose updates a factory cannot take:
  an algorithm without update parts, or a round of several modes."""
  without = [m for m in modes if definition.update_parts(m) is None]
  if not getattr(definition, "aggregation_slot", False) or without:
    what = (f"its {without[0]} round sends no update" if without and
            getattr(definition, "aggregation_slot", False) else
            "its server does not read only sums of its clients' updates (no update parts)")
    raise ValueError(f"model_aggregator with {algo}: {what}; valid: model_aggregator=None, "
                     "or an algorithm with the aggregation slot (fedavg and its server "
                     "optimizers, fedprox, ifca)")
  if len(modes) != 1:
    raise ValueError(f"model_aggregator with {algo}'s round of modes {', '.join(modes)}: "
                     "one factory aggregates one mode's updates; valid: a round of one mode")


def _record_computations(parts, summed_type, weighted: bool):
  """(split, assemble, train_metrics): a client's summed as (its record, its
  weight, the rest); the rest's sum and the factory's result as the
  definition's summed (`_aggregated_process`' rule); the training metrics of
  the rest's sum."""
  layout = {}

  @tff.tensorflow.computation(summed_type)
  def split(summed):
    summed = collections.OrderedDict(summed)
    flat, layout["rebuild"] = mechanisms.flatten_parts(summed, parts.updates)
    layout["keys"] = list(summed)
    w = tf.reduce_sum(summed[parts.weight])
    safe = tf.where(w > 0, w, 1.0)
    rest = collections.OrderedDict((k, v) for k, v in summed.items()
                                   if k not in parts.updates)
    return [u / safe for u in flat], w, rest

  rest_type = split.type_signature.result[2]
  record_type = split.type_signature.result[0]

  @tff.tensorflow.computation(rest_type, record_type)
  def assemble(rest, result):
    rest = collections.OrderedDict(rest)
    weight = rest[parts.weight]
    values = tf.nest.flatten(result)
    if weighted:
      total = tf.reduce_sum(weight)
      values = [v * total for v in values]
    else:
      rest[parts.weight] = tf.ones_like(weight)
    summed = collections.OrderedDict((k, rest.get(k)) for k in layout["keys"])
    layout["rebuild"](summed, values)
    return summed

  @tff.tensorflow.computation(rest_type)
  def train_metrics(rest):
    n = rest["num_examples"] if "num_examples" in rest else rest[parts.weight]
    return collections.OrderedDict(train=fedavg.train_metrics(rest["loss_sum"], n))

  return split, assemble, train_metrics


def _aggregated_process(definition, round_computation, mode: str, initial, factory,
                        client_lr: float, model_index: int):
  """The LearningProcess of `mode`'s round with `factory` aggregating the
  update parts (`Definition.update_parts`) in place of the library's sum.

  Each client's record is its delta in its cluster's row (the update parts
  over its summed weight w: a [K, ...] stack, zeros elsewhere, for a
  clustered definition), aggregated by the factory's process with weight w
  (a `WeightedAggregationFactory`, e.g. `tff.aggregators.MeanFactory()`,
  `tff.learning.robust_aggregator()`) or unweighted (an
  `UnweightedAggregationFactory`, e.g. `DifferentiallyPrivateFactory`). The
  server update then gets, in place of the update sums: for a weighted
  factory, its result times the round's total weight W beside the summed
  weights W_k (row k becomes the result's row k x W / W_k: each cluster's own
  weighted mean where the factory is the mean); for an unweighted one its
  result beside weights of 1 in every row (DP-FedAvg's rule, as
  `--aggregator=dp_fixed`: the noised sum over the factory's
  `clients_per_round` for every cluster, members or not). The process state
  is the state's `model_aggregator` entry, beside the definition's; its
  measurements are the metrics' `aggregator`."""
  d = definition
  broadcast_fn, client_fn, server_fn = round_computation.parts
  data_type = client_fn.type_signature.parameter[1]  # (received, dataset, position)
  weighted = isinstance(factory, tff.aggregators.WeightedAggregationFactory)
  split, assemble, train_metrics = _record_computations(
      d.update_parts(mode), client_fn.type_signature.result[0], weighted)
  record_type, weight_type, _ = split.type_signature.result
  process = factory.create(record_type, weight_type) if weighted else factory.create(record_type)

  @tff.tensorflow.computation(data_type)
  def position(dataset):
    del dataset
    return tf.constant(0, tf.int32)

  @tff.tensorflow.computation
  def initial_state():
    return tf.nest.map_structure(tf.constant, initial)

  def combined(state, aggregator_state):
    return tff.federated_zip(collections.OrderedDict(
        [(k, state[k]) for k in initial] + [(AGGREGATOR_STATE, aggregator_state)]))

  @tff.federated_computation
  def initialize():
    return combined(tff.federated_eval(initial_state, tff.SERVER), process.initialize())

  params = tf.nest.map_structure(np.asarray, round_params(client_lr))
  state_type = initialize.type_signature.result

  @tff.federated_computation(state_type, tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(state, data):
    inner = tff.federated_zip(collections.OrderedDict((k, state[k]) for k in initial))
    received = tff.federated_broadcast(tff.federated_map(
        broadcast_fn, (inner, tff.federated_value(params, tff.SERVER))))
    out = tff.federated_map(client_fn, (received, data, tff.federated_map(position, data)))
    record = tff.federated_map(split, out[0])
    rest = tff.federated_sum(record[2])
    if weighted:
      aggregated = process.next(state[AGGREGATOR_STATE], record[0], record[1])
    else:
      aggregated = process.next(state[AGGREGATOR_STATE], record[0])
    new = tff.federated_map(server_fn, (inner, tff.federated_map(
        assemble, (rest, aggregated.result))))
    metrics = tff.federated_zip(collections.OrderedDict(
        client_work=tff.federated_map(train_metrics, rest),
        aggregator=aggregated.measurements))
    return tff.learning.templates.LearningProcessOutput(combined(new, aggregated.state),
                                                        metrics)

  weights_of, with_weights = _model_access(initial, d.num_trainable, model_index)
  get_model_weights = tff.tensorflow.computation(weights_of, state_type.member)
  model_type = get_model_weights.type_signature.result
  set_model_weights = tff.tensorflow.computation(with_weights, state_type.member, model_type)
  return tff.learning.templates.LearningProcess(initialize, next_fn, get_model_weights,
                                                set_model_weights)


def _check_modes(algo: str, definition, computations, modes) -> None:
  """ValueError (one line) for a mode the definition lacks, or one whose
  round takes per-client keys or states from the host."""
  for mode in modes:
    if mode not in computations:
      raise ValueError(f"invalid mode {mode!r} for {algo}; valid: {', '.join(computations)}")
    needs = [what for what, needed in (
        ("keys", definition.num_keys(mode) > 0),
        ("states", definition.client_state_spec(mode) is not None)) if needed]
    if needs:
      raise ValueError(f"{algo}'s {mode} round takes per-client {' and '.join(needs)} from "
                       "the host, which a LearningProcess cannot pass; valid: its "
                       "api.computations driven by a program, or build(..., runner='tff')")


def _check_host_steps(algo: str, options) -> None:
  """ValueError for an option value whose host steps before round 1 a
  LearningProcess cannot run."""
  for name, plain in HOST_STEP_OPTIONS.items():
    value = dict(options or {}).get(name, plain)
    if value != plain:
      raise ValueError(f"{name}={value!r} is a host step before round 1 (the cluster models' "
                       "start) that a LearningProcess cannot run; valid: "
                       f"{name}={plain!r} with K different initial_weights, or "
                       f"train_program(api.build({algo!r}, ..., runner='tff'), ...)")


def _check_process_algorithm(algo: str, computations, initial) -> None:
  """ValueError (one line) for an algorithm whose state holds no model (its
  rounds need host steps)."""
  if "model" not in initial and "models" not in initial:
    raise ValueError(f"{algo}'s rounds need the host's steps between its computations "
                     f"({', '.join(computations)}), which a LearningProcess cannot run; "
                     f"valid: train_program(api.build({algo!r}, ..., runner='tff'), ...), or "
                     "an algorithm whose round is TensorFlow end to end (the FedAvg family, "
                     "FedProx, Mime, MimeLite, IFCA, CFL-MGD)")


def _check_distinct_models(algo: str, initial) -> None:
  """ValueError (one line) for K identical starting cluster models."""
  if "models" in initial:
    rows = [np.asarray(w) for w in initial["models"]]
    k = rows[0].shape[0]
    if k > 1 and all(np.array_equal(w[0], w[j]) for w in rows for j in range(1, k)):
      raise ValueError(f"the {k} starting models of {algo} are identical, so every client's "
                       "choice ties to model 0 and the clusters never split; valid: "
                       f"initial_weights a list of {k} different weight lists, one per cluster")


def _model_access(state, num_trainable: int, model_index: int):
  """(state -> ModelWeights, (state, ModelWeights) -> state) for a state
  holding one model (`model`) or K stacked ones (`models`, row
  `model_index`)."""
  if "model" in state:
    def pick(s):
      return list(s["model"])

    def put(s, weights):
      out = collections.OrderedDict(s)
      out["model"] = weights
      return out
  elif "models" in state:
    k = int(np.shape(state["models"][0])[0])
    if not 0 <= model_index < k:
      raise ValueError(f"invalid model_index={model_index}; valid: 0..{k - 1} (the state's "
                       f"{k} models)")

    def pick(s):
      return [w[model_index] for w in s["models"]]

    def put(s, weights):
      out = collections.OrderedDict(s)
      out["models"] = [tf.tensor_scatter_nd_update(w, [[model_index]], v[None])
                       for w, v in zip(s["models"], weights)]
      return out
  else:
    raise ValueError(f"a state with {sorted(state)} holds no model a LearningProcess can "
                     "give (valid: 'model' or 'models')")

  def weights_of(s):
    w = pick(s)
    return tff.learning.models.ModelWeights(trainable=w[:num_trainable],
                                            non_trainable=w[num_trainable:])

  def with_weights(s, model):
    return put(s, list(model.trainable) + list(model.non_trainable))

  return weights_of, with_weights


class ProcessBytes(serializable.Serializable):
  """A process state's bytes (`api.Process.state_to_bytes`) as a value a
  `tff.program.ProgramStateManager` saves."""

  def __init__(self, payload: bytes = b""):
    self.payload = bytes(payload)

  def to_bytes(self) -> bytes:
    return self.payload

  @classmethod
  def from_bytes(cls, buffer: bytes) -> "ProcessBytes":
    return cls(buffer)

  def __eq__(self, other: object) -> bool:
    return isinstance(other, ProcessBytes) and other.payload == self.payload


async def train_program(process, data: FederatedData, *, train_data_source: ClientDataSource,
                        train_per_round_clients: int, train_total_rounds: int,
                        program_state_manager, train_metrics_manager=None) -> None:
  """Any algorithm's rounds, host steps included (FedGroup's cold start and
  newcomers, WeCFL's K-means, CFL's splits, pFedMo's scoring, FL+HC's and
  PACFL's clusterings, StoCFL's merges, FedSoft's re-estimation), in
  `tff.program`'s style: the clients each round come from
  `train_data_source` (a `ClientDataSource` over `data`, drawn as the
  training loop draws them), the program state (the round, the data
  iterator, and the process state: server, clients and host, as
  `ProcessBytes`) goes to `program_state_manager` after every round, and
  each round's metrics to `train_metrics_manager`. A program stopped and
  started again loads the latest program state and goes on to
  `train_total_rounds` exactly as an uninterrupted one.

  `process`: a new `api.build(...)` process (runner 'tff', or any other);
  `initialize(data)` runs here (the set-up is seeded, so a restarted program
  makes the same one before loading the saved state). Its rounds run on the
  process's runner (the `tff` runner's own TFF context), not through a
  `tff.program` federated context: the host steps between a round's
  computations are Python that must see each result.
  """
  if train_data_source.data is not data:
    raise ValueError("train_data_source must be a ClientDataSource over the same data the "
                     "process trains on")
  state = process.initialize(data)
  iterator = train_data_source.iterator()
  saved, version = await program_state_manager.load_latest(
      collections.OrderedDict(round=0, data=iterator, process=ProcessBytes()))
  start = 0
  if saved is not None:
    start, iterator = int(saved["round"]), saved["data"]
    state = process.state_from_bytes(saved["process"].payload)
  else:
    await program_state_manager.save(collections.OrderedDict(
        round=0, data=iterator, process=ProcessBytes(process.state_to_bytes(state))), version=0)
  for round_num in range(start + 1, train_total_rounds + 1):
    out = process.next(state, iterator.next_clients(train_per_round_clients))
    state = out.state
    if train_metrics_manager is not None:
      await train_metrics_manager.release(
          {k: v for k, v in out.metrics.items() if isinstance(v, (int, float, np.number))},
          key=round_num)
    await program_state_manager.save(collections.OrderedDict(
        round=round_num, data=iterator, process=ProcessBytes(process.state_to_bytes(state))),
        version=round_num)
