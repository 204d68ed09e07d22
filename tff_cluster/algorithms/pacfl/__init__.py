"""PACFL: one-shot clustering by the principal angles between the clients' data subspaces."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

PACFL_OPTIONS = hp.grouped(
    "pacfl",
    hp.NUM_GROUPS,
    hp.HParam("pacfl_basis", int, 5, "p: left singular vectors kept per label of a "
              "client's training inputs (the authors' default; their CIFAR-10 script: 3).",
              low=1, limit=4096),
    hp.HParam("pacfl_beta", float, 3.5, "beta: clusters merge while their proximity "
              "(degrees) is <= beta (the authors' default; CIFAR-10 script: 4.9). At most "
              "--num_groups clusters.", low=0),
    hp.HParam("pacfl_linkage", str, "average", "Merged proximity: average (mean of the two "
              "rows, the authors'), maximum (complete) or minimum (single).",
              choices=("average", "maximum", "minimum")),
    hp.HParam("pacfl_proximity", str, "code", "code: the smallest angle between any two "
              "basis vectors, min arccos(U_i^T U_j) (the authors' code); principal: the "
              "smallest principal angle between the two subspaces, arccos of the largest "
              "singular value of Q_i^T Q_j (orthonormal bases).",
              choices=("code", "principal")),
)

SPECS = (
    AlgorithmSpec("pacfl", "PACFL: one-shot clustering by the angles between the "
                  "clients' data subspaces, then FedAvg per cluster", f"{__name__}.pacfl",
                  host="PACFLDriver",
                  definition="tff_cluster.algorithms.wecfl.wecfl:fixed_clusters_definition",
                  hparams=PACFL_OPTIONS,
                  parity=({"num_groups": 4, "pacfl_basis": 3, "pacfl_beta": 3.0,
                           "pacfl_proximity": "principal"},)),
)
