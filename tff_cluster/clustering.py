"""Clustering maths shared by the clustered algorithms, as plain numpy /
TensorFlow functions (FedGroup's measures first).

Duan et al., "FedGroup: Efficient Clustered Federated Learning via Decomposed
Data-Driven Measure" (arXiv:2010.06870). Nothing in here touches TFF: the
FedGroup algorithm module calls these on the server side (numpy) or inside its
TensorFlow computations (`inter_group_step`).

Notation follows the paper:

* ΔW, shape [n, d]: one flattened client update Δw_i per row.
* m: the number of groups (`num_groups`).
* V, shape [m, d]: the top-m right singular vectors of ΔW (the paper's truncated
  SVD of ΔWᵀ), i.e. the m dominant update directions in parameter space.
* EDC(i, j) = ‖cos(Δw_i, V) − cos(Δw_j, V)‖₂ — Euclidean distance of
  decomposed cosine similarity. The paper's Eq. (8) scales the cosines by
  1/m; a common scale does not change K-Means' clusters, so it is left out,
  as both authors' codes do.
* MADC(i, j) = 1/(n−2) Σ_{z≠i,j} |S(i,z) − S(j,z)| with S the pairwise cosine
  similarity — mean absolute difference of pairwise cosine similarity.

Equation numbers differ between the arXiv versions of the paper, so the
docstrings name each definition rather than an equation number.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf


def _sk_cluster():
  """scikit-learn's clustering, imported when first used (0.4 s of a run's
  start-up that most algorithms never need)."""
  from sklearn import cluster
  return cluster


MEASURES = ("edc", "madc")


# --------------------------------------------------------------------------- #
# Flattening and cosine similarity.
# --------------------------------------------------------------------------- #


def flatten_weights(weights: Sequence[np.ndarray]) -> np.ndarray:
  """Concatenates the ravelled arrays of one model into a float64 vector [d].

  This is the flattened Δw_i (or w_j) that every FedGroup measure works on.
  """
  arrays = [np.asarray(w, dtype=np.float64).ravel() for w in weights]
  if not arrays:
    raise ValueError("flatten_weights got no arrays; pass a non-empty list of "
                     "per-layer arrays")
  return np.concatenate(arrays)


class RowBlocks:
  """The matrix [n, d] whose row i is `flatten_weights(models[i])`, kept as
  the models' own arrays (no copy) and read in column blocks of at most
  BLOCK_COLUMNS within each layer, as float64 (FedGroup's measures past
  EXACT_BYTES; see `_products`)."""

  def __init__(self, models: Sequence[Sequence[np.ndarray]]):
    self.models = [[np.asarray(w) for w in m] for m in models]
    sizes = [[int(w.size) for w in m] for m in self.models]
    if any(s != sizes[0] for s in sizes):
      raise ValueError("the models' layers differ in size")
    self.sizes = sizes[0] if sizes else []
    self.shape = (len(self.models), sum(self.sizes))
    self.dtype = np.dtype(np.float32)

  def __len__(self) -> int:
    return self.shape[0]

  def blocks(self):
    """(first column, float64 [n, width] block) over the columns in order."""
    start = 0
    for layer, size in enumerate(self.sizes):
      rows = [m[layer].reshape(-1) for m in self.models]
      for j in range(0, size, BLOCK_COLUMNS):
        yield start + j, np.stack([r[j:j + BLOCK_COLUMNS] for r in rows]).astype(np.float64)
      start += size


def _column_blocks(x):
  """(first column, float64 block) of a float32 matrix or a `RowBlocks`."""
  if isinstance(x, RowBlocks):
    yield from x.blocks()
    return
  for j in range(0, x.shape[1], BLOCK_COLUMNS):
    yield j, x[:, j:j + BLOCK_COLUMNS].astype(np.float64)


def flatten_rows(models: Sequence[Sequence[np.ndarray]]):
  """`np.stack([flatten_weights(m) for m in models])` [n, d] float64, filled
  row by row (no list of n flattened vectors beside the matrix); where that
  would pass EXACT_BYTES, the models as `RowBlocks` (no copy), which the
  measures take blockwise."""
  models = list(models)
  if not models:
    raise ValueError("flatten_rows got no models")
  d = sum(int(np.size(w)) for w in models[0])
  if len(models) * d * 8 > EXACT_BYTES:
    return RowBlocks(models)
  out = np.empty((len(models), d), np.float64)
  for i, weights in enumerate(models):
    start = 0
    for w in weights:
      w = np.asarray(w)
      out[i, start:start + w.size] = w.ravel()
      start += w.size
    if start != d:
      raise ValueError(f"model {i} has {start} parameters, model 0 has {d}")
  return out


def row_norms(x: np.ndarray, rows: int = 8) -> np.ndarray:
  """`np.linalg.norm(x, axis=1, keepdims=True)`, the same numbers, a few rows
  at a time (no temporary the size of `x`)."""
  out = np.empty((len(x), 1), x.dtype)
  for i in range(0, len(x), rows):
    out[i:i + rows] = np.linalg.norm(x[i:i + rows], axis=1, keepdims=True)
  return out


# A float64 [n, d] matrix of client updates up to this size is what the
# measures work on (`flatten_rows`); above it (e.g. 100 pre-trained clients of
# a 1.2M-parameter CNN: 965 MB) the updates stay the clients' own arrays
# (`RowBlocks`, or a float32 matrix) and the measures accumulate their float64
# sums over column blocks (`_products`): the same quantities, rounded in
# another order.
EXACT_BYTES = 512 << 20
BLOCK_COLUMNS = 1 << 14


def _as_matrix(x: np.ndarray, name: str, blockwise: bool = False) -> np.ndarray:
  """`x` as a float64 2-D array; with `blockwise`, a float32 `x` or a
  `RowBlocks` as is (the blockwise form of FedGroup's measures, see
  EXACT_BYTES), checked one block at a time."""
  if blockwise and isinstance(x, RowBlocks):
    if not all(np.isfinite(b).all() for _, b in x.blocks()):
      raise ValueError(f"{name} contains NaN or inf; updates must be finite")
    return x
  x = np.asarray(x)
  if not (blockwise and x.dtype == np.float32):
    x = np.asarray(x, dtype=np.float64)
  if x.ndim != 2:
    raise ValueError(f"{name} must be a 2-D array [rows, d]; got shape "
                     f"{x.shape}")
  if not all(np.isfinite(x[i:i + 8]).all() for i in range(0, len(x), 8)):
    raise ValueError(f"{name} contains NaN or inf; updates must be finite")
  return x


def _products(x: np.ndarray, u: np.ndarray = None):
  """(x xᵀ, the row norms [n, 1], and with `u` [n, m] also uᵀx [m, d]) of a
  float32 `x` or a `RowBlocks`, in float64, summed over blocks of at most
  BLOCK_COLUMNS columns: no float64 copy of `x`."""
  n, d = x.shape
  gram = np.zeros((n, n))
  squares = np.zeros(n)
  dirs = None if u is None else np.empty((u.shape[1], d))
  for j, block in _column_blocks(x):
    gram += block @ block.T
    squares += np.einsum("ij,ij->i", block, block)
    if u is not None:
      dirs[:, j:j + block.shape[1]] = u.T @ block
  return gram, np.sqrt(squares)[:, None], dirs


def _unit_rows(x: np.ndarray) -> np.ndarray:
  """Rows scaled to unit norm; zero rows stay zero (so their cosines are 0)."""
  norms = row_norms(x)
  safe = np.where(norms > 0.0, norms, 1.0)
  return x / safe


def cosine_similarity_matrix(a: np.ndarray,
                             b: np.ndarray | None = None) -> np.ndarray:
  """Cosine similarity of every row of `a` with every row of `b` (default `a`).

  Returns [len(a), len(b)]. The paper's S(i, j) = cos(Δw_i, Δw_j). A zero row
  has no direction, so its similarity with anything (itself included) is 0
  rather than NaN. Values are clipped to [-1, 1] against round-off.
  """
  a = _as_matrix(a, "a")
  b = a if b is None else _as_matrix(b, "b")
  if a.shape[1] != b.shape[1]:
    raise ValueError(f"a and b must have the same number of columns; got "
                     f"{a.shape[1]} and {b.shape[1]}")
  return np.clip(_unit_rows(a) @ _unit_rows(b).T, -1.0, 1.0)


# --------------------------------------------------------------------------- #
# EDC: Euclidean distance of decomposed cosine similarity.
# --------------------------------------------------------------------------- #


def _check_num_groups(num_groups: int, upper: int, what: str) -> int:
  if isinstance(num_groups, bool) or not isinstance(num_groups,
                                                    (int, np.integer)):
    raise ValueError(f"num_groups must be an int; got {num_groups!r}")
  if not 1 <= num_groups <= upper:
    raise ValueError(f"num_groups must be in [1, {upper}] ({what}); got "
                     f"{num_groups}")
  return int(num_groups)


def edc_features(updates: np.ndarray, num_groups: int) -> np.ndarray:
  """Decomposed cosine similarity: cos(Δw_i, v_k) for the top-m directions.

  Implements the decomposition step of the paper's EDC measure: V holds the m
  leading right singular vectors of ΔW [n, d] (= the left singular vectors of
  the paper's truncated SVD of ΔWᵀ), and the result is the [n, m] matrix of
  cosines between each client update and each direction. Euclidean distance
  between its rows is EDC(i, j).

  Sign convention: a singular vector is only defined up to sign, so each
  direction is flipped so that its largest-magnitude component is positive
  (the first such component on a tie). That makes the features deterministic;
  the EDC distances do not depend on it, since flipping v_k negates column k
  for every client alike.

  Computation: the exact (deterministic, non-randomised) SVD through the n x n
  Gram matrix G = ΔW ΔWᵀ = U S² Uᵀ. Then ΔW V_mᵀ = U_m S_m, so
  cos(Δw_i, v_k) = U[i, k] s_k / ‖Δw_i‖ without ever forming V in full. Why not
  np.linalg.svd(ΔW): for n=200, d=500k it takes ~140 s on 2 cores and 800 MB
  for Vᵀ, against ~2 s for the Gram product. The Gram route squares the
  condition number, which only matters when s_m/s_1 < ~1e-6 (client update
  norms differing by ~10⁶); a direction with s_k = 0 (rank(ΔW) < m) gets
  cosine 0 with every update, as any null-space direction would.

  A float32 `updates` (FedGroup's past EXACT_BYTES) is taken blockwise: the
  Gram matrix, the directions' products and the norms summed in float64 over
  column blocks, never a float64 copy of the whole.

  Requires 1 <= m <= min(n, d).
  """
  updates = _as_matrix(updates, "updates", blockwise=True)
  n, d = updates.shape
  m = _check_num_groups(num_groups, min(n, d), "at most min(n, d) directions")
  blockwise = isinstance(updates, RowBlocks) or updates.dtype == np.float32  # EXACT_BYTES
  gram = _products(updates)[0] if blockwise else updates @ updates.T
  eigvals, eigvecs = np.linalg.eigh(gram)  # ascending eigenvalues
  top = np.arange(n - 1, n - 1 - m, -1)
  s = np.sqrt(np.clip(eigvals[top], 0.0, None))  # singular values s_1..s_m
  u = eigvecs[:, top]
  # Directions up to positive scale: s_k v_k = ΔWᵀ u_k. Only their signs are
  # needed, and the scale s_k > 0 changes neither argmax|.| nor sign.
  if blockwise:
    _, norms, scaled_dirs = _products(updates, u)
  else:
    scaled_dirs = u.T @ updates  # [m, d]
    norms = None
  pivot = np.argmax(np.abs(scaled_dirs), axis=1)
  signs = np.sign(scaled_dirs[np.arange(m), pivot])
  signs = np.where(signs == 0.0, 1.0, signs)
  projections = u * (s * signs)[None, :]  # ΔW V_mᵀ = U_m S_m, sign-fixed
  norms = row_norms(updates) if norms is None else norms
  # A zero update has no direction: cosine 0 with everything.
  features = projections / np.where(norms > 0.0, norms, 1.0)
  return np.clip(features, -1.0, 1.0)


def edc_cluster(updates: np.ndarray, num_groups: int, seed: int) -> np.ndarray:
  """Clusters client updates with K-Means++ on the EDC features.

  K-Means in the [n, m] decomposed-cosine space minimises squared EDC, the
  paper's clustering step; seeded with n_init=10 restarts for stability.
  Returns int labels in 0..m-1.
  """
  features = edc_features(updates, num_groups)
  kmeans = _sk_cluster().KMeans(n_clusters=int(num_groups), init="k-means++",
                             n_init=10, random_state=seed)
  return kmeans.fit_predict(features).astype(np.int64)


# --------------------------------------------------------------------------- #
# MADC: mean absolute difference of pairwise cosine similarity.
# --------------------------------------------------------------------------- #


def madc_matrix(updates: np.ndarray) -> np.ndarray:
  """MADC(i, j) = 1/(n−2) Σ_{z≠i,j} |S(i,z) − S(j,z)|, the paper's MADC measure.

  S is `cosine_similarity_matrix(updates)`. Returns a symmetric [n, n] matrix
  with a zero diagonal. Requires n >= 3 (there must be a third client z).
  A float32 `updates` is taken blockwise (see `edc_features`).
  """
  updates = _as_matrix(updates, "updates", blockwise=True)
  n = updates.shape[0]
  if n < 3:
    raise ValueError(f"madc_matrix needs at least 3 updates (rows); got {n}")
  if isinstance(updates, RowBlocks) or updates.dtype == np.float32:  # EXACT_BYTES
    gram, norms, _ = _products(updates)
    safe = np.where(norms > 0.0, norms, 1.0)
    s = np.clip(gram / safe / safe.T * (norms > 0.0) * (norms > 0.0).T, -1.0, 1.0)
  else:
    s = cosine_similarity_matrix(updates)
  out = np.zeros((n, n), dtype=np.float64)
  idx = np.arange(n)
  # One row of the result at a time: an [n, n] slab instead of an [n, n, n]
  # tensor, so a few hundred clients stay cheap in memory.
  for i in range(n):
    diff = np.abs(s[i][None, :] - s)  # diff[j, z] = |S(i,z) − S(j,z)|
    diff[:, i] = 0.0  # drop z == i
    diff[idx, idx] = 0.0  # drop z == j
    out[i] = diff.sum(axis=1) / (n - 2)
  out[idx, idx] = 0.0
  # Each entry is computed from both ends; averaging removes round-off skew.
  return 0.5 * (out + out.T)


def madc_cluster(updates: np.ndarray, num_groups: int) -> np.ndarray:
  """Complete-linkage agglomerative clustering on the precomputed MADC matrix.

  Returns int labels in 0..m-1. Deterministic (no seed needed).
  """
  updates = _as_matrix(updates, "updates", blockwise=True)
  n = updates.shape[0]
  m = _check_num_groups(num_groups, n, "at most one group per update")
  distances = madc_matrix(updates)
  agg = _sk_cluster().AgglomerativeClustering(n_clusters=m, metric="precomputed",
                                           linkage="complete")
  return agg.fit_predict(distances).astype(np.int64)


def cluster_updates(updates: np.ndarray, num_groups: int, measure: str,
                    seed: int) -> np.ndarray:
  """Groups client updates with the chosen FedGroup measure ('edc' or 'madc')."""
  if measure == "edc":
    return edc_cluster(updates, num_groups, seed)
  if measure == "madc":
    return madc_cluster(updates, num_groups)
  raise ValueError(f"unknown measure {measure!r}; valid: {', '.join(MEASURES)}")


# --------------------------------------------------------------------------- #
# Newcomer cold start.
# --------------------------------------------------------------------------- #


# --------------------------------------------------------------------------- #
# Inter-group aggregation.
# --------------------------------------------------------------------------- #


def inter_group_step(stacked_weights: Sequence[tf.Tensor],
                     eta: float) -> list[tf.Tensor]:
  """FedGroup inter-group aggregation, in TensorFlow (graph-mode safe).

  w_j ← w_j + η Σ_{l≠j} (w_l − w_j) / ‖w_l − w_j‖, the paper's inter-group
  aggregation rule, for all m groups at once from the old weights.

  `stacked_weights` is a list of per-layer tensors, each [m, ...] (group j's
  model is slice j of every layer). ‖·‖ is the Euclidean norm of the whole
  flattened model, i.e. over all layers jointly. A pair at distance 0 has no
  direction and contributes nothing (no NaN). η = 0 returns the weights
  unchanged. Uses only TF ops, so it runs inside tf.function / TFF
  tensorflow computations.
  """
  if not stacked_weights:
    raise ValueError("inter_group_step got no tensors; pass a non-empty list "
                     "of per-layer tensors [m, ...]")
  layers = [tf.convert_to_tensor(w) for w in stacked_weights]
  for w in layers:
    if w.shape.rank == 0:
      raise ValueError("inter_group_step needs tensors with a leading group "
                       "dimension m; got a scalar")
    if not w.dtype.is_floating:
      raise ValueError(f"inter_group_step needs floating-point weights; got "
                       f"{w.dtype.name}")
  static_m = {w.shape[0] for w in layers if w.shape[0] is not None}
  if len(static_m) > 1:
    raise ValueError(f"inter_group_step: leading dimensions differ "
                     f"{sorted(static_m)}; all layers must stack the same m "
                     "groups")

  def pairwise_diff(w):
    # diff[j, l, :] = w_l − w_j for one layer flattened to [m, k].
    flat = tf.reshape(w, [tf.shape(w)[0], -1])
    return flat[tf.newaxis, :, :] - flat[:, tf.newaxis, :]

  # Squared distances summed over layers in float64 so the joint norm of a
  # large model does not lose precision; [m, m] is tiny.
  sq_dist = tf.add_n([
      tf.cast(tf.reduce_sum(tf.square(pairwise_diff(w)), axis=-1), tf.float64)
      for w in layers
  ])
  dist = tf.sqrt(sq_dist)
  # 1/‖w_l − w_j‖, with 0 for identical pairs (incl. the diagonal l == j).
  inv = tf.math.divide_no_nan(tf.ones_like(dist), dist)

  out = []
  for w in layers:
    coeff = tf.cast(inv, w.dtype)
    # Σ_l inv[j, l] (w_l − w_j), from the old weights of every group.
    step = tf.reduce_sum(coeff[:, :, tf.newaxis] * pairwise_diff(w), axis=1)
    step = tf.reshape(step, tf.shape(w))
    # A Python float goes straight to the layer dtype: tf.cast(0.3, float64)
    # would round it through float32 first.
    eta_w = (tf.cast(eta, w.dtype) if tf.is_tensor(eta)
             else tf.constant(eta, dtype=w.dtype))
    out.append(w + eta_w * step)
  return out


# --------------------------------------------------------------------------- #
# Clustering quality.
# --------------------------------------------------------------------------- #


def _check_labels(true, pred) -> tuple[np.ndarray, np.ndarray]:
  true = np.asarray(true).ravel()
  pred = np.asarray(pred).ravel()
  if true.shape != pred.shape:
    raise ValueError(f"true and pred must have the same length; got "
                     f"{true.size} and {pred.size}")
  if true.size == 0:
    raise ValueError("true and pred are empty; need at least one label")
  return true, pred


def adjusted_rand_index(true, pred) -> float:
  """Adjusted Rand index of two labelings (1 = identical up to renaming)."""
  true, pred = _check_labels(true, pred)
  from sklearn import metrics
  return float(metrics.adjusted_rand_score(true, pred))


def purity(true, pred) -> float:
  """Purity = (1/n) Σ_clusters max_class |cluster ∩ class|."""
  true, pred = _check_labels(true, pred)
  _, true_idx = np.unique(true, return_inverse=True)
  _, pred_idx = np.unique(pred, return_inverse=True)
  counts = np.zeros((pred_idx.max() + 1, true_idx.max() + 1), dtype=np.int64)
  np.add.at(counts, (pred_idx, true_idx), 1)
  return float(counts.max(axis=1).sum() / true.size)


# --------------------------------------------------------------------------- #
# Weighted K-Means (WeCFL / FeSEM).
# --------------------------------------------------------------------------- #


def weighted_kmeans(features: np.ndarray, num_clusters: int,
                    weights: np.ndarray | None = None, seed: int = 0,
                    n_init: int = 10, max_iter: int = 300
                    ) -> tuple[np.ndarray, np.ndarray]:
  """K-Means on client features with client weights λ_i (WeCFL's lower level).

  Minimises Σ_i λ_i ‖g_i − G_{k(i)}‖²: k-means++ initialisation, `n_init`
  seeded restarts, centres G_k = Σ_{i∈k} λ_i g_i / Σ_{i∈k} λ_i. `weights=None`
  is uniform (FeSEM's clustering). Returns (labels [n], centres [K, d]).
  """
  features = _as_matrix(features, "features")
  num_clusters = _check_num_groups(num_clusters, features.shape[0], "clients")
  if weights is not None:
    weights = np.asarray(weights, np.float64)
    if weights.shape != (features.shape[0],) or not np.all(np.isfinite(weights)) \
        or np.any(weights <= 0):
      raise ValueError(f"weights must be {features.shape[0]} positive finite numbers")
  km = _sk_cluster().KMeans(n_clusters=num_clusters, init="k-means++", n_init=n_init,
                         max_iter=max_iter, random_state=seed)
  km.fit(features, sample_weight=weights)
  return km.labels_.astype(np.int64), km.cluster_centers_


def nearest_centre(features: np.ndarray, centres: np.ndarray) -> np.ndarray:
  """One E-step: k(i) = argmin_k ‖g_i − G_k‖² (λ_i > 0 does not change the
  argmin); ties go to the lowest k."""
  features = _as_matrix(features, "features")
  centres = _as_matrix(centres, "centres")
  if features.shape[1] != centres.shape[1]:
    raise ValueError(f"features and centres differ in length: {features.shape[1]} "
                     f"and {centres.shape[1]}")
  sq = (np.sum(features ** 2, 1)[:, None] - 2 * features @ centres.T
        + np.sum(centres ** 2, 1)[None, :])
  return np.argmin(sq, axis=1).astype(np.int64)


def weighted_centres(features: np.ndarray, labels: np.ndarray, num_clusters: int,
                     weights: np.ndarray | None = None,
                     previous: np.ndarray | None = None) -> np.ndarray:
  """G_k = Σ_{i∈k} λ_i g_i / Σ_{i∈k} λ_i (eq. 12 of WeCFL); an empty cluster
  keeps its `previous` centre (zeros if none): never a division by zero."""
  features = _as_matrix(features, "features")
  labels = np.asarray(labels, np.int64)
  w = np.ones(len(labels)) if weights is None else np.asarray(weights, np.float64)
  out = (np.zeros((num_clusters, features.shape[1])) if previous is None
         else np.array(previous, np.float64, copy=True))
  for k in range(num_clusters):
    members = labels == k
    if members.any():
      out[k] = (w[members, None] * features[members]).sum(0) / w[members].sum()
  return out


# --------------------------------------------------------------------------- #
# CFL (Sattler et al.): bipartition of a cluster by its members' updates.
# --------------------------------------------------------------------------- #


def cfl_should_split(updates: np.ndarray, eps1: float, eps2: float,
                     weights: np.ndarray | None = None, min_size: int = 3) -> bool:
  """The split criterion of one cluster from its members' flattened updates:
  ‖mean update‖ < eps1 (stationary on the cluster's joint objective) and
  max_i ‖Δw_i‖ > eps2 (some member is not), with at least `min_size` members.
  The mean is unweighted (the reference code) or weighted by `weights` (the
  paper's data-weighted mean)."""
  updates = _as_matrix(updates, "updates")
  if len(updates) < min_size:
    return False
  w = np.ones(len(updates)) if weights is None else np.asarray(weights, np.float64)
  mean_norm = np.linalg.norm((w[:, None] * updates).sum(0) / w.sum())
  max_norm = np.max(np.linalg.norm(updates, axis=1))
  return bool(mean_norm < eps1 and max_norm > eps2)


def cfl_bipartition(updates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Splits one cluster in two by complete linkage on its members' pairwise
  cosine similarities S (distance 1 − S: the same tree as −S, as complete
  linkage only compares distances). Returns two arrays of *row positions*
  into `updates`; `cfl_step` maps them back to global client indices."""
  updates = _as_matrix(updates, "updates")
  if len(updates) < 2:
    raise ValueError("a cluster needs at least 2 members to split")
  distance = np.clip(1.0 - cosine_similarity_matrix(updates, updates), 0.0, 2.0)
  np.fill_diagonal(distance, 0.0)
  labels = _sk_cluster().AgglomerativeClustering(
      n_clusters=2, metric="precomputed", linkage="complete").fit_predict(distance)
  return np.flatnonzero(labels == 0), np.flatnonzero(labels == 1)


def cfl_step(clusters: Sequence[Sequence[int]], updates: np.ndarray, eps1: float,
             eps2: float, weights: np.ndarray | None = None,
             min_size: int = 3) -> list[list[int]]:
  """One round of CFL's cluster tree: every cluster that meets the split
  criterion is split in two, at most once per round.

  `clusters` hold *global* client indices into the rows of `updates` (and of
  `weights`); the result does too (a split stores c[c1] and c[c2], never the
  positions inside the sub-matrix).
  """
  updates = _as_matrix(updates, "updates")
  out = []
  for cluster in clusters:
    members = np.asarray(cluster, np.int64)
    w = None if weights is None else np.asarray(weights, np.float64)[members]
    if cfl_should_split(updates[members], eps1, eps2, w, min_size):
      first, second = cfl_bipartition(updates[members])
      out += [members[first].tolist(), members[second].tolist()]
    else:
      out.append(members.tolist())
  return out


# --------------------------------------------------------------------------- #
# Agglomerative clustering with a distance threshold (FL+HC, PACFL).


def _first_seen_labels(labels) -> np.ndarray:
  """Labels renamed 0, 1, ... in the order they first appear."""
  order = {}
  return np.array([order.setdefault(int(v), len(order)) for v in labels], np.int64)


def agglomerative(features: np.ndarray, metric: str, linkage: str,
                  threshold, max_clusters: int):
  """Agglomerative clustering of `features` [n, d] (SciPy's hierarchy):
  `metric` euclidean, manhattan or cosine; `linkage` ward (euclidean only),
  average, complete or single. The tree is cut at distance `threshold`
  (merges at distances <= it), or into `max_clusters` clusters when
  `threshold` is None or leaves more than `max_clusters`.

  Returns (labels [n], numbered by first appearance; the number of clusters
  the threshold gave, None without one)."""
  from scipy.cluster import hierarchy
  x = _as_matrix(features, "features").astype(np.float64)
  if linkage == "ward" and metric != "euclidean":
    raise ValueError(f"invalid metric {metric!r} for ward linkage; valid: euclidean")
  if len(x) == 1:
    return np.zeros(1, np.int64), (1 if threshold is not None else None)
  scipy_metric = {"euclidean": "euclidean", "manhattan": "cityblock",
                  "cosine": "cosine"}[metric]
  tree = hierarchy.linkage(x, method=linkage, metric=scipy_metric)
  found = None
  if threshold is not None:
    labels = hierarchy.fcluster(tree, t=float(threshold), criterion="distance")
    found = int(len(np.unique(labels)))
  if threshold is None or found > max_clusters:
    labels = hierarchy.fcluster(tree, t=int(max_clusters), criterion="maxclust")
  return _first_seen_labels(labels), found


def merge_below(distances: np.ndarray, beta: float, linkage: str, max_clusters: int):
  """PACFL's agglomerative loop on a symmetric distance matrix (the authors'
  `hierarchical_clustering`, MMorafah/PACFL at 7ef000d): repeatedly take the
  smallest off-diagonal entry (the first in row-major order on ties); stop
  when it is > `beta`; else merge its two clusters, the merged row and
  column being the element-wise mean (`average`: of the two rows, not
  weighted by size), max (`maximum`) or min (`minimum`) of theirs. Merging
  goes on past `beta` while more than `max_clusters` clusters remain.

  Returns (labels, numbered by first appearance; the number of clusters
  `beta` alone gave)."""
  a = np.array(distances, np.float64)
  n = len(a)
  # One matrix, merged clusters masked by inf in place (the code deletes the
  # merged row and column; the remaining ones keep their order, so the
  # row-major tie rule picks the same pair).
  np.fill_diagonal(a, np.inf)
  members = {i: [i] for i in range(n)}
  combine = {"average": lambda u, v: (u + v) / 2, "maximum": np.maximum,
             "minimum": np.minimum}[linkage]
  found = None
  while len(members) > 1:
    i, j = sorted(divmod(int(np.argmin(a)), n))
    if a[i, j] > beta:
      if found is None:
        found = len(members)
      if len(members) <= max_clusters:
        break
    merged = combine(a[:, i], a[:, j])
    a[:, i] = merged
    a[i, :] = merged
    a[:, j] = a[j, :] = a[i, i] = np.inf
    members[i] += members.pop(j)
  if found is None:
    found = len(members)
  labels = np.empty(n, np.int64)
  for c, group in enumerate(members.values()):
    labels[group] = c
  return _first_seen_labels(labels), found
