"""FedEM: M component models, each client's mixture weights fitted by EM (`fedem.py`)."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

FEDEM_OPTIONS = hp.grouped(
    "fedem",
    hp.NUM_GROUPS,
    hp.HParam("fedem_agg", str, "all", "Component aggregation: all (every client's n_k/n "
              "share, a client not sampled adding the component unchanged: the authors' "
              "code) or sampled (the n_k-weighted mean over the round's clients).",
              choices=("all", "sampled")),
)

SPECS = (
    AlgorithmSpec("fedem", "FedEM: M component models, each client's mixture weights "
                  "and per-example responsibilities (EM), components trained weighted",
                  f"{__name__}.fedem", host="FedEMDriver", hparams=FEDEM_OPTIONS,
                  own_momentum="its local solver is plain SGD (the authors' code)",
                  # FedEM aggregates over all clients, FedRC over the sampled ones.
                  parity=({"num_groups": 2},)),
)
