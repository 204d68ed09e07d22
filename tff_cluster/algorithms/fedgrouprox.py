"""FedGrouProx: FedGroup whose clients add (mu/2)||w - w_group||^2 locally.

Duan et al. (FedGroup), Section 3.2 (Algorithm 2 line 15, Eq. (3)): the FedProx
proximal term anchored at the client's group model; mu = 1 for synthetic,
MNIST and FEMNIST and 0.01 for Sent140 (FedProx's recommendations). Its `--mu`
must be > 0 (`options.MU_POSITIVE`): mu = 0 is FedGroup.
"""

from __future__ import annotations

from tff_cluster.host import driver
from tff_cluster.algorithms import fedgroup
from tff_cluster.spec.options import FEDGROUPROX_HPARAMS, options_of

make_definition = fedgroup.make_definition


def make_driver(task, data, config: driver.TrainingConfig, options=None, **values):
  return fedgroup.FedGroupDriver(task, data, config,
                                 options_of(FEDGROUPROX_HPARAMS, options, **values))
