"""tff-cluster beside pfl-research and Flower: the same settings, the same arrays.

  python benchmarks/peers.py                      # every framework found, 3 settings, seeds 0-2
  python benchmarks/peers.py --frameworks=ours,pfl --settings=femnist_e1 --seeds=0 --rounds=2

Run it with tff-cluster's own Python (the checkout's venv, e.g.
`.venv-py3.12/bin/python benchmarks/peers.py`); the harness itself uses only the
standard library and numpy. Each peer runs in a virtual environment of its own
under --peers_root (default /work/peers), with its script from
`benchmarks/peers/`; a peer whose environment is missing is skipped, and the
reason (with the commands below) is written to the CSV and the table.

The peer environments
---------------------
Made on Python 3.12.1 (pyenv), with uv 0.13, and the versions they resolved
to (`benchmarks/peers/pfl.lock.txt` and `flower.lock.txt` are `uv pip freeze`
of each; `uv pip install --python ENV/bin/python -r LOCK` rebuilds it exactly):

  # pfl-research 0.6.0, TensorFlow backend (TF 2.21.0 = tff-cluster's, tf_keras 2.21.0, TFP 0.25.0)
  uv venv --python "$(pyenv root)/versions/3.12.1/bin/python" /work/peers/pfl
  uv pip install --python /work/peers/pfl/bin/python "pfl[tf]==0.6.0" \
      tensorflow==2.21.0 tf-keras==2.21.0 tensorflow-probability==0.25.0

  # Flower 1.42.0 with its simulation extra (ray 2.55.1), clients in Keras 3 on TF 2.21.0
  uv venv --python "$(pyenv root)/versions/3.12.1/bin/python" /work/peers/flower
  uv pip install --python /work/peers/flower/bin/python "flwr[simulation]==1.42.0" tensorflow==2.21.0

Why TensorFlow for both: tff-cluster is TensorFlow/Keras, and pfl 0.6.0 allows
any TensorFlow 2.16-2.x (`Requires-Dist: tensorflow (>=2.16.1,<3.0.0)` for its
`tf` extra), so every framework runs the same TensorFlow release and the same
CPU kernels. pfl's `TFModel` keys variables by `variable.name`, which Keras 3
no longer makes unique, so pfl's model is built in tf_keras (Keras 2;
TF_USE_LEGACY_KERAS=1), as pfl's TF benchmarks are. Flower's clients use Keras
3 (`model.fit`), as tff-cluster's default stack does.

Settings (--settings)
---------------------
  femnist_e1, femnist_e20  LEAF FEMNIST sample (--femnist_dir, 51 writers, as
      tff-cluster's `--task=femnist --data_dir` splits it), MLP 784-512-62,
      plain SGD, 10 clients a round, batch 10, client lr 0.03, server lr 1
      (FedAvg weighted by the clients' sample counts), E = 1 or 20 local
      epochs, --rounds rounds, evaluated after every round on all clients'
      test data.
  cifar10_pfl6  pfl-research's CIFAR-10 setting: 1,000 users x 50 IID images,
      pfl's simple CNN (1,626,442 parameters), cohort 50, 1 local epoch, batch
      10, local lr 0.1, central lr 1.0, every user weighted alike, evaluation
      every 10 rounds (and, in tff-cluster, the last), --cifar_rounds (6)
      rounds. The images are random uint8 images and labels of CIFAR-10's
      shape (seed 20240), written in CIFAR-10's python-pickle layout to a
      temp folder: CIFAR-10 itself is not downloaded.

Every framework trains on identical arrays: `benchmarks/peers/export_data.py`
runs tff-cluster's loader (under this Python) and writes, for each (setting,
seed), the clients' arrays and tff-cluster's own client schedule (the clients
`run_experiment.py --seed=S` samples each round) to a temp folder under /tmp;
the peers read them (memory-mapped) and train exactly those clients in those
rounds. tff-cluster itself runs `run_experiment.py` (fedavg, runner local),
which loads the data itself.

What is measured
----------------
  process_seconds       wall time of the whole subprocess, measured here: the
                        interpreter's start, imports, data loading, every
                        round, evaluation and shutdown (Flower's includes
                        starting and stopping Ray).
  median_round_seconds  the median over rounds of one round's training
                        seconds, without evaluation: tff-cluster's
                        `round_seconds` in metrics.csv (training and
                        aggregation); pfl's from the start of an iteration to
                        the model update (`pfl_run.py`); Flower's from
                        `configure_fit` to the end of `aggregate_fit`
                        (`flower_run.py`). Round 1 carries each framework's
                        tracing / start-up, so take enough rounds (the
                        median then ignores it).
The frameworks are interleaved per seed (ours, pfl, flower, ours, ...) so the
shared machine's load falls on all alike. Flower (and Ray) run inside
`unshare -n` with only loopback up: nothing leaves 127.0.0.1 (root needed;
without it Flower is skipped).

Where the frameworks differ (read the ratios with these in mind)
  * Data: tff-cluster's process reads LEAF's JSON / CIFAR-10's pickles and
    builds all clients, and scores the initial model on each client a round
    holds (its divergence guard's baseline). On cifar10_pfl6 each peer
    prepares the data in its own process too, as pfl's benchmark does: reads
    the pickles, standardises the 50,000 images, cuts the 1,000 users
    (`peer_common.prepare_cifar10_users`, the same numpy steps; its users are
    checked equal to the exported ones, which it then trains on). On FEMNIST
    the peers read ready arrays of the sampled clients only (the export,
    timed in peers.md, is charged to no one), so there process_seconds favour
    the peers by about ours' LEAF parsing (1.2 s).
  * Local training: tff-cluster's local runner trains a round's clients in
    compiled (XLA) calls, padded to the largest client's step count; pfl calls
    one tf.function per batch from Python, in one process, clients one after
    another (its multi-worker mode is not used), and batches each user's rows
    in one order for all local epochs (shuffled once per round here); Flower
    runs Keras `model.fit` per client in 2 Ray actors of 1 CPU each (Flower's
    default resources), so 2 clients train at once. Every framework uses
    batch 10 with a smaller last batch, plain SGD, and weights clients by their
    sample counts where the setting does.
  * Start-up: Flower's round 1 includes starting the Ray actors (each imports
    TensorFlow); pfl's round 1 includes its per-user before/after scores
    (pfl's `evaluation_frequency`, iteration 0); everyone's round 1 includes
    tracing. The per-round median leaves round 1 out once there are >= 3
    rounds.
  * Evaluation (outside the round times, inside process_seconds): FEMNIST,
    R evaluations each on the pooled test set (pfl: before training and after
    rounds 2..R, its callback's rule; tff-cluster and Flower: after rounds
    1..R); cifar10_pfl6, one each (pfl: before training; tff-cluster and
    Flower: after the last round). The cifar10_pfl task's default
    --eval_every is 1 although docs/tasks.md gives pfl's setting as every 10,
    so tff-cluster gets --eval_every=10 here explicitly.
  * Keras: pfl's model is tf_keras (Keras 2), tff-cluster's and Flower's
    Keras 3; the same TensorFlow 2.21.0 everywhere. The peers seed Keras with
    the run's seed, which on FEMNIST seed 0 gives the very initial weights
    tff-cluster starts from (same initial test accuracy, 0.0048).

tff-cluster runs from a copy of tff_cluster/ and run_experiment.py taken at
start (--library=worktree, the default) or from a commit (--library=HEAD, or
any commit: git archive), so edits to the checkout during a run change
nothing; the data export imports the same copy.

Cost: the default (3 settings x 3 seeds x 3 frameworks, --rounds=5) is
projected at 19-23 minutes on the 2-core machine it was written on (AMD EPYC,
shared; the range is the other load on it), from three smoke runs (--seeds=0
--rounds=2 --cifar_rounds=2: 4.8, 5.9 and 6.3 minutes) and their round-2
times: every further FEMNIST round costs 11-15 s summed over the three
frameworks (E = 20: ours 0.7-1.1 s, pfl 3.5-4.3, Flower 6.5-7.8; E = 1: 0.06,
0.2-0.25, 0.7-1.0), so one more --rounds adds 35-45 s over three seeds.

Output (--out, default benchmarks/results): peers.csv (one row per run:
framework, version, setting, seed, rounds, process_seconds,
median_round_seconds, notes) and peers.md (per setting and framework the
median over seeds of both numbers and the ratio peer / ours; the versions;
the machine).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.metadata
import json
import os
import pickle
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER_DIR = os.path.join(REPO_ROOT, "benchmarks", "peers")
PREFIX = "PEERS_JSON "
FRAMEWORKS = ("ours", "pfl", "flower")
CIFAR_IMAGE_SEED = 20240
FIELDS = ("framework", "version", "setting", "seed", "rounds", "process_seconds",
          "median_round_seconds", "host_share", "parts_gap", "notes")

# One peer framework: its environment's folder under --peers_root, the
# packages whose versions identify it, its script, and how to make the env.
PEERS = {
    "pfl": dict(
        packages=("pfl", "tensorflow", "tf-keras", "tensorflow-probability"),
        script="pfl_run.py",
        create=('uv venv --python "$(pyenv root)/versions/3.12.1/bin/python" {env} && '
                'uv pip install --python {env}/bin/python "pfl[tf]==0.6.0" tensorflow==2.21.0 '
                'tf-keras==2.21.0 tensorflow-probability==0.25.0')),
    "flower": dict(
        packages=("flwr", "ray", "tensorflow", "keras"),
        script="flower_run.py",
        create=('uv venv --python "$(pyenv root)/versions/3.12.1/bin/python" {env} && '
                'uv pip install --python {env}/bin/python "flwr[simulation]==1.42.0" '
                'tensorflow==2.21.0')),
}

SETTINGS: Dict[str, Dict[str, Any]] = {
    "femnist_e1": dict(task="femnist", model="mlp", local_epochs=1, clients_per_round=10,
                       batch_size=10, client_lr=0.03, server_lr=1.0, eval_every=1,
                       weighting="examples"),
    "femnist_e20": dict(task="femnist", model="mlp", local_epochs=20, clients_per_round=10,
                        batch_size=10, client_lr=0.03, server_lr=1.0, eval_every=1,
                        weighting="examples"),
    # pfl-research's setting (tff_cluster/tasks/cifar10.py PFL_DEFAULTS, docs/tasks.md):
    # the task's own defaults, and evaluation every 10 rounds.
    "cifar10_pfl6": dict(task="cifar10_pfl", model="simple_cnn", local_epochs=1,
                         clients_per_round=50, batch_size=10, client_lr=0.1, server_lr=1.0,
                         eval_every=10, weighting="uniform"),
}
DEFAULT_ROUNDS = 5  # FEMNIST rounds: the default benchmark then fits in ~25 min (docstring)


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog="See the module docstring for what is measured.")
  p.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                 help="comma-separated, of: ours, pfl, flower")
  p.add_argument("--settings", default=",".join(SETTINGS),
                 help=f"comma-separated, of: {', '.join(SETTINGS)}")
  p.add_argument("--seeds", default="0,1,2", help="comma-separated integers")
  p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                 help="rounds of the FEMNIST settings")
  p.add_argument("--cifar_rounds", type=int, default=6,
                 help="rounds of cifar10_pfl6 (its setting: 6)")
  p.add_argument("--out", default=os.path.join(REPO_ROOT, "benchmarks", "results"))
  p.add_argument("--peers_root", default="/work/peers",
                 help="folder holding the peers' environments pfl/ and flower/")
  p.add_argument("--femnist_dir", default=os.path.join(os.path.dirname(REPO_ROOT), "shared",
                                                       "data", "femnist_leaf"))
  p.add_argument("--flower_client_cpus", type=int, default=1,
                 help="Ray num_cpus of one Flower client actor (Flower's default 1)")
  p.add_argument("--timeout", type=float, default=1800,
                 help="seconds one run may take before it is stopped")
  p.add_argument("--library", default="worktree",
                 help="the tff-cluster measured: 'worktree' (a copy of tff_cluster/ and "
                      "run_experiment.py taken at start) or a git commit (git archive)")
  p.add_argument("--keep_logs", default="",
                 help="folder to keep every run's output in (default: removed)")
  args = p.parse_args(argv)
  args.frameworks = _names(p, args.frameworks, FRAMEWORKS, "--frameworks")
  args.settings = _names(p, args.settings, tuple(SETTINGS), "--settings")
  try:
    args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
  except ValueError:
    p.error(f"invalid --seeds={args.seeds!r}; valid: comma-separated integers")
  if not args.seeds:
    p.error("--seeds is empty")
  if args.rounds < 1 or args.cifar_rounds < 1:
    p.error("--rounds and --cifar_rounds must be >= 1")
  if not 1 <= args.flower_client_cpus <= (os.cpu_count() or 1):
    p.error(f"invalid --flower_client_cpus={args.flower_client_cpus}; valid: 1..{os.cpu_count()}")
  return args


def _names(p, given: str, valid: Tuple[str, ...], flag: str) -> List[str]:
  names = [n.strip() for n in given.split(",") if n.strip()]
  bad = [n for n in names if n not in valid]
  if bad or not names:
    p.error(f"invalid {flag}={given!r}; valid: comma-separated, of {', '.join(valid)}")
  return list(dict.fromkeys(names))


# -- the frameworks ------------------------------------------------------------


class Framework:
  """One framework: how to start a run, its versions, or why it is skipped."""

  def __init__(self, name: str, python: str = "", versions: Optional[Dict[str, str]] = None,
               skip: str = "", python_version: str = ""):
    self.name, self.python, self.skip = name, python, skip
    self.versions = versions or {}
    self.python_version = python_version
    self.backend = ""  # what the peer's script says it runs (its "start" line)
    self.library = ""  # ours: the frozen copy of tff-cluster it runs

  @property
  def version(self) -> str:
    v = self.versions
    if self.name == "ours":
      return (f"tff-cluster {v.get('tff-cluster', '?')} (TF {v.get('tensorflow', '?')}, "
              f"Keras {v.get('keras', '?')})")
    if self.name == "pfl":
      return (f"pfl {v.get('pfl', '?')} (TF {v.get('tensorflow', '?')}, "
              f"tf-keras {v.get('tf-keras', '?')})")
    return (f"flwr {v.get('flwr', '?')} (ray {v.get('ray', '?')}, TF "
            f"{v.get('tensorflow', '?')}, Keras {v.get('keras', '?')})")


def _git(*args: str) -> str:
  try:
    return subprocess.run(["git", "-C", REPO_ROOT, *args], capture_output=True, text=True,
                          timeout=30).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return ""


def snapshot_library(library: str, tmp: str) -> Tuple[str, str]:
  """(folder, label): a frozen copy of tff_cluster/ and run_experiment.py that
  every run of the benchmark (and the data export) imports, so that edits to
  the checkout while the benchmark runs change nothing in it."""
  target = os.path.join(tmp, "library")
  os.makedirs(target)
  head = _git("rev-parse", "--short", "HEAD") or "?"
  if library == "worktree":
    shutil.copytree(os.path.join(REPO_ROOT, "tff_cluster"), os.path.join(target, "tff_cluster"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(REPO_ROOT, "run_experiment.py"), target)
    dirty = _git("status", "--porcelain", "--", "tff_cluster", "run_experiment.py")
    return target, f"{head}" + (" + uncommitted changes" if dirty else "")
  archive = subprocess.run(["git", "-C", REPO_ROOT, "archive", library, "tff_cluster",
                            "run_experiment.py"], capture_output=True)
  if archive.returncode:
    raise ValueError(f"invalid --library={library!r}: {archive.stderr.decode()[:200].strip()}; "
                     "valid: worktree or a git commit")
  subprocess.run(["tar", "-x", "-C", target], input=archive.stdout, check=True)
  return target, f"commit {_git('rev-parse', '--short', library)}"


def find_ours(library: Tuple[str, str]) -> Framework:
  folder, label = library
  versions = {}
  for package in ("tensorflow", "keras", "numpy"):
    try:
      versions[package] = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
      if package == "tensorflow":
        return Framework("ours", skip=(f"TensorFlow is not installed for {sys.executable}: "
                                       "run peers.py with tff-cluster's own Python"))
  versions["tff-cluster"] = label
  fw = Framework("ours", sys.executable, versions, python_version=platform.python_version())
  fw.library = folder
  return fw


def find_peer(name: str, peers_root: str) -> Framework:
  spec = PEERS[name]
  env = os.path.join(peers_root, name)
  python = os.path.join(env, "bin", "python")
  package = spec["packages"][0]
  create = spec["create"].format(env=env)
  if not os.path.exists(python):
    return Framework(name, skip=f"{package} not installed in {env}: create it with {create}")
  probe = ("import importlib.metadata as m, json, platform\n"
           f"names = {list(spec['packages'])!r}\n"
           "found = {}\n"
           "for n in names:\n"
           "  try: found[n] = m.version(n)\n"
           "  except m.PackageNotFoundError: pass\n"
           "print(json.dumps({'versions': found, 'python': platform.python_version()}))\n")
  try:
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
    info = json.loads(out.stdout.strip().splitlines()[-1])
  except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
    return Framework(name, skip=f"{python} does not run ({e!r}): recreate it with {create}")
  missing = [p for p in spec["packages"] if p not in info["versions"]]
  if missing:
    return Framework(name, skip=(f"{', '.join(missing)} not installed in {env}: create it "
                                 f"with {create}"))
  fw = Framework(name, python, info["versions"], python_version=info["python"])
  if name == "flower":
    why = loopback_only_problem()
    if why:
      fw.skip = why
  return fw


def loopback_only_problem() -> str:
  """Why Flower cannot run in a loopback-only network namespace here ('' when
  it can)."""
  if not (shutil.which("unshare") and shutil.which("ip")):
    return "Flower skipped: needs `unshare` and `ip` to keep Ray on loopback"
  try:
    r = subprocess.run(["unshare", "-n", "sh", "-c", "ip link set lo up"],
                       capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.SubprocessError) as e:
    return f"Flower skipped: `unshare -n` failed ({e!r}); it keeps Ray on loopback"
  if r.returncode:
    return ("Flower skipped: `unshare -n` (a loopback-only network namespace for Ray) needs "
            f"root: {r.stderr.strip()[:200]}")
  return ""


# -- data ------------------------------------------------------------------------


def write_random_cifar10(folder: str, seed: int = CIFAR_IMAGE_SEED) -> str:
  """Random uint8 images and labels in CIFAR-10's python-pickle layout
  (cifar-10-batches-py/data_batch_1..5, test_batch: dicts of bytes keys, a
  [10000, 3072] uint8 array, a list of int labels); returns the data dir."""
  batches = os.path.join(folder, "cifar-10-batches-py")
  os.makedirs(batches, exist_ok=True)
  rng = np.random.default_rng(seed)
  for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
    batch = {b"batch_label": name.encode(),
             b"labels": [int(v) for v in rng.integers(0, 10, 10000)],
             b"data": rng.integers(0, 256, (10000, 3072), dtype=np.uint8),
             b"filenames": [b"random_%05d.png" % i for i in range(10000)]}
    with open(os.path.join(batches, name), "wb") as f:
      pickle.dump(batch, f, protocol=2)
  return folder


def data_dir_of(setting: str, args, tmp: str) -> str:
  if SETTINGS[setting]["task"] == "femnist":
    return args.femnist_dir
  folder = os.path.join(tmp, "cifar10_random")
  if not os.path.isdir(folder):
    write_random_cifar10(folder)
  return folder


def rounds_of(setting: str, args) -> int:
  return args.cifar_rounds if SETTINGS[setting]["task"] == "cifar10_pfl" else args.rounds


def child_env(framework: str, library: str = "") -> Dict[str, str]:
  env = dict(os.environ)
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  env.pop("TF_USE_LEGACY_KERAS", None)
  if framework == "ours":
    env["PYTHONPATH"] = library
  else:
    env["PYTHONPATH"] = PEER_DIR
  if framework == "pfl":
    env["TF_USE_LEGACY_KERAS"] = "1"
  if framework == "flower":
    env["FLWR_TELEMETRY_ENABLED"] = "0"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
  return env


# -- running ---------------------------------------------------------------------


def run_logged(cmd: List[str], env: Dict[str, str], log_path: str, timeout: float
               ) -> Tuple[Optional[int], float]:
  """Runs `cmd` (its own process group) with stdout and stderr to `log_path`;
  (exit code or None on timeout, wall seconds)."""
  started = time.perf_counter()
  with open(log_path, "w") as log:
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, cwd=REPO_ROOT, start_new_session=True)
    try:
      rc: Optional[int] = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      rc = None
      try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
      except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
          os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
        proc.wait()
  return rc, time.perf_counter() - started


def tail(path: str, lines: int = 3) -> str:
  try:
    with open(path, errors="replace") as f:
      text = [l.strip() for l in f if l.strip() and not l.startswith(PREFIX)]
  except OSError:
    return ""
  return " | ".join(text[-lines:])[-400:]


def export_key(setting: str, seed: int, args) -> Tuple[str, int, int, int]:
  """What an export depends on: femnist_e1 and femnist_e20 share theirs."""
  s = SETTINGS[setting]
  return (s["task"], seed, rounds_of(setting, args), s["clients_per_round"])


def export(setting: str, seed: int, args, tmp: str, ours_python: str) -> Tuple[str, float]:
  """tff-cluster's arrays and schedule of (setting, seed) for the peers."""
  s = SETTINGS[setting]
  name = "_".join(map(str, export_key(setting, seed, args)))
  folder = os.path.join(tmp, f"data_{name}")
  log = os.path.join(tmp, f"export_{name}.log")
  cmd = [ours_python, os.path.join(PEER_DIR, "export_data.py"), f"--task={s['task']}",
         f"--data_dir={data_dir_of(setting, args, tmp)}", f"--seed={seed}",
         f"--rounds={rounds_of(setting, args)}",
         f"--clients_per_round={s['clients_per_round']}", f"--out={folder}"]
  rc, seconds = run_logged(cmd, child_env("ours", args.library_dir), log, args.timeout)
  if rc != 0:
    raise RuntimeError(f"export of {setting} seed {seed} failed (rc={rc}): {tail(log)}")
  return folder, seconds


def run_ours(fw: Framework, setting: str, seed: int, args, tmp: str, log: str
             ) -> Dict[str, Any]:
  s = SETTINGS[setting]
  out = os.path.join(tmp, f"ours_{setting}_seed{seed}")
  cmd = [fw.python, os.path.join(fw.library, "run_experiment.py"), "--algo=fedavg",
         f"--task={s['task']}", f"--data_dir={data_dir_of(setting, args, tmp)}",
         f"--rounds={rounds_of(setting, args)}", f"--seed={seed}", "--noprogress",
         f"--output_dir={out}"]
  if s["task"] == "femnist":
    cmd[6:6] = [f"--clients_per_round={s['clients_per_round']}",
                f"--local_epochs={s['local_epochs']}", f"--client_lr={s['client_lr']}",
                f"--batch_size={s['batch_size']}"]
  else:
    # pfl's evaluation frequency (docs/tasks.md: "evaluated every 10 rounds
    # (--eval_every=10)"); the task's defaults give everything else.
    cmd.insert(6, f"--eval_every={s['eval_every']}")
  rc, seconds = run_logged(cmd, child_env("ours", fw.library), log, args.timeout)
  result = {"process_seconds": seconds, "rc": rc}
  try:
    with open(os.path.join(out, "metrics.csv"), newline="") as f:
      rows = list(csv.DictReader(f))
    result["round_seconds"] = [float(r["round_seconds"]) for r in rows if r["round_seconds"]]
    evals = [float(r["eval_seconds"]) for r in rows if r.get("eval_seconds")]
    with open(os.path.join(out, "summary.json")) as f:
      summary = json.load(f)
    # tff-cluster's own account (summary.json's process_time): the host side
    # over the training (both summed over the rounds, compilation apart), and
    # the share of the wall time measured here that no part holds.
    parts = summary.get("process_time") or {}
    if parts.get("training"):
      result["host_share"] = parts["host"] / parts["training"]
      result["parts_gap"] = (seconds - (parts["process"] - parts["unaccounted"])) / seconds
    result["notes"] = (
        f"final_test_accuracy {summary.get('final_test_accuracy', float('nan')):.4f}; "
        f"{len(evals)} evaluations, {sum(evals):.2f} s; summary total_seconds "
        f"{summary.get('total_seconds', float('nan')):.1f} (the training loop's own clock; "
        "the process adds imports and data loading)")
  except (OSError, ValueError, KeyError, TypeError) as e:
    result.setdefault("notes", f"no metrics ({type(e).__name__})")
  shutil.rmtree(out, ignore_errors=True)
  return result


def run_peer(fw: Framework, setting: str, seed: int, data: str, args, tmp: str, log: str
             ) -> Dict[str, Any]:
  s = SETTINGS[setting]
  with open(os.path.join(data, "data.json")) as f:
    info = json.load(f)
  rounds = rounds_of(setting, args)
  spec = dict(s, setting=setting, seed=seed, rounds=rounds, data=data,
              input_shape=info["input_shape"], num_classes=info["num_classes"],
              eval_batch_size=1000, flower_client_cpus=args.flower_client_cpus,
              # pfl's CIFAR-10 setting: the peer reads and prepares CIFAR-10's
              # files itself, as ours does (its users are checked equal to the
              # exported ones); FEMNIST's peers read the exported arrays only.
              cifar_dir=(os.path.join(data_dir_of(setting, args, tmp), "cifar-10-batches-py")
                         if s["task"] == "cifar10_pfl" else None),
              ray_temp_dir=os.path.join(tmp, "ray"),
              # FEMNIST: no per-user scores inside pfl's rounds (tff-cluster has
              # none); pfl's CIFAR-10 setting keeps its own (every 10).
              pfl_local_eval_every=(rounds + 1 if s["task"] == "femnist" else s["eval_every"]))
  spec_path = os.path.join(tmp, f"spec_{fw.name}_{setting}_seed{seed}.json")
  with open(spec_path, "w") as f:
    json.dump(spec, f, indent=1)
  cmd = [fw.python, os.path.join(PEER_DIR, PEERS[fw.name]["script"]), spec_path]
  if fw.name == "flower":
    # A network namespace with only loopback: Ray and Flower stay on 127.0.0.1.
    cmd = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"] + cmd
  rc, seconds = run_logged(cmd, child_env(fw.name), log, args.timeout)
  events = []
  with open(log, errors="replace") as f:
    for line in f:
      if line.startswith(PREFIX):
        try:
          events.append(json.loads(line[len(PREFIX):]))
        except ValueError:
          pass
  rounds_seen = [e for e in events if e.get("event") == "round"]
  evals = [e for e in events if e.get("event") == "eval"]
  start = next((e for e in events if e.get("event") == "start"), {})
  if start.get("versions"):
    fw.versions.update(start["versions"])
  if start.get("backend"):
    fw.backend = start["backend"]
  notes = []
  if evals:
    last = evals[-1]
    acc = last.get("accuracy")
    notes.append(f"last evaluated accuracy {acc:.4f}" if isinstance(acc, (int, float))
                 else "last evaluation without accuracy")
  notes.append(f"{len(evals)} evaluations, {sum(e.get('seconds', 0) for e in evals):.2f} s")
  if "import_seconds" in start:
    notes.append(f"imports {start['import_seconds']:.1f} s")
  if rc == 0 and not any(e.get("event") == "done" for e in events):
    rc = -1
  return {"process_seconds": seconds, "rc": rc,
          "round_seconds": [float(e["train_seconds"]) for e in rounds_seen],
          "notes": "; ".join(notes)}


# -- output ----------------------------------------------------------------------


def cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "?"


def load_average() -> str:
  try:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())
  except OSError:
    return "?"


def fmt(value: Optional[float], digits: int = 3) -> str:
  return "" if value is None else f"{value:.{digits}f}"


def write_csv(path: str, rows: List[Dict[str, Any]]) -> None:
  tmp_path = path + ".tmp"
  with open(tmp_path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=FIELDS)
    writer.writeheader()
    for row in rows:
      writer.writerow({k: row.get(k, "") for k in FIELDS})
  os.replace(tmp_path, path)


def median_or_none(values: List[float]) -> Optional[float]:
  return statistics.median(values) if values else None


def write_md(path: str, rows: List[Dict[str, Any]], frameworks: Dict[str, Framework], args,
             machine: Dict[str, str], command: str) -> None:
  lines = ["# tff-cluster beside pfl-research and Flower", "",
           f"Written by `{command}` ({machine['finished']}; started {machine['started']}).",
           "Per setting and framework: the median over seeds of the per-round median "
           "training seconds (evaluation excluded) and of the whole process's wall seconds; "
           "ratio = peer / ours (above 1: the peer is slower). What each framework times: "
           "`benchmarks/peers.py`'s docstring.", ""]
  for setting in args.settings:
    s = SETTINGS[setting]
    rounds = rounds_of(setting, args)
    lines += [f"## {setting}", "",
              f"`{s['task']}`, model {s['model']}, {s['clients_per_round']} clients a round, "
              f"E = {s['local_epochs']}, batch {s['batch_size']}, client lr {s['client_lr']}, "
              f"server lr {s['server_lr']}, {rounds} rounds, evaluation every "
              f"{s['eval_every']} round(s); seeds {', '.join(map(str, args.seeds))}.", "",
              "| framework | runs | median round s | ratio | median process s | ratio | notes |",
              "|---|---|---|---|---|---|---|"]
    summary = {}
    for name in args.frameworks:
      mine = [r for r in rows if r["framework"] == name and r["setting"] == setting
              and r.get("median_round_seconds") not in ("", None)]
      summary[name] = (median_or_none([float(r["median_round_seconds"]) for r in mine]),
                       median_or_none([float(r["process_seconds"]) for r in mine]), len(mine))
    base_round, base_proc, _ = summary.get("ours", (None, None, 0))
    for name in args.frameworks:
      fw = frameworks[name]
      if fw.skip:
        lines.append(f"| {name} | 0 | | | | | skipped: {fw.skip} |")
        continue
      round_s, proc_s, n = summary[name]
      ratio_r = (round_s / base_round) if (round_s and base_round) else None
      ratio_p = (proc_s / base_proc) if (proc_s and base_proc) else None
      failed = [r for r in rows if r["framework"] == name and r["setting"] == setting
                and str(r.get("notes", "")).startswith("failed")]
      note = fw.backend or ("tff-cluster run_experiment.py, runner local"
                                            if name == "ours" else "")
      if failed:
        note += f"; {len(failed)} failed run(s), see peers.csv"
      lines.append(f"| {name} | {n} | {fmt(round_s)} | {fmt(ratio_r, 2)} | {fmt(proc_s, 1)} | "
                   f"{fmt(ratio_p, 2)} | {note} |")
    ours = [r for r in rows if r["framework"] == "ours" and r["setting"] == setting
            and r.get("host_share") not in ("", None)]
    if ours:
      shares = [float(r["host_share"]) for r in ours]
      gaps = [abs(float(r["parts_gap"])) for r in ours]
      lines += ["", f"tff-cluster's own account (summary.json's process_time): the host side "
                f"{100 * min(shares):.1f}-{100 * max(shares):.1f} % of the rounds' training; "
                f"its parts within {100 * max(gaps):.2f} % of the process's wall time "
                "measured here."]
    lines.append("")
  lines += ["## Versions", ""]
  for name in args.frameworks:
    fw = frameworks[name]
    if fw.skip:
      lines.append(f"- {name}: skipped ({fw.skip})")
    else:
      env = sys.executable if name == "ours" else os.path.join(args.peers_root, name)
      lines.append(f"- {name}: {fw.version}; Python {fw.python_version}; {env}")
  lines += ["", "## Machine", "",
            f"- nproc: {machine['nproc']}; CPU: {machine['cpu']}; memory: {machine['memory']}",
            f"- load average (1, 5, 15 min) at start: {machine['load_start']}; at end: "
            f"{load_average()}",
            f"- harness Python {platform.python_version()} ({sys.executable}), numpy "
            f"{np.__version__}; {platform.platform()}",
            f"- the peers' data export (tff-cluster's loader; in no framework's numbers): "
            f"{machine.get('export_seconds', 0.0):.1f} s in all", ""]
  tmp_path = path + ".tmp"
  with open(tmp_path, "w") as f:
    f.write("\n".join(lines))
  os.replace(tmp_path, path)


def memory_total() -> str:
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemTotal:"):
          return f"{int(line.split()[1]) / 2**20:.1f} GiB"
  except (OSError, ValueError):
    pass
  return "?"


# -- main ------------------------------------------------------------------------


def main(argv=None) -> int:
  args = parse_args(argv)
  command = "python benchmarks/peers.py " + " ".join(sys.argv[1:] if argv is None else argv)
  os.makedirs(args.out, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix="tff_cluster_peers_", dir="/tmp")
  try:
    return run_benchmark(args, tmp, command)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def run_benchmark(args, tmp: str, command: str) -> int:
  csv_path, md_path = os.path.join(args.out, "peers.csv"), os.path.join(args.out, "peers.md")
  machine = {"nproc": str(os.cpu_count()), "cpu": cpu_model(), "memory": memory_total(),
             "load_start": load_average(),
             "started": datetime.datetime.now().isoformat(timespec="seconds")}
  try:
    library = snapshot_library(args.library, tmp)
  except (ValueError, OSError, subprocess.SubprocessError) as e:
    print(f"peers.py: error: {e}", file=sys.stderr)
    return 2
  args.library_dir = library[0]
  frameworks = {}
  for name in args.frameworks:
    frameworks[name] = find_ours(library) if name == "ours" else find_peer(name, args.peers_root)
    fw = frameworks[name]
    print(f"[peers] {name}: " + (f"SKIPPED: {fw.skip}" if fw.skip else fw.version), flush=True)
  ours = frameworks.get("ours") or find_ours(library)
  peers_active = [n for n in args.frameworks if n != "ours" and not frameworks[n].skip]
  if peers_active and ours.skip:
    print(f"[peers] the peers need tff-cluster's loader to export their data: {ours.skip}",
          file=sys.stderr)
    for n in peers_active:
      frameworks[n].skip = f"cannot export the data: {ours.skip}"
    peers_active = []

  rows: List[Dict[str, Any]] = []
  started = time.perf_counter()
  plan = [(setting, seed) for setting in args.settings for seed in args.seeds]
  last_use = {export_key(setting, seed, args): i for i, (setting, seed) in enumerate(plan)}
  exports: Dict[Tuple, Optional[str]] = {}
  for i, (setting, seed) in enumerate(plan):
    rounds = rounds_of(setting, args)
    key = export_key(setting, seed, args)
    if peers_active and key not in exports:
      exports[key] = None
      try:
        exports[key], seconds = export(setting, seed, args, tmp, ours.python)
        machine["export_seconds"] = machine.get("export_seconds", 0.0) + seconds
        print(f"[peers] {setting} seed {seed}: data exported in {seconds:.1f} s", flush=True)
      except (RuntimeError, OSError) as e:
        print(f"[peers] {e}", file=sys.stderr, flush=True)
    data = exports.get(key)
    for name in args.frameworks:  # one (setting, seed): every framework in turn
      fw = frameworks[name]
      row = {"framework": name, "version": fw.version, "setting": setting, "seed": seed,
             "rounds": rounds}
      if fw.skip:
        rows.append(dict(row, notes=f"skipped: {fw.skip}"))
        continue
      if name != "ours" and data is None:
        rows.append(dict(row, notes="skipped: the data export failed"))
        continue
      rows.append(one_run(fw, setting, seed, data, args, tmp, row))
      write_csv(csv_path, rows)
      write_md(md_path, rows, frameworks, args, dict(machine, finished="still running"),
               command)
    if data and last_use[key] == i:
      shutil.rmtree(data, ignore_errors=True)
  machine["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
  write_csv(csv_path, rows)
  write_md(md_path, rows, frameworks, args, machine, command)
  print(f"[peers] {len(rows)} rows in {time.perf_counter() - started:.0f} s -> {csv_path}, "
        f"{md_path}", flush=True)
  return 0


def one_run(fw: Framework, setting: str, seed: int, data: Optional[str], args, tmp: str,
            row: Dict[str, Any]) -> Dict[str, Any]:
  """Runs one (framework, setting, seed) and fills its CSV row."""
  rounds = row["rounds"]
  log = os.path.join(tmp, f"{fw.name}_{setting}_seed{seed}.log")
  try:
    result = (run_ours(fw, setting, seed, args, tmp, log) if fw.name == "ours" else
              run_peer(fw, setting, seed, data, args, tmp, log))
  except Exception as e:  # noqa: BLE001 -- a run must never stop the benchmark
    result = {"rc": -1, "process_seconds": None, "notes": repr(e)[:300]}
  row = dict(row, version=fw.version)
  round_seconds = result.get("round_seconds") or []
  row["process_seconds"] = fmt(result.get("process_seconds"))
  row["median_round_seconds"] = fmt(median_or_none(round_seconds), 4)
  row["host_share"] = fmt(result.get("host_share"), 4)
  row["parts_gap"] = fmt(result.get("parts_gap"), 4)
  notes = result.get("notes", "")
  if round_seconds:
    notes = f"round 1 {round_seconds[0]:.2f} s, {len(round_seconds)} rounds timed; " + notes
  if result.get("rc") != 0 or len(round_seconds) != rounds:
    rc = result.get("rc")
    notes = (f"failed ({'timed out' if rc is None else f'rc={rc}'}, "
             f"{len(round_seconds)}/{rounds} rounds): {tail(log)}; {notes}")
    row["median_round_seconds"] = ""
  row["notes"] = notes
  print(f"[peers] {setting} seed {seed} {fw.name}: process {row['process_seconds']} s, "
        f"median round {row['median_round_seconds'] or '-'} s; {notes}", flush=True)
  if args.keep_logs and os.path.exists(log):
    os.makedirs(args.keep_logs, exist_ok=True)
    shutil.copy(log, args.keep_logs)
  return row


if __name__ == "__main__":
  sys.exit(main())
