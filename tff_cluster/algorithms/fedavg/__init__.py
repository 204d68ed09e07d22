"""FedAvg's family: FedAvg, FedProx and FedAvg with a server optimizer
(FedAvgM, FedMom, SlowMo), one rule (`fedavg.py`) and one host."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

_MODULE = f"{__name__}.fedavg"
_SERVER_MOMENTUM = (hp.SERVER_LR, hp.SERVER_MOMENTUM, hp.CLIENT_WEIGHTING)


def _server_momentum(name: str, description: str, kind: str, parity) -> AlgorithmSpec:
  """FedAvg's rule and host with the server optimizer `kind`."""
  return AlgorithmSpec(name, description, _MODULE, host="FedAvgDriver",
                       hparams=_SERVER_MOMENTUM, fixed={"server_optimizer": kind},
                       parity=parity)


SPECS = (
    AlgorithmSpec("fedavg", "FedAvg: weighted averaging of local SGD models", _MODULE,
                  host="FedAvgDriver", hparams=(hp.CLIENT_WEIGHTING,
                                                *hp.SERVER_OPTIMIZER_OPTIONS),
                  parity=({}, {"client_weighting": "samples"})),
    AlgorithmSpec("fedprox", "FedProx: FedAvg with proximal term (mu/2)||w - w_t||^2",
                  _MODULE, host="FedAvgDriver", hparams=(hp.MU, hp.CLIENT_WEIGHTING),
                  parity=({"mu": 0.5},)),
    _server_momentum("fedavgm", "FedAvgM: FedAvg with heavy-ball server momentum",
                     "heavy_ball", ({"server_lr": 0.8, "server_momentum": 0.5},)),
    _server_momentum("fedmom", "FedMom: FedAvg with Nesterov server momentum", "nesterov",
                     ({"server_momentum": 0.5, "client_weighting": "samples"},)),
    _server_momentum("slowmo", "SlowMo: slow momentum on the averaged local progress",
                     "slowmo", ({"server_lr": 1.2, "server_momentum": 0.5},)),
)
