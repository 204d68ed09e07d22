"""FedPAC: a shared feature extractor aligned to global class prototypes, and each client's classifier a combination of its peers' chosen by a quadratic programme."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

FEDPAC_OPTIONS = hp.grouped(
    "fedpac",
    hp.HParam("fedpac_lambda", float, 1.0, "lambda: weight of the feature alignment "
              "lambda * mean over the d features of (z - c_y)^2 added to each example's loss "
              "in the body phase (the authors' --lam: 1).", low=0),
    hp.HParam("fedpac_head_epochs", int, 1, "Epochs of the classifier alone before the "
              "body's local work (the code's epoch_classifier: 1).", low=1,
              limit=hp.MAX_LOCAL_STEPS),
    hp.HParam("fedpac_head_lr", float, 0.1, "Learning rate of the classifier's epochs (the "
              "code's hard-coded 0.1).", low=0, low_open=True),
    hp.HParam("fedpac_weight_decay", float, 5e-4, "Coupled L2 weight decay of both phases "
              "(the code's 5e-4).", low=0),
    hp.HParam("fedpac_collaborate", bool, True, "Combine the classifiers by the quadratic "
              "programme's weights (the code's --agg_g 1); false: each client keeps its "
              "own."),
)

SPECS = (
    AlgorithmSpec(
        "fedpac", "FedPAC: a shared feature extractor aligned to global class prototypes, "
        "classifiers combined per client by a quadratic programme", f"{__name__}.fedpac",
        host="FedPACDriver", hparams=FEDPAC_OPTIONS,
        # An MLP: a feature extractor to align (MCLR's is empty). `_weights_atol`:
        # the ray runner adds its shards' class-feature sums in another order, and
        # the quadratic programme's weights carry that float32 rounding into the
        # personal heads (1.6e-6 in 1 of 320 weights after 3 rounds); rows are held
        # at the usual tolerance.
        parity=({"_model": "mlp", "fedpac_lambda": 5.0, "fedpac_head_lr": 0.05,
                 "_weights_atol": 1e-5},
                {"_model": "mlp", "fedpac_head_epochs": 2, "fedpac_head_lr": 0.02,
                 "fedpac_collaborate": False, "fedpac_weight_decay": 0.0})),
)
