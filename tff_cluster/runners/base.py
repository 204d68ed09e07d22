"""What every runner shares: the `Runner` interface, the `ClientStateStore`
interface with its in-memory `DictClientStore`, `RoundOutput`, key checks and
`to_numpy`.

Every runner implements `run(mode, state, clients, round_num, work, lr, keys,
client_states, **store_args) -> RoundOutput`, given the same client batches,
and parity tests hold them to the same numbers.
"""

from __future__ import annotations

import collections.abc
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from tff_cluster.learning import evaluation


class RoundOutput(NamedTuple):
  """state: the new server state (runner's representation; `numpy_state`
  converts); summed: the clients' summed values (numpy); results: one numpy
  structure per client; client_states: one new state per client (opaque to
  the caller), or None."""
  state: Any
  summed: Any
  results: List[Any]
  client_states: Optional[List[Any]]


class WorkerLost(RuntimeError):
  """A worker process of a runner (a Ray actor) died during a run; the
  message is one line naming it."""


def to_numpy(structure):
  """A nested structure with every tensor as a numpy array."""
  import numpy as np
  import tensorflow as tf
  return tf.nest.map_structure(np.asarray, structure)


def combine_clients(definition, mode: str, total, results: List[Any]):
  """(total, results) of a call, where `definition` combines its clients'
  deltas by an order statistic in `mode` (`core.mechanisms.Aggregated`):
  the total's update parts replaced by the combination of the results'
  contributions, and the results without them; else as they are."""
  combines = getattr(definition, "combines", None)
  if combines is None or not combines(mode):
    return total, results
  inner, contributions = definition.split(results)
  return definition.combine(total, contributions, mode), inner


def check_keys(keys, num_keys: int, num_clients: int) -> None:
  """One key per client, each in 0..num_keys-1 (else one clear ValueError)."""
  if keys is None or len(keys) != num_clients:
    raise ValueError(f"need one key per client ({num_clients}), got "
                     f"{None if keys is None else len(keys)}")
  bad = [int(k) for k in keys if not 0 <= int(k) < num_keys]
  if bad:
    raise ValueError(f"invalid client keys {bad}; valid: 0..{num_keys - 1}")


class ClientStateStore(collections.abc.MutableMapping):
  """The per-client states a driver keeps between rounds, keyed by an int
  (the driver's state key of a client): a mapping, plus what a round and a
  checkpoint need of it.

  `lend(keys, fresh)` gives the states of a runner call and the extra
  arguments of `Runner.run` that say where they live; `keep(keys, states)`
  records the call's new states; `snapshot()` is the store now (cheap: states
  are never changed in place), `numpy_items(snapshot)` that snapshot as (key,
  numpy state) pairs with `items()` and `len()`, and `restore(states)` puts
  back a snapshot of this store or any (key, state) pairs with `items()` (a
  checkpoint's).
  """

  def lend(self, keys: Sequence[int], fresh: Callable[[int], Any]
           ) -> Tuple[List[Any], Dict[str, Any]]:
    raise NotImplementedError

  def keep(self, keys: Sequence[int], states: Sequence[Any]) -> None:
    raise NotImplementedError

  def snapshot(self) -> Any:
    raise NotImplementedError

  def numpy_items(self, snapshot) -> Any:
    raise NotImplementedError

  def restore(self, states) -> None:
    raise NotImplementedError


class DictClientStore(ClientStateStore):
  """The client states in this process's memory (the `local` and `tff`
  runners'): a call is lent the stored state of each key, or `fresh(i)` for
  the i-th key when it has none, and the new states replace them."""

  def __init__(self, items: Iterable[Tuple[int, Any]] = ()):
    self._states: Dict[int, Any] = dict(items)

  def __getitem__(self, key):
    return self._states[key]

  def __setitem__(self, key, value) -> None:
    self._states[key] = value

  def __delitem__(self, key) -> None:
    del self._states[key]

  def __iter__(self):
    return iter(self._states)

  def __len__(self) -> int:
    return len(self._states)

  def __contains__(self, key) -> bool:
    return key in self._states

  def lend(self, keys, fresh):
    return [self._states[s] if s in self._states else fresh(i)
            for i, s in enumerate(keys)], {}

  def keep(self, keys, states) -> None:
    for s, new in zip(keys, states):
      self._states[s] = new

  def snapshot(self) -> Dict[int, Any]:
    return dict(self._states)

  def numpy_items(self, snapshot) -> Dict[int, Any]:
    return {k: to_numpy(v) for k, v in snapshot.items()}

  def restore(self, states) -> None:
    self._states = dict(states.items())


class Runner:
  """What a driver asks of a runner: `run` (see the module docstring), the
  server state's conversions `put_state` / `numpy_state`, `describe()` for
  `config.json`, and two parts with defaults here: `client_store()`, where
  the driver's per-client states live (in this process), and
  `make_evaluator(split)`, an evaluator of every client's `split` (in this
  process, from the runner's `model_fn`, `loss` and `data`)."""

  name = ""
  model_fn: Callable[[], Any]
  loss: str
  data: Any

  def run(self, mode: str, state, clients: Sequence[int], round_num: int, work, lr: float,
          keys: Optional[Sequence[int]] = None, client_states: Optional[List[Any]] = None,
          **store_args) -> RoundOutput:
    raise NotImplementedError

  def put_state(self, state):
    raise NotImplementedError

  def numpy_state(self, state):
    raise NotImplementedError

  def describe(self) -> Dict[str, Any]:
    raise NotImplementedError

  def client_store(self) -> ClientStateStore:
    return DictClientStore()

  def make_evaluator(self, split: str = "test") -> evaluation.Evaluator:
    return evaluation.Evaluator(self.model_fn, self.loss, self.data, split=split)

  def client_summaries(self, fn: Callable[[Any, Any], Any], clients: Sequence[int],
                       split: str = "train") -> List[Any]:
    """`fn(x, y)` of each of `clients`' `split` arrays (numpy), computed where
    the data lives (here in this process; the ray runner's actors on their
    own clients): a one-shot summary of a client's data, e.g. PACFL's data
    subspaces. `fn` must be picklable for the ray runner (a module-level
    function or a `functools.partial` of one)."""
    return [client_summary(self.data, fn, int(k), split) for k in clients]


def client_summary(data, fn, client: int, split: str):
  """`fn(x, y)` of client `client`'s `split` arrays of `data` (a `FederatedData`)."""
  if split not in ("train", "test"):
    raise ValueError(f"invalid split {split!r}; valid: train, test")
  arrays = data.train if split == "train" else data.test
  x, y = arrays[data.client_ids[client]]
  return fn(x, y)
