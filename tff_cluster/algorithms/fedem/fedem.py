"""FedEM (Marfoq, Neglia, Bellet, Kameni and Vidal, "Federated Multi-Task
Learning under a Mixture of Distributions", NeurIPS 2021), as the authors'
code runs it (omarfoq/FedEM at 996fadd: `client.py` `MixtureClient`,
`learners/learners_ensemble.py`, `aggregator.py` `CentralizedAggregator`).

Server state: M = `--num_groups` component models theta_1..theta_M (each its
own random draw: the code seeds component m with seed + m). Client state:
its mixture weights pi_k (uniform at first) and n_k, its training samples.

Round t, each sampled client k, in the code's order:
  1. E-step (inference mode, the round's models): for each of its examples
     q(i, m) = softmax_m(log pi_k,m - l(theta_m; x_i, y_i));
  2. M-step: pi_k,m = mean_i q(i, m) (over the round's schedule: every
     example once per local epoch, the same mean);
  3. for each m: the local work from theta_m with the loss
     (1/|b|) sum_{i in b} q(i, m) l(theta; x_i, y_i) (plain SGD, the code's);
     q is recomputed from the same frozen models and pi for each batch
     (`trainers.ExampleWeights`), which is the E-step's value, so no
     per-example table is kept between steps or rounds;
  4. server (`--fedem_agg`): all (the code, and its author in issue #1):
     theta_m <- sum over every client of (n_k / n) theta_k,m, a client not
     sampled contributing the unchanged theta_m, i.e. theta_m +
     sum_{k sampled} (n_k / n)(theta_k,m - theta_m), n = the training samples
     of all clients; sampled: theta_m <- the n_k-weighted mean over the
     round's clients.
Prediction for client k: sum_m pi_k,m softmax(theta_m(x)) (`evaluation.Mixture`).
A client never sampled (or without training data) mixes uniformly: the
code's fit of pi for unseen clients (E/M steps with the models frozen) is not
done here. ARI and purity: argmax_m pi_k,m of the clients sampled so far.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Dict

import numpy as np
import tensorflow as tf

from tff_cluster import seeds
from tff_cluster.host import driver
from tff_cluster.core.aggregators import Mean
from tff_cluster.host.state import HostState
from tff_cluster.core import cluster_ops
from tff_cluster.core.definition import ClientOutput, Definition, LocalSolver, flat_norm
from tff_cluster.learning import evaluation
from tff_cluster.learning.trainers import ExampleWeights


class FedEMDefinition(Definition):
  """FedEM's round (see the module docstring). State: `models` ([M, ...]
  per weight). Client state: `pi` [M], `weight` (n_k)."""

  def __init__(self, weights_spec, num_trainable: int, num_components: int, *,
               aggregation: str, total_samples: float, solver: LocalSolver = LocalSolver()):
    """`aggregation`: `--fedem_agg`; `total_samples`: n, the training samples of
    all clients (the shares n_k / n of `all`)."""
    super().__init__(weights_spec, num_trainable, solver)
    self.m = int(num_components)
    self.aggregation = aggregation
    self.total = float(total_samples)

  def initial_state(self, initial_weights):
    return collections.OrderedDict(models=cluster_ops.stack_models(initial_weights, self.m))

  def broadcast(self, state, params, mode):
    return collections.OrderedDict(models=list(state["models"]), lr=params["lr"])

  def client_state_spec(self, mode):
    return collections.OrderedDict(pi=tf.TensorSpec([self.m], tf.float32),
                                   weight=tf.TensorSpec([], tf.float32))

  def initial_client_state(self, mode):
    return collections.OrderedDict(pi=np.full(self.m, 1.0 / self.m, np.float32),
                                   weight=np.float32(0.0))

  def log_weights(self, received, client_state, losses, y):
    """[M, b]: the log-numerators of the E-step, log pi_m - l_m."""
    del received, y
    return tf.math.log(client_state["pi"])[:, None] - losses

  def responsibilities(self, received, client_state):
    """(losses [M, b], y) -> [M, b]: q(i, m), the softmax over m."""
    return lambda losses, y: tf.nn.softmax(
        self.log_weights(received, client_state, losses, y), axis=0)

  def client_work(self, trainer, selected, received, client_state, data, mode, key=None):
    models = [[w[m] for w in received["models"]] for m in range(self.m)]
    q = self.responsibilities(received, client_state)
    sums, count = trainer.example_sums(ExampleWeights(models, q, self.m), data)
    pi = sums / tf.maximum(count, 1.0)
    deltas, loss_sum = [], tf.constant(0.0)
    for m in range(self.m):
      out = trainer.train(models[m], data, received["lr"], self.client_optimizer,
                          example_weights=ExampleWeights(
                              models, lambda losses, y, m=m: q(losses, y)[m]))
      deltas.append(out.delta)
      loss_sum += out.loss_sum
    n = client_state["weight"]
    share = n / self.total if self.aggregation == "all" else n
    stacked = [tf.stack([d[layer] for d in deltas]) for layer in range(len(deltas[0]))]
    summed = collections.OrderedDict(
        update_sums=[share * s for s in stacked], weight=n, loss_sum=loss_sum,
        num_examples=out.num_examples, update_norm_sum=flat_norm(stacked),
        num_clients=tf.constant(1.0))
    result = collections.OrderedDict(pi=pi)
    result.update(self.extra_results(trainer, data, models, q))
    new_state = collections.OrderedDict(pi=pi, weight=n)
    return ClientOutput(summed, result, new_state)

  def extra_results(self, trainer, data, models, q):
    """More per-client results for a subclass (FedRC's label masses); none here."""
    return {}

  def server_update(self, state, summed, mode):
    models = list(state["models"])
    if self.aggregation == "all":
      return collections.OrderedDict(models=[w + s for w, s in zip(models, summed["update_sums"])])
    mean = Mean.mean(summed["update_sums"], summed["weight"])
    return collections.OrderedDict(models=[w + m for w, m in zip(models, mean)])


@dataclasses.dataclass
class FedEMHost(HostState):
  """Each client's latest mixture weights (`pi`, uniform until it is sampled;
  `sampled`: whether it has been) and the summary facts."""
  pi: np.ndarray
  sampled: np.ndarray
  summary: Dict[str, object]


def hard_mixture(pi: np.ndarray, sampled: np.ndarray) -> np.ndarray:
  """Each sampled client's weights one-hot at its largest (the authors'
  --hard_cluster); a client never sampled keeps its weights."""
  hard = np.eye(pi.shape[1])[np.argmax(pi, axis=1)]
  return np.where(np.asarray(sampled)[:, None], hard, pi)


class MixtureReport:
  """What a driver with each client's mixture weights (`host.pi`,
  `host.sampled`, `host.summary`, K = `self.k`) reports: the dominant
  component, its group metrics and ARI, the summary's final mixture."""

  def dominant(self) -> np.ndarray:
    """argmax_m pi_k,m of the clients sampled so far, -1 for the others."""
    return np.where(self.host.sampled, np.argmax(self.host.pi, axis=1), -1)

  def round_eval_metrics(self, result):
    dominant = self.dominant()
    return {**self.group_metrics(result, self.k, dominant, dominant),
            **self.cluster_scores(dominant)}

  def summary(self):
    out = dict(self.host.summary)
    out["final_mixture"] = {cid: [float(v) for v in p]
                            for cid, p in zip(self.data.client_ids, self.host.pi)}
    out["num_groups"] = self.k
    return out


class FedEMDriver(MixtureReport, driver.Driver):
  """M component models; each client's mixture weights (see the module docstring)."""
  label_per_example = "tests each client with a mixture of its models' outputs"

  def __init__(self, context: driver.Context, definition: FedEMDefinition):
    super().__init__(context, definition)
    self.k = int(self.options.num_groups)
    self.host = self.make_host()
    self.extra_columns = (["mean_update_norm"] + self.group_columns(self.k)
                          + self.score_columns())

  def make_host(self):
    n = self.data.num_clients
    return FedEMHost(pi=np.full((n, self.k), 1.0 / self.k), sampled=np.zeros(n, bool),
                     summary={})

  def setup(self):
    draws = [driver.initial_weights(self.model, seeds.int_seed(self.config.seed, "fedem_init", m)) for m in range(self.k)]
    self.state = self.runner.put_state(self.definition.initial_state(draws))
    self.host.summary["num_parameters"] = self.num_params
    return {}

  def run_round(self, round_num, sampled):
    out = self.train_clients("train", self.state, sampled, round_num)
    self.state = out.state
    self.host.pi[sampled] = np.stack([np.asarray(r["pi"], np.float64) for r in out.results])
    self.host.sampled[sampled] = True
    return self.training_row(out.summed, len(sampled), models_down=self.k, models_up=self.k)

  def _models(self):
    state = self.runner.numpy_state(self.state)
    return cluster_ops.unstack_models(state["models"], self.k)

  def mixture(self) -> np.ndarray:
    """[clients, M]: the weights each client predicts with."""
    return self.host.pi.copy()

  def eval_models(self):
    return self._models(), evaluation.Mixture(self.mixture())


def definition(context: driver.Context) -> FedEMDefinition:
  """FedEM's definition: M = `--num_groups` components (at most the clients
  with training data), n the training samples of all clients."""
  options, data = context.options, context.need_data()
  driver.check_num_groups(options.num_groups, data)
  return FedEMDefinition(context.weights_spec, context.num_trainable, options.num_groups,
                         aggregation=options.fedem_agg,
                         total_samples=float(data.num_train_samples().sum()),
                         solver=context.solver)
