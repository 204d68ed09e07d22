"""Algorithm registry: `--algo` name -> how to build its runner.

Each algorithm lives in its own module with a `build_*` function returning its
TFF process (for research pipelines) and a `make_runner` used by the CLI.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Dict, Tuple


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  """One `--algo`.

  Attributes:
    name: the `--algo` value.
    description: one line for `--help`.
    module: module under `tff_cluster.algorithms` with `make_runner`.
    uses_mu: whether `--mu` (proximal term) affects it.
    options: names of algorithm-specific flags `make_runner` takes as keywords.
  """
  name: str
  description: str
  module: str
  uses_mu: bool = False
  options: Tuple[str, ...] = ()

  def make_runner(self, task, data, config, **options):
    module = importlib.import_module(f"tff_cluster.algorithms.{self.module}")
    return module.make_runner(task, data, config, **options)


FEDGROUP_OPTIONS = ("num_groups", "measure", "pretrain_scale", "pretrain_epochs",
                     "group_agg_lr", "cold_start", "newcomer_fraction")

ALGORITHMS: Dict[str, AlgorithmSpec] = {
    spec.name: spec for spec in [
        AlgorithmSpec("fedavg", "FedAvg: weighted averaging of local SGD models",
                      "fedavg"),
        AlgorithmSpec("fedprox", "FedProx: FedAvg with proximal term (mu/2)||w - w_t||^2",
                      "fedprox", uses_mu=True),
        AlgorithmSpec("fedgroup", "FedGroup: EDC/MADC group cold start, group-wise "
                      "FedAvg, newcomer cold start", "fedgroup", options=FEDGROUP_OPTIONS),
        AlgorithmSpec("fedgrouprox", "FedGrouProx: FedGroup with proximal term "
                      "(mu/2)||w - w_group||^2", "fedgrouprox", uses_mu=True,
                      options=FEDGROUP_OPTIONS),
    ]
}


def get_algorithm(name: str) -> AlgorithmSpec:
  if name not in ALGORITHMS:
    raise KeyError(f"unknown algorithm {name!r}; valid: {', '.join(sorted(ALGORITHMS))}")
  return ALGORITHMS[name]
