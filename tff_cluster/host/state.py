"""`HostState`: what a driver keeps between rounds, as one typed value.

Each driver declares a dataclass of its host state (e.g. each client's
group, the random generators its rounds draw from, the facts its summary
reports) and keeps one instance as `driver.host`. A checkpoint stores it
whole, as a dict of its fields by name (`to_dict`); the keys older checkpoints
used for some fields map to them in one place,
`tff_cluster.io.checkpoint.RENAMED_HOST_KEYS`.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Dict, List, Mapping


@dataclasses.dataclass
class HostState:
  """A driver's host state with no fields (an algorithm whose host keeps
  nothing between rounds); drivers that keep something subclass it."""

  @classmethod
  def field_names(cls) -> List[str]:
    """The name of every field (a checkpoint's keys)."""
    return [f.name for f in dataclasses.fields(cls)]

  def to_dict(self) -> Dict[str, Any]:
    """{field name: value} of every field (the values themselves, not
    copies)."""
    return {name: getattr(self, name) for name in self.field_names()}

  def restored(self, values: Mapping[str, Any]) -> "HostState":
    """This state with the fields a checkpoint's `values` hold (copies);
    a field it lacks keeps its value here. Raises ValueError naming a key
    that is no field of this state (another algorithm's checkpoint)."""
    names = self.field_names()
    unknown = sorted(set(values) - set(names))
    if unknown:
      raise ValueError(f"its host state holds {unknown[0]!r}, not a field of "
                       f"{type(self).__name__} ({', '.join(sorted(names)) or 'none'})")
    return dataclasses.replace(self, **{k: copy.deepcopy(v) for k, v in values.items()})

  def copy(self) -> "HostState":
    """A deep copy (the fields are mutable arrays and generators)."""
    return copy.deepcopy(self)
