"""`make_runner`: the runner of a name (`--runner`). Above both runners in the
layering; the `tff` runner, an optional backend, is imported only when asked for."""

from __future__ import annotations

from tff_cluster import stack
from tff_cluster.hparams import RUNNERS
from tff_cluster.runners import local_runner


def make_runner(name: str, definition, model_fn, loss: str, data, seed: int,
                jit: str = "auto", modes=None):
  """The runner `name` ('tff' or 'local') for `definition` on `data`; `modes`:
  the definition's modes it will run (default all; the tff runner builds
  their computations up front)."""
  if name == "tff":  # an optional backend: imported only when asked for
    stack.require_tff()
    from tff_cluster.runners import tff_runner
    return tff_runner.TffRunner(definition, model_fn, loss, data, seed, modes=modes)
  if name == "local":
    return local_runner.LocalRunner(definition, model_fn, loss, data, seed, jit=jit)
  raise ValueError(f"invalid --runner={name}; valid: {', '.join(RUNNERS)}")
