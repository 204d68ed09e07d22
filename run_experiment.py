"""Runs one federated experiment: --algo on --task, results in --output_dir."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import dataclasses  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

from absl import app, flags, logging  # noqa: E402

import tasks  # noqa: E402
from tff_cluster import algorithms  # noqa: E402
from tff_cluster import hparams as hp  # noqa: E402

_ALGOS = algorithms.ALGORITHMS
_TASKS = tasks.registry()
_ALGO_HPARAMS = algorithms.all_hparams()
_RUNNER_HPARAMS = (hp.RUNNER, hp.JIT)

__doc__ = "\n".join(
    ["Runs one federated experiment: --algo on --task, results in --output_dir.",
     "",
     "  python run_experiment.py --algo=fedgroup --task=synthetic",
     "  python run_experiment.py --algo=fedgroup --task=synthetic --runner=local",
     "",
     "Algorithms (--algo):"]
    + [f"  {name:<14} {spec.description}" for name, spec in sorted(_ALGOS.items())]
    + ["", "Tasks (--task) [models for --model, the first is the default]:"]
    + [f"  {name:<26} {spec.description} [{', '.join(spec.model_names)}]"
       for name, spec in sorted(_TASKS.items())]
    + ["", "Per-task defaults fill every hyper-parameter flag left unset."])

FLAGS = flags.FLAGS
flags.DEFINE_string("algo", "fedavg", f"Algorithm: {', '.join(sorted(_ALGOS))}.")
flags.DEFINE_string("task", "synthetic", f"Task: {', '.join(sorted(_TASKS))}.")
flags.DEFINE_string("model", None, "Model, for tasks that offer several (see the task "
                    "list above; default: the task's first).")
flags.DEFINE_integer("num_clients", None, "Number of clients, for tasks that "
                     "generate or partition data (task default).")
flags.DEFINE_string("data_dir", None, "Directory with the task's data files.")
flags.DEFINE_float("synthetic_alpha", 1.0, "Synthetic(alpha, beta): model heterogeneity.")
flags.DEFINE_float("synthetic_beta", 1.0, "Synthetic(alpha, beta): input heterogeneity.")
flags.DEFINE_string("glove_path", None, "GloVe text file for sent140 (glove.6B.300d.txt).")
flags.DEFINE_multi_string("task_arg", [], "Task-specific setting NAME=VALUE, repeatable "
                          "(e.g. --task_arg=num_clusters=4 for cluster-structured tasks).")
flags.DEFINE_string("output_dir", None, "Results directory (default: "
                    "results/<task>_<algo>_<timestamp>).")
flags.DEFINE_boolean("overwrite", False, "Replace results in a non-empty --output_dir.")
flags.DEFINE_boolean("progress", True, "Show a progress bar.")


def _define(decl: hp.HParam) -> None:
  """One flag from a declaration; its default is None (= unset) so that task
  and declaration defaults apply in `resolve_settings`."""
  default = "task default" if decl.default is None else f"default {decl.default}"
  if decl.task_defaults:
    default += "; " + ", ".join(f"{t}: {v}" for t, v in sorted(decl.task_defaults.items()))
  text = f"{decl.help} Valid: {decl.valid_text()} ({default})."
  define = {int: flags.DEFINE_integer, float: flags.DEFINE_float,
            str: flags.DEFINE_string, bool: flags.DEFINE_boolean}[decl.type]
  define(decl.name, None, text)


for _decl in (*hp.TRAINING, *_RUNNER_HPARAMS, *_ALGO_HPARAMS.values()):
  _define(_decl)
del _decl

_GENERAL = ("algo", "task", "model", "num_clients", "data_dir", "synthetic_alpha",
            "synthetic_beta", "glove_path", "task_arg", "output_dir", "overwrite",
            "progress")


class UsageError(Exception):
  """Bad command-line input; the message is the one line shown to the user."""


def resolve_settings(values) -> dict:
  """Validates flags and fills task and declaration defaults. Raises UsageError."""
  if values["algo"] not in _ALGOS:
    raise UsageError(f"unknown --algo={values['algo']}; valid: {', '.join(sorted(_ALGOS))}")
  if values["task"] not in _TASKS:
    raise UsageError(f"unknown --task={values['task']}; valid: {', '.join(sorted(_TASKS))}")
  algo = _ALGOS[values["algo"]]
  task = _TASKS[values["task"]]
  try:
    task.with_model(values.get("model"))
  except ValueError as e:
    raise UsageError(str(e)) from None
  settings = {name: values.get(name) for name in _GENERAL}
  given = dict(values)
  if given.get("local_epochs") is not None and given.get("local_steps") is not None:
    raise UsageError(f"--local_epochs={given['local_epochs']} and --local_steps="
                     f"{given['local_steps']} both given; valid: one of them")
  training = [d for d in hp.TRAINING if d.name != "local_epochs"]
  if given.get("local_steps") is None:
    training.append(hp.LOCAL_EPOCHS)
  try:
    settings.update(hp.resolve(training, given, task.name, task.defaults))
    settings.update(hp.resolve(_RUNNER_HPARAMS, given, task.name))
    settings.update(hp.resolve(algo.hparams, given, task.name, task.defaults))
    for name in ("num_clients", "synthetic_alpha", "synthetic_beta"):
      if settings[name] is None:
        continue
      low = 1 if name == "num_clients" else 0
      kind = int if name == "num_clients" else float
      settings[name] = hp.HParam(name, kind, None, "", low=low).check(settings[name])
  except hp.HParamError as e:
    raise UsageError(str(e)) from None
  settings.setdefault("local_epochs", None)
  if settings["num_clients"] is None:
    settings["num_clients"] = task.defaults.get("num_clients")
  for name in ("rounds", "clients_per_round", "batch_size", "client_lr"):
    if settings[name] is None:
      raise UsageError(f"--{name} has no default for --task={task.name}; give it")
  if settings["local_epochs"] is None and settings["local_steps"] is None:
    raise UsageError(f"--task={task.name} has no default local work; give "
                     "--local_epochs or --local_steps")
  if settings["num_clients"] is not None and \
      settings["clients_per_round"] > settings["num_clients"]:
    raise UsageError(
        f"invalid --clients_per_round={settings['clients_per_round']}: more than "
        f"--num_clients={settings['num_clients']}; valid: 1..{settings['num_clients']}")
  own = {d.name for d in algo.hparams}
  ignored = sorted(f"--{name}" for name in _ALGO_HPARAMS
                   if name not in own and values.get(name) is not None)
  if ignored:
    print(f"warning: {', '.join(ignored)} ignored by --algo={algo.name}", file=sys.stderr)
  if settings["runner"] != "local" and values.get("jit") is not None:
    print(f"warning: --jit ignored by --runner={settings['runner']}", file=sys.stderr)
  settings["algo_options"] = {name: settings[name] for name in own}
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
  names = [*_GENERAL, *(d.name for d in (*hp.TRAINING, *_RUNNER_HPARAMS)), *_ALGO_HPARAMS]
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
  import contextlib

  import tensorflow as tf

  from tff_cluster import experiment, results
  from tff_cluster.data.federated import DataError
  from tff_cluster.task import DataOptions

  tf.get_logger().setLevel("ERROR")  # retracing notices per padded-batch shape
  task = _TASKS[settings["task"]].with_model(settings["model"])
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
  config = experiment.TrainingConfig(**{
      field.name: settings[field.name]
      for field in dataclasses.fields(experiment.TrainingConfig)})
  try:
    driver = algo.make_driver(task, data, config, **settings["algo_options"])
  except ValueError as e:
    raise UsageError(str(e)) from None

  versions = {"tensorflow": tf.__version__}
  if config.runner == "tff":
    import tensorflow_federated as tff
    versions["tensorflow_federated"] = tff.__version__
  runner_columns = list(getattr(driver, "extra_columns", ()))
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
      "model": task.model_name,
      "runner_info": driver.describe(),
      "versions": versions,
      "command": " ".join(sys.argv),
  })
  print(f"{algo.name} on {task.name} ({task.model_name}, runner {config.runner}): "
        f"{data.description}; {data.num_clients} clients, {int(n_train.sum())} train "
        f"samples; results -> {settings['output_dir']}", file=sys.stderr)
  owner = contextlib.nullcontext()
  if config.runner == "tff":
    from tff_cluster import runtime
    owner = runtime.tff_runtime()
  try:
    with owner:
      summary = experiment.run_training(task, data, config, driver, writer,
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
