"""APFL (Deng, Kamani, Mahdavi, "Adaptive Personalized Federated Learning",
arXiv 2003.13461, 2020): beside FedAvg's global model w, each client keeps a
personal model v_k and a mixing weight alpha_k, and deploys their mixture.

Rule, `--apfl_mix=outputs` (the default: the authors' code, MLOPTPSU/FedTorch
at 1edcfbf, `comms/trainings/federated/apfl.py`, `comms/utils/flow_utils.py`
`alpha_update`, `comms/utils/eval.py` `inference_personal`): a sampled client
receives w; on each local batch its copy of w takes a plain SGD step, then
v_k takes one on the loss of the personal prediction alpha v_k(x) + (1 -
alpha) w(x) (w after its step); with `--apfl_adaptive`, at the round's first
step alpha moves by the gradient of that loss plus 0.02 alpha, clipped to
[0, 1] (`optimizers.apfl_step`). The server takes the plain mean of the
clients' models (`--apfl_agg=uniform`, the code's; `examples`: weighted by
the examples processed). `--apfl_mix=params` (FedJAX's `apfl`): the personal
model is the per-weight mixture alpha v + (1 - alpha) w, v steps by the
gradient there (without the factor alpha) and each weight's alpha by the
inner product of v - w with it, at every step when adaptive.

Each client is tested with its mixture of the current global model and its
own v_k (outputs mixed, `evaluation.OutputMix`, or weights mixed); one that
has not trained with the global model (FedJAX's evaluation of a client
without state: alpha 0). v_k starts at w_0, alpha_k at `--apfl_alpha`.
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf

from tff_cluster.algorithms import personal
from tff_cluster.core.weighting import add_mean_update
from tff_cluster.core.definition import ClientOutput, LocalSolver, UpdateParts
from tff_cluster.host import driver
from tff_cluster.learning import evaluation, optimizers
from tff_cluster.spec.options import Options


class APFLDefinition(personal.PersonalStateDefinition):
  """State: `{'model': w}`. Client state: `personal` (v_k, the trainable
  weights), `alpha` ([one per trainable weight]; all equal with output
  mixing). Summed: `update` = sum_k a_k (w_k - w), `weight` = sum_k a_k (a_k
  1, or the examples processed), `loss_sum` and `num_examples` of w's
  training."""

  aggregation_slot = True

  def update_parts(self, mode):
    return UpdateParts(("update",), "weight")

  def __init__(self, weights_spec, num_trainable: int, *, initial_weights, options: Options,
               solver: LocalSolver = LocalSolver()):
    super().__init__(weights_spec, num_trainable, solver)
    self.weighting = "processed"
    self.uniform = options.apfl_agg == "uniform"
    self.mix = options.apfl_mix
    self.adaptive = bool(options.apfl_adaptive)
    self.alpha0 = float(options.apfl_alpha)
    self.initial_personal = [np.asarray(w) for w in initial_weights[:num_trainable]]

  def personal_spec(self):
    return list(self.trainable_spec)

  def client_state_spec(self, mode):
    spec = super().client_state_spec(mode)
    spec["alpha"] = tf.TensorSpec([self.num_trainable], tf.float32)
    return spec

  def initial_client_state(self, mode):
    state = super().initial_client_state(mode)
    state["alpha"] = np.full([self.num_trainable], self.alpha0, np.float32)
    return state

  def broadcast(self, state, params, mode):
    return collections.OrderedDict(model=list(state["model"]), lr=params["lr"])

  def client_work(self, trainer, selected, received, client_state, data, mode, key=None):
    start = list(received["model"])
    step = optimizers.apfl_step(client_state["personal"], client_state["alpha"], self.mix,
                                self.adaptive)
    out = trainer.train(start, data, received["lr"], optimizers.chain(step))
    v, alpha, _ = out.opt_state[0]
    n = tf.constant(1.0) if self.uniform else out.num_examples
    summed = collections.OrderedDict(update=[n * d for d in out.delta], weight=n,
                                     loss_sum=out.loss_sum, num_examples=out.num_examples)
    state = collections.OrderedDict(client_state)
    state["personal"], state["alpha"] = list(v), alpha
    result = collections.OrderedDict(loss_sum=out.loss_sum, num_examples=out.num_examples)
    return ClientOutput(summed, result, state)

  def server_update(self, state, summed, mode):
    return collections.OrderedDict(model=add_mean_update(list(state["model"]),
                                                         summed["update"], summed["weight"]))

  def client_model(self, global_model, client_state) -> list:
    """Weight mixing: alpha v + (1 - alpha) w per trainable weight, w's
    non-trainable ones (output mixing is `APFLDriver.eval_models`')."""
    alpha = np.asarray(client_state["alpha"], np.float32)
    mixed = [alpha[i] * np.asarray(v) + (1.0 - alpha[i]) * np.asarray(w)
             for i, (v, w) in enumerate(zip(client_state["personal"], global_model))]
    return mixed + [np.asarray(w) for w in global_model[self.num_trainable:]]

  def unseen_model(self, global_model, unseen: str) -> list:
    del unseen
    return [np.asarray(w) for w in global_model]


class APFLDriver(personal.PersonalDriver):
  """FedAvg's rounds; each client tested with its mixture."""
  label_per_example = "tests each client with its mixture of two models' outputs"

  def __init__(self, context: driver.Context, definition: APFLDefinition):
    super().__init__(context, definition)
    self.mix = context.options.apfl_mix

  def eval_models(self):
    if self.mix == "params":
      return super().eval_models()
    glob = self.global_model()
    nt = self.definition.num_trainable
    n = self.data.num_clients
    weights, index, alpha = [glob], np.full(n, -1, np.int64), np.zeros(n)
    for key in sorted(int(k) for k in self.client_states):
      client = key - self.state_key_offset
      if 0 <= client < n:
        state = self.client_states[key]
        index[client] = len(weights)
        alpha[client] = float(np.asarray(state["alpha"])[0])
        weights.append([np.asarray(w) for w in state["personal"]] + glob[nt:])
    return weights, evaluation.OutputMix(index, alpha, shared=0)

  def summary(self):
    out = dict(super().summary())
    ids = self.data.client_ids
    alphas = {ids[int(k) - self.state_key_offset]: [float(a) for a in np.asarray(s["alpha"])]
              for k, s in self.client_states.items()}
    if alphas:  # each trained client's alpha (one per weight with weight mixing)
      out["final_alpha"] = alphas
    return out


def definition(context: driver.Context) -> APFLDefinition:
  """APFL's definition: every v_k starts at `context.w0`'s trainable weights."""
  return APFLDefinition(context.weights_spec, context.num_trainable,
                        initial_weights=context.w0, options=context.options,
                        solver=context.solver)
