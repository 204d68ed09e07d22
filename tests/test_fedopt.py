"""FedAdam, FedYogi, FedAdagrad (Reddi et al., ICLR 2021) in both forms
(`--server_opt_form`: the authors' code's and Flower's): the server update by
hand over two rounds, the authors' form against Keras's own optimizers, per
cluster for IFCA and WeCFL, an old checkpoint's server optimizer state
resumed, and TFF's optimizers run as the library's (marked `tff`)."""

import collections
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from tff_cluster import registry, tasks
from tff_cluster.algorithms.fedavg import fedavg
from tff_cluster.algorithms.fedavg.fedavg import FedAvgDefinition, SERVER_OPT_STATE
from tff_cluster.algorithms.ifca import ifca
from tff_cluster.host import loop
from tff_cluster.host.driver import TrainingConfig
from tff_cluster.io import checkpoint
from tff_cluster.learning import optimizers
from tff_cluster.spec.task import DataOptions

ETA, B1, B2, TAU = 0.5, 0.8, 0.9, 0.1
W0 = np.array([1.0, -1.0])
# The clients' weighted mean updates Delta_t = w_bar - w_t of two rounds. With
# v from 0, round 1 gives v_1 = (1 - B2) Delta_1^2 = [0.004, 0.00025]; Delta_2^2
# = [0.09, 0.0001] passes it in one coordinate and not in the other, so
# Yogi's sign takes both values in round 2.
DELTAS = (np.array([0.2, 0.05]), np.array([-0.3, 0.01]))
FORMS = ("authors", "flower")
VARIANTS = [("fedadam", "adam"), ("fedyogi", "yogi"), ("fedadagrad", "adagrad")]


def authors_rule(variant, deltas, x=W0, eta=ETA, b1=B1, b2=B2, eps=TAU):
  """The authors' form as docs/algorithms/fedadam.md writes it, in numpy
  (float64), on g = -Delta_t, from a = s = 0:
    adam: a = b1 a + (1 - b1) g;  s = b2 s + (1 - b2) g^2
    yogi: a = b1 a + (1 - b1) g;  s = s + (1 - b2) sign(g^2 - s) g^2
          x = x - eta sqrt(1 - b2^t) / (1 - b1^t) a / (sqrt(s) + eps), t = round + 1
    adagrad: s = s + g^2;  x = x - eta g / (sqrt(s) + eps)."""
  a, s, out = np.zeros_like(x), np.zeros_like(x), []
  for r, delta in enumerate(deltas, start=1):
    g = -delta
    if variant == "adagrad":
      s = s + g ** 2
      x = x - eta * g / (np.sqrt(s) + eps)
    else:
      t = r + 1
      a = b1 * a + (1 - b1) * g
      if variant == "yogi":
        s = s + (1 - b2) * np.sign(g ** 2 - s) * g ** 2
      else:
        s = b2 * s + (1 - b2) * g ** 2
      x = x - eta * np.sqrt(1 - b2 ** t) / (1 - b1 ** t) * a / (np.sqrt(s) + eps)
    out.append(x)
  return out


def flower_rule(variant, deltas, x=W0, eta=ETA, b1=B1, b2=B2, tau=TAU):
  """Flower's form as docs/algorithms/fedadam.md writes it, in numpy
  (float64), from m = v = 0: m = b1 m + (1 - b1) Delta (adagrad: m = Delta);
  v per variant; x = x + eta m / (sqrt(v) + tau)."""
  m, v, out = np.zeros_like(x), np.zeros_like(x), []
  for delta in deltas:
    m = delta if variant == "adagrad" else b1 * m + (1 - b1) * delta
    if variant == "adagrad":
      v = v + delta ** 2
    elif variant == "yogi":
      v = v - (1 - b2) * delta ** 2 * np.sign(v - delta ** 2)
    else:
      v = b2 * v + (1 - b2) * delta ** 2
    x = x + eta * m / (np.sqrt(v) + tau)
    out.append(x)
  return out


RULES = {"authors": authors_rule, "flower": flower_rule}


def _options(algo, **values):
  spec = registry.get_algorithm(algo)
  names = {h.name for h in spec.hparams}
  given = dict(server_lr=ETA, server_tau=TAU, **values)
  if "server_beta1" in names and values.get("server_optimizer", spec.fixed.get(
      "server_optimizer")) != "adagrad":
    given["server_beta1"] = B1
  if "server_beta2" in names:
    given["server_beta2"] = B2
  return spec.options(**given)


def _fedavg_rounds(options, deltas=DELTAS, weight=4.0):
  d = FedAvgDefinition([tf.TensorSpec([2], tf.float32)], 1, mu=0.0, weighting="processed",
                       server_optimizer=fedavg.server_optimizer(options))
  state = tf.nest.map_structure(lambda a: tf.constant(a, tf.float32),
                                d.initial_state([W0.astype(np.float32)]))
  first, got = state[SERVER_OPT_STATE], []
  for delta in deltas:  # clients of total weight `weight`
    summed = collections.OrderedDict(update=[tf.constant(weight * delta, tf.float32)],
                                     weight=tf.constant(weight), loss_sum=tf.constant(0.0))
    state = d.server_update(state, summed, "train")
    got.append(state["model"][0].numpy())
  return first, got


def test_yogis_sign_takes_both_values_in_round_2():
  for v1 in ((1 - B2) * DELTAS[0] ** 2,):  # both forms' v after round 1
    assert sorted(np.sign(v1 - DELTAS[1] ** 2)) == [-1.0, 1.0]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("algo,variant", VARIANTS)
def test_two_rounds_are_the_forms_rule_by_hand(algo, variant, form):
  assert registry.get_algorithm(algo).fixed == {"server_optimizer": variant}
  first, got = _fedavg_rounds(_options(algo, server_opt_form=form))
  # The state starts at zero but for the authors' Adam/Yogi step count (1).
  if form == "authors" and variant != "adagrad":
    np.testing.assert_array_equal(first[0], [1.0, 1.0])
    first = first[1:]
  for x in first:
    np.testing.assert_array_equal(x, [0.0, 0.0])
  want = RULES[form](variant, DELTAS)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-5)
  # The variants and the forms differ on these numbers (Adam and Yogi by
  # about 5e-4, relative), and from the plain mean; FedAdagrad's two forms
  # are one rule (m = Delta, v from 0, the same tau).
  others = [RULES[f](o, DELTAS)[1] for f in FORMS for o in ("adam", "yogi", "adagrad")
            if o != variant or (f != form and variant != "adagrad")]
  assert all(not np.allclose(want[1], o, rtol=1e-4) for o in others)
  if variant == "adagrad":
    np.testing.assert_allclose(authors_rule("adagrad", DELTAS)[1],
                               flower_rule("adagrad", DELTAS)[1], rtol=1e-12)
  assert not np.allclose(got[1], W0 + DELTAS[0] + DELTAS[1], rtol=1e-3)


def test_the_authors_form_is_the_default_and_its_defaults_are_the_authors_code():
  for algo, variant in VARIANTS:
    options = registry.get_algorithm(algo).options()
    assert options.server_opt_form == "authors"
    assert options.server_tau == {"adagrad": 1e-2}.get(variant, 1e-4)
    assert options.server_lr == {"adagrad": 0.1}.get(variant, 10 ** -2.5)
    if variant != "adagrad":
      assert (options.server_beta1, options.server_beta2) == (0.9, 0.999)
  shared = registry.get_algorithm("fedavg").options(server_optimizer="adam")
  assert (shared.server_opt_form, shared.server_beta1, shared.server_beta2,
          shared.server_tau) == ("authors", 0.9, 0.999, 1e-3)


def _keras_legacy():
  """TF 2.x's Keras optimizers (`OptimizerV2`, the interface the authors'
  code builds; Keras 3's Adagrad is another rule), where installed."""
  try:
    legacy = tf.keras.optimizers.legacy
    legacy.Adam(0.1)
  except (AttributeError, ImportError):
    pytest.skip("no TF 2.x Keras (OptimizerV2) optimizers here (the TFF stack has them)")
  return legacy


@pytest.mark.parametrize("variant", ["adam", "adagrad"])
def test_the_authors_form_is_keras_after_the_authors_zero_update(variant):
  """The authors' process builds the server optimizer with one zero update
  (its step count then 1) and applies -Delta as the gradient each round:
  Keras's Adam (Adagrad with initial accumulator 0) run that way gives the
  authors' form's numbers."""
  legacy = _keras_legacy()
  var = tf.Variable(W0.astype(np.float32))
  if variant == "adam":
    opt = legacy.Adam(ETA, beta_1=B1, beta_2=B2, epsilon=TAU)
  else:
    opt = legacy.Adagrad(ETA, initial_accumulator_value=0.0, epsilon=TAU)
  opt.apply_gradients([(tf.zeros(2), var)])
  np.testing.assert_array_equal(var.numpy(), W0.astype(np.float32))
  want = []
  for delta in DELTAS:
    opt.apply_gradients([(tf.constant(-delta, tf.float32), var)])
    want.append(var.numpy().copy())
  _, got = _fedavg_rounds(_options({"adam": "fedadam", "adagrad": "fedadagrad"}[variant]))
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-5)


def test_fedadagrad_has_no_beta1_and_the_shared_option_refuses_one():
  assert "server_beta1" not in {h.name for h in registry.get_algorithm("fedadagrad").hparams}
  options = _options("fedavg", server_optimizer="adagrad", server_beta1=0.5)
  with pytest.raises(ValueError, match="--server_beta1=0.5 with --server_optimizer=adagrad; "
                                       "valid: 0.9"):
    fedavg.server_optimizer(options)
  with pytest.raises(ValueError, match="invalid FedOpt form 'paper'; valid: authors, flower"):
    optimizers.fedopt("adam", B1, B2, TAU, "paper")


@pytest.mark.parametrize("form", FORMS)
def test_fedavg_server_optimizer_option_is_the_same_rule(form):
  """`fedavg --server_optimizer=yogi` builds FedYogi's step in either form;
  its default is sgd at 1.0, the weighted mean."""
  _, got = _fedavg_rounds(_options("fedavg", server_optimizer="yogi", server_opt_form=form),
                          weight=1.0)
  np.testing.assert_allclose(got[1], RULES[form]("yogi", DELTAS)[1], rtol=1e-5)
  plain = fedavg.server_optimizer(registry.get_algorithm("fedavg").options())
  assert not plain.stateful and not plain.uses_client_lr


@pytest.mark.parametrize("form", FORMS)
def test_ifca_keeps_one_optimizer_state_per_cluster(form):
  """FedAdam per cluster: two clusters with different updates, each moved by
  its own state; a cluster no client chose (round 2, cluster 1) keeps its
  model and its state."""
  options = _options("ifca", server_optimizer="adam", num_groups=2, server_opt_form=form)
  d = ifca.IFCADefinition([tf.TensorSpec([2], tf.float32)], 1, 2, aggregation="uniform",
                          loss_batches=0, server_optimizer=ifca.server_optimizer(options))
  starts = [W0, np.array([0.5, 2.0])]
  state = d.initial_state([[s.astype(np.float32)] for s in starts])
  n_state = {"authors": 3, "flower": 2}[form]  # (t, a, s) or (m, v)
  assert [x.shape for x in state[SERVER_OPT_STATE]] == [(2, 2)] * n_state
  cluster_deltas = [DELTAS, (np.array([0.1, -0.4]),)]
  rounds = [(DELTAS[0], cluster_deltas[1][0], 1.0), (DELTAS[1], np.zeros(2), 0.0)]
  for d0, d1, weight1 in rounds:  # one client in cluster 0; cluster 1 has one or none
    summed = collections.OrderedDict(
        update_sums=[tf.constant(np.stack([d0, d1 * weight1]), tf.float32)],
        weight_sums=tf.constant([1.0, weight1]))
    state = d.server_update(state, summed, "train")
    if weight1:
      after_round_1 = [np.asarray(x)[1].copy() for x in state[SERVER_OPT_STATE]]
  want0 = RULES[form]("adam", DELTAS, x=starts[0])[1]
  want1 = RULES[form]("adam", cluster_deltas[1], x=starts[1])[0]
  np.testing.assert_allclose(np.asarray(state["models"][0])[0], want0, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(state["models"][0])[1], want1, rtol=1e-5)
  for kept, now in zip(after_round_1, state[SERVER_OPT_STATE]):
    np.testing.assert_array_equal(np.asarray(now)[1], kept)
  # Cluster 1's first moment after its one round: (1 - b1) times -its update.
  m = after_round_1[{"authors": 1, "flower": 0}[form]]
  np.testing.assert_allclose(m, -(1 - B1) * cluster_deltas[1][0], rtol=1e-6)


@pytest.mark.parametrize("form", FORMS)
def test_cluster_models_m_step_takes_each_clusters_optimizer(form):
  """WeCFL's M-step with FedAdagrad per cluster: Omega_k moved by its own
  step on Omega_k - (the members' mean); a cluster without members keeps its
  model and state."""
  from tff_cluster.algorithms.wecfl import wecfl
  options = _options("wecfl", server_optimizer="adagrad", num_groups=2, server_opt_form=form)
  d = wecfl.ClusterModelsDefinition([tf.TensorSpec([2], tf.float32)], 1, 2, mu=0.0,
                                    server_optimizer=fedavg.per_cluster_server_optimizer(options))
  state = d.initial_state([[W0.astype(np.float32)], [W0.astype(np.float32)]])
  for delta in DELTAS:  # two members of cluster 0 (weights 1 and 3) at mean W + delta
    w = np.asarray(state["models"][0])[0]
    summed = collections.OrderedDict(
        model_sums=[tf.constant(np.stack([4.0 * (w + delta), np.zeros(2)]), tf.float32)],
        weight_sums=tf.constant([4.0, 0.0]))
    state = d.server_update(state, summed, "aggregate")
  np.testing.assert_allclose(np.asarray(state["models"][0])[0],
                             RULES[form]("adagrad", DELTAS)[1], rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(state["models"][0])[1], W0.astype(np.float32))
  for x in state[SERVER_OPT_STATE]:
    np.testing.assert_array_equal(np.asarray(x)[1], np.zeros(2, np.float32))


def test_slowmo_is_refused_per_cluster_and_momentum_with_fedopt_in_hypcluster():
  with pytest.raises(ValueError, match="client lr"):
    ifca.IFCADefinition([tf.TensorSpec([2], tf.float32)], 1, 2, aggregation="uniform",
                        loss_batches=0, server_optimizer=optimizers.server_slowmo(1.0, 0.5))
  from tff_cluster.algorithms.hypcluster import hypcluster
  options = registry.get_algorithm("hypcluster").options(
      server_optimizer="adam", hypcluster_server_momentum=0.5)
  with pytest.raises(ValueError, match="hypcluster_server_momentum=0.5 with "
                                       "--server_optimizer=adam; valid: 0"):
    hypcluster.server_optimizer(options)


# -- an old checkpoint (server optimizer state under `buffer`) resumes -------------


def _config(rounds):
  return TrainingConfig(rounds=rounds, clients_per_round=4, local_epochs=1,
                        batch_size=10, client_lr=0.05, seed=2)  # the default runner: local


def _train(task, data, rounds, run_dir, resume=None):
  driver = registry.build_driver("fedavgm", task, data, _config(rounds), server_lr=0.8,
                                 server_momentum=0.5)
  loop.run_training(task, data, _config(rounds), driver, None, progress=False,
                    checkpoint_dir=str(run_dir), checkpoint_every=2, resume=resume)
  return driver.runner.numpy_state(driver.state)


def test_a_checkpoint_with_the_old_buffer_key_resumes(tmp_path):
  task = tasks.get_task("synthetic")
  data = task.load_data(DataOptions(seed=3, num_clients=10))
  whole = _train(task, data, 4, tmp_path / "whole")
  assert list(whole) == ["model", SERVER_OPT_STATE]
  split = tmp_path / "split"
  shutil.copytree(tmp_path / "whole", split)
  os.remove(checkpoint.path_of(str(split), 4))
  shutil.rmtree(checkpoint.clients_dir(str(split), 4), ignore_errors=True)
  # Round 2's checkpoint as written before the rename: the key `buffer`.
  path = checkpoint.path_of(str(split), 2)
  payload = checkpoint.loads(path)
  state = payload["driver"]["state"]
  payload["driver"]["state"] = type(state)(
      ("buffer" if k == SERVER_OPT_STATE else k, v) for k, v in state.items())
  checkpoint.atomic_write_bytes(path, checkpoint.dumps(payload))
  assert "buffer" in checkpoint.loads(path)["driver"]["state"]
  round_num, resume = checkpoint.load_latest(str(split))
  assert round_num == 2 and list(resume["driver"]["state"]) == ["model", SERVER_OPT_STATE]
  resumed = _train(task, data, 4, split, resume=resume)
  for a, b in zip(whole["model"] + whole[SERVER_OPT_STATE],
                  resumed["model"] + resumed[SERVER_OPT_STATE]):
    np.testing.assert_array_equal(a, b)


# -- TFF's optimizers ------------------------------------------------------------


def test_other_values_are_refused_in_one_line():
  with pytest.raises(ValueError, match="valid: tff.learning.optimizers.build_sgdm, "
                                       "build_adam, build_yogi or build_adagrad"):
    optimizers.from_tff(tf.keras.optimizers.SGD(0.1))


TFF_BUILDS = [("build_adam", dict(learning_rate=0.01)),
              ("build_adam", dict(learning_rate=0.05, beta_1=0.5, beta_2=0.9, epsilon=1e-3)),
              ("build_yogi", dict(learning_rate=0.02, beta_1=0.7, beta_2=0.95, epsilon=1e-3,
                                  initial_preconditioner_value=0.01)),
              ("build_adagrad", dict(learning_rate=0.1, initial_preconditioner_value=0.05,
                                     epsilon=1e-6)),
              ("build_sgdm", dict(learning_rate=0.3, momentum=0.9)),
              ("build_sgdm", dict(learning_rate=0.3))]


@pytest.mark.tff
@pytest.mark.parametrize("build,kwargs", TFF_BUILDS)
def test_a_tff_optimizer_steps_as_its_own_next(build, kwargs):
  """Three steps of `optimizers.from_tff(opt)` equal TFF's `opt.next` on the
  same weights and gradients (a [2, 3] stack and a vector)."""
  import tensorflow_federated as tff
  opt = getattr(tff.learning.optimizers, build)(**kwargs)
  ours = optimizers.from_tff(opt)
  assert not ours.uses_client_lr
  rng = np.random.default_rng(0)
  weights = [rng.normal(size=(2, 3)).astype(np.float32), rng.normal(size=3).astype(np.float32)]
  theirs_w = tuple(tf.constant(w) for w in weights)
  theirs_state = opt.initialize(tuple(tf.TensorSpec(w.shape, tf.float32) for w in weights))
  our_w, our_state = [tf.constant(w) for w in weights], ours.init(weights)
  for _ in range(3):
    grads = [tf.constant(rng.normal(size=w.shape).astype(np.float32)) for w in weights]
    theirs_state, theirs_w = opt.next(theirs_state, theirs_w, tuple(grads))
    our_w, our_state = ours.update(grads, our_state, our_w, None)
    for a, b in zip(our_w, theirs_w):
      np.testing.assert_allclose(a.numpy(), np.asarray(b), rtol=2e-6, atol=1e-7)
  moved = [np.abs(a.numpy() - w).max() for a, w in zip(our_w, weights)]
  assert min(moved) > 1e-4


@pytest.mark.tff
def test_build_fedavg_takes_tff_client_and_server_optimizers():
  """`build_fedavg` with TFF's SGDM as the client optimizer equals the same
  process with `client_momentum` (its buffer fresh every round), and a
  library chain as server optimizer is refused in one line."""
  import tensorflow_federated as tff
  from tff_cluster import models
  from tff_cluster.learning import schedule
  data = tasks.get_task("synthetic_clusters").load_data(
      DataOptions(seed=1, num_clients=4, extra={"num_clusters": 2}))
  datasets = [schedule.client_dataset(*data.train[c], 10, 1, 0) for c in data.client_ids]
  spec = datasets[0].element_spec

  def model_fn():
    return models.mclr(60, 10)

  tf.keras.utils.set_random_seed(0)
  w0 = models.get_weights(model_fn())
  finals = []
  for kw in (dict(client_lr=0.1, client_momentum=0.5),
             dict(client_lr=0.7, client_optimizer=tff.learning.optimizers.build_sgdm(
                 learning_rate=0.1, momentum=0.5))):
    process = fedavg.build_fedavg(model_fn, models.SPARSE_CE_LOGITS, spec, w0,
                                  server_optimizer=tff.learning.optimizers.build_adam(0.01),
                                  **kw)
    state = process.next(process.initialize(), datasets).state
    finals.append(process.get_model_weights(state).trainable)
  for a, b in zip(*finals):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  with pytest.raises(ValueError, match="valid: tff.learning.optimizers.build_sgdm"):
    fedavg.build_fedavg(model_fn, models.SPARSE_CE_LOGITS, spec, w0,
                        server_optimizer=optimizers.server_sgd(1.0))


@pytest.mark.tff
def test_build_learning_process_takes_a_tff_server_optimizer_for_ifca():
  """IFCA's LearningProcess with TFF's Adam as each cluster's server
  optimizer: the state holds its (t, a, s) per cluster and a round moves the
  chosen clusters; a value of another kind is refused in one line."""
  import tensorflow_federated as tff
  from tff_cluster import models
  from tff_cluster.learning import schedule
  from tff_cluster.tff_program import build_learning_process
  data = tasks.get_task("synthetic_clusters").load_data(
      DataOptions(seed=1, num_clients=6, extra={"num_clusters": 2}))

  def model_fn():
    return models.mclr(60, 10)

  starts = []
  for seed in (1, 2):
    tf.keras.utils.set_random_seed(seed)
    starts.append(models.get_weights(model_fn()))
  datasets = [schedule.client_dataset(*data.train[c], 10, 1, 0) for c in data.client_ids[:4]]
  process = build_learning_process(
      "ifca", model_fn, models.SPARSE_CE_LOGITS, datasets[0].element_spec, starts, 0.1,
      {"num_groups": 2}, server_optimizer=tff.learning.optimizers.build_adam(learning_rate=0.01))
  state = process.initialize()
  assert [np.shape(x) for x in state[SERVER_OPT_STATE]][:2] == [(2, 60, 10), (2, 10)]
  assert len(state[SERVER_OPT_STATE]) == 6  # (t, a, s) for the kernel and the bias
  out = process.next(state, datasets)
  moved = np.abs(np.asarray(out.state["models"][0]) - np.stack([s[0] for s in starts]))
  assert moved.max() > 0 and moved.max() <= 0.01 * 1.01  # Adam's first step: at most lr
  with pytest.raises(ValueError, match="valid: tff.learning.optimizers.build_sgdm"):
    build_learning_process("ifca", model_fn, models.SPARSE_CE_LOGITS,
                           datasets[0].element_spec, starts, 0.1, {"num_groups": 2},
                           server_optimizer=tf.keras.optimizers.Adam(0.01))
