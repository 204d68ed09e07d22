"""FeSEM (Xie et al., multi-center FL), as the WeCFL paper compares with it.

WeCFL's round (`tff_cluster.algorithms.wecfl`) with uniform K-Means weights:
the clustering minimises sum_i ||g_i - G_k(i)||^2 (the WeCFL paper's eq. (2)).
The cluster models are (`--fesem_center`):
  uniform: Omega_k = mean of its members' models (eq. (2), default);
  data:    Omega_k = data-weighted mean (the authors' code behind the WeCFL
           paper's FeSEM rows, whose aggregation keeps its data-size default).
"""

from __future__ import annotations

from tff_cluster.host import driver
from tff_cluster.algorithms import wecfl
from tff_cluster.spec.options import FESEM_HPARAMS, options_of

make_definition = wecfl.make_definition


def make_driver(task, data, config: driver.TrainingConfig, options=None, **values):
  """WeCFL's driver with FeSEM's clustering (uniform K-Means weights) and
  cluster models (`--fesem_center`)."""
  options = options_of(FESEM_HPARAMS, options, **values)
  return wecfl.WeCFLDriver(task, data, config, options, kmeans_weights="uniform",
                           center_weights=options.fesem_center)
