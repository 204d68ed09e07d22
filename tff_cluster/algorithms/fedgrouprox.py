"""FedGrouProx: FedGroup whose clients add (mu/2)||w - w_group||^2 locally.

Duan et al. (FedGroup), Section 3.2 (Algorithm 2 line 15, Eq. (3)): the FedProx
proximal term anchored at the
client's group model; mu = 1 for synthetic, MNIST and FEMNIST and 0.01 for
Sent140 (FedProx's recommendations).
"""

from __future__ import annotations

from tff_cluster import driver
from tff_cluster.algorithms import fedgroup


def build_fedgrouprox(model_fn, loss, element_spec, num_groups: int, mu: float,
                      **options):
  """See `fedgroup.build_fedgroup` (same options); `mu` > 0 is the proximal
  coefficient."""
  if mu <= 0:
    raise ValueError(f"FedGrouProx needs mu > 0, got {mu}; use fedgroup for mu = 0")
  return fedgroup.build_fedgroup(model_fn, loss, element_spec, num_groups, mu=mu, **options)


def make_driver(task, data, config: driver.TrainingConfig, mu: float, **options):
  if mu <= 0:
    raise ValueError(f"invalid --mu={mu} for fedgrouprox; valid: a number > 0")
  return fedgroup.FedGroupDriver(task, data, config, mu=mu, **options)
