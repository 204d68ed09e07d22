"""Evaluates a finished run's saved models on a task's test data.

    python -m tff_cluster.evaluate RUN_DIR [--task=NAME]

(or `run_experiment.py --eval_only --output_dir=RUN_DIR`). Importing it imports
TensorFlow. The models in
`RUN_DIR/models/final` and `models/best` are loaded from their `.npz` weights
into the task's model (default: the run's task) and evaluated: each model on
every client, and, when the task's clients are the run's, each client with the
model `clients.json` gives it. The report goes to `RUN_DIR/eval_<task>.json`.
The run directory is read through `tff_cluster.io.rundir`.
"""

from __future__ import annotations

import sys
from typing import Sequence

import numpy as np

from tff_cluster import stack
from tff_cluster.host import loop
from tff_cluster.io import results
from tff_cluster.io.checkpoint import WriteFailed
from tff_cluster.learning.evaluation import Evaluator
from tff_cluster.data.federated import materialize
from tff_cluster.io import rundir
from tff_cluster.cli import TASKS, UsageError, load_task_data, run_dir_settings


def evaluate_saved(settings: dict, present: Sequence[str] = ()) -> dict:
  """The run's saved models (`settings['output_dir']`) on `settings['task']`'s
  test data; writes and returns the report. `present`: the flags given."""
  tf = stack.import_tensorflow()

  tf.get_logger().setLevel("ERROR")
  run_dir = settings["output_dir"]
  task = TASKS[settings["task"]].with_model(settings["model"])
  data = materialize(load_task_data(settings, task, present))  # evaluated here
  report = {"task": task.name, "run_dir": run_dir, "num_clients": data.num_clients}
  evaluator = Evaluator(task.model_fn, task.loss, data)
  for which in rundir.MODEL_KINDS:
    directory = rundir.models_dir(run_dir, which)
    try:
      info = rundir.read_clients(directory)
      weights = [loop.load_model_weights(task, directory, j)
                 for j in range(info["num_models"])]
    except loop.WeightsMismatch as e:
      raise UsageError(f"--eval_only: {e}") from None
    except rundir.RunDirError as e:
      raise UsageError(f"--eval_only: {e}; valid: the directory of a run that "
                       "finished") from None
    except (ValueError, OSError, TypeError, KeyError) as e:
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
  path = rundir.eval_path(run_dir, task.name)
  try:
    results.write_json(path, report)
  except WriteFailed as e:  # e.g. a read-only run folder
    raise UsageError(f"--eval_only: {e}; valid: a run directory this user can write "
                     "(or a copy of it)") from None
  print(f"wrote {path}", file=sys.stderr)
  return report


def main(argv: Sequence[str]) -> int:
  args = list(argv[1:])
  task = [a.split("=", 1)[1] for a in args if a.startswith("--task=")]
  rest = [a for a in args if not a.startswith("--task=")]
  if len(rest) != 1 or rest[0].startswith("-") or len(task) > 1:
    print("python -m tff_cluster.evaluate: error: usage: python -m tff_cluster.evaluate "
          "RUN_DIR [--task=NAME]", file=sys.stderr)
    return 2
  try:
    # RUN_DIR, not the output_dir its config.json recorded (a run moved or copied).
    given = {"output_dir": rest[0], **({"task": task[0]} if task else {})}
    settings = run_dir_settings(rest[0], given, resume=False, eval_only=True)
    evaluate_saved(settings, ["task"] if task else [])
  except UsageError as e:
    print(f"python -m tff_cluster.evaluate: error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
