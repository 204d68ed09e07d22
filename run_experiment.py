"""Runs one federated experiment: --algo on --task, results in --output_dir.

The checkout's path to the `tff-cluster` command (installed with the package;
`python -m tff_cluster` is the same); its code is `tff_cluster.experiment`.
"""

import sys

from tff_cluster.console import main

if __name__ == "__main__":
  sys.exit(main("run_experiment.py"))
