"""`ModelSpec`: the model a driver trains, with or without a task around it."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """What a driver reads of a model: `model_fn` builds a fresh, built Keras
  model; `loss` is a `tff_cluster.models` loss kind; `name` labels the runs
  (a task's name, or "custom" for a model given to `tff_cluster.api`)."""

  model_fn: Callable[[], Any]
  loss: str
  name: str = "custom"

  @classmethod
  def of(cls, source) -> "ModelSpec":
    """The model spec of a `TaskSpec` (its model function, loss and name), or
    of a `ModelSpec` (an equal one)."""
    return cls(source.model_fn, source.loss, source.name)
