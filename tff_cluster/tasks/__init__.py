"""The papers' task settings, installed with the library: `--task` name -> `TaskSpec`.

`from tff_cluster import tasks; tasks.get_task("femnist_fedprox")` works from
any directory once the package is installed (a checkout's `tasks/` is an alias
of this package).

Each module listed in `_MODULES` defines `TASKS`, a list of `TaskSpec`s. The
modules only describe tasks; no data is read at import time.
"""

from __future__ import annotations

import importlib
from typing import Dict

from tff_cluster.spec.task import TaskSpec

_MODULES = ("synthetic", "femnist", "femnist_fedprox", "sent140", "mnist", "fmnist",
            "cifar10", "mnist_clusterwise", "mnist_workers", "rotated", "shakespeare",
            "cifar100_tff", "celeba")


def registry() -> Dict[str, TaskSpec]:
  tasks: Dict[str, TaskSpec] = {}
  for module in _MODULES:
    for spec in importlib.import_module(f"tff_cluster.tasks.{module}").TASKS:
      if spec.name in tasks:
        raise ValueError(f"task {spec.name!r} is defined twice")
      tasks[spec.name] = spec
  return tasks


def task_names():
  return sorted(registry())


def get_task(name: str) -> TaskSpec:
  tasks = registry()
  if name not in tasks:
    raise KeyError(f"unknown task {name!r}; valid: {', '.join(sorted(tasks))}")
  return tasks[name]
