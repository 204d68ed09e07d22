"""Personalized FL with models kept by the clients: the parts FedPer, FedRep,
LG-FedAvg, FedBN, Ditto and local-only training are written on.

Two shapes of personal state, each kept per client in its client state
(`personal`; the driver's client-state store, so the ray runner's actors hold
and checkpoint it with the client):

* `SplitDefinition`: the model's weights split into a shared part, averaged
  by the server as FedAvg averages a model, and a personal part
  (`core.personal`: the head for FedPer and FedRep, the body for LG-FedAvg,
  the BatchNorm layers for FedBN). A client starts from the round's shared
  weights and its own personal weights; in mode `train` it trains all of
  them, in `head` only its personal weights and in `body` only the shared
  ones (the optimizer's `mask`), and returns the shared part's update,
  weighted as FedAvg weighs it (`--client_weighting`).
* `FullPersonalDefinition`: a personal copy v_k of the whole model. Ditto
  (lambda >= 0): a FedAvg client's local work from the global w_t, then the
  personal model's, v_k <- v_k - lr (grad F_k(v_k) + lambda (v_k - w_t)) on
  the same batches (the proximal anchor is the round's w_t). local-only
  (`federated=False`): only v_k trains; nothing is sent or averaged.

A client that has never trained holds its start: the initial model's
personal weights (for Ditto and local-only the whole initial model w_0,
as the authors' code initialises every v_k), unless the algorithm's option
says that unseen clients take the current global model (`unseen='global'`).
Every client is tested with the model it would deploy: the shared weights
with its own personal ones, or its v_k (`PersonalDriver.eval_models`).
"""

from __future__ import annotations

import collections
from typing import List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tff_cluster.core.weighting import add_mean_update, client_weight, with_weight_spec
from tff_cluster.core import personal
from tff_cluster.core.definition import ClientOutput, Definition, LocalSolver, UpdateParts
from tff_cluster.host import driver
from tff_cluster.learning import optimizers, schedule


class PersonalStateDefinition(Definition):
  """What the definitions below share: the server state `{'model': the full
  weight list}` and a client state `personal` (the weights of
  `personal_spec()`, starting at `initial_personal`), with `weight` for
  `--client_weighting=samples` and `velocity` for a persisted momentum."""

  initial_personal: List[np.ndarray]
  weighting: str

  def personal_spec(self) -> List[tf.TensorSpec]:
    raise NotImplementedError

  def client_state_spec(self, mode):
    spec = collections.OrderedDict(super().client_state_spec(mode) or {})
    spec["personal"] = self.personal_spec()
    return with_weight_spec(spec, self.weighting)

  def initial_client_state(self, mode):
    state = super().initial_client_state(mode)
    state["personal"] = [np.array(w) for w in self.initial_personal]
    return state

  def initial_state(self, initial_weights):
    return collections.OrderedDict(model=[np.asarray(w) for w in initial_weights])


class SplitDefinition(PersonalStateDefinition):
  """Shared and personal weights (see the module docstring).

  State: `{'model': the full weight list}` (its personal entries stay at
  their initial values: the server never sees a client's). Broadcast: the
  shared weights and the round's lr. Client state: `personal` (its weights
  at `indices`), `weight` for `--client_weighting=samples`, `velocity` for
  a persisted momentum. Summed: `loss_sum`, `num_examples` and, in a mode
  that trains the shared part, `update` = sum_k n_k (shared delta) and
  `weight` = sum_k n_k.
  """

  aggregation_slot = True

  def update_parts(self, mode):
    """The shared weights' updates (the head mode sends none)."""
    return None if mode == "head" else UpdateParts(("update",), "weight")

  def __init__(self, weights_spec, num_trainable: int, *, indices: Sequence[int],
               initial_weights, weighting: str, modes: Tuple[str, ...] = ("train",),
               solver: LocalSolver = LocalSolver()):
    super().__init__(weights_spec, num_trainable, solver)
    self.modes = tuple(modes)
    if self.modes != ("train",):
      # A masked phase starts its optimizer afresh (a frozen weight under a
      # carried momentum buffer would move), as the authors' FedRep builds
      # a new optimizer every round.
      self.persist_momentum = False
    self.indices = [int(i) for i in indices]
    self.is_personal = personal.split_flags(len(self.weights_spec), self.indices)
    self.shared = [i for i in range(len(self.weights_spec)) if not self.is_personal[i]]
    self.weighting = weighting
    self.initial_personal = [np.asarray(initial_weights[i]) for i in self.indices]
    trainable = self.is_personal[:self.num_trainable]
    self._optimizers = {
        "train": self.client_optimizer,
        "head": optimizers.chain(optimizers.mask(trainable), self.local_step),
        "body": optimizers.chain(optimizers.mask(~trainable), self.local_step)}

  def personal_spec(self):
    return [self.weights_spec[i] for i in self.indices]

  def broadcast(self, state, params, mode):
    return collections.OrderedDict(shared=[state["model"][i] for i in self.shared],
                                   lr=params["lr"])

  def client_work(self, trainer, selected, received, client_state, data, mode, key=None):
    start = personal.merge(received["shared"], client_state["personal"], self.indices)
    out, new_state = self.local_update(trainer, start, data, received["lr"], client_state,
                                       optimizer=self._optimizers[mode])
    new_state["personal"] = [start[i] + out.delta[i] for i in self.indices]
    n = client_weight(out, client_state, self.weighting)
    summed = collections.OrderedDict(loss_sum=out.loss_sum, num_examples=out.num_examples)
    if mode != "head":
      summed["update"] = [n * out.delta[i] for i in self.shared]
      summed["weight"] = n
    result = collections.OrderedDict(loss_sum=out.loss_sum, num_examples=out.num_examples)
    return ClientOutput(summed, result, new_state)

  def server_update(self, state, summed, mode):
    if mode == "head":
      return collections.OrderedDict(model=list(state["model"]))
    model = list(state["model"])
    moved = add_mean_update([model[i] for i in self.shared], summed["update"], summed["weight"])
    for i, w in zip(self.shared, moved):
      model[i] = w
    return collections.OrderedDict(model=model)

  def client_model(self, global_model, client_state) -> list:
    """The weights client `client_state` deploys: the shared weights of
    `global_model` with its personal ones."""
    rest = [global_model[i] for i in self.shared]
    return personal.merge(rest, [np.asarray(w) for w in client_state["personal"]],
                          self.indices)

  def unseen_model(self, global_model, unseen: str) -> list:
    """A client without personal weights yet: the shared weights with the
    initial personal ones (the personal part never leaves a client, so the
    global model's are the initial ones too)."""
    del unseen
    return self.client_model(global_model, {"personal": self.initial_personal})


class FullPersonalDefinition(PersonalStateDefinition):
  """A personal copy v_k of the whole model (see the module docstring).

  State: `{'model': w}`. Client state: `personal` (v_k, every weight),
  `weight` / `velocity` as FedAvg's. Ditto (`federated`): summed `update` =
  sum_k n_k (w_k - w_t), `weight`, `loss_sum` and `num_examples` of the
  global model's training; local-only: `loss_sum` and `num_examples` of v_k's
  training, and the state never changes.
  """

  aggregation_slot = True

  def update_parts(self, mode):
    """The global model's updates (local-only sends none)."""
    return UpdateParts(("update",), "weight") if self.federated else None

  def __init__(self, weights_spec, num_trainable: int, *, initial_weights, weighting: str,
               lam: float = 0.0, federated: bool = True,
               solver: LocalSolver = LocalSolver()):
    super().__init__(weights_spec, num_trainable, solver)
    self.weighting = weighting
    self.lam = float(lam)
    self.federated = bool(federated)
    self.initial_personal = [np.asarray(w) for w in initial_weights]

  def personal_spec(self):
    return list(self.weights_spec)

  def broadcast(self, state, params, mode):
    if not self.federated:
      return collections.OrderedDict(lr=params["lr"])
    return collections.OrderedDict(model=list(state["model"]), lr=params["lr"])

  def client_work(self, trainer, selected, received, client_state, data, mode, key=None):
    lr = received["lr"]
    v = list(client_state["personal"])
    if not self.federated:
      out, new_state = self.local_update(trainer, v, data, lr, client_state)
      new_state["personal"] = [a + d for a, d in zip(v, out.delta)]
      summed = collections.OrderedDict(loss_sum=out.loss_sum, num_examples=out.num_examples)
      return ClientOutput(summed, summed, new_state)
    w_t = list(received["model"])
    out, new_state = self.local_update(trainer, w_t, data, lr, client_state)
    # The personal model: the same batches, pulled toward the round's w_t;
    # its optimizer state starts afresh every round.
    pull = optimizers.chain(optimizers.proximal(self.lam, w_t[:self.num_trainable]),
                            self.local_step)
    mine = trainer.train(v, data, lr, pull)
    new_state["personal"] = [a + d for a, d in zip(v, mine.delta)]
    n = client_weight(out, client_state, self.weighting)
    summed = collections.OrderedDict(update=[n * d for d in out.delta], weight=n,
                                     loss_sum=out.loss_sum, num_examples=out.num_examples)
    result = collections.OrderedDict(loss_sum=out.loss_sum, num_examples=out.num_examples)
    return ClientOutput(summed, result, new_state)

  def server_update(self, state, summed, mode):
    model = list(state["model"])
    if not self.federated:
      return collections.OrderedDict(model=model)
    return collections.OrderedDict(model=add_mean_update(model, summed["update"],
                                                         summed["weight"]))

  def client_model(self, global_model, client_state) -> list:
    del global_model
    return [np.asarray(w) for w in client_state["personal"]]

  def unseen_model(self, global_model, unseen: str) -> list:
    """A client that has never trained: w_0 ('initial', its v_k's start) or
    the current global model ('global', a new client)."""
    if unseen == "global" and self.federated:
      return [np.asarray(w) for w in global_model]
    return [np.asarray(w) for w in self.initial_personal]


class PersonalDriver(driver.Driver):
  """The host side of every definition above: rounds of one or more modes
  (`phases`: (mode, local work or None for the run's)), one server model,
  each client tested with its own model.

  `phases` is one round of mode `train` with the run's local work and
  `unseen` ('initial' or 'global', the model a client never sampled is
  tested with: `unseen_model`) 'initial'; a subclass sets its own after
  this constructor (FedRep's two phases, Ditto's `--ditto_unseen`).

  `models_down`/`models_up`: the fraction of the model a sampled client
  receives and sends in a round (the shared part's size; 0 for local-only).
  """

  def __init__(self, context: driver.Context, definition: PersonalStateDefinition):
    super().__init__(context, definition)
    self.phases: List[Tuple[str, Optional[schedule.LocalWork]]] = [("train", None)]
    self.unseen = "initial"
    self.state = None

  def setup(self):
    self.state = self.runner.put_state(self.definition.initial_state(self.w0))
    return {"num_parameters": self.num_params}

  def shared_fraction(self) -> float:
    d = self.definition
    if isinstance(d, FullPersonalDefinition):
      return 1.0 if d.federated else 0.0
    if not hasattr(d, "shared"):  # a definition that sends the whole model
      return 1.0
    size = [int(np.prod(s.shape)) for s in d.weights_spec]
    return float(sum(size[i] for i in d.shared)) / float(sum(size))

  def run_round(self, round_num, sampled):
    loss_sum = num_examples = 0.0
    for mode, work in self.phases:
      out = self.train_clients(mode, self.state, sampled, round_num, work=work)
      self.state = out.state
      loss_sum += float(out.summed["loss_sum"])
      num_examples += float(out.summed["num_examples"])
    share = self.shared_fraction()
    return self.training_row({"loss_sum": loss_sum, "num_examples": num_examples},
                             len(sampled), models_down=share, models_up=share)

  def global_model(self) -> List[np.ndarray]:
    return [np.asarray(w) for w in self.runner.numpy_state(self.state)["model"]]

  def eval_models(self):
    """Each client's own model (see the module docstring): one model per
    client that holds personal weights, and one for every client that does
    not (test-only clients included)."""
    glob = self.global_model()
    n = self.data.num_clients
    weights, index = [], np.full(n, -1, np.int64)
    for key in sorted(int(k) for k in self.client_states):
      client = key - self.state_key_offset
      if 0 <= client < n:
        index[client] = len(weights)
        weights.append(self.definition.client_model(glob, self.client_states[key]))
    index[index < 0] = len(weights)
    weights.append(self.definition.unseen_model(glob, self.unseen))
    return weights, index


def split_definition(context: driver.Context, indices: Sequence[int],
                     modes: Tuple[str, ...] = ("train",)) -> SplitDefinition:
  """A `SplitDefinition` whose personal weights are `indices` (into the
  model's weight list), starting at `context.w0`'s, weighted by the
  options' `--client_weighting`."""
  return SplitDefinition(context.weights_spec, context.num_trainable, indices=indices,
                         initial_weights=context.w0,
                         weighting=context.options.client_weighting, modes=modes,
                         solver=context.solver)


def full_definition(context: driver.Context, *, weighting: str, lam: float = 0.0,
                    federated: bool = True) -> FullPersonalDefinition:
  """A `FullPersonalDefinition` (Ditto, local-only) whose every v_k starts at
  `context.w0`."""
  return FullPersonalDefinition(context.weights_spec, context.num_trainable,
                                initial_weights=context.w0, weighting=weighting, lam=lam,
                                federated=federated, solver=context.solver)
