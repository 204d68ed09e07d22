"""tff-cluster: clustered and personalized federated learning on TFF.

Importing the package, the algorithm definitions or the `local` runner does
not import TensorFlow Federated; the `tff` runner (`tff_cluster.runners.tff.
runner`) and the TFF builders do, and install the TFF context owned by
`tff_cluster.runners.tff.runtime` when first used.
"""

__version__ = "0.2.0"
