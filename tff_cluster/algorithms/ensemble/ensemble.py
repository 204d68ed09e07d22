"""FedAvg+ and FedProx+ (the WeCFL paper's ensemble baselines): R =
`--ensemble_size` independent FedAvg (FedProx) runs, combined at test time.

Member r has its own initial model (seeded from --seed and r; member 0 starts
from the run's w0), its own data shuffles and its own client momentum
buffers; all members train on the round's sampled clients (the paper: all
clients every round). Each member's round is FedAvg's
(`tff_cluster.algorithms.fedavg.FedAvgDefinition`, both runners), so the cost
is R x FedAvg.

Test: each client predicts the argmax of the mean of the R models' logits
(`--ensemble_vote=logits`, the authors' code's "soft voting") or of their
softmax probabilities (`probs`); the loss is the cross-entropy of the
ensemble's probabilities. The paper scores the ensemble once, at the end;
it is evaluated every `--eval_every` rounds here (the final round is the
paper's number). Saved models: all R, every client mapped to -1 (the
ensemble).
"""

from __future__ import annotations

import numpy as np

from tff_cluster import seeds
from tff_cluster.host import driver
from tff_cluster.learning import evaluation
from tff_cluster.algorithms.fedavg import fedavg
from tff_cluster.spec.options import given

# Member r > 0 shuffles with round index round + r * SHUFFLE_STRIDE (its own seeds).
SHUFFLE_STRIDE = 1_000_003


class EnsembleDriver(driver.Driver):
  """R independent FedAvg/FedProx runs (see the module docstring).

  `state` is the list of the R members' server states; `client_states` keys
  member r's client k as r * N + k.
  """

  not_one_release = ("its --ensemble_size models train on each round's clients, a release "
                     "each, which the privacy account does not compose")
  label_per_example = "tests each client with the vote of several models' outputs"

  def __init__(self, context: driver.Context, definition: fedavg.FedAvgDefinition):
    """`definition`: the members' FedAvg (FedProx) definition, `definition(context)`."""
    super().__init__(context, definition)
    options = self.options
    self.size = int(options.ensemble_size)
    self.vote = options.ensemble_vote
    self.state = None

  def member_weights(self, r: int):
    if r == 0:
      return self.w0
    seed = seeds.int_seed(self.config.seed, "ensemble_run", r)
    return driver.initial_weights(self.model, seed)

  def setup(self):
    self.state = [self.runner.put_state(self.definition.initial_state(self.member_weights(r)))
                  for r in range(self.size)]
    return {"num_parameters": self.num_params, "ensemble_size": self.size,
            "ensemble_vote": self.vote}

  def run_round(self, round_num, sampled):
    n = self.data.num_clients
    loss, weight, states = 0.0, 0.0, []
    for r in range(self.size):
      self.state_key_offset = r * n  # member r's states: keys r * N + k
      try:
        out = self.train_clients("train", self.state[r], sampled, round_num,
                                 shuffle_round=round_num + r * SHUFFLE_STRIDE)
      finally:
        self.state_key_offset = 0
      states.append(out.state)
      loss += float(out.summed["loss_sum"])
      weight += float(out.summed["weight"])
    self.state = states
    return self.training_row({"loss_sum": loss, "weight": weight}, len(sampled),
                             models_down=self.size, models_up=self.size, weight_key="weight")

  def eval_models(self):
    models = [list(self.runner.numpy_state(s)["model"]) for s in self.state]
    return models, evaluation.ENSEMBLE_VOTES[self.vote]



def definition(context: driver.Context) -> fedavg.FedAvgDefinition:
  """Every member's definition: FedAvg's, FedProx's when the options have
  `mu` (FedProx+), with FedAvg's server step (the weighted mean)."""
  options = context.options
  mu = given(options, "mu") if "mu" in options else 0.0
  return fedavg.FedAvgDefinition(context.weights_spec, context.num_trainable, mu=mu,
                                 weighting=options.client_weighting, solver=context.solver)
