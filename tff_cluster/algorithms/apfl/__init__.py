"""APFL: each client deploys a mixture, with weight alpha, of its personal model and FedAvg's."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

APFL_OPTIONS = hp.grouped(
    "apfl",
    hp.HParam("apfl_alpha", float, 0.5, "The mixing weight alpha every client starts from "
              "(the authors' code's default 0.5).", low=0, high=1),
    hp.HParam("apfl_adaptive", bool, False, "Adapt each client's alpha by its gradient (the "
              "authors' code: at a round's first step, off by default; params: at every "
              "step)."),
    hp.HParam("apfl_mix", str, "outputs", "What the personal model mixes: outputs (the "
              "authors' code, alpha v(x) + (1 - alpha) w(x)) or params (FedJAX's, alpha v + "
              "(1 - alpha) w per weight).", choices=("outputs", "params")),
    hp.HParam("apfl_agg", str, "uniform", "The server's mean of the clients' models: "
              "uniform (the authors' code) or weighted by the examples processed "
              "(FedJAX's).", choices=("uniform", "examples")))

SPECS = (
    AlgorithmSpec("apfl", "APFL: each client deploys a mixture, with weight alpha, of its "
                  "personal model and FedAvg's (outputs or weights mixed)",
                  f"{__name__}.apfl", host="APFLDriver", hparams=APFL_OPTIONS,
                  own_momentum="its local steps are APFL's own (plain SGD on w and on v)",
                  # Output mixing with alpha adapted at each round's first step; weight
                  # mixing, alpha adapted at every step, the examples-weighted mean.
                  parity=({"apfl_adaptive": True, "apfl_alpha": 0.4},
                          {"apfl_mix": "params", "apfl_adaptive": True,
                           "apfl_agg": "examples"})),
)
