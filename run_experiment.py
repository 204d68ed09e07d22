"""Runs one federated experiment: --algo on --task, results in --output_dir.

The checkout's path to the `tff-cluster` command (installed with the package;
`python -m tff_cluster` is the same): its code is `tff_cluster.experiment`,
which `import run_experiment` also gives (the same module object).
"""

import sys

if __name__ == "__main__":
  from tff_cluster.console import main
  sys.exit(main("run_experiment.py"))
else:
  from tff_cluster import experiment
  sys.modules[__name__] = experiment
