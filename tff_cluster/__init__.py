"""tff-cluster: clustered and personalized federated learning on TFF."""

__version__ = "0.1.0"

# Own TFF's execution context (and its C++ worker process) from the first import.
from tff_cluster import runtime  # noqa: E402,F401
