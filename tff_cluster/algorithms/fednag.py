"""FedNAG: pFedMo with pi = 0 (see `tff_cluster.algorithms.pfedmo`)."""

from tff_cluster.algorithms.pfedmo import make_fednag_driver as make_driver  # noqa: F401
