"""Hyper-parameter declarations: one `HParam` per setting, declared once.

The CLI builds its `--flags` (type, default, help) and their checks from these
declarations; libraries and notebooks use the same checks. This module imports
neither TensorFlow nor TFF, so `--help` and flag errors stay fast.

Three kinds of default, in order of precedence:
  1. the value given (flag or keyword argument);
  2. `task_defaults[task]` of the declaration, or the task's own `defaults`
     entry of the same name (e.g. the task's `rounds`, `client_lr`, `mu`);
  3. `default` of the declaration (`None` = "derived", documented in `help`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, List, Mapping, Optional, Sequence, Tuple


class HParamError(ValueError):
  """An invalid value; the message is one line naming it and what is valid
  (`valid`: that part alone, `setting` and `value`: the declaration and the
  value, where a declaration's check raised it)."""

  def __init__(self, message: str, valid: Optional[str] = None,
               setting: Optional["HParam"] = None, value: Any = None):
    super().__init__(message)
    self.valid = valid
    self.setting = setting  # the declaration whose check refused `value`, if any
    self.value = value


@dataclasses.dataclass(frozen=True)
class HParam:
  """One hyper-parameter.

  Attributes:
    name: flag name (without `--`) and keyword argument name.
    type: int, float, str or bool.
    default: value when neither the user nor the task sets it; `None` means
      "unset/derived" (the help text says from what).
    help: one line for `--help`.
    choices: the valid values of a str setting.
    low, high: valid range (`None` = unbounded); `low_open`/`high_open` make
      that end exclusive. Floats must also be finite.
    limit: the largest size accepted where the range itself has no end (a
      number of rounds, clients, steps): past it a value is a typo that would
      run for days or fill the memory. An integer without `high` or `limit`
      is held to `INT_LIMIT`.
    task_defaults: per-task default overrides, e.g. `{"mnist": 3}`.
    group: heading under which `--help` lists it (an algorithm name, or
      "training" for the settings every algorithm shares).
  """
  name: str
  type: type
  default: Any
  help: str
  choices: Tuple[str, ...] = ()
  low: Optional[float] = None
  high: Optional[float] = None
  low_open: bool = False
  high_open: bool = False
  limit: Optional[int] = None
  task_defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  group: str = "training"

  def valid_text(self) -> str:
    """What is valid, in words (used in error messages and `--help`)."""
    if self.choices:
      return ", ".join(self.choices)
    if self.type is bool:
      return "true or false"
    if self.type is str:
      return "a non-empty text"
    if self.limit is not None:
      return f"{dataclasses.replace(self, limit=None).valid_text()}, at most {self.limit}"
    kind = "an integer" if self.type is int else "a number"
    if self.low is not None and self.high is not None:
      left = "(" if self.low_open else "["
      right = ")" if self.high_open else "]"
      if self.type is int and not self.low_open and not self.high_open:
        return f"{kind} in {_fmt(self.low)}..{_fmt(self.high)}"
      return f"{kind} in {left}{_fmt(self.low)}, {_fmt(self.high)}{right}"
    if self.low is not None:
      return f"{kind} {'>' if self.low_open else '>='} {_fmt(self.low)}"
    if self.high is not None:
      return f"{kind} {'<' if self.high_open else '<='} {_fmt(self.high)}"
    return f"{kind}" if self.type is int else "a finite number"

  def default_for(self, task: Optional[str], task_defaults: Mapping[str, Any] = {}
                  ) -> Any:
    """The default for `task`: declaration override, then the task's own."""
    if task is not None and task in self.task_defaults:
      return self.task_defaults[task]
    if self.name in task_defaults:
      return task_defaults[self.name]
    return self.default

  def check(self, value: Any) -> Any:
    """Returns `value` (converted) or raises `HParamError` (one line)."""
    if value is None:
      return None
    bad = HParamError(f"invalid --{self.name}={_show(value)}; valid: {self.valid_text()}",
                      self.valid_text(), self, value)
    if self.type is bool:
      if not isinstance(value, bool):
        raise bad
      return value
    if self.type is str:
      if not isinstance(value, str) or (self.choices and value not in self.choices):
        raise bad
      return value
    if isinstance(value, bool):
      raise bad
    if self.type is int:
      if isinstance(value, float) and value.is_integer():
        value = int(value)
      if not isinstance(value, int) and not _is_numpy_int(value):
        raise bad
      value = int(value)
    else:
      try:
        value = float(value)
      except (TypeError, ValueError):
        raise bad from None
      if not math.isfinite(value):
        raise bad
    if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
      raise bad
    if self.high is not None and (value > self.high or (self.high_open and value == self.high)):
      raise bad
    if self.limit is not None and value > self.limit:
      raise bad
    if self.type is int and self.high is None and self.limit is None and value > INT_LIMIT:
      valid = f"{self.valid_text()}, at most {INT_LIMIT} (every integer setting's limit)"
      raise HParamError(f"invalid --{self.name}={_show(value)}; valid: {valid}", valid, self,
                        value)
    return value


def _fmt(x: float) -> str:
  return str(int(x)) if float(x).is_integer() else str(x)


def _show(value: Any) -> str:
  return str(value).lower() if isinstance(value, bool) else str(value)


def _is_numpy_int(value: Any) -> bool:
  return type(value).__module__ == "numpy" and "int" in type(value).__name__


# ---------------------------------------------------------------------------
# Upper limits of the sizes, checked with the flags before any work. No
# experiment of the papers reproduced here comes near them (the longest runs
# 800 rounds, the largest federation 3,400 writers, the most local work 20
# epochs); a value past them is a typo, and would run for days or fill the
# memory before the first round. docs/cli.md states them.

INT_LIMIT = 2**31 - 1  # any integer setting: TensorFlow's int32 counters and shapes
MAX_ROUNDS = 1_000_000
MAX_CLIENTS = 1_000_000  # --num_clients and --clients_per_round
MAX_LOCAL_EPOCHS = 10_000
MAX_LOCAL_STEPS = 10_000_000
MAX_BATCH_SIZE = 1_000_000
MAX_WORKERS = 10_000  # --ray_workers (actors) and --client_chunk (clients side by side)
MAX_MODELS = 10_000  # --num_groups, --ensemble_size: each one a model held in memory

# ---------------------------------------------------------------------------
# Settings every algorithm shares (the local solver and the round loop).
# `None` defaults come from the task (`TaskSpec.defaults`).

ROUNDS = HParam("rounds", int, None, "Communication rounds.", low=1, limit=MAX_ROUNDS)
CLIENTS_PER_ROUND = HParam("clients_per_round", int, None,
                           "Clients sampled per round.", low=1, limit=MAX_CLIENTS)
LOCAL_EPOCHS = HParam("local_epochs", int, None, "Local epochs per round; exclusive "
                      "with --local_steps.", low=1, limit=MAX_LOCAL_EPOCHS)
LOCAL_STEPS = HParam("local_steps", int, None, "Local work as a number of mini-batch "
                     "steps per round (cycling through reshuffled epochs, restarted every "
                     "round); exclusive with --local_epochs (default: unset, the epochs "
                     "apply).", low=1, limit=MAX_LOCAL_STEPS)
BATCH_SIZE = HParam("batch_size", int, None, "Local mini-batch size.",
                    low=1, limit=MAX_BATCH_SIZE)
CLIENT_LR = HParam("client_lr", float, None, "Local SGD learning rate.",
                   low=0, low_open=True)
LR_DECAY = HParam("lr_decay", float, 1.0, "Per-round multiplier of the client "
                  "learning rate: round t uses client_lr * lr_decay^(t-1).",
                  low=0, low_open=True, high=1)
CLIENT_MOMENTUM = HParam("client_momentum", float, 0.0, "Heavy-ball momentum beta of "
                         "local SGD (v <- beta v + g; w <- w - lr v); 0 = plain SGD.",
                         low=0, high=1, high_open=True)
CLIENT_STATE = HParam("client_state", str, "persist", "Client momentum buffer between "
                      "rounds: persist (kept per client) or reset (zero each round).",
                      choices=("persist", "reset"))
SEED = HParam("seed", int, 0, "Seed of data generation/partition, model init, client "
              "sampling and local shuffles.", low=0, high=2**31 - 1)
EVAL_EVERY = HParam("eval_every", int, 1, "Evaluate every this many rounds (and the "
                    "last).", low=1, limit=MAX_ROUNDS)
DIVERGENCE_RATIO = HParam(
    "divergence_ratio", float, 100.0, "Stop the run as diverged when a round's training "
    "loss exceeds this many times the initial model's loss on the round's clients "
    "(their training data, measured before training); 0 = only NaN and infinities "
    "stop it.", low=0)

# How the clients' updates are combined (docs/privacy.md; tff_cluster.core.mechanisms).
AGGREGATOR = HParam(
    "aggregator", str, "mean", "How the clients' updates are combined: mean (the "
    "algorithm's own weighted mean), clipped (each update's L2 norm clipped to --clip, "
    "then the mean), dp_fixed / dp_adaptive (DP-FedAvg: clipped to --clip or to an "
    "adaptive clip, uniform weights, Gaussian noise, (epsilon, delta) reported), median "
    "or trimmed_mean (coordinate-wise, per cluster).",
    choices=("mean", "clipped", "dp_fixed", "dp_adaptive", "median", "trimmed_mean"),
    group="aggregation")
CLIP = HParam("clip", float, 1.0, "L2 norm each client's update is clipped to "
              "(--aggregator=clipped, dp_fixed; dp_adaptive's starting clip).",
              low=0, low_open=True, group="aggregation")
NOISE_MULTIPLIER = HParam(
    "noise_multiplier", float, 1.0, "z of --aggregator=dp_fixed/dp_adaptive: the Gaussian "
    "noise's stddev over the clip (dp_adaptive: the total, its clip estimate's share "
    "included, as TFF's); ignored when --dp_epsilon is set.", low=0, group="aggregation")
DP_EPSILON = HParam(
    "dp_epsilon", float, 0.0, "Target epsilon of a private run: the noise multiplier is "
    "calibrated so that --rounds rounds spend it at --dp_delta (0 = use "
    "--noise_multiplier).", low=0, group="aggregation")
DP_DELTA = HParam("dp_delta", float, 0.0, "delta of the reported (epsilon, delta); 0 = "
                  "1 / N^1.1, N the clients with training data.", low=0, high=1,
                  high_open=True, group="aggregation")
CLIP_QUANTILE = HParam("clip_quantile", float, 0.5, "dp_adaptive: the fraction of "
                       "updates the clip aims to leave unclipped.", low=0, high=1,
                       group="aggregation")
CLIP_LR = HParam("clip_lr", float, 0.2, "dp_adaptive: the clip's geometric learning "
                 "rate (clip <- clip exp(-lr (unclipped fraction - quantile))).", low=0,
                 group="aggregation")
CLIP_COUNT_STDDEV = HParam("clip_count_stddev", float, 0.0, "dp_adaptive: the stddev of "
                           "the noise on the count of unclipped updates; 0 = 0.05 x "
                           "--clients_per_round (TFF's default).", low=0,
                           group="aggregation")
TRIM_FRACTION = HParam("trim_fraction", float, 0.1, "trimmed_mean: the fraction of a "
                       "cluster's updates dropped at each end, per coordinate.", low=0,
                       high=0.5, high_open=True, group="aggregation")
AGGREGATION = (AGGREGATOR, CLIP, NOISE_MULTIPLIER, DP_EPSILON, DP_DELTA, CLIP_QUANTILE,
               CLIP_LR, CLIP_COUNT_STDDEV, TRIM_FRACTION)

TRAINING = (ROUNDS, CLIENTS_PER_ROUND, LOCAL_EPOCHS, LOCAL_STEPS, BATCH_SIZE, CLIENT_LR,
            LR_DECAY, CLIENT_MOMENTUM, CLIENT_STATE, SEED, EVAL_EVERY, DIVERGENCE_RATIO,
            *AGGREGATION)

# ---------------------------------------------------------------------------
# Shared names: every algorithm that has the concept declares these objects
# (possibly `dataclasses.replace`d with its own default/help), never a twin.

MU = HParam("mu", float, None, "Proximal coefficient mu of the local objective "
            "F_k(w) + (mu/2)||w - w_start||^2.", low=0)
NUM_GROUPS = HParam("num_groups", int, 5, "m: the number of groups/clusters of a "
                    "clustered algorithm (the data's true cluster count is "
                    "--task_arg=num_clusters).", low=1, limit=MAX_MODELS,
                    task_defaults={"mnist": 3})
ENSEMBLE_SIZE = HParam("ensemble_size", int, 1, "Independent runs combined at test "
                       "time.", low=1, limit=MAX_MODELS)

# ---------------------------------------------------------------------------
# Runners.

# Options several algorithm folders declare (each folder's `SPECS` lists them).
MU_POSITIVE = dataclasses.replace(MU, low=0.0, low_open=True)
CLIENT_WEIGHTING = HParam(
    "client_weighting", str, "processed", "FedAvg's client weights: the examples "
    "processed in the round (McMahan et al.; with local epochs proportional to the "
    "data) or the client's training samples (FedBase's, whatever --local_steps).",
    choices=("processed", "samples"), group="fedavg")
SERVER_LR = HParam("server_lr", float, 1.0, "eta_s: the server's learning rate "
                   "(SlowMo's slow learning rate alpha).", low=0, low_open=True,
                   group="server momentum")
SERVER_MOMENTUM = HParam("server_momentum", float, 0.9, "beta: the server's momentum.",
                         low=0, high=1, high_open=True, group="server momentum")
HEAD_LAYERS = HParam("head_layers", int, 1, "The head: the model's last K layers that "
                     "hold weights (the body: the layers below); refused where the model "
                     "has fewer than K + 1.", low=1, limit=1000, group="personalized")
HEAD_NAMES = HParam("head_names", str, "", "The head by layer names (comma-separated; "
                    "given, it replaces --head_layers). An unknown name is refused with "
                    "the model's layers listed.", group="personalized")
HEAD = (HEAD_LAYERS, HEAD_NAMES)


def grouped(name: str, *declared: HParam) -> Tuple[HParam, ...]:
  """The declarations, listed under `name` in `--help` (the shared concepts
  `mu`, `num_groups` and `ensemble_size` keep theirs)."""
  shared = {MU.name, NUM_GROUPS.name, ENSEMBLE_SIZE.name}
  return tuple(d if d.name in shared else dataclasses.replace(d, group=name)
               for d in declared)


RUNNERS = ("local", "tff", "ray")
RUNNER = HParam("runner", str, "local", "Execution: local (in-process, XLA-compiled where "
                "that pays, on a GPU when TensorFlow sees one; any stack), tff (TFF "
                "computations on TFF's C++ runtime, the reference the parity tests hold "
                "local to; needs the TFF stack, the tff extra) or ray (local's client "
                "loop sharded over Ray actors, on this machine or a Ray cluster; the ray "
                "extra, today's stack).",
                choices=RUNNERS, group="runner")
JIT = HParam("jit", str, "auto", "local runner: XLA-compile the client loop: auto "
             "(by model family and device, see README), on, off.",
             choices=("auto", "on", "off"), group="runner")
CLIENT_BATCHING = HParam("client_batching", str, "auto", "local and ray runners: train "
                         "a round's clients one at a time (sequential) or side by side in "
                         "chunks (parallel: any Keras 3 model whose layers have side-by-side "
                         "forms; tf_keras: Dense chains); auto picks per device and model "
                         "kind from measurements (docs/runners.md).",
                         choices=("auto", "sequential", "parallel"), group="runner")
CLIENT_CHUNK = HParam("client_chunk", int, 4, "client_batching=parallel: clients trained "
                      "side by side in one chunk (fewer are taken where a chunk's estimated "
                      "memory would pass a quarter of the memory available).", low=1,
                      limit=MAX_WORKERS, group="runner")
RAY_WORKERS = HParam("ray_workers", int, None, "ray runner: the number of actors, each "
                     "owning a contiguous shard of the clients (default: this machine's "
                     "CPU count, at most one per client).", low=1, limit=MAX_WORKERS,
                     group="runner")
RAY_ADDRESS = HParam("ray_address", str, None, "ray runner: HOST:PORT of a running Ray "
                     "cluster's head (ray start --head), or auto (default: RAY_ADDRESS where set, "
                     "else a Ray instance started on this machine for the run and stopped "
                     "after it).",
                     group="runner")
TFF_WORKERS = HParam("tff_workers", str, None, "tff runner: HOST:PORT[,HOST:PORT...] of TFF "
                     "workers (python -m tff_cluster.runners.tff.worker --port=P on each host) to split "
                     "each round's clients over (default: one worker the run starts and stops).",
                     group="runner")
TFF_WORKER_GRACE = HParam("tff_worker_grace", float, None, "tff runner with --tff_workers: "
                          "seconds a worker may stay unreachable before the run stops with "
                          "an error (default: 60).", low=0.0, group="runner")
TFF_SUBROUND_TIMEOUT = HParam("tff_subround_timeout", float, None, "tff runner with "
                              "--tff_workers: seconds a worker may take for its share of a "
                              "call before it is taken as frozen (default: no limit).",
                              low=0.0, group="runner")

RUNNER_HPARAMS = (RUNNER, JIT, CLIENT_BATCHING, CLIENT_CHUNK, RAY_WORKERS, RAY_ADDRESS,
                  TFF_WORKERS, TFF_WORKER_GRACE, TFF_SUBROUND_TIMEOUT)


def parse_host_ports(text: str, flag: str) -> List[str]:
  """`HOST:PORT[,HOST:PORT...]` -> the addresses; ValueError (one line naming
  `--flag`) when there is none or one is not HOST:PORT with a port in 1..65535."""
  addresses = [a.strip() for a in text.split(",") if a.strip()]

  def valid(address):
    host, _, port = address.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536

  if not addresses or not all(map(valid, addresses)):
    raise ValueError(f"invalid --{flag}={text}; valid: HOST:PORT[,HOST:PORT...]")
  return addresses


def resolve(declared: Sequence[HParam], given: Mapping[str, Any], task: Optional[str],
            task_defaults: Mapping[str, Any] = {}) -> dict:
  """Applies defaults and checks every declared value. Raises `HParamError`."""
  out = {}
  for hp in declared:
    value = given.get(hp.name)
    if value is None:
      value = hp.default_for(task, task_defaults)
    out[hp.name] = hp.check(value)
  return out


def format_value(value: Any) -> str:
  """A value as a flag or `--task_arg` text (booleans as true/false)."""
  return _show(value)


# ---------------------------------------------------------------------------
# The server optimizer on the pseudo-gradient w_t - w_bar (FedAvg's, and per
# cluster IFCA's, HypCluster's, WeCFL's and FeSEM's): SGD at --server_lr, or
# FedOpt's adaptive steps (Reddi et al., "Adaptive Federated Optimization",
# ICLR 2021) in one of two forms: the authors' code's (the default) or
# Flower's strategies'. beta1, beta2 and tau default to the authors' code's
# values (its Keras beta defaults, its recommended epsilon 1e-3); the sources,
# with file and commit: docs/algorithms/fedadam.md.

SERVER_OPTIMIZERS = ("sgd", "adam", "yogi", "adagrad")
SERVER_OPTIMIZER = HParam(
    "server_optimizer", str, "sgd", "The server's optimizer on the pseudo-gradient "
    "w_t - w_bar: sgd (w <- w - server_lr d; server_lr 1 = the weighted mean) or FedOpt's "
    "adam, yogi, adagrad (Reddi et al. 2021; --server_opt_form, --server_lr, "
    "--server_beta1, --server_beta2, --server_tau).", choices=SERVER_OPTIMIZERS,
    group="server optimizer")
SERVER_OPT_FORM = HParam(
    "server_opt_form", str, "authors", "The form of FedOpt's adam, yogi, adagrad: "
    "authors (what the authors' code runs: Keras's Adam and Adagrad, their Yogi; "
    "bias-corrected, accumulators from 0, adagrad without a first moment) or flower "
    "(Flower's strategies: no bias correction, m and v from 0).",
    choices=("authors", "flower"), group="server optimizer")
SERVER_BETA1 = HParam("server_beta1", float, 0.9, "FedOpt's beta1: decay of the server's "
                      "first moment m (adam, yogi; adagrad has none).", low=0, high=1,
                      high_open=True, group="server optimizer")
SERVER_BETA2 = HParam("server_beta2", float, 0.999, "FedOpt's beta2: decay of the server's "
                      "second moment v (adam, yogi).", low=0, high=1, high_open=True,
                      group="server optimizer")
SERVER_TAU = HParam("server_tau", float, 1e-3, "FedOpt's tau (the authors' epsilon): the "
                    "server step is m / (sqrt(v) + tau).",
                    low=0, low_open=True, group="server optimizer")
SERVER_OPTIMIZER_OPTIONS = (SERVER_OPTIMIZER, SERVER_OPT_FORM, SERVER_LR, SERVER_BETA1,
                            SERVER_BETA2, SERVER_TAU)
