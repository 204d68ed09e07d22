"""FedBN (Li et al., "FedBN: Federated Learning on Non-IID Features via Local
Batch Normalization", ICLR 2021): FedAvg in which every BatchNorm layer's
weights stay on the client.

Rule (the authors' code, med-air/FedBN `federated/fed_digits.py`,
`communication`): every weight of a BatchNorm layer (scale, offset and the
moving mean and variance, which are not trainable but are kept local too) is
never averaged; the rest is FedAvg's. The code weighs every client 1/N and
trains all clients every round; here the run's `--clients_per_round` and
`--client_weighting` apply (`--client_weighting=samples` with equal sizes
and every client sampled is the code's). Each client is tested with the
shared weights and its own BatchNorm layers; a client never sampled holds
the initial ones. A model without BatchNorm is refused.
"""

from __future__ import annotations

from tff_cluster.algorithms import personal
from tff_cluster.core import personal as parts
from tff_cluster.host import driver


def definition(context: driver.Context) -> personal.SplitDefinition:
  """Every BatchNorm layer's weights personal, the rest shared."""
  return personal.split_definition(context, parts.batchnorm_indices(context.model.model_fn(),
                                                                    "fedbn"))
