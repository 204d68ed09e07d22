"""The personalized baselines' table: the ten personalized methods beside FedAvg, pFedMo and the best
clustered methods, each client tested with the model it would deploy.

Tasks: `mnist_workers` (pFedMo's MNIST, `--task_arg=split=label`, 20
workers, so that the spread over clients means something), the WeCFL paper's
`fmnist_clientwise_class` and `femnist` on the shared LEAF sample (51
writers). Scores (docs/outputs.md), the final round's (never a maximum over
rounds): the pooled test accuracy, the clients' data-weighted mean
(`test_accuracy_clientavg`), their unweighted mean
(`test_accuracy_client_mean`) and its spread (`_p10`, `_p50`, `_p90`); the
mean bytes a round moves and the median seconds of a round, on this
machine's CPU.

  python benchmarks/personalized_baselines.py --converge          # FedAvg's 1-point round per task
  python benchmarks/personalized_baselines.py --project           # time 4 rounds per cell
  python benchmarks/personalized_baselines.py --tasks=mnist_workers
  python benchmarks/personalized_baselines.py --record --skip_recorded --shard=0/2   # and 1/2
  python benchmarks/personalized_baselines.py --table_only --record
Each run is `run_experiment.py` in its own directory under `--out` with
checkpoints; a finished run is reused and an interrupted one resumes.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional

import numpy as np

import _cells
from _sweep import (SHARED, diverged_cell, is_diverged, load_recorded,
                    mean_std, median_round_seconds, run_rounds, save_markdown, save_recorded,
                    truncated)
from tff_cluster.io import rundir  # (_sweep put the repository on sys.path)

# The cut: each task's flags, clients per round and seeds; its rounds are
# FedAvg's 1-point round (`--converge`, as in the clustered catalogue), written
# here before the table runs (None: not measured yet).
TASKS = {
    "mnist_workers": dict(flags=[f"--data_dir={os.path.join(SHARED, 'mnist')}",
                                 "--num_clients=20", "--task_arg=split=label"],
                          clients_per_round=20, seeds="0,1,2",
                          rounds=25),  # FedAvg within 1 point only at its default 25
    "fmnist_clientwise_class": dict(flags=[
        f"--data_dir={os.path.join(SHARED, 'fashion_mnist')}"], clients_per_round=20,
        seeds="0", rounds=100),  # FedAvg within 1 point only at its default 100
    "femnist": dict(flags=[f"--data_dir={os.path.join(SHARED, 'femnist_leaf')}"],
                    clients_per_round=10, seeds="0",
                    rounds=120),  # FedAvg within 1 point from round 120 (of 200)
}
PERSONALIZED = ("ditto", "fedrep", "fedper", "lg_fedavg", "fedbn", "apfl", "perfedavg",
                "pfedme", "local_only", "fedavg_ft")
# The clustered methods that led the clustered catalogue
# (docs/reproductions/clustered_catalogue.md), with the task's K below.
CLUSTERED = ("fedgroup", "hypcluster", "flhc")
ALGOS = ("fedavg", "pfedmo", *CLUSTERED, *PERSONALIZED)
NUM_GROUPS = {"mnist_workers": 4, "fmnist_clientwise_class": 5, "femnist": 5}
# pFedMe on the three tasks' non-convex models: the authors' README's tuned
# non-convex (DNN) personal step and lambda; its beta stays 1 (the README's
# same-parameter runs, FL-bench's). At the library's convex defaults (the
# README's MCLR row: 0.1, 15) it diverged in its first round on LeNet-5 and the
# FEMNIST MLP in the projection; with these it trained (4 rounds each).
PFEDME_NONCONVEX = ["--pfedme_personal_lr=0.05", "--pfedme_lambda=30"]
# The settings of the spec's section 18 that fit offline: each paper's
# closest task here, its hyper-parameters (the authors' README or script), its
# method beside FedAvg (and pFedMe's own comparison, Per-FedAvg). None of
# these papers' numbers could be read (the spec), so only ours are shown.
SETTINGS = {
    # pFedMe's MNIST: 20 users, 2 digits each (FedProx's recipe with N = 20,
    # lognormal sizes; the authors' generator splits 75/25, ours 90/10), MCLR,
    # B 20, 800 rounds, 5 of 20 clients; each method with its own row of the
    # README's fine-tuned table (CharlieDinh/pFedMe README at 37c4957):
    # pFedMe eta 0.01, eta_p 0.1, beta 2, lambda 15, K 5, R = 20 local steps;
    # FedAvg lr 0.02, 20 steps; Per-FedAvg alpha 0.03, beta 0.003, 20
    # meta-steps (the code's local_epochs: two batches each, 40 here).
    "pfedme_mnist": dict(
        task="mnist", algos=("fedavg", "pfedme", "perfedavg"), seeds="0,1,2", rounds=800,
        clients_per_round=5, eval_every=20,
        flags=[f"--data_dir={os.path.join(SHARED, 'mnist')}", "--num_clients=20",
               "--batch_size=20"],
        algo_flags={"fedavg": ["--client_lr=0.02", "--local_steps=20"],
                    "pfedme": ["--client_lr=0.01", "--local_steps=20",
                               "--pfedme_personal_lr=0.1", "--pfedme_lambda=15",
                               "--pfedme_beta=2", "--pfedme_k=5"],
                    "perfedavg": ["--client_lr=0.03", "--local_steps=40",
                                  "--perfedavg_beta=0.003"]}),
    # pFedMe's Synthetic(0.5, 0.5): 100 users (FedProx's generator; the
    # authors' sizes differ), MCLR, B 20, 600 rounds, 10 of 100 clients; the
    # README's fine-tuned rows: pFedMe eta 0.01, eta_p 0.01, beta 2, lambda
    # 20, K 5, R 20; FedAvg lr 0.02; Per-FedAvg alpha 0.02, beta 0.002.
    "pfedme_synthetic": dict(
        task="synthetic", algos=("fedavg", "pfedme", "perfedavg"), seeds="0,1,2", rounds=600,
        clients_per_round=10, eval_every=20,
        flags=["--synthetic_alpha=0.5", "--synthetic_beta=0.5", "--batch_size=20"],
        algo_flags={"fedavg": ["--client_lr=0.02", "--local_steps=20"],
                    "pfedme": ["--client_lr=0.01", "--local_steps=20",
                               "--pfedme_personal_lr=0.01", "--pfedme_lambda=20",
                               "--pfedme_beta=2", "--pfedme_k=5"],
                    "perfedavg": ["--client_lr=0.02", "--local_steps=40",
                                  "--perfedavg_beta=0.002"]}),
    # LG-FedAvg's MNIST: 100 users with 2 digits each (FedProx's recipe; the
    # authors deal 2 sorted shards), lr 0.05, B 10, E 1, 10 of 100, 200 rounds;
    # our MLP (784-128-10, its output layer shared) is smaller than the
    # authors' 784-512-256-256-128-10: not comparable in model.
    "lg_mnist": dict(
        task="mnist", algos=("fedavg", "lg_fedavg"), seeds="0,1,2", rounds=200,
        clients_per_round=10, eval_every=10,
        flags=[f"--data_dir={os.path.join(SHARED, 'mnist')}", "--num_clients=100",
               "--model=mlp", "--batch_size=10", "--client_lr=0.05", "--local_epochs=1"]),
    # Ditto's FMNIST: 500 users with 5 classes each (equal shares here; the
    # authors' script draws lognormal sizes and proportions), our FMNIST CNN;
    # the script's lr 0.05, B 16, 2 local iterations, lambda 1, 10 clients a
    # round; 2,000 of its 5,000 rounds (CPU time), seed 0.
    "ditto_fmnist": dict(
        task="fmnist_clientwise_class", algos=("fedavg", "ditto"), seeds="0", rounds=2000,
        clients_per_round=10, eval_every=100,
        flags=[f"--data_dir={os.path.join(SHARED, 'fashion_mnist')}", "--num_clients=500",
               "--task_arg=classes_per_client=5", "--batch_size=16", "--client_lr=0.05",
               "--local_steps=2", "--client_momentum=0"],
        algo_flags={"ditto": ["--ditto_lambda=1"]}),
    # FedRep's Sent140 on the shared partial Sent140 with 50-d GloVe (not
    # comparable: 124 users with 5 or more tweets, the authors' LEAF sample
    # has 183): E 15 with 10 head epochs (E_rep 5), B 4, lr 0.01, 10 % of the
    # clients a round (12), 50 rounds.
    "fedrep_sent140": dict(
        task="sent140", algos=("fedavg", "fedrep"), seeds="0", rounds=50,
        clients_per_round=12, eval_every=5,
        flags=[f"--data_dir={os.path.join(SHARED, 'sent140_partial')}",
               f"--glove_path={os.path.join(SHARED, 'sent140_partial')}",
               "--task_arg=min_tweets=5", "--batch_size=4", "--client_lr=0.01",
               "--local_epochs=15"],
        algo_flags={"fedrep": ["--fedrep_head_epochs=10"]}),
}
# Cells left out: FedBN where the model has no BatchNorm layer (LeNet-5, the
# FEMNIST MLP; it refuses them in one line); pFedMo, cross-silo (every client
# every round), on the 200- and 51-client tasks (the cut, written before any
# table run: 39.01 and 28.32 s a round, 66.6 and 57.4 min a seed); pFedMe, whose
# every client trains every round (the authors' rule), there too (108.55 and
# 46.5 s a round in the projection, 181.5 and about 93 min); each setting's
# algorithms but its own.
LEFT_OUT = {"mnist_workers": ("fedbn",), "fmnist_clientwise_class": ("pfedmo", "pfedme"),
            "femnist": ("fedbn", "pfedmo", "pfedme"),
            **{name: tuple(a for a in ALGOS if a not in c["algos"])
               for name, c in SETTINGS.items()}}
TASKS.update(SETTINGS)
EVAL_EVERY = 5
NAME = "personalized_baselines"  # benchmarks/recorded/NAME.csv, results/NAME/
RECORD_KEY = ("algo", "task", "seed")
SCORES = ("accuracy", "accuracy_clientavg", "accuracy_client_mean", "accuracy_p10",
          "accuracy_p50", "accuracy_p90")
RECORD_FIELDS = RECORD_KEY + ("rounds", *SCORES, "bytes_per_round", "seconds_per_round",
                              "diverged_round")


def flags_for(algo: str, task: str, cpr: int) -> List[str]:
  """A cell's flags; a cross-silo algorithm (pFedMo: every client every
  round) takes every client."""
  from tff_cluster import registry  # TF-free
  c = TASKS[task]
  flags = [f"--algo={algo}", f"--task={c.get('task', task)}", *c["flags"],
           "--checkpoint_every=10", *c.get("algo_flags", {}).get(algo, ())]
  if cpr is not None and not registry.ALGORITHMS[algo].all_clients:
    flags.append(f"--clients_per_round={cpr}")
  if algo in CLUSTERED:
    flags.append(f"--num_groups={NUM_GROUPS[task]}")
  if algo == "pfedme" and task not in SETTINGS:
    flags += PFEDME_NONCONVEX
  return flags


def cut(task: str, args) -> Dict[str, object]:
  c = TASKS[task]
  return {"clients_per_round": args.clients_per_round or c["clients_per_round"],
          "seeds": [int(x) for x in (args.seeds or c["seeds"]).split(",")],
          "rounds": args.rounds or c["rounds"]}


def score(directory: str) -> Optional[Dict[str, object]]:
  """The record of a finished run: its final round's scores, or, for a run
  the divergence guard stopped, the round it diverged in and no scores (None
  if it has not finished)."""
  summary = rundir.read_summary(directory) or {}
  diverged = is_diverged(summary)
  if not summary.get("completed") and not diverged:
    return None
  _, rows = rundir.read_metrics(directory)
  last = rows[-1]
  moved = [float(r["bytes_down"]) + float(r["bytes_up"]) for r in rows]

  def value(key):
    return "" if diverged or last.get(key) in (None, "") else float(last[key])

  return {"rounds": run_rounds(directory) if diverged else int(last["round"]),
          **{s: value(s.replace("accuracy", "test_accuracy", 1)) for s in SCORES},
          "bytes_per_round": int(np.mean(moved)),
          "seconds_per_round": truncated(median_round_seconds(directory), 3),
          "diverged_round": summary["diverged_round"] if diverged else ""}


def main(argv=None):
  p = _cells.parser(__doc__.splitlines()[0], TASKS, ALGOS, NAME)
  args = p.parse_args(argv)
  _cells.check_names("personalized_baselines.py", args, TASKS, ALGOS)
  tasks = args.tasks.split(",")
  if args.markdown:
    return save_markdown(args.markdown, markdown())
  if args.converge:
    return _cells.converge(tasks, args, cut, flags_for, [f"--eval_every={EVAL_EVERY}"])
  if args.project:
    return _cells.project(tasks, args, cut, flags_for, LEFT_OUT)
  save = lambda rows: save_recorded(NAME, rows, RECORD_KEY, RECORD_FIELDS)  # noqa: E731
  records = _cells.run_cells("personalized_baselines.py", tasks, args, cut, flags_for,
                             lambda task: TASKS[task].get("eval_every", EVAL_EVERY), score,
                             LEFT_OUT, record=save if args.record else None,
                             recorded=_cells.recorded_cells(NAME) if args.skip_recorded
                             else frozenset())
  if args.record and records:
    save(records)


def markdown() -> str:
  """The recorded table, one block per task: mean ± std over the recorded
  seeds (percent), MB a round, the median seconds of a round beside FedAvg's."""
  def cells(mine):
    """Mean ± std over the seeds that finished; the seeds the divergence
    guard stopped are named in the first cell."""
    ok = [r for r in mine if not r.get("diverged_round")]
    out = [mean_std([_cells.number(r, s) for r in ok]) for s in SCORES]
    stopped = [int(r["diverged_round"]) for r in mine if r.get("diverged_round")]
    if stopped:
      said = diverged_cell(stopped, len(mine))
      out[0] = said if not ok else f"{out[0]} ({said})"
    return out

  out = _cells.task_blocks(load_recorded(NAME), TASKS, ALGOS,
                           ["accuracy %", "client-avg %", "client mean %", "p10 %", "p50 %",
                            "p90 %"], cells)
  return "\n".join(out)


if __name__ == "__main__":
  main()
