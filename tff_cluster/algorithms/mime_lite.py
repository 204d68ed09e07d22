"""MimeLite (Karimireddy et al., "Mime: Mimicking Centralized Stochastic
Algorithms in Federated Learning"), as TFF 0.87's
`tff.learning.algorithms.build_weighted_mime_lite` runs it with an SGD-with-
momentum base optimizer.

State: the global model x and the base optimizer's momentum m (trainable
weights, m_0 = 0). Round t, with eta = the round's client lr, beta =
`--mime_momentum`, eta_s = `--server_lr`:
  client i receives (x, m);
    c_i = its full-batch gradient at x: the mean gradient over every batch of
          the round's local work (training mode);
    local steps from x, each with the momentum *fixed* at the server's:
          y <- y - eta (beta m + g)     (the optimizer's state update is
          discarded: TFF's SGDM step from state m)
    returns Delta_i = y_i - x and c_i, weighted by n_i (the examples of the
          round's local work, TFF's NUM_EXAMPLES weighting);
  server: m <- beta m + sum_i n_i c_i / sum_i n_i   (the base optimizer's state
          update with the mean full gradient);
          x <- x + eta_s sum_i n_i Delta_i / sum_i n_i (TFF's server SGD,
          learning rate eta_s; 1 = the mean of the clients' models).
BatchNorm statistics take the weighted mean update. The Mime paper writes the
momentum as (1 - beta) g + beta m; TFF's SGDM (and this module) use
beta m + g, a scaling of the learning rate. Full Mime (an extra round
broadcasting the mean gradient for a control variate) is not implemented; the
pFedMo paper, which compares with "Mime", does not say which it ran.
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf

from tff_cluster import experiment
from tff_cluster.algorithms.definition import ClientOutput, Definition
from tff_cluster.algorithms.fedavg import FedAvgDriver


class MimeLiteDefinition(Definition):
  """State: `model` (every weight) and `momentum` (trainable weights)."""

  def __init__(self, weights_spec, num_trainable: int, mime_momentum: float = 0.9,
               server_lr: float = 1.0, momentum: float = 0.0,
               persist_momentum: bool = False):
    if momentum:
      raise ValueError("invalid --client_momentum for mime_lite: its momentum is the "
                       "server's, --mime_momentum; valid: --client_momentum=0")
    super().__init__(weights_spec, num_trainable)
    del persist_momentum
    if not 0 <= mime_momentum < 1:
      raise ValueError(f"invalid --mime_momentum={mime_momentum}; valid: 0 <= beta < 1")
    if not server_lr > 0:
      raise ValueError(f"invalid --server_lr={server_lr}; valid: a number > 0")
    self.beta = float(mime_momentum)
    self.server_lr = float(server_lr)

  def initial_state(self, initial_weights):
    model = [np.asarray(w) for w in initial_weights]
    return collections.OrderedDict(
        model=model, momentum=[np.zeros_like(w, np.float32)
                               for w in model[:self.num_trainable]])

  def broadcast(self, state, params, mode):
    return collections.OrderedDict(model=list(state["model"]),
                                   momentum=list(state["momentum"]), lr=params["lr"])

  def client_work(self, trainer, selected, received, client_state, data, mode):
    start = list(received["model"])
    full_gradient, _ = trainer.gradient(start, data, 0)
    offset = [self.beta * m for m in received["momentum"]]
    out = trainer.train(start, data, received["lr"], grad_offset=offset)
    n = out.num_examples
    summed = collections.OrderedDict(
        update=[n * d for d in out.delta], gradient=[n * g for g in full_gradient],
        weight=n, loss_sum=out.loss_sum)
    result = collections.OrderedDict(loss_sum=out.loss_sum, num_examples=n)
    return ClientOutput(summed, result, None)

  def server_update(self, state, summed, mode):
    weight = summed["weight"]
    has = weight > 0
    safe = tf.where(has, weight, 1.0)
    momentum = [tf.where(has, self.beta * m + g / safe, m)
                for m, g in zip(state["momentum"], summed["gradient"])]
    model = [w + self.server_lr * u / safe for w, u in zip(state["model"], summed["update"])]
    return collections.OrderedDict(model=model, momentum=momentum)


def build_mime_lite(model_fn, loss: str, element_spec, mime_momentum: float = 0.9,
                    server_lr: float = 1.0):
  """MimeLite's TFF computation `{'train': ...}` (the `tff` runner's; see
  `tff_runner.build_round`); the state is `definition.initial_state(w0)`.
  Returns (definition, computations). (TFF's own process is
  `tff.learning.algorithms.build_weighted_mime_lite`; a test holds the two
  to the same weights.)"""
  from tff_cluster import local_training
  from tff_cluster.runners import tff_runner
  model = model_fn()
  definition = MimeLiteDefinition(local_training.weights_type_spec(model),
                                  len(model.trainable_variables),
                                  mime_momentum=mime_momentum, server_lr=server_lr)
  return definition, {"train": tff_runner.build_round(definition, "train", model_fn, loss,
                                                      element_spec)}


class MimeLiteDriver(FedAvgDriver):
  """FedAvg's host side over MimeLite's definition."""

  def __init__(self, task, data, config: experiment.TrainingConfig, *,
               mime_momentum: float = 0.9, server_lr: float = 1.0):
    experiment.Driver.__init__(
        self, task, data, config,
        lambda specs, num_trainable, **solver: MimeLiteDefinition(
            specs, num_trainable, mime_momentum=mime_momentum, server_lr=server_lr,
            **solver))
    self.state = None

  def run_round(self, round_num, sampled):
    row = super().run_round(round_num, sampled)
    row["bytes_down"] *= 2  # the model and the server momentum
    row["bytes_up"] *= 2  # the update and the full gradient
    return row


def make_driver(task, data, config: experiment.TrainingConfig, **options):
  return MimeLiteDriver(task, data, config, **options)
