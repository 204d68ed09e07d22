"""Seconds per training round of the `tff` and `local` runners (and baselines).

What it measures
----------------
The median wall-clock seconds of one round -- the call `driver.run_round(r,
sampled)`, i.e. the sampled clients' local training plus aggregation and the
server update, WITHOUT evaluation -- over `--rounds_timed` rounds that follow
`--warmup` untimed warm-up rounds (tracing / XLA compilation / worker start-up
happen there). FedGroup's group cold start (pre-training of min(alpha*m, N)
clients and the clustering) runs in `driver.setup()` and is excluded from the
round timings (its duration is reported as `setup_s`).

Two extra columns make the numbers easier to trust:
  * steady (`--rerun`, default on): the timed rounds are then run a second
    time with the same round numbers and clients, so every shape and value
    the runner compiles for has been seen; `steady_median_s_per_round` is the
    time of a round with no compilation in it. (The local runner pads every
    client to the largest step count and trains the round's clients in one
    compiled call, so it compiles once per mode; the two columns should
    agree.)
  * other_cpu_cores: the mean number of cores that processes other than this
    one (and its TFF worker / subprocesses) kept busy during the timed
    rounds. On a shared machine the script waits (in total at most
    `--quiet_budget_s`) for a quiet moment before each timed round.
The library is imported from a copy of `tff_cluster/` and `tasks/` taken at
start (`--library=worktree`) or from a git commit (`--library=COMMIT`), so
edits made while it runs cannot affect it.

Every configuration sees the same clients: round r samples
`loop.sample_clients(rng, N, 20)` with
`rng = np.random.default_rng(np.random.SeedSequence([0, 7]))`, as the
training loop does, and the clients' shuffles are seeded by
`schedule.client_seed(0, r, k)`.

Settings (`--tasks`):
  synthetic  Synthetic(1,1), 100 clients, MCLR 60->10; 20 clients/round,
             10 local epochs, batch 10, lr 0.01.
  femnist    LEAF FEMNIST (51 writers, `--femnist_dir`), MLP 784-512-62;
             20 clients/round, 10 local epochs, batch 10, lr 0.003.
  fmnist_lenet5  the same Fashion-MNIST clients with LeNet-5 (61,706
             parameters, no BatchNorm), so that the local runner's jit=on and
             jit=off can both be measured on a CNN.
  fmnist     Fashion-MNIST pathological non-IID (200 clients x 2 classes,
             `--fmnist_dir`), FMNIST CNN (2 x conv5x5 + BatchNorm); 20
             clients/round, only 1 local epoch (`--cnn_local_epochs`) because
             CNN steps are slow on a CPU, batch 10, lr 0.01;
             `--cnn_rounds_timed` (default 5) timed rounds.
Algorithms (`--algorithms`): fedavg, fedprox (mu = 1.0), fedgroup (m = 5 groups,
pretrain_scale alpha = 20).
Runners (`--runners`): `tff` (TFF's C++ runtime), `local_on` (local runner,
jit='on': the client loop XLA-compiled), `local_off` (local runner, jit='off').
What jit='auto' resolves to (`driver.describe()['jit']`) is recorded per task.
The FMNIST CNN has BatchNorm, for which the library refuses jit='on'; at most
fedavg is tried there (`--cnn_jit_on_rounds` timed rounds) and the refusal is
written to the CSV as a note.

Baselines (`--baselines`):
  tff_learning  TFF's own `tff.learning.algorithms.build_weighted_fed_avg`
                (Keras model via `tff.learning.models.from_keras_model`, client
                SGD `build_sgdm(lr)`, server `build_sgdm(1.0)`, same client
                datasets `schedule.client_dataset`, same initial weights)
                on synthetic and femnist, inside `runtime.tff_runtime()`.

FLOPs
-----
Training FLOPs of a round are counted analytically:

  FLOPs/round = 6 * MACs * E,   E = sum_{k in sampled} local_epochs * n_k

with MACs the multiply-adds of one forward pass of one example (forward =
2 MACs, backward = 4 MACs per example; biases, activations, BatchNorm,
pooling and the optimizer update are not counted), n_k client k's number of
training samples, E averaged over the timed rounds (the same clients for
every runner). MACs per layer: Dense in*out; Conv2D
H_out*W_out*k*k*C_in*C_out. Hence MCLR 60->10: 600; MLP 784-512-62:
784*512 + 512*62 = 433,152; FMNIST CNN: 28*28*25*1*16 + 14*14*25*16*32 +
7*7*32*10 = 313,600 + 2,508,800 + 15,680 = 2,838,080 (read from the Keras
model, `model_macs`). Achieved GFLOP/s = FLOPs/round / median s/round, shown
beside the rate of one large `tf.linalg.matmul` (`--matmul_n` x `--matmul_n`
float32, 2 n^3 FLOPs, median of 10 runs after warm-up) on the same machine.

How to run
----------
From the repository root, in the TFF stack's environment (the `tff` runner
and TFF's own FedAvg need it; see the README's "Install")::

    .venv-tff/bin/python benchmarks/runner_speed.py

or on today's stack (no TFF: the `local` modes only; each CSV row records its
TensorFlow version, so the two stacks' files can be compared side by side)::

    python benchmarks/runner_speed.py --output=benchmarks/results/runner_speed_today.csv
    # parts only, e.g.:
    .venv-tff/bin/python benchmarks/runner_speed.py --tasks=synthetic \
        --algorithms=fedavg --runners=tff,local_on --baselines=

It prints a markdown table of the medians and a ratio table, and writes every
measurement to `--output` (default benchmarks/results/runner_speed.csv);
progress goes to stderr. A full run takes about 20 minutes on 2 CPU cores
(more if it has to wait for other processes). Every TFF worker this script
starts is stopped (`tff_cluster.runners.tff.runtime`); leftovers are reported.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TASK_SETTINGS = {
    # name -> (client_lr, local_epochs flag, data_dir flag or None, model label)
    "synthetic": dict(lr=0.01, epochs="local_epochs", data_dir=None, num_clients=100,
                      model="MCLR 60->10"),
    "femnist": dict(lr=0.003, epochs="local_epochs", data_dir="femnist_dir",
                    num_clients=None, model="MLP 784-512-62"),
    "fmnist": dict(lr=0.01, epochs="cnn_local_epochs", data_dir="fmnist_dir",
                   num_clients=None, model="FMNIST CNN"),
    # The same data with LeNet-5 (no BatchNorm), so that XLA can be measured on a CNN.
    "fmnist_lenet5": dict(lr=0.01, epochs="cnn_local_epochs", data_dir="fmnist_dir",
                          num_clients=None, model="LeNet-5", task="fmnist",
                          model_name="lenet5"),
}
ALGORITHMS = ("fedavg", "fedprox", "fedgroup")
ALGO_OPTIONS = {"fedavg": {}, "fedprox": {"mu": 1.0},
                "fedgroup": {"num_groups": 5, "pretrain_scale": 20.0}}
RUNNERS = {"tff": ("tff", "auto"), "local_on": ("local", "on"),
           "local_off": ("local", "off")}
CNN_TASKS = ("fmnist", "fmnist_lenet5")
BASELINE_TASKS = ("synthetic", "femnist")
CLIENTS_PER_ROUND = 20
TF_VERSION = [""]  # set by main: each CSV row says which TensorFlow measured it
BATCH_SIZE = 10
SEED = 0

CSV_COLUMNS = ("task", "algorithm", "runner", "jit", "tf_version", "code", "jit_auto_resolves_to", "status",
               "median_s_per_round", "mean_s_per_round", "min_s", "max_s", "rounds_timed",
               "warmup", "setup_s", "first_round_s", "examples_per_round",
               "macs_per_example", "flops_per_round", "gflops_per_s",
               "matmul_gflops_per_s", "pct_of_matmul", "other_cpu_cores",
               "steady_median_s_per_round", "steady_gflops_per_s", "steady_other_cpu_cores",
               "last_train_loss", "round_seconds", "steady_round_seconds", "note")


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--tasks", default="synthetic,femnist,fmnist,fmnist_lenet5")
  p.add_argument("--algorithms", default=",".join(ALGORITHMS))
  tff_stack = _tff_stack()
  p.add_argument("--runners", default=",".join(RUNNERS) if tff_stack else "local_on,local_off",
                 help="comma list of tff, local_on, local_off (default: all on the TFF "
                      "stack; local_on,local_off on today's stack, which has no TFF)")
  p.add_argument("--baselines", default="tff_learning" if tff_stack else "",
                 help="comma list of tff_learning (empty: none; the default on the TFF "
                      "stack only)")
  p.add_argument("--rounds_timed", type=int, default=5)
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument("--local_epochs", type=int, default=10,
                 help="local epochs of synthetic and femnist")
  p.add_argument("--cnn_local_epochs", type=int, default=1)
  p.add_argument("--cnn_rounds_timed", type=int, default=5,
                 help="timed rounds of the CNN task (its rounds are slow on CPU)")
  p.add_argument("--cnn_jit_on_rounds", type=int, default=2,
                 help="timed rounds of local jit=on on the CNN task (fedavg only)")
  p.add_argument("--femnist_dir", default="../shared/data/femnist_leaf",
                 help="LEAF FEMNIST dir (relative to the repo root or absolute)")
  p.add_argument("--fmnist_dir", default="../shared/data/fashion_mnist")
  p.add_argument("--matmul_n", type=int, default=2048)
  p.add_argument("--output", default="benchmarks/results/runner_speed.csv")
  p.add_argument("--library", default="worktree",
                 help="code measured: 'worktree' (a copy of tff_cluster/ and tasks/ taken "
                      "at start) or a git commit (exported with git archive)")
  p.add_argument("--rerun", default=True, action=argparse.BooleanOptionalAction,
                 help="also re-run the timed rounds (same round numbers and clients, "
                      "everything compiled): steady-state seconds per round")
  p.add_argument("--quiet_budget_s", type=float, default=240.0,
                 help="total seconds we may wait for other processes to leave the "
                      "CPUs idle before timed rounds (0: never wait)")
  p.add_argument("--quiet_threshold", type=float, default=0.25,
                 help="'idle' = other processes use fewer cores than this")
  args = p.parse_args(argv)
  split = lambda s: [x for x in s.split(",") if x]  # noqa: E731
  args.tasks = split(args.tasks)
  args.algorithms = split(args.algorithms)
  args.runners = split(args.runners)
  args.baselines = split(args.baselines)
  for name, values, valid in (("tasks", args.tasks, TASK_SETTINGS),
                              ("algorithms", args.algorithms, ALGORITHMS),
                              ("runners", args.runners, RUNNERS),
                              ("baselines", args.baselines, ("tff_learning",))):
    bad = [v for v in values if v not in valid]
    if bad:
      p.error(f"invalid --{name} {bad}; valid: {', '.join(valid)}")
  needs_tff = [f"--runners={r}" for r in args.runners if r == "tff"] + [
      f"--baselines={b}" for b in args.baselines]
  if needs_tff and not tff_stack:
    p.error(f"{', '.join(needs_tff)} needs TensorFlow Federated, which this stack lacks "
            f"(Python {sys.version_info[0]}.{sys.version_info[1]}); valid here: "
            "--runners=local_on,local_off --baselines=")
  if args.rounds_timed < 1 or args.warmup < 0:
    p.error("--rounds_timed must be >= 1 and --warmup >= 0")
  return args


def _tff_stack() -> bool:
  """Whether TensorFlow Federated can be imported here (the TFF stack)."""
  import importlib.util
  return importlib.util.find_spec("tensorflow_federated") is not None


def _stop_tff_workers():
  if _tff_stack():
    from tff_cluster.runners.tff import runtime
    runtime.stop()


def log(*parts):
  print(*parts, file=sys.stderr, flush=True)


def abs_path(path: str) -> str:
  return path if os.path.isabs(path) else os.path.normpath(os.path.join(REPO_ROOT, path))


# ---------------------------------------------------------------------------
# FLOPs and the machine's matmul rate.


def model_macs(model) -> int:
  """Multiply-adds of one forward pass of one example (Dense, Conv2D and LSTM;
  an Embedding is a lookup)."""
  import numpy as np
  import tensorflow as tf
  total = 0
  for layer in model.layers:
    if isinstance(layer, tf.keras.Model):
      total += model_macs(layer)
    elif isinstance(layer, tf.keras.layers.Dense):
      fan_in, fan_out = layer.kernel.shape
      total += int(fan_in) * int(fan_out)
    elif isinstance(layer, tf.keras.layers.Conv2D):
      kh, kw, c_in, c_out = layer.kernel.shape
      _, h_out, w_out, _ = layer.output.shape
      total += int(h_out) * int(w_out) * int(kh) * int(kw) * int(c_in) * int(c_out)
    elif isinstance(layer, tf.keras.layers.LSTM):
      steps, features = int(layer.input.shape[1]), int(layer.input.shape[-1])
      total += steps * 4 * int(layer.units) * (features + int(layer.units))
    elif layer.weights and not isinstance(layer, (tf.keras.layers.BatchNormalization,
                                                  tf.keras.layers.Embedding)):
      raise ValueError(f"model_macs: no MAC count for layer {layer.name} "
                       f"({type(layer).__name__})")
  del np
  return total


def matmul_gflops(n: int, runs: int = 10) -> float:
  import tensorflow as tf
  a = tf.random.stateless_normal([n, n], seed=[1, 2], dtype=tf.float32)
  b = tf.random.stateless_normal([n, n], seed=[3, 4], dtype=tf.float32)
  for _ in range(3):
    tf.linalg.matmul(a, b).numpy()
  times = []
  for _ in range(runs):
    t0 = time.perf_counter()
    c = tf.linalg.matmul(a, b)
    _ = c[0, 0].numpy()  # CPU eager ops are synchronous; this only makes sure
    times.append(time.perf_counter() - t0)
  return 2.0 * n ** 3 / statistics.median(times) / 1e9


# ---------------------------------------------------------------------------
# CPU used by other processes while we time (the machine may be shared).

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_table():
  """pid -> (ppid, cpu ticks incl. reaped children, cmdline) of every process."""
  table = {}
  for pid in os.listdir("/proc"):
    if not pid.isdigit():
      continue
    try:
      with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, IndexError):
      continue
    ppid = int(fields[1])
    ticks = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    table[int(pid)] = (ppid, ticks, cmd)
  return table


def _ours(table) -> set:
  """This process and its descendants."""
  me, ours = os.getpid(), set()
  for pid in table:
    p, seen = pid, 0
    while p and p in table and seen < 64:
      if p == me:
        ours.add(pid)
        break
      p, seen = table[p][0], seen + 1
  return ours


def _busy_ticks() -> int:
  with open("/proc/stat") as f:
    v = [int(x) for x in f.readline().split()[1:]]
  return sum(v) - v[3] - (v[4] if len(v) > 4 else 0)  # minus idle and iowait


class CpuMeter:
  """Average CPU cores busy with processes other than ours (and their children)."""

  def __enter__(self):
    self._t = time.perf_counter()
    self._busy = _busy_ticks()
    table = _proc_table()
    self._ours0 = {p: table[p][1] for p in _ours(table)}
    return self

  def __exit__(self, *exc):
    wall = time.perf_counter() - self._t
    busy = _busy_ticks() - self._busy
    table = _proc_table()
    ours = sum(table[p][1] - self._ours0.get(p, 0) for p in _ours(table))
    self.other_cores = max(busy - ours, 0) / _TICK / max(wall, 1e-9)
    return False


# ---------------------------------------------------------------------------
# Timing helpers.


def schedule(num_clients: int, num_rounds: int):
  """The sampled clients of rounds 1..num_rounds (the training loop's sampling)."""
  import numpy as np
  from tff_cluster.host.driver import sample_clients
  rng = np.random.default_rng(np.random.SeedSequence([SEED, 7]))
  return [sample_clients(rng, num_clients, CLIENTS_PER_ROUND)
          for _ in range(num_rounds)]


class Quiet:
  """Waits (within a total budget) until other processes leave the CPUs idle.

  The machine may be shared; before each timed round we wait up to
  `per_round_s` seconds for a 0.5 s window in which processes other than ours
  use less than `threshold` cores, then time the round anyway.
  """

  def __init__(self, budget_s: float = 0.0, threshold: float = 0.25,
               per_round_s: float = 10.0):
    self.budget_s = budget_s
    self.threshold = threshold
    self.per_round_s = per_round_s
    self.waited_s = 0.0

  def wait(self) -> float:
    waited = 0.0
    while self.budget_s > 0 and waited < self.per_round_s:
      with CpuMeter() as meter:
        time.sleep(0.5)
      if meter.other_cores < self.threshold:
        break
      waited += 0.5
      self.budget_s -= 0.5
    self.waited_s += waited
    return waited


QUIET = Quiet()


def time_rounds(run_round, sampled_rounds, warmup: int, rerun: bool = True,
                tag: str = "") -> Dict[str, Any]:
  """Runs `run_round(r, sampled)` for every round; times those after warm-up.

  With `rerun`, the timed rounds are then run again with the same round
  numbers and clients (everything compiled by now): the steady-state time.
  """
  seconds, losses, other = [], [], []
  order = list(enumerate(sampled_rounds, start=1))
  if rerun:
    order += order[warmup:]
  for i, (r, sampled) in enumerate(order):
    timed = i >= warmup
    if timed:
      QUIET.wait()
    with CpuMeter() as meter:
      t0 = time.perf_counter()
      out = run_round(r, sampled)
      seconds.append(time.perf_counter() - t0)
    other.append(meter.other_cores)
    losses.append(out.get("train_loss") if isinstance(out, dict) else None)
    kind = ("warm-up" if not timed else "timed" if i < len(sampled_rounds) else "re-run")
    log(f"    {tag}round {r} ({kind}): {seconds[-1]:.3f} s  train_loss={losses[-1]}"
        f"  other processes: {other[-1]:.2f} cores")
  n = len(sampled_rounds)
  timed, again = seconds[warmup:n], seconds[n:]
  out = dict(median_s_per_round=statistics.median(timed),
             mean_s_per_round=statistics.fmean(timed), min_s=min(timed), max_s=max(timed),
             rounds_timed=len(timed), warmup=warmup, first_round_s=seconds[0],
             other_cpu_cores=statistics.fmean(other[warmup:n]),
             last_train_loss=losses[n - 1],
             round_seconds=";".join(f"{x:.4f}" for x in seconds[:n]))
  if again:
    out.update(steady_median_s_per_round=statistics.median(again),
               steady_other_cpu_cores=statistics.fmean(other[n:]),
               steady_round_seconds=";".join(f"{x:.4f}" for x in again))
  return out


def examples_per_round(data, sampled_rounds, epochs: int, warmup: int) -> float:
  sizes = data.num_train_samples()
  timed = sampled_rounds[warmup:]
  return statistics.fmean(float(epochs * sizes[list(s)].sum()) for s in timed)


# ---------------------------------------------------------------------------
# The current library.


def data_options(name: str, args) -> dict:
  """The `DataOptions` keywords of setting `name` (seed, clients, data dir)."""
  setting = TASK_SETTINGS[name]
  options = dict(seed=SEED)
  if setting["num_clients"]:
    options["num_clients"] = setting["num_clients"]
  if setting["data_dir"]:
    options["data_dir"] = abs_path(getattr(args, setting["data_dir"]))
  return options


def load_task(name: str, args):
  from tff_cluster import tasks
  from tff_cluster.spec.task import DataOptions
  setting = TASK_SETTINGS[name]
  options = data_options(name, args)
  task = tasks.get_task(setting.get("task", name)).with_model(setting.get("model_name"))
  return task, task.load_data(DataOptions(**options))


def make_config(name: str, args, runner: str, jit: str, rounds: int):
  from tff_cluster.host.driver import TrainingConfig
  from tff_cluster.runners.config import RunnerConfig
  setting = TASK_SETTINGS[name]
  return TrainingConfig(
      rounds=rounds, clients_per_round=CLIENTS_PER_ROUND,
      local_epochs=getattr(args, setting["epochs"]), batch_size=BATCH_SIZE,
      client_lr=setting["lr"], seed=SEED, runner=RunnerConfig(runner, jit=jit))


def measure_driver(task_name, task, data, args, algorithm, runner, jit, sampled_rounds):
  import contextlib
  from tff_cluster import registry
  config = make_config(task_name, args, runner, jit, len(sampled_rounds))
  if runner == "tff":
    from tff_cluster.runners.tff import runtime
  ctx = runtime.tff_runtime() if runner == "tff" else contextlib.nullcontext()
  with ctx:
    try:
      driver = registry.build_driver(algorithm, 
          task, data, config, **ALGO_OPTIONS[algorithm])
      described = driver.describe()
      t0 = time.perf_counter()
      driver.setup()
      setup_s = time.perf_counter() - t0
      log(f"    setup: {setup_s:.2f} s; describe() = {described}")
      out = time_rounds(driver.run_round, sampled_rounds, args.warmup, args.rerun)
    finally:
      if runner == "tff":
        runtime.stop()
  out.update(setup_s=setup_s, described_jit=described.get("jit"))
  return out


def auto_jit(task, data, args, task_name) -> Optional[bool]:
  """What jit='auto' resolves to for this task's model (local runner)."""
  from tff_cluster import registry
  config = make_config(task_name, args, "local", "auto", 1)
  return registry.build_driver("fedavg", task, data, config).describe()["jit"]


# ---------------------------------------------------------------------------
# TFF's own FedAvg.


def measure_tff_learning(task, data, args, task_name, sampled_rounds):
  import numpy as np
  import tensorflow as tf
  import tensorflow_federated as tff
  from tff_cluster.host.driver import initial_weights
  from tff_cluster.learning import schedule
  from tff_cluster.runners.tff import runtime
  setting = TASK_SETTINGS[task_name]
  epochs = getattr(args, setting["epochs"])
  lr = setting["lr"]
  element_spec = schedule.client_dataset(
      *data.train[data.client_ids[0]], BATCH_SIZE, 1, 0).element_spec

  def model_fn():
    return tff.learning.models.from_keras_model(
        task.model_fn(),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=element_spec)

  w0 = initial_weights(task, SEED)
  num_trainable = len(task.model_fn().trainable_variables)
  with runtime.tff_runtime():
    t0 = time.perf_counter()
    process = tff.learning.algorithms.build_weighted_fed_avg(
        model_fn,
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=lr),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=1.0))
    state = process.initialize()
    # Same start as the library's FedAvg (so the losses are comparable).
    state = process.set_model_weights(state, tff.learning.models.ModelWeights(
        trainable=[np.asarray(w) for w in w0[:num_trainable]],
        non_trainable=[np.asarray(w) for w in w0[num_trainable:]]))
    setup_s = time.perf_counter() - t0
    holder = {"state": state}

    def run_round(r, sampled):
      datasets = []
      for k in sampled:
        x, y = data.train[data.client_ids[k]]
        datasets.append(schedule.client_dataset(
            x, y, BATCH_SIZE, epochs, schedule.client_seed(SEED, r, int(k))))
      output = process.next(holder["state"], datasets)
      holder["state"] = output.state
      return {"train_loss": float(output.metrics["client_work"]["train"]["loss"])}

    out = time_rounds(run_round, sampled_rounds, args.warmup, args.rerun)
  out.update(setup_s=setup_s)
  return out


# ---------------------------------------------------------------------------
# Exporting a commit (--library).

def export_commit(commit: str) -> str:
  """`git archive commit` extracted to a fresh temporary directory."""
  target = tempfile.mkdtemp(prefix=f"runner_speed_{commit}_", dir="/tmp")
  archive = subprocess.run(["git", "-C", REPO_ROOT, "archive", commit],
                           check=True, capture_output=True).stdout
  subprocess.run(["tar", "-x", "-C", target], input=archive, check=True)
  return target


# ---------------------------------------------------------------------------
# Worker check.


def worker_processes():
  """(ours, others): `worker_binary` pids started by this run / by anything else."""
  table = _proc_table()
  ours = _ours(table)
  workers = [p for p, (_, _, cmd) in table.items()
             if "worker_binary" in cmd.split(" ")[0]]
  return [p for p in workers if p in ours], [p for p in workers if p not in ours]


def kill_our_workers() -> List[int]:
  ours, _ = worker_processes()
  for pid in ours:
    try:
      os.kill(pid, 9)
    except ProcessLookupError:
      pass
  return ours


# ---------------------------------------------------------------------------
# Output.


def fmt(x, digits=3):
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return "-"
  if isinstance(x, float):
    if x >= 100:
      return f"{x:.0f}"
    if x >= 10:
      return f"{x:.1f}"
    return f"{x:.{digits}g}" if x < 0.01 else f"{x:.{digits}f}"
  return str(x)


def ratio(a, b):
  if a is None or b is None or not b:
    return None
  return a / b


def print_tables(rows: List[Dict[str, Any]], matmul: float, matmul_n: int):
  ok = [r for r in rows if r["status"] == "ok"]
  print("\n### Median seconds per round (training + aggregation, no evaluation)\n")
  print(f"Machine: {os.cpu_count()} CPU cores; tf.linalg.matmul {matmul_n}x{matmul_n} "
        f"float32: {matmul:.1f} GFLOP/s. 'steady' = the timed rounds re-run (same "
        "round numbers and clients, everything compiled). 'other CPU' = mean cores "
        "used by other processes on the machine during the timed rounds.\n")
  print("| task | algorithm | runner | jit | median s/round | timed rounds | steady s/round | "
        "GFLOP/round | GFLOP/s | GFLOP/s steady | % of matmul (steady) | setup s | "
        "other CPU |")
  print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
  for r in rows:
    if r["status"] != "ok":
      print(f"| {r['task']} | {r['algorithm']} | {r['runner']} | {r['jit']} | "
            f"{r['status']} | - | - | - | - | - | - | - | - |")
      continue
    steady_pct = (100.0 * r["steady_gflops_per_s"] / matmul
                  if r.get("steady_gflops_per_s") else None)
    print(f"| {r['task']} | {r['algorithm']} | {r['runner']} | {r['jit']} | "
          f"{fmt(r['median_s_per_round'])} | {r['rounds_timed']} | "
          f"{fmt(r.get('steady_median_s_per_round'))} | "
          f"{fmt(r['flops_per_round'] / 1e9)} | {fmt(r['gflops_per_s'])} | "
          f"{fmt(r.get('steady_gflops_per_s'))} | {fmt(r['pct_of_matmul'], 2)} "
          f"({fmt(steady_pct, 2)}) | {fmt(r.get('setup_s'), 2)} | "
          f"{fmt(r.get('other_cpu_cores'), 2)} |")
  notes = [r for r in rows if r["status"] != "ok" or r.get("note")]
  if notes:
    print("\nNotes:")
    for r in notes:
      if r.get("note"):
        print(f"- {r['task']} / {r['algorithm']} / {r['runner']} jit={r['jit']} "
              f"({r['status']}): {r['note']}")

  seen = []
  for r in rows:
    key = (r["task"], r["algorithm"])
    if key not in seen and r["runner"] != "tff.learning":
      seen.append(key)

  def get(task, algo, runner, jit, metric):
    for r in ok:
      if (r["task"], r["algorithm"], r["runner"]) == (task, algo, runner) and (
          jit is None or r["jit"] == jit):
        return r.get(metric)
    return None

  def speedup(slow, fast):
    x = ratio(slow, fast)
    return "-" if x is None else f"{x:.2f}x"

  summaries = {}
  for metric, title in (("median_s_per_round", "timed rounds (after warm-up)"),
                        ("steady_median_s_per_round", "steady state (re-run rounds)")):
    if not any(r.get(metric) for r in ok):
      continue
    print(f"\n### Ratios, {title}: median s/round; speed-up = slower / faster\n")
    print("| task | algorithm | tff | local jit=on | local jit=off | jit=auto picks | "
          "TFF build_weighted_fed_avg | speed-up local(best) vs tff | "
          "speed-up local(best) vs TFF fed_avg |")
    print("|---|---|---:|---:|---:|---|---:|---:|---:|")
    summary = summaries[metric] = {}
    for task, algo in seen:
      tff_s = get(task, algo, "tff", None, metric)
      on = get(task, algo, "local", "on", metric)
      off = get(task, algo, "local", "off", metric)
      best = min([x for x in (on, off) if x is not None], default=None)
      bwfa = (get(task, "fedavg (tff.learning)", "tff.learning", None, metric)
              if algo == "fedavg" else None)
      auto = next((r["jit_auto_resolves_to"] for r in rows if r["task"] == task
                   and r.get("jit_auto_resolves_to") not in ("", None)), None)
      auto_s = "-" if auto is None else (
          "on" if auto is True else "off" if auto is False else str(auto))
      summary[(task, algo)] = dict(tff=tff_s, best=best, bwfa=bwfa)
      print(f"| {task} | {algo} | {fmt(tff_s)} | {fmt(on)} | {fmt(off)} | {auto_s} | "
            f"{fmt(bwfa)} | {speedup(tff_s, best)} | "
            f"{speedup(bwfa, best)} |")

  print("\n### Targets\n")
  for metric, label in (("median_s_per_round", "timed"),
                        ("steady_median_s_per_round", "steady")):
    summary = summaries.get(metric, {})
    for (task, algo), x in summary.items():
      need = {"synthetic": 10.0, "femnist": 1.5}.get(task)
      sp = ratio(x["tff"], x["best"])
      if need is not None and sp is not None:
        print(f"- [{label}] {task} {algo}: local(best jit) is {sp:.2f}x faster than tff "
              f"(target >= {need:g}x): {'MET' if sp >= need else 'NOT MET'}")


def write_csv(path: str, rows: List[Dict[str, Any]]):
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for r in rows:
      writer.writerow({k: r.get(k, "") if r.get(k) is not None else "" for k in CSV_COLUMNS})


# ---------------------------------------------------------------------------


def snapshot_library(library: str) -> Dict[str, str]:
  """A frozen copy of `tff_cluster/` and `tasks/` to import from (see --library).

  Editing the library while this script runs would otherwise break it:
  AutoGraph re-reads functions' source from disk when it traces them.
  """
  git = lambda *a: subprocess.run(["git", "-C", REPO_ROOT, *a], capture_output=True,  # noqa: E731
                                  text=True).stdout.strip()
  head = git("rev-parse", "--short", "HEAD")
  if library == "worktree":
    target = tempfile.mkdtemp(prefix="runner_speed_worktree_", dir="/tmp")
    for name in ("tff_cluster", "tasks"):
      shutil.copytree(os.path.join(REPO_ROOT, name), os.path.join(target, name),
                      ignore=shutil.ignore_patterns("__pycache__"))
    dirty = [line[3:] for line in git("status", "--porcelain", "--", "tff_cluster",
                                         "tasks").splitlines()]
    label = (f"working tree at HEAD {head}" + (f" + {len(dirty)} uncommitted change(s) "
             f"under tff_cluster/ and tasks/" if dirty else " (clean)"))
  else:
    target = export_commit(library)
    label = f"commit {git('rev-parse', '--short', library)} (git archive)"
  return dict(dir=target, label=label)


def main(argv=None):
  args = parse_args(argv)
  os.chdir(REPO_ROOT)
  started = time.perf_counter()
  library = snapshot_library(args.library)
  sys.path.insert(0, library["dir"])
  import tff_cluster  # noqa: E402
  assert os.path.realpath(tff_cluster.__file__).startswith(
      os.path.realpath(library["dir"]) + os.sep), tff_cluster.__file__
  log(f"library: {library['label']}, imported from {library['dir']}")
  output = abs_path(args.output)
  QUIET.budget_s, QUIET.threshold = args.quiet_budget_s, args.quiet_threshold
  import tensorflow as tf  # (after TF_CPP_MIN_LOG_LEVEL)
  TF_VERSION[0] = tf.__version__
  log(f"TensorFlow {tf.__version__}, Python {sys.version.split()[0]}")

  log(f"matmul {args.matmul_n}x{args.matmul_n} float32 ...")
  QUIET.wait()
  matmul = matmul_gflops(args.matmul_n)
  log(f"  {matmul:.1f} GFLOP/s")

  rows: List[Dict[str, Any]] = []
  per_task: Dict[str, Dict[str, Any]] = {}

  def add(row, examples=None):
    row.setdefault("status", "ok")
    row.setdefault("code", library["label"])
    row.setdefault("tf_version", TF_VERSION[0])
    info = per_task.get(row["task"], {})
    row.setdefault("jit_auto_resolves_to", info.get("auto_jit"))
    if row["status"] == "ok":
      examples = info["examples"] if examples is None else examples
      row["examples_per_round"] = examples
      row["macs_per_example"] = info["macs"]
      row["flops_per_round"] = 6.0 * info["macs"] * examples
      row["gflops_per_s"] = row["flops_per_round"] / row["median_s_per_round"] / 1e9
      row["matmul_gflops_per_s"] = matmul
      row["pct_of_matmul"] = 100.0 * row["gflops_per_s"] / matmul
      if row.get("steady_median_s_per_round"):
        row["steady_gflops_per_s"] = (row["flops_per_round"] /
                                      row["steady_median_s_per_round"] / 1e9)
    rows.append(row)
    write_csv(output, rows)  # keep what we have if a later part fails

  try:
    for task_name in args.tasks:
      setting = TASK_SETTINGS[task_name]
      log(f"== {task_name}: loading data ...")
      task, data = load_task(task_name, args)
      cnn = task_name in CNN_TASKS
      timed = args.cnn_rounds_timed if cnn else args.rounds_timed
      sampled_rounds = schedule(data.num_clients, args.warmup + timed)
      epochs = getattr(args, setting["epochs"])
      info = dict(examples=examples_per_round(data, sampled_rounds, epochs, args.warmup),
                  macs=model_macs(task.model_fn()))
      per_task[task_name] = info
      try:
        info["auto_jit"] = auto_jit(task, data, args, task_name)
      except Exception as e:  # noqa: BLE001
        info["auto_jit"] = f"error: {e}"
      log(f"   {data.num_clients} clients; {info['macs']} MACs/example; "
          f"{info['examples']:.0f} examples/round; jit=auto -> {info['auto_jit']}")
      for algorithm in args.algorithms:
        for runner_key in args.runners:
          runner, jit = RUNNERS[runner_key]
          row = dict(task=task_name, algorithm=algorithm, runner=runner,
                     jit="n/a" if runner == "tff" else jit)
          rounds_here = sampled_rounds
          if cnn and runner_key == "local_on":
            if algorithm != "fedavg":
              row.update(status="skipped", note="CNN with jit=on: measured for fedavg "
                         "only (XLA CNN steps are slow on CPU)")
              add(row)
              continue
            rounds_here = sampled_rounds[:args.warmup + args.cnn_jit_on_rounds]
          log(f"-- {task_name} / {algorithm} / {runner} jit={row['jit']}")
          try:
            result = measure_driver(task_name, task, data, args, algorithm, runner, jit,
                                    rounds_here)
          except Exception as e:  # noqa: BLE001
            refused = isinstance(e, ValueError) and "invalid --jit" in str(e)
            log(f"   {'REFUSED' if refused else 'FAILED'}: {type(e).__name__}: {e}")
            row.update(status="refused" if refused else "error",
                       note=f"{type(e).__name__}: {e}"[:500])
            add(row)
            continue
          if runner == "local" and result["described_jit"] != (jit == "on"):
            row["note"] = f"describe() says jit={result['described_jit']}"
          row.update(result)
          examples = None
          if len(rounds_here) != len(sampled_rounds):
            row["note"] = (row.get("note", "") + " CNN jit=on: only the first "
                           f"{len(rounds_here) - args.warmup} timed rounds").strip()
            examples = examples_per_round(data, rounds_here, epochs, args.warmup)
          add(row, examples)
          log(f"   median {result['median_s_per_round']:.3f} s/round")

      if "tff_learning" in args.baselines and task_name in BASELINE_TASKS:
        row = dict(task=task_name, algorithm="fedavg (tff.learning)", runner="tff.learning",
                   jit="n/a")
        log(f"-- {task_name} / tff.learning.algorithms.build_weighted_fed_avg")
        try:
          row.update(measure_tff_learning(task, data, args, task_name, sampled_rounds))
          row["note"] = "from_keras_model; client build_sgdm(lr), server build_sgdm(1.0)"
          log(f"   median {row['median_s_per_round']:.3f} s/round")
        except Exception as e:  # noqa: BLE001
          log(f"   FAILED: {type(e).__name__}: {e}")
          row.update(status="error", note=f"{type(e).__name__}: {e}"[:500])
        add(row)
      per_task[task_name]["schedule"] = sampled_rounds
      del task, data
  finally:
    _stop_tff_workers()
    shutil.rmtree(library["dir"], ignore_errors=True)
    killed = kill_our_workers()
    if killed:
      log(f"killed leftover worker_binary processes of this run: {killed}")
    write_csv(output, rows)

  # Order: per task, the algorithms' rows, then the baselines.
  print(f"\nLibrary measured: {library['label']}.")
  print_tables(rows, matmul, args.matmul_n)
  elapsed = time.perf_counter() - started
  print(f"\nCSV: {output}")
  print(f"Total run time: {elapsed / 60:.1f} min (of which waiting for other processes "
        f"to leave the CPUs idle: {QUIET.waited_s:.0f} s)")
  ours, others = worker_processes()
  print(f"worker_binary processes of this run still running: {ours or 'none'}"
        + (f" (others' on the machine, not touched: {others})" if others else ""))


if __name__ == "__main__":
  main()
