"""`tff_cluster.task` kept for users: the module is `tff_cluster.spec.task`."""
import sys

from tff_cluster.spec import task as _module

sys.modules[__name__] = _module
