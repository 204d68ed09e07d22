"""pFedMo and FedNAG (pFedMo with pi = 0, no representation model): local NAG, one rule (`pfedmo.py`)."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

_MODULE = f"{__name__}.pfedmo"
_OWN_MOMENTUM = "its local momentum is NAG's, --nag_momentum"

NAG_MOMENTUM = hp.HParam("nag_momentum", float, 0.5, "gamma: the workers' Nesterov "
                         "momentum (the pFedMo paper's Table 2: 0.5).", low=0, high=1,
                         high_open=True)
AGG_WEIGHTS = hp.HParam("agg_weights", str, "data", "Aggregation weights a_i: data "
                        "(D_i / D) or uniform (1/N, the pFedMo paper's quantity-skew "
                        "experiment).", choices=("data", "uniform"))
PFEDMO_OPTIONS = hp.grouped(
    "pfedmo",
    NAG_MOMENTUM,
    hp.HParam("pfedmo_pi", float, 1.0, "pi: how strongly the representation model is "
              "mixed into each worker's start (0 = FedNAG; Table 2: 1).", low=0, high=1),
    AGG_WEIGHTS,
    hp.HParam("pfedmo_model", str, "eq12", "Each worker's model: eq12 (the paper's eq. 12 "
              "as printed, the rule its Theorem 2 bounds; its momentum term y_bar - y_i+ "
              "cancels the mix with x_r to first order) or mix ((1 - pi s_i) x_bar + pi s_i "
              "x_r: a project variant, after the paper's prose; it breaks Theorem 2's "
              "O(eta) bound).", choices=("eq12", "mix")),
    hp.HParam("score_batch", int, 64, "B: samples of the scoring batch, drawn once from "
              "the pooled test data (the paper gives no size).", low=1,
              limit=hp.MAX_BATCH_SIZE),
    hp.HParam("public_fraction", float, 0.1, "When the task has no public set: the share "
              "of the pooled training data drawn as one (it then overlaps the workers').",
              low=0, low_open=True, high=1),
)
FEDNAG_OPTIONS = hp.grouped("pfedmo", NAG_MOMENTUM, AGG_WEIGHTS)

SPECS = (
    AlgorithmSpec("pfedmo", "pFedMo: local NAG; a representation model trained on "
                  "public data personalises each worker's model and momentum", _MODULE,
                  host="PFedMoDriver", hparams=PFEDMO_OPTIONS, all_clients=True,
                  own_momentum=_OWN_MOMENTUM,
                  # (24 workers, all of them every round; the synthetic task has no public
                  # set, so pFedMo draws one from the pooled training data.)
                  parity=({"pfedmo_pi": 1.0, "nag_momentum": 0.5, "score_batch": 16,
                           "_config": {"client_lr": 0.01}},
                          {"pfedmo_pi": 0.5, "nag_momentum": 0.3, "agg_weights": "uniform",
                           "public_fraction": 0.2, "pfedmo_model": "mix"})),
    AlgorithmSpec("fednag", "FedNAG: local NAG, weighted means of models and look-ahead "
                  "points (pFedMo with pi = 0)", _MODULE, host="PFedMoDriver",
                  hparams=FEDNAG_OPTIONS, fixed={"representation": False}, all_clients=True,
                  own_momentum=_OWN_MOMENTUM,
                  parity=({"nag_momentum": 0.6, "_config": {"client_lr": 0.01}},)),
)
