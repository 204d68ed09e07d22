"""One module per algorithm: its `Definition` (the round as plain TensorFlow
functions) and its driver (`make_driver`, the host side between rounds). The
registry of names and options is `tff_cluster.registry`; this package's
`__init__` imports nothing, so an algorithm module never imports the registry.
"""
