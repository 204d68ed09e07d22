"""MNIST twins of the WeCFL paper's Fashion-MNIST tasks (FMNIST CNN).

mnist_clusterwise_dir, mnist_clusterwise_class, mnist_clientwise_dir and
mnist_clientwise_class: the same partitions, settings and defaults as the
fmnist_* tasks of tasks/fmnist.py (see its docstring), on the official MNIST
train (60,000) and test (10,000) sets from `--data_dir` (the four idx files)
or Keras' cache (~/.keras/datasets/mnist.npz). Pixels in [-1, 1], BatchNorm
with PyTorch's defaults, as the fmnist_* tasks.
"""

from __future__ import annotations

from tff_cluster.tasks import fmnist
from tff_cluster.spec.task import DataOptions


def _official(options: DataOptions):
  return fmnist.official_split("mnist", options.data_dir, options.data_source)


TASKS = fmnist.wecfl_tasks("mnist", "MNIST", lambda options: _official(options))
