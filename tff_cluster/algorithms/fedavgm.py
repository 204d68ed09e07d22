"""FedAvgM: heavy-ball server momentum (Hsu et al., 2019); see `tff_cluster.algorithms.server_momentum`."""

from tff_cluster.algorithms import server_momentum

make_driver = server_momentum.driver_factory("fedavgm")
make_definition = server_momentum.make_definition("fedavgm")
