"""What a task is: a data source + partition, a model, a loss and defaults.

Task modules live in `tff_cluster.tasks` (installed with the library; the CLI
and the README's examples use them); each defines `TaskSpec`s. The rest of the
library only knows this interface.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Tuple

from tff_cluster.spec.hparams import HParam

from tff_cluster.data.federated import FederatedData


@dataclasses.dataclass(frozen=True)
class DataOptions:
  """Settings a task's data loader may read (from CLI flags or code).

  `num_clients=None` means the task's own default. `extra` carries task-specific
  settings (e.g. a partition's number of clusters) by name. `data_source`
  ("auto", "keras" or "tfds") picks where the vision tasks read MNIST,
  Fashion-MNIST and CIFAR-10 (tff_cluster.data.vision's rule).
  """
  seed: int = 0
  num_clients: Optional[int] = None
  data_dir: Optional[str] = None
  data_source: str = "auto"
  synthetic_alpha: float = 1.0
  synthetic_beta: float = 1.0
  glove_path: Optional[str] = None
  extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """One `--task`.

  Attributes:
    name: the `--task` value.
    description: one line for `--help`: data, partition, model.
    load_data: builds the federated data from `DataOptions`.
    model_fn: builds a fresh, built (variables created) Keras model: the
      task's default model, named `model_name`.
    loss: `'sparse_ce_logits'` (multi-class, model outputs logits) or
      `'binary_probs'` (one sigmoid output), or `'sequence_ce_logits'` (a
      label per sequence position, 0 = padding; logits per position).
    defaults: default hyper-parameters: rounds, clients_per_round,
      local_epochs, batch_size, client_lr, mu, num_clients (and any others).
    source: the paper/setting the defaults come from.
    model_name: the name of `model_fn` for `--model`.
    other_models: further models the task offers, name -> builder
      (`--model=NAME`; `with_model` picks one).
    task_args: the settings `--task_arg NAME=VALUE` may give (declarations
      with type, default and valid range; read with `task_arg`).
  """
  name: str
  description: str
  load_data: Callable[[DataOptions], FederatedData]
  model_fn: Callable[[], Any]
  loss: str
  defaults: Mapping[str, Any]
  source: str = ""
  model_name: str = "default"
  other_models: Mapping[str, Callable[[], Any]] = dataclasses.field(default_factory=dict)
  task_args: Tuple[HParam, ...] = ()

  @property
  def model_names(self):
    return (self.model_name, *self.other_models)

  def with_model(self, name: Optional[str]) -> "TaskSpec":
    """This task with model `name` (None or `model_name`: unchanged)."""
    if name is None or name == self.model_name:
      return self
    if name not in self.other_models:
      raise ValueError(f"invalid --model={name} for --task={self.name}; valid: "
                       f"{', '.join(self.model_names)}")
    return dataclasses.replace(self, model_fn=self.other_models[name], model_name=name,
                               other_models={self.model_name: self.model_fn,
                                             **{k: v for k, v in self.other_models.items()
                                                if k != name}})


def task_arg(options: DataOptions, decl: HParam) -> Any:
  """The task setting `decl` from `options.extra` (its default when absent),
  checked: a bad value raises `HParamError` naming `--task_arg`."""
  value = options.extra.get(decl.name)
  try:
    return decl.check(decl.default if value is None else value)
  except ValueError:
    raise type_error(decl, value) from None


def type_error(decl: HParam, value: Any) -> ValueError:
  from tff_cluster.spec.hparams import HParamError
  return HParamError(f"invalid --task_arg={decl.name}={value}; valid: {decl.valid_text()}")
