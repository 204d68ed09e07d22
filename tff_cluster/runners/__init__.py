"""Runners: how a `Definition`'s round is executed (see `base`).

* `local_runner.LocalRunner`: in-process, the client loop a `tf.while_loop`
  (XLA-compiled where that pays), on a GPU when TensorFlow sees one.
* `tff_runner.TffRunner`: TFF computations on TFF's C++ runtime, the reference;
  the only runner that imports TFF. `tff_runner.build_computations` gives an
  algorithm's computations to TFF pipelines.

`config.RunnerConfig` names one and holds its settings (TF-free);
`factory.make_runner(config, ...)` makes it. This package's `__init__` imports
nothing, so the runners import `base` without a cycle.
"""
