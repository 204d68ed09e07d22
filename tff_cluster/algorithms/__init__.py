"""One folder per algorithm (or family of algorithms sharing a rule): its
`__init__.py` declares `SPECS` (`tff_cluster.spec.algorithm.AlgorithmSpec`,
no TensorFlow), its module the `Definition` (the round as plain TensorFlow
functions), the `Driver` (the host side between rounds) and
`definition(context)`. `tff_cluster.registry` discovers the folders; this
package's `__init__` imports nothing, so an algorithm never imports the
registry. Shared parts of several folders live in flat modules here
(`personal.py`).
"""
