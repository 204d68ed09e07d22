"""The papers' task settings moved into the library: `tff_cluster.tasks`.

This package keeps `import tasks` and `from tasks import fmnist` working in a
checkout (scripts, notebooks and tests written before the move): `tasks` and
`tasks.<module>` are the very module objects of `tff_cluster.tasks`, not
copies, so patching one patches the other.
"""

import importlib
import sys

from tff_cluster import tasks as _package

for _name in _package._MODULES:  # pylint: disable=protected-access
  sys.modules[f"{__name__}.{_name}"] = importlib.import_module(
      f"tff_cluster.tasks.{_name}")
sys.modules[__name__] = _package
