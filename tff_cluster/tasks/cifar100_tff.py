"""TFF's federated CIFAR-100 (500 training, 100 test clients), Reddi et al.'s setting.

Data (`tff_cluster.data.cifar100_tff`): TFF's `cifar100.sqlite`, fetched on
first use into `$TFF_CLUSTER_DATA` (`tff_cluster.data.download.CIFAR100`) and
read without TFF; `--data_dir` naming such a database (any file name) or a
folder holding `cifar100.sqlite` reads that file. The 500 training clients
(ids "train_<TFF id>", 100 images each) train; the 100 test clients ("test_<TFF
id>", 100 images each) are test-only: never sampled, each tested with the model
of lowest loss on its own images (with one model, that model: the accuracy is
then over CIFAR-100's whole test split, Reddi et al.'s evaluation). The
training clients have no test data (TFF's file has none) unless
`--task_arg=holdout=H` moves a share H of each one's images (seeded) into its
own test set. `--task_arg=labels=coarse` reads the 20 coarse labels instead of
the 100 fine ones. `--num_clients=N` keeps a seeded subset of N training
clients (the test clients stay).

Models: `resnet18` (the default), Reddi et al.'s ResNet-18 with group norm as
TFF builds it, behind TFF's baseline preprocessing (central 24 x 24 crop,
per-image standardization; `tff_cluster.vision_models.resnet18_gn`, 11.2M
parameters); `cnn`, a small CNN for CPUs (`models.simple_cnn`, the layers of
Reddi et al.'s EMNIST CNN on the 32 x 32 colour image, 1.6M parameters, 17
million multiply-adds a forward pass against the ResNet's 400 million). The paper's model is the default,
as every task's default is its paper's. It is a GPU's model: on two CPU cores
a round trains in about 25 s and an evaluation of the 10,000 test images takes
about 80 s, against 1.5 s and 5 s for `--model=cnn` (docs/tasks.md).

Defaults: Reddi et al., "Adaptive Federated Optimization" (ICLR 2021), as the
authors' code records them (google-research/federated
optimization/docs/hyperparameters.md at 0f29cad762b6353f8aee64862b9e7d1255f3f9f9
and optimization/main/federated_trainer.py at
00d4d5c859b5e43457f8ab1634d03b9502e6ef7d): 10 clients per round, one local
epoch, batch 20, 4,000 rounds, crop 24, client SGD at 10^-1 (FedAvg's best
client learning rate there; its best server learning rate, 10^0.5, is
`--server_lr`'s to set). Left out: the authors' random crops and flips of the
training images (`distort_train_images`, the default of their
optimization/tasks/cifar100.py at 4e068112247a6110d4eda9628dedc399706072ac;
TFF's baseline defaults to no distortion) and the model's L2 weight decay.
"""

from __future__ import annotations

from typing import Optional

from tff_cluster import models, vision_models
from tff_cluster.data import cifar100_tff, tff_sqlite
from tff_cluster.data.federated import FederatedData
from tff_cluster.spec.hparams import HParam
from tff_cluster.spec.task import DataOptions, TaskSpec, task_arg

LABELS = HParam("labels", str, "fine", "CIFAR-100's labels: fine (100 classes, Reddi "
                "et al.'s) or coarse (20)", choices=tuple(cifar100_tff.LABELS))
HOLDOUT = HParam("holdout", float, 0.0, "share of each training client's images held "
                 "out as its own test set (0: none; the test clients alone are tested)",
                 low=0, high=1, high_open=True)

DEFAULTS = dict(rounds=4000, clients_per_round=10, local_epochs=1, batch_size=20,
                client_lr=0.1, mu=0.0, num_clients=None)  # None: all 500

SOURCE = ("Reddi et al. 2021 (Adaptive Federated Optimization) CIFAR-100: "
          "google-research/federated optimization/docs/hyperparameters.md; TFF's "
          "cifar100.sqlite, create_resnet18 and CIFAR-100 baseline preprocessing")


class _Model:
  """A model builder whose output size follows the labels the task last loaded
  in this process (fine: 100, coarse: 20). An instance pickles with its class
  count, so the `ray` runner's actors build the same head."""

  def __init__(self, build):
    self.build = build
    self.num_classes = cifar100_tff.LABELS["fine"][1]

  def __call__(self):
    return self.build(self.num_classes)


def _resnet18(num_classes: int):
  return vision_models.resnet18_gn(num_classes)


def _cnn(num_classes: int):
  return models.simple_cnn(cifar100_tff.IMAGE_SHAPE, num_classes, name="cnn")


RESNET18 = _Model(_resnet18)
CNN = _Model(_cnn)


def find_source(data_dir: Optional[str]) -> str:
  """The database: `--data_dir` naming one (any file name) or a folder
  holding `cifar100_tff.SOURCE.name`; without it, fetched when no cache holds it."""
  return tff_sqlite.database_path(data_dir, cifar100_tff.SOURCE, cifar100_tff.fetch_database)


def load(options: DataOptions) -> FederatedData:
  labels = task_arg(options, LABELS)
  holdout = task_arg(options, HOLDOUT)
  data = cifar100_tff.load_database(find_source(options.data_dir), labels=labels,
                                    num_clients=options.num_clients, seed=options.seed,
                                    holdout=holdout)
  for builder in (RESNET18, CNN):
    builder.num_classes = data.num_classes
  return data


TASKS = [
    TaskSpec(
        name="cifar100_tff",
        description="TFF's federated CIFAR-100: 500 training clients, 100 test-only "
                    "clients (fetched on first use, or --data_dir: cifar100.sqlite); "
                    "ResNet-18 with group norm, --model=cnn for CPUs",
        load_data=load, task_args=(LABELS, HOLDOUT), model_fn=RESNET18,
        model_name="resnet18", other_models={"cnn": CNN}, loss=models.SPARSE_CE_LOGITS,
        defaults=DEFAULTS, source=SOURCE),
]
