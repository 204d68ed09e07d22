"""`tff_cluster.options` kept for users: the module is `tff_cluster.spec.options`."""
import sys

from tff_cluster.spec import options as _module

sys.modules[__name__] = _module
