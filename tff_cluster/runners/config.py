"""`RunnerConfig`: which runner executes a run, and its settings, as one value.

Its fields are the runner settings the CLI declares (`hp.RUNNER_HPARAMS`,
`--runner` as `name`), each checked by its declaration in `checked`, which
the CLI and the API both call. No TensorFlow import.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional

from tff_cluster.spec import hparams as hp

# Each field's declaration: the flag `--runner` is the field `name`.
DECLARATIONS: Dict[str, hp.HParam] = {
    ("name" if decl is hp.RUNNER else decl.name): decl for decl in hp.RUNNER_HPARAMS}
# The runners each setting applies to (a setting absent here applies to all).
SETTING_RUNNERS = {"jit": ("local", "ray"), "client_batching": ("local", "ray"),
                   "client_chunk": ("local", "ray"), "ray_workers": ("ray",),
                   "ray_address": ("ray",), "tff_workers": ("tff",),
                   "tff_worker_grace": ("tff",), "tff_subround_timeout": ("tff",)}


@dataclasses.dataclass(frozen=True)
class RunnerConfig:
  """The runner (`name`: 'local', 'tff' or 'ray') and its settings: `jit`,
  `client_batching` and `client_chunk` apply to the local and ray runners,
  `ray_workers` and `ray_address` to the ray runner, `tff_workers`
  (HOST:PORT,...), `tff_worker_grace` and `tff_subround_timeout` (seconds)
  to the tff runner (see `hp.RUNNER_HPARAMS`). Made by `checked`, every
  value is valid."""
  name: str = hp.RUNNER.default
  jit: str = hp.JIT.default
  client_batching: str = hp.CLIENT_BATCHING.default
  client_chunk: int = hp.CLIENT_CHUNK.default
  ray_workers: Optional[int] = None
  ray_address: Optional[str] = None
  tff_workers: Optional[str] = None
  tff_worker_grace: Optional[float] = None
  tff_subround_timeout: Optional[float] = None

  @classmethod
  def checked(cls, **values: Any) -> "RunnerConfig":
    """The config of `values` (by field name; None or absent: the
    declaration's default), each checked by its declaration; the ray and tff
    runners' settings only with their runner. Raises `hp.HParamError` (one
    line, in flag words: `--name=value`)."""
    unknown = sorted(set(values) - set(DECLARATIONS))
    if unknown:
      raise hp.HParamError(f"unknown runner setting {unknown[0]!r}; valid: "
                           f"{', '.join(DECLARATIONS)}")
    config = cls(**{field: decl.check(decl.default if values.get(field) is None
                                      else values[field])
                    for field, decl in DECLARATIONS.items()})
    for runner in ("ray", "tff"):
      given = [f"--{field}" for field, runners in SETTING_RUNNERS.items()
               if runners == (runner,) and getattr(config, field) is not None]
      if given and config.name != runner:
        raise hp.HParamError(f"{', '.join(given)} given with --runner={config.name}; "
                             f"valid: --runner={runner} with them, or neither")
    if config.tff_workers is not None:
      try:
        hp.parse_host_ports(config.tff_workers, "tff_workers")
      except ValueError as e:
        raise hp.HParamError(str(e)) from None
    if config.ray_address == "":
      raise hp.HParamError("invalid --ray_address=''; valid: HOST:PORT of a Ray head, "
                           "or auto")
    return config

  @classmethod
  def of_flags(cls, values: Mapping[str, Any]) -> "RunnerConfig":
    """`checked` of the runner settings in `values` by their flag names
    (`runner` for `name`; other names are not read)."""
    return cls.checked(**{field: values.get(decl.name)
                          for field, decl in DECLARATIONS.items()})

  def flags(self) -> Dict[str, Any]:
    """The settings by their flag names (`runner` for `name`), as config.json
    holds them."""
    return {decl.name: getattr(self, field) for field, decl in DECLARATIONS.items()}
