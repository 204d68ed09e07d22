"""Partitioners: split one pooled labelled dataset among simulated clients.

Every partitioner takes the pooled labels (or just the number of samples when
labels do not matter), a `seed` for `np.random.default_rng`, and returns a
`Partition`: one array of indices into the pooled data per client, the
ground-truth cluster of each client when the setting defines one, and what
the clusters mean (`cluster_info`). The same seed always gives the same
partition. No sample is given to two clients; each docstring says whether
every sample is used.

`build_federated_data` turns a `Partition` into a `FederatedData` (per-client
90/10 train/test split), optionally transforming each client's samples, e.g.
rotating the images of a rotation cluster or permuting its labels.

Settings implemented:
  * FedProx (Li et al., MLSys 2020) MNIST: its generator's recipe (1,000
    devices, digits (u, u+1) mod 10, 5 images per digit, lognormal shares).
  * Pathological n-class non-IID (McMahan et al., FedAvg): label shards.
  * Dirichlet label skew (Hsu et al. 2019) and quantity skew (Li et al.,
    "Federated Learning on Non-IID Data Silos", 2021).
  * WeCFL (Ma et al., "On the Convergence of Clustered Federated Learning"):
    cluster-wise Dirichlet(c_cluster, c_client) and (n_cluster, n_client)-class
    on pooled data (`clusterwise_dirichlet`, `clusterwise_classes`: this
    project's variant), and the authors' own recipe from their FedBase code
    (`fedbase_groupwise`, `fedbase_split`): the official train and test sets
    cut with one proportion matrix, returning a `SplitPartition` that
    `build_split_federated_data` materializes (no pooling, no 90/10 split).
  * Rotated-image clusters (Ghosh et al., IFCA) and label-permutation clusters
    (e.g. Sattler et al., CFL; FedGroup's swapped-label settings).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tff_cluster.data.federated import DataError, FederatedData, split_train_test

# FedProx's MNIST generator: 10 digits, 5 images per (device, digit) slot
# first, the rest by lognormal(0, 2) shares read per block of 10 devices.
FEDPROX_MNIST_DIGITS = 10
FEDPROX_MNIST_PHASE1 = 5
FEDPROX_MNIST_SIGMA = 2.0
FEDPROX_MNIST_BLOCK = 10

# Rotation clusters: cluster k is rotated by 90 * k degrees.
ROTATIONS = (0, 90, 180, 270)

# Attempts at drawing distinct random label permutations before giving up.
_PERMUTATION_TRIES = 1000


def _checked_clusters(true_clusters, num_clients: int) -> Optional[np.ndarray]:
  """`true_clusters` as int64, one cluster id per client (None stays None)."""
  if true_clusters is None:
    return None
  true_clusters = np.asarray(true_clusters, dtype=np.int64)
  if true_clusters.shape != (num_clients,):
    raise DataError(
        f"true_clusters has shape {true_clusters.shape} but there are "
        f"{num_clients} clients; give one cluster id per client")
  return true_clusters


@dataclasses.dataclass
class Partition:
  """Which pooled samples each client holds.

  Attributes:
    client_indices: one int64 array per client, indices into the pooled data.
    true_clusters: ground-truth cluster id of each client (int64, one entry per
      client), or None when the setting has no clusters.
    cluster_info: what the clusters are, e.g. {'rotations': [0, 90]} or
      {'permutations': array [m, num_classes]}; {} when there is nothing to say.
  """
  client_indices: List[np.ndarray]
  true_clusters: Optional[np.ndarray] = None
  cluster_info: Dict = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    self.client_indices = [np.asarray(i, dtype=np.int64)
                           for i in self.client_indices]
    self.true_clusters = _checked_clusters(self.true_clusters, len(self.client_indices))

  @property
  def num_clients(self) -> int:
    return len(self.client_indices)

  def sizes(self) -> np.ndarray:
    """Number of samples of each client."""
    return np.array([len(i) for i in self.client_indices], dtype=np.int64)


# ----------------------------------------------------------------------------
# Argument checks (each raises a one-line DataError).


def _check_labels(labels) -> np.ndarray:
  labels = np.asarray(labels)
  if labels.ndim != 1 or labels.size == 0:
    raise DataError(
        f"labels must be a non-empty 1-D array of class ids, got shape "
        f"{labels.shape}; pass y (one label per sample), not one-hot labels")
  if not np.issubdtype(labels.dtype, np.integer):
    if not np.all(np.equal(np.mod(labels, 1), 0)):
      raise DataError(
          f"labels must be integer class ids, got dtype {labels.dtype} with "
          "fractional values; pass y as ints (argmax one-hot labels first)")
    labels = labels.astype(np.int64)
  if labels.min() < 0:
    raise DataError(
        f"labels must be >= 0, got minimum {labels.min()}; remap labels to 0..C-1")
  return labels.astype(np.int64)


def _check_positive_int(name: str, value, minimum: int = 1) -> int:
  if isinstance(value, bool) or int(value) != value or value < minimum:
    raise DataError(f"{name} must be an integer >= {minimum}, got {value!r}")
  return int(value)


def _check_concentration(name: str, value) -> float:
  if not np.isfinite(value) or value <= 0:
    raise DataError(
        f"{name} must be a positive number (small = skewed, large = near "
        f"uniform), got {value!r}; e.g. use 0.1 or 100")
  return float(value)


def _check_enough_samples(num_samples: int, num_clients: int, minimum: int = 1):
  if num_samples < num_clients * minimum:
    raise DataError(
        f"{num_samples} samples cannot give {num_clients} clients at least "
        f"{minimum} sample(s) each; use at most {num_samples // minimum} clients")


# ----------------------------------------------------------------------------
# Shared building blocks.


def _allocate(total: int, weights: np.ndarray, low: np.ndarray,
              high: Optional[np.ndarray] = None) -> np.ndarray:
  """Integer counts a with low <= a <= high, sum(a) == total.

  Starts at `low` and hands out the rest in proportion to `weights`
  (water-filling: holders at `high` drop out), rounding by largest remainder
  so the counts are deterministic given the weights.
  """
  weights = np.asarray(weights, dtype=np.float64)
  a = np.asarray(low, dtype=np.int64).copy()
  high = (np.full(len(a), total, np.int64) if high is None
          else np.asarray(high, dtype=np.int64))
  if a.sum() > total or high.sum() < total or np.any(a > high):
    raise DataError(f"cannot split {total} items under the given bounds")
  remaining = total - int(a.sum())
  while remaining > 0:
    room = high - a
    active = room > 0
    w = np.where(active, weights, 0.0)
    if w.sum() <= 0:  # all weight sits on full holders: share evenly instead
      w = active.astype(np.float64)
    share = remaining * w / w.sum()
    add = np.minimum(np.floor(share).astype(np.int64), room)
    if add.sum() == 0:
      # Every share is < 1 here, so `remaining` <= number of active holders.
      order = np.argsort(-(share - np.floor(share)), kind="stable")
      order = order[active[order]][:remaining]
      add = np.zeros_like(a)
      add[order] = 1
    a += add
    remaining -= int(add.sum())
  return a


def _deal_labels(num_holders: int, per_holder: int, label_ids: np.ndarray,
                 weights: np.ndarray, caps: np.ndarray,
                 rng: np.random.Generator) -> Tuple[List[np.ndarray], np.ndarray]:
  """Gives each holder `per_holder` distinct labels, spreading label usage.

  How many holders use label l is allocated in proportion to `weights` (at
  most `caps[l]` <= num_holders; at least 1 when there are enough slots to
  use every label). The labels are then written out as one sequence, each
  label repeated by its usage, and slot p goes to holder p % num_holders: a
  label's run is at most num_holders long, so no holder gets it twice, and
  every holder gets exactly per_holder labels.

  Returns (labels of each holder, sequence of dealt labels with their holder
  as `holder_of_slot`), the latter as an array [num_holders * per_holder, 2].
  """
  order = rng.permutation(len(label_ids))  # random tie-breaking and layout
  label_ids, weights, caps = label_ids[order], weights[order], caps[order]
  total = num_holders * per_holder
  low = np.ones(len(label_ids), np.int64) if total >= len(label_ids) else (
      np.zeros(len(label_ids), np.int64))
  uses = _allocate(total, weights, np.minimum(low, caps), caps)
  sequence = np.repeat(label_ids, uses)
  holder_perm = rng.permutation(num_holders)  # which holder gets column p % n
  holder_of_slot = holder_perm[np.arange(total) % num_holders]
  dealt = [np.sort(sequence[holder_of_slot == h]) for h in range(num_holders)]
  return dealt, np.stack([sequence, holder_of_slot], axis=1)


def _split_by_slots(labels: np.ndarray, slots: np.ndarray, num_holders: int,
                    rng: np.random.Generator,
                    slot_weights: Optional[np.ndarray] = None,
                    min_per_slot: Optional[int] = None) -> List[np.ndarray]:
  """Splits each label's samples among the (label, holder) slots that use it.

  Equal shards by default; with `slot_weights`, each slot first gets
  `min_per_slot` samples (fewer when the label is short) and the rest in
  proportion to its weight. Labels used by no slot are left out.
  """
  parts: List[List[np.ndarray]] = [[] for _ in range(num_holders)]
  for label in np.unique(slots[:, 0]):
    pos = np.flatnonzero(slots[:, 0] == label)
    idx = rng.permutation(np.flatnonzero(labels == label))
    if len(idx) < len(pos):
      raise DataError(
          f"class {label} has {len(idx)} samples but {len(pos)} clients need "
          f"it; use fewer clients or fewer classes per client")
    if slot_weights is None:
      counts = _allocate(len(idx), np.ones(len(pos)), np.zeros(len(pos)))
    else:
      floor = min(min_per_slot, len(idx) // len(pos))
      counts = _allocate(len(idx), slot_weights[pos],
                         np.full(len(pos), floor))
    for holder, chunk in zip(slots[pos, 1], np.split(idx, np.cumsum(counts)[:-1])):
      parts[holder].append(chunk)
  return [np.sort(np.concatenate(p)) if p else np.zeros(0, np.int64)
          for p in parts]


def _dirichlet_split(indices: np.ndarray, labels: np.ndarray, num_parts: int,
                     concentration: float, rng: np.random.Generator,
                     min_per_part: Sequence[int]) -> List[np.ndarray]:
  """Dirichlet label skew (Hsu et al. 2019) of `indices` into `num_parts`.

  For each class, proportions over the parts ~ Dir(concentration * 1) and the
  class's samples are cut at the cumulative proportions (all samples used).
  Parts short of `min_per_part` then take random samples from the currently
  largest part, which keeps the draw (no rejection loop that may never end
  for tiny concentrations and many parts).
  """
  min_per_part = np.asarray(min_per_part, dtype=np.int64)
  parts: List[List[np.ndarray]] = [[] for _ in range(num_parts)]
  for label in np.unique(labels[indices]):
    idx = rng.permutation(indices[labels[indices] == label])
    p = rng.dirichlet(np.full(num_parts, concentration))
    cuts = (np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
    for k, chunk in enumerate(np.split(idx, cuts)):
      parts[k].append(chunk)
  out = [np.concatenate(p) if p else np.zeros(0, np.int64) for p in parts]
  for k in np.flatnonzero([len(o) < m for o, m in zip(out, min_per_part)]):
    while len(out[k]) < min_per_part[k]:
      sizes = np.array([len(o) for o in out]) - min_per_part
      donor = int(np.argmax(sizes))
      take = min(int(min_per_part[k] - len(out[k])), int(sizes[donor]))
      moved = rng.choice(len(out[donor]), size=take, replace=False)
      out[k] = np.concatenate([out[k], out[donor][moved]])
      out[donor] = np.delete(out[donor], moved)
  return [np.sort(o) for o in out]


def _even_clusters(num_clients: int, num_clusters: int,
                   rng: np.random.Generator) -> np.ndarray:
  """Cluster id of each client: sizes differ by at most one (the first
  num_clients % num_clusters clusters get the extra client), and the ids are
  shuffled so no client range is biased towards one cluster."""
  counts = np.full(num_clusters, num_clients // num_clusters)
  counts[:num_clients % num_clusters] += 1
  return rng.permutation(np.repeat(np.arange(num_clusters), counts))


def _iid_split(num_samples: int, num_clients: int,
               rng: np.random.Generator) -> List[np.ndarray]:
  # Near-equal shares of a random permutation: sizes differ by at most one.
  return [np.sort(c) for c in
          np.array_split(rng.permutation(num_samples), num_clients)]


def _check_clusters(num_clusters, num_clients) -> Tuple[int, int]:
  num_clusters = _check_positive_int("num_clusters", num_clusters)
  num_clients = _check_positive_int("num_clients", num_clients)
  if num_clients < num_clusters:
    raise DataError(
        f"num_clients ({num_clients}) must be >= num_clusters ({num_clusters}) "
        "so every cluster has a client; raise num_clients or lower num_clusters")
  return num_clusters, num_clients


# ----------------------------------------------------------------------------
# Label-based partitions without clusters.


def _check_class_request(labels, num_clients, classes_per_client):
  """Validates a "k classes per client" request; returns the labels' classes too."""
  labels = _check_labels(labels)
  num_clients = _check_positive_int("num_clients", num_clients)
  classes_per_client = _check_positive_int("classes_per_client",
                                           classes_per_client)
  classes, counts = np.unique(labels, return_counts=True)
  if classes_per_client > len(classes):
    raise DataError(
        f"classes_per_client ({classes_per_client}) exceeds the {len(classes)} "
        f"classes present; use at most {len(classes)}")
  return labels, num_clients, classes_per_client, classes, counts


def _fedprox_mnist_digits(num_clients: int, classes_per_client: int) -> np.ndarray:
  """Digits of each device, [num_clients, classes_per_client]: (u + j) mod 10."""
  return (np.arange(num_clients)[:, None]
          + np.arange(classes_per_client)[None, :]) % FEDPROX_MNIST_DIGITS


def _fedprox_mnist_max_clients(counts: np.ndarray, classes_per_client: int,
                               upper: int) -> int:
  """Largest N <= upper whose phase 1 fits `counts` (slots grow with N)."""
  def fits(n):
    slots = np.bincount(_fedprox_mnist_digits(n, classes_per_client).ravel(),
                        minlength=FEDPROX_MNIST_DIGITS)
    return bool(np.all(FEDPROX_MNIST_PHASE1 * slots <= counts))
  low, high = 0, upper  # fits(0) holds, fits(upper) does not
  while high - low > 1:
    mid = (low + high) // 2
    low, high = (mid, high) if fits(mid) else (low, mid)
  return low


def fedprox_mnist(labels, num_clients: int = 1000, classes_per_client: int = 2,
                  seed: int = 0) -> Partition:
  """FedProx's non-IID MNIST recipe (Li et al., MLSys 2020, Section 5.1).

  Follows the data generator published with FedProx
  (`data/mnist/generate_niid.py`), with 1,000 devices and 2 digits each there:
    * each digit's images are taken in pooled order (pass train then test, in
      file order), through one cursor per digit; nothing is shuffled first;
    * device u holds digits (u + j) mod 10, j = 0..classes_per_client-1;
    * phase 1: for u = 0..N-1 and each of its digits in order, the next 5
      images of that digit;
    * phase 2: props ~ lognormal(0, 2), shape (10, ceil(N / 10),
      classes_per_client), from np.random.default_rng(seed). Device u's slot j
      (digit l) reads props[l, u // 10, j]. props[l] is scaled so that the
      entries read by some slot sum to the images of digit l left after phase
      1, i.e. count_l - 5 * (number of slots holding l). FedProx writes this
      as count_l - 1000, which is the same number for N = 1000 and 2 digits
      (each digit sits in 200 slots); when N is a multiple of 10 every entry
      of props[l] is read, as in FedProx, otherwise the last block's unread
      entries do not take a share. Then, in the order of phase 1, the slot
      gets the next int(share) images of l, but only if cursor + int(share)
      < count_l (otherwise none, as in FedProx).
  Truncation and that strict test leave some images unused; none is used
  twice. Every device has >= 5 * classes_per_client images, so the 90/10
  split of `build_federated_data` is exactly train = int(0.9 n), test = the
  rest, FedProx's split. A client's indices are in the order it received
  them (phase 1, then phase 2), not sorted.

  Args:
    labels: pooled labels, digits 0-9.
    num_clients: number of devices N (FedProx: 1000).
    classes_per_client: digits per device, 1..10 (FedProx: 2).
    seed: seed of the lognormal draw.

  Returns:
    A `Partition` without clusters; cluster_info holds 'classes' (the
    [N, classes_per_client] digits of each device), 'props' (the raw
    lognormal draw), 'shares' (props scaled per digit), 'samples_used' and
    'slots_refused' (phase-2 slots with int(share) > 0 that the cursor test
    skipped).
  """
  labels = _check_labels(labels)
  if labels.max() >= FEDPROX_MNIST_DIGITS:
    raise DataError(
        f"FedProx's MNIST recipe needs digit labels 0..9, got a label "
        f"{labels.max()}")
  num_clients = _check_positive_int("num_clients", num_clients)
  c = _check_positive_int("classes_per_client", classes_per_client)
  if c > FEDPROX_MNIST_DIGITS:
    raise DataError(
        f"classes_per_client must be between 1 and {FEDPROX_MNIST_DIGITS} "
        f"for MNIST, got {c}")
  by_digit = [np.flatnonzero(labels == l) for l in range(FEDPROX_MNIST_DIGITS)]
  counts = np.array([len(i) for i in by_digit], dtype=np.int64)
  digits = _fedprox_mnist_digits(num_clients, c)
  slots = np.bincount(digits.ravel(), minlength=FEDPROX_MNIST_DIGITS)
  need = FEDPROX_MNIST_PHASE1 * slots
  if np.any(need > counts):
    l = int(np.argmax(need > counts))
    raise DataError(
        f"FedProx's MNIST recipe gives {FEDPROX_MNIST_PHASE1} images of each "
        f"of a device's digits first: digit {l} has {counts[l]} images but "
        f"{slots[l]} device-slots need {need[l]}; use at most "
        f"{_fedprox_mnist_max_clients(counts, c, num_clients)} clients or "
        f"fewer classes_per_client")

  parts: List[List[np.ndarray]] = [[] for _ in range(num_clients)]
  cursor = np.zeros(FEDPROX_MNIST_DIGITS, dtype=np.int64)
  for u in range(num_clients):  # phase 1
    for l in digits[u]:
      parts[u].append(by_digit[l][cursor[l]:cursor[l] + FEDPROX_MNIST_PHASE1])
      cursor[l] += FEDPROX_MNIST_PHASE1

  rng = np.random.default_rng(seed)
  blocks = -(-num_clients // FEDPROX_MNIST_BLOCK)
  props = rng.lognormal(0.0, FEDPROX_MNIST_SIGMA,
                        (FEDPROX_MNIST_DIGITS, blocks, c))
  block = np.arange(num_clients) // FEDPROX_MNIST_BLOCK
  read = np.zeros(props.shape, dtype=bool)  # entries some slot reads
  read[digits, block[:, None], np.arange(c)[None, :]] = True
  left = counts - cursor
  shares = np.zeros_like(props)
  for l in range(FEDPROX_MNIST_DIGITS):
    if read[l].any():
      shares[l] = left[l] * props[l] / props[l][read[l]].sum()
  refused = 0
  for u in range(num_clients):  # phase 2
    for j, l in enumerate(digits[u]):
      n = int(shares[l, block[u], j])
      if cursor[l] + n < counts[l]:
        parts[u].append(by_digit[l][cursor[l]:cursor[l] + n])
        cursor[l] += n
      elif n:
        refused += 1
  indices = [np.concatenate(p) for p in parts]
  return Partition(indices, None, {
      "classes": digits, "props": props, "shares": shares,
      "samples_used": int(cursor.sum()), "slots_refused": refused})


def n_class_pathological(labels, num_clients: int, classes_per_client: int,
                         seed: int) -> Partition:
  """Pathological non-IID: each client holds exactly `classes_per_client` labels.

  McMahan et al., "Communication-Efficient Learning of Deep Networks from
  Decentralized Data" (FedAvg): sort by label, cut into shards, give each
  client `classes_per_client` shards. Here shards never straddle two labels:
  num_clients * classes_per_client shards are allocated to the labels in
  proportion to their counts (each label at most num_clients shards), each
  label's shuffled samples are cut into equal shards, and the shards are dealt
  round-robin so every client gets shards of distinct labels - exactly
  `classes_per_client` labels per client.
  All samples are used when num_clients * classes_per_client >= number of
  classes (otherwise the labels left without a shard are unused); none twice.
  """
  labels, num_clients, classes_per_client, classes, counts = _check_class_request(
      labels, num_clients, classes_per_client)
  caps = np.minimum(num_clients, counts)  # a shard needs at least one sample
  if caps.sum() < num_clients * classes_per_client:
    raise DataError(
        f"{len(labels)} samples cannot make {num_clients} x "
        f"{classes_per_client} non-empty single-label shards with distinct "
        "labels per client; use fewer clients or classes_per_client")
  rng = np.random.default_rng(seed)
  dealt, slots = _deal_labels(num_clients, classes_per_client, classes,
                              counts.astype(np.float64), caps, rng)
  indices = _split_by_slots(labels, slots, num_clients, rng)
  return Partition(indices, None, {"classes": dealt})


def dirichlet_label_skew(labels, num_clients: int, concentration: float,
                         seed: int, min_samples_per_client: int = 1) -> Partition:
  """Dirichlet label skew: per class, proportions over clients ~ Dir(alpha).

  Hsu et al., "Measuring the Effects of Non-Identical Data Distribution for
  Federated Visual Classification" (2019). Small `concentration` (0.1): each
  client sees few classes; large (100): near-IID labels. Clients left with
  fewer than `min_samples_per_client` samples take random samples from the
  largest client (instead of redrawing until lucky).
  All samples are used; none twice.
  """
  labels = _check_labels(labels)
  num_clients = _check_positive_int("num_clients", num_clients)
  concentration = _check_concentration("concentration", concentration)
  min_samples = _check_positive_int("min_samples_per_client",
                                    min_samples_per_client, minimum=0)
  _check_enough_samples(len(labels), num_clients, min_samples)
  rng = np.random.default_rng(seed)
  indices = _dirichlet_split(np.arange(len(labels)), labels, num_clients,
                             concentration, rng,
                             np.full(num_clients, min_samples))
  return Partition(indices, None, {})


def quantity_skew(num_samples: int, num_clients: int, concentration: float,
                  seed: int) -> Partition:
  """Quantity skew: IID labels, client sizes ~ Dir(alpha) (at least 1 each).

  Li et al., "Federated Learning on Non-IID Data Silos: An Experimental Study"
  (2021): q ~ Dir(concentration * 1); each client gets 1 sample plus its
  q-share of the rest (largest-remainder rounding) of a random permutation.
  All samples are used; none twice.
  """
  num_samples = _check_positive_int("num_samples", num_samples)
  num_clients = _check_positive_int("num_clients", num_clients)
  concentration = _check_concentration("concentration", concentration)
  _check_enough_samples(num_samples, num_clients)
  rng = np.random.default_rng(seed)
  q = rng.dirichlet(np.full(num_clients, concentration))
  sizes = _allocate(num_samples, q, np.ones(num_clients))
  perm = rng.permutation(num_samples)
  return Partition([np.sort(c) for c in np.split(perm, np.cumsum(sizes)[:-1])],
                   None, {})


# ----------------------------------------------------------------------------
# Clustered partitions (ground-truth clusters).


def clusterwise_dirichlet(labels, num_clusters: int, num_clients: int,
                          cluster_concentration: float,
                          client_concentration: float,
                          seed: int) -> Partition:
  """WeCFL's two-level Dirichlet partition, Dir(c_cluster, c_client).

  Ma et al., "On the Convergence of Clustered Federated Learning" (WeCFL),
  e.g. (0.1, 10) with 200 clients and m = 5 or 10 clusters:
    1. per class, proportions over the m clusters ~ Dir(c_cluster) (clusters
       get very different label mixes when c_cluster is small);
    2. within each cluster, per class, proportions over its clients
       ~ Dir(c_client) (clients of a cluster are near-IID when c_client is
       large).
  Clients are dealt to clusters evenly: num_clients // m each, the first
  num_clients % m clusters one more (in a shuffled client order). Every
  cluster gets at least one sample per client and every client at least one
  sample (topped up from the largest part when a draw leaves it short).
  All samples are used; none twice. true_clusters = cluster id per client.
  """
  labels = _check_labels(labels)
  num_clusters, num_clients = _check_clusters(num_clusters, num_clients)
  c_cluster = _check_concentration("cluster_concentration",
                                   cluster_concentration)
  c_client = _check_concentration("client_concentration", client_concentration)
  _check_enough_samples(len(labels), num_clients)
  rng = np.random.default_rng(seed)
  clusters = _even_clusters(num_clients, num_clusters, rng)
  members = [np.flatnonzero(clusters == k) for k in range(num_clusters)]
  cluster_indices = _dirichlet_split(
      np.arange(len(labels)), labels, num_clusters, c_cluster, rng,
      [len(m) for m in members])
  indices: List[np.ndarray] = [np.zeros(0, np.int64)] * num_clients
  for k in range(num_clusters):
    parts = _dirichlet_split(cluster_indices[k], labels, len(members[k]),
                             c_client, rng, np.ones(len(members[k])))
    for client, part in zip(members[k], parts):
      indices[client] = part
  return Partition(indices, clusters, {
      "cluster_concentration": c_cluster,
      "client_concentration": c_client})


def clusterwise_classes(labels, num_clusters: int, num_clients: int,
                        classes_per_cluster: int, classes_per_client: int,
                        seed: int) -> Partition:
  """WeCFL's (n_cluster, n_client)-class partition, e.g. (3, 2).

  Ma et al. (WeCFL): each of the m clusters gets `classes_per_cluster`
  distinct classes (disjoint across clusters when m * n_cluster <= classes,
  otherwise shared as evenly as possible), and each client of a cluster gets
  `classes_per_client` distinct classes of its cluster's (the cluster's
  classes used by equally many of its clients). Each class's samples are then
  cut into equal shards, one per client holding it.
  Clients are dealt to clusters evenly: num_clients // m each, the first
  num_clients % m clusters one more (in a shuffled client order).
  Every sample of a class some client holds is used; none twice.
  cluster_info['cluster_classes'][k] = the classes of cluster k.
  """
  labels = _check_labels(labels)
  num_clusters, num_clients = _check_clusters(num_clusters, num_clients)
  n_cluster = _check_positive_int("classes_per_cluster", classes_per_cluster)
  n_client = _check_positive_int("classes_per_client", classes_per_client)
  classes, counts = np.unique(labels, return_counts=True)
  if n_cluster > len(classes):
    raise DataError(
        f"classes_per_cluster ({n_cluster}) exceeds the {len(classes)} classes "
        f"present; use at most {len(classes)}")
  if n_client > n_cluster:
    raise DataError(
        f"classes_per_client ({n_client}) must be <= classes_per_cluster "
        f"({n_cluster}); a client only holds classes of its cluster")
  rng = np.random.default_rng(seed)
  clusters = _even_clusters(num_clients, num_clusters, rng)
  # Uniform weights: spread classes over clusters evenly (disjoint if possible).
  cluster_classes, _ = _deal_labels(
      num_clusters, n_cluster, classes, np.ones(len(classes)),
      np.full(len(classes), num_clusters), rng)
  slots = []
  client_classes: List[np.ndarray] = [None] * num_clients
  for k in range(num_clusters):
    members = np.flatnonzero(clusters == k)
    dealt, local = _deal_labels(len(members), n_client, cluster_classes[k],
                                np.ones(n_cluster),
                                np.full(n_cluster, len(members)), rng)
    for j, client in enumerate(members):
      client_classes[client] = dealt[j]
    slots.append(np.stack([local[:, 0], members[local[:, 1]]], axis=1))
  indices = _split_by_slots(labels, np.concatenate(slots), num_clients, rng)
  return Partition(indices, clusters, {"cluster_classes": cluster_classes,
                                       "classes": client_classes})


def rotation_clusters(num_samples: int, num_clients: int, num_clusters: int = 4,
                      seed: int = 0) -> Partition:
  """Rotated-image clusters (Ghosh et al., IFCA; Rotated MNIST / CIFAR).

  IID split of the samples among clients (sizes differ by at most one);
  clients are dealt evenly to clusters (num_clients // m each, the first
  num_clients % m clusters one more, shuffled order); cluster k's images are
  to be rotated by 90 * k degrees: cluster_info['rotations'] =
  [0, 90, 180, 270][:m]. Apply with `rotation_transform(partition)` in
  `build_federated_data`. All samples are used; none twice.
  """
  num_samples = _check_positive_int("num_samples", num_samples)
  num_clusters, num_clients = _check_clusters(num_clusters, num_clients)
  if num_clusters > len(ROTATIONS):
    raise DataError(
        f"num_clusters must be between 1 and {len(ROTATIONS)} for rotation "
        f"clusters (rotations {list(ROTATIONS)}), got {num_clusters}")
  _check_enough_samples(num_samples, num_clients)
  rng = np.random.default_rng(seed)
  indices = _iid_split(num_samples, num_clients, rng)
  clusters = _even_clusters(num_clients, num_clusters, rng)
  return Partition(indices, clusters,
                   {"rotations": list(ROTATIONS[:num_clusters])})


def rotate_images(x: np.ndarray, degrees: int, index=None) -> np.ndarray:
  """Rotates a batch of images counter-clockwise by a multiple of 90 degrees.

  `x` is [N, H, W], [N, H, W, C], or [N, D] with D a square (784 -> 28 x 28,
  a single channel), the last returned flat again. With `index` (integer
  indices into `x`) the result is `rotate_images(x[index], degrees)`, made in
  one copy (no intermediate gathered array). The result never shares memory
  with `x`.
  """
  if int(degrees) != degrees or degrees % 90:
    raise DataError(
        f"degrees must be a multiple of 90, got {degrees!r}; use 0, 90, 180 or 270")
  k = (int(degrees) // 90) % 4
  x = np.asarray(x)
  if x.ndim == 2:
    side = int(round(np.sqrt(x.shape[1])))
    if side * side != x.shape[1]:
      raise DataError(
          f"flat images must have a square size (e.g. 784 = 28 x 28), got "
          f"{x.shape[1]}; pass images shaped [N, H, W] or [N, H, W, C]")
    images = x.reshape(-1, side, side)
  elif x.ndim in (3, 4):
    images = x
  else:
    raise DataError(
        f"images must be [N, D], [N, H, W] or [N, H, W, C], got shape {x.shape}")
  turned = np.rot90(images, k, axes=(1, 2))  # a view
  rows = len(turned) if index is None else len(index)
  out = np.empty((rows,) + turned.shape[1:], turned.dtype)  # C-contiguous
  if index is None:
    np.copyto(out, turned)
  else:
    np.take(turned, np.asarray(index, np.intp), axis=0, out=out)
  return out.reshape((rows,) + (x.shape[1:] if x.ndim == 2 else turned.shape[1:]))


def rotation_transform(partition: Partition) -> Callable:
  """`transform` for `build_federated_data`: rotates client i's images by its
  cluster's angle (`cluster_info['rotations']`)."""
  rotations = partition.cluster_info["rotations"]
  clusters = partition.true_clusters

  def transform(client_index: int, x: np.ndarray, y: np.ndarray):
    return rotate_images(x, rotations[clusters[client_index]]), y
  return transform


def label_permutation_clusters(labels, num_clients: int, num_clusters: int,
                               num_classes: int, seed: int) -> Partition:
  """Label-permutation clusters: same inputs, cluster-specific label maps.

  Concept shift across clusters (e.g. Sattler et al., CFL; FedGroup): IID split
  of the samples among clients (sizes differ by at most one); clients are
  dealt evenly to clusters (num_clients // m each, the first num_clients % m
  clusters one more, shuffled order). Cluster k relabels y -> permutations[k][y];
  cluster 0 keeps the identity and all m permutations are distinct.
  cluster_info['permutations'] is an int64 array [m, num_classes]. Apply with
  `label_permutation_transform(partition)`. All samples are used; none twice.
  """
  labels = _check_labels(labels)
  num_clusters, num_clients = _check_clusters(num_clusters, num_clients)
  num_classes = _check_positive_int("num_classes", num_classes, minimum=2)
  if labels.max() >= num_classes:
    raise DataError(
        f"labels go up to {labels.max()} but num_classes is {num_classes}; "
        f"pass num_classes >= {labels.max() + 1}")
  if num_classes <= 8 and num_clusters > math.factorial(num_classes):
    raise DataError(
        f"{num_classes} classes have only {math.factorial(num_classes)} "
        f"distinct permutations, fewer than num_clusters ({num_clusters}); "
        "lower num_clusters")
  _check_enough_samples(len(labels), num_clients)
  rng = np.random.default_rng(seed)
  indices = _iid_split(len(labels), num_clients, rng)
  clusters = _even_clusters(num_clients, num_clusters, rng)
  perms = [np.arange(num_classes)]
  seen = {tuple(perms[0])}
  for _ in range(_PERMUTATION_TRIES):
    if len(perms) == num_clusters:
      break
    p = rng.permutation(num_classes)
    if tuple(p) not in seen:  # distinct maps, so clusters really differ
      seen.add(tuple(p))
      perms.append(p)
  if len(perms) < num_clusters:
    raise DataError(
        f"could not draw {num_clusters} distinct label permutations of "
        f"{num_classes} classes; lower num_clusters")
  return Partition(indices, clusters,
                   {"permutations": np.stack(perms).astype(np.int64)})


def permute_labels(y: np.ndarray, permutation: np.ndarray) -> np.ndarray:
  """Relabels y -> permutation[y], keeping y's dtype."""
  y = np.asarray(y)
  permutation = np.asarray(permutation)
  if y.size and (y.min() < 0 or y.max() >= len(permutation)):
    raise DataError(
        f"labels must lie in [0, {len(permutation)}) for a permutation of "
        f"{len(permutation)} classes, got range [{y.min()}, {y.max()}]")
  return permutation[y].astype(y.dtype)


def label_permutation_transform(partition: Partition) -> Callable:
  """`transform` for `build_federated_data`: relabels client i's samples with
  its cluster's permutation (`cluster_info['permutations']`)."""
  perms = partition.cluster_info["permutations"]
  clusters = partition.true_clusters

  def transform(client_index: int, x: np.ndarray, y: np.ndarray):
    return x, permute_labels(y, perms[clusters[client_index]])
  return transform


# ----------------------------------------------------------------------------
# Materialization.


def build_federated_data(x: np.ndarray, y: np.ndarray, partition: Partition,
                         num_classes: int, seed: int, description: str,
                         transform: Optional[Callable] = None,
                         train_fraction: float = 0.9) -> FederatedData:
  """Materializes a `Partition` of pooled (x, y) as `FederatedData`.

  For client i: takes x[idx], y[idx], applies `transform(i, x, y) -> (x, y)`
  when given (e.g. `rotation_transform(partition)`), then shuffles and splits
  train/test with `split_train_test` (LEAF: 90/10). The client id is
  f"client_{i:04d}" with i the partition's client index, so ids map back to
  the partition. Clients with no samples are skipped with a warning and left
  out of true_clusters too.
  """
  x, y = np.asarray(x), np.asarray(y)
  if len(x) != len(y):
    raise DataError(f"x has {len(x)} samples but y has {len(y)}; pass matching arrays")
  if not 0.0 < train_fraction <= 1.0:
    raise DataError(
        f"train_fraction must be in (0, 1], got {train_fraction}; LEAF uses 0.9")
  for i, idx in enumerate(partition.client_indices):
    if idx.size and (idx.min() < 0 or idx.max() >= len(y)):
      raise DataError(
          f"partition client {i} indexes sample {idx.max()} but the data has "
          f"{len(y)} samples; build the partition from these arrays")
  rng = np.random.default_rng(seed)
  client_ids, train, test, kept = [], {}, {}, []
  for i, idx in enumerate(partition.client_indices):
    xi, yi = x[idx], y[idx]
    if transform is not None:
      xi, yi = transform(i, xi, yi)
    if len(yi) == 0:
      warnings.warn(f"client {i} has no samples; skipping it", stacklevel=2)
      continue
    cid = f"client_{i:04d}"
    client_ids.append(cid)
    kept.append(i)
    train[cid], test[cid] = split_train_test(xi, yi, rng, train_fraction)
  if not client_ids:
    raise DataError("every client of the partition is empty; check the partition")
  clusters = None
  if partition.true_clusters is not None:
    clusters = partition.true_clusters[np.asarray(kept, dtype=np.int64)]
  return FederatedData(client_ids, train, test, num_classes, clusters,
                       description)


# ----------------------------------------------------------------------------
# The WeCFL authors' split (FedBase): train and official test set partitioned
# with one proportion matrix, clients kept by test size, no pooling.

# A node is kept only if its test part has more than this many samples.
FEDBASE_MIN_TEST = 5
# The cluster level is redrawn until every cluster's test part has more than
# this fraction of |test| / num_clusters samples.
FEDBASE_CLUSTER_MIN_SHARE = 0.3
# Draws tried (per level) before giving up with a DataError.
FEDBASE_MAX_DRAWS = 1000
FEDBASE_METHODS = ("dirichlet", "class")


@dataclasses.dataclass
class SplitPartition:
  """Which official-train and official-test samples each client holds.

  Attributes:
    train_indices: one int64 array per client, indices into the train set.
    test_indices: one int64 array per client, indices into the test set.
    true_clusters: ground-truth cluster of each client, or None.
    info: how the split was drawn (proportions, drops, duplicates, ...).
  """
  train_indices: List[np.ndarray]
  test_indices: List[np.ndarray]
  true_clusters: Optional[np.ndarray] = None
  info: Dict = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    self.train_indices = [np.asarray(i, dtype=np.int64) for i in self.train_indices]
    self.test_indices = [np.asarray(i, dtype=np.int64) for i in self.test_indices]
    if len(self.train_indices) != len(self.test_indices):
      raise DataError(
          f"{len(self.train_indices)} train parts but {len(self.test_indices)} "
          "test parts; give one of each per client")
    self.true_clusters = _checked_clusters(self.true_clusters, len(self.train_indices))

  @property
  def num_clients(self) -> int:
    return len(self.train_indices)


def _check_fedbase_level(method: str, alpha, num_nodes, what: str):
  if method not in FEDBASE_METHODS:
    raise DataError(f"{what} method must be one of {', '.join(FEDBASE_METHODS)}, "
                    f"got {method!r}")
  num_nodes = _check_positive_int(f"{what} count", num_nodes)
  if method == "dirichlet":
    alpha = _check_concentration(f"{what} concentration", alpha)
  else:
    alpha = _check_positive_int(f"{what} classes", alpha)
  return method, alpha, num_nodes


def fedbase_proportions(num_classes: int, num_nodes: int, alpha, method: str,
                        test_size: int, rng: np.random.Generator) -> np.ndarray:
  """The proportion matrix P [num_classes, num_nodes] of one FedBase draw.

  dirichlet: row c ~ Dir(alpha * 1), rounded to round(log10(test_size /
  num_classes)) decimals (so a row need not sum to 1). class: each node in
  turn picks `alpha` distinct classes uniformly (independent picks, so a
  class may be picked by many nodes or by none); P[c, j] = X[c, j] /
  (sum_j X[c, j] + 1e-10), a class nobody picked being a zero row.
  """
  if method == "dirichlet":
    decimals = int(round(math.log(test_size / num_classes, 10)))
    return np.round(rng.dirichlet(np.full(num_nodes, alpha), size=num_classes),
                    decimals)
  picked = np.zeros((num_classes, num_nodes))
  for j in range(num_nodes):
    picked[rng.choice(num_classes, alpha, replace=False), j] = 1.0
  return picked / (picked.sum(axis=1, keepdims=True) + 1e-10)


def _cut_consecutive(by_class: List[np.ndarray], sizes: np.ndarray) -> List[np.ndarray]:
  """Node j gets, of each class c, the run by_class[c][start:stop] with
  stop = sizes[c, :j+1].sum() and start = stop - sizes[c, j], both clipped to
  the class's length (rounded sizes may overshoot it: the last runs shrink)."""
  parts: List[List[np.ndarray]] = [[] for _ in range(sizes.shape[1])]
  for idx, row in zip(by_class, sizes):
    stop = np.cumsum(row)
    start = np.minimum(stop - row, len(idx))
    stop = np.minimum(stop, len(idx))
    for j in range(len(row)):
      parts[j].append(idx[start[j]:stop[j]])
  return [np.concatenate(p) if p else np.zeros(0, np.int64) for p in parts]


def _fedbase_split(train_labels: np.ndarray, test_labels: np.ndarray,
                   train_idx: np.ndarray, test_idx: np.ndarray, num_nodes: int,
                   alpha, method: str, rng: np.random.Generator, quirks: bool,
                   where: str = "the data") -> Tuple[List[np.ndarray], List[np.ndarray], Dict]:
  """One FedBase `split_dataset` of (train_idx, test_idx) into num_nodes nodes.

  Classes are those present in the train part; each class's indices are kept
  in dataset order (ascending). A draw: P = `fedbase_proportions`, train
  counts round(L_train[c] * P[c, j]) and test counts round(L_test[c] * P[c, j])
  (half to even), node j takes consecutive runs (`_cut_consecutive`), and is
  kept iff its test part has more than FEDBASE_MIN_TEST samples. Draws are
  repeated while at most num_nodes // 2 nodes are kept. With `quirks`
  (FedBase): every draw's kept nodes are appended to those of the earlier
  draws (so nodes of different draws overlap, and more than num_nodes may
  result), then, while fewer than num_nodes are kept, num_nodes - kept
  indices are drawn with replacement among the kept nodes and one copy of
  each distinct one is appended (duplicate nodes). Without `quirks`: a draw
  is accepted only when all num_nodes nodes are kept (a redraw replaces the
  earlier draw), so exactly num_nodes nodes, no sample twice; settings where
  that is unlikely (e.g. Dir(0.1) over 200 nodes) raise a DataError.
  """
  if num_nodes == 1:
    return [train_idx], [test_idx], {"draws": 0, "dropped": 0, "duplicated": 0}
  classes = np.unique(train_labels[train_idx])
  if len(test_idx) == 0:
    raise DataError(f"{where} has no test samples to split among {num_nodes} nodes")
  if method == "class" and alpha > len(classes):
    raise DataError(
        f"{where} has {len(classes)} classes but each node is to pick {alpha}; "
        f"use at most {len(classes)} classes per node")
  tr_by_class = [train_idx[train_labels[train_idx] == c] for c in classes]
  te_by_class = [test_idx[test_labels[test_idx] == c] for c in classes]
  l_tr = np.array([len(i) for i in tr_by_class], dtype=np.float64)
  l_te = np.array([len(i) for i in te_by_class], dtype=np.float64)
  kept_tr: List[np.ndarray] = []
  kept_te: List[np.ndarray] = []
  draws = dropped = 0
  proportions = []
  need = num_nodes // 2 + 1 if quirks else num_nodes
  while len(kept_te) < need:
    if draws == FEDBASE_MAX_DRAWS:
      raise DataError(
          f"{FEDBASE_MAX_DRAWS} draws of {where} never gave {need} of {num_nodes} "
          f"nodes more than {FEDBASE_MIN_TEST} test samples each; use fewer nodes, "
          "a larger concentration" + ("" if quirks else " or fedbase_quirks=true"))
    draws += 1
    if not quirks:
      kept_tr, kept_te, dropped, proportions = [], [], 0, []
    p = fedbase_proportions(len(classes), num_nodes, alpha, method, len(test_idx), rng)
    proportions.append(p)
    n_tr = np.round(l_tr[:, None] * p).astype(np.int64)
    n_te = np.round(l_te[:, None] * p).astype(np.int64)
    tr_parts = _cut_consecutive(tr_by_class, n_tr)
    te_parts = _cut_consecutive(te_by_class, n_te)
    for tr, te in zip(tr_parts, te_parts):
      if len(te) > FEDBASE_MIN_TEST:
        kept_tr.append(tr)
        kept_te.append(te)
      else:
        dropped += 1
  duplicated = 0
  while quirks and len(kept_te) < num_nodes:
    picks = np.unique(rng.choice(len(kept_te), num_nodes - len(kept_te), replace=True))
    kept_tr += [kept_tr[i] for i in picks]
    kept_te += [kept_te[i] for i in picks]
    duplicated += len(picks)
  return kept_tr, kept_te, {"draws": draws, "dropped": dropped,
                            "duplicated": duplicated, "classes": classes,
                            "proportions": proportions}


def _check_split_labels(train_labels, test_labels):
  train_labels, test_labels = _check_labels(train_labels), _check_labels(test_labels)
  return train_labels, test_labels


def fedbase_split(train_labels, test_labels, num_clients: int, alpha,
                  method: str, seed: int, quirks: bool = True) -> SplitPartition:
  """FedBase's client-wise split (the WeCFL paper's Table 5 settings).

  `fedbase_split(y_train, y_test, 200, 0.1, 'dirichlet', seed)` and
  `(..., 200, 2, 'class', seed)`: the train and official test sets are cut
  with the same proportion matrix (see `_fedbase_split` for the draw, the
  drop rule and what `quirks` changes). No clusters (true_clusters None).
  info: 'draws', 'dropped' (nodes with <= 5 test samples), 'duplicated'
  (copies appended), 'proportions' (the P of every draw), 'classes'.
  """
  train_labels, test_labels = _check_split_labels(train_labels, test_labels)
  method, alpha, num_clients = _check_fedbase_level(method, alpha, num_clients, "client")
  rng = np.random.default_rng(seed)
  tr, te, info = _fedbase_split(train_labels, test_labels,
                                np.arange(len(train_labels)),
                                np.arange(len(test_labels)), num_clients, alpha,
                                method, rng, bool(quirks))
  return SplitPartition(tr, te, None, info)


def fedbase_groupwise(train_labels, test_labels, num_clusters: int,
                      cluster_alpha, cluster_method: str,
                      clients_per_cluster: int, client_alpha,
                      client_method: str, seed: int,
                      quirks: bool = True) -> SplitPartition:
  """FedBase's cluster-wise split (`split_dataset_groupwise`; WeCFL Table 2).

  α = (0.1, 10): (10, 0.1, 'dirichlet', 20, 10, 'dirichlet'); (3, 2)-class:
  (10, 3, 'class', 20, 2, 'class'). First the whole train and test sets are
  split among num_clusters clusters, redrawn (a fresh split each time) until
  every resulting part has more than 0.3 * |test| / num_clusters test
  samples; the first num_clusters parts are the clusters (with `quirks` the
  split may return more parts, and the check covers them all; without, all
  num_clusters must be kept). Then each cluster's train and test parts are
  split among clients_per_cluster clients the same way; true cluster = g.
  See `_fedbase_split` for the draw, the <= 5 test samples drop rule and
  `quirks`. info: 'cluster_draws', 'clusters' (the cluster-level
  draw info), 'per_cluster' (each cluster's client-level draw info),
  'dropped', 'duplicated' (client level, summed).
  """
  train_labels, test_labels = _check_split_labels(train_labels, test_labels)
  cluster_method, cluster_alpha, num_clusters = _check_fedbase_level(
      cluster_method, cluster_alpha, num_clusters, "cluster")
  client_method, client_alpha, clients_per_cluster = _check_fedbase_level(
      client_method, client_alpha, clients_per_cluster, "client")
  rng = np.random.default_rng(seed)
  threshold = FEDBASE_CLUSTER_MIN_SHARE * len(test_labels) / num_clusters
  all_tr, all_te = np.arange(len(train_labels)), np.arange(len(test_labels))
  for cluster_draws in range(1, FEDBASE_MAX_DRAWS + 1):
    c_tr, c_te, c_info = _fedbase_split(train_labels, test_labels, all_tr, all_te,
                                        num_clusters, cluster_alpha,
                                        cluster_method, rng, bool(quirks))
    if len(c_te) >= num_clusters and min(len(t) for t in c_te) > threshold:
      break
  else:
    raise DataError(
        f"{FEDBASE_MAX_DRAWS} cluster-level draws never gave every one of "
        f"{num_clusters} clusters more than {threshold:g} test samples; use "
        "fewer clusters or a larger cluster concentration")
  train_idx: List[np.ndarray] = []
  test_idx: List[np.ndarray] = []
  clusters: List[int] = []
  per_cluster = []
  for g in range(num_clusters):
    tr, te, info = _fedbase_split(train_labels, test_labels, np.sort(c_tr[g]),
                                  np.sort(c_te[g]), clients_per_cluster,
                                  client_alpha, client_method, rng, bool(quirks),
                                  where=f"cluster {g}")
    train_idx += tr
    test_idx += te
    clusters += [g] * len(tr)
    per_cluster.append(info)
  return SplitPartition(train_idx, test_idx, np.array(clusters, np.int64), {
      "cluster_draws": cluster_draws, "clusters": c_info,
      "cluster_train": c_tr[:num_clusters], "cluster_test": c_te[:num_clusters],
      "per_cluster": per_cluster,
      "dropped": sum(i["dropped"] for i in per_cluster),
      "duplicated": sum(i["duplicated"] for i in per_cluster)})


def build_split_federated_data(train: Tuple[np.ndarray, np.ndarray],
                               test: Tuple[np.ndarray, np.ndarray],
                               partition: SplitPartition, num_classes: int,
                               description: str) -> FederatedData:
  """Materializes a `SplitPartition`: client i gets train[0][train_indices[i]]
  and test[0][test_indices[i]] (no shuffling, no 90/10 split), id
  f"client_{i:04d}". A client whose train part is empty is skipped with a
  warning (and left out of true_clusters)."""
  (x_tr, y_tr), (x_te, y_te) = train, test
  if len(x_tr) != len(y_tr) or len(x_te) != len(y_te):
    raise DataError("inputs and labels differ in length; pass matching arrays")
  client_ids, tr_out, te_out, kept = [], {}, {}, []
  for i, (a, b) in enumerate(zip(partition.train_indices, partition.test_indices)):
    if (a.size and a.max() >= len(y_tr)) or (b.size and b.max() >= len(y_te)):
      raise DataError(f"partition client {i} indexes samples beyond the data; "
                      "build the partition from these arrays")
    if a.size == 0:
      warnings.warn(f"client {i} has no train samples; skipping it", stacklevel=2)
      continue
    cid = f"client_{i:04d}"
    client_ids.append(cid)
    kept.append(i)
    tr_out[cid] = (x_tr[a], y_tr[a])
    te_out[cid] = (x_te[b], y_te[b])
  if not client_ids:
    raise DataError("every client of the partition is empty; check the partition")
  clusters = None
  if partition.true_clusters is not None:
    clusters = partition.true_clusters[np.asarray(kept, dtype=np.int64)]
  return FederatedData(client_ids, tr_out, te_out, num_classes, clusters, description)
