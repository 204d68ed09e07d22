"""LG-FedAvg (Liang et al., "Think Locally, Act Globally: Federated Learning
with Local and Global Representations", arXiv:2001.01523, 2019): local
representations (the body) on every client, a global head averaged by the
server.

Rule (the authors' code, pliang279/LG-FedAvg `main_lg.py`, `models/Update.py`):
FedPer's split turned over. A sampled client trains its own body with the
round's global head for the local work and sends the head; the server
averages the heads (`--client_weighting`; the code's mean is uniform:
`--client_weighting=samples` with equal sizes, or the processed examples by
default). The global part is the model's last `--head_layers` layers with
weights (the code keeps 3 of its MNIST MLP's 5 layers global, 2 of its CIFAR
CNN's; FL-bench 1, the default here), or `--head_names`.

Left out, on purpose: the code starts the LG phase from the FedAvg checkpoint
with the best *test* accuracy and keeps each client's best model by test
accuracy; both choose models on test labels. Here every run starts from the
seeded initial model and each client is tested, at the final round, with
its own body and the global head (a client never sampled: the initial body).
"""

from __future__ import annotations

from tff_cluster.algorithms import personal
from tff_cluster.core import personal as parts
from tff_cluster.host import driver


def body_indices(model, options):
  """Every weight outside the head: LG-FedAvg's personal part."""
  head = set(parts.head_indices(model, options.head_layers, options.head_names, "lg_fedavg"))
  return [i for i in range(len(parts.models.model_variables(model))) if i not in head]


def definition(context: driver.Context) -> personal.SplitDefinition:
  """The body personal, the head (`--head_layers` / `--head_names`) shared."""
  return personal.split_definition(context, body_indices(context.model.model_fn(),
                                                         context.options))
