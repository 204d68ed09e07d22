"""FedPer: a shared body averaged by FedAvg, a personal head per client, trained together."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

FEDPER_OPTIONS = (*hp.HEAD, hp.CLIENT_WEIGHTING)

SPECS = (
    AlgorithmSpec("fedper", "FedPer: a shared body averaged by FedAvg, a personal head "
                  "per client, trained together", f"{__name__}.fedper",
                  host="tff_cluster.algorithms.personal:PersonalDriver",
                  hparams=FEDPER_OPTIONS,
                  # `_model`: the model it runs instead of the task's MCLR (a body
                  # and a head need two layers).
                  parity=({"_model": "mlp", "head_layers": 1},)),
)
