"""FedAvg + fine-tuning: each client fine-tunes a copy of the global model before a test."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

FEDAVG_FT_OPTIONS = (hp.CLIENT_WEIGHTING, *hp.grouped(
    "fedavg_ft",
    hp.HParam("ft_epochs", int, 1, "Epochs each client fine-tunes a copy of the global model "
              "on its training data before every evaluation (FedEM's "
              "--locally_tune_clients: 1).", low=1, limit=hp.MAX_LOCAL_EPOCHS),
    hp.HParam("ft_layers", str, "all", "The layers fine-tuned: all (FedEM's) or head "
              "(FedRep's FedAvg baseline; the head as --head_layers/--head_names choose "
              "it).", choices=("all", "head")),
    hp.HParam("ft_mu", float, 0.0, "mu: a pull (mu/2)||v - w||^2 toward the global model w "
              "while fine-tuning (Ditto's fine-tuning baseline; 0: none, FedEM's).",
              low=0)), *hp.HEAD)

SPECS = (
    AlgorithmSpec("fedavg_ft", "FedAvg + fine-tuning: before every evaluation each "
                  "client fine-tunes a copy of the global model", f"{__name__}.fedavg_ft",
                  host="FineTuneDriver", hparams=FEDAVG_FT_OPTIONS,
                  # `_weights_atol`: its final weights are every client's fine-tuned copy
                  # (24 clients, a whole epoch each; under momentum 0.9 the runners'
                  # float32 rounding reached 1.2e-5 in 2 of 600 weights of a copy); its
                  # rows are held at the usual tolerance.
                  parity=({"ft_epochs": 1, "ft_mu": 0.5, "_weights_atol": 5e-5},)),
)
