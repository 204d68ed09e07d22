"""Algorithm registry: `--algo` name -> its `AlgorithmSpec`.

The registry discovers the specs: every folder (package) under
`tff_cluster/algorithms/` names its algorithms in `SPECS` (a tuple of
`tff_cluster.spec.algorithm.AlgorithmSpec`) in its `__init__.py`, which
imports neither TensorFlow nor TFF, so the CLI builds its flags and checks
from them before any heavy import. `build_driver` makes a run's driver: the
options checked, the algorithm's definition made from the `Context`, then
its host constructed with both. Algorithms of your own package join with
`register` (docs/extending.md).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from typing import Dict, List

from tff_cluster.spec.algorithm import AlgorithmSpec
from tff_cluster.spec.hparams import HParam
from tff_cluster.spec.options import Options

_PACKAGE = "tff_cluster.algorithms"


def discover_specs(package: str = _PACKAGE) -> List[AlgorithmSpec]:
  """The `SPECS` of every folder under `package`, folders by name."""
  root = importlib.import_module(package)
  out: List[AlgorithmSpec] = []
  for info in sorted(pkgutil.iter_modules(root.__path__), key=lambda i: i.name):
    if info.ispkg:
      out.extend(getattr(importlib.import_module(f"{package}.{info.name}"), "SPECS", ()))
  return out


def build_driver(spec, model, data, config, options=None, *, initial_weights=None, **values):
  """`spec`'s (an `AlgorithmSpec` or a registered name) driver for `model` (a `TaskSpec` or a `ModelSpec`) on `data`
  with the shared settings `config`: its options `options` (an `Options`,
  or None) with `values` applied, checked once here (then `host.check`, before
  the definition and the runner are made) (the rest take the
  task's defaults, then the declarations'). An algorithm whose local steps
  are its own refuses `--client_momentum` in one line."""
  from tff_cluster.host import driver  # TensorFlow: only when a run is built
  if isinstance(spec, str):
    spec = get_algorithm(spec)
  spec.check_client_momentum(config.client_momentum)
  if isinstance(options, Options):
    options = options.replace(**values) if values else options
  else:
    options = spec.options(task=model, **{**dict(options or {}), **values})
  context = driver.Context.of(model, data, config, options, initial_weights)
  host = spec.load_host()
  host.check(context)
  return host(context, driver.with_mechanism(spec.load_definition()(context), host, context))


ALGORITHMS: Dict[str, AlgorithmSpec] = {spec.name: spec for spec in discover_specs()}


def register(name: str, spec: AlgorithmSpec) -> None:
  """Adds an algorithm defined outside `tff_cluster.algorithms` (docs/extending.md).

  `spec.name` must be `name`; a
  name already taken, or an option declared by another algorithm with another
  type or choices, is refused with a `ValueError` of one line. Register before
  `run_experiment` is imported for the CLI to know its flags (it reads the
  registry once, at import); `tff_cluster.api.build` sees it at once.
  """
  if name in ALGORITHMS:
    raise ValueError(f"algorithm {name!r} is already registered; choose another name")
  if spec.name != name:
    raise ValueError(f"register({name!r}, spec): spec.name is {spec.name!r}, not {name!r}")
  ALGORITHMS[name] = spec
  try:
    all_hparams()
  except ValueError:
    del ALGORITHMS[name]
    raise


def get_algorithm(name: str) -> AlgorithmSpec:
  if name not in ALGORITHMS:
    raise KeyError(f"unknown algorithm {name!r}; valid: {', '.join(sorted(ALGORITHMS))}")
  return ALGORITHMS[name]


def all_hparams() -> Dict[str, HParam]:
  """Every declared algorithm hyper-parameter by name (one flag each).

  Two algorithms may declare the same name only with the same type and
  choices (a shared concept, e.g. `num_groups`); the CLI flag takes the first
  declaration's default and help.
  """
  out: Dict[str, HParam] = {}
  for spec in ALGORITHMS.values():
    for decl in spec.hparams:
      first = out.setdefault(decl.name, decl)
      if (first.type, first.choices) != (decl.type, decl.choices):
        raise ValueError(f"--{decl.name} is declared twice with different types")
  return out
