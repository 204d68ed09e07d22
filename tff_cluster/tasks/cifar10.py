"""CIFAR-10 with Dirichlet label skew, CIFAR-10 LeNet-style CNN.

Data: the pooled 60,000 CIFAR-10 images (float32 [32, 32, 3] in [0, 1]) from
`--data_dir` holding `cifar-10-batches-py/` (data_batch_1..5, test_batch; the
extracted cifar-10-python.tar.gz) or, without `--data_dir`, Keras' cache
(~/.keras/datasets/cifar-10-batches-py/).
Partition: per class, proportions over clients ~ Dir(alpha) (Hsu et al. 2019);
alpha = DataOptions.extra['concentration'] (default 0.5); each client split
90/10. The optimization defaults are this project's choice (FedGroup-style
20 clients per round, 10 local epochs, batch 10), not from a paper.
"""

from __future__ import annotations

from tff_cluster import models
from tff_cluster.data import partition as part
from tff_cluster.data import vision
from tff_cluster.data.federated import FederatedData
from tff_cluster.spec.hparams import HParam
from tff_cluster.spec.task import DataOptions, TaskSpec, task_arg

CONCENTRATION = HParam("concentration", float, 0.5, "Dirichlet alpha", low=0,
                       low_open=True)

DEFAULTS = dict(rounds=200, clients_per_round=20, local_epochs=10, batch_size=10,
                client_lr=0.01, mu=0.01, num_clients=100)


def load_cifar10(options: DataOptions) -> FederatedData:
  x, y = vision.load_cifar10(options.data_dir)
  n = options.num_clients or DEFAULTS["num_clients"]
  alpha = task_arg(options, CONCENTRATION)
  p = part.dirichlet_label_skew(y, n, alpha, options.seed)
  return part.build_federated_data(
      x, y, p, 10, options.seed,
      f"CIFAR-10 ({options.data_dir or 'Keras cache'}), {n} clients, Dirichlet "
      f"label skew alpha={alpha:g}, seed {options.seed}")


TASKS = [
    TaskSpec(
        name="cifar10",
        description="CIFAR-10, 100 clients, Dirichlet(0.5) label skew, LeNet-style "
                    "CNN (--data_dir: cifar-10-batches-py/)",
        load_data=load_cifar10, task_args=(CONCENTRATION,), model_fn=models.cifar10_cnn, model_name="cifar10_cnn",
        loss=models.SPARSE_CE_LOGITS, defaults=DEFAULTS,
        source="partition: Hsu et al. 2019 (Dirichlet label skew); defaults: "
               "this project"),
]
