"""HCFL+: a shared extractor and a head per cluster, each example's cluster weights fitted by EM, clusters split and removed on the host (`hcflplus.py`)."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

HCFLPLUS_OPTIONS = hp.grouped(
    "hcflplus",
    hp.NUM_GROUPS,
    hp.HParam("hcflplus_init", int, None, "Clusters at the start, at most --num_groups (the "
              "slots); default: the code's --n_learners, 3, or --num_groups if fewer.", low=1,
              limit=hp.MAX_MODELS),
    hp.HParam("hcflplus_tol", float, 0.05, "A cluster splits when its largest weighted "
              "distance exceeds their mean by more than this (the code's tol).", low=0),
    hp.HParam("hcflplus_mu", float, 0.4, "omega <- mu gamma + (1 - mu) pi: the weight of "
              "each example's own posterior in its next prior (the code's fedrc_SW: 0.4; "
              "its FedEM_SW: 0).", low=0, high=1),
    hp.HParam("hcflplus_likelihood", str, "fedrc", "The E-step's score: fedrc (-loss - log "
              "P_m(y), the label prior; the code's fedrc_SW) or fedem (-loss; FedEM_SW).",
              choices=("fedrc", "fedem")),
    hp.HParam("hcflplus_distance", str, "updates", "What the split compares: updates (each "
              "client's head updates, what the released code returns) or prototypes (its "
              "per-class feature means, the return the code comments out).",
              choices=("updates", "prototypes")),
    hp.HParam("hcflplus_predict", str, "soft", "A client's prediction: soft (its pi-weighted "
              "mixture of the heads' probabilities) or hard (its largest-pi head; the "
              "code's --hard_cluster).", choices=("soft", "hard")),
)

SPECS = (
    AlgorithmSpec("hcflplus", "HCFL+: a shared extractor and a head per cluster, each "
                  "example's weights fitted by EM with an intra-client prior, clusters split "
                  "by their clients' distances and removed when no client picks them",
                  f"{__name__}.hcflplus", host="HCFLPlusDriver", hparams=HCFLPLUS_OPTIONS,
                  # A margin every round passes: a split (and a removal when a cluster
                  # is no client's pick) in every round until the slots are full.
                  parity=({"num_groups": 3, "hcflplus_init": 2, "hcflplus_tol": 0.0},
                          {"num_groups": 2, "hcflplus_init": 2, "hcflplus_likelihood": "fedem",
                           "hcflplus_distance": "prototypes", "hcflplus_predict": "hard"})),
)
