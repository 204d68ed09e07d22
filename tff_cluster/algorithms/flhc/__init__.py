"""FL+HC: FedAvg, one agglomerative clustering of the clients' updates, then FedAvg per cluster."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

FLHC_OPTIONS = hp.grouped(
    "flhc",
    hp.NUM_GROUPS,
    hp.HParam("flhc_round", int, 10, "n: the clustering round (FedAvg before it; every "
              "client with training data trains in it). Not read in the paper: 10, the "
              "largest n of a public reproduction's sweep (1, 3, 5, 10).", low=1,
              limit=hp.MAX_ROUNDS),
    hp.HParam("flhc_threshold", float, None, "P: the distance at which the tree of the "
              "clients' updates is cut (merges at distances <= P); unset: cut into "
              "--num_groups clusters. At most --num_groups clusters either way.", low=0,
              low_open=True),
    hp.HParam("flhc_metric", str, "euclidean", "Distance between two clients' updates.",
              choices=("euclidean", "manhattan", "cosine")),
    hp.HParam("flhc_linkage", str, "ward", "Linkage of the agglomerative clustering (ward "
              "needs the euclidean metric).",
              choices=("ward", "average", "complete", "single")),
)

SPECS = (
    AlgorithmSpec("flhc", "FL+HC: FedAvg, then one agglomerative clustering of the "
                  "clients' updates, then FedAvg per cluster", f"{__name__}.flhc",
                  host="FLHCDriver",
                  definition="tff_cluster.algorithms.wecfl.wecfl:fixed_clusters_definition",
                  hparams=FLHC_OPTIONS,
                  # The clustering round inside the 4 rounds, cut by a threshold. (Round 3:
                  # with it in round 2, the two rounds after it in 4 small clusters amplify
                  # float32 rounding in the side-by-side CNN+LSTM run to 5e-6 in one conv
                  # weight, past the tolerance's atol.)
                  parity=({"num_groups": 4, "flhc_round": 3, "flhc_threshold": 0.5,
                           "flhc_metric": "cosine", "flhc_linkage": "average"},)),
)
