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

from tff_cluster import driver, evaluation
from tff_cluster.algorithms.fedavg import FedAvgDefinition

VOTES = tuple(evaluation.ENSEMBLE_VOTES)
# Member r > 0 shuffles with round index round + r * SHUFFLE_STRIDE (its own seeds).
SHUFFLE_STRIDE = 1_000_003


class EnsembleDriver(driver.Driver):
  """R independent FedAvg/FedProx runs (see the module docstring).

  `state` is the list of the R members' server states; `client_states` keys
  member r's client k as r * N + k.
  """

  def __init__(self, task, data, config: driver.TrainingConfig, *,
               ensemble_size: int = 1, ensemble_vote: str = "logits", mu: float = 0.0,
               client_weighting: str = "processed"):
    if ensemble_vote not in VOTES:
      raise ValueError(f"invalid --ensemble_vote={ensemble_vote}; valid: {', '.join(VOTES)}")
    if ensemble_size < 1:
      raise ValueError(f"invalid --ensemble_size={ensemble_size}; valid: an integer >= 1")
    super().__init__(task, data, config,
                     lambda specs, num_trainable, **solver: FedAvgDefinition(
                         specs, num_trainable, mu=mu or 0.0, weighting=client_weighting,
                         **solver))
    self.size = int(ensemble_size)
    self.vote = ensemble_vote
    self.state = None

  def member_weights(self, r: int):
    if r == 0:
      return self.w0
    seed = int(np.random.SeedSequence([self.config.seed, 31, r]).generate_state(1)[0]
               & 0x7FFFFFFF)
    return driver.initial_weights(self.task, seed)

  def setup(self):
    self.state = [self.runner.put_state(self.definition.initial_state(self.member_weights(r)))
                  for r in range(self.size)]
    return {"num_parameters": self.num_params, "ensemble_size": self.size,
            "ensemble_vote": self.vote}

  def run_round(self, round_num, sampled):
    n = self.data.num_clients
    every = self.client_states
    loss, weight, states = 0.0, 0.0, []
    for r in range(self.size):
      self.client_states = {k - r * n: v for k, v in every.items() if r * n <= k < (r + 1) * n}
      try:
        out = self.train_clients("train", self.state[r], sampled, round_num,
                                 shuffle_round=round_num + r * SHUFFLE_STRIDE)
        every.update({r * n + k: v for k, v in self.client_states.items()})
      finally:
        self.client_states = every
      states.append(out.state)
      loss += float(out.summed["loss_sum"])
      weight += float(out.summed["weight"])
    self.state = states
    model_bytes = self.num_params * driver.BYTES_PER_PARAMETER
    return {"train_loss": loss / max(weight, 1.0),
            "bytes_down": self.size * len(sampled) * model_bytes,
            "bytes_up": self.size * len(sampled) * model_bytes}

  def eval_models(self):
    models = [list(self.runner.numpy_state(s)["model"]) for s in self.state]
    return models, evaluation.ENSEMBLE_VOTES[self.vote]


def make_driver(task, data, config: driver.TrainingConfig, **options):
  return EnsembleDriver(task, data, config, **options)
