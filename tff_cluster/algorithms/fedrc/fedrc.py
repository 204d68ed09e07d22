"""FedRC (Guo, Tang and Lin, "FedRC: Tackling Diverse Distribution Shifts
Challenge in Federated Learning by Robust Clustering", ICML 2024), as the
authors' code runs it (LINs-lab/FedRC at ce79229: `client.py` class `FedRC`,
`run_experiment.py`'s host step, `aggregator.py`; a fork of FedEM's code).

FedEM's round (`tff_cluster.algorithms.fedem`) with robust weights and the
label prior:
  * E-step: gamma(i, m) = softmax_m(log omega_k,m - l(theta_m; x_i, y_i)
    - log P_m(y_i)), P [M, C] the server's per-component label distribution
    (uniform at first, which leaves the softmax as FedEM's);
    omega_k,m = mean_i gamma(i, m); the client's label masses
    L_k[m, c] = sum_{i: y_i = c} gamma(i, m) go back to the host;
  * training: each component with the loss (1/|b|) sum gamma(i, m) l_i, as
    FedEM's;
  * server: theta_m <- the n_k-weighted mean over the round's clients
    (sampled clients only: FedEM's `--fedem_agg=sampled`);
  * host, after every round: P_m(c) = sum over all clients of L_k[m, c] (a
    client not sampled this round: its latest masses; never sampled: none),
    clamped at >= 1e-8, normalised over c, sent with the next round's models.
Prediction (`--fedrc_predict`): soft, sum_m omega_k,m softmax(theta_m(x));
hard, the component of largest omega_k,m alone (the code's --hard_cluster).
A client never sampled (or without training data) mixes uniformly in both.
Not run: the code's "diverse" KL term (`fit_epoch_diverse`), which its main
loop never calls.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import tensorflow as tf

from tff_cluster.host import driver
from tff_cluster.algorithms.fedem import fedem
from tff_cluster.core.definition import LocalSolver
from tff_cluster.learning.trainers import ExampleWeights

PRIOR_FLOOR = 1e-8


class FedRCDefinition(fedem.FedEMDefinition):
  """FedEM's definition with the label prior `log_prior` [M, C] in the state."""

  def __init__(self, weights_spec, num_trainable, num_components, *, num_classes: int,
               solver: LocalSolver = LocalSolver()):
    super().__init__(weights_spec, num_trainable, num_components, aggregation="sampled",
                     total_samples=1.0, solver=solver)
    self.c = int(num_classes)

  def initial_state(self, initial_weights):
    state = super().initial_state(initial_weights)
    state["log_prior"] = np.full((self.m, self.c), -np.log(self.c), np.float32)
    return state

  def broadcast(self, state, params, mode):
    out = super().broadcast(state, params, mode)
    out["log_prior"] = state["log_prior"]
    return out

  def log_weights(self, received, client_state, losses, y):
    labels = tf.cast(tf.reshape(y, [-1]), tf.int32)
    return (tf.math.log(client_state["pi"])[:, None] - losses
            - tf.gather(received["log_prior"], labels, axis=1))

  def extra_results(self, trainer, data, models, q):
    c = self.c

    def masses(losses, y):  # [M * C, b]: gamma(i, m) in the column of y_i
      onehot = tf.one_hot(tf.cast(tf.reshape(y, [-1]), tf.int32), c)  # [b, C]
      return tf.reshape(q(losses, y)[:, None, :] * tf.transpose(onehot)[None], [-1, tf.shape(y)[0]])

    sums, _ = trainer.example_sums(ExampleWeights(models, masses, self.m * c), data)
    return collections.OrderedDict(label_mass=tf.reshape(sums, [self.m, c]))

  def server_update(self, state, summed, mode):
    out = super().server_update(state, summed, mode)
    out["log_prior"] = state["log_prior"]
    return out


@dataclasses.dataclass
class FedRCHost(fedem.FedEMHost):
  """FedEM's host state and each client's latest label masses [N, M, C]."""
  label_mass: np.ndarray = None


def label_prior(masses: np.ndarray) -> np.ndarray:
  """P [M, C] from the clients' label masses [N, M, C]: summed over the
  clients, clamped at >= 1e-8, normalised over the labels."""
  p = np.maximum(np.asarray(masses, np.float64).sum(axis=0), PRIOR_FLOOR)
  return p / p.sum(axis=1, keepdims=True)


class FedRCDriver(fedem.FedEMDriver):
  """FedEM's host side, the label prior refreshed after every round."""
  label_per_example = ("weighs examples by a per-class label prior and tests each client "
                       "with a mixture of its models' outputs")

  def __init__(self, context: driver.Context, definition: FedRCDefinition):
    super().__init__(context, definition)
    self.predict = self.options.fedrc_predict

  def make_host(self):
    base = super().make_host()
    return FedRCHost(pi=base.pi, sampled=base.sampled, summary=base.summary,
                     label_mass=np.zeros((self.data.num_clients, self.k,
                                          self.data.num_classes)))

  def run_round(self, round_num, sampled):
    out = self.train_clients("train", self.state, sampled, round_num)
    self.host.pi[sampled] = np.stack([np.asarray(r["pi"], np.float64) for r in out.results])
    self.host.sampled[sampled] = True
    self.host.label_mass[sampled] = np.stack([np.asarray(r["label_mass"], np.float64)
                                              for r in out.results])
    state = self.runner.numpy_state(out.state)
    state["log_prior"] = np.log(label_prior(self.host.label_mass)).astype(np.float32)
    self.state = self.runner.put_state(state)
    return self.training_row(out.summed, len(sampled), models_down=self.k, models_up=self.k)

  def mixture(self):
    pi = self.host.pi.copy()
    return fedem.hard_mixture(pi, self.host.sampled) if self.predict == "hard" else pi


def definition(context: driver.Context) -> FedRCDefinition:
  """FedRC's definition: M = `--num_groups` components (at most the clients
  with training data), a label prior over the data's classes."""
  options, data = context.options, context.need_data()
  driver.check_num_groups(options.num_groups, data)
  return FedRCDefinition(context.weights_spec, context.num_trainable, options.num_groups,
                         num_classes=data.num_classes, solver=context.solver)
