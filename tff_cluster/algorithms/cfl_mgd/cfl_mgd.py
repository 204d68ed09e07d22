"""CFL-MGD (clustered FL with momentum gradient descent; the CFL-MGD paper,
Algorithm 1), options I and II.

State: P = `--num_groups` cluster models chi_p and cluster momentum buffers
u_p (trainable weights, zero at the start), stacked [P, ...].

Round t (lr eta_t = client_lr * lr_decay^(t-1); beta = `--cfl_mgd_beta`): the
server broadcasts every chi_p (and every u_p where the option needs them).
Each sampled client i estimates its cluster p_i = argmin_p phi_i(chi_p), its
mean loss on its training batches (`--ifca_loss_batches`, 0 = all: IFCA's
estimate; ties to the lowest index), r_{i,p} = 1{p = p_i}. Then

option II, model averaging (`--cfl_mgd_option=model`, eqs. (4), (6), (10)):
  (w, u) <- (chi_{p_i}, u_{p_i}); the round's local steps (the local work) of
      u <- beta u + grad;  w <- w - eta u      (momentum first, eqs. (4)/(10))
  server, per cluster with members: chi_p = mean of the members' w,
  u_p = mean of their u (unweighted); a cluster without members keeps both.
  With beta = 0 this is IFCA with uniform averaging; with P = 1 and beta = 0
  it is FedAvg with uniform weights.

option I, gradient averaging (`--cfl_mgd_option=gradient`, eqs. (3), (5), (9)):
  g_i = the mean gradient at chi_{p_i} over the first `--cfl_mgd_grad_batches`
      batches of the round's schedule (1: one stochastic gradient; a batch
      of the client's size gives full-batch GD);
  u_i <- beta u_i + g_i   (the current gradient, as the proof's eq. (32);
      Algorithm 1 line 9 prints the previous round's)
  server: chi_p <- chi_p - (eta / N) sum_{i in M_t} r_{i,p} u_i, N = the total
      number of clients with training data (the paper's m; test-only
      clients are not counted; `--grad_avg_norm=total`) or the
      cluster's members this round (`members`, a cluster mean);
      u_p = mean of its members' u_i, and every member sets u_i <- u_p
      (Algorithm 1 line 15).
  `--cfl_mgd_buffer=client` (the paper): u_i is the client's, kept between
  its participations (a client that switches cluster brings its old
  buffer); `server`: the client starts from its cluster's u_p instead.

Initialisation and evaluation are IFCA's (`tff_cluster.algorithms.ifca`):
`--ifca_init=random|good_init|fedavg_warm|kmeans_loss` (with `--ifca_warm_rounds`,
`--ifca_forced_rounds`, `--ifca_good_init_threshold`; fedavg_warm's warm-up
trains one model by this definition's own rule, cluster 0, and round 1 starts
with zero buffers) and `--ifca_eval=assigned|test_loss|train_loss`. On the rotated tasks
the training clients hold no test data and the test-only clients choose by
test loss (the paper's test clients), so both evaluations agree there.
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf

from tff_cluster.host import driver
from tff_cluster.core import cluster_ops
from tff_cluster.core.aggregators import ClusterMean
from tff_cluster.core.definition import ClientOutput, Definition, LocalSolver, flat_norm
from tff_cluster.algorithms.ifca.ifca import IFCADriver, assign_output, select_cluster
from tff_cluster.learning import optimizers



class CFLMGDDefinition(Definition):
  """CFL-MGD's round as plain TF functions (see the module docstring).

  State: `models` (every weight, [P, ...]) and `momenta` (trainable weights,
  [P, ...]). Client state (option I with client buffers): `velocity`.
  Modes, as IFCA's: train (argmin estimate, then the option's work); assign
  (the estimate only: good_init's check); forced (the client's key is its
  cluster: fedavg_warm's warm-up and forced rounds).
  """

  modes = ("train", "assign", "forced")

  def __init__(self, weights_spec, num_trainable: int, num_clusters: int, *,
               option: str, beta: float, buffer: str, norm: str, num_clients: int,
               loss_batches: int, grad_batches: int, solver: LocalSolver = LocalSolver()):
    """The `--cfl_mgd_*` options, `norm` = `--grad_avg_norm`, `loss_batches` =
    `--ifca_loss_batches`; `num_clients`: the clients with training data (m)."""
    super().__init__(weights_spec, num_trainable, solver)
    self.k = int(num_clusters)
    self.option = option
    self.beta = float(beta)
    # Option II's local steps: heavy-ball momentum whose state starts at the
    # cluster's buffer (`momenta`: one optimizer state per cluster).
    self.client_optimizer = optimizers.chain(optimizers.heavy_ball(self.beta))
    self.buffer = buffer
    self.norm = norm
    self.num_clients = int(num_clients)
    self.loss_batches = int(loss_batches)
    self.grad_batches = int(grad_batches)

  @property
  def client_buffers(self) -> bool:
    return self.option == "gradient" and self.buffer == "client"

  def initial_state(self, initial_weights):
    models = cluster_ops.stack_models(initial_weights, self.k)
    return collections.OrderedDict(
        models=models,
        momenta=[np.zeros_like(w, np.float32) for w in models[:self.num_trainable]])

  def num_keys(self, mode):
    return self.k if mode == "forced" else 0

  def database(self, state, mode):
    if mode != "forced":
      return None
    # The key's row of every model (and buffer) weight.
    buffers = [] if self.client_buffers else list(state["momenta"])
    return [*state["models"], *buffers]

  def broadcast(self, state, params, mode):
    if mode == "forced":
      return collections.OrderedDict(lr=params["lr"])
    out = collections.OrderedDict(models=list(state["models"]), lr=params["lr"])
    if not self.client_buffers:
      out["momenta"] = list(state["momenta"])
    return out

  def client_state_spec(self, mode):
    if not self.client_buffers or mode == "assign":
      return None
    return collections.OrderedDict(velocity=list(self.weights_spec[:self.num_trainable]))

  def client_work(self, trainer, selected, received, client_state, data, mode, key=None):
    stacks = ("models",) if self.client_buffers else ("models", "momenta")
    cluster, losses, rows = select_cluster(trainer, selected, received, data, mode, self.k,
                                           self.loss_batches, stacks, key)
    if mode == "assign":
      return assign_output(cluster, losses)
    start, start_momenta = rows[:len(self.weights_spec)], rows[len(self.weights_spec):]
    clusters = ClusterMean(self.k)
    result = collections.OrderedDict(cluster=cluster, losses=losses)
    if self.option == "model":
      opt = self.client_optimizer
      if self.beta:
        out = trainer.train(start, data, received["lr"], opt,
                            opt.unflat_state(start_momenta, self.trainable_spec))
        new_velocity = opt.flat_state(out.opt_state)
      else:  # plain SGD: the buffer stays zero
        out = trainer.train(start, data, received["lr"], opt)
        new_velocity = [tf.zeros_like(v) for v in start_momenta]
      model_sums, counts = clusters.client(cluster, [s + d for s, d in zip(start, out.delta)])
      summed = collections.OrderedDict(
          model_sums=model_sums, velocity_sums=clusters.client(cluster, new_velocity)[0],
          counts=counts, loss_sum=out.loss_sum, num_examples=out.num_examples,
          update_norm_sum=flat_norm(out.delta), num_clients=tf.constant(1.0))
      return ClientOutput(summed, result, None)
    grads, _ = trainer.gradient(start, data, self.grad_batches)
    if self.client_buffers:
      previous = list(client_state["velocity"])
    else:
      previous = list(start_momenta)
    u = [self.beta * p + g for p, g in zip(previous, grads)]
    lr = tf.cast(received["lr"], tf.float32)
    step_sums, counts = clusters.client(cluster, [lr * v for v in u])
    summed = collections.OrderedDict(
        step_sums=step_sums, velocity_sums=clusters.client(cluster, u)[0], counts=counts,
        loss_sum=tf.gather(losses, cluster), num_examples=tf.constant(1.0),
        update_norm_sum=lr * flat_norm(u), num_clients=tf.constant(1.0))
    new_state = collections.OrderedDict(velocity=u) if self.client_buffers else None
    return ClientOutput(summed, result, new_state)

  def _per_cluster(self, counts, sums, old, divisor=None):
    """sums / divisor where the cluster has members, else `old`."""
    return ClusterMean.mean(sums, counts if divisor is None else divisor, old, has=counts > 0)

  def server_update(self, state, summed, mode):
    if mode == "assign":
      return state
    counts = summed["counts"]
    models = list(state["models"])
    momenta = self._per_cluster(counts, summed["velocity_sums"], list(state["momenta"]))
    if self.option == "model":
      models = self._per_cluster(counts, summed["model_sums"], models)
    else:
      divisor = (counts if self.norm == "members"
                 else tf.fill([self.k], tf.constant(float(self.num_clients))))
      n = self.num_trainable
      zeros = [tf.zeros_like(w) for w in models[:n]]
      steps = self._per_cluster(counts, summed["step_sums"], zeros, divisor)
      models = [w - s for w, s in zip(models[:n], steps)] + models[n:]
    return collections.OrderedDict(models=models, momenta=momenta)


class CFLMGDDriver(IFCADriver):
  """IFCA's host side (initial models, argmin estimates, evaluation) around
  CFL-MGD's definition."""

  def __init__(self, context: driver.Context, definition: CFLMGDDefinition):
    super().__init__(context, definition)
    self.host.summary.update({k: context.options[k] for k in (
        "cfl_mgd_option", "cfl_mgd_beta", "cfl_mgd_buffer", "grad_avg_norm")})

  def run_round(self, round_num, sampled):
    row = super().run_round(round_num, sampled)
    if self.definition.client_buffers:
      # Algorithm 1 line 15: every participant takes its cluster's mean buffer.
      momenta = self.runner.numpy_state(self.state)["momenta"]
      self.client_states.update({
          int(k): collections.OrderedDict(
              velocity=[np.asarray(u[p]) for u in momenta])
          for k, p in ((k, int(self.host.assignment[int(k)])) for k in sampled)})
    if self.definition.option == "model" or not self.definition.client_buffers:
      row["bytes_down"] *= 2  # the models and the buffers
    row["bytes_up"] *= 2
    return row


def definition(context: driver.Context) -> CFLMGDDefinition:
  """CFL-MGD's definition; option I's m is the number of clients with
  training data."""
  o = context.options
  return CFLMGDDefinition(context.weights_spec, context.num_trainable, o.num_groups,
                          option=o.cfl_mgd_option, beta=o.cfl_mgd_beta, buffer=o.cfl_mgd_buffer,
                          norm=o.grad_avg_norm,
                          num_clients=context.need_data().num_training_clients,
                          loss_batches=o.ifca_loss_batches, grad_batches=o.cfl_mgd_grad_batches,
                          solver=context.solver)
