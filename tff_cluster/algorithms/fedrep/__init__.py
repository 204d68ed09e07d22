"""FedRep: a shared body, a personal head; head epochs, then body epochs."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

FEDREP_OPTIONS = (*hp.HEAD, hp.HParam(
    "fedrep_head_epochs", int, 10, "Epochs of head-only training before the body's (the "
    "authors' code: E - E_rep = 10 in every setting); the body then trains for the run's "
    "local work.", low=1, limit=hp.MAX_LOCAL_EPOCHS, group="fedrep"), hp.CLIENT_WEIGHTING)

SPECS = (
    AlgorithmSpec("fedrep", "FedRep: a shared body, a personal head; head epochs, then "
                  "body epochs", f"{__name__}.fedrep", host="FedRepDriver",
                  hparams=FEDREP_OPTIONS,
                  # `_model`: the model it runs instead of the task's MCLR (a body
                  # and a head need two layers).
                  parity=({"_model": "mlp", "fedrep_head_epochs": 1},)),
)
