"""pFedMe (Dinh, Tran, Nguyen, "Personalized Federated Learning with Moreau
Envelopes", NeurIPS 2020): a personal model theta_i per client, the solution
of min_theta f_i(theta) + (lambda/2)||theta - w_i||^2 found approximately by K
steps on each batch, and a local model w_i pulled toward it.

Rule (the authors' code, CharlieDinh/pFedMe `userpFedMe.train`,
`pFedMeOptimizer`, `serverpFedMe.train`): a round broadcasts w to the clients
that train; each sets w_i = theta_i = w and, for each of its local steps (one
batch each: `--local_steps`, the code's `local_epochs`), takes K =
`--pfedme_k` steps theta <- theta - eta_p (grad f_i(theta) + lambda (theta -
w_i) + mu theta) on that batch, then w_i <- w_i - eta lambda (w_i - theta)
(`optimizers.moreau_step`; eta the run's `--client_lr`, eta_p
`--pfedme_personal_lr`, mu `--pfedme_weight_decay`, the weight decay of 0.001
the code's optimizer adds by default). The server takes the sampled clients'
n-weighted mean w_bar and sets w <- (1 - beta) w + beta w_bar. The code trains
**every** client each round and averages the sampled ones
(`--pfedme_train=all`, the default; `sampled` trains those alone). Each client
is tested with its theta_i (the code's "pFedMe_p"); one that has not trained
with w.
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf

from tff_cluster.algorithms import personal
from tff_cluster.core.weighting import add_mean_update, client_weight
from tff_cluster.core.definition import ClientOutput, LocalSolver, UpdateParts
from tff_cluster.host import driver
from tff_cluster.learning import optimizers
from tff_cluster.spec.options import Options


class PFedMeDefinition(personal.PersonalStateDefinition):
  """State: `{'model': w}`. Client state: `personal` (theta_i, with the local
  model's non-trainable weights), `weight` for `--client_weighting=samples`.
  With `keyed` (every client trains), a client's key is 1 when it was sampled
  (averaged) and 0 when it only trains. Summed: `update` = sum_k a_k n_k (w_k -
  w), `weight` = sum_k a_k n_k (a_k its key, 1 without keys), `loss_sum` and
  `num_examples` of every client that trained."""

  aggregation_slot = True

  def update_parts(self, mode):
    return UpdateParts(("update",), "weight")

  def __init__(self, weights_spec, num_trainable: int, *, options: Options, keyed: bool,
               solver: LocalSolver = LocalSolver()):
    super().__init__(weights_spec, num_trainable, solver)
    self.keyed = bool(keyed)
    self.weighting = options.client_weighting
    # Never read: theta starts at w every round; a client without a theta is
    # tested with w (`unseen_model`).
    self.initial_personal = [np.zeros(s.shape, s.dtype.as_numpy_dtype) for s in self.weights_spec]
    self.beta = float(options.pfedme_beta)
    self.client_optimizer = optimizers.chain(optimizers.moreau_step(
        options.pfedme_personal_lr, options.pfedme_lambda, options.pfedme_k,
        options.pfedme_weight_decay))

  def num_keys(self, mode):
    return 2 if self.keyed else 0

  def personal_spec(self):
    return list(self.weights_spec)

  def broadcast(self, state, params, mode):
    return collections.OrderedDict(model=list(state["model"]), lr=params["lr"])

  def client_work(self, trainer, selected, received, client_state, data, mode, key=None):
    start = list(received["model"])
    out = trainer.train(start, data, received["lr"], self.client_optimizer)
    theta = list(out.opt_state[0])
    n = client_weight(out, client_state, self.weighting)
    a = tf.constant(1.0) if key is None else tf.cast(key, tf.float32)
    summed = collections.OrderedDict(update=[a * n * d for d in out.delta], weight=a * n,
                                     loss_sum=out.loss_sum, num_examples=out.num_examples)
    state = collections.OrderedDict(client_state)
    state["personal"] = theta + [w + d for w, d in zip(start[self.num_trainable:],
                                                       out.delta[self.num_trainable:])]
    result = collections.OrderedDict(loss_sum=out.loss_sum, num_examples=out.num_examples)
    return ClientOutput(summed, result, state)

  def server_update(self, state, summed, mode):
    return collections.OrderedDict(model=add_mean_update(
        list(state["model"]), summed["update"], summed["weight"], self.beta))

  def client_model(self, global_model, client_state) -> list:
    del global_model
    return [np.asarray(w) for w in client_state["personal"]]

  def unseen_model(self, global_model, unseen: str) -> list:
    del unseen
    return [np.asarray(w) for w in global_model]


class PFedMeDriver(personal.PersonalDriver):
  """Every client with training data trains each round (`--pfedme_train=all`),
  the sampled ones keyed 1; or the sampled ones alone."""

  def __init__(self, context: driver.Context, definition: PFedMeDefinition):
    super().__init__(context, definition)
    self.train_all = definition.keyed

  def run_round(self, round_num, sampled):
    if not self.train_all:
      return super().run_round(round_num, sampled)
    clients = self.data.training_clients()
    keys = np.isin(clients, sampled).astype(np.int32)
    out = self.train_clients("train", self.state, clients, round_num, keys=keys)
    self.state = out.state
    return self.training_row(out.summed, len(sampled), models_down=len(clients) / len(sampled),
                             weight_key="num_examples")


def definition(context: driver.Context) -> PFedMeDefinition:
  """pFedMe's definition, keyed when every client trains (`--pfedme_train=all`)."""
  options = context.options
  return PFedMeDefinition(context.weights_spec, context.num_trainable, options=options,
                          keyed=options.pfedme_train == "all", solver=context.solver)
