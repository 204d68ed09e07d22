"""The aggregation slot: how the clients' updates are combined
(`--aggregator`), written once for every algorithm whose server reads only
sums of its clients' updates (docs/privacy.md).

A definition opts in by naming, per mode, the keys of its `summed` that hold
the clients' updates and the key of their weights (`Definition.update_parts`,
an `UpdateParts`):
each client's update there is w x delta, in the row of its key for a
clustered definition (a [K, ...] stack, zeros in the other rows), and its
weight w (a scalar, or w in row key of a [K] vector). `Aggregated` wraps such
a definition; the runners run the wrapper as they run any definition:

  mean          the definition's own rule (no wrapper).
  clipped       each client's delta clipped in L2 norm to C (over every
                update key: the row of its key), then the definition's
                weighted mean.
  dp_fixed      DP-FedAvg (McMahan et al., ICLR 2018), TFF's
                `DifferentiallyPrivateFactory.gaussian_fixed` on the stacked
                record: each client's delta clipped to C with uniform weight
                1; the server adds N(0, (z C)^2) to every coordinate of the
                sums (every row, with members or not) and divides each row by
                m = --clients_per_round (the public, fixed cohort size: TFF's
                `NormalizedQuery` denominator), whatever the members' count.
  dp_adaptive   the same with the clip adapted by the quantile rule of Andrew
                et al. (NeurIPS 2021) as TFF's `gaussian_adaptive` runs it
                (tensorflow_privacy's `QuantileAdaptiveClipSumQuery` with
                geometric updates): b_i = 1[||delta_i|| <= C] - 1/2 summed,
                noised with N(0, s^2) (s = --clip_count_stddev, default
                0.05 m), b = sum / m + 1/2 clamped to [0, 1],
                C <- C exp(-lr (b - q)); the round's sums are noised with the
                clip before the update, at the value noise multiplier
                z_v = (z^-2 - (2 s)^-2)^-1/2 (TFF's `adaptive_clip_noise_params`:
                z is the total).
  median, trimmed_mean
                coordinate-wise, per cluster, over the clients of the
                cluster this round (uniform weights): the runners hand every
                client's delta to `combine` (host side) instead of summing it.

The noise is drawn with `tf.random.stateless_normal` from (the run's seed,
the release counter kept in the state), so a run is the same on every runner
and a resumed run draws what an uninterrupted one does. The mechanism's state
(`aggregator`: the clip, the release count, the total and the value noise
multipliers) rides in the server state, so checkpoints carry it: a resumed
run draws and reports what an uninterrupted one does.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_cluster.core.definition import ClientOutput, Definition

AGGREGATORS = ("mean", "clipped", "dp_fixed", "dp_adaptive", "median", "trimmed_mean")
PRIVATE = ("dp_fixed", "dp_adaptive")
ORDER_STATISTICS = ("median", "trimmed_mean")
# The server state's key of the mechanism's state.
STATE_KEY = "aggregator"
# Seeds of the two noise streams (the sums' and the clip count's) apart from
# the run's other streams.
NOISE_STREAM = 0x5EED_D9
COUNT_STREAM = 0x5EED_DA


@dataclasses.dataclass(frozen=True)
class Mechanism:
  """An aggregator and its settings (`--aggregator` and its flags)."""
  kind: str = "mean"
  clip: float = 1.0
  noise_multiplier: float = 0.0   # z: the total (dp_adaptive's count share included)
  clients_per_round: float = 1.0  # m: the public denominator of the private sums
  seed: int = 0
  clip_quantile: float = 0.5
  clip_lr: float = 0.2
  clip_count_stddev: float = 0.0  # 0: 0.05 m
  trim_fraction: float = 0.1

  def __post_init__(self):
    if self.kind not in AGGREGATORS:
      raise ValueError(f"invalid --aggregator={self.kind}; valid: {', '.join(AGGREGATORS)}")

  @property
  def private(self) -> bool:
    return self.kind in PRIVATE

  @property
  def count_stddev(self) -> float:
    """dp_adaptive's stddev of the noise on the unclipped count: the flag's,
    else 0.05 m, and 0 without noise (z = 0: TFF's `gaussian_adaptive`)."""
    if self.clip_count_stddev:
      return float(self.clip_count_stddev)
    return 0.05 * float(self.clients_per_round) if self.noise_multiplier else 0.0

  def value_noise_multiplier(self) -> float:
    """The noise multiplier of the sums: z for dp_fixed; for dp_adaptive the
    part of the total z left once the count's noise is paid (TFF's
    `adaptive_clip_noise_params`), refused in one line where the count's
    noise alone costs more than z allows."""
    z = float(self.noise_multiplier)
    if self.kind != "dp_adaptive" or z == 0:
      return z
    s = self.count_stddev
    if z >= 2 * s:
      raise ValueError(
          f"--aggregator=dp_adaptive: noise multiplier {z:g} needs a clip count noise "
          f"stddev above {z / 2:g} (now {s:g}: --clip_count_stddev, default 0.05 x "
          "--clients_per_round); valid: a larger --clip_count_stddev or "
          "--clients_per_round, or a smaller noise multiplier")
    return (z ** -2 - (2 * s) ** -2) ** -0.5


def unsupported(definition: Definition, kind: str) -> Optional[str]:
  """Why `definition` cannot take aggregator `kind` (a phrase), or None."""
  if kind == "mean":
    return None
  reads = getattr(definition, "individual_updates", "")
  if reads:
    return reads
  if not getattr(definition, "aggregation_slot", False):
    return ("its server update does not combine the clients' deltas through the "
            "aggregation slot")
  return None


class Aggregated(Definition):
  """`inner` (a definition with `update_parts`) whose updates `mechanism`
  combines. Every attribute not written here is the inner definition's."""

  def __init__(self, inner: Definition, mechanism: Mechanism):
    # No Definition.__init__: the inner definition's attributes are these.
    self.inner = inner
    self.mechanism = mechanism
    self.z_value = mechanism.value_noise_multiplier() if mechanism.private else 0.0

  def __getattr__(self, name):
    # Only for attributes not found on the wrapper (drivers read their
    # definition's own, e.g. `k`).
    if name in ("inner", "mechanism"):
      raise AttributeError(name)
    return getattr(self.inner, name)

  @property
  def modes(self):
    return self.inner.modes

  # -- the inner definition, its state without the mechanism's -------------

  @staticmethod
  def _inner_state(state):
    return collections.OrderedDict((k, v) for k, v in state.items() if k != STATE_KEY)

  def initial_state(self, initial_weights):
    state = collections.OrderedDict(self.inner.initial_state(initial_weights))
    state[STATE_KEY] = collections.OrderedDict(
        clip=np.float32(self.mechanism.clip), releases=np.int32(0),
        noise_multiplier=np.float32(self.mechanism.noise_multiplier),
        value_noise_multiplier=np.float32(self.z_value))
    return state

  def with_server_optimizer(self, optimizer):
    return Aggregated(self.inner.with_server_optimizer(optimizer), self.mechanism)

  def num_keys(self, mode):
    return self.inner.num_keys(mode)

  def database(self, state, mode):
    return self.inner.database(self._inner_state(state), mode)

  def client_state_spec(self, mode):
    return self.inner.client_state_spec(mode)

  def initial_client_state(self, mode):
    return self.inner.initial_client_state(mode)

  def broadcast(self, state, params, mode):
    inner = self.inner.broadcast(self._inner_state(state), params, mode)
    if self.inner.update_parts(mode) is None:
      return inner
    return collections.OrderedDict(inner=inner, clip=state[STATE_KEY]["clip"])

  # -- client side ---------------------------------------------------------

  def client_work(self, trainer, selected, received, client_state, data, mode, key=None):
    parts = self.inner.update_parts(mode)
    extra = {} if key is None else {"key": key}
    if parts is None:
      return self.inner.client_work(trainer, selected, received, client_state, data, mode,
                                    **extra)
    out = self.inner.client_work(trainer, selected, received["inner"], client_state, data,
                                 mode, **extra)
    summed = collections.OrderedDict(out.summed)
    flat, rebuild = flatten_parts(summed, parts.updates)
    weight = summed[parts.weight]
    n = tf.reduce_sum(weight)
    safe = tf.where(n > 0, n, 1.0)
    clip = tf.cast(received["clip"], tf.float32)
    kind = self.mechanism.kind
    # The client's delta (in its key's row), weight 1: uniform weights.
    delta = [u / safe for u in flat]
    norm = tf.linalg.global_norm(delta)
    summed["clipped_count"] = tf.cast(norm > clip, tf.float32)
    if kind == "clipped":
      scale = clip_scale(norm, clip)
      rebuild(summed, [u * scale for u in flat])
    elif kind in PRIVATE:
      # The weights stay as they are for the host's metrics: the server
      # divides by m (`server_update`).
      rebuild(summed, [d * clip_scale(norm, clip) for d in delta])
      if kind == "dp_adaptive":
        # Andrew et al.'s record: unclipped (<= the clip) or not, minus 1/2.
        summed["unclipped_sum"] = tf.cast(norm <= clip, tf.float32) - 0.5
    else:  # order statistics: the runner hands each delta to `combine`
      rebuild(summed, delta)
      result = collections.OrderedDict(
          inner=out.result, contribution=collections.OrderedDict(
              updates=delta, weight=weight / safe))
      return ClientOutput(summed, result, out.state)
    return ClientOutput(summed, out.result, out.state)

  # -- server side ---------------------------------------------------------

  def combines(self, mode: str) -> bool:
    """Whether the runners hand each client's delta to `combine` in `mode`
    rather than adding them up (the order statistics): then each client's
    result is `{'inner': its result, 'contribution': {'updates', 'weight'}}`
    and `split` takes them apart."""
    return (self.mechanism.kind in ORDER_STATISTICS
            and self.inner.update_parts(mode) is not None)

  @staticmethod
  def split(results):
    """(the inner definition's per-client results, the contributions)."""
    return [r["inner"] for r in results], [r["contribution"] for r in results]

  def combine(self, total, contributions: Sequence[Any], mode: str):
    """`total` (the clients' sums, numpy) with the update parts of `mode`
    replaced by W x their coordinate-wise median or trimmed mean per cluster
    over the clients' `contributions` (each `{'updates': delta, 'weight': w}`,
    numpy: its delta in its key's row, w 1 there), W the cluster's summed
    weight in `total` (kept: the host's metrics read it), so that the
    definition's division by W leaves the median."""
    parts = self.inner.update_parts(mode)
    if not contributions:
      return total
    total = collections.OrderedDict(total)
    weights = np.stack([np.asarray(c["weight"], np.float32) for c in contributions])
    flat = [np.stack([np.asarray(a, np.float32) for a in col])
            for col in zip(*(c["updates"] for c in contributions))]
    reduce = (robust_median if self.mechanism.kind == "median" else
              lambda a: trimmed_mean(a, self.mechanism.trim_fraction))
    summed_weight = np.asarray(total[parts.weight], np.float32)
    if weights.ndim == 1:  # one model
      combined = [reduce(a) * summed_weight for a in flat]
    else:  # [clients, K]: per cluster, over its members
      combined = [np.zeros(a.shape[1:], np.float32) for a in flat]
      for j in range(weights.shape[1]):
        members = weights[:, j] > 0
        if members.any():
          for c, a in zip(combined, flat):
            c[j] = reduce(a[members, j]) * summed_weight[j]
    _, rebuild = flatten_parts(total, parts.updates)
    rebuild(total, combined)
    return total

  def server_update(self, state, summed, mode):
    parts = self.inner.update_parts(mode)
    inner_state = self._inner_state(state)
    mech = state[STATE_KEY]
    if parts is None or self.mechanism.kind not in PRIVATE:
      new = collections.OrderedDict(self.inner.server_update(inner_state, summed, mode))
      new[STATE_KEY] = mech
      return new
    summed = collections.OrderedDict(summed)
    flat, rebuild = flatten_parts(summed, parts.updates)
    clip, releases = mech["clip"], mech["releases"]
    z = mech["value_noise_multiplier"]
    noised = [u + clip * z * gaussian(u.shape, self.mechanism.seed, NOISE_STREAM, releases, i)
              for i, u in enumerate(flat)]
    rebuild(summed, noised)
    m = tf.constant(float(self.mechanism.clients_per_round))
    # The public denominator in every row: each cluster's sum over m.
    summed[parts.weight] = m * tf.ones_like(summed[parts.weight])
    new_clip = clip
    if self.mechanism.kind == "dp_adaptive":
      new_clip = adaptive_clip(clip, summed["unclipped_sum"], m, self.mechanism,
                               gaussian([], self.mechanism.seed, COUNT_STREAM, releases, 0))
    new = collections.OrderedDict(self.inner.server_update(inner_state, summed, mode))
    new[STATE_KEY] = collections.OrderedDict(
        clip=new_clip, releases=releases + 1, noise_multiplier=mech["noise_multiplier"],
        value_noise_multiplier=z)
    return new


def clip_scale(norm, clip):
  """min(1, clip / norm): the factor that brings a vector of L2 norm `norm`
  within `clip` (1 for a zero vector); `tf.clip_by_global_norm`'s rule."""
  return tf.minimum(1.0, clip / tf.maximum(norm, 1e-30))


def gaussian(shape, seed: int, stream: int, releases, index: int):
  """Standard normal draws of `shape` for release `releases`, tensor
  `index` of stream `stream`: stateless, so every runner draws the same."""
  counter = tf.cast(releases, tf.int64) * 4096 + index
  seeds = tf.stack([tf.constant(int(seed) * 1_000_003 + stream, tf.int64), counter])
  return tf.random.stateless_normal(shape, seed=seeds, dtype=tf.float32)


def adaptive_clip(clip, unclipped_sum, m, mechanism: Mechanism, draw):
  """The next clip of the quantile rule: b = (sum of b_i + s draw) / m + 1/2
  clamped to [0, 1]; clip exp(-lr (b - q)) (tensorflow_privacy's
  `QuantileEstimatorQuery`, geometric update), at least 0."""
  noised = (unclipped_sum + mechanism.count_stddev * draw) / m + 0.5
  fraction = tf.clip_by_value(noised, 0.0, 1.0)
  new = clip * tf.exp(-mechanism.clip_lr * (fraction - mechanism.clip_quantile))
  return tf.maximum(new, 0.0)


def robust_median(a: np.ndarray) -> np.ndarray:
  """The coordinate-wise median over axis 0 (the mean of the two middle
  values for an even count: numpy's)."""
  return np.median(a, axis=0).astype(np.float32)


def trimmed_mean(a: np.ndarray, fraction: float) -> np.ndarray:
  """The coordinate-wise mean over axis 0 of what is left once floor(fraction
  x n) values are dropped at each end (Yin et al., ICML 2018)."""
  n = a.shape[0]
  t = int(math.floor(fraction * n))
  ordered = np.sort(a, axis=0)
  return ordered[t:n - t].mean(axis=0, dtype=np.float64).astype(np.float32)


def flatten_parts(summed, keys):
  """(the update tensors of `keys` in order, a function putting a same-length
  list back into `summed` under those keys)."""
  sizes = []
  flat: List[Any] = []
  for key in keys:
    value = summed[key]
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    sizes.append((key, len(items), isinstance(value, (list, tuple))))
    flat.extend(items)

  def rebuild(target, values):
    at = 0
    for key, size, listed in sizes:
      chunk = list(values[at:at + size])
      target[key] = chunk if listed else chunk[0]
      at += size
  return flat, rebuild
