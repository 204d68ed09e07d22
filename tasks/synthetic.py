"""Synthetic(alpha, beta) and Synthetic-IID with the MCLR model (60 -> 10).

Defaults follow FedGroup's synthetic experiments (100 clients, 20 clients per
round, 10 local epochs, batch 10, lr 0.01) and FedProx's mu = 1 for synthetic.
"""

from tff_cluster import models
from tff_cluster.data.synthetic import NUM_CLASSES, NUM_FEATURES, generate_synthetic
from tff_cluster.task import DataOptions, TaskSpec

DEFAULTS = dict(rounds=200, clients_per_round=20, local_epochs=10, batch_size=10,
                client_lr=0.01, mu=1.0, num_clients=100)


def _mclr():
  return models.mclr(NUM_FEATURES, NUM_CLASSES)


def _load(options: DataOptions, iid: bool):
  return generate_synthetic(
      num_clients=options.num_clients or DEFAULTS["num_clients"],
      alpha=options.synthetic_alpha, beta=options.synthetic_beta, iid=iid,
      seed=options.seed)


TASKS = [
    TaskSpec(
        name="synthetic",
        description="Synthetic(alpha, beta) (default (1, 1)), FedProx recipe, MCLR 60->10",
        load_data=lambda options: _load(options, iid=False),
        model_fn=_mclr, loss=models.SPARSE_CE_LOGITS, defaults=DEFAULTS,
        source="FedGroup (Duan et al.) synthetic setting; FedProx generator"),
    TaskSpec(
        name="synthetic_iid",
        description="Synthetic-IID: one shared model and input distribution, MCLR 60->10",
        load_data=lambda options: _load(options, iid=True),
        model_fn=_mclr, loss=models.SPARSE_CE_LOGITS, defaults=DEFAULTS,
        source="FedProx synthetic IID generator"),
]
