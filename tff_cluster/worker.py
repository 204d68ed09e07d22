"""`tff_cluster.worker` kept for users: the module is `tff_cluster.runners.tff.worker`."""
import sys

from tff_cluster.runners.tff import worker as _module

if __name__ == "__main__":
  sys.exit(_module.main())
else:
  sys.modules[__name__] = _module
