"""Runs one federated experiment: --algo on --task, results in --output_dir."""

from __future__ import annotations

import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _quiet_exit(signum, frame):
  del frame
  print("run_experiment.py: error: interrupted before the run started; nothing was "
        "written", file=sys.stderr)
  os._exit(128 + signum)


if __name__ == "__main__":
  # Until main() runs, a signal (e.g. Ctrl-C during the imports below) ends the
  # process with one line instead of a traceback.
  for _sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(_sig, _quiet_exit)

import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

from absl import flags, logging  # noqa: E402
import numpy as np  # noqa: E402

from tff_cluster import tasks  # noqa: E402
from tff_cluster import registry  # noqa: E402
from tff_cluster import hparams as hp  # noqa: E402

def _task_help(name, spec):
  defaults = " ".join(f"{k}={v}" for k, v in spec.defaults.items() if v is not None)
  args = ", ".join(f"{d.name}={hp.format_value(d.default)}" for d in spec.task_args) or "none"
  pad = " " * 30
  return [f"  {name:<26}  {spec.description}",
          f"{pad}models: {', '.join(spec.model_names)}; task_arg: {args}",
          f"{pad}defaults: {defaults}"]


_ALGOS = registry.ALGORITHMS
_TASKS = tasks.registry()
_ALGO_HPARAMS = registry.all_hparams()
_RUNNER_HPARAMS = (hp.RUNNER, hp.JIT)

__doc__ = "\n".join(
    ["Runs one federated experiment: --algo on --task, results in --output_dir.",
     "",
     "  python run_experiment.py --algo=fedgroup --task=synthetic",
     "  python run_experiment.py --algo=fedgroup --task=synthetic --runner=local",
     "",
     "Algorithms (--algo):"]
    + [f"  {name:<14} {spec.description}" for name, spec in sorted(_ALGOS.items())]
    + ["", "Tasks (--task); under each: its models (--model, the first is the default),",
       "its defaults and its settings (--task_arg NAME=VALUE, default):"]
    + [line for name, spec in sorted(_TASKS.items()) for line in _task_help(name, spec)]
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
flags.DEFINE_string("glove_path", None, "GloVe vectors for sent140: a text file of any "
                    "dimension, plain or .gz (glove.6B.300d.txt), or a directory with one "
                    "glove*.txt[.gz].")
flags.DEFINE_multi_string("task_arg", [], "Task-specific setting NAME=VALUE, repeatable "
                          "(e.g. --task_arg=num_clusters=4 for cluster-structured tasks).")
flags.DEFINE_string("output_dir", None, "Results directory (default: "
                    "results/<task>_<algo>_<timestamp>).")
flags.DEFINE_boolean("overwrite", False, "Replace results in a non-empty --output_dir.")
flags.DEFINE_boolean("progress", True, "Show a progress bar.")
flags.DEFINE_integer("checkpoint_every", 10, "Checkpoint the run state every this many "
                     "rounds (also after the set-up and at the end); --resume continues "
                     "from the latest.")
flags.DEFINE_boolean("resume", False, "Continue the run in --output_dir from its latest "
                     "checkpoint (written on any stack and runner); flags not given take "
                     "the run's values; only a larger --rounds, --runner and --jit may "
                     "differ.")
flags.DEFINE_boolean("eval_only", False, "Evaluate the saved models of the run in "
                     "--output_dir (models/final and models/best) on --task's test data "
                     "(default: the run's task); writes eval_<task>.json there.")


def _flag_text(decl: hp.HParam) -> str:
  """Help text: the declaration's, what is valid, the default."""
  if decl.default is not None:
    default = f" (default {decl.default}"
  elif "default" not in decl.help.lower():
    default = " (task default"
  else:
    default = " ("
  if decl.task_defaults:
    default += ("; " if default != " (" else "") + ", ".join(
        f"{t}: {v}" for t, v in sorted(decl.task_defaults.items()))
  default = "" if default == " (" else default + ")"
  return f"{decl.help} Valid: {decl.valid_text()}{default}."


def _define(decl: hp.HParam) -> None:
  """One flag from a declaration; its default is None (= unset) so that task
  and declaration defaults apply in `resolve_settings`."""
  define = {int: flags.DEFINE_integer, float: flags.DEFINE_float,
            str: flags.DEFINE_string, bool: flags.DEFINE_boolean}[decl.type]
  define(decl.name, None, _flag_text(decl))


for _decl in (*hp.TRAINING, *_RUNNER_HPARAMS, *_ALGO_HPARAMS.values()):
  _define(_decl)
del _decl

_GENERAL = ("algo", "task", "model", "num_clients", "data_dir", "synthetic_alpha",
            "synthetic_beta", "glove_path", "task_arg", "output_dir", "overwrite",
            "progress", "checkpoint_every", "resume", "eval_only")
# Settings a resumed run may change (the rest must equal the run's config.json).
# The runner and its XLA setting compute the same rounds (parity tests), so a
# run started on `tff` (or on another stack) may go on with `local`.
_RESUME_MAY_CHANGE = ("rounds", "output_dir", "overwrite", "progress", "checkpoint_every",
                      "resume", "eval_only", "runner", "jit", "divergence_ratio")


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
  # Local work is epochs or steps: what the user gives wins over the task's
  # default of the other kind; without either, the task's default decides.
  if given.get("local_epochs") is not None:
    work = "local_epochs"
  elif given.get("local_steps") is not None:
    work = "local_steps"
  else:
    work = ("local_steps" if task.defaults.get("local_steps") is not None
            else "local_epochs")
  other = "local_steps" if work == "local_epochs" else "local_epochs"
  training = [d for d in hp.TRAINING if d.name != other]
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
  settings[other] = None
  if settings["num_clients"] is None:
    settings["num_clients"] = task.defaults.get("num_clients")
  if algo.all_clients and given.get("clients_per_round") is None:
    # Every client takes part in every round: the number is known once the
    # data is loaded (`_load_task_data`).
    settings["clients_per_round"] = None
  for name in ("rounds", "clients_per_round", "batch_size", "client_lr"):
    if name == "clients_per_round" and algo.all_clients:
      continue
    if settings[name] is None:
      raise UsageError(f"--{name} has no default for --task={task.name}; give it")
  if settings["local_epochs"] is None and settings["local_steps"] is None:
    raise UsageError(f"--task={task.name} has no default local work; give "
                     "--local_epochs or --local_steps")
  if settings["num_clients"] is not None and settings["clients_per_round"] is not None \
      and settings["clients_per_round"] > settings["num_clients"]:
    raise UsageError(
        f"invalid --clients_per_round={settings['clients_per_round']}: more than "
        f"--num_clients={settings['num_clients']}; valid: 1..{settings['num_clients']}")
  own = {d.name for d in algo.hparams}
  ignored = sorted(f"--{name}" for name in _ALGO_HPARAMS
                   if name not in own and values.get(name) is not None)
  if ignored:
    print(f"warning: {', '.join(ignored)} ignored by --algo={algo.name}", file=sys.stderr)
  from tff_cluster import stack
  if stack.keras_problem() is not None:
    raise UsageError(stack.keras_problem())
  if settings["runner"] == "tff":
    problem = stack.tff_problem()
    if problem is not None:
      raise UsageError(f"--runner=tff: {problem} (--runner=local, the default)")
  if settings["runner"] != "local" and values.get("jit") is not None:
    print(f"warning: --jit ignored by --runner={settings['runner']}", file=sys.stderr)
  settings["algo_options"] = {name: settings[name] for name in own}
  settings["task_args"] = _parse_task_args(values.get("task_arg") or [], task)
  settings.pop("task_arg", None)
  if settings["checkpoint_every"] is not None and settings["checkpoint_every"] < 1:
    raise UsageError(f"invalid --checkpoint_every={settings['checkpoint_every']}; "
                     "valid: an integer >= 1")
  if settings["output_dir"] == "":
    raise UsageError("invalid --output_dir=''; valid: a directory path")
  if (settings["resume"] or settings["eval_only"]) and settings["output_dir"] is None:
    flag = "--resume" if settings["resume"] else "--eval_only"
    raise UsageError(f"{flag} needs --output_dir=RUN_DIR, the directory of the run")
  if settings["output_dir"] is None:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    settings["output_dir"] = os.path.join(
        "results", f"{settings['task']}_{settings['algo']}_{stamp}")
  return settings


def _parse_task_args(items, task) -> dict:
  """`--task_arg NAME=VALUE` items, typed and checked by the task's declarations."""
  declared = {d.name: d for d in task.task_args}
  valid = ", ".join(sorted(declared)) or "none"
  out = {}
  for item in items:
    name, sep, raw = item.partition("=")
    if not sep or not name:
      raise UsageError(f"invalid --task_arg={item}; valid: NAME=VALUE with NAME one of "
                       f"{valid} (--task={task.name})")
    if name not in declared:
      raise UsageError(f"--task_arg {name} is not a setting of --task={task.name}; "
                       f"valid: {valid}")
    if name in out:
      raise UsageError(f"--task_arg {name} given twice; valid: once per setting")
    decl = declared[name]
    try:
      out[name] = decl.check(_typed(decl, raw))
    except (ValueError, hp.HParamError):
      raise UsageError(f"invalid --task_arg={name}={raw}; valid: {decl.valid_text()}") \
          from None
  return out


def _typed(decl, raw: str):
  """A `--task_arg` text as the declaration's type (bool: true/false, any case)."""
  if decl.type is bool:
    if raw.lower() not in ("true", "false"):
      raise ValueError(raw)
    return raw.lower() == "true"
  return decl.type(raw)


def _flag_names():
  return [*_GENERAL, *(d.name for d in (*hp.TRAINING, *_RUNNER_HPARAMS)), *_ALGO_HPARAMS]


def _flag_values() -> dict:
  return {name: FLAGS[name].value for name in _flag_names()}


def _run_config(run_dir: str) -> dict:
  path = os.path.join(run_dir, "config.json")
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise UsageError(f"cannot read {path} ({e.__class__.__name__}); --resume and "
                     "--eval_only need the directory of a run") from None


def run_dir_settings() -> dict:
  """--resume / --eval_only: the run's settings from its config.json, with the
  flags given on top. --resume refuses (UsageError) any change but a larger
  --rounds; --eval_only may evaluate on another --task."""
  run_dir = FLAGS.output_dir
  if not run_dir:
    flag = "--resume" if FLAGS.resume else "--eval_only"
    raise UsageError(f"{flag} needs --output_dir=RUN_DIR, the directory of the run")
  config = _run_config(run_dir)
  values = {name: config.get(name) for name in _flag_names() if name in config}
  given = {name: FLAGS[name].value for name in _flag_names() if FLAGS[name].present}
  if "task" in given and given["task"] != config.get("task"):
    values.pop("model", None)  # another task: its own default model and settings
  else:
    values["task_arg"] = [f"{k}={hp.format_value(v)}"
                          for k, v in (config.get("task_args") or {}).items()]
  values.update(given)
  values["resume"], values["eval_only"] = FLAGS.resume, FLAGS.eval_only
  settings = resolve_settings(values)
  if not FLAGS.resume:
    return settings
  for key, old in sorted(config.items()):
    if key not in settings or key in _RESUME_MAY_CHANGE:
      continue
    new = results_jsonable(settings[key])
    if new != old:
      raise UsageError(f"--resume: {key}={new} differs from the run's {key}={old} "
                       f"({run_dir}/config.json); valid: the run's settings, a "
                       "larger --rounds, another --runner or --jit")
  if settings["rounds"] < config["rounds"]:
    raise UsageError(f"--resume: --rounds={settings['rounds']} is fewer than the run's "
                     f"{config['rounds']}; valid: --rounds >= {config['rounds']}")
  return settings


def results_jsonable(value):
  from tff_cluster.results import to_jsonable
  return to_jsonable(value)


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


def _prepare_output_dir(path: str, overwrite: bool, resume: bool) -> bool:
  """Checks `path` can take results before any data is loaded. Returns whether
  this call created it (so that a run failing before its first result can
  remove it again: no half-written directory is left)."""
  from tff_cluster import results
  if resume:
    return False
  try:
    results.check_output_dir(path, overwrite)
  except results.OutputDirError as e:
    raise UsageError(str(e)) from None
  created = not os.path.exists(path)
  try:
    os.makedirs(path, exist_ok=True)
    probe = os.path.join(path, ".write-test")
    with open(probe, "w"):
      pass
    os.remove(probe)
  except OSError as e:
    if created:
      shutil.rmtree(path, ignore_errors=True)
    raise UsageError(f"--output_dir={path} is not writable ({e.strerror or e}); "
                     "valid: a directory this user can create and write") from None
  return created


class _ReadRecorder:
  """The task's `DataOptions`, recording which settings the task reads."""

  def __init__(self, options):
    object.__setattr__(self, "_options", options)
    object.__setattr__(self, "read", set())

  def __getattr__(self, name):
    self.read.add(name)
    return getattr(self._options, name)


def _load_task_data(settings: dict, task):
  from tff_cluster.data.federated import DataError
  from tff_cluster.task import DataOptions
  options = DataOptions(seed=settings["seed"], num_clients=settings["num_clients"],
                        data_dir=settings["data_dir"],
                        synthetic_alpha=settings["synthetic_alpha"],
                        synthetic_beta=settings["synthetic_beta"],
                        glove_path=settings["glove_path"], extra=settings["task_args"])
  tracked = _ReadRecorder(options)
  with warnings.catch_warnings():
    warnings.simplefilter("always")
    try:
      data = task.load_data(tracked)
    except (DataError, hp.HParamError) as e:
      raise UsageError(str(e)) from None
  unused = [f"--{name}" for name in ("data_dir", "glove_path", "num_clients",
                                      "synthetic_alpha", "synthetic_beta")
            if FLAGS[name].present and name not in tracked.read]
  if unused:
    print(f"warning: {', '.join(unused)} ignored by --task={task.name}", file=sys.stderr)
  if settings["num_clients"] is not None and data.num_clients < settings["num_clients"]:
    raise UsageError(f"invalid --num_clients={settings['num_clients']}: --task={task.name} "
                     f"has {data.num_clients} clients; valid: 1..{data.num_clients}")
  training = data.num_training_clients  # test-only clients never train
  if settings["clients_per_round"] is None:  # an all-clients algorithm's default
    settings["clients_per_round"] = training
  if settings["clients_per_round"] > training:
    # A task whose own setting decides how many clients remain names it (e.g.
    # sent140's "--task_arg=min_tweets=50").
    setting = getattr(data, "client_count_setting", None)
    if setting:
      raise UsageError(
          f"invalid {setting}: leaves {data.num_clients} clients, fewer than "
          f"--clients_per_round={settings['clients_per_round']}; valid: a setting that "
          f"keeps >= {settings['clients_per_round']} clients, or --clients_per_round <= "
          f"{data.num_clients}")
    what = (f"{training} clients" if training == data.num_clients else
            f"{training} clients with training data (and {data.num_clients - training} "
            "test-only clients)")
    raise UsageError(
        f"invalid --clients_per_round={settings['clients_per_round']}: the task has "
        f"{what}; valid: 1..{training}")
  return data


def run(settings: dict) -> dict:
  """Loads data, builds the driver, trains, writes results. Returns the summary."""
  import contextlib

  from tff_cluster import stack
  tf = stack.import_tensorflow()

  from tff_cluster import checkpoint, experiment, results

  tf.get_logger().setLevel("ERROR")  # retracing notices per padded-batch shape
  task = _TASKS[settings["task"]].with_model(settings["model"])
  algo = _ALGOS[settings["algo"]]
  out_dir = settings["output_dir"]
  resume = None
  if settings["resume"]:
    found = checkpoint.load_latest(out_dir)
    if found is None and checkpoint.legacy_rounds(out_dir):
      raise UsageError(f"--resume: {checkpoint.directory(out_dir)} holds only pickled "
                       "checkpoints (round-*.pkl, tff-cluster 0.1), which are not read "
                       "any more; valid: a run checkpointed as round-*.npz (run it again)")
    if found is None:
      raise UsageError(f"--resume: no readable checkpoint in {checkpoint.directory(out_dir)}"
                       "; valid: the directory of a run that saved one")
    resume = found[1]
  previous = _run_config(out_dir) if settings["resume"] else {}
  created = _prepare_output_dir(out_dir, settings["overwrite"], settings["resume"])
  try:
    load_start = time.perf_counter()
    data = _load_task_data(settings, task)
    load_seconds = time.perf_counter() - load_start
    config = experiment.TrainingConfig(**{
        field.name: settings[field.name]
        for field in dataclasses.fields(experiment.TrainingConfig)})
    try:
      driver = algo.make_driver(task, data, config, **settings["algo_options"])
    except ValueError as e:
      raise UsageError(str(e)) from None
  except BaseException:
    if created:
      shutil.rmtree(out_dir, ignore_errors=True)
    raise

  from tff_cluster.task import DataOptions, task_arg
  # The task's declared settings as the data was built with them (defaults
  # filled in), next to `task_args`, what was given.
  task_args_applied = {d.name: task_arg(DataOptions(extra=settings["task_args"]), d)
                       for d in task.task_args}
  runner_columns = list(getattr(driver, "extra_columns", ()))
  writer = results.ResultsWriter(
      out_dir, [*experiment.BASE_COLUMNS, *runner_columns],
      overwrite=settings["overwrite"], resume_rows=None if resume is None else resume["rows"])
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
      "task_args_applied": task_args_applied,
      **results.provenance(),  # git_commit, git_dirty, versions
      "command": " ".join(sys.argv),
      **({"resumed_from_round": resume["round"],
          # where the rounds before came from (they may be another runner's,
          # or another stack's)
          "resumed_from": {key: previous.get(key) for key in ("runner", "jit", "versions")}}
         if resume else {}),
  })
  print(f"{algo.name} on {task.name} ({task.model_name}, runner {config.runner}): "
        f"{data.description}; {data.num_clients} clients, {int(n_train.sum())} train "
        f"samples; results -> {out_dir}"
        + (f"; resuming after round {resume['round']}" if resume else ""), file=sys.stderr)
  owner = contextlib.nullcontext()
  if config.runner == "tff":
    from tff_cluster import runtime
    owner = runtime.tff_runtime()
  try:
    with owner:
      summary = experiment.run_training(
          task, data, config, driver, writer, progress=settings["progress"],
          checkpoint_dir=out_dir, checkpoint_every=settings["checkpoint_every"],
          resume=resume, models_dir=os.path.join(out_dir, "models"))
  finally:
    writer.close()
  return summary


def evaluate_saved(settings: dict) -> dict:
  """--eval_only: the run's saved models on `settings['task']`'s test data."""
  from tff_cluster import stack
  tf = stack.import_tensorflow()

  from tff_cluster import experiment, results
  from tff_cluster.evaluation import Evaluator

  tf.get_logger().setLevel("ERROR")
  run_dir = settings["output_dir"]
  task = _TASKS[settings["task"]].with_model(settings["model"])
  data = _load_task_data(settings, task)
  report = {"task": task.name, "run_dir": run_dir, "num_clients": data.num_clients}
  evaluator = Evaluator(task.model_fn, task.loss, data)
  for which in ("final", "best"):
    directory = os.path.join(run_dir, "models", which)
    try:
      with open(os.path.join(directory, "clients.json")) as f:
        info = json.load(f)
      weights = [experiment.load_model_weights(task, directory, j)
                 for j in range(info["num_models"])]
    except experiment.WeightsMismatch as e:
      raise UsageError(f"--eval_only: {e}") from None
    except ValueError as e:
      raise UsageError(f"--eval_only: cannot load {directory} ({e.__class__.__name__}); "
                       "valid: the directory of a run that finished") from None
    except (OSError, TypeError, KeyError) as e:
      raise UsageError(f"--eval_only: cannot load {directory} ({e.__class__.__name__}); "
                       "valid: the directory of a run that finished") from None
    per_model = [evaluator.evaluate([w], np.zeros(data.num_clients, np.int64)).accuracy
                 for w in weights]
    entry = {"round": info["round"], "model_test_accuracy": per_model}
    mapping = info["client_model"]
    if all(c in mapping for c in data.client_ids):
      chosen = np.array([mapping[c] for c in data.client_ids])
      result = evaluator.evaluate(weights, chosen)
      entry.update(test_accuracy=result.accuracy, test_loss=result.loss,
                   clients="each client with its model from clients.json")
    else:
      entry["clients"] = ("the task's clients are not the run's: each model on every "
                          "client (model_test_accuracy)")
    report[which] = entry
  path = os.path.join(run_dir, f"eval_{task.name}.json")
  results.write_json(path, report)
  print(f"wrote {path}", file=sys.stderr)
  return report


def _interrupted(settings: dict, code: int) -> "NoReturn":  # noqa: F821
  for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a second one: no traceback
    signal.signal(sig, signal.SIG_IGN)
  out = settings.get("output_dir")
  if out and os.path.isfile(os.path.join(out, "summary.json")):
    _fail(f"interrupted; partial results are in {out} (summary.json: completed=false; "
          "--resume continues from the latest checkpoint)", code=code)
  _fail("interrupted before the run started; nothing was written", code=code)


def _print_help() -> None:
  """The doc, then the flags grouped: general, training, runner, per algorithm."""
  sections = [("General", [f"  --{'[no]' if FLAGS[n].boolean else ''}{n}: {FLAGS[n].help}"
                           for n in _GENERAL]),
              ("Training (every algorithm)",
               [f"  --{d.name}: {_flag_text(d)}" for d in hp.TRAINING]),
              ("Runner", [f"  --{d.name}: {_flag_text(d)}" for d in _RUNNER_HPARAMS])]
  sections += [(f"--algo={name}", [f"  --{d.name}: {_flag_text(d)}" for d in spec.hparams])
               for name, spec in sorted(_ALGOS.items()) if spec.hparams]
  print(__doc__)
  for title, lines in sections:
    print(f"\n{title}:")
    print("\n".join(lines))


_SIGNAL = {"received": None}


def _note_signal(signum: int) -> None:
  """Remembers a stop signal, here and in the training loop (if loaded): the
  exception a handler raises may surface as another one when it interrupts
  TensorFlow's own Python code, and the run must still close as interrupted."""
  _SIGNAL["received"] = signum
  experiment = sys.modules.get("tff_cluster.experiment")
  if experiment is not None:
    experiment.note_stop_signal(signum)


@contextlib.contextmanager
def _signals_as_exit():
  """SIGINT raises KeyboardInterrupt, SIGTERM/SIGHUP SystemExit(128 + signum),
  so that every way of stopping a run closes it (summary, one closing line)."""
  def handler(signum, frame):
    del frame
    _note_signal(signum)
    raise SystemExit(128 + signum)

  def int_handler(signum, frame):
    _note_signal(signum)
    signal.default_int_handler(signum, frame)

  if threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
  previous[signal.SIGINT] = signal.signal(signal.SIGINT, int_handler)
  try:
    yield
  finally:
    for sig, old in previous.items():
      signal.signal(sig, old)


def main(argv) -> int:
  _SIGNAL["received"] = None  # main() may run more than once in one process
  experiment = sys.modules.get("tff_cluster.experiment")
  if experiment is not None:
    experiment.note_stop_signal(None)
  with _signals_as_exit():
    return _main(argv)


def _main(argv) -> int:
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
    settings = (run_dir_settings() if FLAGS.resume or FLAGS.eval_only
                else resolve_settings(_flag_values()))
    if settings["eval_only"]:
      evaluate_saved(settings)
      return 0
    summary = run(settings)
  except UsageError as e:
    _fail(str(e))
  except KeyboardInterrupt:
    _interrupted(settings, 130)
  except SystemExit as e:
    if isinstance(e.code, int) and e.code > 128:  # SIGTERM/SIGHUP inside the run
      _interrupted(settings, e.code)
    raise
  except Exception as e:  # noqa: BLE001 - only Diverged is expected here
    from tff_cluster.experiment import Diverged
    signum = _SIGNAL["received"]
    if signum is not None:  # a signal's exception, transformed by the code it hit
      _interrupted(settings, 130 if signum == signal.SIGINT else 128 + signum)
    if not isinstance(e, Diverged):
      raise
    saved = (f"the last good state (round {e.round_num - 1}) is checkpointed in "
             f"{settings['output_dir']}/checkpoints; " if e.round_num else "")
    _fail(f"{e}; {saved}summary.json says \"reason\": \"diverged\" (try a smaller "
          "--client_lr)", code=3)
  line = {k: summary.get(k) for k in ("final_test_accuracy", "max_test_accuracy",
                                       "max_round", "mean_round_seconds")}
  print(json.dumps(line), file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
