"""An algorithm's TFF computations driven by `tff.program` components.

A TFF research pipeline in the shape `tff.program` gives it: the round
computation runs under `tff.program.NativeFederatedContext` (on the worker
`tff_cluster.runners.tff.runtime` owns, through an asynchronous context), the server
state is saved and restored by a `tff.program.FileProgramStateManager`, and
each round's metrics go to release managers (`LoggingReleaseManager`, and a
`CSVFileReleaseManager` writing `metrics.csv`). The computations are
`tff_cluster.api.computations`' (FedAvg here, or any algorithm whose
definition needs nothing from the data); their outputs are all placed at
the server, which `NativeFederatedContext` requires.

With `--algo=ifca` it is TFF's own training loop instead:
`tff.learning.programs.train_model` over IFCA's round as a `LearningProcess`
(`tff_cluster.tff_program.build_learning_process`, K = `--num_groups` cluster
models in its state) and the library's data as a `tff.program` data source
(`ClientDataSource`: the training loop's client draws and batches), its
program state in a `FileProgramStateManager` and the released metrics
(`tff.learning`'s layout) in `metrics.csv`. With `--algo=fedgroup`, FedGroup
with its host steps (cold start, newcomers) under
`tff_cluster.tff_program.train_program` (the process's state as bytes in the
program state).

The TFF stack only (tensorflow-federated 0.87):

  python scripts/tff_program_example.py --root_dir=/tmp/fedavg_program --rounds=5
  python scripts/tff_program_example.py --root_dir=/tmp/ifca_program --rounds=5 --algo=ifca
  python scripts/tff_program_example.py --root_dir=/tmp/fedgroup_program --rounds=5 --algo=fedgroup

Run it again with a larger --rounds: it goes on from the saved state.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--root_dir", required=True, help="program state and metrics go here")
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--clients_per_round", type=int, default=10)
  p.add_argument("--lr", type=float, default=0.01)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--algo", choices=("fedavg", "ifca", "fedgroup"), default="fedavg",
                 help="fedavg: a round computation in a loop of our own; ifca: train_model "
                      "over IFCA's LearningProcess; fedgroup: train_program (host steps)")
  p.add_argument("--num_groups", type=int, default=3, help="ifca, fedgroup: K clusters")
  return p.parse_args(argv)


def _managers(args):
  """The program's state manager (`ROOT/state`) and its metrics' release
  managers (the log, and `ROOT/metrics.csv`), releasing one value at a time
  in the order asked: `train_model` releases each round's metrics as a task
  of its own, and TFF's CSVFileReleaseManager rewrites the whole file on a
  file's first release, so two releases at once could lose a round's row."""
  import tensorflow_federated as tff

  class InOrder(tff.program.ReleaseManager):
    def __init__(self, inner):
      self._inner, self._lock = inner, asyncio.Lock()

    async def release(self, value, key):
      async with self._lock:  # (FIFO: in the order asked)
        await self._inner.release(value, key)

  return (tff.program.FileProgramStateManager(os.path.join(args.root_dir, "state")),
          InOrder(tff.program.GroupingReleaseManager([
              tff.program.LoggingReleaseManager(),
              tff.program.CSVFileReleaseManager(os.path.join(args.root_dir, "metrics.csv"))])))


async def train_ifca(args) -> dict:
  """IFCA under `tff.learning.programs.train_model`."""
  import tensorflow as tf
  import tensorflow_federated as tff

  from tff_cluster import models, tasks
  from tff_cluster.spec.task import DataOptions
  from tff_cluster.tff_program import ClientDataSource, build_learning_process

  task = tasks.get_task("synthetic_clusters")
  data = task.load_data(DataOptions(seed=args.seed))
  source = ClientDataSource(data, batch_size=10, epochs=1, seed=args.seed)
  starts = []  # K independent draws of the model's initializer
  for j in range(args.num_groups):
    tf.keras.utils.set_random_seed(args.seed * 1000 + j)
    starts.append(models.get_weights(task.model_fn()))
  process = build_learning_process("ifca", task.model_fn, task.loss, source.element_spec, starts,
                                   args.lr, {"num_groups": args.num_groups})
  state_manager, releases = _managers(args)
  await tff.learning.programs.train_model(
      train_process=process, train_data_source=source,
      train_per_round_clients=args.clients_per_round, train_total_rounds=args.rounds,
      program_state_manager=state_manager,
      model_output_manager=tff.program.MemoryReleaseManager(),
      train_metrics_manager=releases,
      evaluation_manager=None, evaluation_periodicity=args.rounds)
  return {"rounds": args.rounds}


async def train(args) -> dict:
  import tensorflow_federated as tff

  from tff_cluster import tasks
  from tff_cluster import api
  from tff_cluster.learning import schedule
  from tff_cluster import models
  from tff_cluster.runners.tff import runtime
  from tff_cluster.core.definition import round_params
  from tff_cluster.spec.task import DataOptions

  task = tasks.get_task("synthetic")
  data = task.load_data(DataOptions(seed=args.seed))
  first = data.client_ids[0]
  element_spec = schedule.client_dataset(*data.train[first], 10, 1, 0).element_spec
  definition, computations = api.computations("fedavg", task.model_fn, task.loss, element_spec)
  round_comp = computations["train"]  # a RoundComputation; .computation is TFF's own

  context = tff.program.NativeFederatedContext(runtime.async_context())
  state_manager, releases = _managers(args)

  import tensorflow as tf
  tf.keras.utils.set_random_seed(args.seed)
  initial = definition.initial_state(models.get_weights(task.model_fn()))
  state, start = await state_manager.load_latest(initial)
  if state is None:
    state, start = initial, 0
  rng = np.random.default_rng(np.random.SeedSequence([args.seed, 7]))
  for _ in range(start):  # the same client samples as an uninterrupted program
    rng.choice(data.num_clients, args.clients_per_round, replace=False)
  with tff.framework.get_context_stack().install(context):
    for round_num in range(start + 1, args.rounds + 1):
      clients = np.sort(rng.choice(data.num_clients, args.clients_per_round, replace=False))
      datasets = [schedule.client_dataset(
          *data.train[data.client_ids[k]], 10, 1,
          schedule.client_seed(args.seed, round_num, int(k))) for k in clients]
      positions = [np.int32(i) for i in range(len(clients))]
      new_state, summed, collected = round_comp.computation(
          state, round_params(args.lr), datasets, positions)
      state = await tff.program.materialize_value(new_state)
      summed = await tff.program.materialize_value(summed)
      collected = await tff.program.materialize_value(collected)
      results, _ = round_comp.unpack(collected, len(clients))
      metrics = {"train_loss": float(summed["loss_sum"] / max(float(summed["weight"]), 1.0)),
                 "clients": len(results)}
      await releases.release(metrics, key=round_num)
      await state_manager.save(state, round_num)
  return {"state": state, "rounds": args.rounds}


async def train_fedgroup(args) -> dict:
  """FedGroup, cold start and newcomers included, under `train_program`."""
  from tff_cluster import api, tasks
  from tff_cluster.spec.task import DataOptions
  from tff_cluster.tff_program import ClientDataSource, train_program

  task = tasks.get_task("synthetic_clusters")
  data = task.load_data(DataOptions(seed=args.seed))
  process = api.build("fedgroup", task.model_fn, task.loss, client_lr=args.lr, local_epochs=1,
                      batch_size=10, num_groups=args.num_groups, seed=args.seed, runner="tff")
  state_manager, releases = _managers(args)
  await train_program(
      process, data, train_data_source=ClientDataSource(data, batch_size=10, seed=args.seed),
      train_per_round_clients=args.clients_per_round, train_total_rounds=args.rounds,
      program_state_manager=state_manager, train_metrics_manager=releases)
  return {"rounds": args.rounds}


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.algo == "fedgroup":
    out = asyncio.run(train_fedgroup(args))
  elif args.algo == "ifca":
    import tensorflow_federated as tff
    from tff_cluster.runners.tff import runtime
    context = tff.program.NativeFederatedContext(runtime.async_context())
    with tff.framework.get_context_stack().install(context):
      out = asyncio.run(train_ifca(args))
  else:
    out = asyncio.run(train(args))
  print(f"trained to round {out['rounds']}; state in {os.path.join(args.root_dir, 'state')}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
