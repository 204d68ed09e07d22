"""How a client's contribution is weighted, written once: FedAvg's weights
(`--client_weighting`) and the weighted mean update they make; shared by
FedAvg's family, IFCA's estimate and the personalized algorithms."""

from __future__ import annotations

import collections

import tensorflow as tf


def with_weight_spec(spec, weighting: str):
  """A client state spec with a `weight` scalar added for 'samples' (the host
  fills it with the client's training samples)."""
  if weighting != "samples":
    return spec
  out = collections.OrderedDict() if spec is None else collections.OrderedDict(spec)
  out["weight"] = tf.TensorSpec([], tf.float32)
  return out


def client_weight(out, client_state, weighting: str):
  """The client's averaging weight (`--client_weighting`): the examples
  processed in the round (n_k of FedAvg's paper: with local epochs, E x the
  client's data), or the client's training samples whatever the local work
  (FedBase, where 10 local steps process the same number of examples on every
  client)."""
  if weighting == "samples":
    return client_state["weight"]
  return out.num_examples


def add_mean_update(weights, updates, weight, scale: float = 1.0) -> list:
  """w + scale u / weight for each weight and its summed update (the
  weighted mean of the clients' deltas, `scale` the server's step on it);
  the weights unchanged where no client had weight (`weight` 0)."""
  safe = tf.where(weight > 0, weight, 1.0)
  return [tf.where(weight > 0, w + scale * u / safe, w) for w, u in zip(weights, updates)]
