"""Driver memory and seconds per round as the federation grows: `ray` beside `local`.

Task: `synthetic` (Synthetic(1, 1)) with `--task_arg=samples_per_client=S`
(default 10: 9 training and 1 test sample per client, each client drawn from
its own seed), MCLR, FedAvg, 20 clients per round, 10 local epochs, batch 10,
lr 0.01, client momentum 0.9 persisted between rounds (per-client state),
`--groups_format=long`, evaluation of every client at the last round only,
a checkpoint at the end (the per-client states written client by client).
Each configuration runs the CLI (`run_experiment.main`) in a fresh process;
that process reports:

  driver_peak_mib   the driver's peak resident memory (ru_maxrss), the whole
                    run: TensorFlow, Ray's driver side, the catalogue, the
                    evaluation's per-client sums;
  actor_mib         each actor's resident memory after making its clients
                    (ray), from config.json's runner_info;
  data_s            loading the task's data on the driver: the catalogue
                    (both runners; the local runner's driver makes every
                    client's arrays when it is built, counted in other_s);
  median_round_s    median `round_seconds` of rounds 2..R (training, no
                    evaluation);
  eval_s            the last round's evaluation of every client;
  other_s           the rest of the run's wall time: the runner's start (Ray,
                    the actors making their clients; local: the driver
                    making every client's arrays), the initial model's
                    loss on every client, the checkpoint, the plots.

On this machine (no cluster) Ray runs inside a network namespace with only
loopback (the script re-executes itself under `unshare -n`; root only).

  python benchmarks/ray_memory.py --clients=1000,10000,100000 --runners=ray,local
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

ISOLATED_ENV = "TFF_CLUSTER_RAY_ISOLATED"
FIELDS = ("runner", "actors", "clients", "samples_per_client", "rounds", "driver_peak_mib",
          "actor_mib", "data_s", "other_s", "median_round_s", "eval_s", "client_states",
          "final_test_accuracy")


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--clients", default="1000,10000,100000")
  p.add_argument("--runners", default="ray,local")
  p.add_argument("--ray_workers", type=int, default=2)
  p.add_argument("--samples_per_client", type=int, default=10)
  p.add_argument("--rounds", type=int, default=6)
  p.add_argument("--out", default=os.path.join(REPO_ROOT, "benchmarks", "results",
                                               "ray_memory.csv"))
  p.add_argument("--child", default=None, help=argparse.SUPPRESS)
  return p.parse_args(argv)


def child(args) -> int:
  """One run in this process; prints its measurements as one JSON line."""
  runner, clients = args.child.split(":")
  out_dir = tempfile.mkdtemp(prefix="ray_memory_")
  flags = ["run_experiment.py", "--algo=fedavg", "--task=synthetic",
           f"--task_arg=samples_per_client={args.samples_per_client}",
           f"--num_clients={clients}", f"--rounds={args.rounds}", "--clients_per_round=20",
           "--local_epochs=10", "--batch_size=10", "--client_lr=0.01",
           "--client_momentum=0.9", "--client_state=persist", f"--eval_every={args.rounds}",
           f"--checkpoint_every={args.rounds}", "--groups_format=long", "--progress=false",
           f"--runner={runner}", f"--output_dir={out_dir}", "--overwrite"]
  if runner == "ray":
    flags.append(f"--ray_workers={args.ray_workers}")
  from tff_cluster import experiment as run_experiment
  start = time.perf_counter()
  code = run_experiment.main(flags)
  if code != 0:
    print(json.dumps({"error": code}))
    return code
  peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  from tff_cluster.io import checkpoint
  from tff_cluster.io import rundir
  config = rundir.read_config(out_dir)
  rows = rundir.read_metrics(out_dir, first=rundir.METRICS_JSONL)[1]
  summary = rundir.read_summary(out_dir)
  _, payload = checkpoint.load_latest(out_dir)
  wall = time.perf_counter() - start
  actors = config["runner_info"].get("actors") or []
  print(json.dumps({
      "runner": runner, "actors": len(actors) or "", "clients": int(clients),
      "samples_per_client": args.samples_per_client, "rounds": args.rounds,
      "driver_peak_mib": peak_kib / 1024,
      "actor_mib": "/".join(f"{a['memory'] / 2**20:.0f}" for a in actors if a.get("memory")),
      "data_s": config["data_seconds"],
      "other_s": wall - config["data_seconds"] - sum(r["round_seconds"] for r in rows)
                 - sum(r.get("eval_seconds") or 0.0 for r in rows),
      "median_round_s": statistics.median(r["round_seconds"] for r in rows[1:]),
      "eval_s": rows[-1]["eval_seconds"],
      "client_states": len(payload["driver"]["client_states"]),
      "final_test_accuracy": summary["final_test_accuracy"], "wall_s": wall}))
  shutil.rmtree(out_dir, ignore_errors=True)
  return 0


def main(argv=None):
  args = parse_args(argv)
  if args.child:
    return child(args)
  from tff_cluster.runners.ray_runner import loopback_only
  if "ray" in args.runners.split(",") and not loopback_only():
    if os.environ.get(ISOLATED_ENV):
      sys.exit("ray_memory.py: re-executed, yet not in a loopback-only namespace")
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
      sys.exit("ray_memory.py: a loopback-only network namespace is needed on this machine "
               "(root and `unshare`, `ip`)")
    import shlex
    inner = " ".join([f"exec {sys.executable}", *map(shlex.quote, sys.argv)])
    return subprocess.call(["unshare", "-n", "sh", "-c", f"ip link set lo up && {inner}"],
                           env=dict(os.environ, **{ISOLATED_ENV: "1"}))
  rows = []
  for clients in (int(c) for c in args.clients.split(",")):
    for runner in args.runners.split(","):
      done = subprocess.run(
          [sys.executable, os.path.abspath(__file__), f"--child={runner}:{clients}",
           f"--samples_per_client={args.samples_per_client}", f"--rounds={args.rounds}",
           f"--ray_workers={args.ray_workers}"],
          cwd=REPO_ROOT, capture_output=True, text=True)
      lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
      if done.returncode != 0 or not lines:
        print(done.stderr[-3000:], file=sys.stderr)
        sys.exit(f"ray_memory.py: {runner} with {clients} clients failed "
                 f"(exit {done.returncode})")
      row = json.loads(lines[-1])
      rows.append(row)
      print(json.dumps(row), file=sys.stderr, flush=True)
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
      writer.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in row.items()})
  print("| runner | clients | driver peak MiB | actor MiB | data s | other s | s/round | "
        "eval s |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|")
  for row in rows:
    print(f"| {row['runner']}{'' if not row['actors'] else ' x' + str(row['actors'])} | "
          f"{row['clients']:,} | {row['driver_peak_mib']:.0f} | {row['actor_mib'] or '–'} | "
          f"{row['data_s']:.2f} | {row['other_s']:.2f} | {row['median_round_s']:.3f} | "
          f"{row['eval_s']:.2f} |")
  print(f"wrote {args.out}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
