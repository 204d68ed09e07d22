"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", 2020).

FedAvg whose clients minimise F_k(w) + (mu/2)||w - w_t||^2 (eq. 2), i.e. local
SGD steps w <- w - lr (grad F_k(w) + mu (w - w_t)). All clients run the same
number of local epochs here (no stragglers / variable local work).
"""

from __future__ import annotations

from tff_cluster import experiment
from tff_cluster.algorithms import fedavg


def build_fedprox(model_fn, loss, element_spec, initial_weights, client_lr: float,
                  mu: float, server_optimizer=None):
  """FedProx as a TFF `LearningProcess`; see `fedavg.build_fedavg` for arguments."""
  return fedavg.build_fedavg(model_fn, loss, element_spec, initial_weights,
                             client_lr, mu=mu, server_optimizer=server_optimizer)


def make_runner(task, data, config: experiment.TrainingConfig):
  return fedavg.FedAvgRunner(task, data, config, mu=config.mu)
