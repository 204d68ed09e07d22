"""Client and server optimizers as values: small TF `init`/`update` transforms
on lists of weights, composed as optax's are.

Client side. A `Transform` maps the batch's gradients (one tensor per
trainable weight) to new gradients (a gradient transform) or to the new
weights (a step, the last transform of a chain). `chain(*transforms)` runs
them in order, ending with `sgd()` when no step is given:

  opt = chain(control_variate(x), scale(s), proximal(mu), offset(o), heavy_ball(b))
  state = opt.init(start)                           tuple, one entry per transform
  new_w, state = opt.update(w, grads, state, lr, gradient_at)

`gradient_at(point)` is the trainer's (`GradientAt`): the same batch's
gradient at other trainable weights (Mime's control variate asks for it), and
`gradient_at.mixed(point, other, alpha)` the gradients at two points of the
batch's loss of their mixed outputs (APFL's personal prediction). `opt.bind(start)` is
called by the trainer once per `train` call, before `init`: a transform whose
value depends on the start (the proximal term's default anchor) takes it
there. Every transform is elementwise per weight, and the order in a chain is
the order of the floating-point operations: the chain above computes, per
weight, g <- g - g(x); g <- s g; g <- g + mu (w - anchor); g <- g + o; then
the step (`v <- b v + g; w <- w - lr v`).

A chain's state is a tuple with one entry per transform (`()` for the
stateless ones). `flat_state`/`unflat_state` give it as one flat list of
tensors, which is how a client's persisted optimizer state is stored
(`Definition`'s client state key `velocity`: for heavy-ball momentum, its
buffer per trainable weight).

Per-example weights enter in the trainer's batch loss, not here: the mean
loss over a batch already weighs each row by its 1.0/0.0 mask
(`local_training.sgd_step`), and a per-example weight multiplies that mask.
A variable mask is the `mask(trainable_flags)` gradient transform.

Server side. A `ServerOptimizer` applies a (pseudo-)gradient to the server's
trainable weights: `update(weights, grads, state, client_lr) -> (weights,
state)`, its state a list of one tensor per trainable weight (or empty).
`client_lr` is the round's mean client learning rate (SlowMo's gamma_t).
"""

from __future__ import annotations

from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf


# ---------------------------------------------------------------------------
# Client transforms


class Transform(NamedTuple):
  """One client transform.

  init: trainable start weights -> state.
  update: (grads, state, weights, lr, gradient_at) -> (grads, state), or for
    a step (`is_step`) -> (new weights, state).
  bind: trainable start weights -> the transform to use from that start
    (None: the transform itself).
  """
  init: Callable[[List[tf.Tensor]], Any]
  update: Callable[..., Tuple[List[tf.Tensor], Any]]
  is_step: bool = False
  bind: Optional[Callable[[List[tf.Tensor]], "Transform"]] = None


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

  def update(self, weights, grads, state, lr, gradient_at=None):
    """(new weights, new state) after one step with the batch's `grads`."""
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

  @property
  def stateful(self) -> bool:
    """Whether the state holds any tensor."""
    return bool(tf.nest.flatten(self.init([tf.zeros([1])])))


def chain(*transforms) -> Chain:
  """The transforms (or chains) in order, as one optimizer."""
  return Chain(transforms)


def as_chain(optimizer) -> Chain:
  """A `Chain` from a chain or a single transform."""
  return optimizer if isinstance(optimizer, Chain) else Chain([optimizer])


# ---------------------------------------------------------------------------
# Server optimizers


class ServerOptimizer(NamedTuple):
  """init: trainable weights (numpy) -> state (a list, empty when stateless);
  update: (weights, grads, state, client_lr) -> (new weights, new state);
  uses_client_lr: whether `update` reads `client_lr` (else it may be None)."""
  init: Callable[[Sequence[np.ndarray]], List[np.ndarray]]
  update: Callable[..., Tuple[List[tf.Tensor], List[tf.Tensor]]]
  uses_client_lr: bool = False


def _zeros(weights):
  return [np.zeros_like(np.asarray(w)) for w in weights]


def server_sgd(eta: float = 1.0) -> ServerOptimizer:
  """w <- w - eta d. With eta = 1 and d = w_t - w_bar this is FedAvg's
  w_bar."""
  eta = float(eta)
  return ServerOptimizer(lambda weights: [],
                         lambda weights, grads, state, client_lr:
                         ([w - eta * g for w, g in zip(weights, grads)], []))


def server_heavy_ball(eta: float, beta: float) -> ServerOptimizer:
  """FedAvgM (Hsu et al., 2019): m <- beta m + d; w <- w - eta m (m_0 = 0);
  TFF's `build_sgdm(eta, momentum=beta)`."""
  eta, beta = float(eta), float(beta)

  def update(weights, grads, state, client_lr):
    buffer = [beta * m + g for m, g in zip(state, grads)]
    return [w - eta * m for w, m in zip(weights, buffer)], buffer

  return ServerOptimizer(_zeros, update)


def server_nesterov(eta: float, beta: float) -> ServerOptimizer:
  """FedMom (Huo et al., 2020): v_new = w - eta d; w <- v_new + beta (v_new - v);
  v <- v_new (v_0 = w_0)."""
  eta, beta = float(eta), float(beta)

  def update(weights, grads, state, client_lr):
    v_new = [w - eta * g for w, g in zip(weights, grads)]
    return [v + beta * (v - v_old) for v, v_old in zip(v_new, state)], v_new

  return ServerOptimizer(lambda weights: [np.array(w, copy=True) for w in weights], update)


def server_slowmo(eta: float, beta: float) -> ServerOptimizer:
  """SlowMo (Wang et al., ICLR 2020): u <- beta u + d / gamma;
  w <- w - eta gamma u (u_0 = 0), gamma the round's client learning rate."""
  eta, beta = float(eta), float(beta)

  def update(weights, grads, state, client_lr):
    buffer = [beta * u + g / client_lr for u, g in zip(state, grads)]
    return [w - eta * client_lr * u for w, u in zip(weights, buffer)], buffer

  return ServerOptimizer(_zeros, update, uses_client_lr=True)
