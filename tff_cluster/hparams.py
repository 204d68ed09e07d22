"""`tff_cluster.hparams` kept for users: the module is `tff_cluster.spec.hparams`."""
import sys

from tff_cluster.spec import hparams as _module

sys.modules[__name__] = _module
