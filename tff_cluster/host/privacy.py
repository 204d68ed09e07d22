"""The host's side of the aggregation slot (`--aggregator`): the mechanism a
run's flags name, put around its definition, and the privacy a private run
spends, from Google's `dp-accounting` (docs/privacy.md).

Accounting. The cohort of a round is `--clients_per_round` clients drawn
uniformly without replacement from the N clients with training data
(`driver.sample_clients`): a fixed-size sample, so the accountant is Rényi
DP's for sampling without replacement (Wang, Balle and Kasiviswanathan,
AISTATS 2019; `dp_accounting.SampledWithoutReplacementDpEvent`), which holds
for neighbouring federations that differ in one client's data (replace-one,
N public; `NeighborRel.REPLACE_ONE`). Replacing one client moves the sum of
clipped records by up to 2C, so each release is a Gaussian mechanism of noise
multiplier z / 2 for that relation (dp_adaptive: z the total, the clip
count's share included, as TFF reports it). Each release is one private
round of the definition (`aggregator/releases` of the server state, so a
resumed run counts what an uninterrupted one does). delta defaults to
1 / N^1.1.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Dict, Optional

from tff_cluster.core import mechanisms

INSTALL = "pip install 'tff-cluster[privacy]' (Google's dp-accounting)"


# The algorithms that fill the aggregation slot, for the refusals' "valid".
SLOT_ALGORITHMS = ("fedavg and its server optimizers, fedprox, ifca, hypcluster, and the "
                   "shared part of fedper, fedrep, lg_fedavg, fedbn, ditto, apfl, pfedme")


def _accounting():
  try:
    import dp_accounting  # noqa: PLC0415  (only private runs need it)
  except ImportError:
    raise ValueError(f"a private --aggregator needs the dp-accounting package; {INSTALL}"
                     ) from None
  return dp_accounting


def default_delta(num_clients: int) -> float:
  """1 / N^1.1: below 1/N, so that releasing one client's data whole is not
  within the guarantee."""
  return float(num_clients) ** -1.1


def _one_release(noise_multiplier: float, num_clients: int, cohort: int):
  """One release as a `DpEvent` (see the module docstring)."""
  dp = _accounting()
  # Replace-one: the sum moves by up to twice the clip.
  gaussian = dp.GaussianDpEvent(noise_multiplier / 2.0)
  if cohort >= num_clients:
    return gaussian
  return dp.SampledWithoutReplacementDpEvent(num_clients, cohort, gaussian)


@functools.lru_cache(maxsize=64)
def _release_rdp(noise_multiplier: float, num_clients: int, cohort: int):
  """(orders, the Rényi DP of one release at each): computed once, since
  composing r releases is r times it (the accountant's own rule)."""
  dp = _accounting()
  accountant = dp.rdp.RdpAccountant(neighboring_relation=dp.NeighboringRelation.REPLACE_ONE)
  accountant.compose(_one_release(noise_multiplier, num_clients, cohort))
  return accountant.orders, accountant.rdp


def epsilon(noise_multiplier: float, num_clients: int, cohort: int, releases: int,
            delta: float) -> float:
  """The epsilon of `releases` rounds of the mechanism (see the module
  docstring) at `delta`, as `dp_accounting`'s RDP accountant gives it for
  the composed releases; 0 for none, inf without noise."""
  if releases <= 0:
    return 0.0
  if noise_multiplier <= 0:
    return float("inf")
  orders, rdp = _release_rdp(float(noise_multiplier), int(num_clients), int(cohort))
  dp = _accounting()
  return float(dp.rdp.rdp_privacy_accountant.compute_epsilon(orders, releases * rdp,
                                                             delta)[0])


def calibrate(target_epsilon: float, num_clients: int, cohort: int, rounds: int,
              delta: float) -> float:
  """The smallest total noise multiplier whose `rounds` releases spend at most
  `target_epsilon` at `delta` (a bisection to 1e-4 relative: the reported
  epsilon is then at most the target)."""
  low, high = 1e-3, 1.0
  while epsilon(high, num_clients, cohort, rounds, delta) > target_epsilon:
    low, high = high, high * 2
    if high > 1e6:
      raise ValueError(f"invalid --dp_epsilon={target_epsilon:g}: no noise multiplier "
                       f"up to 1e6 reaches it in {rounds} rounds; valid: a larger epsilon")
  while (high - low) / high > 1e-4:
    mid = (low + high) / 2
    if epsilon(mid, num_clients, cohort, rounds, delta) > target_epsilon:
      low = mid
    else:
      high = mid
  return high * (1 + 1e-6)  # float32 in the state rounds it down by less


def mechanism_for(definition, host, config, data, algo: str):
  """`definition` wrapped by the mechanism `config` names (itself for
  `--aggregator=mean`); one-line ValueError where the algorithm's host or
  server reads each client's update, or the settings do not fit."""
  kind = config.aggregator
  asked = [f"--{name}={getattr(config, name):g}" for name in ("dp_epsilon", "dp_delta")
           if getattr(config, name)]
  if asked and kind not in mechanisms.PRIVATE:
    raise ValueError(f"{asked[0]} asks for privacy, which --aggregator={kind} does not give; "
                     "valid: --aggregator=dp_fixed or dp_adaptive with it, or without it")
  if kind == "mean":
    return definition
  why = getattr(host, "individual_updates", "") or mechanisms.unsupported(definition, kind)
  if why:
    raise ValueError(f"--aggregator={kind} with --algo={algo}: {why}; valid: "
                     "--aggregator=mean, or an algorithm whose server reads only sums of "
                     f"its clients' updates ({SLOT_ALGORITHMS})")
  if kind in mechanisms.PRIVATE and getattr(host, "not_one_release", ""):
    raise ValueError(f"--aggregator={kind} with --algo={algo}: {host.not_one_release}; "
                     "valid: --aggregator=mean, clipped, median or trimmed_mean with it, or "
                     f"a private aggregator with {SLOT_ALGORITHMS}")
  n = int(data.num_training_clients)
  cohort = int(config.clients_per_round or n)
  mechanism = mechanisms.Mechanism(
      kind, clip=config.clip, noise_multiplier=config.noise_multiplier,
      clients_per_round=float(cohort), seed=config.seed,
      clip_quantile=config.clip_quantile, clip_lr=config.clip_lr,
      clip_count_stddev=config.clip_count_stddev, trim_fraction=config.trim_fraction)
  if mechanism.private:
    _accounting()
    if config.dp_epsilon:
      z = calibrate(config.dp_epsilon, n, cohort, config.rounds, delta_of(config, data))
      mechanism = dataclasses.replace(mechanism, noise_multiplier=z)
  return mechanisms.Aggregated(definition, mechanism)


def delta_of(config, data) -> float:
  return float(config.dp_delta) or default_delta(data.num_training_clients)


def _mechanism_state(driver) -> Optional[Dict[str, Any]]:
  definition = getattr(driver, "definition", None)
  if not isinstance(definition, mechanisms.Aggregated) or getattr(driver, "state", None) is None:
    return None
  # The mechanism's four scalars only, not the whole state (every model) each round.
  return driver.runner.numpy_state(driver.state[mechanisms.STATE_KEY])


def columns(driver):
  """The row columns `round_metrics` adds for `driver`'s mechanism."""
  definition = getattr(driver, "definition", None)
  if not isinstance(definition, mechanisms.Aggregated):
    return []
  return ["clip", "dp_epsilon"] if definition.mechanism.private else ["clip"]


def round_metrics(driver) -> Dict[str, float]:
  """A round's row entries of the mechanism: `clip` (the clip now), and for
  a private run `dp_epsilon` (spent so far, at the run's delta)."""
  state = _mechanism_state(driver)
  if state is None:
    return {}
  mechanism = driver.definition.mechanism
  row = {"clip": float(state["clip"])}
  if mechanism.private:
    row["dp_epsilon"] = spent(driver, state)
  return row


def spent(driver, state) -> float:
  """The epsilon spent by the releases `state` (the mechanism's) counts, at
  the noise multiplier it holds (a resumed run's: the one it started with)."""
  mechanism = driver.definition.mechanism
  return epsilon(float(state["noise_multiplier"]), int(driver.data.num_training_clients),
                 int(mechanism.clients_per_round), int(state["releases"]),
                 delta_of(driver.config, driver.data))


def summary(driver) -> Dict[str, Any]:
  """summary.json's entries of the mechanism (empty for --aggregator=mean)."""
  state = _mechanism_state(driver)
  if state is None:
    return {}
  mechanism = driver.definition.mechanism
  out: Dict[str, Any] = {"aggregator": mechanism.kind, "clip_final": float(state["clip"])}
  if mechanism.private:
    out.update({
        "dp_epsilon": spent(driver, state),
        "dp_delta": delta_of(driver.config, driver.data),
        "dp_noise_multiplier": float(state["noise_multiplier"]),
        "dp_value_noise_multiplier": float(state["value_noise_multiplier"]),
        "dp_releases": int(state["releases"]),
        "dp_accountant": ("RDP, sampling without replacement of "
                          f"{int(mechanism.clients_per_round)} of "
                          f"{int(driver.data.num_training_clients)} clients, replace-one"),
    })
  return out
