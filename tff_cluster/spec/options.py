"""`Options`: an algorithm's options, checked, as one object.

Each option is one `HParam` (type, default, valid values, help, per-task
defaults; `tff_cluster.spec.hparams`); an algorithm's spec lists them beside
its rule (`tff_cluster.spec.algorithm.AlgorithmSpec.hparams`), and the CLI
turns them into flags. `Options(declared, values)` fills the defaults, checks
every value and refuses names the algorithm does not declare: the algorithm's
definition and driver read that one object. This module sits at the bottom of
the layering (no TensorFlow import).
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Optional, Sequence

from tff_cluster.spec.hparams import HParam, HParamError


class Options(Mapping):
  """An algorithm's options: every declared `HParam`, given or defaulted, checked.

  Read them as attributes (`options.num_groups`) or as a mapping; it is frozen
  (`replace(**changes)` makes a checked copy). A default of `None` stays None
  ("derived": the declaration's help says from what). A name the algorithm
  does not declare is refused with one line (`HParamError`).
  """

  def __init__(self, declared: Sequence[HParam], values: Optional[Mapping[str, Any]] = None,
               task: Optional[str] = None, task_defaults: Optional[Mapping[str, Any]] = None,
               algo: str = "", fixed: Optional[Mapping[str, Any]] = None):
    values = dict(values or {})
    names = [d.name for d in declared]
    unknown = sorted(set(values) - set(names))
    if unknown:
      who = f"{algo} " if algo else ""
      raise HParamError(
          f"{who}has no option {', '.join('--' + u for u in unknown)}; valid: "
          f"{', '.join('--' + n for n in names) or 'none'}")
    checked = {}
    for d in declared:
      value = values[d.name] if d.name in values else d.default_for(task, task_defaults or {})
      checked[d.name] = d.check(value)
    checked.update(fixed or {})
    object.__setattr__(self, "_declared", tuple(declared))
    object.__setattr__(self, "_values", checked)
    object.__setattr__(self, "_context", (task, task_defaults, algo, dict(fixed or {})))

  def __getattr__(self, name: str) -> Any:
    values = self.__dict__.get("_values", {})
    if name in values:
      return values[name]
    raise AttributeError(f"no option {name!r}")

  def __setattr__(self, name, value):
    raise AttributeError("Options are frozen; use replace(**changes)")

  @property
  def algo(self) -> str:
    """The `--algo` whose options these are ("" outside the registry)."""
    return self._context[2]

  def __getitem__(self, name: str) -> Any:
    return self._values[name]

  def __iter__(self) -> Iterator[str]:
    return iter(self._values)

  def __len__(self) -> int:
    return len(self._values)

  def __repr__(self) -> str:
    return "Options(" + ", ".join(f"{k}={v!r}" for k, v in self._values.items()) + ")"

  def replace(self, **changes) -> "Options":
    task, task_defaults, algo, fixed = self._context
    values = {**self._values, **changes}
    fixed = {k: values.pop(k) for k in fixed}
    return Options(self._declared, values, task, task_defaults, algo, fixed)


def given(options: Options, name: str) -> Any:
  """`options[name]`, which must be set: a declaration whose default is
  "derived" from the task (e.g. `--mu`) has none outside a task."""
  value = options[name]
  if value is None:
    raise HParamError(f"--{name} has no default outside a task; give it (the CLI and "
                      "the registry take the task's)")
  return value
