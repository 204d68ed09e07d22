"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", 2020).

FedAvg whose clients minimise F_k(w) + (mu/2)||w - w_t||^2 (eq. 2), i.e. local
SGD steps w <- w - lr (grad F_k(w) + mu (w - w_t)). All clients run the same
local work here (no stragglers / variable local work). The definition is
`fedavg.FedAvgDefinition` with `--mu`; `fedavg.build_fedavg(..., mu=...)`
gives it as a TFF `LearningProcess`.
"""

from __future__ import annotations

from tff_cluster.host import driver
from tff_cluster.algorithms import fedavg
from tff_cluster.spec.options import FEDPROX_HPARAMS, options_of

make_definition = fedavg.make_definition


def make_driver(task, data, config: driver.TrainingConfig, options=None, **values):
  return fedavg.FedAvgDriver(task, data, config, options_of(FEDPROX_HPARAMS, options, **values))
