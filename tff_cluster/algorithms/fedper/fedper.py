"""FedPer (Arivazhagan et al., "Federated Learning with Personalization
Layers", arXiv:1912.00818, 2019): a shared base trained with FedAvg and
personalization layers (the head) that stay on each client.

Rule (the paper's abstract for the split; the training as the FedRep
authors' `--alg fedper` runs it, lgcollins/FedRep `main_fedrep.py` and
`models/Update.py`; FedPer has no official code): each round a sampled client
loads the global base and its own head, trains **all** of them together for
the local work, sends the base; the server averages the bases
(`--client_weighting`) and never sees a head. The head is the model's last
`--head_layers` layers with weights, or `--head_names`. Each client is tested
with the global base and its own head; one never sampled holds the initial
model's head. `personal.SplitDefinition` in mode `train`.
"""

from __future__ import annotations

from tff_cluster.algorithms import personal
from tff_cluster.core import personal as parts
from tff_cluster.host import driver


def definition(context: driver.Context) -> personal.SplitDefinition:
  """The head (`--head_layers` / `--head_names`) personal, the body shared."""
  options = context.options
  return personal.split_definition(context, parts.head_indices(
      context.model.model_fn(), options.head_layers, options.head_names, "fedper"))
