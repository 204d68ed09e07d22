"""Client and server optimizers as values: small TF `init`/`update` transforms
on lists of weights, composed as optax's are. One type serves both sides.

A `Transform` maps gradients (one tensor per trainable weight) to new
gradients (a gradient transform) or to the new weights (a step, the last
transform of a chain). `chain(*transforms)` runs them in order, ending with
`sgd()` when no step is given. One argument order everywhere, for a
transform and for a chain:

  opt = chain(control_variate(x), scale(s), proximal(mu), offset(o), heavy_ball(b))
  state = opt.init(start)                           tuple, one entry per transform
  new_w, state = opt.update(grads, state, w, lr, gradient_at)

Client side: `lr` is the step's learning rate (the round's, decayed) and
`gradient_at(point)` the trainer's (`GradientAt`): the same batch's
gradient at other trainable weights (Mime's control variate asks for it), and
`gradient_at.mixed(point, other, alpha)` the gradients at two points of the
batch's loss of their mixed outputs (APFL's personal prediction). `opt.bind(start)` is
called by the trainer once per `train` call, before `init`: a transform whose
value depends on the start (the proximal term's default anchor) takes it
there. Every transform is elementwise per weight, and the order in a chain is
the order of the floating-point operations: the chain above computes, per
weight, g <- g - g(x); g <- s g; g <- g + mu (w - anchor); g <- g + o; then
the step (`v <- b v + g; w <- w - lr v`).

Server side: the same chains over the pseudo-gradient d_t = w_t - w_bar of
the server's trainable weights. A server step carries its own step size, the
server learning rate eta_s (`with_lr(step, eta_s)`; `server_sgd`,
`server_heavy_ball`, ... build them), so the `lr` a server update is called
with is the round's client learning rate, which only a chain whose
`uses_client_lr` is true reads (SlowMo's gamma_t); the others take None.
Every server transform is elementwise (Adam's step counts included: one per
weight element), so one update of [K, ...] stacks is K clusters' updates,
each with its own state.

A chain's state is a tuple with one entry per transform (`()` for the
stateless ones). `flat_state`/`unflat_state` give it as one flat list of
tensors, which is how persisted optimizer state is stored: a client's
(`Definition`'s client state key `velocity`: for heavy-ball momentum, its
buffer per trainable weight) and the server's (the server state key
`server_opt_state`).

Per-example weights enter in the trainer's batch loss, not here: the mean
loss over a batch already weighs each row by its 1.0/0.0 mask
(the trainers' step), and a per-example weight multiplies that mask.
A variable mask is the `mask(trainable_flags)` gradient transform.
"""

from __future__ import annotations

from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf


# ---------------------------------------------------------------------------
# Transforms


class Transform(NamedTuple):
  """One transform (client or server).

  init: trainable start weights -> state.
  update: (grads, state, weights, lr, gradient_at) -> (grads, state), or for
    a step (`is_step`) -> (new weights, state).
  bind: trainable start weights -> the transform to use from that start
    (None: the transform itself).
  uses_client_lr: whether `update` reads its `lr` argument (None: a step
    does, a gradient transform does not; `with_lr` makes a step that reads
    its own).
  """
  init: Callable[[List[tf.Tensor]], Any]
  update: Callable[..., Tuple[List[tf.Tensor], Any]]
  is_step: bool = False
  bind: Optional[Callable[[List[tf.Tensor]], "Transform"]] = None
  uses_client_lr: Optional[bool] = None

  @property
  def reads_lr(self) -> bool:
    """`uses_client_lr`, its None resolved."""
    return self.is_step if self.uses_client_lr is None else bool(self.uses_client_lr)


class GradientAt:
  """What a trainer gives a step of the same batch at other weights: called
  with trainable weights `point`, the batch's mean-loss gradient there;
  `mixed(point, other, alpha)`, the gradients at `point` and at `other` of the
  batch's mean loss of the mixed outputs alpha f(point; x) + (1 - alpha)
  f(other; x) (the output-mixing forward of APFL's personal prediction)."""

  def __init__(self, at: Callable, mixed: Optional[Callable] = None):
    self._at = at
    self._mixed = mixed

  def __call__(self, point):
    return self._at(point)

  def mixed(self, point, other, alpha):
    if self._mixed is None:
      raise ValueError("this trainer has no output-mixing forward")
    return self._mixed(point, other, alpha)


def _stateless(fn, is_step: bool = False) -> Transform:
  """A transform without state from `fn(grads, weights, lr, gradient_at)`."""
  return Transform(lambda start: (),
                   lambda grads, state, weights, lr, gradient_at:
                   (fn(grads, weights, lr, gradient_at), ()),
                   is_step)


def _identity() -> Transform:
  """The gradient unchanged (a transform whose parameter makes it a no-op)."""
  return _stateless(lambda grads, *_: list(grads))


def sgd() -> Transform:
  """The plain step: w <- w - lr g."""
  return _stateless(lambda grads, weights, lr, _: [w - lr * g for w, g in zip(weights, grads)],
                    is_step=True)


def heavy_ball(beta: float) -> Transform:
  """Heavy-ball momentum, PyTorch's convention: v <- beta v + g, w <- w - lr v
  (v_0 = 0; state: v per weight). beta = 0 is `sgd()` (no state)."""
  beta = float(beta)
  if not beta:
    return sgd()

  def update(grads, velocity, weights, lr, _):
    new_velocity = [beta * v + g for v, g in zip(velocity, grads)]
    return [w - lr * v for w, v in zip(weights, new_velocity)], new_velocity

  return Transform(lambda start: [tf.zeros_like(w) for w in start], update, is_step=True)


def nesterov(beta: float) -> Transform:
  """Nesterov's accelerated gradient in its two-sequence form (the pFedMo
  paper's eqs. 6-7); the state is the look-ahead point y of the previous step
  (y_0 = the start, unless the caller gives it):
    y_new = w - lr g;  w <- y_new + beta (y_new - y);  y <- y_new.
  In one sequence this is v <- beta v - lr g, w <- w + beta v - lr g (Keras'
  nesterov SGD), with v = y_new - y."""
  beta = float(beta)

  def update(grads, look_ahead, weights, lr, _):
    y_new = [w - lr * g for w, g in zip(weights, grads)]
    return [y + beta * (y - y_old) for y, y_old in zip(y_new, look_ahead)], y_new

  return Transform(lambda start: [tf.identity(w) for w in start], update, is_step=True)


def adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> Transform:
  """Adam (Kingma and Ba, 2015, Algorithm 1): m <- b1 m + (1 - b1) g,
  v <- b2 v + (1 - b2) g^2, t <- t + 1,
  w <- w - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
  State: (t, m, v)."""
  b1, b2, eps = float(b1), float(b2), float(eps)

  def init(start):
    return (tf.constant(0.0), [tf.zeros_like(w) for w in start],
            [tf.zeros_like(w) for w in start])

  def update(grads, state, weights, lr, _):
    count, m, v = state
    count = count + 1.0
    m = [b1 * a + (1.0 - b1) * g for a, g in zip(m, grads)]
    v = [b2 * a + (1.0 - b2) * tf.square(g) for a, g in zip(v, grads)]
    c1 = 1.0 - tf.pow(b1, count)
    c2 = 1.0 - tf.pow(b2, count)
    new = [w - lr * (a / c1) / (tf.sqrt(b / c2) + eps) for w, a, b in zip(weights, m, v)]
    return new, (count, m, v)

  return Transform(init, update, is_step=True)


def scale(s: float) -> Transform:
  """g <- s g (the identity when s = 1)."""
  if isinstance(s, (int, float)) and s == 1.0:
    return _identity()
  return _stateless(lambda grads, *_: [s * g for g in grads])


def offset(values: Sequence[tf.Tensor]) -> Transform:
  """g <- g + values (one constant per trainable weight; MimeLite's fixed
  server momentum term)."""
  values = list(values)
  return _stateless(lambda grads, *_: [g + o for g, o in zip(grads, values)])


def proximal(mu: float, anchor: Optional[Sequence[tf.Tensor]] = None) -> Transform:
  """g <- g + mu (w - anchor), the gradient of (mu/2)||w - anchor||^2 added
  (FedProx, Li et al. 2020, eq. 2); `anchor` None: the start weights. mu = 0
  is the identity."""
  mu = float(mu)
  if not mu:
    return _identity()

  def at(centre):
    centre = list(centre)
    return _stateless(lambda grads, weights, *_:
                      [g + mu * (w - a) for g, w, a in zip(grads, weights, centre)])

  if anchor is not None:
    return at(anchor)

  def unbound(*_):
    raise ValueError("proximal() without an anchor is bound to the start by the trainer "
                     "(Chain.bind) before use")

  return _stateless(unbound)._replace(bind=at)


def proximal_mix(coefs, anchors: Sequence[tf.Tensor]) -> Transform:
  """g <- g + sum_s coefs[s] (w - anchors_s), the gradient of
  sum_s (coefs[s]/2)||w - anchors_s||^2 added (FedSoft's pull toward every
  cluster model in proportion to the client's importance weights): `coefs`
  [S] (a tensor: per client), `anchors` one [S, ...] stack per trainable
  weight."""
  coefs = tf.convert_to_tensor(coefs, tf.float32)
  anchors = list(anchors)
  return _stateless(lambda grads, weights, *_: [
      g + tf.tensordot(coefs, w[None] - a, axes=1)
      for g, w, a in zip(grads, weights, anchors)])


def cosine_pull(coef, direction: Sequence[tf.Tensor]) -> Transform:
  """g <- g + coef (c / ||w|| - <c, w> w / ||w||^3), the gradient of
  coef <c, w> / ||w|| added, w and c the trainable weights and `direction`
  each flattened into one vector (pFedGraph's local term, its c the graph's
  weighted sum of unit-norm neighbour models: coef sum_j a_j cos(w, w_j));
  `coef` a scalar (a tensor: per client); nothing is added where ||w|| = 0."""
  coef = tf.convert_to_tensor(coef, tf.float32)
  direction = list(direction)

  def update(grads, weights, *_):
    sq = tf.add_n([tf.reduce_sum(tf.square(w)) for w in weights])
    dot = tf.add_n([tf.reduce_sum(c * w) for c, w in zip(direction, weights)])
    positive = sq > 0
    norm = tf.sqrt(tf.where(positive, sq, 1.0))
    along = tf.where(positive, coef / norm, 0.0)
    back = tf.where(positive, coef * dot / (norm * norm * norm), 0.0)
    return [g + along * c - back * w for g, c, w in zip(grads, direction, weights)]

  return _stateless(update)


def control_variate(point: Sequence[tf.Tensor]) -> Transform:
  """g <- g - g(point): the same batch's gradient at the trainable weights
  `point` subtracted (Mime's control variate)."""
  point = list(point)
  return _stateless(lambda grads, weights, lr, gradient_at:
                    [g - c for g, c in zip(grads, gradient_at(point))])


def mask(trainable_flags: Sequence[bool]) -> Transform:
  """Freezes the trainable weights whose flag is False: their gradient is
  set to zero. Put it last before the step: a frozen weight then stays at
  its start under `sgd`, `heavy_ball`, `nesterov` and `adam` started afresh
  (their state stays at its initial value)."""
  flags = [bool(f) for f in trainable_flags]
  return _stateless(lambda grads, *_: [g if keep else tf.zeros_like(g)
                                       for g, keep in zip(grads, flags)])


def moreau_step(personal_lr: float, lam: float, inner_steps: int,
                weight_decay: float = 0.0) -> Transform:
  """pFedMe's local step (Dinh et al., 2020; the authors' `pFedMeOptimizer`
  and `userpFedMe.train`), a step transform whose state is the personal
  model theta (starting at the start weights): on the step's batch,
  `inner_steps` times theta <- theta - personal_lr (g(theta) + lam (theta - w)
  + weight_decay theta), with g(theta) the batch's gradient at theta; then
  w <- w - lr lam (w - theta). The step's own gradient at w is not used."""
  personal_lr, lam, decay = float(personal_lr), float(lam), float(weight_decay)
  inner_steps = int(inner_steps)

  def update(grads, theta, weights, lr, gradient_at):
    del grads
    theta = list(theta)
    for _ in range(inner_steps):
      g = gradient_at(theta)
      theta = [t - personal_lr * (gt + lam * (t - w) + decay * t)
               for t, gt, w in zip(theta, g, weights)]
    return [w - lr * lam * (w - t) for w, t in zip(weights, theta)], theta

  return Transform(lambda start: [tf.identity(w) for w in start], update, is_step=True)


def apfl_step(personal, alpha, mix: str, adaptive: bool,
              alpha_decay: float = 0.02) -> Transform:
  """APFL's local step (Deng et al., 2020), a step transform whose state is
  (the personal model v, the mixing weights alpha [one per trainable weight],
  1.0 until the call's first step is taken), started from the client's
  `personal` and `alpha`. With lr the step's learning rate, g the batch's
  gradient at w:

  mix='outputs' (the authors' FedTorch code): w <- w - lr g; then on the same
  batch, with the personal prediction alpha f(v) + (1 - alpha) f(w) (w after
  its step, one alpha: alpha[0]) and its loss's gradients g_v, g_w,
  v <- v - lr g_v; with `adaptive`, at the first step only,
  alpha <- clip(alpha - lr (sum <v - w, alpha g_v + (1 - alpha) g_w>
  + alpha_decay alpha), 0, 1) (v and w after their steps).
  mix='params' (FedJAX's `apfl`): vbar = alpha v + (1 - alpha) w per weight,
  g_bar the gradient at vbar; from the values before the step:
  w <- w - lr g, v <- v - lr g_bar and, with `adaptive`, at every step
  alpha_i <- clip(alpha_i - lr <v_i - w_i, g_bar_i>, 0, 1)."""
  if mix not in ("outputs", "params"):
    raise ValueError(f"invalid APFL mix {mix!r}; valid: outputs, params")
  personal = list(personal)
  decay = float(alpha_decay)

  def init(start):
    del start
    return (list(personal), tf.convert_to_tensor(alpha, tf.float32), tf.constant(1.0))

  def update(grads, state, weights, lr, gradient_at):
    v, a, first = list(state[0]), state[1], state[2]
    new_w = [w - lr * g for w, g in zip(weights, grads)]
    if mix == "outputs":
      scalar = a[0]
      g_v, g_w = gradient_at.mixed(v, new_w, scalar)
      new_v = [x - lr * g for x, g in zip(v, g_v)]
      if adaptive:
        inner = tf.add_n([tf.reduce_sum((x - w) * (scalar * gv + (1.0 - scalar) * gw))
                          for x, w, gv, gw in zip(new_v, new_w, g_v, g_w)])
        moved = tf.clip_by_value(scalar - lr * (inner + decay * scalar), 0.0, 1.0)
        a = tf.fill(tf.shape(a), tf.where(first > 0, moved, scalar))
      return new_w, (new_v, a, tf.constant(0.0))
    mixed = [a[i] * x + (1.0 - a[i]) * w for i, (x, w) in enumerate(zip(v, weights))]
    g_bar = gradient_at(mixed)
    if adaptive:
      a = tf.clip_by_value(a - lr * tf.stack([tf.reduce_sum((x - w) * g) for x, w, g in
                                              zip(v, weights, g_bar)]), 0.0, 1.0)
    new_v = [x - lr * g for x, g in zip(v, g_bar)]
    return new_w, (new_v, a, tf.constant(0.0))

  return Transform(init, update, is_step=True)


def meta_step(variant: str, beta: float, delta: float = 1e-3) -> Transform:
  """Per-FedAvg's local meta-step (Fallah, Mokhtari, Ozdaglar, 2020; as
  FL-bench's `perfedavg` client runs it), a step transform over consecutive
  batches: with lr the step's learning rate (alpha, the inner step),

  batch D (phase 0): w~ = w - lr grad(w; D); w stays.
  batch D' (phase 1): g = grad(w~; D'); 'fo': w <- w - beta g.
  batch D'' (phase 2, 'hf' only): Hg = (grad(w + delta g; D'') -
    grad(w - delta g; D'')) / (2 delta); w <- w - beta (g - lr Hg).

  State: (phase, w~, g). Every gradient is taken at every step and the
  phase picks the one that applies (no branches in the trained graph)."""
  if variant not in ("fo", "hf"):
    raise ValueError(f"invalid Per-FedAvg variant {variant!r}; valid: fo, hf")
  beta, delta = float(beta), float(delta)
  cycle = 2.0 if variant == "fo" else 3.0

  def init(start):
    return (tf.constant(0.0), [tf.identity(w) for w in start],
            [tf.zeros_like(w) for w in start])

  def update(grads, state, weights, lr, gradient_at):
    phase, tilde, saved = state[0], list(state[1]), list(state[2])
    inner = [w - lr * g for w, g in zip(weights, grads)]
    g_tilde = gradient_at(tilde)
    if variant == "fo":
      meta = [w - beta * g for w, g in zip(weights, g_tilde)]
    else:
      plus = gradient_at([w + delta * g for w, g in zip(weights, saved)])
      minus = gradient_at([w - delta * g for w, g in zip(weights, saved)])
      meta = [w - beta * (g - lr * (p - m) / (2.0 * delta))
              for w, g, p, m in zip(weights, saved, plus, minus)]
    first, second = tf.equal(phase, 0.0), tf.equal(phase, 1.0)
    last = tf.equal(phase, cycle - 1.0)
    new_w = [tf.where(last, m, w) for m, w in zip(meta, weights)]
    new_tilde = [tf.where(first, i, t) for i, t in zip(inner, tilde)]
    new_saved = [tf.where(second, g, s) for g, s in zip(g_tilde, saved)]
    return new_w, (tf.math.floormod(phase + 1.0, cycle), new_tilde, new_saved)

  return Transform(init, update, is_step=True)


def _tuples(structure):
  """`structure` with every list made a tuple (loop carries keep one shape)."""
  if isinstance(structure, (list, tuple)):
    return tuple(_tuples(s) for s in structure)
  return structure


class Chain:
  """Transforms applied in order (see the module docstring); the last one is
  the step (`sgd()` appended when none is given)."""

  def __init__(self, transforms: Sequence[Transform]):
    flat: List[Transform] = []
    for t in transforms:
      flat.extend(t.transforms if isinstance(t, Chain) else [t])
    if not flat or not flat[-1].is_step:
      flat.append(sgd())
    if any(t.is_step for t in flat[:-1]):
      raise ValueError("a chain has one step (sgd, heavy_ball, nesterov or adam), "
                       "its last transform")
    self.transforms = tuple(flat)

  def bind(self, start) -> "Chain":
    """The chain to run from the trainable weights `start`."""
    start = list(start)
    return Chain([t.bind(start) if t.bind is not None else t for t in self.transforms])

  def init(self, start):
    start = list(start)
    return _tuples([t.init(start) for t in self.transforms])

  def canonical(self, state):
    """A given state (lists or tuples) in the form `init` and `update` return."""
    return _tuples(state)

  def update(self, grads, state, weights, lr=None, gradient_at=None):
    """(new weights, new state) after one step with `grads` (a client's
    batch gradients, or the server's pseudo-gradient) from `weights`."""
    weights, grads, new_state = list(weights), list(grads), []
    for t, s in zip(self.transforms, state):
      grads, s = t.update(grads, s, weights, lr, gradient_at)
      new_state.append(s)
    return list(grads), _tuples(new_state)

  def state_spec(self, trainable_specs: Sequence[tf.TensorSpec]):
    """`tf.TensorSpec` structure of the state."""
    zeros = [tf.zeros(s.shape, s.dtype) for s in trainable_specs]
    return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), self.init(zeros))

  def flat_state(self, state) -> List[tf.Tensor]:
    """The state as one flat list of tensors."""
    return tf.nest.flatten(state)

  def unflat_state(self, flat, trainable_specs: Sequence[tf.TensorSpec]):
    """`flat_state`'s inverse."""
    return tf.nest.pack_sequence_as(self.state_spec(trainable_specs), list(flat))

  def state_like(self, flat, weights):
    """`flat_state`'s inverse for the state of these weights (tensors or
    arrays of any shape: a server's [K, ...] stacks too)."""
    return tf.nest.pack_sequence_as(self.init(list(weights)), list(flat))

  @property
  def stateful(self) -> bool:
    """Whether the state holds any tensor."""
    return bool(tf.nest.flatten(self.init([tf.zeros([1])])))

  @property
  def uses_client_lr(self) -> bool:
    """Whether `update` reads its `lr` (the round's client learning rate, on
    the server: SlowMo's); a server chain that does not takes lr=None."""
    return any(t.reads_lr for t in self.transforms)


def chain(*transforms) -> Chain:
  """The transforms (or chains) in order, as one optimizer."""
  return Chain(transforms)


def as_chain(optimizer) -> Chain:
  """A `Chain` from a chain or a single transform."""
  return optimizer if isinstance(optimizer, Chain) else Chain([optimizer])


# ---------------------------------------------------------------------------
# Server optimizers: chains over the pseudo-gradient d = w_t - w_bar whose
# step carries the server learning rate eta_s.


def with_lr(step: Transform, lr: float) -> Transform:
  """`step` run with its own step size `lr` whatever the caller's (a
  server step: eta_s); it reads no client learning rate."""
  lr = float(lr)
  bind = None if step.bind is None else (lambda start: with_lr(step.bind(start), lr))
  return step._replace(update=lambda grads, state, weights, _, gradient_at:
                       step.update(grads, state, weights, lr, gradient_at),
                       uses_client_lr=False, bind=bind)


def server_sgd(eta: float = 1.0) -> Chain:
  """w <- w - eta d. With eta = 1 and d = w_t - w_bar this is FedAvg's
  w_bar."""
  return chain(with_lr(sgd(), eta))


def server_heavy_ball(eta: float, beta: float) -> Chain:
  """FedAvgM (Hsu et al., 2019): m <- beta m + d; w <- w - eta m (m_0 = 0);
  TFF's `build_sgdm(eta, momentum=beta)`."""
  return chain(with_lr(heavy_ball(beta), eta))


def server_nesterov(eta: float, beta: float) -> Chain:
  """FedMom (Huo et al., 2020): v_new = w - eta d; w <- v_new + beta (v_new - v);
  v <- v_new (v_0 = w_0)."""
  return chain(with_lr(nesterov(beta), eta))


def slowmo(eta: float, beta: float) -> Transform:
  """SlowMo's step (Wang et al., ICLR 2020), with lr the round's client
  learning rate gamma: u <- beta u + d / gamma; w <- w - eta gamma u
  (u_0 = 0)."""
  eta, beta = float(eta), float(beta)

  def update(grads, buffer, weights, client_lr, _):
    buffer = [beta * u + g / client_lr for u, g in zip(buffer, grads)]
    return [w - eta * client_lr * u for w, u in zip(weights, buffer)], buffer

  return Transform(lambda start: [tf.zeros_like(w) for w in start], update, is_step=True,
                   uses_client_lr=True)


def server_slowmo(eta: float, beta: float) -> Chain:
  """SlowMo: `slowmo(eta, beta)`, reading the round's client lr."""
  return chain(slowmo(eta, beta))


FEDOPT_VARIANTS = ("adam", "yogi", "adagrad")
# The two forms of FedAdam / FedYogi / FedAdagrad's server step (the paper's
# text could not be read for this project; docs/algorithms/fedadam.md):
#   authors: what the authors' experiments run (google-research/federated,
#     optimization/, commit 0b7d004f6d8afccf75dbcf9046ecc1f29bb69df6): Keras's
#     Adam and Adagrad and the authors' Keras Yogi applied to the
#     pseudo-gradient, bias-corrected (Adam, Yogi), accumulators from 0.
#   flower: Flower's FedAdam / FedYogi / FedAdagrad strategies
#     (adap/flower, src/py/flwr/server/strategy/, commit
#     914b3dab3bb5546b192493c349142f41c95ade5c): no bias correction, m and v
#     from 0, FedAdagrad without a first moment.
FEDOPT_FORMS = ("authors", "flower")


def _steps_counted_from(step: Transform, count: float) -> Transform:
  """`step` (a `tff_adam` / `tff_yogi` step, state (t, a, s)) with its step
  count t starting at `count` instead of 0."""
  def init(start):
    state = step.init(start)
    return ([tf.fill(tf.shape(w), tf.constant(float(count), tf.float32)) for w in start],
            *state[1:])

  return step._replace(init=init)


def keras_adagrad(initial_accumulator_value: float = 0.0, epsilon: float = 1e-3) -> Transform:
  """Keras's Adagrad step (`tf.keras.optimizers.Adagrad`, the optimizer
  interface of TF 2.x the authors' code builds): s <- s + g^2;
  w <- w - lr g / (sqrt(s) + epsilon), s starting at
  `initial_accumulator_value`. (TFF's `build_adagrad` differs: sqrt(s +
  epsilon); `tff_adagrad`.) State: s per weight."""
  s0, eps = float(initial_accumulator_value), float(epsilon)

  def init(start):
    return [tf.fill(tf.shape(w), tf.constant(s0, tf.float32)) for w in start]

  def update(grads, state, weights, lr, _):
    s = [p + tf.square(g) for p, g in zip(state, grads)]
    return [w - lr * g / (tf.sqrt(p) + eps) for w, g, p in zip(weights, grads, s)], s

  return Transform(init, update, is_step=True)


def authors_fedopt(variant: str, b1: float = 0.9, b2: float = 0.999,
                   epsilon: float = 1e-3) -> Transform:
  """The server step the authors' FedAdam / FedYogi / FedAdagrad
  experiments run, on the pseudo-gradient g = w_t - w_bar (= -Delta), lr the
  server learning rate eta:
    adam: Keras's Adam      a <- a + (g - a)(1 - b1);  s <- s + (g^2 - s)(1 - b2)
    yogi: the authors' Yogi a <- b1 a + (1 - b1) g;    s <- s + (1 - b2) sign(g^2 - s) g^2
          w <- w - (lr sqrt(1 - b2^t) / (1 - b1^t)) a / (sqrt(s) + epsilon)
          a, s from 0 (Yogi's initial accumulator value 0: the authors'
          setting; Adam's is fixed at 0); t = the round number + 1: the
          authors' process applies one zero update when it builds the
          server optimizer, so its first real update is Keras's step 2.
    adagrad: Keras's Adagrad (no first moment, no bias correction, b1 and b2
          unused): s <- s + g^2;  w <- w - lr g / (sqrt(s) + epsilon), s from 0.
  Adam and Yogi are `tff_adam` / `tff_yogi` (the same operations as Keras's
  and the authors' Yogi) with their count from 1; adagrad is
  `keras_adagrad(0.0, epsilon)`."""
  if variant not in FEDOPT_VARIANTS:
    raise ValueError(f"invalid FedOpt variant {variant!r}; valid: {', '.join(FEDOPT_VARIANTS)}")
  if variant == "adagrad":
    return keras_adagrad(0.0, epsilon)
  if variant == "adam":
    return _steps_counted_from(tff_adam(b1, b2, epsilon), 1.0)
  return _steps_counted_from(tff_yogi(b1, b2, epsilon, initial_preconditioner_value=0.0), 1.0)


def flower_fedopt(variant: str, b1: float, b2: float, tau: float) -> Transform:
  """Flower's FedAdam / FedYogi / FedAdagrad server step, on the
  pseudo-gradient d = -Delta (Delta: the mean client update), lr the step
  size eta:
    m <- b1 m + (1 - b1) d         (adagrad: m <- d, Flower's beta_1 = 0)
    adagrad: v <- v + d^2
    yogi:    v <- v - (1 - b2) d^2 sign(v - d^2)
    adam:    v <- b2 v + (1 - b2) d^2
    w <- w - lr m / (sqrt(v) + tau)
  m and v from 0, no bias correction (Flower's x + eta m / (sqrt(v) + tau)
  with its m = -ours). State: (m, v), one of each per weight."""
  if variant not in FEDOPT_VARIANTS:
    raise ValueError(f"invalid FedOpt variant {variant!r}; valid: {', '.join(FEDOPT_VARIANTS)}")
  b1 = 0.0 if variant == "adagrad" else float(b1)
  b2, tau = float(b2), float(tau)

  def init(start):
    return ([tf.zeros_like(w) for w in start], [tf.zeros_like(w) for w in start])

  def second(v, g):
    g2 = tf.square(g)
    if variant == "adagrad":
      return v + g2
    if variant == "yogi":
      return v - (1.0 - b2) * g2 * tf.sign(v - g2)
    return b2 * v + (1.0 - b2) * g2

  def update(grads, state, weights, lr, _):
    m = [b1 * a + (1.0 - b1) * g for a, g in zip(state[0], grads)]
    v = [second(b, g) for b, g in zip(state[1], grads)]
    new = [w - lr * a / (tf.sqrt(b) + tau) for w, a, b in zip(weights, m, v)]
    return new, (m, v)

  return Transform(init, update, is_step=True)


def fedopt(variant: str, b1: float, b2: float, tau: float, form: str = "authors") -> Transform:
  """FedAdam / FedYogi / FedAdagrad's server step in `form` (`FEDOPT_FORMS`):
  `authors_fedopt` (tau its epsilon) or `flower_fedopt`."""
  if form == "authors":
    return authors_fedopt(variant, b1, b2, tau)
  if form == "flower":
    return flower_fedopt(variant, b1, b2, tau)
  raise ValueError(f"invalid FedOpt form {form!r}; valid: {', '.join(FEDOPT_FORMS)}")


def server_fedopt(variant: str, eta: float, b1: float = 0.9, b2: float = 0.999,
                  tau: float = 1e-3, form: str = "authors") -> Chain:
  """FedAdam / FedYogi / FedAdagrad's server optimizer: `fedopt` at step
  size eta (`b1`, `b2` unused by adagrad)."""
  return chain(with_lr(fedopt(variant, b1, b2, tau, form), eta))


# -- TFF's optimizers, their exact rules ---------------------------------------


def tff_adam(beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7) -> Transform:
  """`tff.learning.optimizers.build_adam`'s step, operation for operation
  (lr the learning rate, t the step count):
    a <- a + (g - a)(1 - beta_1);  s <- s + (g^2 - s)(1 - beta_2)
    w <- w - (lr sqrt(1 - beta_2^t) / (1 - beta_1^t)) a / (sqrt(s) + epsilon).
  State (t, a, s), t one count per weight element (so a [K, ...] stack of
  cluster models counts each cluster's steps)."""
  b1, b2, eps = float(beta_1), float(beta_2), float(epsilon)

  def init(start):
    return tuple([tf.zeros_like(w) for w in start] for _ in range(3))

  def update(grads, state, weights, lr, _):
    t = [c + 1.0 for c in state[0]]
    a = [x + (g - x) * (1.0 - b1) for x, g in zip(state[1], grads)]
    s = [x + (tf.square(g) - x) * (1.0 - b2) for x, g in zip(state[2], grads)]
    new = [w - lr * tf.sqrt(1.0 - tf.pow(b2, c)) / (1.0 - tf.pow(b1, c)) * x
           / (tf.sqrt(p) + eps) for w, c, x, p in zip(weights, t, a, s)]
    return new, (t, a, s)

  return Transform(init, update, is_step=True)


def tff_yogi(beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-3,
             initial_preconditioner_value: float = 1e-6) -> Transform:
  """`tff.learning.optimizers.build_yogi`'s step (bias-corrected as its Adam):
    a <- a + (g - a)(1 - beta_1);  s <- s + (1 - beta_2) sign(g^2 - s) g^2
    w <- w - (lr sqrt(1 - beta_2^t) / (1 - beta_1^t)) a / (sqrt(s) + epsilon),
  s starting at `initial_preconditioner_value`. State (t, a, s) as
  `tff_adam`'s."""
  b1, b2, eps = float(beta_1), float(beta_2), float(epsilon)
  s0 = float(initial_preconditioner_value)

  def init(start):
    return ([tf.zeros_like(w) for w in start], [tf.zeros_like(w) for w in start],
            [tf.fill(tf.shape(w), tf.constant(s0, tf.float32)) for w in start])

  def update(grads, state, weights, lr, _):
    t = [c + 1.0 for c in state[0]]
    a = [x + (g - x) * (1.0 - b1) for x, g in zip(state[1], grads)]
    s = [p + (1.0 - b2) * tf.sign(tf.square(g) - p) * tf.square(g)
         for p, g in zip(state[2], grads)]
    new = [w - lr * tf.sqrt(1.0 - tf.pow(b2, c)) / (1.0 - tf.pow(b1, c)) * x
           / (tf.sqrt(p) + eps) for w, c, x, p in zip(weights, t, a, s)]
    return new, (t, a, s)

  return Transform(init, update, is_step=True)


def tff_adagrad(initial_preconditioner_value: float = 0.1,
                epsilon: float = 1e-7) -> Transform:
  """`tff.learning.optimizers.build_adagrad`'s step: s <- s + g^2;
  w <- w - lr g / sqrt(s + epsilon), s starting at
  `initial_preconditioner_value`. State: s per weight."""
  s0, eps = float(initial_preconditioner_value), float(epsilon)

  def init(start):
    return [tf.fill(tf.shape(w), tf.constant(s0, tf.float32)) for w in start]

  def update(grads, state, weights, lr, _):
    s = [p + tf.square(g) for p, g in zip(state, grads)]
    return [w - lr * g / tf.sqrt(p + eps) for w, g, p in zip(weights, grads, s)], s

  return Transform(init, update, is_step=True)


TFF_OPTIMIZERS = "tff.learning.optimizers.build_sgdm, build_adam, build_yogi or build_adagrad"


def from_tff(optimizer) -> Chain:
  """A `tff.learning.optimizers` optimizer (`build_sgdm`, `build_adam`,
  `build_yogi`, `build_adagrad`) as this module's chain with the same rule
  and numbers (its hyper-parameters read by `get_hparams`, the initial
  preconditioner from its initial state), its learning rate the step's own
  (`with_lr`); a chain is returned as it is. Anything else is refused in
  one line naming what to pass."""
  if isinstance(optimizer, Chain):
    return optimizer
  kind = type(optimizer).__name__
  if (not type(optimizer).__module__.startswith("tensorflow_federated")
      or kind not in ("_SGD", "_Adam", "_Yogi", "_Adagrad")):
    raise ValueError(f"unsupported optimizer {optimizer!r}; valid: {TFF_OPTIMIZERS}, "
                     "or a tff_cluster.learning.optimizers chain")
  state = optimizer.initialize((tf.TensorSpec([1], tf.float32),))
  h = {k: float(np.asarray(v)) for k, v in optimizer.get_hparams(state).items()}
  lr = h["learning_rate"]
  if kind == "_SGD":
    return chain(with_lr(heavy_ball(h.get("momentum", 0.0)), lr))
  if kind == "_Adam":
    return chain(with_lr(tff_adam(h["beta_1"], h["beta_2"], h["epsilon"]), lr))
  initial = float(np.asarray(tf.nest.flatten(state["preconditioner"])[0]).reshape(-1)[0])
  if kind == "_Yogi":
    return chain(with_lr(tff_yogi(h["beta_1"], h["beta_2"], h["epsilon"], initial), lr))
  return chain(with_lr(tff_adagrad(initial, h["epsilon"]), lr))
