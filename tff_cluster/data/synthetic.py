"""Synthetic(alpha, beta) federated data, the FedProx/LEAF recipe.

Shamir et al.'s setting as Li et al., "Federated Optimization in
Heterogeneous Networks" (FedProx), Section 5.1, builds it: for client k,
  u_k ~ N(0, alpha^2), B_k ~ N(0, beta^2)       (alpha, beta: standard deviations)
  W_k ~ N(u_k, 1) in R^{60x10},  b_k ~ N(u_k, 1) in R^10
  v_k ~ N(B_k, 1) in R^60,  x ~ N(v_k, Sigma), Sigma = diag(j^-1.2), j = 1..60
  y = argmax(x W_k + b_k)
Client sizes are floor(lognormal(4, 2)) + 50. Each client's samples are shuffled
and split 90/10 into train/test. The IID variant shares one W, b (~N(0, 1)) and
one input distribution x ~ N(0, Sigma) across clients.
"""

from __future__ import annotations

import functools
from typing import Optional

import numpy as np

from tff_cluster import seeds
from tff_cluster.data.federated import (DataError, FederatedData, LazyFederatedData,
                                        split_counts, split_train_test)

NUM_FEATURES = 60
NUM_CLASSES = 10


def _client_sizes(rng: np.random.Generator, num_clients: int) -> np.ndarray:
  return rng.lognormal(4, 2, num_clients).astype(np.int64) + 50


def _draw_client_model(rng: np.random.Generator, alpha: float, beta: float):
  """(W_k, b_k, v_k) of one client: u_k ~ N(0, alpha^2), B_k ~ N(0, beta^2),
  W_k ~ N(u_k, 1), b_k ~ N(u_k, 1), v_k ~ N(B_k, 1)."""
  u_k = rng.normal(0.0, alpha)
  b_mean = rng.normal(0.0, beta)
  w = rng.normal(u_k, 1.0, (NUM_FEATURES, NUM_CLASSES))
  b = rng.normal(u_k, 1.0, NUM_CLASSES)
  v = rng.normal(b_mean, 1.0, NUM_FEATURES)
  return w, b, v


def _draw_samples(rng: np.random.Generator, n: int, w, b, v):
  """n samples x ~ N(v, Sigma), Sigma = diag(j^-1.2), y = argmax(x W + b)."""
  sigma_diag = np.arange(1, NUM_FEATURES + 1, dtype=np.float64) ** -1.2
  x = v + rng.normal(size=(n, NUM_FEATURES)) * np.sqrt(sigma_diag)
  y = np.argmax(x @ w + b, axis=1)
  return x.astype(np.float32), y.astype(np.int32)


def generate_synthetic(num_clients: int = 100, alpha: float = 1.0,
                       beta: float = 1.0, iid: bool = False, seed: int = 0,
                       true_clusters: Optional[np.ndarray] = None,
                       cluster_models: Optional[tuple] = None,
                       ) -> FederatedData:
  """Generates Synthetic(alpha, beta) (or Synthetic-IID) federated data.

  Args:
    num_clients: number of clients.
    alpha: std of u_k (how much the clients' models differ).
    beta: std of B_k (how much the clients' inputs differ).
    iid: one shared model and input distribution for every client.
    seed: seed of everything drawn here.
    true_clusters: optional cluster id per client; clients of one cluster then
      share the (W, b) given in `cluster_models` (a cluster-structured variant).
    cluster_models: (W [m, 60, 10], b [m, 10], v [m, 60]) used with
      `true_clusters`: the model and input mean of each cluster.
  """
  if num_clients < 1:
    raise DataError(f"--num_clients must be >= 1, got {num_clients}")
  if alpha < 0 or beta < 0:
    raise DataError(
        f"synthetic alpha and beta must be >= 0, got alpha={alpha}, beta={beta}")
  rng = np.random.default_rng(seed)
  sizes = _client_sizes(rng, num_clients)
  if iid:
    w_shared = rng.normal(0.0, 1.0, (NUM_FEATURES, NUM_CLASSES))
    b_shared = rng.normal(0.0, 1.0, NUM_CLASSES)
  client_ids, train, test = [], {}, {}
  for k in range(num_clients):
    if iid:
      w, b, v = w_shared, b_shared, np.zeros(NUM_FEATURES)
    else:
      w, b, v = _draw_client_model(rng, alpha, beta)
      if true_clusters is not None:
        w, b, v = (part[true_clusters[k]] for part in cluster_models)
    cid = f"f_{k:05d}"
    client_ids.append(cid)
    train[cid], test[cid] = split_train_test(*_draw_samples(rng, sizes[k], w, b, v), rng)
  kind = "IID" if iid else f"({alpha:g}, {beta:g})"
  return FederatedData(
      client_ids, train, test, NUM_CLASSES,
      true_clusters=true_clusters,
      description=f"Synthetic{kind}, FedProx recipe, {num_clients} clients, seed {seed}")


def _client_arrays(k: int, samples: int, alpha: float, beta: float, iid: bool, seed: int,
                   cluster: Optional[int], cluster_models: Optional[tuple]):
  """Client k's (train, test) arrays of `samples_per_client` data: drawn
  from the client's own generator (seeded by (seed, k)), the same recipe as
  `generate_synthetic`."""
  rng = seeds.generator(seed, "synthetic_clusters", k)
  if iid:
    shared = seeds.generator(seed, "synthetic_shared")
    w = shared.normal(0.0, 1.0, (NUM_FEATURES, NUM_CLASSES))
    b = shared.normal(0.0, 1.0, NUM_CLASSES)
    v = np.zeros(NUM_FEATURES)
  elif cluster is not None:
    w, b, v = (part[cluster] for part in cluster_models)
  else:
    w, b, v = _draw_client_model(rng, alpha, beta)
  return split_train_test(*_draw_samples(rng, samples, w, b, v), rng)


def _client_id(k: int) -> str:
  return f"f_{k:05d}"


def _load_clients(lo: int, hi: int, *, samples: int, alpha: float, beta: float, iid: bool,
                  seed: int, true_clusters: Optional[np.ndarray],
                  cluster_models: Optional[tuple]) -> FederatedData:
  ids, train, test = [], {}, {}
  for k in range(lo, hi):
    cid = _client_id(k)
    ids.append(cid)
    train[cid], test[cid] = _client_arrays(
        k, samples, alpha, beta, iid, seed,
        None if true_clusters is None else int(true_clusters[k]), cluster_models)
  return FederatedData(ids, train, test, NUM_CLASSES,
                       true_clusters=None if true_clusters is None else true_clusters[lo:hi])


def synthetic_per_client(num_clients: int, samples_per_client: int, alpha: float = 1.0,
                         beta: float = 1.0, iid: bool = False, seed: int = 0,
                         true_clusters: Optional[np.ndarray] = None,
                         cluster_models: Optional[tuple] = None) -> LazyFederatedData:
  """Synthetic(alpha, beta) (or -IID, or the cluster variant) with every
  client holding `samples_per_client` samples, each client drawn from its own
  generator seeded by (seed, k): a client's data do not depend on the other
  clients, so they can be made anywhere, shard by shard (the `ray` runner's
  actors make their own). Not the same draw as `generate_synthetic`, whose
  clients share one generator."""
  if num_clients < 1:
    raise DataError(f"--num_clients must be >= 1, got {num_clients}")
  if samples_per_client < 2:
    raise DataError(f"invalid --task_arg=samples_per_client={samples_per_client}; valid: "
                    ">= 2 (a training and a test sample), or 0 for the FedProx sizes")
  if alpha < 0 or beta < 0:
    raise DataError(
        f"synthetic alpha and beta must be >= 0, got alpha={alpha}, beta={beta}")
  n_train, n_test = split_counts(samples_per_client)
  kind = "IID" if iid else f"({alpha:g}, {beta:g})"
  loader = functools.partial(_load_clients, samples=samples_per_client, alpha=alpha,
                             beta=beta, iid=iid, seed=seed, true_clusters=true_clusters,
                             cluster_models=cluster_models)
  return LazyFederatedData(
      [_client_id(k) for k in range(num_clients)],
      np.full(num_clients, n_train), np.full(num_clients, n_test), NUM_CLASSES, loader,
      true_clusters=true_clusters,
      description=(f"Synthetic{kind}, FedProx recipe, {num_clients} clients x "
                   f"{samples_per_client} samples (per-client seeds), seed {seed}"))
