"""CFL-GP: K cluster models; clients are partitioned by the SVD of their accumulated gradient profiles."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

CFLGP_OPTIONS = hp.grouped(
    "cflgp",
    hp.NUM_GROUPS,
    hp.HParam("cflgp_period", int, 2, "T: the profile is updated and the clients clustered "
              "every T rounds (the authors' default: 2).", low=1, limit=hp.MAX_ROUNDS),
    hp.HParam("cflgp_stop", int, 10, "tau: clustering runs while t < tau (t counted from 0; "
              "the authors' default: 10), then the clusters stay fixed.", low=0,
              limit=hp.MAX_ROUNDS),
    hp.HParam("cflgp_protocol", str, "gradient", "What a client sends: gradient (one "
              "minibatch gradient at its cluster's model, each cluster then takes an SGD "
              "step with the round's lr on its members' mean: the authors' default) or model "
              "(the round's local work, each cluster the mean of its members' updates).",
              choices=("gradient", "model")),
    hp.HParam("cflgp_profile_at", str, "own", "Model a profile's gradient is taken at: own "
              "(the client's cluster model, as the code computes it) or criterion (theta_0 "
              "for every client, the criterion model the code's query list names and "
              "ignores).", choices=("own", "criterion")),
)

SPECS = (
    AlgorithmSpec(
        "cflgp", "CFL-GP: K cluster models, clients partitioned by the SVD of their "
        "accumulated gradient profiles", f"{__name__}.cflgp", host="CFLGPDriver",
        hparams=CFLGP_OPTIONS, all_clients=True,
        # Clustering in rounds 1-3 (beta 1, then 1/2), clients moving between
        # clusters; the model protocol's local work.
        parity=({"num_groups": 3, "cflgp_period": 1, "cflgp_stop": 3},
                {"num_groups": 2, "cflgp_protocol": "model", "cflgp_period": 2,
                 "cflgp_stop": 4, "cflgp_profile_at": "criterion"})),
)
