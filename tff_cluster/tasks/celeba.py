"""TFF's federated CelebA (LEAF's: one client per celebrity, "smiling"), LEAF's CNN.

Data (`tff_cluster.data.celeba`): TFF's `celeba.sqlite`, fetched on first use
into `$TFF_CLUSTER_DATA` (`tff_cluster.data.download.CELEBA`) and read without
TFF; `--data_dir` naming such a database (any file name) or a folder holding
`celeba.sqlite` reads that file. One client per celebrity (9,343), label
"smiling" (two classes). `--task_arg=split=examples` (the default): TFF's
split_by_examples, every celebrity trains on about 90 % of its images and is
tested on the rest (LEAF's `-t sample`, which LEAF's models use);
`split=clients`: TFF's split_by_clients, 8,408 training celebrities without
test data and 935 test-only ones. `--num_clients=N` keeps a seeded subset of N
celebrities (of the training ones with split=clients). The images, 4.24 GB as
uint8, are read from the file when the runner needs them (a catalogue,
`LazyFederatedData`).

Model: LEAF's CelebA CNN (TalwalkarLab/leaf models/celeba/cnn.py;
`tff_cluster.vision_models.celeba_cnn`, 31,458 parameters).

Defaults: LEAF's reference code for CelebA (TalwalkarLab/leaf
models/baseline_constants.py at 15681b5e375fec0fbf80724268027e4be5883d96:
learning rate 0.1, and for its default `-t large` 400 rounds, evaluation every
20 rounds, 2 clients per round; models/utils/args.py at
1b7f8f28d634075df6e7bf2cab02d7a77fceb9e7: batch 10, one local epoch).
"""

from __future__ import annotations

from typing import Optional

from tff_cluster import models, vision_models
from tff_cluster.data import celeba, tff_sqlite
from tff_cluster.data.federated import LazyFederatedData
from tff_cluster.spec.hparams import HParam
from tff_cluster.spec.task import DataOptions, TaskSpec, task_arg

SPLIT = HParam("split", str, "examples", "TFF's split group: examples (every celebrity "
               "trains and tests, LEAF's) or clients (training celebrities and "
               "test-only ones)", choices=tuple(celeba.SPLITS))

DEFAULTS = dict(rounds=400, clients_per_round=2, local_epochs=1, batch_size=10,
                client_lr=0.1, mu=0.0, num_clients=None, eval_every=20)

SOURCE = ("LEAF (Caldas et al. 2018) CelebA: models/celeba/cnn.py, "
          "models/baseline_constants.py and models/utils/args.py; TFF's celeba.sqlite")


def find_source(data_dir: Optional[str]) -> str:
  """The database: `--data_dir` naming one (any file name) or a folder
  holding `celeba.SOURCE.name`; without it, fetched when no cache holds it."""
  return tff_sqlite.database_path(data_dir, celeba.SOURCE, celeba.fetch_database)


def load(options: DataOptions) -> LazyFederatedData:
  split = task_arg(options, SPLIT)
  return celeba.load_catalogue(find_source(options.data_dir), split=split,
                               num_clients=options.num_clients, seed=options.seed)


def _cnn():
  return vision_models.celeba_cnn(celeba.NUM_CLASSES)


TASKS = [
    TaskSpec(
        name="celeba",
        description="TFF's federated CelebA (LEAF's): one client per celebrity, "
                    "'smiling', LEAF's CNN (fetched on first use, or --data_dir: "
                    "celeba.sqlite)",
        load_data=load, task_args=(SPLIT,), model_fn=_cnn, model_name="cnn",
        loss=models.SPARSE_CE_LOGITS, defaults=DEFAULTS, source=SOURCE),
]
