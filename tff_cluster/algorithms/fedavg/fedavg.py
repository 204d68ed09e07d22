"""FedAvg (McMahan et al. 2017), FedProx (Li et al. 2020) and FedAvg with a
server optimizer: FedAvgM, FedMom, SlowMo.

Update rule, per round t with sampled clients S_t:
  each client k in S_t runs its local work (epochs or steps) of mini-batch
  SGD from w_t (FedProx adds (mu/2)||w - w_t||^2 to the local objective, eq. 2
  of its paper: local steps w <- w - lr (grad F_k(w) + mu (w - w_t)); every
  client runs the same local work, no stragglers), giving Delta_k = w_k - w_t;
  w_bar = w_t + sum_k n_k Delta_k / sum_k n_k, with n_k the examples
  processed (`--client_weighting=processed`) or the client's training samples
  (`samples`, FedBase's weights); BatchNorm statistics are averaged the same
  way. The server applies its optimizer to the pseudo-gradient
  d_t = w_t - w_bar of the trainable weights: FedAvg's is SGD with step 1
  (w_{t+1} = w_bar). With eta_s = `--server_lr`, beta = `--server_momentum`:

FedAvgM (Hsu et al., 2019), heavy-ball server momentum:
    m <- beta m + d_t;  w_{t+1} = w_t - eta_s m          (m_0 = 0)
  TFF's `build_weighted_fed_avg` with `build_sgdm(eta_s, momentum=beta)`.
FedMom (Huo et al., 2020), Nesterov server momentum:
    v_{t+1} = w_t - eta_s d_t;  w_{t+1} = v_{t+1} + beta (v_{t+1} - v_t)   (v_0 = w_0)
  The rule is the one the project's spec gives from memory; the paper could
  not be consulted here. eta_s = 1, beta = 0 is FedAvg (tested).
SlowMo (Wang et al., ICLR 2020):
    u <- beta u + d_t / gamma_t;  w_{t+1} = w_t - eta_s gamma_t u   (u_0 = 0)
  gamma_t the round's client learning rate (the base optimizer's), eta_s the
  slow learning rate alpha. The paper averages the workers exactly (equal
  weights): use `--client_weighting=samples` on equal-size clients, or
  equal local work, for that. Local momentum buffers follow
  `--client_state` (kept or reset; not averaged).
FedAdam, FedYogi, FedAdagrad (Reddi et al., "Adaptive Federated
Optimization", ICLR 2021), on Delta_t = w_bar - w_t = -d_t, with eta =
`--server_lr`, beta1, beta2, tau = `--server_beta1`, `--server_beta2`,
`--server_tau`: the paper's text could not be read here, so the rule is the
one its authors' code runs (`--server_opt_form=authors`: Keras's Adam and
Adagrad and their Yogi, tau as epsilon; google-research/federated,
optimization/shared/optimizer_utils.py at 0b7d004) or Flower's strategies
(`flower`, no bias correction); docs/algorithms/fedadam.md gives both rules,
their sources and the defaults (`optimizers.server_fedopt`). `fedavg
--server_optimizer=adam|yogi|adagrad` runs them at FedAvg's eta = 1.
The momentum acts on the trainable weights; BatchNorm statistics take the
plain weighted mean. The defaults (eta_s = 1, beta = 0.9) are ours: the pFedMo
paper, which compares with these methods, gives none of their settings.

`FedAvgDefinition` writes this once as plain TF functions; every runner runs
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
from tff_cluster.spec.options import Options, given
from tff_cluster.core.definition import ClientOutput, Definition, LocalSolver, UpdateParts
from tff_cluster.core.aggregators import Mean
from tff_cluster.core.weighting import client_weight, with_weight_spec
from tff_cluster.learning import optimizers


# The server state key of the server optimizer's state (flat; checkpoints
# before it named it `buffer`: `io.checkpoint` maps that name).
SERVER_OPT_STATE = "server_opt_state"


class FedAvgDefinition(Definition):
  """State: `{'model': weights}`, and `server_opt_state` (the server
  optimizer's state as one flat list: FedAvgM's m, FedAdam's m then v, ...)
  when it keeps state. Every client receives the model and the round's lr.

  Summed: `update` = sum_k n_k Delta_k, `weight` = sum_k n_k, `loss_sum`
  (and `lr_sum`, `num_clients` for a server optimizer that reads the round's
  client lr). The server applies `server_optimizer` (an `optimizers` chain;
  `optimizers.server_sgd(1.0)` by default: the weighted mean of the clients'
  models) to the pseudo-gradient d = w_t - w_bar of the trainable weights;
  BatchNorm statistics take the plain weighted mean. The clients' local
  steps carry FedProx's proximal term when `mu` > 0.
  """

  def __init__(self, weights_spec, num_trainable: int, *, mu: float, weighting: str,
               server_optimizer: Optional[optimizers.Chain] = None,
               solver: LocalSolver = LocalSolver()):
    super().__init__(weights_spec, num_trainable, solver)
    self.mu = float(mu)
    self.weighting = weighting
    self.client_optimizer = optimizers.chain(optimizers.proximal(self.mu), self.local_step)
    self.server_optimizer = (optimizers.server_sgd(1.0) if server_optimizer is None
                             else server_optimizer)

  aggregation_slot = True

  def update_parts(self, mode):
    return UpdateParts(("update",), "weight")

  def client_state_spec(self, mode):
    return with_weight_spec(super().client_state_spec(mode), self.weighting)

  def initial_state(self, initial_weights):
    model = [np.asarray(w) for w in initial_weights]
    state = collections.OrderedDict(model=model)
    opt = self.server_optimizer
    flat = opt.flat_state(opt.init(model[:self.num_trainable]))
    if flat:
      state[SERVER_OPT_STATE] = [np.asarray(x) for x in flat]
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
    mean_delta = Mean.mean(summed["update"], weight)
    d = [-x for x in mean_delta[:n]]  # pseudo-gradient w_t - w_bar
    client_lr = None
    if self.server_optimizer.uses_client_lr:
      client_lr = summed["lr_sum"] / tf.maximum(summed["num_clients"], 1.0)
    opt = self.server_optimizer
    old = list(state.get(SERVER_OPT_STATE, []))
    trainable, opt_state = opt.update(d, opt.state_like(old, model[:n]), model[:n], client_lr)
    has = weight > 0
    new = collections.OrderedDict(
        model=[tf.where(has, t, w) for t, w in zip(trainable, model[:n])]
        + [w + x for w, x in zip(model[n:], mean_delta[n:])])
    if old:
      new[SERVER_OPT_STATE] = [tf.where(has, b, was)
                               for b, was in zip(opt.flat_state(opt_state), old)]
    return new


class FedAvgDriver(driver.Driver):
  """One global model for every client."""

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


# The server momentum optimizers of FedAvg's family, from (eta_s, beta): the
# server state's `server_opt_state` is their state (FedAvgM's m, FedMom's v,
# SlowMo's u).
SERVER_OPTIMIZERS = {
    "heavy_ball": optimizers.server_heavy_ball,
    "nesterov": optimizers.server_nesterov,
    "slowmo": optimizers.server_slowmo,
}


def server_optimizer(options: Options) -> optimizers.Chain:
  """The server optimizer `options` name (`server_optimizer`, fixed by the
  spec or given as `--server_optimizer`; default plain averaging,
  `server_sgd(1.0)`): sgd at `server_lr`, FedOpt's adam, yogi or adagrad in
  the form `server_opt_form` (default the authors' code's) at `server_lr`
  with `server_beta1`, `server_beta2`, `server_tau`, or a momentum optimizer
  of `SERVER_OPTIMIZERS` at (`server_lr`, `server_momentum`). FedAdagrad has
  no first moment in either form: a `server_beta1` other than its default
  is refused with adagrad."""
  kind = options.get("server_optimizer", "sgd")
  if kind == "sgd":
    return optimizers.server_sgd(options.get("server_lr", 1.0))
  if kind in optimizers.FEDOPT_VARIANTS:
    beta1 = options.get("server_beta1", hparams.SERVER_BETA1.default)
    if kind == "adagrad" and beta1 != hparams.SERVER_BETA1.default:
      raise ValueError(f"--server_beta1={beta1} with --server_optimizer=adagrad; valid: "
                       f"{hparams.SERVER_BETA1.default} (FedAdagrad has no first moment)")
    return optimizers.server_fedopt(kind, options.server_lr, beta1,
                                    options.get("server_beta2", hparams.SERVER_BETA2.default),
                                    options.server_tau,
                                    options.get("server_opt_form", "authors"))
  return SERVER_OPTIMIZERS[kind](options.server_lr, options.server_momentum)


def per_cluster_server_optimizer(options: Options) -> Optional[optimizers.Chain]:
  """A clustered algorithm's `--server_optimizer` for each cluster (its
  state stacked [K, ...]); None for sgd at 1.0, the plain per-cluster mean
  (also where the algorithm declares no server optimizer)."""
  if options.get("server_optimizer", "sgd") == "sgd" and options.get("server_lr", 1.0) == 1.0:
    return None
  return server_optimizer(options)


def definition(context: driver.Context) -> FedAvgDefinition:
  """FedAvg's definition, FedProx's when the options have `mu`, with the
  server optimizer they name (FedAvgM's, FedMom's, SlowMo's, ...)."""
  options = context.options
  mu = given(options, "mu") if "mu" in options else 0.0
  return FedAvgDefinition(context.weights_spec, context.num_trainable, mu=mu,
                          weighting=options.client_weighting,
                          server_optimizer=server_optimizer(options), solver=context.solver)


def build_fedavg(model_fn: Callable[[], tf.keras.Model], loss,
                 element_spec, initial_weights: Optional[List[np.ndarray]] = None,
                 client_lr: float = 0.01, mu: float = 0.0, server_optimizer=None,
                 client_momentum: float = 0.0, seed: int = 0, client_optimizer=None):
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
    client_optimizer: a `tff.learning.optimizers` optimizer (`build_sgdm`,
      `build_adam`, `build_yogi`, `build_adagrad`) for the local steps, run by
      its equivalent chain (`optimizers.from_tff`; its own learning rate, its
      state afresh every round); default SGD at `client_lr`, `client_momentum`.

  `next(state, client_datasets)` returns the new state and metrics in
  `tff.learning`'s layout, `{'client_work': {'train': {'loss', 'loss_sum',
  'num_examples'}}, ...}` (`loss`: the mean over the round's examples), for
  `tff.learning.programs.train_model`. The client work is
  `FedAvgDefinition`'s local update, the one every runner executes.
  """
  stack.require_tff()
  import tensorflow_federated as tff  # the definition itself needs no TFF

  from tff_cluster.runners.tff import runtime
  from tff_cluster.runners.tff import types as tff_types

  loss = models.loss_kind(loss)
  if client_lr <= 0:
    raise ValueError(f"client_lr must be > 0, got {client_lr}")
  if initial_weights is None:
    tf.keras.utils.set_random_seed(seed)
    initial_weights = models.get_weights(model_fn())
  model = model_fn()
  definition = _process_definition(model, mu, client_momentum, client_optimizer,
                                   server_optimizer)
  runtime.install()
  num_trainable = definition.num_trainable

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


def _process_definition(model, mu: float, client_momentum: float, client_optimizer,
                        server_optimizer) -> FedAvgDefinition:
  """`build_fedavg`'s definition of `model`, its arguments checked (one line
  naming what is valid): FedAvg's local work (FedProx's with `mu`) with the
  client optimizer a TFF optimizer names, or local SGD with momentum."""
  mu = hparams.MU.check(mu)
  if server_optimizer is not None and not (hasattr(server_optimizer, "initialize")
                                           and hasattr(server_optimizer, "next")):
    raise ValueError(f"invalid server_optimizer {server_optimizer!r}; valid: "
                     f"{optimizers.TFF_OPTIMIZERS} (a tff.learning.optimizers.Optimizer)")
  local = None
  if client_optimizer is not None:
    if client_momentum:
      raise ValueError("client_momentum with a client_optimizer; valid: the momentum in "
                       "the client_optimizer (build_sgdm(lr, momentum=...))")
    local = optimizers.from_tff(client_optimizer)
  definition = FedAvgDefinition(models.weights_type_spec(model), len(model.trainable_variables),
                                mu=mu, weighting="processed",
                                solver=LocalSolver(client_momentum))
  if local is not None:
    definition.client_optimizer = optimizers.chain(optimizers.proximal(definition.mu), local)
  return definition


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
