"""Ditto (Li et al., "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021): FedAvg for a global model w, and on every
client a personal model v_k pulled toward it.

Rule (the authors' code, litian96/ditto `flearn/trainers_MTL/ditto.py`,
`Server.train`): a sampled client receives w_t; on the same minibatches its
personal model takes v_k <- v_k - lr (grad F_k(v_k) + lambda (v_k - w_t))
(the anchor is the round's w_t) and its copy of the global model plain SGD
steps; it sends w_k - w_t, and the server takes the weighted mean
(`--client_weighting`; the code samples clients in proportion to their data
and takes a simple mean). The code interleaves the two models' steps per
minibatch; they are independent given the batches, so training one after
the other on the same batches gives the same v_k and w_k (FL-bench runs them
one after the other too). Every v_k starts at w_0; a client never sampled is
tested with w_0 (`--ditto_unseen=initial`, the code's) or the current global
model (`global`). The personal model's optimizer state starts afresh every
round; the global copy's follows the run's `--client_state`.

`--ditto_lambda` (default 1, the authors' FMNIST script); 0 gives
independent local models beside FedAvg (the code's README).
"""

from __future__ import annotations

from tff_cluster.algorithms import personal
from tff_cluster.host import driver


def definition(context: driver.Context) -> personal.FullPersonalDefinition:
  """FedAvg's global model and a personal v_k per client, pulled by
  `--ditto_lambda`."""
  options = context.options
  return personal.full_definition(context, weighting=options.client_weighting,
                                  lam=options.ditto_lambda)


class DittoDriver(personal.PersonalDriver):
  """A client never sampled is tested with `--ditto_unseen`'s model."""

  def __init__(self, context: driver.Context, definition: personal.FullPersonalDefinition):
    super().__init__(context, definition)
    self.unseen = context.options.ditto_unseen
