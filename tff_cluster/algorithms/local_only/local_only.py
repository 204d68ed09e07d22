"""Local-only training: every client trains its own model on its own data and
nothing is shared, the baseline every personalized paper reports (FedEM's
`local`, Ditto with lambda = 0 without the global model, FedRep's and PACFL's
`main_local.py`, FL-bench's and PFLlib's `local`).

Rule (FedEM's `NoCommunicationAggregator`): each client's model starts at the
same seeded w_0; a sampled client trains it for the run's local work with the
run's optimizer, batch size and learning rate; nothing is sent (0 bytes a
round). A client takes part as often as `--clients_per_round` samples it,
so its training budget is the federated runs' (every client every round:
`--clients_per_round` = the number of clients). Each client is tested with
its own model; a client never sampled with w_0.
"""

from __future__ import annotations

from tff_cluster.algorithms import personal
from tff_cluster.host import driver


def definition(context: driver.Context) -> personal.FullPersonalDefinition:
  """Each client's own model, trained alone; nothing is sent or averaged."""
  return personal.full_definition(context, weighting="processed", federated=False)
