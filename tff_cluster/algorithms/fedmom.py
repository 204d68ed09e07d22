"""FedMom: Nesterov server momentum (Huo et al., 2020); see `tff_cluster.algorithms.server_momentum`."""

from tff_cluster.algorithms import server_momentum

make_driver = server_momentum.driver_factory("fedmom")
make_definition = server_momentum.make_definition("fedmom")
