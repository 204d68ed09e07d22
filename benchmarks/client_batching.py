"""Clients one at a time or side by side: seconds, GFLOP/s and memory per round.

The `local` runner trains a round's clients either one after another
(`--client_batching=sequential`: one compiled loop over the clients, each
client's local SGD a loop over its batches) or side by side
(`--client_batching=parallel`: the clients sorted by step count and cut into
chunks of `chunk` clients; each chunk is one `tf.vectorized_map` of the client
function whose loops run the chunk's largest step count, shorter clients'
extra steps masked). This script measures both on FedAvg, XLA on (the dense
models' default on CPUs), one configuration per subprocess so that each
peak memory is its own.

Settings (`--settings`):
  synthetic20   Synthetic(1,1), 100 clients, MCLR 60->10; 20 clients per round
                (runner_speed.py's sample), 10 local epochs, batch 10, lr 0.01.
  synthetic100  The same task with data seed 11, all 100 clients every round.
  femnist       LEAF FEMNIST (51 writers, `--femnist_dir`), MLP 784-512-62;
                20 clients per round, 10 local epochs, batch 10, lr 0.003.
  flute         FLUTE's FEMNIST setting on those writers: CNN_DropOut, 10
                clients per round, 1 epoch, batch 20, lr 0.1, --jit=auto.
  synthetic_lstm  synthetic20's data through two LSTMs of 100 units (the
                features as 6 steps of 10), 1 epoch, --jit=auto.
  pfl_cifar10   pfl-research's CIFAR-10 setting: its simple CNN, a cohort of
                50 users x 50 images, 1 epoch, batch 10, lr 0.1, --jit=auto;
                shape-equivalent images (gpu_hlo_round.py's), the cohort only.
Modes (`--modes`): `sequential`, `parallel:C` (chunks of C clients).

Per configuration: the median seconds of `--rounds_timed` rounds after
`--warmup` rounds (compilation happens there), training + aggregation, no
evaluation; FLOPs per round = 6 x MACs per example x examples trained
(runner_speed.py's count); GFLOP/s and its ratio to a 2048x2048 float32
matmul measured in the same process; the longest-client floor: the round's
largest step count times the sequential mode's seconds per step (what a round
would take if every other client ran for free beside the longest), and the
ratio that floor would reach; memory: resident MiB after the runner was
built (before any round) and the process's peak (VmHWM) after the rounds;
the seconds of one evaluation pass over every client's test split (the
runner's evaluator, after one untimed pass).

    python benchmarks/client_batching.py
    python benchmarks/client_batching.py --settings=synthetic100 \\
        --modes=sequential,parallel:8,parallel:100

Writes `--output` (CSV, one row per configuration) and prints a Markdown
table. Other processes on the machine slow every number: run it alone.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

SETTINGS = {
    "synthetic20": dict(task="synthetic", num_clients=100, seed=0, per_round=20, lr=0.01,
                        data_dir=None, model="MCLR 60->10"),
    "synthetic100": dict(task="synthetic", num_clients=100, seed=11, per_round=100, lr=0.01,
                         data_dir=None, model="MCLR 60->10"),
    "femnist": dict(task="femnist", num_clients=None, seed=0, per_round=20, lr=0.003,
                    data_dir="femnist_dir", model="MLP 784-512-62"),
    # FLUTE's FEMNIST setting on the LEAF sample: CNN_DropOut, 10 clients per
    # round, one epoch, batch 20, lr 0.1; --jit=auto (off for a CNN on CPUs).
    "flute": dict(task="femnist", num_clients=None, seed=0, per_round=10, lr=0.1,
                  data_dir="femnist_dir", model="CNN_DropOut 784-62", model_fn="cnn_dropout",
                  epochs=1, batch=20, jit="auto"),
    # A recurrent round: Synthetic(1,1)'s 60 features as 6 steps of 10 through
    # two LSTMs of 100 units (Sent140's stack), 20 clients, one epoch.
    # pfl-research's CIFAR-10 setting: its simple CNN, a cohort of 50 users x
    # 50 images, 1 epoch, batch 10, lr 0.1; shape-equivalent users where
    # CIFAR-10 is absent (gpu_hlo_round.py's, the cohort only).
    "pfl_cifar10": dict(task="cifar10_pfl", num_clients=50, seed=0, per_round=50, lr=0.1,
                        data_dir=None, model="pfl simple CNN 32x32x3-10", epochs=1, batch=10,
                        jit="auto", shape_data=True),
    "synthetic_lstm": dict(task="synthetic", num_clients=100, seed=0, per_round=20, lr=0.01,
                           data_dir=None, model="LSTM 2x100 over 6x10", model_fn="lstm6x10",
                           epochs=1, batch=10, jit="auto"),
}


def _model_fn(name: str):
  """The settings' models other than their task's own."""
  import tensorflow as tf
  from tff_cluster import models
  if name == "cnn_dropout":
    return models.cnn_dropout

  def lstm6x10():
    inputs = tf.keras.Input(shape=(60,))
    h = tf.keras.layers.Reshape((6, 10))(inputs)
    h = tf.keras.layers.LSTM(100, return_sequences=True)(h)
    h = tf.keras.layers.LSTM(100)(h)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(10)(h))
  return lstm6x10
EPOCHS, BATCH = 10, 10
COLUMNS = ("setting", "model", "mode", "chunk", "tf_version", "clients_per_round",
           "median_s_per_round", "round_seconds", "flops_per_round", "gflops_per_s",
           "matmul_gflops_per_s", "pct_of_matmul", "steps_per_round", "longest_client_steps",
           "floor_s", "floor_pct_of_matmul", "rss_before_mib", "peak_mib", "last_train_loss",
           "eval_seconds", "test_examples", "status")


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--settings", default="synthetic20,synthetic100,femnist")
  p.add_argument("--modes", default="sequential,parallel:4,parallel:16,parallel:100")
  p.add_argument("--rounds_timed", type=int, default=5)
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument("--femnist_dir", default=os.path.join(REPO_ROOT, "..", "shared", "data",
                                                       "femnist_leaf"))
  p.add_argument("--output", default="benchmarks/results/client_batching.csv")
  p.add_argument("--step_cost", action="store_true",
                 help="instead: the cost of one local SGD step with W clients side by side "
                 "(equal step counts, nothing masked), MCLR 60->10 and MLP 784-512-62")
  p.add_argument("--one", default=None, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  args.settings = [s for s in args.settings.split(",") if s]
  bad = [s for s in args.settings if s not in SETTINGS]
  if bad:
    p.error(f"invalid --settings {bad}; valid: {', '.join(SETTINGS)}")
  modes = []
  for m in (m for m in args.modes.split(",") if m):
    name, _, chunk = m.partition(":")
    if name == "sequential" and not chunk:
      modes.append(("sequential", 0))
    elif name == "parallel" and chunk.isdigit() and int(chunk) >= 1:
      modes.append(("parallel", int(chunk)))
    else:
      p.error(f"invalid --modes entry {m!r}; valid: sequential or parallel:C (C >= 1)")
  args.modes = modes
  if args.rounds_timed < 1 or args.warmup < 0:
    p.error("--rounds_timed must be >= 1 and --warmup >= 0")
  return args


def _status_mib(field: str) -> float:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1]) / 1024.0
  return float("nan")


def measure_one(spec: Dict[str, Any]) -> Dict[str, Any]:
  """One configuration in this process (the subprocess's work)."""
  import numpy as np
  import tensorflow as tf
  from tff_cluster import tasks
  from tff_cluster import registry
  from tff_cluster.host.driver import TrainingConfig, sample_clients
  from tff_cluster.runners.config import RunnerConfig
  from tff_cluster.learning import schedule
  from tff_cluster.spec.task import DataOptions
  sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
  import runner_speed

  setting = SETTINGS[spec["setting"]]
  options = dict(seed=setting["seed"])
  if setting["num_clients"]:
    options["num_clients"] = setting["num_clients"]
  if setting["data_dir"]:
    options["data_dir"] = os.path.abspath(spec["data_dir"])
  task = tasks.get_task(setting["task"])
  if setting.get("shape_data"):
    import gpu_hlo_round
    data = gpu_hlo_round._pfl_shape_data(setting["num_clients"], setting["seed"])
  else:
    data = task.load_data(DataOptions(**options))
  if "model_fn" in setting:
    task = dataclasses.replace(task, model_fn=_model_fn(setting["model_fn"]))
  epochs, batch = setting.get("epochs", EPOCHS), setting.get("batch", BATCH)
  rounds = spec["warmup"] + spec["rounds_timed"]
  n = data.num_clients
  if setting["per_round"] >= n:
    sampled = [np.arange(n) for _ in range(rounds)]
  else:
    rng = np.random.default_rng(np.random.SeedSequence([setting["seed"], 7]))
    sampled = [sample_clients(rng, n, setting["per_round"]) for _ in range(rounds)]
  config = TrainingConfig(
      rounds=rounds, clients_per_round=min(setting["per_round"], n), local_epochs=epochs,
      batch_size=batch, client_lr=setting["lr"], seed=setting["seed"],
      runner=RunnerConfig("local", jit=setting.get("jit", "on"), client_batching=spec["mode"],
                          client_chunk=spec["chunk"] or 4))
  driver = registry.build_driver("fedavg", task, data, config)
  driver.setup()
  rss_before = _status_mib("VmRSS")
  seconds, loss = [], None
  for r, s in enumerate(sampled, start=1):
    t0 = time.perf_counter()
    out = driver.run_round(r, s)
    seconds.append(time.perf_counter() - t0)
    loss = out.get("train_loss") if isinstance(out, dict) else None
  peak = _status_mib("VmHWM")
  # One evaluation pass over every client's test split (the runner's
  # evaluator), timed after one untimed pass.
  evaluator = driver.runner.make_evaluator()
  weights, client_model = driver.eval_models()
  evaluator.evaluate(weights, client_model)
  t0 = time.perf_counter()
  evaluator.evaluate(weights, client_model)
  eval_seconds = time.perf_counter() - t0
  test_examples = int(sum(len(data.test[c][1]) for c in data.client_ids))
  timed = sampled[spec["warmup"]:]
  sizes = data.num_train_samples()
  work = schedule.LocalWork(batch, epochs=epochs)
  steps = [sum(work.num_steps(int(sizes[k])) for k in s) for s in timed]
  longest = [max(work.num_steps(int(sizes[k])) for k in s) for s in timed]
  examples = [epochs * float(sizes[list(s)].sum()) for s in timed]
  macs = runner_speed.model_macs(task.model_fn())
  median = statistics.median(seconds[spec["warmup"]:])
  flops = 6.0 * macs * statistics.fmean(examples)
  matmul = runner_speed.matmul_gflops(2048)
  return dict(setting=spec["setting"], model=setting["model"], mode=spec["mode"],
              chunk=spec["chunk"] or "", tf_version=tf.__version__,
              clients_per_round=len(sampled[0]), median_s_per_round=median,
              round_seconds=";".join(f"{x:.4f}" for x in seconds),
              flops_per_round=flops, gflops_per_s=flops / median / 1e9,
              matmul_gflops_per_s=matmul, pct_of_matmul=100.0 * flops / median / 1e9 / matmul,
              steps_per_round=statistics.fmean(steps),
              longest_client_steps=statistics.fmean(longest),
              rss_before_mib=rss_before, peak_mib=peak, last_train_loss=loss,
              eval_seconds=eval_seconds, test_examples=test_examples,
              status="ok", described=driver.describe())


def run_config(args, setting: str, mode: str, chunk: int) -> Dict[str, Any]:
  spec = dict(setting=setting, mode=mode, chunk=chunk, warmup=args.warmup,
              rounds_timed=args.rounds_timed, data_dir=args.femnist_dir)
  proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", json.dumps(spec)],
                        capture_output=True, text=True, cwd=REPO_ROOT)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
  if proc.returncode or not lines:
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return dict(setting=setting, mode=mode, chunk=chunk or "", status=f"failed: {tail}")
  return json.loads(lines[-1][len("RESULT "):])


def add_floor(rows: List[Dict[str, Any]]) -> None:
  """The longest-client floor of every row, from its setting's sequential row."""
  for row in rows:
    seq = [r for r in rows if r["setting"] == row["setting"] and r.get("mode") == "sequential"
           and r["status"] == "ok"]
    if row["status"] != "ok" or not seq:
      continue
    per_step = seq[0]["median_s_per_round"] / seq[0]["steps_per_round"]
    row["floor_s"] = per_step * row["longest_client_steps"]
    row["floor_pct_of_matmul"] = (100.0 * row["flops_per_round"] / row["floor_s"] / 1e9
                                  / row["matmul_gflops_per_s"])


def fmt(x, digits=3):
  return "-" if x is None or x == "" else f"{x:.{digits}f}"


def print_table(rows: List[Dict[str, Any]]) -> None:
  print("\n| setting | model | mode | chunk | clients | s/round | GFLOP/s | % of matmul | "
        "steps (longest) | floor s (% of matmul) | MiB before | peak MiB |")
  print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
  for r in rows:
    if r["status"] != "ok":
      print(f"| {r['setting']} | | {r['mode']} | {r['chunk']} | | {r['status']} | | | | | | |")
      continue
    print(f"| {r['setting']} | {r['model']} | {r['mode']} | {r['chunk']} | "
          f"{r['clients_per_round']} | {fmt(r['median_s_per_round'])} | "
          f"{fmt(r['gflops_per_s'], 2)} | {fmt(r['pct_of_matmul'], 2)} | "
          f"{r['steps_per_round']:.0f} ({r['longest_client_steps']:.0f}) | "
          f"{fmt(r.get('floor_s'))} ({fmt(r.get('floor_pct_of_matmul'), 2)}) | "
          f"{r['rss_before_mib']:.0f} | {r['peak_mib']:.0f} |")


STEP_MODELS = {"MCLR 60->10": ((60,), None, 10, (1, 2, 4, 8, 16, 32, 64)),
               "MLP 784-512-62": ((784,), 512, 62, (1, 2, 4, 8))}


def step_cost(steps: int = 300) -> List[Dict[str, Any]]:
  """Microseconds per step of W clients side by side: the library's
  `FunctionalTrainer` in one `tf.vectorized_map` under XLA, every client with
  the same number of steps (the best case: no masked step), batch 10."""
  import numpy as np
  import tensorflow as tf
  from tff_cluster import models
  from tff_cluster.learning import functional, schedule
  sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
  import runner_speed
  matmul = runner_speed.matmul_gflops(2048)
  rows = []
  rng = np.random.default_rng(0)
  for name, (shape, hidden, classes, widths) in STEP_MODELS.items():
    model = (models.mclr(shape[0], classes) if hidden is None
             else models.mlp(shape[0], hidden, classes))
    macs = runner_speed.model_macs(model)
    stateless = functional.stateless_model(model)
    weights = models.get_weights(model)
    n = 4000
    x = tf.constant(rng.normal(size=(n,) + shape).astype(np.float32))
    y = tf.constant(rng.integers(0, classes, n).astype(np.int32))
    for width in widths:
      idx = tf.constant(rng.integers(0, n, (width, steps, BATCH)).astype(np.int32))
      sizes = tf.fill([width, steps], BATCH)
      counts = tf.fill([width], steps)

      def client(c):
        trainer = functional.FunctionalTrainer(stateless, models.SPARSE_CE_LOGITS, x, y,
                                               bound=tf.constant(steps))
        data = schedule.PaddedBatches(tf.gather(idx, c), tf.gather(sizes, c),
                                            tf.gather(counts, c))
        return trainer.train(weights, data, 0.01).delta

      fn = tf.function(lambda: tf.vectorized_map(client, tf.range(width),
                                                 fallback_to_while_loop=False),
                       jit_compile=True)
      fn()
      times = []
      for _ in range(3):
        t0 = time.perf_counter()
        tf.nest.map_structure(lambda t: t.numpy(), fn())
        times.append(time.perf_counter() - t0)
      per_step = min(times) / steps
      flops = 6.0 * macs * BATCH * width
      rows.append(dict(model=name, width=width, us_per_step=per_step * 1e6,
                       us_per_client_step=per_step * 1e6 / width,
                       gflops_per_s=flops / per_step / 1e9,
                       pct_of_matmul=100.0 * flops / per_step / 1e9 / matmul,
                       matmul_gflops_per_s=matmul, tf_version=tf.__version__))
      print(f"{name} W={width}: {per_step * 1e6:.1f} us/step", file=sys.stderr, flush=True)
  return rows


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.step_cost:
    rows = step_cost()
    print(f"\nmatmul 2048x2048: {rows[0]['matmul_gflops_per_s']:.1f} GFLOP/s\n")
    print("| model | clients side by side | us per step | us per client-step | GFLOP/s | "
          "% of matmul |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
      print(f"| {r['model']} | {r['width']} | {r['us_per_step']:.1f} | "
            f"{r['us_per_client_step']:.2f} | {r['gflops_per_s']:.2f} | "
            f"{r['pct_of_matmul']:.2f} |")
    out = args.output.replace(".csv", "_steps.csv")
    out = os.path.join(REPO_ROOT, out) if not os.path.isabs(out) else out
    with open(out, "w", newline="") as f:
      writer = csv.DictWriter(f, fieldnames=list(rows[0]))
      writer.writeheader()
      writer.writerows(rows)
    print(f"\nwrote {out}", file=sys.stderr)
    return 0
  if args.one:
    print("RESULT " + json.dumps(measure_one(json.loads(args.one)), default=str), flush=True)
    return 0
  rows = []
  for setting in args.settings:
    for mode, chunk in args.modes:
      print(f"{setting} {mode}{':' + str(chunk) if chunk else ''} ...", file=sys.stderr,
            flush=True)
      rows.append(run_config(args, setting, mode, chunk))
  add_floor(rows)
  print_table(rows)
  out = os.path.join(REPO_ROOT, args.output) if not os.path.isabs(args.output) else args.output
  os.makedirs(os.path.dirname(out), exist_ok=True)
  with open(out, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
  print(f"\nwrote {out}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
