"""Per-FedAvg: FedAvg over MAML meta-steps; each client adapts by one step before its test."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

PERFEDAVG_OPTIONS = hp.grouped(
    "perfedavg",
    hp.HParam("perfedavg_variant", str, "fo", "fo: first-order meta-steps over 2 batches; "
              "hf: Hessian-free, a finite-difference Hessian-vector product on a third "
              "batch.", choices=("fo", "hf")),
    hp.HParam("perfedavg_beta", float, 0.001, "beta: the meta-step's size (FL-bench's "
              "default; the inner step alpha is --client_lr).", low=0, low_open=True),
    hp.HParam("perfedavg_delta", float, 0.001, "delta: the finite difference of the "
              "Hessian-free variant (FL-bench's default).", low=0, low_open=True))

SPECS = (
    AlgorithmSpec("perfedavg", "Per-FedAvg: FedAvg over MAML meta-steps (first-order or "
                  "Hessian-free); each client adapts by one step before its test",
                  f"{__name__}.perfedavg", host="PerFedAvgDriver",
                  hparams=PERFEDAVG_OPTIONS,
                  own_momentum="its local steps are Per-FedAvg's meta-steps (plain SGD "
                  "inside)",
                  # First-order meta-steps; Hessian-free (a third batch, its finite
                  # difference). (A smaller inner lr: at 0.02 the meta-steps amplified
                  # the runners' float32 rounding to 4e-4 in a test loss by round 3.)
                  parity=({"perfedavg_beta": 0.02, "_config": {"client_lr": 0.005}},
                          {"perfedavg_variant": "hf", "perfedavg_beta": 0.02,
                           "perfedavg_delta": 0.01, "_config": {"client_lr": 0.005}})),
)
