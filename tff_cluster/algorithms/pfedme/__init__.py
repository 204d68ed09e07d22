"""pFedMe: personal models from K Moreau-envelope steps, local models pulled toward them."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

PFEDME_OPTIONS = (hp.CLIENT_WEIGHTING, *hp.grouped(
    "pfedme",
    hp.HParam("pfedme_lambda", float, 15.0, "lambda: the personal model's pull toward the "
              "local model in the Moreau envelope (the authors' MNIST README: 15).", low=0,
              low_open=True),
    hp.HParam("pfedme_personal_lr", float, 0.1, "The personal model's learning rate in the "
              "inner steps (README MNIST: 0.1).", low=0, low_open=True),
    hp.HParam("pfedme_k", int, 5, "K: inner steps on each batch (README: 5).", low=1,
              limit=1000),
    hp.HParam("pfedme_beta", float, 1.0, "beta: w <- (1 - beta) w + beta mean of the "
              "clients' local models (README's same-parameter runs and FL-bench: 1; tuned "
              "MNIST: 2).", low=0, low_open=True),
    hp.HParam("pfedme_weight_decay", float, 0.001, "mu: the weight decay the authors' "
              "optimizer adds to the inner steps (0.001, its default; 0: off).", low=0),
    hp.HParam("pfedme_train", str, "all", "Which clients train a round: all (the authors' "
              "code: every client trains, the sampled ones are averaged) or sampled.",
              choices=("all", "sampled"))))

SPECS = (
    AlgorithmSpec("pfedme", "pFedMe: personal models from K Moreau-envelope steps per "
                  "batch; local models pulled toward them, the server mixes by beta",
                  f"{__name__}.pfedme", host="PFedMeDriver", hparams=PFEDME_OPTIONS,
                  own_momentum="pFedMe's local steps are its own (K personal steps, then "
                  "the pull)",
                  # eta_p 0.01, the authors' Synthetic setting (at 0.05 the inner steps
                  # of two of the 24 clients are unstable and amplify rounding to 1e-1).
                  parity=({"pfedme_lambda": 2.0, "pfedme_personal_lr": 0.01, "pfedme_k": 2,
                           "pfedme_beta": 1.5},)),
)
