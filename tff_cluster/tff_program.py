"""`tff.program` components over the library's federated data (the TFF stack).

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

import json
from typing import List, Optional

import numpy as np
import tensorflow as tf

from tff_cluster import stack

stack.require_tff()
import tensorflow_federated as tff  # noqa: E402

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
    self._rng = np.random.default_rng(np.random.SeedSequence([self.source.seed, 7]))
    if rng_state is not None:
      self._rng.bit_generator.state = rng_state

  @property
  def round_num(self) -> int:
    """Rounds selected so far (the next `select` is round `round_num + 1`)."""
    return self._round

  @property
  def federated_type(self) -> tff.FederatedType:
    return self.source.federated_type

  def select(self, k: Optional[int] = None) -> List[tf.data.Dataset]:
    """The next round's `k` clients' datasets, in client order."""
    limit = len(self.source.training_clients)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= limit:
      raise ValueError(f"invalid number of clients to select: {k!r}; valid: 1..{limit} (the "
                       "clients with training data)")
    clients = sample_clients(self._rng, self.source.training_clients, int(k))
    self._round += 1
    return [self.source.dataset(int(c), self._round) for c in clients]

  def selected_clients(self, k: int) -> List[str]:
    """The ids the next `select(k)` would give, without advancing."""
    probe = type(self)(self._round, self._rng.bit_generator.state)
    clients = sample_clients(probe._rng, self.source.training_clients, int(k))
    return [self.source.data.client_ids[int(c)] for c in clients]

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
