"""SlowMo: slow momentum over the averaged local work (Wang et al., 2020); see `tff_cluster.algorithms.server_momentum`."""

from tff_cluster.algorithms import server_momentum

make_driver = server_momentum.driver_factory("slowmo")
make_definition = server_momentum.make_definition("slowmo")
