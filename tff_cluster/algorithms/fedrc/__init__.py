"""FedRC: FedEM's mixture with robust weights and a label prior (`fedrc.py`, on `fedem/`)."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

FEDRC_OPTIONS = hp.grouped(
    "fedrc",
    hp.NUM_GROUPS,
    hp.HParam("fedrc_predict", str, "soft", "A client's prediction: soft (its "
              "omega-weighted mixture of the components' probabilities) or hard (its "
              "largest-omega component alone; the authors' --hard_cluster).",
              choices=("soft", "hard")),
)

SPECS = (
    AlgorithmSpec("fedrc", "FedRC: FedEM's mixture with robust weights "
                  "omega exp(-loss) / P_m(y) and a label prior refreshed each round",
                  f"{__name__}.fedrc", host="FedRCDriver", hparams=FEDRC_OPTIONS,
                  own_momentum="its local solver is plain SGD (the authors' code)",
                  # FedEM aggregates over all clients, FedRC over the sampled ones.
                  parity=({"num_groups": 2, "fedrc_predict": "hard"},)),
)
