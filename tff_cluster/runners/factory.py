"""`make_runner`: the runner of a name (`--runner`). Above both runners in the
layering; the `tff` runner, an optional backend, is imported only when asked for,
and Ray only when a `ray` runner is made."""

from __future__ import annotations

from tff_cluster import stack
from tff_cluster.spec.hparams import RUNNERS
from tff_cluster.runners import local_runner, ray_runner


def make_runner(name: str, definition, model_fn, loss: str, data, seed: int,
                jit: str = "auto", modes=None, ray_workers=None, ray_address=None,
                tff_workers=None, tff_worker_grace=None, tff_subround_timeout=None,
                client_batching: str = "auto", client_chunk=None):
  """The runner `name` ('tff', 'local' or 'ray') for `definition` on `data`;
  `modes`: the definition's modes it will run (default all; the tff runner
  builds their computations up front); `ray_*`: the ray runner's actors and
  cluster."""
  if name == "tff":  # an optional backend: imported only when asked for
    stack.require_tff()
    from tff_cluster.runners.tff import runner as tff_runner
    return tff_runner.TffRunner(definition, model_fn, loss, data, seed, modes=modes,
                                workers=tff_workers, worker_grace=tff_worker_grace,
                                subround_timeout=tff_subround_timeout)
  if name == "local":
    return local_runner.LocalRunner(definition, model_fn, loss, data, seed, jit=jit,
                                    client_batching=client_batching, chunk=client_chunk)
  if name == "ray":  # Ray itself is imported by the runner
    return ray_runner.RayRunner(definition, model_fn, loss, data, seed, jit=jit,
                                client_batching=client_batching, chunk=client_chunk,
                                num_workers=ray_workers, address=ray_address)
  raise ValueError(f"invalid --runner={name}; valid: {', '.join(RUNNERS)}")
