"""The `tff-cluster` command (`python -m tff_cluster`, `python run_experiment.py`
in a checkout): one federated experiment, --algo on --task, results in
--output_dir. `main(argv)` runs it in this process; `run(settings)` is the
run itself. Importing it does not import TensorFlow: a run that is refused
(bad flags, a folder that cannot take it) is refused before TensorFlow
loads, so the imports a run needs are made where it needs them.
"""

from __future__ import annotations

import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import contextlib
import json
import re
import shutil
import threading
import time
from typing import Optional

from absl import flags, logging

from tff_cluster.spec import hparams as hp
from tff_cluster import interrupts, registry
from tff_cluster.cli import (
    ALGO_HPARAMS as _ALGO_HPARAMS, ALGOS as _ALGOS, GENERAL as _GENERAL,
    GENERAL_DEFAULTS as _DEFAULT, GROUPS_FORMATS as _GROUPS_FORMATS,
    RUNNER_HPARAMS as _RUNNER_HPARAMS, TASKS as _TASKS, UsageError, flag_names,
    load_task_data, prepare_output_dir, resolve_settings, run_config, run_dir_settings)

def _task_help(name, spec):
  defaults = " ".join(f"{k}={v}" for k, v in spec.defaults.items() if v is not None)
  args = ", ".join(f"{d.name}={hp.format_value(d.default)}" for d in spec.task_args) or "none"
  pad = " " * 30
  return [f"  {name:<26}  {spec.description}",
          f"{pad}models: {', '.join(spec.model_names)}; task_arg: {args}",
          f"{pad}defaults: {defaults}"]


__doc__ = "\n".join(
    ["Runs one federated experiment: --algo on --task, results in --output_dir.",
     "",
     "  tff-cluster --algo=fedgroup --task=synthetic",
     "  tff-cluster --algo=fedgroup --task=synthetic --runner=local",
     "",
     "(`python -m tff_cluster` is the same command; in a checkout, `python run_experiment.py`.)",
     "",
     "Algorithms (--algo):"]
    + [f"  {name:<14} {spec.description}" for name, spec in sorted(_ALGOS.items())]
    + ["", "Tasks (--task); under each: its models (--model, the first is the default),",
       "its defaults and its settings (--task_arg NAME=VALUE, default):"]
    + [line for name, spec in sorted(_TASKS.items()) for line in _task_help(name, spec)]
    + ["", "Per-task defaults fill every hyper-parameter flag left unset."])

FLAGS = flags.FLAGS
PROG = "run_experiment.py"  # the command's name in its error lines (`main` sets it)
flags.DEFINE_string("algo", _DEFAULT["algo"], f"Algorithm: {', '.join(sorted(_ALGOS))}.")
flags.DEFINE_string("task", _DEFAULT["task"], f"Task: {', '.join(sorted(_TASKS))}.")
flags.DEFINE_string("model", None, "Model, for tasks that offer several (see the task "
                    "list above; default: the task's first).")
flags.DEFINE_integer("num_clients", None, "Number of clients, for tasks that "
                     "generate or partition data (task default).")
flags.DEFINE_string("data_dir", None, "Directory with the task's data files.")
flags.DEFINE_string("data_source", _DEFAULT["data_source"],
                    "Where the MNIST, Fashion-MNIST and CIFAR-10 "
                    "tasks read their images: auto, keras or tfds. keras: --data_dir's files, "
                    "else Keras' cache or download; tfds: TensorFlow Datasets (pip install "
                    "'tff-cluster[tfds]'; --data_dir is then TFDS's data directory); auto: "
                    "--data_dir's files, else Keras' cache when it holds them, else a prepared "
                    "TFDS copy when there is one, else Keras' download. Every source gives the "
                    "same arrays in the same order (docs/tasks.md).")
flags.DEFINE_float("synthetic_alpha", _DEFAULT["synthetic_alpha"],
                   "Synthetic(alpha, beta): model heterogeneity.")
flags.DEFINE_float("synthetic_beta", _DEFAULT["synthetic_beta"],
                   "Synthetic(alpha, beta): input heterogeneity.")
flags.DEFINE_string("glove_path", None, "GloVe vectors for sent140: a text file of any "
                    "dimension, plain or .gz (glove.6B.300d.txt), or a directory with one "
                    "glove*.txt[.gz].")
flags.DEFINE_multi_string("task_arg", list(_DEFAULT["task_arg"]),
                          "Task-specific setting NAME=VALUE, repeatable "
                          "(e.g. --task_arg=num_clusters=4 for cluster-structured tasks).")
flags.DEFINE_string("output_dir", None, "Results directory (default: "
                    "results/<task>_<algo>_<timestamp>).")
flags.DEFINE_boolean("overwrite", _DEFAULT["overwrite"],
                     "Replace results in a non-empty --output_dir.")
flags.DEFINE_boolean("progress", _DEFAULT["progress"], "Show a progress bar.")
flags.DEFINE_integer("checkpoint_every", _DEFAULT["checkpoint_every"],
                     "Checkpoint the run state every this many "
                     "rounds (also after the set-up and at the end); --resume continues "
                     "from the latest.")
flags.DEFINE_enum("groups_format", _DEFAULT["groups_format"],
                  list(_GROUPS_FORMATS), "groups.csv: one row per "
                  "round with a column per client (wide), or round,client,group lines for "
                  "the clients whose group changed (long; for large federations).")
flags.DEFINE_boolean("resume", _DEFAULT["resume"],
                     "Continue the run in --output_dir from its latest "
                     "checkpoint (written on any stack and runner); flags not given take "
                     "the run's values; only a larger --rounds, --runner and --jit may "
                     "differ (with another --runner, the run's flags of its old runner "
                     "are dropped).")
flags.DEFINE_boolean("profile", _DEFAULT["profile"], "At the end, print where the "
                     "process's seconds went (summary.json's process_time: start, imports, "
                     "data, build, compile, training, evaluation, host side, closing).")
flags.DEFINE_boolean("eval_only", _DEFAULT["eval_only"], "Evaluate the saved models of the run in "
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

def _flag_values() -> dict:
  return {name: FLAGS[name].value for name in flag_names()}


def _present():
  """The flags the user gave."""
  return [name for name in flag_names() if FLAGS[name].present]


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
  print(f"{PROG}: error: {message}", file=sys.stderr)
  sys.exit(code)


def run(settings: dict, origin: Optional[float] = None) -> dict:
  """Loads data, builds the driver, trains, writes results. Returns the
  summary. `origin`: the `time.time()` the run's `process_time` counts from
  (the command: its process's start; None: now)."""
  from tff_cluster import stack, timing
  from tff_cluster.io import results as results_io  # (no TensorFlow)
  ledger = timing.Ledger(origin)
  if not settings["resume"]:  # a folder that cannot take the run: refused before TF loads
    try:
      results_io.check_output_dir(settings["output_dir"], settings["overwrite"])
    except results_io.OutputDirError as e:
      raise UsageError(str(e)) from None
  ledger.add("start", time.time() - ledger.origin)
  with ledger.part("tensorflow_import"):
    tf = stack.import_tensorflow()

  with ledger.part("library_import"):
    from tff_cluster.host import loop
    from tff_cluster.host.driver import SETTINGS, TrainingConfig
    from tff_cluster.io import results
    from tff_cluster.io import rundir

  tf.get_logger().setLevel("ERROR")  # retracing notices per padded-batch shape
  task = _TASKS[settings["task"]].with_model(settings["model"])
  algo = _ALGOS[settings["algo"]]
  out_dir = settings["output_dir"]
  with ledger.part("setup"):  # a resumed run's checkpoint and settings
    resume = _latest_checkpoint(out_dir) if settings["resume"] else None
    previous = run_config(out_dir) if settings["resume"] else {}
  with ledger.part("results_setup"):
    created = prepare_output_dir(out_dir, settings["overwrite"], settings["resume"])
  try:
    with ledger.part("data"):
      load_start = time.perf_counter()
      data = load_task_data(settings, task, _present())
      load_seconds = time.perf_counter() - load_start
    with ledger.part("build"):
      config = TrainingConfig.checked(**{name: settings[name] for name in SETTINGS})
      try:
        driver = registry.build_driver(algo, task, data, config, **settings["algo_options"])
      except ValueError as e:
        raise UsageError(str(e)) from None
  except BaseException:
    if created:
      shutil.rmtree(out_dir, ignore_errors=True)
    raise

  with ledger.part("data"):
    from tff_cluster.data.federated import fingerprint
    data_fingerprint = fingerprint(data)
    if resume is not None:
      _check_same_data(previous, data, data_fingerprint, out_dir)

  with ledger.part("results_setup"):
    writer = _open_writer(results, loop, settings, out_dir, driver, resume)
  summary = None

  def final_summary():  # process_time, once everything the run opened is closed
    summary["process_time"] = ledger.breakdown()
    writer.write_summary(summary)

  try:
    with ledger.part("results_setup"):
      _record_config(writer, settings, task, algo, data, driver, config, load_seconds,
                     data_fingerprint, resume, previous)
    owner = contextlib.ExitStack()
    with ledger.part("build"):  # the runner's processes: a Ray session, TFF's workers
      owner.enter_context(_runtime_owner(config.runner.name))
    try:
      summary = loop.run_training(
          task, data, config, driver, writer, progress=settings["progress"],
          checkpoint_dir=out_dir, checkpoint_every=settings["checkpoint_every"],
          resume=resume, models_dir=rundir.path_of(out_dir, rundir.MODELS), ledger=ledger)
    finally:
      with ledger.part("closing"):
        owner.close()
  finally:
    with ledger.part("closing"):
      writer.close(last=None if summary is None else final_summary)
  return summary


def _open_writer(results, loop, settings, out_dir, driver, resume):
  """The run's `ResultsWriter` (UsageError, one line, when another run
  took the folder meanwhile)."""
  try:
    return results.ResultsWriter(
        out_dir, loop.columns(driver),
        overwrite=settings["overwrite"], resume_rows=None if resume is None else resume["rows"],
        groups_format=settings["groups_format"] or "wide")
  except results.OutputDirError as e:
    raise UsageError(str(e)) from None


def _record_config(writer, settings, task, algo, data, driver, config, load_seconds,
                   data_fingerprint, resume, previous) -> None:
  """config.json, and the run's one opening line."""
  record = _config_record(settings, task, data, driver, load_seconds, data_fingerprint,
                          resume, previous)
  writer.write_config(record)
  device = record["runner_info"].get("device") if isinstance(
      record["runner_info"], dict) else None
  print(f"{algo.name} on {task.name} ({task.model_name}, runner {config.runner.name}"
        f"{f' on {device}' if device else ''}): "
        f"{data.description}; {data.num_clients} clients, {record['num_train_samples']} "
        f"train samples; results -> {settings['output_dir']}"
        + (f"; resuming after round {resume['round']}" if resume else ""), file=sys.stderr)


def _config_record(settings, task, data, driver, load_seconds, data_fingerprint, resume,
                   previous) -> dict:
  """What config.json holds: the settings, the data's provenance, the runner's."""
  from tff_cluster.io import results
  from tff_cluster.spec.task import DataOptions, task_arg
  # The task's declared settings as the data was built with them (defaults
  # filled in), next to `task_args`, what was given.
  task_args_applied = {d.name: task_arg(DataOptions(extra=settings["task_args"]), d)
                       for d in task.task_args}
  return {
      **settings,
      "num_clients_loaded": data.num_clients,
      "num_train_samples": int(data.num_train_samples().sum()),
      "num_test_samples": int(data.num_test_samples().sum()),
      "data_description": data.description,
      "data_fingerprint": data_fingerprint,
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
  }


def _runtime_owner(runner: str):
  """What owns the runner's processes for the run: the TFF worker runtime,
  the Ray session (its actors, and a Ray started here), or nothing."""
  if runner == "tff":
    from tff_cluster.runners.tff import runtime
    return runtime.tff_runtime()
  if runner == "ray":
    from tff_cluster.runners import ray_runner
    return ray_runner.session()
  return contextlib.nullcontext()


def _check_same_data(previous: dict, data, data_fingerprint: str, out_dir: str) -> None:
  """--resume refuses other data than the run's: its clients and their
  numbers of samples (`data_fingerprint` in config.json; a run written
  before it: the numbers of clients and samples)."""
  now = {"num_clients_loaded": data.num_clients,
         "num_train_samples": int(data.num_train_samples().sum()),
         "num_test_samples": int(data.num_test_samples().sum())}
  old_print = previous.get("data_fingerprint")
  same = (old_print == data_fingerprint if old_print is not None else
          all(previous.get(k, v) == v for k, v in now.items()))
  if not same:
    was = ", ".join(f"{previous.get(k)}" for k in now)
    raise UsageError(
        f"--resume: the data differs from the run's ({now['num_clients_loaded']} clients, "
        f"{now['num_train_samples']} train and {now['num_test_samples']} test samples now; "
        f"the run had {was}; {out_dir}/config.json data_fingerprint {old_print}, now "
        f"{data_fingerprint}); valid: the run's data (the same --data_dir contents)")


def _latest_checkpoint(out_dir: str) -> dict:
  """--resume: the payload of the run's latest readable checkpoint; UsageError
  (one line) while another run writes the folder, or when there is none."""
  from tff_cluster.io import checkpoint, lock
  try:
    lock.check(out_dir)  # a live run: refused before its checkpoints are read
  except lock.LockHeld as e:
    raise UsageError(f"--resume: {e}") from None
  found = checkpoint.load_latest(out_dir)
  if found is None and checkpoint.legacy_rounds(out_dir):
    raise UsageError(f"--resume: {checkpoint.directory(out_dir)} holds only pickled "
                     "checkpoints (round-*.pkl, tff-cluster 0.1), which are not read "
                     "any more; valid: a run checkpointed as round-*.npz (run it again)")
  if found is None:
    raise UsageError(f"--resume: no readable checkpoint in {checkpoint.directory(out_dir)}"
                     "; valid: the directory of a run that saved one")
  return found[1]


def _resume_hint(out_dir: str) -> str:
  """'--resume continues from round R (OUT/checkpoints); ' when a checkpoint
  was saved, else ''."""
  from tff_cluster.io import checkpoint
  saved = checkpoint.rounds(out_dir) if out_dir else []
  return (f"--resume continues after round {saved[-1]} ({checkpoint.directory(out_dir)}); "
          if saved else "")


def _interrupted(settings: dict, code: int) -> "NoReturn":  # noqa: F821
  for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a second one: no traceback
    signal.signal(sig, signal.SIG_IGN)
  from tff_cluster.io import rundir
  out = settings.get("output_dir")
  if out and os.path.isfile(rundir.path_of(out, rundir.SUMMARY)):
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


@contextlib.contextmanager
def _signals_as_exit():
  """SIGINT raises KeyboardInterrupt, SIGTERM/SIGHUP SystemExit(128 + signum),
  so that every way of stopping a run closes it (summary, one closing line);
  inside `interrupts.deferred()` they are recorded and raised after it. Every
  signal is recorded (`interrupts.note`): the exception a handler raises may
  surface as another one when it interrupts TensorFlow's own Python code, and
  the run must still close as interrupted."""
  def handler(signum, frame):
    del frame
    interrupts.note(signum)
    if not interrupts.are_deferred():  # else the training loop raises it after the stretch
      raise SystemExit(128 + signum)

  def int_handler(signum, frame):
    interrupts.note(signum)
    if not interrupts.are_deferred():
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


def program_name(argv0: str) -> str:
  """How the command was called, for its error lines: `tff-cluster`,
  `run_experiment.py` or `python -m tff_cluster`."""
  name = os.path.basename(argv0 or "")
  return "python -m tff_cluster" if name in ("__main__.py", "") else name


def main(argv, origin: Optional[float] = None) -> int:
  """Runs the command on `argv`; `origin`: the `time.time()` summary.json's
  `process_time` counts from (the command: its process's start; None: now)."""
  global PROG
  PROG = program_name(argv[0] if argv else "")
  interrupts.note(None)  # main() may run more than once in one process
  with _signals_as_exit():
    return _main(argv, time.time() if origin is None else origin)


def _main(argv, origin: float) -> int:
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
    if FLAGS.resume or FLAGS.eval_only:
      settings = run_dir_settings(FLAGS.output_dir, {n: FLAGS[n].value for n in _present()},
                                  FLAGS.resume, FLAGS.eval_only)
    else:
      settings = resolve_settings(_flag_values())
    if settings["eval_only"]:
      from tff_cluster.evaluate import evaluate_saved  # imports TensorFlow
      evaluate_saved(settings, _present())
      return 0
    summary = run(settings, origin)
  except UsageError as e:
    _fail(str(e))
  except KeyboardInterrupt:
    _interrupted(settings, 130)
  except SystemExit as e:
    if isinstance(e.code, int) and e.code > 128:  # SIGTERM/SIGHUP inside the run
      _interrupted(settings, e.code)
    raise
  except Exception as e:  # noqa: BLE001 - the expected ones are named below
    from tff_cluster.host.loop import Diverged, WorkerLost
    signum = interrupts.received()
    if signum is not None:  # a signal's exception, transformed by the code it hit
      _interrupted(settings, 130 if signum == signal.SIGINT else 128 + signum)
    if isinstance(e, WorkerLost):
      _fail(f"{e}; {_resume_hint(settings['output_dir'])}summary.json says \"reason\": "
            "\"worker_lost\"", code=4)
    from tff_cluster.io.checkpoint import CheckpointError, WriteFailed
    if isinstance(e, WriteFailed):  # a full disk, a failing drive: nothing half-written left
      _fail(f"{e}; {_resume_hint(settings['output_dir'])}nothing half-written is left", code=5)
    from tff_cluster.runners.local_runner import CompiledCodeLimit
    # A checkpoint that does not fit this run; no room left to compile one.
    if isinstance(e, (CheckpointError, CompiledCodeLimit)):
      _fail(str(e))
    if not isinstance(e, Diverged):
      raise
    saved = (f"the last good state (round {e.round_num - 1}) is checkpointed in "
             f"{settings['output_dir']}/checkpoints; " if e.round_num else "")
    _fail(f"{e}; {saved}summary.json says \"reason\": \"diverged\" (try a smaller "
          "--client_lr)", code=3)
  line = {k: summary.get(k) for k in ("final_test_accuracy", "max_test_accuracy",
                                       "max_round", "mean_round_seconds")}
  print(json.dumps(line), file=sys.stderr)
  if settings.get("profile"):
    from tff_cluster import timing
    timing.print_table(summary["process_time"])
  return 0
