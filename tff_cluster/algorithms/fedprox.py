"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", 2020).

FedAvg whose clients minimise F_k(w) + (mu/2)||w - w_t||^2 (eq. 2), i.e. local
SGD steps w <- w - lr (grad F_k(w) + mu (w - w_t)). All clients run the same
local work here (no stragglers / variable local work). The definition is
`fedavg.FedAvgDefinition` with mu > 0.
"""

from __future__ import annotations

from tff_cluster import driver
from tff_cluster.algorithms import fedavg


def build_fedprox(model_fn, loss, element_spec, initial_weights, client_lr: float,
                  mu: float, server_optimizer=None):
  """FedProx as a TFF `LearningProcess`; see `fedavg.build_fedavg` for arguments."""
  return fedavg.build_fedavg(model_fn, loss, element_spec, initial_weights,
                             client_lr, mu=mu, server_optimizer=server_optimizer)


def make_driver(task, data, config: driver.TrainingConfig, mu: float,
                client_weighting: str = "processed"):
  return fedavg.FedAvgDriver(task, data, config, mu=mu, client_weighting=client_weighting)
