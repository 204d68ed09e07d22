"""`python -m tff_cluster`: the `tff-cluster` command (see `tff_cluster.experiment`)."""

import sys

from tff_cluster.console import main

if __name__ == "__main__":
  sys.exit(main("python -m tff_cluster"))
