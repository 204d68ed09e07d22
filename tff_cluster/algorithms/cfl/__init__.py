"""CFL: a cluster tree grown by bipartitions of clusters whose members' updates disagree."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

CFL_OPTIONS = hp.grouped(
    "cfl",
    hp.NUM_GROUPS,
    hp.HParam("cfl_eps1", float, 0.4, "A cluster may split when the norm of its mean "
              "update is below eps1.", low=0, low_open=True),
    hp.HParam("cfl_eps2", float, 1.6, "... and its largest update norm is above eps2.",
              low=0),
    hp.HParam("cfl_warmup_rounds", int, 20, "No split in the first rounds.", low=0,
              limit=hp.MAX_ROUNDS),
    hp.HParam("cfl_weighting", str, "uniform", "Mean update and cluster models: uniform "
              "(the authors' code) or data-weighted.", choices=("uniform", "data")),
)

SPECS = (
    AlgorithmSpec("cfl", "CFL: a cluster tree, bipartitions by the cosine "
                  "similarity of the members' updates (--num_groups: most clusters)",
                  f"{__name__}.cfl", host="CFLDriver",
                  definition="tff_cluster.algorithms.wecfl.wecfl:fixed_clusters_definition",
                  hparams=CFL_OPTIONS,
                  # eps chosen so that splits happen within the 4 rounds.
                  parity=({"num_groups": 4, "cfl_eps1": 2.0, "cfl_eps2": 0.1,
                           "cfl_warmup_rounds": 1},
                          {"num_groups": 2, "cfl_eps1": 2.0, "cfl_eps2": 0.1,
                           "cfl_warmup_rounds": 0, "cfl_weighting": "data"})),
)
