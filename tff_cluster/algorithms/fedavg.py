"""FedAvg (McMahan et al. 2017); FedProx (Li et al. 2020) is the same with mu > 0.

Update rule, per round t with sampled clients S_t:
  each client k in S_t runs its local work (epochs or steps) of mini-batch
  SGD from w_t (FedProx adds (mu/2)||w - w_t||^2 to the local objective),
  giving Delta_k = w_k - w_t;
  w_{t+1} = w_t + sum_k n_k Delta_k / sum_k n_k, with n_k the examples
  processed (`--client_weighting=processed`) or the client's training samples
  (`samples`, FedBase's weights); BatchNorm statistics are averaged the same
  way.

`FedAvgDefinition` writes this once as plain TF functions; both runners run
it. `build_fedavg` composes the same local update into a TFF
`LearningProcess` (broadcast, client work, weighted mean, finalizer with a
server optimizer) for research pipelines.
"""

from __future__ import annotations

import collections
from typing import Callable, List, Optional

import numpy as np
import tensorflow as tf

from tff_cluster import models, stack
from tff_cluster.host import driver
from tff_cluster.spec import hparams
from tff_cluster.learning import trainers
from tff_cluster.spec.options import FEDAVG_HPARAMS, Options, given, options_of
from tff_cluster.core.definition import ClientOutput, Definition
from tff_cluster.learning import optimizers


def with_weight_spec(spec, weighting: str):
  """A client state spec with a `weight` scalar added for 'samples' (the host
  fills it with the client's training samples)."""
  if weighting != "samples":
    return spec
  out = collections.OrderedDict() if spec is None else collections.OrderedDict(spec)
  out["weight"] = tf.TensorSpec([], tf.float32)
  return out


def client_weight(out, client_state, weighting: str):
  """The client's averaging weight (`--client_weighting`): the examples
  processed in the round (n_k of FedAvg's paper: with local epochs, E x the
  client's data), or the client's training samples whatever the local work
  (FedBase, where 10 local steps process the same number of examples on every
  client)."""
  if weighting == "samples":
    return client_state["weight"]
  return out.num_examples


def add_mean_update(weights, updates, weight, scale: float = 1.0) -> list:
  """w + scale u / weight for each weight and its summed update (the
  weighted mean of the clients' deltas, `scale` the server's step on it);
  the weights unchanged where no client had weight (`weight` 0)."""
  safe = tf.where(weight > 0, weight, 1.0)
  return [tf.where(weight > 0, w + scale * u / safe, w) for w, u in zip(weights, updates)]


class FedAvgDefinition(Definition):
  """State: `{'model': weights}`, and `buffer` (trainable weights) when the
  server optimizer keeps state. Every client receives the model and the
  round's lr.

  Summed: `update` = sum_k n_k Delta_k, `weight` = sum_k n_k, `loss_sum`
  (and `lr_sum`, `num_clients` for a server optimizer that reads the round's
  client lr). The server applies `server_optimizer`
  (`optimizers.server_sgd(1.0)` by default: the weighted mean of the
  clients' models) to the pseudo-gradient d = w_t - w_bar of the trainable
  weights; BatchNorm statistics take the plain weighted mean. The clients'
  local steps carry FedProx's proximal term when `mu` > 0.
  """

  def __init__(self, weights_spec, num_trainable: int, *, mu: float, weighting: str,
               server_optimizer: Optional[optimizers.ServerOptimizer] = None, **solver):
    super().__init__(weights_spec, num_trainable, **solver)
    self.mu = float(mu)
    self.weighting = weighting
    self.client_optimizer = optimizers.chain(optimizers.proximal(self.mu), self.local_step)
    self.server_optimizer = (optimizers.server_sgd(1.0) if server_optimizer is None
                             else server_optimizer)

  def client_state_spec(self, mode):
    return with_weight_spec(super().client_state_spec(mode), self.weighting)

  def initial_state(self, initial_weights):
    model = [np.asarray(w) for w in initial_weights]
    state = collections.OrderedDict(model=model)
    buffer = self.server_optimizer.init(model[:self.num_trainable])
    if buffer:
      state["buffer"] = buffer
    return state

  def broadcast(self, state, params, mode):
    return collections.OrderedDict(model=list(state["model"]), lr=params["lr"])

  def client_work(self, trainer, selected, received, client_state, data, mode, key=None):
    out, new_state = self.local_update(trainer, received["model"], data, received["lr"],
                                       client_state)
    n = client_weight(out, client_state, self.weighting)
    summed = collections.OrderedDict(update=[n * d for d in out.delta], weight=n,
                                     loss_sum=out.loss_sum)
    if self.server_optimizer.uses_client_lr:
      # The round's learning rate reaches the server as a sum over the clients.
      summed["lr_sum"] = tf.cast(received["lr"], tf.float32)
      summed["num_clients"] = tf.constant(1.0)
    result = collections.OrderedDict(loss_sum=out.loss_sum, num_examples=n)
    return ClientOutput(summed, result, new_state)

  def server_update(self, state, summed, mode):
    model = list(state["model"])
    n = self.num_trainable
    weight = summed["weight"]
    safe = tf.where(weight > 0, weight, 1.0)
    mean_delta = [s / safe for s in summed["update"]]
    d = [-x for x in mean_delta[:n]]  # pseudo-gradient w_t - w_bar
    client_lr = None
    if self.server_optimizer.uses_client_lr:
      client_lr = summed["lr_sum"] / tf.maximum(summed["num_clients"], 1.0)
    old_buffer = list(state.get("buffer", []))
    trainable, buffer = self.server_optimizer.update(model[:n], d, old_buffer, client_lr)
    has = weight > 0
    new = collections.OrderedDict(
        model=[tf.where(has, t, w) for t, w in zip(trainable, model[:n])]
        + [w + x for w, x in zip(model[n:], mean_delta[n:])])
    if old_buffer:
      new["buffer"] = [tf.where(has, b, old) for b, old in zip(buffer, old_buffer)]
    return new


class FedAvgDriver(driver.Driver):
  """One global model for every client."""

  def __init__(self, task, data, config: driver.TrainingConfig, options: Options):
    super().__init__(task, data, config, lambda specs, num_trainable, **solver:
                     make_definition(specs, num_trainable, options, **solver))
    self.state = None

  def setup(self):
    self.state = self.runner.put_state(self.definition.initial_state(self.w0))
    return {"num_parameters": self.num_params}

  def run_round(self, round_num, sampled):
    out = self.train_clients("train", self.state, sampled, round_num)
    self.state = out.state
    return self.training_row(out.summed, len(sampled), weight_key="weight")

  def model_weights(self) -> List[np.ndarray]:
    return list(self.runner.numpy_state(self.state)["model"])

  def eval_models(self):
    return [self.model_weights()], np.zeros(self.data.num_clients, np.int64)


def make_definition(weights_spec, num_trainable: int, options: Options,
                    server_optimizer: Optional[optimizers.ServerOptimizer] = None,
                    **solver) -> FedAvgDefinition:
  """FedAvg's definition, or FedProx's when `options` has `mu`; with
  `server_optimizer` (default plain averaging) FedAvgM's, FedMom's, ..."""
  mu = given(options, "mu") if "mu" in options else 0.0
  return FedAvgDefinition(weights_spec, num_trainable, mu=mu,
                          weighting=options.client_weighting,
                          server_optimizer=server_optimizer, **solver)


def make_driver(task, data, config: driver.TrainingConfig, options=None,
                **values) -> FedAvgDriver:
  return FedAvgDriver(task, data, config, options_of(FEDAVG_HPARAMS, options, **values))


def build_fedavg(model_fn: Callable[[], tf.keras.Model], loss,
                 element_spec, initial_weights: Optional[List[np.ndarray]] = None,
                 client_lr: float = 0.01, mu: float = 0.0, server_optimizer=None,
                 client_momentum: float = 0.0, seed: int = 0):
  """FedAvg (mu = 0) or FedProx (mu > 0) as a TFF `LearningProcess`.

  Args:
    model_fn: builds a fresh built Keras model (called inside TFF computations).
    loss: `tff_cluster.models` loss kind, or the Keras loss object it names
      (`tff_cluster.models.loss_kind`).
    element_spec: element spec of a client's batched dataset (`{'x', 'y'}`).
    initial_weights: starting weights, trainable then non-trainable; default
      the model's own initializer under `seed`.
    client_lr: local SGD learning rate.
    mu: proximal coefficient; 0 = FedAvg.
    server_optimizer: a `tff.learning.optimizers.Optimizer` applied to the
      mean pseudo-gradient of the trainable weights; default SGD with
      learning rate 1.0 (= weighted averaging of client models, the
      definition's server update). BatchNorm statistics take the mean update.
    client_momentum: heavy-ball beta of local SGD; its buffer starts at zero
      every round (a `LearningProcess` keeps no per-client state).

  `next(state, client_datasets)` returns the new state and metrics in
  `tff.learning`'s layout, `{'client_work': {'train': {'loss', 'loss_sum',
  'num_examples'}}, ...}` (`loss`: the mean over the round's examples), so
  `tff.learning.programs.train_model` and its metrics managers take it. The
  client work is `FedAvgDefinition`'s local update, the one both runners
  execute.
  """
  stack.require_tff()
  import tensorflow_federated as tff  # the definition itself needs no TFF

  from tff_cluster.runners.tff import runtime
  from tff_cluster.runners.tff import types as tff_types

  loss = models.loss_kind(loss)
  mu = hparams.MU.check(mu)  # one line naming what is valid
  if client_lr <= 0:
    raise ValueError(f"client_lr must be > 0, got {client_lr}")
  if initial_weights is None:
    tf.keras.utils.set_random_seed(seed)
    initial_weights = models.get_weights(model_fn())
  runtime.install()
  model = model_fn()
  num_trainable = len(model.trainable_variables)
  definition = FedAvgDefinition(models.weights_type_spec(model), num_trainable,
                                mu=mu, weighting="processed", momentum=client_momentum)

  def split(weights):
    return tff.learning.models.ModelWeights(trainable=list(weights[:num_trainable]),
                                            non_trainable=list(weights[num_trainable:]))

  initial = split([np.asarray(w) for w in initial_weights])
  model_weights_type = tff_types.to_tff_type(split(definition.weights_spec))
  data_type = tff_types.sequence_type(element_spec)
  if server_optimizer is None:
    server_optimizer = tff.learning.optimizers.build_sgdm(learning_rate=1.0)

  @tff.tensorflow.computation(model_weights_type, data_type)
  def client_update(weights, dataset):
    trainer = trainers.DatasetTrainer(model_fn(), loss)

    @tf.function  # orders local SGD's variable reads and writes in the graph
    def work(start, dataset):
      out, _ = definition.local_update(trainer, start, dataset, client_lr, None)
      return [-d for d in out.delta], out.num_examples, out.loss_sum

    update, num_examples, loss_sum = work(
        list(weights.trainable) + list(weights.non_trainable), dataset)
    return split(update), num_examples, loss_sum

  metrics_fn = _train_metrics(*client_update.type_signature.result[1:])

  @tff.federated_computation
  def client_init():
    return tff.federated_value((), tff.SERVER)

  @tff.federated_computation(
      client_init.type_signature.result,
      tff.FederatedType(model_weights_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS))
  def client_next(state, weights, data):
    update, num_examples, loss_sum = tff.federated_map(client_update, (weights, data))
    measurements = tff.federated_zip(collections.OrderedDict(train=tff.federated_map(
        metrics_fn, (tff.federated_sum(loss_sum), tff.federated_sum(num_examples)))))
    result = tff.federated_zip(tff.learning.templates.ClientResult(update, num_examples))
    return tff.templates.MeasuredProcessOutput(state, result, measurements)

  @tff.tensorflow.computation
  def initial_model_weights_fn():
    return tf.nest.map_structure(tf.constant, initial)

  return tff.learning.templates.compose_learning_process(
      initial_model_weights_fn,
      tff.learning.templates.build_broadcast_process(model_weights_type),
      tff.learning.templates.ClientWorkProcess(client_init, client_next),
      tff.aggregators.MeanFactory().create(model_weights_type, tff.TensorType(np.float32)),
      _finalizer(server_optimizer, model_weights_type))


def train_metrics(loss_sum, num_examples):
  """A round's summed loss and examples as `tff.learning`'s client-work
  metrics (`client_work/train/...`, which `tff.learning.programs.train_model`
  releases): the mean loss beside the two sums."""
  loss = loss_sum / tf.maximum(tf.cast(num_examples, loss_sum.dtype), 1.0)
  return collections.OrderedDict(loss=loss, loss_sum=loss_sum, num_examples=num_examples)


def _train_metrics(examples_type, loss_type):
  """`train_metrics` as a TFF computation of these types."""
  import tensorflow_federated as tff
  return tff.tensorflow.computation(train_metrics, loss_type, examples_type)


def _finalizer(server_optimizer, model_weights_type):
  """`build_fedavg`'s finalizer: `server_optimizer` (a TFF optimizer) applied
  to the mean update of the trainable weights; the non-trainable weights
  take the mean update as it is."""
  import tensorflow_federated as tff

  @tff.tensorflow.computation
  def optimizer_init():
    specs = [tf.TensorSpec(t.shape, t.dtype) for t in model_weights_type.trainable]
    return server_optimizer.initialize(tuple(specs))

  @tff.tensorflow.computation(optimizer_init.type_signature.result, model_weights_type,
                              model_weights_type)
  def apply(opt_state, weights, update):
    opt_state, trainable = server_optimizer.next(
        opt_state, tuple(weights.trainable), tuple(update.trainable))
    non_trainable = [w - u for w, u in zip(weights.non_trainable, update.non_trainable)]
    return opt_state, tff.learning.models.ModelWeights(list(trainable), non_trainable)

  @tff.federated_computation
  def finalizer_init():
    return tff.federated_eval(optimizer_init, tff.SERVER)

  @tff.federated_computation(
      finalizer_init.type_signature.result,
      tff.FederatedType(model_weights_type, tff.SERVER),
      tff.FederatedType(model_weights_type, tff.SERVER))
  def finalizer_next(state, weights, update):
    new_state, new_weights = tff.federated_map(apply, (state, weights, update))
    return tff.templates.MeasuredProcessOutput(
        new_state, new_weights, tff.federated_value((), tff.SERVER))

  return tff.learning.templates.FinalizerProcess(finalizer_init, finalizer_next)
