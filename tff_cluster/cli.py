"""A run's settings, from flag values: checked, defaults filled, one line per error.

The CLI (`run_experiment.py`) parses flags into a dict of values; this module
turns them into the settings of a run (task and algorithm defaults, the local
work, the task's `--task_arg`s), reads a run directory's settings for
`--resume` and `--eval_only`, prepares the output directory and loads the
task's data. Every refusal is a `UsageError` whose message is the one line the
user sees. No TensorFlow import.
"""

from __future__ import annotations

import datetime
import functools
import os
import shutil
import sys
import warnings
from typing import Any, Dict, Sequence

from tff_cluster.spec import hparams as hp
from tff_cluster import registry, stack, tasks
from tff_cluster.io import results
from tff_cluster.data import tfds_source, vision
from tff_cluster.data.federated import DataError, FederatedData, release_free_memory, reloading
from tff_cluster.io import rundir
from tff_cluster.runners.config import SETTING_RUNNERS, RunnerConfig
from tff_cluster.spec.task import DataOptions

ALGOS = registry.ALGORITHMS
TASKS = tasks.registry()
ALGO_HPARAMS = registry.all_hparams()
RUNNER_HPARAMS = hp.RUNNER_HPARAMS
GENERAL = ("algo", "task", "model", "num_clients", "data_dir", "synthetic_alpha",
           "synthetic_beta", "glove_path", "task_arg", "output_dir", "overwrite",
           "progress", "checkpoint_every", "groups_format", "resume", "eval_only",
           "data_source", "profile")
# The general flags' defaults (run_experiment.py's flags and a sweep's cells
# take them; the others default to None: unset).
GENERAL_DEFAULTS = {"algo": "fedavg", "task": "synthetic", "synthetic_alpha": 1.0,
                    "synthetic_beta": 1.0, "task_arg": (), "overwrite": False,
                    "progress": True, "checkpoint_every": 10, "groups_format": "wide",
                    "resume": False, "eval_only": False, "data_source": "auto",
                    "profile": False}
GROUPS_FORMATS = ("wide", "long")
# Settings a resumed run may change (the rest must equal the run's config.json).
# The runner and its XLA setting compute the same rounds (parity tests), so a
# run started on `tff` (or on another stack) may go on with `local`.
RESUME_MAY_CHANGE = ("rounds", "output_dir", "overwrite", "progress", "profile",
                     "checkpoint_every",
                     "resume", "eval_only", "runner", "jit", "client_batching", "client_chunk",
                     "divergence_ratio",
                     "ray_workers", "ray_address", "tff_workers", "tff_worker_grace",
                     "tff_subround_timeout")
# The runners each flag applies to. A resumed (or evaluated) run inherits only
# the ones its runner takes: `--resume --runner=local` of a `ray` run does not
# carry the run's `--ray_workers` over as if it had been typed.
RUNNER_FLAG_RUNNERS = SETTING_RUNNERS
# Generated tasks whose clients all live in this process's memory: the mean
# samples of a client (FedProx's sizes: floor(lognormal(4, 2)) + 50, mean
# exp(6) + 50) and the bytes of one sample (60 float32 features, an int32 label).
GENERATED_SAMPLES_PER_CLIENT = {"synthetic": 453, "synthetic_iid": 453,
                                "synthetic_clusters": 453}
GENERATED_SAMPLE_BYTES = 60 * 4 + 4
# Measured (docs/runners.md, memory as the federation grows): a local run
# holds about three copies of the clients' arrays and 4 KB of bookkeeping each.
CLIENT_MEMORY_COPIES = 3
CLIENT_OVERHEAD_BYTES = 4096


def flag_names():
  """Every flag's name: the general ones, training, runner, every algorithm's."""
  return [*GENERAL, *(d.name for d in (*hp.TRAINING, *RUNNER_HPARAMS)), *ALGO_HPARAMS]


class UsageError(Exception):
  """Bad command-line input; the message is the one line shown to the user."""


def _resolve_declared(values, algo, task) -> dict:
  """The general flags, and the training, runner and algorithm settings by
  their declarations with the task's defaults (the local work's other kind
  None). Raises UsageError."""
  settings = {name: values.get(name) for name in GENERAL}
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
  task_defaults = dict(task.defaults)
  if algo.own_momentum:  # the task's local momentum is not this solver's
    task_defaults.pop("client_momentum", None)
  try:
    settings.update(hp.resolve(training, given, task.name, task_defaults))
    settings.update(RunnerConfig.of_flags(given).flags())
    settings.update(hp.resolve(algo.hparams, given, task.name, task.defaults))
    for name in ("num_clients", "synthetic_alpha", "synthetic_beta"):
      if settings[name] is None:
        continue
      low = 1 if name == "num_clients" else 0
      limit = hp.MAX_CLIENTS if name == "num_clients" else None
      kind = int if name == "num_clients" else float
      settings[name] = hp.HParam(name, kind, None, "", low=low, limit=limit).check(
          settings[name])
  except hp.HParamError as e:
    raise UsageError(str(e)) from None
  settings[other] = None
  return settings


def _check_training(settings: dict, values, algo, task) -> None:
  """The sizes a run needs (filled in where every client takes part), and
  a warning for algorithm flags `algo` ignores. Raises UsageError."""
  if settings["num_clients"] is None:
    settings["num_clients"] = task.defaults.get("num_clients")
  if algo.all_clients and values.get("clients_per_round") is None:
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
  ignored = sorted(f"--{name}" for name in ALGO_HPARAMS
                   if name not in own and values.get(name) is not None)
  if ignored:
    print(f"warning: {', '.join(ignored)} ignored by --algo={algo.name}", file=sys.stderr)


def _check_runner(settings: dict, values) -> None:
  """The runner's stack is installed (its flags were checked with
  `RunnerConfig.checked`), a warning for local-runner flags the tff runner
  ignores. Raises UsageError."""
  if stack.keras_problem() is not None:
    raise UsageError(stack.keras_problem())
  if settings["runner"] == "tff":
    problem = stack.tff_problem()
    if problem is not None:
      raise UsageError(f"--runner=tff: {problem} (--runner=local, the default)")
  for name in ("jit", "client_batching", "client_chunk"):
    if settings["runner"] == "tff" and values.get(name) is not None:
      print(f"warning: --{name} ignored by --runner={settings['runner']}", file=sys.stderr)
  if settings["runner"] == "ray" and not stack.has_module("ray"):
    raise UsageError(stack.RAY_MISSING)


def resolve_settings(values) -> dict:
  """Validates flags and fills task and declaration defaults. Raises UsageError."""
  if values["algo"] not in ALGOS:
    raise UsageError(f"unknown --algo={values['algo']}; valid: {', '.join(sorted(ALGOS))}")
  if values["task"] not in TASKS:
    raise UsageError(f"unknown --task={values['task']}; valid: {', '.join(sorted(TASKS))}")
  algo = ALGOS[values["algo"]]
  task = TASKS[values["task"]]
  try:
    task.with_model(values.get("model"))
  except ValueError as e:
    raise UsageError(str(e)) from None
  settings = _resolve_declared(values, algo, task)
  settings["data_source"] = _data_source(settings.get("data_source"))
  _check_training(settings, values, algo, task)
  _check_runner(settings, values)
  settings["algo_options"] = {d.name: settings[d.name] for d in algo.hparams}
  settings["task_args"] = parse_task_args(values.get("task_arg") or [], task)
  settings.pop("task_arg", None)
  if settings["checkpoint_every"] is not None and not (
      1 <= settings["checkpoint_every"] <= hp.MAX_ROUNDS):
    raise UsageError(f"invalid --checkpoint_every={settings['checkpoint_every']}; "
                     f"valid: an integer >= 1, at most {hp.MAX_ROUNDS}")
  _check_client_memory(settings, task)
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


def _data_source(value) -> str:
  """--data_source checked (unset: auto); tfds without TensorFlow Datasets
  installed is refused here, before TensorFlow loads."""
  value = "auto" if value is None else value
  if value not in vision.DATA_SOURCES:
    raise UsageError(f"invalid --data_source={value}; valid: {', '.join(vision.DATA_SOURCES)}")
  if value == "tfds" and not tfds_source.installed():
    raise UsageError(tfds_source.missing_message())
  return value


def available_memory() -> int:
  """Bytes this machine can still give a process: MemAvailable of
  /proc/meminfo, else the physical memory, else 0 (unknown)."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  try:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (OSError, ValueError, AttributeError):
    return 0


def _check_client_memory(settings: dict, task) -> None:
  """Refuses a generated task whose clients cannot fit in this machine's
  memory (estimated from their mean size), before any data is made. Tasks read
  from files are held to their own size; a `ray` run on a cluster
  (`--ray_address`) spreads the clients over its hosts."""
  per_client = GENERATED_SAMPLES_PER_CLIENT.get(task.name)
  if per_client is None or (settings["runner"] == "ray" and settings["ray_address"]):
    return
  given_samples = settings["task_args"].get("samples_per_client")
  per_client = given_samples or per_client
  clients = settings["num_clients"] or task.defaults.get("num_clients") or 0
  client_bytes = (CLIENT_MEMORY_COPIES * per_client * GENERATED_SAMPLE_BYTES
                  + CLIENT_OVERHEAD_BYTES)
  available = available_memory()
  if not available or clients * client_bytes <= available:
    return
  what = (f"--num_clients={clients} with --task_arg=samples_per_client={given_samples}"
          if given_samples else f"--num_clients={clients}")
  fit = available // client_bytes
  if fit >= 1:
    valid = f"--num_clients <= {fit} here"
  else:
    most = (available - CLIENT_OVERHEAD_BYTES) // (CLIENT_MEMORY_COPIES
                                                    * GENERATED_SAMPLE_BYTES)
    valid = f"--task_arg=samples_per_client <= {max(most, 1)} for one client here"
  raise UsageError(
      f"invalid {what}: --task={task.name} would need about {_gigabytes(clients * client_bytes)}"
      f" of memory ({per_client} samples per client), more than the "
      f"{_gigabytes(available)} available; valid: {valid}, or --runner=ray with "
      "--ray_address of a cluster")


def _gigabytes(size: int) -> str:
  return f"{size / 2**30:,.1f} GB"


def parse_task_args(items, task) -> dict:
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
    except ValueError as e:  # HParamError included
      valid = getattr(e, "valid", None) or decl.valid_text()
      raise UsageError(f"invalid --task_arg={name}={raw}; valid: {valid}") from None
  return out


def _typed(decl, raw: str):
  """A `--task_arg` text as the declaration's type (bool: true/false, any case)."""
  if decl.type is bool:
    if raw.lower() not in ("true", "false"):
      raise ValueError(raw)
    return raw.lower() == "true"
  return decl.type(raw)


def run_config(run_dir: str) -> dict:
  """The run's config.json (`rundir.read_config`); UsageError (one line) when
  it cannot be read."""
  try:
    return rundir.read_config(run_dir)
  except rundir.RunDirError as e:
    raise UsageError(f"{e}; --resume and --eval_only need the directory of a run") from None


def _check_config_types(run_dir: str, config: dict) -> None:
  """UsageError (one line) for a config.json whose settings are not of the
  kinds a run writes: a flag's value a number, text, true/false or null
  (`task_arg` a list of text), `task_args` an object."""
  def kind(value) -> str:
    return type(value).__name__.replace("dict", "an object").replace("list", "a list")

  for name in flag_names():
    if name not in config:
      continue
    value = config[name]
    ok = (isinstance(value, list) and all(isinstance(v, str) for v in value)
          if name == "task_arg" else
          value is None or isinstance(value, (str, int, float, bool)))
    if not ok:
      raise UsageError(f"{run_dir}/config.json: {name} is {kind(value)}; valid: a run's "
                       "config.json, where each setting is a number, text, true/false "
                       "or null")
  if not isinstance(config.get("task_args") or {}, dict):
    raise UsageError(f"{run_dir}/config.json: task_args is {kind(config['task_args'])}; "
                     "valid: a run's config.json, where task_args is an object")


def _known_options(new: Dict[str, Any], old: Dict[str, Any], algo) -> Dict[str, Any]:
  """`new` without the options a run made before they existed lacks (`old`
  has no such key) that stay at their declared default: that run ran as the
  default does."""
  defaults = {d.name: results.to_jsonable(d.default) for d in algo.hparams}
  return {k: v for k, v in new.items() if k in old or k not in defaults or v != defaults[k]}


def run_dir_settings(run_dir: str, given: Dict[str, Any], resume: bool,
                     eval_only: bool) -> dict:
  """--resume / --eval_only: the run's settings from its config.json, with the
  flags `given` on top. --resume refuses (UsageError) any change but a larger
  --rounds; --eval_only may evaluate on another --task."""
  if not run_dir:
    flag = "--resume" if resume else "--eval_only"
    raise UsageError(f"{flag} needs --output_dir=RUN_DIR, the directory of the run")
  config = run_config(run_dir)
  _check_config_types(run_dir, config)
  values = {name: config.get(name) for name in flag_names() if name in config}
  if "task" in given and given["task"] != config.get("task"):
    values.pop("model", None)  # another task: its own default model and settings
  else:
    values["task_arg"] = [f"{k}={hp.format_value(v)}"
                          for k, v in (config.get("task_args") or {}).items()]
  if "algo" in given and given["algo"] != config.get("algo"):
    for name in config.get("algo_options") or {}:  # the run's algorithm's, not this one's
      values.pop(name, None)
  runner = given.get("runner") or config.get("runner") or hp.RUNNER.default
  for name, runners in RUNNER_FLAG_RUNNERS.items():
    if runner not in runners:
      values.pop(name, None)  # the run's value, for a runner this one is not
  values.update(given)
  values["resume"], values["eval_only"] = resume, eval_only
  settings = resolve_settings(values)
  if not resume:
    return settings
  for key, old in sorted(config.items()):
    if key not in settings or key in RESUME_MAY_CHANGE:
      continue
    new = results.to_jsonable(settings[key])
    if key == "algo_options" and isinstance(old, dict) and isinstance(new, dict):
      new = _known_options(new, old, ALGOS[settings["algo"]])
    if new != old:
      raise UsageError(f"--resume: {key}={new} differs from the run's {key}={old} "
                       f"({run_dir}/config.json); valid: the run's settings, a "
                       "larger --rounds, another --runner, --jit, --client_batching or --ray_*")
  if settings["rounds"] < config["rounds"]:
    raise UsageError(f"--resume: --rounds={settings['rounds']} is fewer than the run's "
                     f"{config['rounds']}; valid: --rounds >= {config['rounds']}")
  return settings


def prepare_output_dir(path: str, overwrite: bool, resume: bool) -> bool:
  """Checks `path` can take results before any data is loaded. Returns whether
  this call created it (so that a run failing before its first result can
  remove it again: no half-written directory is left)."""
  if resume:
    return False
  try:
    results.check_output_dir(path, overwrite)
  except results.OutputDirError as e:
    raise UsageError(str(e)) from None
  created = not os.path.exists(path)
  try:
    os.makedirs(path, exist_ok=True)
    probe = os.path.join(path, rundir.WRITE_TEST)
    if rundir.is_plain_file(probe):
      os.remove(probe)  # a killed run's
    # Created new, never through a link: a `.write-test` link to a file
    # elsewhere fails here (EEXIST) and that file is left as it is.
    os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
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


def load_task_data(settings: dict, task, present: Sequence[str] = ()):
  """The task's data under `settings`; `present`: the flags the user gave
  (one given that the task does not read gets a warning)."""
  options = DataOptions(seed=settings["seed"], num_clients=settings["num_clients"],
                        data_dir=settings["data_dir"],
                        data_source=settings.get("data_source") or "auto",
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
  release_free_memory()  # what the loader freed: out of the run's resident size
  unused = [f"--{name}" for name in ("data_dir", "data_source", "glove_path", "num_clients",
                                      "synthetic_alpha", "synthetic_beta")
            if name in present and name not in tracked.read]
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
  if settings.get("runner") == "ray" and isinstance(data, FederatedData):
    # The ray runner's actors read the task again and keep their shard: the
    # host keeps the catalogue (counts, clusters), not the clients' arrays.
    data = reloading(data, functools.partial(_reload_task, task.load_data, options))
  return data


def _reload_task(load_data, options: DataOptions):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the host's load has shown them
    return load_data(options)
