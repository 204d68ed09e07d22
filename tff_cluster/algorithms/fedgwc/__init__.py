"""FedGWC: clusters split by spectral clustering of an interaction matrix built from Gaussian rewards on the clients' loss trajectories."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

FEDGWC_OPTIONS = hp.grouped(
    "fedgwc",
    hp.NUM_GROUPS,
    hp.HParam("fedgwc_gamma", float, 0.1, "gamma: the affinity exp(-gamma ||row_i - "
              "row_j||^2) of the min-max normalised interaction matrix (the code's "
              "default).", low=0, low_open=True),
    hp.HParam("fedgwc_eps", float, 1e-5, "epsilon: a cluster is clustered after "
              "round(K_c / m) rounds in a row with its running mean squared change of the "
              "interaction matrix below it (the code's default).", low=0, low_open=True),
    hp.HParam("fedgwc_max_split", int, 4, "The most parts one split makes (the code's "
              "candidates 2..min(K_c // m, 4)).", low=2, limit=hp.MAX_MODELS),
    hp.HParam("fedgwc_weight_decay", float, 4e-4, "Coupled L2 weight decay of the local "
              "steps (the code's default).", low=0),
)

SPECS = (
    AlgorithmSpec(
        "fedgwc", "FedGWC: clusters split by spectral clustering of an interaction matrix "
        "of Gaussian rewards on the clients' loss trajectories", f"{__name__}.fedgwc",
        host="FedGWCDriver", hparams=FEDGWC_OPTIONS,
        # A threshold every round passes: the root (24 clients, 8 a round)
        # splits in three at round 3, its patience round(24 / 8) = 3 rounds;
        # then the code's defaults, no split in 4 rounds.
        parity=({"num_groups": 3, "fedgwc_eps": 10.0},
                {"num_groups": 2, "fedgwc_weight_decay": 0.0})),
)
