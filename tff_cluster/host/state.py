"""`HostState`: what a driver keeps between rounds, as one typed value.

Each driver declares a dataclass of its host state (e.g. each client's
group, the random generators its rounds draw from, the facts its summary
reports) and keeps one instance as `driver.host`. A checkpoint stores it
whole, as a dict of its fields (`to_dict`) under each field's checkpoint key:
the field's name, or the `key` a field made by `stored_as` names (the keys
checkpoints have always used, so that any of them resumes).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Dict, Mapping


def stored_as(key: str) -> Any:
  """A field (no default) that a checkpoint stores under `key`."""
  return dataclasses.field(metadata={"key": key})


def _key(field: dataclasses.Field) -> str:
  return field.metadata.get("key", field.name)


@dataclasses.dataclass
class HostState:
  """A driver's host state with no fields (an algorithm whose host keeps
  nothing between rounds); drivers that keep something subclass it."""

  @classmethod
  def checkpoint_keys(cls) -> Dict[str, str]:
    """{checkpoint key: field name} of every field."""
    return {_key(f): f.name for f in dataclasses.fields(cls)}

  def to_dict(self) -> Dict[str, Any]:
    """{checkpoint key: value} of every field (the values themselves, not
    copies)."""
    return {_key(f): getattr(self, f.name) for f in dataclasses.fields(self)}

  def restored(self, values: Mapping[str, Any]) -> "HostState":
    """This state with the fields a checkpoint's `values` hold (copies);
    a field it lacks keeps its value here. Raises ValueError naming a key
    that is no field of this state (another algorithm's checkpoint)."""
    names = self.checkpoint_keys()
    unknown = sorted(set(values) - set(names))
    if unknown:
      raise ValueError(f"its host state holds {unknown[0]!r}, not a field of "
                       f"{type(self).__name__} ({', '.join(sorted(names)) or 'none'})")
    return dataclasses.replace(self, **{names[k]: copy.deepcopy(v) for k, v in values.items()})

  def copy(self) -> "HostState":
    """A deep copy (the fields are mutable arrays and generators)."""
    return copy.deepcopy(self)
