"""FedSoft: soft clustering by importance weights, local models pulled toward every cluster (`fedsoft.py`)."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

FEDSOFT_OPTIONS = hp.grouped(
    "fedsoft",
    hp.NUM_GROUPS,
    hp.HParam("fedsoft_tau", int, 1, "tau: the importance weights are re-estimated every "
              "tau rounds, from round 1 (the code's default; its CIFAR-10 run: 2).", low=1,
              limit=hp.MAX_ROUNDS),
    hp.HParam("fedsoft_k", int, None, "K: the clients each cluster selects a round "
              "(default 30, the code's, or every client with training data when fewer; its "
              "CIFAR-10 run: 15).", low=1),
    hp.HParam("fedsoft_lambda", float, 0.1, "lambda: the local pull sum_s (lambda/2) u_s "
              "||w - c_s||^2 (the code's MNIST solver; CIFAR-10: 0.01).", low=0),
    hp.HParam("fedsoft_sigma", float, 1e-4, "sigma: a cluster no sample of a client "
              "chooses gets u = sigma.", low=0, low_open=True, high=1),
    hp.HParam("fedsoft_selection", str, "clusters", "clusters: each cluster draws K "
              "clients with probabilities v_s (the code's default), its model the mean of "
              "their models; all: every client trains every round, c_s = sum_k v_sk w_k.",
              choices=("clusters", "all")),
    hp.HParam("fedsoft_eval", str, "cluster", "Model a client is tested with: cluster (the "
              "cluster model of its largest importance weight) or local (its own "
              "personalised local model).", choices=("cluster", "local")),
)

SPECS = (
    AlgorithmSpec("fedsoft", "FedSoft: importance weights per client and cluster, "
                  "cluster-wise selection, local models pulled toward every cluster",
                  f"{__name__}.fedsoft", host="FedSoftDriver", hparams=FEDSOFT_OPTIONS,
                  own_momentum="its local optimizer is Adam (the authors' code)",
                  # Cluster-wise selection with re-estimates every 2 rounds; every client.
                  parity=({"num_groups": 2, "fedsoft_k": 5, "fedsoft_tau": 2,
                           "fedsoft_lambda": 0.5},
                          {"num_groups": 3, "fedsoft_selection": "all",
                           "fedsoft_eval": "local"})),
)
