"""`make_runner`: the runner a `RunnerConfig` names (`--runner`). Above both
runners in the layering; the `tff` runner, an optional backend, is imported
only when asked for, and Ray only when a `ray` runner is made."""

from __future__ import annotations

from tff_cluster import stack
from tff_cluster.spec.hparams import RUNNERS
from tff_cluster.runners import local_runner, ray_runner
from tff_cluster.runners.config import RunnerConfig


def make_runner(config: RunnerConfig, definition, model, data, seed: int, modes=None):
  """The runner `config.name` ('tff', 'local' or 'ray', with its settings)
  for `definition` on `data`; `model`: the `ModelSpec` (model_fn and loss)
  to train; `modes`: the definition's modes it will run (default all; the
  tff runner builds their computations up front)."""
  if config.name == "tff":  # an optional backend: imported only when asked for
    stack.require_tff()
    from tff_cluster.runners.tff import runner as tff_runner
    return tff_runner.TffRunner(definition, model.model_fn, model.loss, data, seed,
                                modes=modes, workers=config.tff_workers,
                                worker_grace=config.tff_worker_grace,
                                subround_timeout=config.tff_subround_timeout)
  if config.name == "local":
    return local_runner.LocalRunner(definition, model.model_fn, model.loss, data, seed,
                                    jit=config.jit, client_batching=config.client_batching,
                                    chunk=config.client_chunk)
  if config.name == "ray":  # Ray itself is imported by the runner
    return ray_runner.RayRunner(definition, model.model_fn, model.loss, data, seed,
                                jit=config.jit, client_batching=config.client_batching,
                                chunk=config.client_chunk, num_workers=config.ray_workers,
                                address=config.ray_address)
  raise ValueError(f"invalid --runner={config.name}; valid: {', '.join(RUNNERS)}")
