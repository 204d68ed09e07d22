"""WeCFL and FeSEM: cluster models, K-Means on the clients' trained models (`wecfl.py`)."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

_MODULE = f"{__name__}.wecfl"

WECFL_SHARED = (
    hp.NUM_GROUPS,
    hp.HParam("wecfl_features", str, "last_layer", "Clustering features of a client's "
              "trained model: last_layer (kernel of the last Dense layer, the authors' "
              "code), fc (kernels and biases of every Dense layer, the paper's App. B.1) "
              "or all (every trainable weight: a project variant).",
              choices=("last_layer", "fc", "all")),
    hp.HParam("wecfl_kmeans", str, "refit", "refit (K-Means from scratch every round, "
              "the authors' code) or one_step (one E-step against the current cluster "
              "models, Algorithm 1).", choices=("refit", "one_step")),
    hp.HParam("wecfl_mu", float, 0.0, "Proximal coefficient: each local step adds "
              "(mu/2)||w - w_bar||^2, w_bar the data-weighted mean of the clients' models "
              "(the paper: none, 0; the authors' last driver: 0.95). Separate from --mu, "
              "whose task default is FedProx's.", low=0),
    # Each cluster's own server optimizer in the M-step (state per cluster);
    # sgd at 1.0 is the plain mean.
    *hp.SERVER_OPTIMIZER_OPTIONS,
)

WECFL_OPTIONS = hp.grouped(
    "wecfl", *WECFL_SHARED,
    hp.HParam("kmeans_weights", str, "data", "K-Means client weights: data (lambda_i "
              "proportional to training samples, WeCFL) or uniform (FeSEM's clustering).",
              choices=("data", "uniform")),
)

FESEM_OPTIONS = hp.grouped(
    "fesem", *WECFL_SHARED,
    hp.HParam("fesem_center", str, "uniform", "Cluster models: uniform mean of the members "
              "(the WeCFL paper's eq. (2)) or data-weighted (the authors' code behind its "
              "FeSEM rows).", choices=("uniform", "data")),
)

SPECS = (
    AlgorithmSpec("wecfl", "WeCFL: clients train their cluster model; weighted "
                  "K-Means on the trained models; weighted cluster means", _MODULE,
                  host="WeCFLDriver", hparams=WECFL_OPTIONS,
                  parity=({"num_groups": 3},
                          {"num_groups": 3, "wecfl_features": "all",
                           "wecfl_kmeans": "one_step", "kmeans_weights": "uniform",
                           "wecfl_mu": 0.5},
                          {"num_groups": 2, "server_optimizer": "adagrad",
                           "server_lr": 0.05, "server_tau": 0.01})),
    # FeSEM: WeCFL's rule and host with uniform K-Means weights; its cluster
    # models by --fesem_center.
    AlgorithmSpec("fesem", "FeSEM: WeCFL with uniform K-Means weights", _MODULE,
                  host="WeCFLDriver", hparams=FESEM_OPTIONS,
                  fixed={"kmeans_weights": "uniform"},
                  parity=({"num_groups": 3, "fesem_center": "data"},)),
)
