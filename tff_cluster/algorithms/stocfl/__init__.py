"""StoCFL: clusters merged by the cosine of cached client representations (`stocfl.py`)."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

STOCFL_OPTIONS = hp.grouped(
    "stocfl",
    hp.HParam("stocfl_tau", float, 0.3, "tau: two sampled clusters merge when the cosine "
              "similarity of their directions is >= tau (the code's default; its CIFAR "
              "command: 0.65).", low=-1, high=1),
    hp.HParam("stocfl_mu", float, 0.05, "mu: the cluster models' proximal pull (mu/2)||w - "
              "w_g||^2 toward the global model.", low=0),
    hp.HParam("stocfl_obep", int, 10, "Local epochs of a client's one representation "
              "training from the fixed anchor.", low=1, limit=hp.MAX_LOCAL_EPOCHS),
    hp.HParam("stocfl_obbs", int, None, "Batch size of the representation training "
              "(default: the client's whole training set in one batch, the code's).", low=1),
    hp.HParam("stocfl_global", str, "chain", "The global model's training: chain (each "
              "sampled client starts from the previous one's trained model; the new global "
              "model is the mean of the chain's models: the authors' code) or parallel "
              "(every client from w_g, the mean: the bi-level reading).",
              choices=("chain", "parallel")),
)

SPECS = (
    AlgorithmSpec("stocfl", "StoCFL: clusters merged by the cosine of cached client "
                  "representations; cluster models pulled toward a global model",
                  f"{__name__}.stocfl", host="StoCFLDriver", hparams=STOCFL_OPTIONS,
                  own_momentum="its local solver is plain SGD (the authors' code)",
                  # The code's chain of global trainings; the parallel reading.
                  parity=({"stocfl_tau": 0.3},
                          {"stocfl_global": "parallel", "stocfl_obbs": 10, "stocfl_obep": 2,
                           "stocfl_mu": 0.5})),
)
