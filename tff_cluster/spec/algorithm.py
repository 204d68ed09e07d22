"""`AlgorithmSpec`: everything an `--algo` declares, once, beside its rule.

Each algorithm folder under `tff_cluster/algorithms/` (a package) names its
algorithms in `SPECS`, a tuple of `AlgorithmSpec`, in its `__init__.py`, which
imports neither TensorFlow nor TFF: the registry discovers them there and the
CLI builds its flags, `--help` and checks from them before any heavy import.
The spec names its module (the rule: a `Definition` subclass and the host's
`Driver`), which is imported only when a run is built.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Mapping, Tuple

from tff_cluster.spec.hparams import HParam
from tff_cluster.spec.options import Options


def _load(path: str, module: str):
  """The object `path` names: `name` in `module`, or `package.module:name`."""
  where, _, name = path.rpartition(":")
  return getattr(importlib.import_module(where or module), name)


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  """One `--algo`.

  Attributes:
    name: the `--algo` value.
    description: one line for `--help`.
    module: the full dotted name of the module with the rule (its `host` and
      `definition`).
    host: the `Driver` subclass in `module` (or `package.module:Class`),
      constructed as `host(context, definition)`.
    definition: the function in `module` (or `package.module:function`) that
      makes the `Definition` from a `host.driver.Context`.
    hparams: its own options, declared once; shared concepts use the shared
      declarations of `tff_cluster.spec.hparams`.
    fixed: values of options it does not expose as flags (e.g. FedAdam's
      server optimizer `adam` on FedAvg's rule); its definition and host read
      them with the options.
    parity: option values of the cases every runner must agree on
      (`tests/test_runners.py`); at least one.
    all_clients: every client takes part in every round (cross-silo); the
      CLI's --clients_per_round then defaults to all of them.
    own_momentum: why the solver's `--client_momentum` does not apply (its
      local steps are its own); empty: it does. A task's default momentum is
      then dropped and a --client_momentum given is refused with this reason.
  """
  name: str
  description: str
  module: str
  host: str
  definition: str = "definition"
  hparams: Tuple[HParam, ...] = ()
  fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  parity: Tuple[Mapping[str, Any], ...] = ()
  all_clients: bool = False
  own_momentum: str = ""

  def options(self, task=None, **values) -> Options:
    """This algorithm's `Options`: `values` checked, the task's defaults then
    the declarations' filling the rest, and its fixed values; a name it does
    not declare is refused."""
    return Options(self.hparams, values, task=None if task is None else task.name,
                   task_defaults=dict(getattr(task, "defaults", None) or {}),
                   algo=self.name, fixed=self.fixed)

  def check_client_momentum(self, momentum: float, flag: str = "--client_momentum") -> None:
    """Refuses (`ValueError`, one line) a local momentum for an algorithm
    whose local steps are its own; `flag` names the setting in the caller's
    words (the CLI's flag, the API's keyword)."""
    if self.own_momentum and momentum:
      raise ValueError(f"invalid {flag} for {self.name}: {self.own_momentum}; "
                       f"valid: {flag}=0")

  def load_host(self):
    """Its `Driver` subclass (imports its module: TensorFlow)."""
    return _load(self.host, self.module)

  def load_definition(self):
    """Its definition function (imports its module: TensorFlow)."""
    return _load(self.definition, self.module)
