"""The personalized methods' rules: FedPer, FedRep, LG-FedAvg, FedBN, Ditto and
local-only, and the parts they are written on (the split by layer, personal
client state, each client tested with its own model).

Each rule is checked on one full-batch SGD step per client (`--local_steps=1`,
a batch larger than any client's data) against a reference written here from
the rule with a GradientTape. Runner parity and resume are
`tests/test_runners.py`'s and `tests/test_reliability.py`'s, from each
algorithm's PARITY_CASES entry."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf

from tff_cluster import models, registry
from tff_cluster.core import personal as parts
from tff_cluster.data.federated import FederatedData
from tff_cluster.host import loop
from tff_cluster.host.driver import TrainingConfig
from tff_cluster.learning.evaluation import Evaluator
from tff_cluster.spec.task import TaskSpec

LR = 0.5


def _mlp():
  return models.mlp(5, 4, 3)


def _bn_mlp():
  inputs = tf.keras.Input((5,))
  h = tf.keras.layers.Dense(4, name="d0")(inputs)
  h = tf.keras.layers.BatchNormalization(name="bn")(h)
  h = tf.keras.layers.ReLU()(h)
  return tf.keras.Model(inputs, tf.keras.layers.Dense(3, name="out")(h), name="bn_mlp")


def _task(model_fn):
  rng = np.random.default_rng(7)
  ids = ["a", "b", "c"]
  sizes = {"a": 4, "b": 6, "c": 5}
  train = {c: (rng.normal(size=(n, 5)).astype(np.float32),
               rng.integers(0, 3, n).astype(np.int32)) for c, n in sizes.items()}
  test = {c: (rng.normal(size=(3, 5)).astype(np.float32),
              rng.integers(0, 3, 3).astype(np.int32)) for c in ids}
  data = FederatedData(ids, train, test, 3, description="tiny")
  return TaskSpec(name="tiny", description="", load_data=lambda o: data, model_fn=model_fn,
                  loss=models.SPARSE_CE_LOGITS, defaults={}), data


def _run(algo, model_fn=_mlp, rounds=1, sampled=2, **options):
  """`algo` for `rounds` rounds of one full-batch step on 2 of the 3 clients."""
  task, data = _task(model_fn)
  config = TrainingConfig(rounds=rounds, clients_per_round=sampled, local_epochs=None,
                          local_steps=1, batch_size=64, client_lr=LR, seed=3)
  driver = registry.build_driver(algo, task, data, config, **options)
  w0 = [np.array(w) for w in driver.w0]
  sampled_clients = []
  original = driver.run_round

  def record(round_num, clients):
    sampled_clients.append(list(clients))
    return original(round_num, clients)
  driver.run_round = record
  loop.run_training(task, data, config, driver, progress=False)
  return driver, data, w0, sampled_clients


def _step(model_fn, weights, x, y, frozen=(), pull=None, lam=0.0):
  """One full-batch SGD step of the model at `weights` on (x, y): the
  trainable weights whose index is in `frozen` stay; `pull` adds lam (w -
  pull) to the gradient. BatchNorm statistics move as Keras' training call
  moves them."""
  model = model_fn()
  models.set_weights(model, weights)
  with tf.GradientTape() as tape:
    logits = model(x, training=True)
    loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
        y, logits, from_logits=True))
  grads = tape.gradient(loss, model.trainable_variables)
  n = len(model.trainable_variables)
  after = [np.array(w) for w in models.get_weights(model)]  # moving statistics updated
  out = [np.array(w, np.float64) for w in weights]
  for i in range(n):
    if i in frozen:
      continue
    g = grads[i].numpy().astype(np.float64)
    if pull is not None:
      g = g + lam * (out[i] - pull[i])
    out[i] = out[i] - LR * g
  out[n:] = after[n:]
  return [o.astype(np.float32) for o in out]


def _close(a, b):
  for x, y in zip(a, b):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- #
# The split by layer.


def test_the_head_is_the_last_layers_or_the_named_ones():
  model = _mlp()  # dense (5x4, 4), dense_1 (4x3, 3): weights k0, b0, k1, b1
  assert parts.head_indices(model, 1) == [2, 3]
  names = [name for name, _ in parts.weight_layers(model)]
  assert parts.head_indices(model, 0, head_names=names[0]) == [0, 1]
  bn = _bn_mlp()  # trainable d0 k, b, bn gamma, beta, out k, b; then moving mean, variance
  assert [n for n, _ in parts.weight_layers(bn)] == ["d0", "bn", "out"]
  assert parts.head_indices(bn, 2) == [2, 3, 4, 5, 6, 7]
  assert parts.batchnorm_indices(bn) == [2, 3, 6, 7]
  w = list(range(8))
  assert parts.merge([0, 1, 4, 5], [2, 3, 6, 7], [2, 3, 6, 7]) == w


@pytest.mark.parametrize("kw, message", [
    (dict(head_layers=1), r"--algo=fedper splits the model into a body and a head, but model "
                          r"'mclr' has 1 layer\(s\) with weights: logits \(60x10, 10\); valid"),
    (dict(head_layers=2), r"invalid --head_layers=2: model 'mlp\w*' has 2 layer"),
    (dict(head_layers=1, head_names="nope"), r"invalid --head_names=nope: .*valid: "
                                             r"comma-separated names"),
])
def test_a_split_that_does_not_fit_is_refused_naming_the_layers(kw, message):
  model = models.mclr(60, 10) if "mclr" in message else _mlp()
  with pytest.raises(ValueError, match=message):
    parts.head_indices(model, kw["head_layers"], kw.get("head_names", ""), "fedper")
  with pytest.raises(ValueError, match="has none"):
    parts.batchnorm_indices(_mlp(), "fedbn")


# --------------------------------------------------------------------------- #
# The rules, one round by hand.


def _client_arrays(data, k):
  return data.train[data.client_ids[k]]


@pytest.mark.parametrize("algo", ["fedper", "lg_fedavg"])
def test_fedper_and_lg_fedavg_average_one_part_and_keep_the_other(algo):
  driver, data, w0, sampled = _run(algo)
  clients = sampled[0]
  head = [2, 3]
  personal = head if algo == "fedper" else [0, 1]
  shared = [i for i in range(4) if i not in personal]
  stepped = {k: _step(_mlp, w0, *_client_arrays(data, k)) for k in clients}
  n = {k: len(_client_arrays(data, k)[1]) for k in clients}  # examples processed
  glob = driver.global_model()
  for i in shared:  # the weighted mean of the clients' shared weights
    want = sum(n[k] * stepped[k][i] for k in clients) / sum(n.values())
    np.testing.assert_allclose(glob[i], want, rtol=1e-5, atol=1e-6)
  for i in personal:  # the server never moves a personal weight
    np.testing.assert_array_equal(glob[i], w0[i])
  weights, index = driver.eval_models()
  for k in range(3):
    model = weights[index[k]]
    for i in shared:
      np.testing.assert_array_equal(model[i], glob[i])
    for i in personal:  # its own, or the initial one if never sampled
      np.testing.assert_allclose(model[i], stepped[k][i] if k in clients else w0[i],
                                 rtol=1e-5, atol=1e-6)
  row_bytes = driver.training_row({"loss_sum": 0.0, "num_examples": 1.0}, 2,
                                  models_down=driver.shared_fraction())["bytes_down"]
  assert row_bytes == 2 * 4 * (4 * 3 + 3 if algo == "lg_fedavg" else 5 * 4 + 4)


def test_fedrep_trains_the_head_then_the_body():
  driver, data, w0, sampled = _run("fedrep", fedrep_head_epochs=1)
  clients = sampled[0]
  glob = driver.global_model()
  n = {k: len(_client_arrays(data, k)[1]) for k in clients}
  after = {}
  for k in clients:
    x, y = _client_arrays(data, k)
    # Head phase: one epoch = one full batch here, body frozen ...
    w = _step(_mlp, w0, x, y, frozen=(0, 1))
    np.testing.assert_array_equal(w[0], w0[0])
    # ... then the body's step at the new head, head frozen.
    after[k] = _step(_mlp, w, x, y, frozen=(2, 3))
  for i in (0, 1):
    want = sum(n[k] * after[k][i] for k in clients) / sum(n.values())
    np.testing.assert_allclose(glob[i], want, rtol=1e-5, atol=1e-6)
  weights, index = driver.eval_models()
  for k in clients:
    _close(weights[index[k]][2:], after[k][2:])


def test_ditto_pulls_the_personal_model_toward_the_rounds_global_model():
  lam = 0.7
  driver, data, w0, sampled = _run("ditto", rounds=2, ditto_lambda=lam)
  # Round 1 from w0; round 2 from the mean after round 1.
  v = {k: w0 for k in range(3)}
  w = w0
  for clients in sampled:
    n = {k: len(_client_arrays(data, k)[1]) for k in clients}
    trained = {k: _step(_mlp, w, *_client_arrays(data, k)) for k in clients}
    for k in clients:
      v[k] = _step(_mlp, v[k], *_client_arrays(data, k), pull=w, lam=lam)
    w = [sum(n[k] * trained[k][i] for k in clients) / sum(n.values()) for i in range(4)]
  _close(driver.global_model(), w)
  weights, index = driver.eval_models()
  seen = set(sampled[0]) | set(sampled[1])
  for k in range(3):
    _close(weights[index[k]], v[k] if k in seen else w0)


def test_each_kept_client_state_owns_its_memory():
  """A client's state is copied out of its round's stacked arrays: a view
  would keep the whole round's states alive while any one of them is kept
  (FedSoft's 2,400 client models on rotated_mnist grew past 22 GB)."""
  driver, *_ = _run("ditto", rounds=2)
  leaves = [a for k in driver.client_states
            for a in tf.nest.flatten(driver.client_states[k])]
  assert leaves and all(isinstance(a, np.ndarray) and a.base is None for a in leaves)


def test_ditto_without_pull_is_local_only_and_unseen_clients_can_take_the_global_model():
  ditto, _, _, sampled = _run("ditto", ditto_lambda=0.0, ditto_unseen="global")
  local, _, w0, sampled_local = _run("local_only")
  assert sampled == sampled_local
  a, ia = ditto.eval_models()
  b, ib = local.eval_models()
  unseen = [k for k in range(3) if k not in sampled[0]]
  for k in sampled[0]:
    _close(a[ia[k]], b[ib[k]])
  for k in unseen:
    _close(a[ia[k]], ditto.global_model())
    _close(b[ib[k]], w0)
  # local-only sends nothing and its server model never moves.
  _close(local.global_model(), w0)
  assert local.shared_fraction() == 0.0


def test_fedbn_keeps_every_batchnorm_weight_on_its_client():
  driver, data, w0, sampled = _run("fedbn", model_fn=_bn_mlp)
  clients = sampled[0]
  bn = [2, 3, 6, 7]
  stepped = {k: _step(_bn_mlp, w0, *_client_arrays(data, k)) for k in clients}
  n = {k: len(_client_arrays(data, k)[1]) for k in clients}
  glob = driver.global_model()
  for i in range(8):
    if i in bn:
      np.testing.assert_array_equal(glob[i], w0[i])
    else:
      want = sum(n[k] * stepped[k][i] for k in clients) / sum(n.values())
      np.testing.assert_allclose(glob[i], want, rtol=1e-5, atol=1e-6)
  weights, index = driver.eval_models()
  for k in clients:  # its own scale, offset and moving statistics
    for i in bn:
      np.testing.assert_allclose(weights[index[k]][i], stepped[k][i], rtol=1e-5, atol=1e-6)
  a, b = clients
  assert not np.allclose(weights[index[a]][6], weights[index[b]][6])


def test_a_split_method_on_a_one_layer_model_is_refused_by_the_cli(tmp_path, capsys):
  """(The CLI in this process: its exit code, stderr and files are what a
  process of its own gives; tests/test_cli.py runs it as one.)"""
  from tests.helpers import assert_one_line_error, main_in_process
  code, _, err = main_in_process(["--algo=fedper", "--task=synthetic", "--rounds=1",
                                  f"--output_dir={tmp_path / 'r'}", "--progress=false"], capsys)
  assert_one_line_error(code, err, tmp_path / "r", "splits the model into a body and a head",
                        "mclr")


@pytest.mark.parametrize("kw", [dict(ft_epochs=2), dict(ft_epochs=2, ft_mu=0.8),
                                dict(ft_epochs=1, ft_layers="head")])
def test_fedavg_ft_tests_each_client_with_its_fine_tuned_copy(kw):
  driver, data, w0, sampled = _run("fedavg_ft", **kw)
  clients = sampled[0]
  n = {k: len(_client_arrays(data, k)[1]) for k in clients}
  stepped = {k: _step(_mlp, w0, *_client_arrays(data, k)) for k in clients}
  w = [sum(n[k] * stepped[k][i] for k in clients) / sum(n.values()) for i in range(4)]
  _close(driver.global_model() if hasattr(driver, "global_model") else driver.model_weights(), w)
  weights, index = driver.eval_models()
  frozen = (0, 1) if kw.get("ft_layers") == "head" else ()
  for k in range(3):  # every client with training data, sampled or not
    v = w
    for _ in range(kw["ft_epochs"]):  # one full batch an epoch, pulled toward w
      v = _step(_mlp, v, *_client_arrays(data, k), frozen=frozen, pull=w,
                lam=kw.get("ft_mu", 0.0))
    _close(weights[index[k]], v)
  # The global model is not changed by the fine-tuning, and a round without
  # evaluation tests with it.
  _close(driver.model_weights(), w)
  models_, idx = driver.round_models()
  assert len(models_) == 1 and not idx.any()


def _grad(model_fn, weights, x, y):
  model = model_fn()
  models.set_weights(model, weights)
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
        y, model(x, training=True), from_logits=True))
  return [g.numpy().astype(np.float64) for g in tape.gradient(loss, model.trainable_variables)]


@pytest.mark.parametrize("train", ["all", "sampled"])
def test_pfedme_by_hand(train):
  lam, plr, k, beta, mu = 2.0, 0.3, 2, 1.5, 0.01
  driver, data, w0, sampled = _run("pfedme", pfedme_lambda=lam, pfedme_personal_lr=plr,
                                   pfedme_k=k, pfedme_beta=beta, pfedme_weight_decay=mu,
                                   pfedme_train=train)
  clients = sampled[0]
  trained = range(3) if train == "all" else clients
  theta, local = {}, {}
  w = [np.asarray(a, np.float64) for a in w0]
  for c in trained:
    x, y = _client_arrays(data, c)
    t = list(w)
    for _ in range(k):  # the inner steps on the one batch, anchored at w_i = w
      g = _grad(_mlp, [a.astype(np.float32) for a in t], x, y)
      t = [a - plr * (gi + lam * (a - b) + mu * a) for a, gi, b in zip(t, g, w)]
    theta[c] = t
    local[c] = [b - LR * lam * (b - a) for b, a in zip(w, t)]
  n = {c: len(_client_arrays(data, c)[1]) for c in clients}
  mean = [sum(n[c] * local[c][i] for c in clients) / sum(n.values()) for i in range(4)]
  _close(driver.global_model(), [(1 - beta) * a + beta * m for a, m in zip(w, mean)])
  weights, index = driver.eval_models()
  for c in range(3):
    _close(weights[index[c]], theta[c] if c in trained else driver.global_model())
  _assert_refuses_client_momentum("pfedme")


def _assert_refuses_client_momentum(algo):
  """`algo`'s local steps are its own: the registry refuses --client_momentum
  with the reason its spec gives."""
  task, data = _task(_mlp)
  config = TrainingConfig(rounds=1, clients_per_round=2, local_epochs=None,
                          local_steps=1, batch_size=64, client_lr=LR, client_momentum=0.9)
  reason = registry.get_algorithm(algo).own_momentum
  assert reason
  with pytest.raises(ValueError, match=rf"invalid --client_momentum for {algo}: "
                                       rf"{re.escape(reason)}; valid: --client_momentum=0"):
    registry.build_driver(algo, task, data, config)


def _mixed_grads(v, w, alpha, x, y):
  """Gradients at v and at w of the mean cross-entropy of alpha v(x) +
  (1 - alpha) w(x), from two models."""
  mv, mw = _mlp(), _mlp()
  models.set_weights(mv, [a.astype(np.float32) for a in v])
  models.set_weights(mw, [a.astype(np.float32) for a in w])
  with tf.GradientTape(persistent=True) as tape:
    z = alpha * mv(x, training=True) + (1.0 - alpha) * mw(x, training=True)
    loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(y, z,
                                                                          from_logits=True))
  return ([g.numpy().astype(np.float64) for g in tape.gradient(loss, mv.trainable_variables)],
          [g.numpy().astype(np.float64) for g in tape.gradient(loss, mw.trainable_variables)])


def _apfl_step(mix, w, v, alpha, x, y):
  """One APFL step of the rule (adaptive, the round's first step) from the
  client's w, v, alpha [4]: (w, v, alpha) after it."""
  g = _grad(_mlp, [a.astype(np.float32) for a in w], x, y)
  if mix == "outputs":
    w1 = [a - LR * gi for a, gi in zip(w, g)]
    a = float(alpha[0])
    g_v, g_w = _mixed_grads(v, w1, a, x, y)
    v1 = [b - LR * gi for b, gi in zip(v, g_v)]
    inner = sum(float(np.sum((p - q) * (a * gv + (1 - a) * gw)))
                for p, q, gv, gw in zip(v1, w1, g_v, g_w))
    return w1, v1, np.full(4, np.clip(a - LR * (inner + 0.02 * a), 0.0, 1.0))
  mixed = [alpha[i] * v[i] + (1 - alpha[i]) * w[i] for i in range(4)]
  g_bar = _grad(_mlp, [a.astype(np.float32) for a in mixed], x, y)
  new_alpha = np.clip([alpha[i] - LR * np.sum((v[i] - w[i]) * g_bar[i]) for i in range(4)],
                      0.0, 1.0)
  return ([a - LR * gi for a, gi in zip(w, g)], [b - LR * gi for b, gi in zip(v, g_bar)],
          new_alpha)


@pytest.mark.parametrize("mix", ["outputs", "params"])
def test_apfl_by_hand(mix):
  """Two rounds, one full-batch step each, adaptive alpha from 0.4: the
  global model (uniform mean), each client's v and alpha, and the mixture
  each client is tested with."""
  driver, data, w0, sampled = _run("apfl", rounds=2, apfl_mix=mix, apfl_adaptive=True,
                                   apfl_alpha=0.4)
  w = [np.asarray(a, np.float64) for a in w0]
  v = {k: list(w) for k in range(3)}
  alpha = {k: np.full(4, 0.4) for k in range(3)}
  for clients in sampled:
    trained = {}
    for k in clients:
      trained[k], v[k], alpha[k] = _apfl_step(mix, w, v[k], alpha[k], *_client_arrays(data, k))
    w = [sum(trained[k][i] for k in clients) / len(clients) for i in range(4)]
  _close(driver.global_model(), w)
  seen = set(sampled[0]) | set(sampled[1])
  for k in seen:
    state = driver.client_states[k]
    _close(state["personal"], v[k])
    np.testing.assert_allclose(state["alpha"], alpha[k], rtol=1e-4, atol=1e-6)
  weights, client_model = driver.eval_models()
  if mix == "params":
    for k in range(3):
      expected = ([alpha[k][i] * v[k][i] + (1 - alpha[k][i]) * w[i] for i in range(4)]
                  if k in seen else w)
      _close(weights[client_model[k]], expected)
  else:
    # Each client's test prediction: its alpha mixes its v's logits with w's.
    result = Evaluator(_mlp, models.SPARSE_CE_LOGITS, data).evaluate(weights, client_model)
    for k in range(3):
      x, y = data.test[data.client_ids[k]]
      mv, mw = _mlp(), _mlp()
      models.set_weights(mw, [a.astype(np.float32) for a in w])
      z = mw(x).numpy()
      if k in seen:
        models.set_weights(mv, [a.astype(np.float32) for a in v[k]])
        z = alpha[k][0] * mv(x).numpy() + (1 - alpha[k][0]) * z
      assert result.per_client_correct[k] == np.sum(np.argmax(z, axis=1) == y)
      # Saved as: its own v_k, or the global model (0) for a client never trained.
      assert result.client_model[k] == (client_model.personal[k] if k in seen else 0)
  final = driver.summary()["final_alpha"]
  assert set(final) == {data.client_ids[k] for k in seen}
  for k in seen:
    np.testing.assert_allclose(final[data.client_ids[k]], alpha[k], rtol=1e-4, atol=1e-6)


def test_apfl_refuses_momentum_and_keeps_alpha_without_adaptation():
  driver, *_ = _run("apfl", rounds=2, apfl_alpha=0.3)
  assert all(np.all(np.asarray(s["alpha"]) == np.float32(0.3))
             for s in driver.client_states.values())
  _assert_refuses_client_momentum("apfl")


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_perfedavg_meta_step_by_hand(variant):
  """On l_b(w) = |w - c_b|^2 / 2 (gradient w - c_b on batch b), one
  meta-step over consecutive batches: w~ = w - a (w - c0); fo: w - b (w~ - c1);
  hf: g = w~ - c1, Hg = g (the Hessian is I), w - b (g - a g)."""
  from tff_cluster.learning import optimizers
  a, b = 0.3, 0.2
  c = [np.array([1.0, -2.0], np.float32), np.array([0.5, 3.0], np.float32),
       np.array([-1.0, 0.25], np.float32)]
  w = [np.array([2.0, 1.0], np.float32)]
  opt = optimizers.chain(optimizers.meta_step(variant, b, delta=0.01)).bind(w)
  state = opt.init(w)
  cur = [tf.constant(w[0])]
  steps = 2 if variant == "fo" else 3
  for t in range(steps):
    at = optimizers.GradientAt(lambda p, t=t: [p[0] - c[t]])
    cur, state = opt.update([cur[0] - c[t]], state, cur, a, at)
    if t < steps - 1:
      np.testing.assert_array_equal(cur[0], w[0])  # w moves at the meta-step only
  tilde = w[0] - a * (w[0] - c[0])
  g = tilde - c[1]
  expected = w[0] - b * g if variant == "fo" else w[0] - b * (g - a * g)
  np.testing.assert_allclose(cur[0], expected, rtol=1e-5, atol=1e-6)


def test_perfedavg_by_hand():
  """Full-batch steps (D = D' = the client's data), first order: w~ = w - a
  grad(w), w_k = w - b grad(w~), the plain mean; each client tested after one
  step of size a from the global model on its training data."""
  b = 0.7
  task, data = _task(_mlp)
  config = TrainingConfig(rounds=1, clients_per_round=2, local_epochs=None,
                          local_steps=2, batch_size=64, client_lr=LR, seed=3)
  driver = registry.build_driver("perfedavg", task, data, config,
                                                           perfedavg_beta=b)
  w0 = [np.array(w, np.float64) for w in driver.w0]
  sampled = []
  original = driver.run_round
  driver.run_round = lambda r, clients: (sampled.append(list(clients)), original(r, clients))[1]
  loop.run_training(task, data, config, driver, progress=False)
  trained = []
  for k in sampled[0]:
    x, y = _client_arrays(data, k)
    tilde = [w - LR * g for w, g in zip(w0, _grad(_mlp, [a.astype(np.float32) for a in w0], x, y))]
    g = _grad(_mlp, [a.astype(np.float32) for a in tilde], x, y)
    trained.append([w - b * gi for w, gi in zip(w0, g)])
  w = [sum(t[i] for t in trained) / len(trained) for i in range(4)]
  _close(driver.model_weights(), w)
  weights, index = driver.eval_models()
  for k in range(3):
    x, y = _client_arrays(data, k)
    g = _grad(_mlp, [a.astype(np.float32) for a in w], x, y)
    _close(weights[index[k]], [a - LR * gi for a, gi in zip(w, g)])
