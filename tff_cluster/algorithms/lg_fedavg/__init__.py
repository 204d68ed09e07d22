"""LG-FedAvg: a personal body per client, a shared head averaged by FedAvg."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

LG_FEDAVG_OPTIONS = (*hp.HEAD, hp.CLIENT_WEIGHTING)

SPECS = (
    AlgorithmSpec("lg_fedavg", "LG-FedAvg: a personal body per client, a shared head "
                  "averaged by FedAvg", f"{__name__}.lg_fedavg",
                  host="tff_cluster.algorithms.personal:PersonalDriver",
                  hparams=LG_FEDAVG_OPTIONS,
                  # `_model`: the model it runs instead of the task's MCLR (a body
                  # and a head need two layers).
                  parity=({"_model": "mlp", "client_weighting": "samples"},)),
)
