"""Local-only: each client trains its own model, nothing is shared."""

from tff_cluster.spec.algorithm import AlgorithmSpec

SPECS = (
    AlgorithmSpec("local_only", "Local-only: each client trains its own model, "
                  "nothing is shared", f"{__name__}.local_only",
                  host="tff_cluster.algorithms.personal:PersonalDriver", parity=({},)),
)
