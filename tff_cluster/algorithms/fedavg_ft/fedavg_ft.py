"""FedAvg + local fine-tuning ("FedAvg+", "FT"): FedAvg's training, and before
every evaluation each client fine-tunes a copy of the global model on its own
training data and is tested with it.

Rule (FedEM's `--locally_tune_clients`, omarfoq/FedEM, the catalogue spec's
§16.2, the default): at an evaluation every client with training data copies
the current global model w and trains it for `--ft_epochs` epochs (FedEM: 1)
with the run's optimizer, batch size and learning rate; the copy is tested on
its test split and thrown away (the global training is unaffected). Named
variants of the other papers' baselines: `--ft_layers=head` fine-tunes the
head only (FedRep's FedAvg baseline: 10 head epochs in its last round; the
head as `--head_layers`/`--head_names` choose it) and `--ft_mu` > 0 pulls the
copy toward w by (mu/2)||v - w||^2 (Ditto's `finetuning.py`). Test-only
clients (no training data) are tested with w.

The fine-tuning is one runner call over every client with training data, in
mode `finetune`, at each evaluation (`--eval_every`); a round that is not
evaluated costs FedAvg's round alone. It moves no bytes (the clients hold w
after the round).
"""

from __future__ import annotations

import collections

import numpy as np

from tff_cluster.algorithms.fedavg import fedavg
from tff_cluster.core import personal as parts
from tff_cluster.core.definition import ClientOutput, LocalSolver
from tff_cluster.host import driver
from tff_cluster.learning import optimizers, schedule


class FineTuneDefinition(fedavg.FedAvgDefinition):
  """FedAvg's definition (mode `train`) and the fine-tuning (mode `finetune`):
  a client trains a copy of the received global model with `finetune_optimizer`
  and returns it as its state (`personal`); nothing is summed but its loss,
  and the server state does not change."""

  modes = ("train", "finetune")

  def __init__(self, weights_spec, num_trainable: int, *, head=None, ft_mu: float = 0.0,
               weighting: str, solver: LocalSolver = LocalSolver()):
    super().__init__(weights_spec, num_trainable, mu=0.0, weighting=weighting, solver=solver)
    steps = [optimizers.proximal(ft_mu)]
    if head is not None:  # the head only
      steps.append(optimizers.mask(parts.split_flags(len(self.weights_spec),
                                                     head)[:self.num_trainable]))
    self.finetune_optimizer = optimizers.chain(*steps, self.local_step)

  def update_parts(self, mode):
    return None if mode == "finetune" else super().update_parts(mode)

  def client_state_spec(self, mode):
    if mode != "finetune":
      return super().client_state_spec(mode)
    return collections.OrderedDict(personal=list(self.weights_spec))

  def client_work(self, trainer, selected, received, client_state, data, mode, key=None):
    if mode != "finetune":
      return super().client_work(trainer, selected, received, client_state, data, mode, key)
    start = list(received["model"])
    out = trainer.train(start, data, received["lr"], self.finetune_optimizer)
    summed = collections.OrderedDict(loss_sum=out.loss_sum, num_examples=out.num_examples)
    state = collections.OrderedDict(personal=[w + d for w, d in zip(start, out.delta)])
    return ClientOutput(summed, summed, state)

  def server_update(self, state, summed, mode):
    if mode == "finetune":
      return collections.OrderedDict((k, list(v)) for k, v in state.items())
    return super().server_update(state, summed, mode)


class FineTuneDriver(fedavg.FedAvgDriver):
  """FedAvg's rounds; each evaluation tests every client with its fine-tuned
  copy (`eval_models`), a round without one with the global model."""

  def __init__(self, context: driver.Context, definition: FineTuneDefinition):
    super().__init__(context, definition)
    self.state = None
    self.last_round = 0

  def finetune_work(self) -> schedule.LocalWork:
    """The local work of an evaluation's fine-tuning: `--ft_epochs` epochs."""
    return schedule.LocalWork(self.config.batch_size, epochs=self.options.ft_epochs)

  def run_round(self, round_num, sampled):
    self.last_round = round_num
    return super().run_round(round_num, sampled)

  def round_models(self):
    return super().eval_models()

  def eval_models(self):
    glob = self.model_weights()
    clients = self.data.training_clients()
    out = self.train_clients("finetune", self.state, clients, max(self.last_round, 1),
                             work=self.finetune_work(), persist=False)
    weights = [[np.asarray(w) for w in s["personal"]] for s in out.client_states] + [glob]
    index = np.full(self.data.num_clients, len(weights) - 1, np.int64)
    index[np.asarray(clients)] = np.arange(len(clients))
    return weights, index


def definition(context: driver.Context) -> FineTuneDefinition:
  """FedAvg's definition with the fine-tuning of `--ft_layers` (the head as
  `--head_layers` / `--head_names` choose it) and `--ft_mu`."""
  options = context.options
  model = context.model.model_fn()
  # A head is checked where given, and fine-tuned alone with --ft_layers=head.
  head = parts.head_indices(model, options.head_layers, options.head_names, "fedavg_ft") \
      if options.ft_layers == "head" else parts.check_head_names(model, options.head_names)
  return FineTuneDefinition(context.weights_spec, context.num_trainable, head=head,
                            ft_mu=options.ft_mu, weighting=options.client_weighting,
                            solver=context.solver)
