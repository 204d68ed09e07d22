"""FedAvg / FedProx processes against TFF's FedAvg and in-process local SGD."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.tff
tff = pytest.importorskip("tensorflow_federated", reason="needs the TFF stack")

import tensorflow as tf  # noqa: E402

from tests import references  # noqa: E402
from tff_cluster import models  # noqa: E402
from tff_cluster.learning import schedule  # noqa: E402
from tff_cluster.algorithms.fedavg.fedavg import build_fedavg  # noqa: E402
from tff_cluster.data.synthetic import NUM_CLASSES, NUM_FEATURES, generate_synthetic  # noqa: E402

BATCH = 10
EPOCHS = 2
# The Synthetic task's default. Much larger rates make local SGD unstable on
# some clients (lr x largest eigenvalue of E[x x^T] > 2), and a chaotic
# trajectory amplifies float32 rounding beyond any tolerance.
LR = 0.01


def _model():
  return models.mclr(NUM_FEATURES, NUM_CLASSES)


@pytest.fixture(scope="module")
def setup():
  data = generate_synthetic(num_clients=8, seed=0)
  sizes = data.num_train_samples()
  assert len(set(sizes.tolist())) == len(sizes)  # unequal client sizes
  rng = np.random.default_rng(1)
  init = [rng.normal(scale=0.1, size=w.shape).astype(np.float32)
          for w in models.get_weights(_model())]
  element_spec = _dataset(data, 0, 0).element_spec
  return data, init, element_spec


def _dataset(data, k, seed, epochs=EPOCHS):
  x, y = data.train[data.client_ids[k]]
  return schedule.client_dataset(x, y, BATCH, epochs, seed)


def _round_datasets(data, round_num, clients):
  # Fresh datasets each call: a shuffled dataset replays the same batches
  # only when rebuilt from its seed.
  return [_dataset(data, k, schedule.client_seed(0, round_num, k)) for k in clients]


def _flat(model_weights):
  return [np.asarray(w) for w in list(model_weights.trainable)
          + list(model_weights.non_trainable)]


def _in_process_round(data, weights, round_num, clients, mu):
  """Each client's local SGD run here (no TFF), as (deltas, examples, loss_sums)."""
  local_sgd = references.build_local_sgd(_model(), models.SPARSE_CE_LOGITS)
  deltas, examples, losses = [], [], []
  for k, ds in zip(clients, _round_datasets(data, round_num, clients)):
    out = local_sgd(weights, ds, LR, mu)
    deltas.append([d.numpy() for d in out["delta"]])
    examples.append(float(out["num_examples"]))
    losses.append(float(out["loss_sum"]))
  return deltas, np.array(examples), np.array(losses)


def _weighted_mean(deltas, weights):
  weights = np.asarray(weights, np.float64)
  return [sum(w * d[i] for w, d in zip(weights, deltas)) / weights.sum()
          for i in range(len(deltas[0]))]


def _schedule():
  rng = np.random.default_rng(4)
  return [np.sort(rng.choice(8, 5, replace=False)) for _ in range(3)]


def test_matches_tff_weighted_fed_avg(setup):
  data, init, element_spec = setup
  ours = build_fedavg(_model, models.SPARSE_CE_LOGITS, element_spec, init, LR)

  x_spec = tf.TensorSpec([None, NUM_FEATURES], tf.float32)
  y_spec = tf.TensorSpec([None], tf.int32)

  def tff_model_fn():
    return tff.learning.models.from_keras_model(
        _model(), loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=(x_spec, y_spec))

  reference = tff.learning.algorithms.build_weighted_fed_avg(
      tff_model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=LR),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=1.0))
  ref_state = reference.initialize()
  ref_state = reference.set_model_weights(
      ref_state, tff.learning.models.ModelWeights(trainable=list(init), non_trainable=[]))
  state = ours.initialize()
  for a, b in zip(_flat(ours.get_model_weights(state)),
                  _flat(reference.get_model_weights(ref_state))):
    np.testing.assert_array_equal(a, b)

  for round_num, clients in enumerate(_schedule(), start=1):
    state = ours.next(state, _round_datasets(data, round_num, clients)).state
    tuples = [ds.map(lambda e: (e["x"], e["y"]))
              for ds in _round_datasets(data, round_num, clients)]
    ref_state = reference.next(ref_state, tuples).state

  got = _flat(ours.get_model_weights(state))
  want = _flat(reference.get_model_weights(ref_state))
  for g, w, w0 in zip(got, want, init):
    np.testing.assert_allclose(g, w, atol=1e-5)
    assert np.abs(g - w0).max() > 1e-2  # training moved the model


def test_one_round_is_example_weighted_mean_of_local_models(setup):
  data, init, element_spec = setup
  process = build_fedavg(_model, models.SPARSE_CE_LOGITS, element_spec, init, LR)
  clients = [0, 2, 4, 6, 7]  # 108, 221, 61, 711, 370 training samples
  output = process.next(process.initialize(), _round_datasets(data, 1, clients))
  got = _flat(process.get_model_weights(output.state))

  deltas, examples, losses = _in_process_round(data, init, 1, clients, mu=0.0)
  np.testing.assert_array_equal(
      examples, EPOCHS * data.num_train_samples()[clients].astype(float))
  expected = [w + d for w, d in zip(init, _weighted_mean(deltas, examples))]
  unweighted = [w + d for w, d in zip(init, _weighted_mean(deltas, np.ones(5)))]
  for g, e, u in zip(got, expected, unweighted):
    np.testing.assert_allclose(g, e, atol=1e-5)
    assert np.abs(e - u).max() > 1e-3  # weighting by examples is visible

  work = output.metrics["client_work"]["train"]  # tff.learning's layout
  assert float(work["num_examples"]) == examples.sum()
  np.testing.assert_allclose(float(work["loss_sum"]), losses.sum(), rtol=1e-5)
  np.testing.assert_allclose(float(work["loss"]), losses.sum() / examples.sum(), rtol=1e-5)


def test_fedprox_is_weighted_mean_of_proximal_sgd_with_less_drift(setup):
  data, init, element_spec = setup
  clients = [1, 3, 5, 6]
  mu = 1.0
  prox = build_fedavg(_model, models.SPARSE_CE_LOGITS, element_spec, init, LR, mu=mu)
  plain = build_fedavg(_model, models.SPARSE_CE_LOGITS, element_spec, init, LR, mu=0.0)
  got = {}
  for name, process in (("prox", prox), ("plain", plain)):
    output = process.next(process.initialize(), _round_datasets(data, 1, clients))
    got[name] = _flat(process.get_model_weights(output.state))

  prox_deltas, examples, _ = _in_process_round(data, init, 1, clients, mu=mu)
  plain_deltas, _, _ = _in_process_round(data, init, 1, clients, mu=0.0)
  for name, deltas in (("prox", prox_deltas), ("plain", plain_deltas)):
    expected = [w + d for w, d in zip(init, _weighted_mean(deltas, examples))]
    for g, e in zip(got[name], expected):
      np.testing.assert_allclose(g, e, atol=1e-5)

  def norm(ws):
    return float(np.sqrt(sum(np.sum(np.square(w)) for w in ws)))

  # Every client drifts less from w_t with the proximal term (equal norms
  # would mean mu is ignored)...
  for dp, d0 in zip(prox_deltas, plain_deltas):
    assert norm(dp) < norm(d0)
  # ...and so does the global model.
  step_prox = norm([g - w for g, w in zip(got["prox"], init)])
  step_plain = norm([g - w for g, w in zip(got["plain"], init)])
  assert step_prox < step_plain


def test_rejects_bad_hyper_parameters(setup):
  _, init, element_spec = setup
  with pytest.raises(ValueError, match="client_lr"):
    build_fedavg(_model, models.SPARSE_CE_LOGITS, element_spec, init, 0.0)
  with pytest.raises(ValueError, match="mu"):
    build_fedavg(_model, models.SPARSE_CE_LOGITS, element_spec, init, LR, mu=-0.1)
