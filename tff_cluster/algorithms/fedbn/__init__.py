"""FedBN: FedAvg with every BatchNorm layer kept by its client."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

SPECS = (
    AlgorithmSpec("fedbn", "FedBN: FedAvg with every BatchNorm layer kept by its "
                  "client", f"{__name__}.fedbn",
                  host="tff_cluster.algorithms.personal:PersonalDriver",
                  hparams=(hp.CLIENT_WEIGHTING,),
                  # `_model`: the model it runs instead of the task's MCLR (FedBN
                  # needs a BatchNorm layer).
                  parity=({"_model": "mlp_bn"},)),
)
