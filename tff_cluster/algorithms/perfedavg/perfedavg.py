"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar, "Personalized Federated Learning
with Theoretical Guarantees: A Model-Agnostic Meta-Learning Approach",
NeurIPS 2020): FedAvg over MAML meta-steps, each client adapting the global
model by one gradient step on its own training data before it is tested.

No code by the authors exists; the rule is the paper's form as FL-bench runs
it (`src/client/perfedavg.py`, the catalogue spec's section 13): a sampled
client takes meta-steps over consecutive batches D, D' (and D'' for the
Hessian-free variant), w~ = w - alpha grad(w; D); first order (`fo`):
w <- w - beta grad(w~; D'); Hessian-free (`hf`): with g = grad(w~; D'),
w <- w - beta (g - alpha Hg), Hg the finite difference
(grad(w + delta g; D'') - grad(w - delta g; D'')) / (2 delta)
(`optimizers.meta_step`; alpha the run's `--client_lr`, its decay applied).
The server takes the plain mean of the clients' models (FL-bench's client
weight 1). Before each evaluation every client with training data takes one
SGD step of size alpha from the global model on one batch of its *training*
data and is tested with the result (one public code adapts on test batches;
not here); a test-only client is tested with the global model.
"""

from __future__ import annotations

import collections

import tensorflow as tf

from tff_cluster.algorithms.fedavg_ft import fedavg_ft
from tff_cluster.core.definition import ClientOutput, LocalSolver
from tff_cluster.host import driver
from tff_cluster.learning import optimizers, schedule
from tff_cluster.spec.options import Options


class PerFedAvgDefinition(fedavg_ft.FineTuneDefinition):
  """FedAvg + FT's definition with the meta-steps as the training of mode
  `train`, every client weighted 1, and one plain step as the adaptation
  (mode `finetune`)."""

  def __init__(self, weights_spec, num_trainable: int, *, options: Options,
               solver: LocalSolver = LocalSolver()):
    super().__init__(weights_spec, num_trainable, weighting="processed", solver=solver)
    self.meta = optimizers.chain(optimizers.meta_step(
        options.perfedavg_variant, options.perfedavg_beta, options.perfedavg_delta))

  def client_work(self, trainer, selected, received, client_state, data, mode, key=None):
    if mode != "train":
      return super().client_work(trainer, selected, received, client_state, data, mode, key)
    out, new_state = self.local_update(trainer, list(received["model"]), data, received["lr"],
                                       client_state, optimizer=self.meta)
    summed = collections.OrderedDict(update=list(out.delta), weight=tf.constant(1.0),
                                     loss_sum=out.loss_sum, num_examples=out.num_examples)
    result = collections.OrderedDict(loss_sum=out.loss_sum, num_examples=out.num_examples)
    return ClientOutput(summed, result, new_state)


class PerFedAvgDriver(fedavg_ft.FineTuneDriver):
  """FedAvg's rounds of meta-steps; each evaluation tests every client after
  one adaptation step on a batch of its training data."""

  def finetune_work(self) -> schedule.LocalWork:
    """The adaptation: one step."""
    return schedule.LocalWork(self.config.batch_size, steps=1)

  def run_round(self, round_num, sampled):
    self.last_round = round_num
    out = self.train_clients("train", self.state, sampled, round_num)
    self.state = out.state
    return self.training_row(out.summed, len(sampled))


def definition(context: driver.Context) -> PerFedAvgDefinition:
  """Per-FedAvg's definition: the meta-steps of `--perfedavg_variant`."""
  return PerFedAvgDefinition(context.weights_spec, context.num_trainable,
                             options=context.options, solver=context.solver)
