"""HypCluster: IFCA's loop with a k-means++-by-loss start and a server
optimizer per cluster (FedJAX's)."""

from tff_cluster.algorithms import ifca
from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

HYPCLUSTER_OPTIONS = hp.grouped(
    "hypcluster",
    hp.NUM_GROUPS,
    hp.HParam("hypcluster_init", str, "kmeans_loss", "Cluster models' start: kmeans_loss "
              "(FedJAX's k-means++ by loss over clients trained from one start) or random "
              "(K independent draws).", choices=("kmeans_loss", "random")),
    ifca.INIT_CLIENTS,
    hp.HParam("hypcluster_eval", str, "train_loss", "Model a client is tested with: "
              "train_loss (the argmin of its training loss over the K models at evaluation, "
              "FedJAX's evaluator) or assigned (the cluster it last trained).",
              choices=("train_loss", "assigned")),
    *(d for d in ifca.IFCA_OPTIONS if d.name == "ifca_loss_batches"),
    hp.SERVER_LR,
    hp.HParam("hypcluster_server_momentum", float, 0.0, "beta of each cluster's own server "
              "optimizer (heavy ball, state per cluster; 0: SGD with --server_lr, 1.0 = "
              "FedAvg's mean; --server_optimizer=sgd only).", low=0, high=1, high_open=True),
    hp.SERVER_OPTIMIZER, hp.SERVER_OPT_FORM, hp.SERVER_BETA1, hp.SERVER_BETA2,
    hp.SERVER_TAU,
)

SPECS = (
    AlgorithmSpec(
        "hypcluster", "HypCluster: IFCA's loop with a k-means++-by-loss start and a server "
        "optimizer per cluster (FedJAX's)", f"{__name__}.hypcluster", host="HypClusterDriver",
        hparams=HYPCLUSTER_OPTIONS,
        # kmeans_loss's forced and assign calls; a per-cluster heavy-ball server step.
        parity=({"num_groups": 3},
                {"num_groups": 2, "hypcluster_init": "random", "server_lr": 0.8,
                 "hypcluster_server_momentum": 0.5, "hypcluster_eval": "assigned",
                 "ifca_loss_batches": 2},
                {"num_groups": 2, "hypcluster_init": "random", "server_optimizer": "yogi",
                 "server_opt_form": "flower", "server_lr": 0.05, "server_beta1": 0.8,
                 "server_beta2": 0.95, "server_tau": 0.01})),
)
