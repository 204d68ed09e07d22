"""`tff_cluster.plot` kept for users: the module is `tff_cluster.io.plot`."""
import sys

from tff_cluster.io import plot as _module

if __name__ == "__main__":
  sys.exit(_module.main())
else:
  sys.modules[__name__] = _module
