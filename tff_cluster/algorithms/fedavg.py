"""FedAvg (McMahan et al. 2017) as a TFF `LearningProcess`.

Update rule, per round t with sampled clients S_t:
  each client k in S_t runs `local_epochs` of mini-batch SGD from w_t on its
  data (FedProx adds (mu/2)||w - w_t||^2 to the local objective, see
  `fedprox.py`), giving Delta_k = w_k - w_t;
  Delta = sum_k n_k Delta_k / sum_k n_k, with n_k the examples processed;
  w_{t+1} = w_t - server_opt(-Delta)   (server SGD with lr 1 is plain averaging).

The process is composed from the four parts of `tff.learning.templates`: a
broadcast distributor, the client work below (`local_training.build_local_sgd`
inside a TFF computation), a weighted-mean aggregator, and a finalizer that
applies the server optimizer to trainable weights and the plain mean update to
non-trainable ones (BatchNorm statistics; TFF's own FedAvg leaves those frozen).
"""

from __future__ import annotations

import collections
from typing import Callable, List, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_cluster import experiment, local_training, tff_types


def _split(weights: List, num_trainable: int) -> tff.learning.models.ModelWeights:
  return tff.learning.models.ModelWeights(
      trainable=list(weights[:num_trainable]),
      non_trainable=list(weights[num_trainable:]))


def build_client_work(model_fn: Callable[[], tf.keras.Model], loss: str,
                      element_spec, client_lr: float, mu: float,
                      model_weights_type) -> tff.learning.templates.ClientWorkProcess:
  """Local (proximal) SGD; the update is the pseudo-gradient w_t - w_k."""
  data_type = tff_types.sequence_type(element_spec)

  @tff.tensorflow.computation(model_weights_type, data_type)
  def client_update(initial, dataset):
    model = model_fn()
    local_sgd = local_training.build_local_sgd(model, loss)
    flat = list(initial.trainable) + list(initial.non_trainable)
    out = local_sgd(flat, dataset, client_lr, mu)
    update = _split([-d for d in out["delta"]], len(initial.trainable))
    return update, out["num_examples"], out["loss_sum"]

  @tff.federated_computation
  def init_fn():
    return tff.federated_value((), tff.SERVER)

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(model_weights_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(state, weights, data):
    update, num_examples, loss_sum = tff.federated_map(
        client_update, (weights, data))
    total = tff.federated_sum(num_examples)
    measurements = tff.federated_zip(collections.OrderedDict(
        loss_sum=tff.federated_sum(loss_sum), num_examples=total))
    result = tff.federated_zip(
        tff.learning.templates.ClientResult(update, num_examples))
    return tff.templates.MeasuredProcessOutput(state, result, measurements)

  return tff.learning.templates.ClientWorkProcess(init_fn, next_fn)


def build_finalizer(model_weights_type, server_optimizer
                    ) -> tff.learning.templates.FinalizerProcess:
  """w_trainable <- optimizer step with the mean pseudo-gradient; BN stats <- mean."""
  trainable_type = model_weights_type.trainable

  @tff.tensorflow.computation
  def init_tf():
    specs = [tf.TensorSpec(t.shape, t.dtype) for t in trainable_type]
    return server_optimizer.initialize(tuple(specs))

  state_type = init_tf.type_signature.result

  @tff.tensorflow.computation(state_type, model_weights_type, model_weights_type)
  def apply(opt_state, weights, update):
    opt_state, trainable = server_optimizer.next(
        opt_state, tuple(weights.trainable), tuple(update.trainable))
    non_trainable = [w - u for w, u in zip(weights.non_trainable,
                                           update.non_trainable)]
    return opt_state, tff.learning.models.ModelWeights(
        list(trainable), non_trainable)

  @tff.federated_computation
  def init_fn():
    return tff.federated_eval(init_tf, tff.SERVER)

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(model_weights_type, tff.SERVER),
      tff.FederatedType(model_weights_type, tff.SERVER))
  def next_fn(state, weights, update):
    new_state, new_weights = tff.federated_map(apply, (state, weights, update))
    return tff.templates.MeasuredProcessOutput(
        new_state, new_weights, tff.federated_value((), tff.SERVER))

  return tff.learning.templates.FinalizerProcess(init_fn, next_fn)


def build_fedavg(model_fn: Callable[[], tf.keras.Model], loss: str,
                 element_spec, initial_weights: List[np.ndarray],
                 client_lr: float, mu: float = 0.0,
                 server_optimizer=None) -> tff.learning.templates.LearningProcess:
  """Builds FedAvg (mu = 0) or FedProx (mu > 0) as a `LearningProcess`.

  Args:
    model_fn: builds a fresh built Keras model (called inside TFF computations).
    loss: `tff_cluster.models` loss kind.
    element_spec: element spec of a client's batched dataset (`{'x', 'y'}`).
    initial_weights: starting weights, trainable then non-trainable (fixed so
      that a seed fixes the run).
    client_lr: local SGD learning rate.
    mu: proximal coefficient; 0 = FedAvg.
    server_optimizer: a `tff.learning.optimizers.Optimizer`; default SGD with
      learning rate 1.0 (= weighted averaging of client models).

  `next(state, client_datasets)` returns the new state and metrics
  `{'client_work': {'loss_sum', 'num_examples'}, ...}`.
  """
  if client_lr <= 0:
    raise ValueError(f"client_lr must be > 0, got {client_lr}")
  if mu < 0:
    raise ValueError(f"mu must be >= 0, got {mu}")
  model = model_fn()
  num_trainable = len(model.trainable_variables)
  initial = _split([np.asarray(w) for w in initial_weights], num_trainable)
  model_weights_type = tff_types.to_tff_type(
      _split(local_training.model_variables(model), num_trainable))
  if server_optimizer is None:
    server_optimizer = tff.learning.optimizers.build_sgdm(learning_rate=1.0)

  @tff.tensorflow.computation
  def initial_model_weights_fn():
    return tf.nest.map_structure(tf.constant, initial)

  return tff.learning.templates.compose_learning_process(
      initial_model_weights_fn,
      tff.learning.templates.build_broadcast_process(model_weights_type),
      build_client_work(model_fn, loss, element_spec, client_lr, mu,
                        model_weights_type),
      tff.aggregators.MeanFactory().create(
          model_weights_type, tff.TensorType(np.float32)),
      build_finalizer(model_weights_type, server_optimizer))


class FedAvgRunner(experiment.Runner):
  """Drives `build_fedavg`'s process: one global model for every client."""

  def __init__(self, task, data, config: experiment.TrainingConfig, mu: float = 0.0):
    self._data = data
    self._config = config
    self._element_spec = experiment.client_element_spec(data, config.batch_size)
    init = experiment.initial_weights(task, config.seed)
    self._num_params = int(sum(np.size(w) for w in init))
    self.process = build_fedavg(task.model_fn, task.loss, self._element_spec,
                                init, config.client_lr, mu)
    self.state = None

  def setup(self):
    self.state = self.process.initialize()
    return {"num_parameters": self._num_params}

  def run_round(self, round_num, sampled):
    datasets = experiment.round_datasets(self._data, self._config, round_num,
                                         sampled, self._config.local_epochs)
    output = self.process.next(self.state, datasets)
    self.state = output.state
    work = output.metrics["client_work"]
    model_bytes = self._num_params * experiment.BYTES_PER_PARAMETER
    return {"train_loss": float(work["loss_sum"] / max(work["num_examples"], 1.0)),
            "bytes_down": len(sampled) * model_bytes,
            "bytes_up": len(sampled) * model_bytes}

  def eval_models(self):
    weights = self.process.get_model_weights(self.state)
    flat = list(weights.trainable) + list(weights.non_trainable)
    return [flat], np.zeros(self._data.num_clients, np.int64)


def make_runner(task, data, config: experiment.TrainingConfig) -> FedAvgRunner:
  return FedAvgRunner(task, data, config, mu=0.0)
