"""FedAvg's family: FedAvg, FedProx and FedAvg with a server optimizer
(FedAvgM, FedMom, SlowMo; FedAdam, FedYogi, FedAdagrad), one rule
(`fedavg.py`) and one host."""

import dataclasses

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

_MODULE = f"{__name__}.fedavg"
_SERVER_MOMENTUM = (hp.SERVER_LR, hp.SERVER_MOMENTUM, hp.CLIENT_WEIGHTING)


def _server_momentum(name: str, description: str, kind: str, parity) -> AlgorithmSpec:
  """FedAvg's rule and host with the server optimizer `kind`."""
  return AlgorithmSpec(name, description, _MODULE, host="FedAvgDriver",
                       hparams=_SERVER_MOMENTUM, fixed={"server_optimizer": kind},
                       parity=parity)


def _fedopt(name: str, description: str, kind: str, eta: float, tau: float,
            parity) -> AlgorithmSpec:
  """FedAvg's rule and host with FedOpt's server step `kind` (Reddi et al.
  2021; `--server_opt_form`: the authors' code's or Flower's), its own
  default server learning rate `eta` and tau `tau` (FedAdagrad: no beta1)."""
  declared = (hp.SERVER_OPT_FORM,
              dataclasses.replace(hp.SERVER_LR, default=eta, group="server optimizer"),
              *((hp.SERVER_BETA1, hp.SERVER_BETA2) if kind != "adagrad" else ()),
              dataclasses.replace(hp.SERVER_TAU, default=tau),
              hp.CLIENT_WEIGHTING)
  return AlgorithmSpec(name, description, _MODULE, host="FedAvgDriver", hparams=declared,
                       fixed={"server_optimizer": kind}, parity=parity)


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
    # FedOpt's default server learning rate and tau: the authors' code has no
    # default learning rate (a required flag) and tunes both per task; these
    # are its tuned values for EMNIST character recognition
    # (optimization/docs/hyperparameters.md; docs/algorithms/fedadam.md).
    _fedopt("fedadam", "FedAdam: FedAvg with an Adam server step (FedOpt)", "adam",
            10 ** -2.5, 1e-4,
            ({"server_lr": 0.05, "server_beta1": 0.5, "server_beta2": 0.9,
              "server_tau": 0.01}, {"server_opt_form": "flower", "server_lr": 0.05})),
    _fedopt("fedyogi", "FedYogi: FedAvg with a Yogi server step (FedOpt)", "yogi",
            10 ** -2.5, 1e-4,
            ({"server_lr": 0.05, "server_beta1": 0.8, "server_beta2": 0.95,
              "server_tau": 0.01, "client_weighting": "samples"},)),
    _fedopt("fedadagrad", "FedAdagrad: FedAvg with an Adagrad server step (FedOpt)",
            "adagrad", 0.1, 1e-2, ({"server_lr": 0.05, "server_tau": 0.01},)),
)
