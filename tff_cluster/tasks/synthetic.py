"""Synthetic(alpha, beta) and Synthetic-IID with the MCLR model (60 -> 10);
`--model=mlp` (60 -> 32 -> 10, ReLU) and `mlp_bn` (the same with BatchNorm) for
methods that need layers to split or batch statistics.

Defaults follow the FedGroup paper (Duan et al., Section 5.1: 100 clients, 20
clients per round, E = 20 local epochs, batch 10, lr 0.01) and FedProx's mu = 1
and T = 200 rounds for synthetic (the FedGroup paper does not state T; FlexCFL,
the authors' TF2 code, runs 10 local epochs and 300 rounds).

The generator follows FedProx's (Shamir et al.'s Synthetic(alpha, beta) as
FedProx builds it); our seeded draw is not the paper's data (its 100 clients
hold 75,349 samples, ours 35,621 at seed 0).
"""

from tff_cluster import models
from tff_cluster.data.synthetic import (NUM_CLASSES, NUM_FEATURES, generate_synthetic,
                                        synthetic_per_client)
from tff_cluster.spec.hparams import HParam
from tff_cluster.spec.task import DataOptions, TaskSpec, task_arg

NUM_CLUSTERS = HParam("num_clusters", int, 5, "true clusters", low=1)
SAMPLES_PER_CLIENT = HParam(
    "samples_per_client", int, 0,
    "samples of every client, each client drawn from its own seed (made where it "
    "trains: the ray runner's actors); 0: FedProx's lognormal sizes, one generator", low=0)

DEFAULTS = dict(rounds=200, clients_per_round=20, local_epochs=20, batch_size=10,
                client_lr=0.01, mu=1.0, num_clients=100)


def _mclr():
  return models.mclr(NUM_FEATURES, NUM_CLASSES)


def _mlp():
  return models.mlp(NUM_FEATURES, 32, NUM_CLASSES)


def _mlp_bn():
  return models.mlp_bn(NUM_FEATURES, 32, NUM_CLASSES)


OTHER_MODELS = {"mlp": _mlp, "mlp_bn": _mlp_bn}


def _load(options: DataOptions, iid: bool):
  samples = task_arg(options, SAMPLES_PER_CLIENT)
  if samples:
    return synthetic_per_client(
        options.num_clients or DEFAULTS["num_clients"], samples,
        alpha=options.synthetic_alpha, beta=options.synthetic_beta, iid=iid,
        seed=options.seed)
  return generate_synthetic(
      num_clients=options.num_clients or DEFAULTS["num_clients"],
      alpha=options.synthetic_alpha, beta=options.synthetic_beta, iid=iid,
      seed=options.seed)


def _load_clusters(options: DataOptions):
  """Clients of cluster c share (W_c, b_c) ~ N(u_c, 1) and input mean v_c ~ N(B_c, 1).

  u_c ~ N(0, alpha^2), B_c ~ N(0, beta^2) as in Synthetic(alpha, beta), drawn per
  cluster instead of per client; sizes and the 90/10 split as in `synthetic`.
  """
  import numpy as np
  num_clients = options.num_clients or DEFAULTS["num_clients"]
  m = task_arg(options, NUM_CLUSTERS)
  rng = np.random.default_rng([options.seed, 1])
  clusters = np.arange(num_clients) % m
  rng.shuffle(clusters)
  u = rng.normal(0.0, options.synthetic_alpha, m)
  b_mean = rng.normal(0.0, options.synthetic_beta, m)
  w = rng.normal(u[:, None, None], 1.0, (m, NUM_FEATURES, NUM_CLASSES))
  b = rng.normal(u[:, None], 1.0, (m, NUM_CLASSES))
  v = rng.normal(b_mean[:, None], 1.0, (m, NUM_FEATURES))
  samples = task_arg(options, SAMPLES_PER_CLIENT)
  if samples:
    return synthetic_per_client(num_clients, samples, alpha=options.synthetic_alpha,
                                beta=options.synthetic_beta, seed=options.seed,
                                true_clusters=clusters, cluster_models=(w, b, v))
  return generate_synthetic(num_clients=num_clients, alpha=options.synthetic_alpha,
                            beta=options.synthetic_beta, seed=options.seed,
                            true_clusters=clusters, cluster_models=(w, b, v))


TASKS = [
    TaskSpec(
        name="synthetic",
        description="Synthetic(alpha, beta) (default (1, 1)), FedProx recipe, MCLR 60->10",
        load_data=lambda options: _load(options, iid=False), task_args=(SAMPLES_PER_CLIENT,),
        model_fn=_mclr, model_name="mclr", other_models=OTHER_MODELS,
        loss=models.SPARSE_CE_LOGITS, defaults=DEFAULTS,
        source="FedGroup (Duan et al.) synthetic setting; FedProx generator"),
    TaskSpec(
        name="synthetic_iid",
        description="Synthetic-IID: one shared model and input distribution, MCLR 60->10",
        load_data=lambda options: _load(options, iid=True), task_args=(SAMPLES_PER_CLIENT,),
        model_fn=_mclr, model_name="mclr", other_models=OTHER_MODELS,
        loss=models.SPARSE_CE_LOGITS, defaults=DEFAULTS,
        source="FedProx synthetic IID generator"),
    TaskSpec(
        name="synthetic_clusters",
        description="Synthetic with 5 true clusters (clients of a cluster share model and inputs), MCLR",
        load_data=_load_clusters, task_args=(NUM_CLUSTERS, SAMPLES_PER_CLIENT),
        model_fn=_mclr, model_name="mclr", other_models=OTHER_MODELS,
        loss=models.SPARSE_CE_LOGITS, defaults=DEFAULTS,
        source="cluster-structured variant of the FedProx generator (ground truth for ARI)"),
]
