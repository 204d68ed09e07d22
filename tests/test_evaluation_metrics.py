"""Client-averaged accuracy and macro-F1 (evaluation.Evaluator), hand-computed."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import tensorflow as tf

from tff_cluster import tasks
from tff_cluster import models, registry
from tff_cluster.learning import evaluation
from tff_cluster.host import loop
from tff_cluster.host.driver import TrainingConfig

from tff_cluster.data.federated import FederatedData
from tff_cluster.learning.evaluation import CHOOSE_BY_TEST_LOSS, Evaluator
from tff_cluster.io.results import ResultsWriter, summarize
from tff_cluster.spec.task import DataOptions

NUM_CLASSES = 4


def _identity_model():
  # Logits = x @ W with W = I: the predicted class is argmax(x), so a one-hot
  # input of class p predicts p.
  inputs = tf.keras.Input((NUM_CLASSES,))
  outputs = tf.keras.layers.Dense(NUM_CLASSES, use_bias=False)(inputs)
  return tf.keras.Model(inputs, outputs)


def _client(y_true, y_pred, n_train):
  x_test = np.eye(NUM_CLASSES, dtype=np.float32)[np.asarray(y_pred, np.int64)]
  x_test = x_test.reshape(-1, NUM_CLASSES)
  y_test = np.asarray(y_true, np.int32)
  x_train = np.zeros((n_train, NUM_CLASSES), np.float32)
  y_train = np.zeros(n_train, np.int32)
  return (x_train, y_train), (x_test, y_test)


# Client a: classes {0,1}; F1_0 = 2*1/(2+1) = 2/3, F1_1 = 2*2/(2+3) = 4/5,
#   macro = 11/15, acc = 3/4.
# Client b: class 3 predicted but absent: F1_2 = 2*2/(3+2) = 4/5, F1_3 = 0,
#   macro = 2/5, acc = 2/3.
# Client c: class 1 present, never predicted: F1_0 = 2*1/(1+3) = 1/2, F1_1 = 0,
#   F1_3 = 2*2/(3+2) = 4/5, macro = 13/30, acc = 3/5.
# Train sizes 10, 30, 60 -> w = 0.1, 0.3, 0.6.
CLIENTS = {
    "a": ([0, 0, 1, 1], [0, 1, 1, 1], 10),
    "b": ([2, 2, 2], [2, 3, 2], 30),
    "c": ([0, 1, 3, 3, 3], [0, 0, 0, 3, 3], 60),
}
MACRO_F1 = [11 / 15, 2 / 5, 13 / 30]
ACCURACY = [3 / 4, 2 / 3, 3 / 5]
EXPECTED_F1 = 0.1 * 11 / 15 + 0.3 * 2 / 5 + 0.6 * 13 / 30  # = 34/75
EXPECTED_ACC = 0.1 * 3 / 4 + 0.3 * 2 / 3 + 0.6 * 3 / 5  # = 0.635


def _data(clients):
  ids = list(clients)
  made = {c: _client(*clients[c]) for c in ids}
  return FederatedData(ids, {c: made[c][0] for c in ids}, {c: made[c][1] for c in ids},
                       num_classes=NUM_CLASSES)


IDENTITY = [np.eye(NUM_CLASSES, dtype=np.float32)]


def test_hand_computed_three_clients():
  assert EXPECTED_F1 == pytest.approx(34 / 75)
  data = _data(CLIENTS)
  evaluator = Evaluator(_identity_model, models.SPARSE_CE_LOGITS, data, batch_size=4)
  result = evaluator.evaluate([IDENTITY], np.zeros(3, np.int64))
  np.testing.assert_allclose(result.per_client_f1, MACRO_F1, rtol=1e-12)
  np.testing.assert_allclose(result.client_weight, [0.1, 0.3, 0.6], rtol=1e-12)
  assert result.macro_f1 == pytest.approx(EXPECTED_F1, rel=1e-12)
  assert result.accuracy_clientavg == pytest.approx(EXPECTED_ACC, rel=1e-12)
  assert result.accuracy == pytest.approx(8 / 12, rel=1e-12)  # pooled, unchanged


def test_matches_sklearn_macro_f1_over_the_union():
  from sklearn.metrics import f1_score
  for (y_true, y_pred, _), f1 in zip(CLIENTS.values(), MACRO_F1):
    union = sorted(set(y_true) | set(y_pred))
    assert f1_score(y_true, y_pred, average="macro", labels=union) == pytest.approx(f1)
  y_true = np.concatenate([v[0] for v in CLIENTS.values()])
  y_pred = np.concatenate([v[1] for v in CLIENTS.values()])
  np.testing.assert_allclose(
      evaluation.per_client_macro_f1(y_true, y_pred, [4, 3, 5]), MACRO_F1, rtol=1e-12)


def test_clients_on_different_models_and_chosen_by_loss():
  # Model 1 maps every one-hot input to class 0 (W[:, 0] = 1): all wrong except
  # true class-0 examples, and a higher loss than the identity everywhere it
  # matters, so choosing by test loss picks the identity for every client.
  zero = np.zeros((NUM_CLASSES, NUM_CLASSES), np.float32)
  zero[:, 0] = 1.0
  data = _data(CLIENTS)
  evaluator = Evaluator(_identity_model, models.SPARSE_CE_LOGITS, data)
  mixed = evaluator.evaluate([IDENTITY, [zero]], np.array([0, 1, 0]))
  # Client b on model 1: predicts 0 for true 2,2,2 -> F1_0 = 0, F1_2 = 0.
  np.testing.assert_allclose(mixed.per_client_f1, [11 / 15, 0.0, 13 / 30], rtol=1e-12)
  assert mixed.macro_f1 == pytest.approx(0.1 * 11 / 15 + 0.6 * 13 / 30, rel=1e-12)
  assert mixed.accuracy_clientavg == pytest.approx(0.1 * 3 / 4 + 0.6 * 3 / 5, rel=1e-12)
  chosen = evaluator.evaluate([[zero], IDENTITY], CHOOSE_BY_TEST_LOSS)
  np.testing.assert_array_equal(chosen.client_model, [1, 1, 1])
  assert chosen.macro_f1 == pytest.approx(EXPECTED_F1, rel=1e-12)
  assert chosen.accuracy_clientavg == pytest.approx(EXPECTED_ACC, rel=1e-12)


def test_client_without_test_data_is_left_out():
  # A client with 100 training samples but no test data: no accuracy or F1 of
  # its own, so the weights are renormalised over a, b, c (unchanged).
  clients = dict(CLIENTS, d=([], [], 100))
  data = _data(clients)
  result = Evaluator(_identity_model, models.SPARSE_CE_LOGITS, data).evaluate(
      [IDENTITY], np.zeros(4, np.int64))
  np.testing.assert_allclose(result.client_weight, [0.1, 0.3, 0.6, 0.0], rtol=1e-12)
  assert result.macro_f1 == pytest.approx(EXPECTED_F1, rel=1e-12)
  assert result.accuracy_clientavg == pytest.approx(EXPECTED_ACC, rel=1e-12)
  assert evaluation.client_weights([0, 0], [2, 6]).tolist() == [0.25, 0.75]


def _sigmoid_model():
  inputs = tf.keras.Input((1,))
  outputs = tf.keras.layers.Dense(1, activation="sigmoid")(inputs)
  return tf.keras.Model(inputs, outputs)


def test_binary_threshold_at_one_half():
  # p = sigmoid(x); x = 0 gives p = 0.5, which predicts class 1.
  # Client a: y = [1,0,0,1], x = [2,0,-3,1] -> pred [1,1,0,1]:
  #   F1_0 = 2*1/(2+1) = 2/3, F1_1 = 2*2/(2+3) = 4/5, macro 11/15, acc 3/4.
  # Client b: y = [0,0], x = [-1,5] -> pred [0,1]: F1_0 = 2/3, F1_1 = 0 (absent
  #   class predicted), macro 1/3, acc 1/2. Train sizes 3, 1 -> w = 3/4, 1/4.
  def client(y, x, n_train):
    return ((np.zeros((n_train, 1), np.float32), np.zeros(n_train, np.float32)),
            (np.asarray(x, np.float32).reshape(-1, 1), np.asarray(y, np.float32)))
  made = {"a": client([1, 0, 0, 1], [2, 0, -3, 1], 3), "b": client([0, 0], [-1, 5], 1)}
  data = FederatedData(["a", "b"], {c: v[0] for c, v in made.items()},
                       {c: v[1] for c, v in made.items()}, num_classes=2)
  weights = [np.ones((1, 1), np.float32), np.zeros(1, np.float32)]
  result = Evaluator(_sigmoid_model, models.BINARY_PROBS, data).evaluate(
      [weights], np.zeros(2, np.int64))
  np.testing.assert_allclose(result.per_client_f1, [11 / 15, 1 / 3], rtol=1e-12)
  assert result.macro_f1 == pytest.approx(0.75 * 11 / 15 + 0.25 / 3, rel=1e-12)
  assert result.accuracy_clientavg == pytest.approx(0.75 * 0.75 + 0.25 * 0.5, rel=1e-12)
  assert result.accuracy == pytest.approx(4 / 6, rel=1e-12)


def test_two_round_run_writes_both_columns(tmp_path):
  from sklearn.metrics import f1_score
  task = tasks.get_task("synthetic")
  data = task.load_data(DataOptions(seed=3, num_clients=6))
  config = TrainingConfig(rounds=2, clients_per_round=3, batch_size=10,
                                     client_lr=0.02, seed=1,
                                     local_epochs=1)
  driver = registry.build_driver("fedavg", task, data, config)
  writer = ResultsWriter(str(tmp_path), [*loop.BASE_COLUMNS, *driver.extra_columns],
                         tensorboard=False, figures=False)
  summary = loop.run_training(task, data, config, driver, writer, progress=False)
  writer.close()
  with open(tmp_path / "metrics.csv") as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == 2
  for row in rows:
    for name in ("test_accuracy_clientavg", "test_macro_f1"):
      assert 0.0 <= float(row[name]) <= 1.0
  with open(tmp_path / "metrics.jsonl") as f:
    last = [json.loads(line) for line in f][-1]
  # The last row against sklearn and numpy, from the final model.
  weights, _ = driver.eval_models()
  model = task.model_fn()
  models.set_weights(model, weights[0])
  n_train = data.num_train_samples().astype(np.float64)
  w = n_train / n_train.sum()
  f1, acc = [], []
  for cid in data.client_ids:
    x, y = data.test[cid]
    pred = np.argmax(model(x, training=False).numpy(), axis=1)
    f1.append(f1_score(y, pred, average="macro", labels=sorted(set(y) | set(pred))))
    acc.append(np.mean(pred == y))
  assert last["test_macro_f1"] == pytest.approx(np.dot(w, f1), abs=1e-9)
  assert last["test_accuracy_clientavg"] == pytest.approx(np.dot(w, acc), abs=1e-9)
  # Every client once, and the spread over clients (each client has test data here).
  assert last["test_accuracy_client_mean"] == pytest.approx(np.mean(acc), abs=1e-12)
  for q in (10, 50, 90):
    assert last[f"test_accuracy_p{q}"] == pytest.approx(np.percentile(acc, q), abs=1e-12)
  for name in ("test_macro_f1", "test_accuracy_clientavg"):
    assert summary[f"final_{name}"] == last[name]
    assert summary[f"max_{name}"] == max(r[name] for r in writer.rows)
    assert f"max_{name}_round" in summary
  assert summarize(writer.rows, 2)["final_test_macro_f1"] == last["test_macro_f1"]
