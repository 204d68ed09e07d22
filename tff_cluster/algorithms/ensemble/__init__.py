"""FedAvg+ and FedProx+: --ensemble_size independent FedAvg (FedProx) runs, combined at test time."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

_MODULE = f"{__name__}.ensemble"

ENSEMBLE_VOTE = hp.HParam("ensemble_vote", str, "logits", "How the ensemble's models "
                          "vote: mean of their logits (the authors' code) or of their "
                          "probabilities.", choices=("logits", "probs"), group="ensemble")

SPECS = (
    AlgorithmSpec("fedavg_plus", "FedAvg+: --ensemble_size independent FedAvg runs, "
                  "combined at test time", _MODULE, host="EnsembleDriver",
                  hparams=(hp.ENSEMBLE_SIZE, ENSEMBLE_VOTE, hp.CLIENT_WEIGHTING),
                  parity=({"ensemble_size": 2},)),
    AlgorithmSpec("fedprox_plus", "FedProx+: --ensemble_size independent FedProx "
                  "runs, combined at test time", _MODULE, host="EnsembleDriver",
                  hparams=(hp.MU, hp.ENSEMBLE_SIZE, ENSEMBLE_VOTE, hp.CLIENT_WEIGHTING),
                  parity=({"ensemble_size": 2, "mu": 0.5, "ensemble_vote": "probs",
                           "client_weighting": "samples"},)),
)
