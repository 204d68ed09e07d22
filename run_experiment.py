"""Runs one federated experiment: --algo on --task, results in --output_dir."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import datetime  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

from absl import app, flags, logging  # noqa: E402

import tasks  # noqa: E402
from tff_cluster import algorithms  # noqa: E402
from tff_cluster.algorithms import fedgroup  # noqa: E402

_ALGOS = algorithms.ALGORITHMS
_TASKS = tasks.registry()

__doc__ = "\n".join(
    ["Runs one federated experiment: --algo on --task, results in --output_dir.",
     "",
     "  python run_experiment.py --algo=fedgroup --task=synthetic",
     "",
     "Algorithms (--algo):"]
    + [f"  {name:<14} {spec.description}" for name, spec in sorted(_ALGOS.items())]
    + ["", "Tasks (--task):"]
    + [f"  {name:<26} {spec.description}" for name, spec in sorted(_TASKS.items())]
    + ["", "Per-task defaults fill every hyper-parameter flag left unset."])

FLAGS = flags.FLAGS
flags.DEFINE_string("algo", "fedavg", f"Algorithm: {', '.join(sorted(_ALGOS))}.")
flags.DEFINE_string("task", "synthetic", f"Task: {', '.join(sorted(_TASKS))}.")
flags.DEFINE_integer("rounds", None, "Communication rounds (task default).")
flags.DEFINE_integer("clients_per_round", None, "Clients sampled per round (task default).")
flags.DEFINE_integer("local_epochs", None, "Local epochs per round (task default).")
flags.DEFINE_integer("batch_size", None, "Local mini-batch size (task default).")
flags.DEFINE_float("client_lr", None, "Local SGD learning rate (task default).")
flags.DEFINE_float("mu", None, "Proximal coefficient mu of FedProx-style algorithms "
                   "(task default).")
flags.DEFINE_integer("seed", 0, "Seed of data generation/partition, model init, "
                     "client sampling and local shuffles.")
flags.DEFINE_integer("num_clients", None, "Number of clients, for tasks that "
                     "generate or partition data (task default).")
flags.DEFINE_string("data_dir", None, "Directory with the task's data files.")
flags.DEFINE_float("synthetic_alpha", 1.0, "Synthetic(alpha, beta): model heterogeneity.")
flags.DEFINE_float("synthetic_beta", 1.0, "Synthetic(alpha, beta): input heterogeneity.")
flags.DEFINE_string("glove_path", None, "GloVe text file for sent140 (glove.6B.300d.txt).")
flags.DEFINE_multi_string("task_arg", [], "Task-specific setting NAME=VALUE, repeatable "
                          "(e.g. --task_arg=num_clusters=4 for cluster-structured tasks).")
flags.DEFINE_integer("eval_every", 1, "Evaluate every this many rounds (and the last).")
flags.DEFINE_string("output_dir", None, "Results directory (default: "
                    "results/<task>_<algo>_<timestamp>).")
flags.DEFINE_boolean("overwrite", False, "Replace results in a non-empty --output_dir.")
flags.DEFINE_boolean("progress", True, "Show a progress bar.")
# FedGroup / FedGrouProx.
flags.DEFINE_integer("num_groups", 5, "FedGroup: number of groups m.")
flags.DEFINE_string("measure", "edc", "FedGroup: clustering measure, edc or madc.")
flags.DEFINE_float("pretrain_scale", 20.0, "FedGroup: alpha; min(alpha*m, N) clients "
                   "are pre-trained for group cold start.")
flags.DEFINE_integer("pretrain_epochs", None, "FedGroup: local epochs of the "
                     "pre-training (default: --local_epochs).")
flags.DEFINE_float("group_agg_lr", 0.0, "FedGroup: inter-group aggregation rate "
                   "eta_g (0 = off).")
flags.DEFINE_string("cold_start", "default", "FedGroup cold start: default, rcc "
                    "(random cluster centres) or rac (random assignment of clients).")
flags.DEFINE_float("newcomer_fraction", 0.0, "FedGroup: fraction of clients held "
                   "out of pre-training and of the first 10% of rounds.")

_COMMON = ("rounds", "clients_per_round", "local_epochs", "batch_size", "client_lr",
           "mu", "num_clients")
_ALGO_FLAG_DEFAULTS = {name: FLAGS[name].default for name in algorithms.FEDGROUP_OPTIONS}
_VALID = {"measure": fedgroup.MEASURES, "cold_start": fedgroup.COLD_STARTS}


class UsageError(Exception):
  """Bad command-line input; the message is the one line shown to the user."""


def resolve_settings(values) -> dict:
  """Validates flags and fills task defaults. Raises UsageError."""
  if values["algo"] not in _ALGOS:
    raise UsageError(f"unknown --algo={values['algo']}; valid: {', '.join(sorted(_ALGOS))}")
  if values["task"] not in _TASKS:
    raise UsageError(f"unknown --task={values['task']}; valid: {', '.join(sorted(_TASKS))}")
  algo = _ALGOS[values["algo"]]
  task = _TASKS[values["task"]]
  settings = dict(values)
  for name in _COMMON:
    if settings.get(name) is None:
      settings[name] = task.defaults.get(name)
  if not algo.uses_mu:
    if values.get("mu") is not None:
      print(f"warning: --mu ignored by --algo={algo.name} (no proximal term)",
            file=sys.stderr)
    settings["mu"] = 0.0

  def require(name, ok, valid):
    value = settings[name]
    if value is None or not ok(value):
      raise UsageError(f"invalid --{name}={value}; valid: {valid}")

  require("rounds", lambda v: v >= 1, "an integer >= 1")
  require("clients_per_round", lambda v: v >= 1, "an integer >= 1")
  require("local_epochs", lambda v: v >= 1, "an integer >= 1")
  require("batch_size", lambda v: v >= 1, "an integer >= 1")
  require("client_lr", lambda v: v > 0, "a number > 0")
  require("mu", lambda v: v >= 0, "a number >= 0")
  require("seed", lambda v: v >= 0, "an integer >= 0")
  require("eval_every", lambda v: v >= 1, "an integer >= 1")
  require("synthetic_alpha", lambda v: v >= 0, "a number >= 0")
  require("synthetic_beta", lambda v: v >= 0, "a number >= 0")
  if settings["num_clients"] is not None:
    require("num_clients", lambda v: v >= 1, "an integer >= 1")
    if settings["clients_per_round"] > settings["num_clients"]:
      raise UsageError(
          f"invalid --clients_per_round={settings['clients_per_round']}: more than "
          f"--num_clients={settings['num_clients']}; valid: 1..{settings['num_clients']}")
  if algo.options:
    require("num_groups", lambda v: v >= 1, "an integer >= 1")
    require("measure", lambda v: v in _VALID["measure"], ", ".join(_VALID["measure"]))
    require("cold_start", lambda v: v in _VALID["cold_start"], ", ".join(_VALID["cold_start"]))
    require("pretrain_scale", lambda v: v > 0, "a number > 0")
    if settings["pretrain_epochs"] is None:
      settings["pretrain_epochs"] = settings["local_epochs"]
    require("pretrain_epochs", lambda v: v >= 1, "an integer >= 1")
    require("group_agg_lr", lambda v: v >= 0, "a number >= 0")
    require("newcomer_fraction", lambda v: 0 <= v < 1, "a number in [0, 1)")
  else:
    ignored = [f"--{name}" for name, default in _ALGO_FLAG_DEFAULTS.items()
               if values.get(name) != default]
    if ignored:
      print(f"warning: {', '.join(ignored)} ignored by --algo={algo.name}",
            file=sys.stderr)
    for name in _ALGO_FLAG_DEFAULTS:
      settings.pop(name, None)
  settings["task_args"] = _parse_task_args(values.get("task_arg") or [])
  settings.pop("task_arg", None)
  if settings["output_dir"] is None:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    settings["output_dir"] = os.path.join(
        "results", f"{settings['task']}_{settings['algo']}_{stamp}")
  return settings


class _ReadTracker(dict):
  """The task's extra settings; remembers which names the task actually read."""

  def __init__(self, *args):
    super().__init__(*args)
    self.read = set()

  def __getitem__(self, key):
    self.read.add(key)
    return super().__getitem__(key)

  def get(self, key, default=None):
    self.read.add(key)
    return super().get(key, default)


def _parse_task_args(items) -> dict:
  out = {}
  for item in items:
    name, sep, raw = item.partition("=")
    if not sep or not name:
      raise UsageError(f"invalid --task_arg={item}; valid: NAME=VALUE, e.g. num_clusters=4")
    value = raw
    for cast in (int, float):
      try:
        value = cast(raw)
        break
      except ValueError:
        pass
    out[name] = value
  return out


def _flag_values() -> dict:
  names = ["algo", "task", "seed", "data_dir", "synthetic_alpha", "synthetic_beta",
           "glove_path", "task_arg", "eval_every", "output_dir", "overwrite", "progress",
           *_COMMON, *_ALGO_FLAG_DEFAULTS]
  return {name: FLAGS[name].value for name in names}


def _flag_error_message(error: Exception) -> str:
  """absl's parse error as one line naming the bad input and what is valid."""
  if isinstance(error, flags.UnrecognizedFlagError):
    known = sorted(f.name for f in FLAGS.get_flags_for_module(__name__))
    return (f"unknown flag --{error.flagname}; valid: "
            f"{', '.join('--' + n for n in known)} (see --help)")
  match = re.match(r"flag --(\w+)=(.*?): ", str(error))
  if isinstance(error, flags.IllegalFlagValueError) and match and match.group(1) in FLAGS:
    name, value = match.groups()
    valid = FLAGS[name].parser.syntactic_help or (
        "true or false" if FLAGS[name].boolean else "see --help")
    return f"invalid --{name}={value}; valid: {valid}"
  return f"{str(error).splitlines()[0]} (see --help)"


def _fail(message: str, code: int = 2) -> "NoReturn":  # noqa: F821
  print(f"run_experiment.py: error: {message}", file=sys.stderr)
  sys.exit(code)


def run(settings: dict) -> dict:
  """Loads data, builds the runner, trains, writes results. Returns the summary."""
  import tensorflow as tf
  import tensorflow_federated as tff

  from tff_cluster import experiment, results, runtime
  from tff_cluster.data.federated import DataError
  from tff_cluster.task import DataOptions

  task = _TASKS[settings["task"]]
  algo = _ALGOS[settings["algo"]]
  try:
    results.check_output_dir(settings["output_dir"], settings["overwrite"])
  except results.OutputDirError as e:
    raise UsageError(str(e)) from None
  options = DataOptions(seed=settings["seed"], num_clients=settings["num_clients"],
                        data_dir=settings["data_dir"],
                        synthetic_alpha=settings["synthetic_alpha"],
                        synthetic_beta=settings["synthetic_beta"],
                        glove_path=settings["glove_path"],
                        extra=_ReadTracker(settings["task_args"]))
  load_start = time.perf_counter()
  with warnings.catch_warnings():
    warnings.simplefilter("always")
    try:
      data = task.load_data(options)
    except DataError as e:
      raise UsageError(str(e)) from None
  load_seconds = time.perf_counter() - load_start
  unused = sorted(set(options.extra) - options.extra.read)
  if unused:
    raise UsageError(f"--task_arg {', '.join(unused)} is not a setting of --task={task.name}; "
                     "see the task module's docstring for its settings")
  if settings["clients_per_round"] > data.num_clients:
    raise UsageError(
        f"invalid --clients_per_round={settings['clients_per_round']}: the task has "
        f"{data.num_clients} clients; valid: 1..{data.num_clients}")
  config = experiment.TrainingConfig(
      rounds=settings["rounds"], clients_per_round=settings["clients_per_round"],
      local_epochs=settings["local_epochs"], batch_size=settings["batch_size"],
      client_lr=settings["client_lr"], seed=settings["seed"],
      eval_every=settings["eval_every"], mu=settings["mu"])
  algo_options = {name: settings[name] for name in algo.options}
  try:
    runner = algo.make_runner(task, data, config, **algo_options)
  except ValueError as e:
    raise UsageError(str(e)) from None

  runner_columns = list(getattr(runner, "extra_columns", ()))
  writer = results.ResultsWriter(
      settings["output_dir"], [*experiment.BASE_COLUMNS, *runner_columns],
      overwrite=settings["overwrite"])
  n_train = data.num_train_samples()
  writer.write_config({
      **settings,
      "num_clients_loaded": data.num_clients,
      "num_train_samples": int(n_train.sum()),
      "num_test_samples": int(data.num_test_samples().sum()),
      "data_description": data.description,
      "data_seconds": load_seconds,
      "task_source": task.source,
      "task_defaults": dict(task.defaults),
      "versions": {"tensorflow": tf.__version__, "tensorflow_federated": tff.__version__},
      "command": " ".join(sys.argv),
  })
  print(f"{algo.name} on {task.name}: {data.description}; "
        f"{data.num_clients} clients, {int(n_train.sum())} train samples; "
        f"results -> {settings['output_dir']}", file=sys.stderr)
  try:
    with runtime.tff_runtime():
      summary = experiment.run_training(task, data, config, runner, writer,
                                        progress=settings["progress"])
  finally:
    writer.close()
  return summary


def _print_help() -> None:
  print(__doc__)
  print("\nFlags:")
  print(FLAGS.module_help(sys.modules[__name__]))


def main(argv) -> int:
  if any(a in ("-h", "--help", "-help", "--helpshort", "--helpfull") for a in argv[1:]):
    _print_help()
    return 0
  settings = {}
  FLAGS.unparse_flags()  # main() may be called more than once in one process
  try:
    rest = FLAGS(argv)
  except flags.Error as e:
    _fail(_flag_error_message(e))
  if len(rest) > 1:
    _fail(f"unexpected argument {rest[1]!r}; flags are written --name=value (see --help)")
  logging.set_verbosity(logging.WARNING)
  try:
    settings = resolve_settings(_flag_values())
    summary = run(settings)
  except UsageError as e:
    _fail(str(e))
  except KeyboardInterrupt:
    _fail("interrupted; partial results (summary.json has completed=false) are in "
          f"{settings.get('output_dir', 'the output directory')}", code=130)
  line = {k: summary.get(k) for k in ("final_test_accuracy", "max_test_accuracy",
                                       "max_round", "mean_round_seconds")}
  print(json.dumps(line), file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
