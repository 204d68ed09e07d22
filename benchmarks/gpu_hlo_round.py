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
             "femnist": os.path.join(REPO_ROOT, "..", "shared", "data", "femnist_leaf")}


def export(args) -> None:
  sys.path.insert(0, REPO_ROOT)
  import tensorflow as tf
  import tasks
  from tff_cluster import driver as driver_lib, experiment, registry
  from tff_cluster.runners import local_runner
  from tff_cluster.task import DataOptions

  setting = TASK_SETTINGS[args.task]
  task = tasks.get_task(args.task)
  options = dict(seed=args.seed)
  if DATA_DIRS[args.task]:
    options["data_dir"] = args.data_dir or DATA_DIRS[args.task]
  data = task.load_data(DataOptions(**options))
  config = experiment.TrainingConfig(
      rounds=1, clients_per_round=args.clients, local_epochs=args.epochs, batch_size=10,
      client_lr=setting["lr"], seed=args.seed, runner="local", jit="on")
  captured = {}
  original = local_runner.LocalRunner._round_fn

  def spy(self, mode, round_args):
    fn = original(self, mode, round_args)
    # The round's last argument: how many of the stacked clients train (None:
    # all of them, as the local runner calls it; the ray runner's shards pad).
    captured.update(fn=fn, args=(*round_args, None))
    return fn

  local_runner.LocalRunner._round_fn = spy
  driver = registry.get_algorithm("fedavg").make_driver(task, data, config)
  driver.setup()
  rng = np.random.default_rng(np.random.SeedSequence([args.seed, 7]))
  sampled = driver_lib.sample_clients(rng, len(data.client_ids), args.clients)
  driver.run_round(1, sampled)
  fn, round_args = captured["fn"], captured["args"]
  concrete = fn.get_concrete_function(*round_args)
  flat_args = [a for a in tf.nest.flatten(round_args) if a is not None]
  variables = {id(v.handle): v for v in concrete.variables}
  captures = [np.asarray(variables[id(t)].numpy() if t.dtype == tf.resource else t)
              for t in concrete.captured_inputs]
  values = [np.asarray(a) for a in flat_args] + captures
  compiler_ir = fn.experimental_get_compiler_ir(*round_args)
  hlo, text = compiler_ir(stage="hlo_serialized"), compiler_ir(stage="hlo")
  outputs = [np.asarray(o) for o in tf.nest.flatten(fn(*round_args))]
  times = []
  for _ in range(args.warmup + args.repeats):
    t0 = time.perf_counter()
    out = fn(*round_args)
    tf.nest.map_structure(lambda t: t.numpy(), out)
    times.append(time.perf_counter() - t0)
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "round.hlo.pb"), "wb") as f:
    f.write(hlo)
  with open(os.path.join(args.out, "round.hlo.txt"), "w") as f:
    f.write(text)
  np.savez_compressed(os.path.join(args.out, "inputs.npz"), *values)
  np.savez_compressed(os.path.join(args.out, "outputs.npz"), *outputs)
  sizes = data.num_train_samples()
  info = {
      "task": args.task, "model": setting["model"], "algorithm": "fedavg", "clients": args.clients,
      "epochs": args.epochs, "batch_size": 10, "seed": args.seed,
      "sampled": [int(k) for k in sampled],
      "examples_per_round": int(args.epochs * sizes[list(sampled)].sum()),
      "steps_per_client_padded": int(round_args[4].shape[1]),
      "inputs": [[list(v.shape), str(v.dtype)] for v in values],
      "outputs": [[list(v.shape), str(v.dtype)] for v in outputs],
      "tf_version": tf.__version__, "tf_device": driver.describe().get("device"),
      "tf_median_s": statistics.median(times[args.warmup:]),
      "tf_times_s": times[args.warmup:]}
  with open(os.path.join(args.out, "export.json"), "w") as f:
    json.dump(info, f, indent=1)
  print(json.dumps({k: v for k, v in info.items() if k != "sampled"}, indent=1))


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
      entry["speedup_vs_tf_export_machine"] = info["tf_median_s"] / entry["median_s"]
    except Exception as e:  # noqa: BLE001 -- reported, not hidden
      entry["error"] = f"{type(e).__name__}: {e}"[:2000]
  out = json.dumps(results, indent=1)
  print(out)
  if args.out:
    with open(args.out, "w") as f:
      f.write(out)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  sub = p.add_subparsers(dest="mode", required=True)
  e = sub.add_parser("export", help="write the round's HLO, inputs and TF outputs")
  e.add_argument("--out", required=True)
  e.add_argument("--task", choices=sorted(DATA_DIRS), default="synthetic")
  e.add_argument("--data_dir", default="", help="femnist: the LEAF FEMNIST folder")
  e.add_argument("--clients", type=int, default=20)
  e.add_argument("--epochs", type=int, default=20)
  e.add_argument("--seed", type=int, default=0)
  e.add_argument("--warmup", type=int, default=2)
  e.add_argument("--repeats", type=int, default=5)
  r = sub.add_parser("run", help="compile and time the exported round with JAX")
  r.add_argument("--dir", required=True)
  r.add_argument("--backends", default="gpu,cpu")
  r.add_argument("--warmup", type=int, default=2)
  r.add_argument("--repeats", type=int, default=10)
  r.add_argument("--precision", choices=("default", "highest"), default="default",
                 help="highest: float32 products (no TF32 on a GPU)")
  r.add_argument("--out", default="")
  args = p.parse_args(argv)
  (export if args.mode == "export" else run)(args)
  return 0


if __name__ == "__main__":
  sys.exit(main())
