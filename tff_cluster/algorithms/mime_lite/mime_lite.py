"""MimeLite and Mime (Karimireddy et al., "Mime: Mimicking Centralized
Stochastic Algorithms in Federated Learning"), with an SGD-with-momentum base
optimizer whose state m (trainable weights, m_0 = 0) the server keeps and the
clients use fixed during their local steps.

MimeLite (`--algo=mime_lite`), as TFF 0.87's
`tff.learning.algorithms.build_weighted_mime_lite` runs it. Round t, with
eta = the round's client lr, beta = `--mime_momentum`, eta_s = `--server_lr`:
  client i receives (x, m);
    c_i = its full-batch gradient at x: the mean gradient over every batch of
          the round's local work (training mode);
    local steps from x, each with the momentum *fixed* at the server's:
          y <- y - eta U(g, m)
    returns Delta_i = y_i - x and c_i, weighted by n_i (the examples of the
          round's local work, TFF's NUM_EXAMPLES weighting);
  server: m <- V(c_bar, m) with c_bar = sum_i n_i c_i / sum_i n_i;
          x <- x + eta_s sum_i n_i Delta_i / sum_i n_i (TFF's server SGD,
          learning rate eta_s; 1 = the mean of the clients' models).
The base optimizer's form (`--mime_momentum_form`):
  tff:   U(g, m) = beta m + g,             V(c, m) = beta m + c  (TFF's SGDM,
         and fedjax's Mime on optax's `trace`; the default, held to TFF's
         process by a test);
  paper: U(g, m) = (1 - beta) g + beta m,  V(c, m) = (1 - beta) c + beta m
         (the exponential average; the form the project's audit attributes to
         the Mime paper. The paper's algorithm box could not be read here:
         the stored copies hold its abstract only; two public implementations
         that cite it update the server statistic this way).
For a fixed m the two differ by a scaling: tff's step is 1/(1 - beta) times
paper's at the same eta in the g term.

Mime (`--algo=mime`), as fedjax's `mime` algorithm (which cites the paper)
runs it: an extra exchange first, where the round's clients send their
full-batch gradients at x and the server averages them into c (the control
variate); then each local step uses the corrected gradient
    g = grad f_i(y; batch) - grad f_i(x; batch) + c
in U(g, m) (the same batch at both points), and the server updates x as
MimeLite and m <- V(c, m) with that same c. Models with BatchNorm are
refused (the gradient at x would move the batch statistics a second time).

BatchNorm statistics take the weighted mean update.
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf

from tff_cluster.host import driver
from tff_cluster import models
from tff_cluster.core.definition import ClientOutput, Definition, LocalSolver
from tff_cluster.algorithms.fedavg.fedavg import FedAvgDriver
from tff_cluster.learning import optimizers


class MimeLiteDefinition(Definition):
  """State: `model` (every weight) and `momentum` (trainable weights)."""

  def __init__(self, weights_spec, num_trainable: int, *, mime_momentum: float,
               server_lr: float, mime_momentum_form: str, solver: LocalSolver = LocalSolver()):
    super().__init__(weights_spec, num_trainable, solver)
    self.beta = float(mime_momentum)
    self.server_lr = float(server_lr)
    self.form = mime_momentum_form
    # U(g, m) = scale g + beta m; V(c, m) = scale c + beta m.
    self.scale = 1.0 - self.beta if self.form == "paper" else 1.0

  def initial_state(self, initial_weights):
    model = [np.asarray(w) for w in initial_weights]
    return collections.OrderedDict(
        model=model, momentum=[np.zeros_like(w, np.float32)
                               for w in model[:self.num_trainable]])

  def broadcast(self, state, params, mode):
    return collections.OrderedDict(model=list(state["model"]),
                                   momentum=list(state["momentum"]), lr=params["lr"])

  def client_work(self, trainer, selected, received, client_state, data, mode, key=None):
    start = list(received["model"])
    full_gradient, _ = trainer.gradient(start, data, 0)
    offset = [self.beta * m for m in received["momentum"]]
    out = trainer.train(start, data, received["lr"],
                        optimizers.chain(optimizers.scale(self.scale), optimizers.offset(offset)))
    n = out.num_examples
    summed = collections.OrderedDict(
        update=[n * d for d in out.delta], gradient=[n * g for g in full_gradient],
        weight=n, loss_sum=out.loss_sum)
    result = collections.OrderedDict(loss_sum=out.loss_sum, num_examples=n)
    return ClientOutput(summed, result, None)

  def _momentum(self, m, c):
    """V(c, m): the base optimizer's state update with the gradient c."""
    return [self.scale * ci + self.beta * mi for mi, ci in zip(m, c)]

  def server_update(self, state, summed, mode):
    weight = summed["weight"]
    has = weight > 0
    safe = tf.where(has, weight, 1.0)
    updated = self._momentum(state["momentum"], [g / safe for g in summed["gradient"]])
    momentum = [tf.where(has, u, m) for u, m in zip(updated, state["momentum"])]
    model = [w + self.server_lr * u / safe for w, u in zip(state["model"], summed["update"])]
    return collections.OrderedDict(model=model, momentum=momentum)


class MimeDefinition(MimeLiteDefinition):
  """Full Mime: state `model`, `momentum` and `control` (c, trainable weights).
  Modes: `gradient` (the clients' full-batch gradients at x, averaged into c)
  and `train` (local steps with the control variate; x and m updated)."""

  modes = ("gradient", "train")

  def initial_state(self, initial_weights):
    state = super().initial_state(initial_weights)
    state["control"] = [np.zeros_like(m) for m in state["momentum"]]
    return state

  def broadcast(self, state, params, mode):
    if mode == "gradient":
      return collections.OrderedDict(model=list(state["model"]), lr=params["lr"])
    return collections.OrderedDict(model=list(state["model"]),
                                   momentum=list(state["momentum"]),
                                   control=list(state["control"]), lr=params["lr"])

  def client_work(self, trainer, selected, received, client_state, data, mode, key=None):
    start = list(received["model"])
    if mode == "gradient":
      gradient, n = trainer.gradient(start, data, 0)
      return ClientOutput(collections.OrderedDict(gradient=[n * g for g in gradient],
                                                  weight=n),
                          collections.OrderedDict(num_examples=n))
    # U(g - g(x) + c, m) = scale (g - g(x)) + (scale c + beta m).
    offset = [self.scale * c + self.beta * m
              for c, m in zip(received["control"], received["momentum"])]
    out = trainer.train(start, data, received["lr"], optimizers.chain(
        optimizers.control_variate(start[:self.num_trainable]),
        optimizers.scale(self.scale), optimizers.offset(offset)))
    n = out.num_examples
    summed = collections.OrderedDict(update=[n * d for d in out.delta], weight=n,
                                     loss_sum=out.loss_sum)
    return ClientOutput(summed, collections.OrderedDict(loss_sum=out.loss_sum,
                                                        num_examples=n))

  def server_update(self, state, summed, mode):
    new = collections.OrderedDict(state)
    weight = summed["weight"]
    has = weight > 0
    safe = tf.where(has, weight, 1.0)
    if mode == "gradient":
      new["control"] = [tf.where(has, g / safe, c)
                        for g, c in zip(summed["gradient"], state["control"])]
      return new
    updated = self._momentum(state["momentum"], state["control"])
    new["momentum"] = [tf.where(has, u, m) for u, m in zip(updated, state["momentum"])]
    new["model"] = [w + self.server_lr * u / safe
                    for w, u in zip(state["model"], summed["update"])]
    return new


class MimeLiteDriver(FedAvgDriver):
  """FedAvg's host side over MimeLite's definition."""

  def run_round(self, round_num, sampled):
    row = super().run_round(round_num, sampled)
    row["bytes_down"] *= 2  # the model and the server momentum
    row["bytes_up"] *= 2  # the update and the full gradient
    return row


class MimeDriver(MimeLiteDriver):
  """Full Mime: two exchanges per round with the same clients, the
  full-batch gradients at x (averaged into c), then the local steps."""

  def run_round(self, round_num, sampled):
    out = self.train_clients("gradient", self.state, sampled, round_num)
    self.state = out.state
    row = FedAvgDriver.run_round(self, round_num, sampled)
    # Down: x (first exchange), then x, m and c; up: the gradient, then the update.
    row["bytes_down"] *= 4
    row["bytes_up"] *= 2
    return row


def definition(context: driver.Context, definition_class=MimeLiteDefinition):
  """MimeLite's definition (`definition_class`'s: Mime's) from its options."""
  options = context.options
  return definition_class(context.weights_spec, context.num_trainable,
                          mime_momentum=options.mime_momentum, server_lr=options.server_lr,
                          mime_momentum_form=options.mime_momentum_form,
                          solver=context.solver)


def mime_definition(context: driver.Context) -> MimeDefinition:
  """Mime's definition; a model with BatchNorm is refused."""
  if models.has_batch_statistics(context.model.model_fn()):
    raise ValueError("--algo=mime takes a gradient at the round's start x on every local "
                     "batch, which would move BatchNorm statistics twice; valid: a model "
                     "without BatchNorm (or --algo=mime_lite)")
  return definition(context, MimeDefinition)
