"""One benchmark run on pfl-research (PyPI `pfl`), TensorFlow backend.

Run by `benchmarks/peers.py` as `<pfl env>/bin/python pfl_run.py SPEC.json`.
pfl 0.6.0's TensorFlow model (`pfl.model.tensorflow.TFModel`) maps variables by
`variable.name`, which Keras 3 no longer makes unique, so the model is built in
tf_keras (Keras 2): TF_USE_LEGACY_KERAS=1, with the same TensorFlow release as
tff-cluster's environment.

What runs, with pfl's public API:
  * `FederatedDataset(make_dataset_fn, user_sampler)`: the sampler hands out
    the exported schedule (tff-cluster's clients, round by round), so a cohort
    of `clients_per_round` users is exactly that round's clients;
    each user's rows are shuffled once per round (pfl's `Dataset.iter`
    batches in the stored order and does not reshuffle between local epochs);
  * `FederatedAveraging` with `NNAlgorithmParams` (cohort, rounds,
    evaluation_frequency), `NNTrainHyperParams` (local epochs, batch, local
    lr) and `TFModel` with a central SGD(server lr). `evaluation_frequency`
    also makes pfl score each trained user's data before and after its local
    training (inside the round): pfl's CIFAR-10 setting does so every 10
    iterations (`eval_every`); the FEMNIST settings, which tff-cluster runs
    without such scores, set `pfl_local_eval_every` past the last round, so
    only the first iteration (0 % n == 0 in pfl) has them;
  * `SimulatedBackend` with `WeightByDatapoints` where the setting weights
    clients by their sample counts (FEMNIST, as tff-cluster's FedAvg), none
    for pfl's CIFAR-10 setting (every user weighted alike: 50 images each);
  * `CentralEvaluationCallback` on the pooled test set with frequency =
    the setting's `eval_every` (pfl evaluates before training and then every
    `frequency` iterations after the first).
Timing: a round's training is from the algorithm's `get_next_central_contexts`
(start of the iteration) to the end of
`process_aggregated_statistics_from_all_contexts` (model updated); the
callbacks (central evaluation) run after that and are not in it.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from peer_common import (Arrays, Stopwatch, build_model, check_users, emit,  # noqa: E402
                         load_spec, prepare_cifar10_users, round_seed, shuffled)


def main() -> None:
  clock = Stopwatch()
  spec = load_spec(sys.argv[1])
  import importlib.metadata as md

  import tensorflow as tf
  from pfl.aggregate.simulate import SimulatedBackend
  from pfl.aggregate.weighting import WeightByDatapoints
  from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
  from pfl.callback.central_evaluation import CentralEvaluationCallback
  from pfl.data.dataset import Dataset
  from pfl.data.federated_dataset import FederatedDataset
  from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
  from pfl.model.tensorflow import TFModel

  keras = tf.keras
  versions = {p: md.version(p) for p in ("pfl", "tensorflow", "tf-keras")}
  emit("start", versions=versions, keras=keras.__name__,
       backend="pfl TensorFlow backend (tf_keras model, TFModel, SimulatedBackend)",
       import_seconds=clock.seconds())

  arrays = Arrays(spec["data"])
  if spec.get("cifar_dir"):  # the setting's own data preparation, in this process
    prepared = prepare_cifar10_users(spec["cifar_dir"], int(spec["seed"]))
    check_users(prepared, arrays)
    emit("prepared", seconds=clock.seconds())
  k = int(spec["clients_per_round"])
  rounds = int(spec["rounds"])
  flat = arrays.schedule.reshape(-1).tolist()
  draws = iter(range(len(flat)))

  def user_sampler():
    return next(draws)

  def make_dataset_fn(draw: int):
    client = int(flat[draw])
    x, y = shuffled(*arrays.client(client), round_seed(spec, draw // k + 1, client))
    return Dataset((x, y), user_id=arrays.client_ids[client])

  keras.utils.set_random_seed(int(spec["seed"]))
  net = build_model(keras, spec)
  net.compile(optimizer=keras.optimizers.SGD(learning_rate=float(spec["client_lr"])),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  model = TFModel(
      net, metrics={"loss": keras.metrics.SparseCategoricalCrossentropy(from_logits=True),
                    "accuracy": keras.metrics.SparseCategoricalAccuracy()},
      central_optimizer=keras.optimizers.SGD(learning_rate=float(spec["server_lr"])))

  class TimedFedAvg(FederatedAveraging):
    """FedAvg whose iterations report their training seconds."""

    def get_next_central_contexts(self, *args, **kwargs):
      self._round_start = time.perf_counter()
      return super().get_next_central_contexts(*args, **kwargs)

    def process_aggregated_statistics_from_all_contexts(self, *args, **kwargs):
      out = super().process_aggregated_statistics_from_all_contexts(*args, **kwargs)
      self._rounds_done = getattr(self, "_rounds_done", 0) + 1
      emit("round", round=self._rounds_done, clients=k,
           train_seconds=time.perf_counter() - self._round_start)
      return out

  class TimedEvaluation(CentralEvaluationCallback):
    """pfl's central evaluation, reporting its accuracy and seconds."""

    def _eval(self, model):
      started = time.perf_counter()
      stop, metrics = super()._eval(model)
      values = metrics.to_simple_dict()
      accuracy = next((v for n, v in values.items() if n.endswith("| accuracy")), None)
      emit("eval", accuracy=accuracy, seconds=time.perf_counter() - started)
      return stop, metrics

  eval_params = NNEvalHyperParams(local_batch_size=int(spec["eval_batch_size"]))
  central = Dataset((arrays.x_test, arrays.y_test))
  backend = SimulatedBackend(
      training_data=FederatedDataset(make_dataset_fn, user_sampler), val_data=None,
      postprocessors=[WeightByDatapoints()] if spec["weighting"] == "examples" else [])
  algorithm = TimedFedAvg()
  algorithm.run(
      algorithm_params=NNAlgorithmParams(
          central_num_iterations=rounds,
          evaluation_frequency=int(spec.get("pfl_local_eval_every") or spec["eval_every"]),
          train_cohort_size=k, val_cohort_size=0),
      backend=backend, model=model,
      model_train_params=NNTrainHyperParams(
          local_num_epochs=int(spec["local_epochs"]),
          local_learning_rate=float(spec["client_lr"]),
          local_batch_size=int(spec["batch_size"])),
      model_eval_params=eval_params,
      callbacks=[TimedEvaluation(central, model_eval_params=eval_params,
                                 frequency=int(spec["eval_every"]))])
  # No extra evaluation of the final model: pfl's setting decides which models
  # are evaluated (the harness's process time includes exactly those).
  emit("done", seconds=clock.seconds())


if __name__ == "__main__":
  main()
