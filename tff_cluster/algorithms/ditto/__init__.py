"""Ditto: FedAvg, and a personal model per client pulled toward the round's global model."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

DITTO_OPTIONS = (*hp.grouped(
    "ditto",
    hp.HParam("ditto_lambda", float, 1.0, "lambda: the personal model's pull (lambda/2)||v - "
              "w_t||^2 toward the round's global model (the authors' FMNIST script: 1; 0: "
              "independent local models).", low=0),
    hp.HParam("ditto_unseen", str, "initial", "A client never sampled is tested with: "
              "initial (its v_k's start w_0, as the authors' code) or global (the current "
              "global model, as a new client).", choices=("initial", "global"))),
    hp.CLIENT_WEIGHTING)

SPECS = (
    AlgorithmSpec("ditto", "Ditto: FedAvg, and a personal model per client pulled "
                  "toward the round's global model", f"{__name__}.ditto", host="DittoDriver",
                  hparams=DITTO_OPTIONS, parity=({"ditto_lambda": 0.5},)),
)
