"""What every runner shares: `RoundOutput`, key checks and `to_numpy`.

Both runners implement `run(mode, state, clients, round_num, work, lr, keys,
client_states) -> RoundOutput`, given the same client batches, and parity
tests hold them to the same numbers.
"""

from __future__ import annotations

from typing import Any, List, NamedTuple, Optional


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


def check_keys(keys, num_keys: int, num_clients: int) -> None:
  """One key per client, each in 0..num_keys-1 (else one clear ValueError)."""
  if keys is None or len(keys) != num_clients:
    raise ValueError(f"need one key per client ({num_clients}), got "
                     f"{None if keys is None else len(keys)}")
  bad = [int(k) for k in keys if not 0 <= int(k) < num_keys]
  if bad:
    raise ValueError(f"invalid client keys {bad}; valid: 0..{num_keys - 1}")
