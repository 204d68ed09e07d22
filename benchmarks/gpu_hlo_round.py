"""Time the `local` runner's XLA-compiled round on a GPU host without TensorFlow.

Some GPU machines have CUDA and JAX but no TensorFlow, and cannot receive a
TensorFlow install. The `local` runner's round is one XLA computation (with
`--jit=on`), so it can be carried there as HLO and run by JAX's XLA with
inputs of the same shapes:

  export  (here, with TensorFlow) builds a FedAvg driver on Synthetic(1,1)
          (MCLR 60->10, batch 10, lr 0.01) or LEAF FEMNIST (MLP 784-512-62,
          lr 0.003; `--task=femnist`) with the local runner at jit=on,
          runs one round, and writes to --out: the round's HLO module
          (`round.hlo.pb`, TF's `experimental_get_compiler_ir(...)
          ('hlo_serialized')`), its inputs (`inputs.npz`, in the order of the
          HLO's parameters), TF's outputs for those inputs (`outputs.npz`) and
          TF's own timing of the round on this machine (`export.json`).
  run     (on the GPU host, with JAX only: this mode imports no TensorFlow)
          converts the HLO to StableHLO (`copy`, which JAX's GPU compiler
          refuses, rewritten as an identity reshape), compiles it for each JAX backend
          given (--backends=gpu,cpu), checks the outputs against TF's
          (max |difference| <= 1e-5 x max |TF output| + 1e-6 per output:
          another XLA build may sum in another order) and
          writes the median seconds per round over --repeats calls after
          --warmup calls (`run.json`).

  python benchmarks/gpu_hlo_round.py export --out=/tmp/hlo --clients=20 --epochs=20
  python benchmarks/gpu_hlo_round.py run --dir=/tmp/hlo --backends=gpu,cpu
  python benchmarks/gpu_hlo_round.py run --dir=/tmp/hlo --backends=gpu --precision=highest

`--precision=default` keeps TF's products as they are (a GPU may run them in
TF32, as TensorFlow does by default on Ampere and later GPUs); `highest`
asks for full float32 products, which the check against TF's CPU outputs
needs.

The round timed is the compiled client loop only (the sampled clients' local
SGD and their summed update), not the server update or evaluation, which run
outside it. Both runs of a comparison must use the same export.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time

import numpy as np

from runner_speed import TASK_SETTINGS

RTOL, ATOL = 1e-5, 1e-6  # an output matches when max|got - tf| <= RTOL * max|tf| + ATOL
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The tasks' default data folders (None: generated); learning rates and model
# labels are runner_speed.py's settings of the same tasks.
DATA_DIRS = {"synthetic": None,
             "femnist": os.path.join(REPO_ROOT, "..", "shared", "data", "femnist_leaf"),
             "cifar10_pfl": None}
# pfl-research's CIFAR-10 setting (tasks/cifar10.py): without CIFAR-10 on this
# machine, shape-equivalent users (50 images of 32 x 32 x 3 each, standard
# normal pixels, as after its per-channel standardisation; random labels),
# drawn by numpy from a seed: the device regenerates them rather than carry
# them (`regenerate` in export.json).
PFL_SHAPE_SEED = 20240
PFL_LR = 0.1


def pfl_images(count: int, seed: int = PFL_SHAPE_SEED):
  """The shape-equivalent images (the same numbers on every machine)."""
  return np.random.default_rng(seed).standard_normal((count, 32, 32, 3), dtype=np.float32)


def _pfl_shape_data(users: int, seed: int):
  from tff_cluster.data.federated import FederatedData
  per = 50
  x = pfl_images(users * per)
  y = np.random.default_rng(seed + 1).integers(0, 10, users * per).astype(np.int32)
  ids = [f"user_{u:04d}" for u in range(users)]
  train = {c: (x[u * per:(u + 1) * per], y[u * per:(u + 1) * per]) for u, c in enumerate(ids)}
  test = {c: (x[u * per:u * per + 10], y[u * per:u * per + 10]) for u, c in enumerate(ids)}
  return FederatedData(ids, train, test, 10, description=(
      f"{users} shape-equivalent users x {per} images (standard normal, seed "
      f"{PFL_SHAPE_SEED}), CIFAR-10 absent"))


def _load(args):
  """(tasks module, task, data) of args.task, with args.model's model."""
  sys.path.insert(0, REPO_ROOT)
  import dataclasses
  from tff_cluster import tasks
  from tff_cluster import models
  from tff_cluster.spec.task import DataOptions

  task = tasks.get_task(args.task)
  if args.model == "cnn_dropout":
    task = dataclasses.replace(task, model_fn=lambda: models.cnn_dropout(
        num_classes=62, rates=(0.0, 0.0) if args.no_dropout else (0.25, 0.5)))
  elif args.model:
    task = tasks.with_model(task, args.model) if hasattr(tasks, "with_model") else \
        dataclasses.replace(task, model_fn=task.other_models[args.model])
  options = dict(seed=args.seed)
  if args.task == "cifar10_pfl" and not args.data_dir:
    # Only the round's cohort is placed on the device (every user trains once).
    return task, _pfl_shape_data(args.clients, args.seed)
  if DATA_DIRS[args.task]:
    options["data_dir"] = args.data_dir or DATA_DIRS[args.task]
  return task, task.load_data(DataOptions(**options))


def _lr(args) -> float:
  if args.lr:
    return args.lr
  return PFL_LR if args.task == "cifar10_pfl" else TASK_SETTINGS[args.task]["lr"]


def _model_label(args) -> str:
  if args.model == "cnn_dropout":
    return "CNN_DropOut 784-62 (1206590 params)" + (
        ", dropout off" if args.no_dropout else "")
  if args.task == "cifar10_pfl":
    return "pfl-research simple CNN 32x32x3-10 (1626442 params)"
  return args.model or TASK_SETTINGS[args.task]["model"]


def _dump(fn, call_args, out, info, args):
  """Writes fn's HLO at call_args (a tf.function), its inputs in the HLO's
  parameter order (the non-None flat arguments, then the captured tensors and
  variables), TF's outputs and TF's own timing to `out`."""
  import tensorflow as tf
  concrete = fn.get_concrete_function(*call_args)
  flat_args = [a for a in tf.nest.flatten(call_args) if a is not None]
  variables = {id(v.handle): v for v in concrete.variables}
  captures = [np.asarray(variables[id(t)].numpy() if t.dtype == tf.resource else t)
              for t in concrete.captured_inputs]
  values = [np.asarray(a) for a in flat_args] + captures
  compiler_ir = fn.experimental_get_compiler_ir(*call_args)
  hlo, text = compiler_ir(stage="hlo_serialized"), compiler_ir(stage="hlo")
  outputs = [np.asarray(o) for o in tf.nest.flatten(fn(*call_args))]
  # The call above moved any random-generator state it writes; TF's timing
  # calls below move it further. Outputs are compared with the first call's,
  # whose inputs are `values`.
  times = []
  for _ in range(args.warmup + args.repeats if args.repeats else 0):
    t0 = time.perf_counter()
    res = fn(*call_args)
    tf.nest.map_structure(lambda t: t.numpy(), res)
    times.append(time.perf_counter() - t0)
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "round.hlo.pb"), "wb") as f:
    f.write(hlo)
  with open(os.path.join(out, "round.hlo.txt"), "w") as f:
    f.write(text)
  regenerate = []
  if info.get("task") == "cifar10_pfl" and "shape-equivalent" in info.get("data", ""):
    for i, v in enumerate(values):
      if v.dtype == np.float32 and v.ndim == 4 and v.shape[1:] == (32, 32, 3) and \
          np.array_equal(v, pfl_images(len(v))):
        regenerate.append({"position": i, "count": int(len(v)), "seed": PFL_SHAPE_SEED})
        values[i] = np.zeros((0,), np.float32)  # `run` draws it again
  np.savez_compressed(os.path.join(out, "inputs.npz"), *values)
  np.savez_compressed(os.path.join(out, "outputs.npz"), *outputs)
  info = dict(info)
  info.update({
      "regenerate": regenerate,
      "inputs": [[list(v.shape), str(v.dtype)] for v in values],
      "outputs": [[list(v.shape), str(v.dtype)] for v in outputs],
      "tf_version": tf.__version__,
      # None with --repeats=0 (XLA's CPU convolutions can take minutes a call)
      "tf_median_s": statistics.median(times[args.warmup:]) if args.repeats else None,
      "tf_times_s": times[args.warmup:]})
  with open(os.path.join(out, "export.json"), "w") as f:
    json.dump(info, f, indent=1)
  print(json.dumps({k: v for k, v in info.items() if k not in ("sampled", "inputs", "outputs")},
                   indent=1))
  return outputs


def export(args) -> None:
  """The round (args.kind='round'), the side-by-side CNN prototype
  ('grouped') or the evaluation pass ('eval')."""
  if args.kind == "grouped":
    return export_grouped(args)
  if args.kind == "eval":
    return export_eval(args)
  task, data = _load(args)
  from tff_cluster import registry
  from tff_cluster.host import driver as driver_lib
  from tff_cluster.host.driver import TrainingConfig
  from tff_cluster.runners.config import RunnerConfig
  from tff_cluster.runners import local_runner

  config = TrainingConfig(
      rounds=1, clients_per_round=args.clients, local_epochs=args.epochs,
      batch_size=args.batch_size, client_lr=_lr(args), seed=args.seed,
      runner=RunnerConfig("local", jit="on", client_batching=args.client_batching,
                          client_chunk=args.chunk))
  captured = {}
  sequential, parallel = local_runner.LocalRunner._round_fn, \
      local_runner.LocalRunner._parallel_round_fn

  def spy_sequential(self, mode, inputs):
    fn = sequential(self, mode, inputs)
    # The round's last argument: how many of the stacked clients train (None:
    # all of them, as the local runner calls it; the ray runner's shards pad).
    captured.update(fn=fn, args=(inputs, None))
    return fn

  def spy_parallel(self, mode, inputs):
    fn = parallel(self, mode, inputs)

    def call(*a):
      captured.update(fn=fn, args=a)
      return fn(*a)
    return call

  local_runner.LocalRunner._round_fn = spy_sequential
  local_runner.LocalRunner._parallel_round_fn = spy_parallel
  try:
    driver = registry.build_driver("fedavg", task, data, config)
    driver.setup()
    rng = np.random.default_rng(np.random.SeedSequence([args.seed, 7]))
    sampled = driver_lib.sample_clients(rng, len(data.client_ids), args.clients)
    driver.run_round(1, sampled)
  finally:
    local_runner.LocalRunner._round_fn = sequential
    local_runner.LocalRunner._parallel_round_fn = parallel
  sizes = data.num_train_samples()
  described = driver.describe()
  info = {
      "kind": "round", "task": args.task, "model": _model_label(args), "algorithm": "fedavg",
      "data": data.description,
      "clients": args.clients, "epochs": args.epochs, "batch_size": args.batch_size,
      "lr": _lr(args), "seed": args.seed, "sampled": [int(k) for k in sampled],
      "client_batching": described.get("client_batching"), "chunk": described.get("chunk"),
      "examples_per_round": int(args.epochs * sizes[list(sampled)].sum()),
      "steps_per_client_padded": int(captured["args"][0].indices.shape[1]),
      "tf_device": described.get("device")}
  runner = driver.runner
  if described.get("client_batching") == "parallel":
    # The runner's memory estimate of one chunk, to hold against the device's
    # measured peak (`run`'s peak_bytes).
    info["chunk_bytes_estimate"] = int(runner.chunk) * local_runner.chunk_bytes_per_client(
        runner._num_params, runner._activations, args.batch_size)
  _dump(captured["fn"], captured["args"], args.out, info, args)


# ---------------------------------------------------------------------------
# A prototype of a round's clients side by side for a CNN (CNN_DropOut): no
# per-client loop; each convolution is one grouped convolution over the chunk
# (client k's channels are group k), each dense layer one batched product.


def grouped_filter(kernel):
  """[K, h, w, in, out] per-client kernels -> one grouped kernel
  [h, w, in, K*out] (output channels k*out .. (k+1)*out - 1 are client k's)."""
  import tensorflow as tf
  k, h, w, i, o = kernel.shape
  return tf.reshape(tf.transpose(kernel, [1, 2, 3, 0, 4]), [h, w, i, k * o])


def grouped_forward(weights, x, dropout_seeds=None, rates=(0.25, 0.5)):
  """CNN_DropOut's logits for K clients at once: weights[i] is [K, ...]
  (the Keras weight order: conv1 kernel, bias, conv2 kernel, bias, dense1,
  bias, dense2, bias); x [K, B, 784]. `dropout_seeds` [2] int32 (None: no
  dropout): each dropout mask is drawn for the whole chunk [K, B, ...]."""
  import tensorflow as tf
  k1, b1, k2, b2, w3, b3, w4, b4 = weights
  num, batch = x.shape[0], x.shape[1]
  h = tf.reshape(x, [num, batch, 28, 28, 1])
  h = tf.reshape(tf.transpose(h, [1, 2, 3, 0, 4]), [batch, 28, 28, num])
  h = tf.nn.relu(tf.nn.conv2d(h, grouped_filter(k1), 1, "VALID") + tf.reshape(b1, [-1]))
  h = tf.nn.relu(tf.nn.conv2d(h, grouped_filter(k2), 1, "VALID") + tf.reshape(b2, [-1]))
  h = tf.nn.max_pool2d(h, 2, 2, "VALID")                       # [B, 12, 12, K*64]
  h = tf.reshape(tf.transpose(tf.reshape(h, [batch, 12, 12, num, 64]), [3, 0, 1, 2, 4]),
                 [num, batch, 12 * 12 * 64])
  if dropout_seeds is not None and rates[0]:
    h = tf.nn.experimental.stateless_dropout(h, rates[0], dropout_seeds)
  h = tf.nn.relu(tf.einsum("kbi,kio->kbo", h, w3) + b3[:, None])
  if dropout_seeds is not None and rates[1]:
    h = tf.nn.experimental.stateless_dropout(h, rates[1], dropout_seeds + 1)
  return tf.einsum("kbi,kio->kbo", h, w4) + b4[:, None]


def grouped_round(start, x, y, indices, sizes, num_steps, lr, seed, dropout: bool):
  """FedAvg's client half for K clients side by side: local SGD (the
  library's rule: each step the masked mean loss of the client's batch) from
  `start` for every client, steps past a client's own count leaving it
  unchanged. Returns (sum_k n_k delta_k, sum_k n_k, sum of losses x n)
  as the sequential round's `summed`, with per-client (loss_sum, n)."""
  import tensorflow as tf
  from tff_cluster import models
  num, steps, batch = indices.shape
  start = [tf.convert_to_tensor(w) for w in start]
  stacked = tuple(tf.tile(w[None], [num] + [1] * len(w.shape)) for w in start)

  def body(i, w, n, loss_sum):
    rows = indices[:, i]
    xb, yb = tf.gather(x, rows), tf.gather(y, rows)
    mask = tf.cast(tf.range(batch)[None] < sizes[:, i][:, None], tf.float32)
    active = i < num_steps                                          # [K]
    count = tf.reduce_sum(mask, 1)
    with tf.GradientTape() as tape:
      tape.watch(w)
      seeds = tf.stack([seed, i]) if dropout else None
      logits = grouped_forward(list(w), xb, seeds)
      per_example = tf.reshape(models.per_example_loss(
          models.SPARSE_CE_LOGITS, tf.reshape(yb, [-1]), tf.reshape(logits, [num * batch, -1])),
          [num, batch])
      means = tf.reduce_sum(per_example * mask, 1) / tf.maximum(count, 1.0)
      total = tf.reduce_sum(means)
    grads = tape.gradient(total, list(w))
    new = []
    for v, g in zip(w, grads):
      keep = tf.reshape(active, [num] + [1] * (len(v.shape) - 1))
      new.append(tf.where(keep, v - lr * g, v))
    af = tf.cast(active, tf.float32)
    return i + 1, tuple(new), n + af * count, loss_sum + af * means * count

  zeros = tf.zeros([num])
  _, w, n, loss_sum = tf.while_loop(lambda i, *_: i < steps, body,
                                    (tf.constant(0), stacked, zeros, zeros))
  update = [tf.einsum("k,k...->...", n, v - s[None]) for v, s in zip(w, start)]
  return update, tf.reduce_sum(n), tf.reduce_sum(loss_sum), loss_sum, n


def export_grouped(args) -> None:
  """The prototype's round on the same clients, batches and seeds as
  `export` (kind 'round') of the same arguments."""
  import tensorflow as tf
  from tff_cluster import models
  from tff_cluster.host import driver as driver_lib
  from tff_cluster.learning import schedule
  if args.model != "cnn_dropout":
    raise SystemExit("error: --kind=grouped is written for --model=cnn_dropout")
  task, data = _load(args)
  tf.keras.utils.set_random_seed(args.seed)
  model = task.model_fn()
  start = models.get_weights(model)
  rng = np.random.default_rng(np.random.SeedSequence([args.seed, 7]))
  sampled = driver_lib.sample_clients(rng, len(data.client_ids), args.clients)
  xs = [data.train[c][0] for c in data.client_ids]
  ys = [data.train[c][1] for c in data.client_ids]
  sizes = np.array([len(v) for v in ys], np.int64)
  offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
  work = schedule.LocalWork(batch_size=args.batch_size, epochs=args.epochs)
  total_steps = max(work.num_steps(int(n)) for n in sizes)
  batches = schedule.stacked_padded_batches(
      sizes[sampled], offsets[sampled], work,
      [schedule.client_seed(args.seed, 1, int(k)) for k in sampled], total_steps)
  x, y = np.concatenate(xs), np.concatenate(ys)
  dropout = not args.no_dropout

  @tf.function(jit_compile=True, autograph=False)
  def fn(start, x, y, indices, sizes, num_steps, lr, seed):
    return grouped_round(start, x, y, indices, sizes, num_steps, lr, seed, dropout)

  call_args = (start, x, y, batches.indices, batches.sizes, batches.num_steps,
               np.float32(_lr(args)), np.int32(args.seed))
  info = {"kind": "grouped", "task": args.task, "model": _model_label(args),
          "algorithm": "fedavg", "clients": args.clients, "epochs": args.epochs,
          "batch_size": args.batch_size, "lr": _lr(args), "seed": args.seed,
          "sampled": [int(k) for k in sampled], "client_batching": "grouped prototype",
          "chunk": args.clients,
          "examples_per_round": int(args.epochs * sizes[sampled].sum()),
          "steps_per_client_padded": int(total_steps), "tf_device": "CPU"}
  _dump(fn, call_args, args.out, info, args)


def export_eval(args) -> None:
  """The evaluation pass: the model's correct predictions and summed loss on
  `args.eval_examples` test examples (the task's test examples repeated to
  that count), one compiled call."""
  import tensorflow as tf
  from tff_cluster import models
  task, data = _load(args)
  tf.keras.utils.set_random_seed(args.seed)
  model = task.model_fn()
  if "shape-equivalent" in data.description:
    # The shape-equivalent images themselves (redrawn on the device, not carried).
    xt = pfl_images(args.eval_examples)
    yt = np.random.default_rng(args.seed + 1).integers(0, 10, args.eval_examples).astype(np.int32)
  else:
    xt = np.concatenate([data.test[c][0] for c in data.client_ids])
    yt = np.concatenate([data.test[c][1] for c in data.client_ids])
    reps = -(-args.eval_examples // len(yt))
    xt = np.tile(xt, (reps,) + (1,) * (xt.ndim - 1))[:args.eval_examples]
    yt = np.tile(yt, reps)[:args.eval_examples]

  @tf.function(jit_compile=True)
  def fn(x, y):
    logits = model(x, training=False)
    loss = tf.reduce_sum(models.per_example_loss(task.loss, y, logits))
    correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1), tf.cast(y, tf.int64)),
                                    tf.int32))
    return correct, loss

  info = {"kind": "eval", "task": args.task, "model": _model_label(args), "seed": args.seed,
          "eval_examples": int(args.eval_examples), "tf_device": "CPU",
          "data": data.description}
  _dump(fn, (xt, yt), args.out, info, args)


# The exports of one device call (`prepare` writes them, `run --root` runs
# them): name -> export flags. FLUTE's setting: FedAvg, CNN_DropOut on FEMNIST,
# 10 clients per round, batch 20, one epoch, lr 0.1.
PRESETS = {
    "femnist20_seq": "--task=femnist --clients=20 --epochs=10",
    "femnist20_par20": "--task=femnist --clients=20 --epochs=10 --client_batching=parallel --chunk=20",
    "femnist20_par5": "--task=femnist --clients=20 --epochs=10 --client_batching=parallel --chunk=5",
    "syn20_seq": "--task=synthetic --clients=20 --epochs=20",
    "syn20_par20": "--task=synthetic --clients=20 --epochs=20 --client_batching=parallel --chunk=20",
    "flute_seq": "--task=femnist --model=cnn_dropout --clients=10 --epochs=1 --batch_size=20 --lr=0.1",
    "flute_grouped": ("--task=femnist --model=cnn_dropout --clients=10 --epochs=1 --batch_size=20 "
                      "--lr=0.1 --kind=grouped"),
    # The runner's own side-by-side round of the CNN (convolutions as patches
    # times a matrix, Dropout from each client's seed), in one chunk and in two.
    "flute_par10": ("--task=femnist --model=cnn_dropout --clients=10 --epochs=1 --batch_size=20 "
                    "--lr=0.1 --client_batching=parallel --chunk=10"),
    "flute_par5": ("--task=femnist --model=cnn_dropout --clients=10 --epochs=1 --batch_size=20 "
                   "--lr=0.1 --client_batching=parallel --chunk=5"),
    # pfl-research's CIFAR-10 setting: its simple CNN, cohort 50 of 50 images,
    # one epoch, batch 10, lr 0.1 (shape-equivalent images without CIFAR-10).
    "pfl_seq": "--task=cifar10_pfl --clients=50 --epochs=1 --batch_size=10 --repeats=1",
    "pfl_par50": ("--task=cifar10_pfl --clients=50 --epochs=1 --batch_size=10 "
                  "--client_batching=parallel --chunk=50"),
    "pfl_par10": ("--task=cifar10_pfl --clients=50 --epochs=1 --batch_size=10 "
                  "--client_batching=parallel --chunk=10"),
    "pfl_eval10k": "--task=cifar10_pfl --clients=50 --kind=eval --eval_examples=10000",
    "flute_eval10k": "--task=femnist --model=cnn_dropout --kind=eval --eval_examples=10000",
}


def prepare(args) -> None:
  """Every preset's export under --root (one folder each), for one device call."""
  import subprocess
  names = args.only.split(",") if args.only else list(PRESETS)
  for name in names:
    out = os.path.join(args.root, name)
    if os.path.exists(os.path.join(out, "export.json")) and not args.again:
      print(f"{name}: exported already")
      continue
    cmd = [sys.executable, os.path.abspath(__file__), "export", f"--out={out}",
           f"--warmup={args.warmup}", f"--repeats={args.repeats}", *PRESETS[name].split()]
    print("+", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True)


def rewrite_mlir(text: str, precision: str):
  """The MLIR text of TF's HLO made compilable by JAX's GPU compiler.

  TF's HLO copies the variables it returns (`copy`), which becomes
  `mhlo.copy`: JAX's GPU compiler refuses that op (its CPU compiler takes
  it), so each is rewritten as the identity reshape of the same type.
  precision='highest' asks for float32 products; 'default' leaves them as TF
  wrote them, which lets a GPU use TF32 tensor cores (as TensorFlow itself
  does on Ampere and later GPUs). Returns (text, copies rewritten, products).
  """
  text, copies = re.subn(r"mhlo\.copy (%[\w#.]+) : (tensor<[^>]*>)",
                         r"stablehlo.reshape \1 : (\2) -> \2", text)
  dots = text.count("precision = [DEFAULT, DEFAULT]")
  if precision == "highest":
    text = text.replace("precision = [DEFAULT, DEFAULT]", "precision = [HIGHEST, HIGHEST]")
  return text, copies, dots


def run(args) -> None:
  import jax
  import jax.extend
  jax.config.update("jax_enable_x64", True)  # int64 inputs (labels) keep their type
  from jax._src.lib import xla_client

  with open(os.path.join(args.dir, "round.hlo.pb"), "rb") as f:
    hlo = f.read()
  with np.load(os.path.join(args.dir, "inputs.npz")) as z:
    inputs = [z[f"arr_{i}"] for i in range(len(z.files))]
  with np.load(os.path.join(args.dir, "outputs.npz")) as z:
    expected = [z[f"arr_{i}"] for i in range(len(z.files))]
  with open(os.path.join(args.dir, "export.json")) as f:
    info = json.load(f)
  for item in info.get("regenerate", []):
    inputs[item["position"]] = pfl_images(item["count"], item["seed"])
  text = xla_client._xla.mlir.xla_computation_to_mlir_module(xla_client.XlaComputation(hlo))
  text, copies, dots = rewrite_mlir(text, args.precision)
  stablehlo = xla_client._xla.mlir.mhlo_to_stablehlo(text)
  results = {"jax_version": jax.__version__, "copies_rewritten": copies,
             "precision": args.precision, "products": dots, "backends": {},
             "export": {k: v for k, v in info.items() if k not in ("sampled", "inputs", "outputs")}}
  for name in args.backends.split(","):
    entry = results["backends"][name] = {}
    try:
      backend = jax.extend.backend.get_backend(name)
      device = backend.local_devices()[0]
      entry["device"] = str(getattr(device, "device_kind", device))
      options = xla_client.CompileOptions()
      t0 = time.perf_counter()
      executable = backend.compile_and_load(
          stablehlo, xla_client.DeviceList((device,)), options)
      entry["compile_s"] = time.perf_counter() - t0
      placed = [jax.device_put(v, device) for v in inputs]

      def call():
        # The HLO aliases the model variables it writes to their inputs
        # (donated): those are placed again, outside the timed call.
        for i, p in enumerate(placed):
          if p.is_deleted():
            placed[i] = jax.device_put(inputs[i], device)
        jax.block_until_ready(placed)
        t0 = time.perf_counter()
        out = executable.execute_sharded(placed)
        arrays = out.disassemble_into_single_device_arrays()
        got = [np.asarray(a[0]) for a in arrays]  # waits for the device
        return time.perf_counter() - t0, got

      times = []
      for _ in range(args.warmup + args.repeats):
        seconds, got = call()
        times.append(seconds)
      entry["median_s"] = statistics.median(times[args.warmup:])
      entry["times_s"] = times[args.warmup:]
      got = got[:len(expected)]  # then the variables the round wrote
      entry["outputs"] = [
          {"shape": list(e.shape), "max_abs": float(np.max(np.abs(e))) if e.size else 0.0,
           "max_abs_diff": float(np.max(np.abs(g.astype(np.float64) - e))) if e.size else 0.0}
          for g, e in zip(got, expected)]
      entry["outputs_match"] = bool(len(got) == len(expected) and all(
          g.shape == e.shape for g, e in zip(got, expected)) and all(
          o["max_abs_diff"] <= RTOL * o["max_abs"] + ATOL for o in entry["outputs"]))
      if info.get("tf_median_s"):
        entry["speedup_vs_tf_export_machine"] = info["tf_median_s"] / entry["median_s"]
      try:  # the process's peak device memory so far (one export per process: run --root)
        stats = device.memory_stats() or {}
        entry["peak_bytes"] = int(stats.get("peak_bytes_in_use", 0)) or None
      except Exception:  # noqa: BLE001 -- not every backend reports it
        entry["peak_bytes"] = None
    except Exception as e:  # noqa: BLE001 -- reported, not hidden
      entry["error"] = f"{type(e).__name__}: {e}"[:2000]
  out = json.dumps(results, indent=1)
  print(out)
  if args.out:
    with open(args.out, "w") as f:
      f.write(out)


CSV_FIELDS = ("name", "kind", "model", "clients", "epochs", "batch_size", "client_batching",
              "chunk", "examples_per_round", "backend", "device", "precision", "median_s",
              "compile_s", "max_rel_diff_vs_tf", "outputs_match", "peak_bytes",
              "tf_cpu_median_s", "jax")


def run_root(args) -> None:
  """`run` on every export under --root, each in its own process (so that a
  process's peak device memory is its export's), then one CSV row per
  export, backend and precision in --csv."""
  import csv
  import subprocess
  rows = []
  if args.results:
    os.makedirs(args.results, exist_ok=True)
  names = sorted(n for n in os.listdir(args.root)
                 if os.path.exists(os.path.join(args.root, n, "export.json"))
                 and (not args.only or n in args.only.split(",")))
  for name in names:
    for precision in args.precisions.split(","):
      out = os.path.join(args.results or args.root,
                         f"{name}.{precision}.{args.backends.replace(',', '-')}.json")
      cmd = [sys.executable, os.path.abspath(__file__), "run", f"--dir={os.path.join(args.root, name)}",
             f"--backends={args.backends}", f"--warmup={args.warmup}", f"--repeats={args.repeats}",
             f"--precision={precision}", f"--out={out}"]
      print("+", name, precision, flush=True)
      done = subprocess.run(cmd, capture_output=True, text=True)
      if done.returncode or not os.path.exists(out):
        print(f"{name} ({precision}) failed: {done.stderr[-2000:]}", flush=True)
        continue
      with open(out) as f:
        result = json.load(f)
      e = result["export"]
      for backend, entry in result["backends"].items():
        diffs = [o["max_abs_diff"] / max(o["max_abs"], 1e-30) for o in entry.get("outputs", [])]
        rows.append({
            "name": name, "kind": e.get("kind", "round"), "model": e.get("model"),
            "clients": e.get("clients"), "epochs": e.get("epochs"),
            "batch_size": e.get("batch_size"), "client_batching": e.get("client_batching"),
            "chunk": e.get("chunk"), "examples_per_round": e.get("examples_per_round",
                                                                 e.get("eval_examples")),
            "backend": f"jax-{backend}", "device": entry.get("device"), "precision": precision,
            "median_s": entry.get("median_s"), "compile_s": entry.get("compile_s"),
            "max_rel_diff_vs_tf": max(diffs) if diffs else None,
            "outputs_match": entry.get("outputs_match"), "peak_bytes": entry.get("peak_bytes"),
            "tf_cpu_median_s": e.get("tf_median_s"), "jax": result.get("jax_version")})
        if "error" in entry:
          print(f"{name} {backend}: {entry['error'][:500]}", flush=True)
      # Written after each export: a call stopped at its time limit keeps the rows so far.
      with open(args.csv, "w", newline="") as f:
        writer = csv.DictWriter(f, CSV_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
  for row in rows:
    print(f"{row['name']:18s} {row['backend']:8s} {row['precision']:8s} "
          f"{row['median_s'] if row['median_s'] is not None else float('nan'):.4f} s  "
          f"match={row['outputs_match']}", flush=True)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  sub = p.add_subparsers(dest="mode", required=True)
  e = sub.add_parser("export", help="write the round's HLO, inputs and TF outputs")
  e.add_argument("--out", required=True)
  e.add_argument("--task", choices=sorted(DATA_DIRS), default="synthetic")
  e.add_argument("--data_dir", default="", help="femnist: the LEAF FEMNIST folder")
  e.add_argument("--model", default="", help="the task's other model, or cnn_dropout (femnist)")
  e.add_argument("--no_dropout", action="store_true", help="cnn_dropout with rates 0")
  e.add_argument("--kind", choices=("round", "grouped", "eval"), default="round")
  e.add_argument("--clients", type=int, default=20)
  e.add_argument("--epochs", type=int, default=20)
  e.add_argument("--batch_size", type=int, default=10)
  e.add_argument("--lr", type=float, default=0.0, help="0: the task setting's")
  e.add_argument("--client_batching", choices=("sequential", "parallel"), default="sequential")
  e.add_argument("--chunk", type=int, default=4)
  e.add_argument("--eval_examples", type=int, default=10000)
  e.add_argument("--seed", type=int, default=0)
  e.add_argument("--warmup", type=int, default=2)
  e.add_argument("--repeats", type=int, default=5)
  q = sub.add_parser("prepare", help="export every preset under --root")
  q.add_argument("--root", required=True)
  q.add_argument("--only", default="", help="comma-separated preset names")
  q.add_argument("--again", action="store_true")
  q.add_argument("--warmup", type=int, default=1)
  q.add_argument("--repeats", type=int, default=3)
  r = sub.add_parser("run", help="compile and time the exported round with JAX")
  r.add_argument("--dir", default="")
  r.add_argument("--root", default="", help="run every export under this folder")
  r.add_argument("--results", default="", help="--root: folder for the JSON results")
  r.add_argument("--csv", default="gpu_hlo_round.csv", help="--root: the CSV written")
  r.add_argument("--precisions", default="default", help="--root: comma-separated")
  r.add_argument("--only", default="", help="--root: these exports only (comma-separated)")
  r.add_argument("--backends", default="gpu,cpu")
  r.add_argument("--warmup", type=int, default=2)
  r.add_argument("--repeats", type=int, default=10)
  r.add_argument("--precision", choices=("default", "highest"), default="default",
                 help="highest: float32 products (no TF32 on a GPU)")
  r.add_argument("--out", default="")
  args = p.parse_args(argv)
  if args.mode == "run" and args.root:
    run_root(args)
  elif args.mode == "run" and not args.dir:
    p.error("run needs --dir or --root")
  else:
    {"export": export, "prepare": prepare, "run": run}[args.mode](args)
  return 0


if __name__ == "__main__":
  sys.exit(main())
