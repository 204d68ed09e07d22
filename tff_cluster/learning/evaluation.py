"""Honest test metrics: every client, each with the model it would receive now.

Accuracy = total correct / total test examples over all clients (a fraction in
[0, 1]); `per_client_correct`/`per_client_count` let callers report per-group
numbers. Plain TensorFlow: one Keras model, weights swapped per distinct model.
Loss 'sequence_ce_logits' (a label per sequence position, 0 = padding)
counts characters, not examples: correct, count, the loss (cross-entropy per
character) and F1 are over each client's non-padding targets.

Per-client spread (the personalized protocol): acc_i = correct_i / n_i^test
over the clients with test data, reported as their unweighted mean
(`accuracy_client_mean`: every client counts once, LG-FedAvg's and PACFL's
score) and as percentiles over clients (`accuracy_percentile`).

Client-averaged metrics (the WeCFL paper's way of reporting): with
w_i = n_i^train / sum_j n_j^train over the clients that have test data,
  accuracy_clientavg = sum_i w_i * acc_i,   macro_f1 = sum_i w_i * F1_i,
where F1_i is client i's macro-F1 over the classes in its y_true U y_pred (a
class predicted but absent from y_true, or present but never predicted,
scores F1 0). Predicted class: argmax of the logits; for one sigmoid output
('binary_probs') class 1 iff p >= 0.5. A client without test samples has no
accuracy or F1: it is left out and the weights are renormalised over the
others (so a perfect model scores 1). If any client with test data holds no
training data (a test-only client, e.g. the rotated tasks' test clients),
every client with test data is weighted by its test samples instead,
w_i = n_i^test / sum_j n_j^test, so that no tested client is silently
weighted 0.

Test-only clients have no assignment of their own: whatever `client_model`
an algorithm gives, each of them is tested with the model of lowest mean loss
on its own test data (IFCA's protocol for its test clients), chosen among all
the models the algorithm returns.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_cluster import models

from tff_cluster.data import compact
from tff_cluster.data.federated import FederatedData


class Deployment(abc.ABC):
  """Which model each client is tested with (`Driver.eval_models`' second
  value, normalized by `deployment`): a fixed index per client (`Assigned`)
  or a rule applied at evaluation. Hosts, runners and tests only call these
  members, so a new rule is one subclass in this module."""

  per_client = True  # says something of each client by its position
  rule = True  # decided at evaluation, not a fixed index per client

  @abc.abstractmethod
  def rows(self, lo: int, hi: int) -> "Deployment":
    """The deployment of clients lo..hi-1 (a shard's)."""

  @abc.abstractmethod
  def groups(self, chosen, assignment, num_clients: int) -> Optional[np.ndarray]:
    """Each client's group/model index for groups.csv (-1: none), or None when
    not known; `chosen` is the evaluation's choice (None on a round without
    evaluation), `assignment` the driver's (-1: a client in no group yet)."""

  @abc.abstractmethod
  def evaluate(self, evaluator: "Evaluator", weights) -> "EvalResult":
    """`evaluator`'s result with every client tested as this deployment says."""

  @abc.abstractmethod
  def assert_same(self, other, rtol: float = 0.0, atol: float = 0.0) -> None:
    """Raises AssertionError unless `other` (anything `deployment` takes) is
    the same deployment: the same kind and integers, real values (mixture
    weights, alphas) within `np.testing.assert_allclose(self's, other's,
    rtol, atol)` (exactly by default)."""

  def _same_kind(self, other) -> "Deployment":
    """`other` as a `Deployment`; AssertionError unless of this one's kind."""
    other = deployment(other)
    if type(self) is not type(other):
      raise AssertionError(f"deployments {type(self).__name__} and {type(other).__name__}")
    return other


def _no_group(num_clients: int) -> np.ndarray:
  return np.full(num_clients, -1, np.int64)


@dataclasses.dataclass(frozen=True, eq=False)
class Assigned(Deployment):
  """Client k is tested with model `index[k]` (what a driver's bare index
  array says)."""
  index: np.ndarray
  rule = False

  def rows(self, lo: int, hi: int) -> "Assigned":
    return Assigned(self.index[lo:hi])

  def groups(self, chosen, assignment, num_clients: int) -> np.ndarray:
    """The indices, -1 where `assignment` (when given, of the same shape) is
    negative (e.g. FedGroup's clients in no group yet, tested with its
    auxiliary model)."""
    groups = np.array(self.index, np.int64)
    if assignment is not None and np.shape(assignment) == groups.shape:
      groups[np.asarray(assignment) < 0] = -1
    return groups

  def evaluate(self, evaluator: "Evaluator", weights) -> "EvalResult":
    return evaluator._evaluate_assigned(weights, self.index)  # noqa: SLF001

  def assert_same(self, other, rtol: float = 0.0, atol: float = 0.0) -> None:
    np.testing.assert_array_equal(self.index, self._same_kind(other).index,
                                  err_msg="each client's model")


@dataclasses.dataclass(frozen=True)
class ChooseByTestLoss(Deployment):
  """Each client takes the model of lowest mean loss on its own test data."""
  per_client = False

  def rows(self, lo: int, hi: int) -> "ChooseByTestLoss":
    return self

  def groups(self, chosen, assignment, num_clients: int) -> Optional[np.ndarray]:
    """`chosen`, the evaluation's choice (None on a round without one)."""
    return None if chosen is None else np.asarray(chosen, np.int64)

  def evaluate(self, evaluator: "Evaluator", weights) -> "EvalResult":
    return evaluator._evaluate_by_test_loss(weights)  # noqa: SLF001

  def assert_same(self, other, rtol: float = 0.0, atol: float = 0.0) -> None:
    self._same_kind(other)


@dataclasses.dataclass(frozen=True)
class Ensemble(Deployment):
  """Every client is tested with the ensemble of all models: the argmax of the
  mean of their logits (`vote='logits'`) or of their probabilities ('probs')
  (FedAvg+ / FedProx+). `EvalResult.client_model` is then -1 for every client."""
  vote: str
  per_client = False

  def rows(self, lo: int, hi: int) -> "Ensemble":
    return self

  def groups(self, chosen, assignment, num_clients: int) -> np.ndarray:
    return _no_group(num_clients)

  def evaluate(self, evaluator: "Evaluator", weights) -> "EvalResult":
    return evaluator._evaluate_ensemble(weights, self.vote)  # noqa: SLF001

  def assert_same(self, other, rtol: float = 0.0, atol: float = 0.0) -> None:
    other = self._same_kind(other)
    if self.vote != other.vote:
      raise AssertionError(f"votes {self.vote!r} and {other.vote!r}")


@dataclasses.dataclass(frozen=True, eq=False)
class Mixture(Deployment):
  """Each client k is tested with its own mixture of the models' predicted
  probabilities, sum_m weights[k, m] softmax(logits_m) (FedEM, FedRC):
  `weights` [clients, models], rows summing to 1. `EvalResult.client_model`
  is -1 for every client."""
  weights: np.ndarray

  def rows(self, lo: int, hi: int) -> "Mixture":
    return Mixture(np.asarray(self.weights)[lo:hi])

  def groups(self, chosen, assignment, num_clients: int) -> np.ndarray:
    return _no_group(num_clients)

  def evaluate(self, evaluator: "Evaluator", weights) -> "EvalResult":
    return evaluator._evaluate_ensemble(weights, "probs",  # noqa: SLF001
                                        np.asarray(self.weights))

  def assert_same(self, other, rtol: float = 0.0, atol: float = 0.0) -> None:
    np.testing.assert_allclose(self.weights, self._same_kind(other).weights, rtol=rtol,
                               atol=atol, err_msg="each client's mixture weights")


CHOOSE_BY_TEST_LOSS = ChooseByTestLoss()
ENSEMBLE_VOTES = {"logits": Ensemble("logits"), "probs": Ensemble("probs")}


@dataclasses.dataclass(frozen=True, eq=False)
class OutputMix(Deployment):
  """Client k tested with the mixed outputs alpha[k] f(weights[personal[k]];
  x) + (1 - alpha[k]) f(weights[shared]; x) (APFL's personal prediction); a
  client with personal[k] = -1 with weights[shared] alone.
  `EvalResult.client_model` is `personal`, `shared` where it is -1."""
  personal: np.ndarray
  alpha: np.ndarray
  shared: int = 0

  def rows(self, lo: int, hi: int) -> "OutputMix":
    return OutputMix(np.asarray(self.personal)[lo:hi], np.asarray(self.alpha)[lo:hi],
                     self.shared)

  def groups(self, chosen, assignment, num_clients: int) -> np.ndarray:
    return _no_group(num_clients)

  def evaluate(self, evaluator: "Evaluator", weights) -> "EvalResult":
    return evaluator._evaluate_output_mix(weights, self)  # noqa: SLF001

  def assert_same(self, other, rtol: float = 0.0, atol: float = 0.0) -> None:
    other = self._same_kind(other)
    if self.shared != other.shared:
      raise AssertionError(f"shared model {self.shared} and {other.shared}")
    np.testing.assert_array_equal(self.personal, other.personal,
                                  err_msg="each client's personal model")
    np.testing.assert_allclose(self.alpha, other.alpha, rtol=rtol, atol=atol,
                               err_msg="each client's alpha")


def deployment(client_model) -> Deployment:
  """`client_model` as a `Deployment`: a bare index array or list is
  `Assigned`; a str is refused (TypeError)."""
  if isinstance(client_model, Deployment):
    return client_model
  if isinstance(client_model, str):
    raise TypeError(f"client_model must be indices, ChooseByTestLoss() or Ensemble(vote), "
                    f"got {client_model!r}")
  return Assigned(np.asarray(client_model))


def mixed_outputs_refusal(loss: str) -> str:
  """One line: the deployments that combine several models' outputs per
  example (`Ensemble`, `Mixture`, `OutputMix`) predict one label per example,
  which loss `loss` (a label per position) does not have."""
  return (f"loss {loss!r} (a label per sequence position) cannot be tested with several "
          "models' outputs combined (an ensemble, a mixture or APFL's mixed outputs); "
          "valid: an algorithm that tests each client with one model")


def ensemble_predict(outputs: np.ndarray, vote: str, loss: str) -> tuple:
  """Combines the outputs [R, n, C] of R models (logits; for 'binary_probs'
  one sigmoid probability [R, n, 1]) into (predicted labels [n], the
  ensemble's probabilities [n, C]).

  vote 'logits': probabilities = softmax(mean_r logits_r) (argmax of the mean
  logits); 'probs': probabilities = mean_r softmax(logits_r). A sigmoid output
  is averaged as a probability under both.
  """
  outputs = np.asarray(outputs, np.float64)
  if loss != models.SPARSE_CE_LOGITS:
    p1 = outputs[..., 0].mean(axis=0)
    return (p1 >= 0.5).astype(np.int64), np.stack([1.0 - p1, p1], axis=1)
  if vote == "logits":
    z = outputs.mean(axis=0)
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z)
    return np.argmax(outputs.mean(axis=0), axis=1), p / p.sum(axis=1, keepdims=True)
  if vote == "probs":
    z = outputs - outputs.max(axis=2, keepdims=True)
    e = np.exp(z)
    p = (e / e.sum(axis=2, keepdims=True)).mean(axis=0)
    return np.argmax(p, axis=1), p
  raise ValueError(f"invalid ensemble vote {vote!r}; valid: logits, probs")


def mixture_predict(outputs: np.ndarray, mix: np.ndarray, loss: str) -> tuple:
  """(predicted labels [n], probabilities [n, C]): example i's probabilities
  are sum_r mix[i, r] softmax(outputs[r, i]) (`outputs` [R, n, C] logits;
  for 'binary_probs' one sigmoid probability [R, n, 1])."""
  outputs = np.asarray(outputs, np.float64)
  mix = np.asarray(mix, np.float64).T[:, :, None]  # [R, n, 1]
  if loss != models.SPARSE_CE_LOGITS:
    p1 = (mix[..., 0] * outputs[..., 0]).sum(axis=0)
    return (p1 >= 0.5).astype(np.int64), np.stack([1.0 - p1, p1], axis=1)
  e = np.exp(outputs - outputs.max(axis=2, keepdims=True))
  p = (mix * e / e.sum(axis=2, keepdims=True)).sum(axis=0)
  return np.argmax(p, axis=1), p


@dataclasses.dataclass
class EvalResult:
  accuracy: float
  loss: float
  per_client_correct: np.ndarray
  per_client_count: np.ndarray
  per_client_loss_sum: np.ndarray
  client_model: Optional[np.ndarray] = None  # the model index each client was tested with
  per_client_f1: Optional[np.ndarray] = None  # macro-F1 per client (0 without test data)
  client_weight: Optional[np.ndarray] = None  # w_i of the client-averaged metrics

  @property
  def accuracy_clientavg(self) -> float:
    """sum_i w_i * acc_i (NaN when unknown)."""
    if self.client_weight is None:
      return float("nan")
    acc = self.per_client_correct / np.maximum(self.per_client_count, 1)
    return float(np.dot(self.client_weight, acc))

  @property
  def per_client_accuracy(self) -> np.ndarray:
    """acc_i of every client with test data (clients without any are left
    out), in client order."""
    tested = self.per_client_count > 0
    return self.per_client_correct[tested] / self.per_client_count[tested]

  @property
  def accuracy_client_mean(self) -> float:
    """The unweighted mean of acc_i over the clients with test data (every
    client counts once; NaN when none has test data)."""
    acc = self.per_client_accuracy
    return float(acc.mean()) if len(acc) else float("nan")

  def accuracy_percentile(self, q: float) -> float:
    """The q-th percentile (0..100) of acc_i over the clients with test data,
    numpy's linear interpolation between the order statistics: with the m
    accuracies sorted a_0 <= ... <= a_{m-1}, position p = q/100 (m - 1),
    a_floor(p) + (p - floor(p)) (a_ceil(p) - a_floor(p)). NaN when no client
    has test data."""
    acc = self.per_client_accuracy
    return float(np.percentile(acc, q)) if len(acc) else float("nan")

  @property
  def macro_f1(self) -> float:
    """sum_i w_i * F1_i (NaN when unknown)."""
    if self.client_weight is None or self.per_client_f1 is None:
      return float("nan")
    return float(np.dot(self.client_weight, self.per_client_f1))

  def group_accuracy(self, assignment: np.ndarray, group: int) -> float:
    mask = assignment == group
    count = self.per_client_count[mask].sum()
    return float(self.per_client_correct[mask].sum() / count) if count else float("nan")


def client_weights(train_counts, test_counts) -> np.ndarray:
  """w_i = n_i^train / sum of n_j^train over clients with test data; 0 for a
  client without test data. If any client with test data has no training data
  (a test-only client), every client with test data is weighted by its test
  samples instead."""
  train = np.asarray(train_counts, np.float64)
  tested = np.asarray(test_counts) > 0
  base = np.where(tested, train, 0.0)
  if (tested & (train <= 0)).any():
    base = np.where(tested, np.asarray(test_counts, np.float64), 0.0)
  total = base.sum()
  return base / total if total > 0 else base


def per_client_macro_f1(y_true: np.ndarray, y_pred: np.ndarray,
                        counts: np.ndarray) -> np.ndarray:
  """Macro-F1 of each client; the clients' examples are consecutive in
  `y_true`/`y_pred` with sizes `counts`. Classes: each client's y_true U y_pred.
  A client with no examples gets 0."""
  counts = np.asarray(counts, np.int64)
  m = len(counts)
  y_true = np.asarray(y_true, np.int64).reshape(-1)
  y_pred = np.asarray(y_pred, np.int64).reshape(-1)
  if len(y_true) == 0:
    return np.zeros(m)
  num_classes = int(max(y_true.max(), y_pred.max())) + 1
  client = np.repeat(np.arange(m), counts)
  size = m * num_classes
  true_n = np.bincount(client * num_classes + y_true, minlength=size).reshape(m, num_classes)
  pred_n = np.bincount(client * num_classes + y_pred, minlength=size).reshape(m, num_classes)
  hit = y_true == y_pred
  tp = np.bincount(client[hit] * num_classes + y_true[hit],
                   minlength=size).reshape(m, num_classes)
  support = true_n + pred_n  # > 0 exactly for the classes in y_true U y_pred
  f1 = np.where(support > 0, 2.0 * tp / np.maximum(support, 1), 0.0)
  classes = (support > 0).sum(axis=1)
  return np.where(classes > 0, f1.sum(axis=1) / np.maximum(classes, 1), 0.0)


def _batches(parts: Sequence, batch_size: int):
  """(start row, decoded float batch) of the rows of `parts` concatenated,
  cut every `batch_size` rows: the batches `np.concatenate(parts)` sliced
  would give, made from the parts one batch at a time."""
  pending, have, start = [], 0, 0
  for part in parts:
    offset = 0
    while offset < len(part):
      take = min(batch_size - have, len(part) - offset)
      pending.append(part[offset:offset + take])
      have += take
      offset += take
      if have == batch_size:
        yield start, compact.decode(compact.concatenate(pending) if len(pending) > 1
                                    else pending[0])
        start, pending, have = start + have, [], 0
  if pending:
    yield start, compact.decode(compact.concatenate(pending) if len(pending) > 1
                                else pending[0])


class Evaluator:
  """Evaluates per-client model choices on every client's test split (or, with
  `split='train'`, on its training split: the losses of `mean_losses`)."""

  def __init__(self, model_fn: Callable[[], tf.keras.Model], loss: str,
               data: FederatedData, batch_size: int = 2048, split: str = "test"):
    if split not in ("test", "train"):
      raise ValueError(f"invalid split {split!r}; valid: test, train")
    self._model = model_fn()
    self._loss = loss
    self._batch_size = batch_size
    arrays = data.test if split == "test" else data.train
    self._x = [arrays[c][0] for c in data.client_ids]
    self._y = [arrays[c][1] for c in data.client_ids]
    # What an accuracy counts: examples, or a sequence task's non-padding targets.
    self._counts = np.array([len(models.scored_targets(loss, y)) for y in self._y], np.int64)
    self._weight = client_weights(data.num_train_samples(), self._counts)
    self._test_only = np.asarray(data.test_only())

    @tf.function(reduce_retracing=True, autograph=False)
    def batch_stats(x, y):
      pred = self._model(x, training=False)
      if loss == models.SEQUENCE_CE_LOGITS:  # per non-padding target character
        return models.sequence_stats(y, pred)
      per_example = models.per_example_loss(loss, y, pred)
      if loss == models.SPARSE_CE_LOGITS:
        label = tf.argmax(pred, axis=-1, output_type=tf.int32)
      else:
        label = tf.cast(tf.reshape(pred, [-1]) >= 0.5, tf.int32)
      correct = tf.cast(tf.equal(label, tf.reshape(tf.cast(y, tf.int32), [-1])),
                        tf.float64)
      return correct, tf.cast(per_example, tf.float64), label

    self._batch_stats = batch_stats
    self._outputs = tf.function(lambda x: self._model(x, training=False),
                                reduce_retracing=True, autograph=False)

  def _stats(self, parts: Sequence, y: np.ndarray):
    """Per-example (correct, loss, label) of the rows of `parts` (the
    members' input arrays, one after the other) against `y`: batches of
    `batch_size` rows of their concatenation, made one batch at a time (the
    whole is never copied, nor decoded)."""
    correct, losses, labels = [], [], []
    for start, batch in _batches(parts, self._batch_size):
      c, l, p = self._batch_stats(batch, y[start:start + self._batch_size])
      correct.append(c.numpy())
      losses.append(l.numpy())
      labels.append(p.numpy())
    return np.concatenate(correct), np.concatenate(losses), np.concatenate(labels)

  def evaluate(self, weights: Sequence[Sequence[np.ndarray]],
               client_model) -> EvalResult:
    """Every client tested as `client_model` (indices or a `Deployment`, see
    `deployment`) says: client k with `weights[client_model[k]]`; with
    `CHOOSE_BY_TEST_LOSS` each client takes the model of lowest mean loss on
    its own test data (ties: the lowest index), as IFCA's test clients do.
    Test-only clients (no training data) take their lowest-test-loss model
    whatever indices say for them (their entry is ignored, e.g. -1).
    `result.client_model` is the choice either way."""
    return deployment(client_model).evaluate(self, weights)

  def mean_losses(self, weights: Sequence[np.ndarray],
                  clients: Optional[Sequence[int]] = None) -> np.ndarray:
    """Each client's mean loss under one model's `weights` (NaN for a client
    without data in this split). `clients`: only these (indices), in their
    order, each evaluated in batches of its own data alone."""
    if clients is None:
      result = self._evaluate_indices([weights], np.zeros(len(self._y), np.int64))
      return np.where(self._counts > 0,
                      result.per_client_loss_sum / np.maximum(self._counts, 1), np.nan)
    models.set_weights(self._model, weights)
    out = np.full(len(clients), np.nan)
    for i, k in enumerate(clients):
      if self._counts[k] > 0:
        out[i] = self._stats([self._x[k]], self._y[k])[1].sum() / self._counts[k]
    return out

  def _evaluate_assigned(self, weights, client_model: np.ndarray) -> EvalResult:
    """Client k tested with `weights[client_model[k]]`; test-only clients with
    their lowest-test-loss model (`_choose_for_test_only`)."""
    if self._test_only.any():
      client_model = self._choose_for_test_only(weights, client_model)
    return self._evaluate_indices(weights, client_model)

  def _evaluate_by_test_loss(self, weights) -> EvalResult:
    """Each client tested with the model of lowest mean loss on its own test
    data (ties: the lowest index)."""
    every = [self._evaluate_indices(weights, np.full(len(self._y), j))
             for j in range(len(weights))]
    mean_loss = np.stack([np.where(r.per_client_count > 0,
                                   r.per_client_loss_sum / np.maximum(r.per_client_count, 1),
                                   0.0) for r in every])
    choice = np.argmin(mean_loss, axis=0)
    pick = lambda field: np.choose(choice, [getattr(r, field) for r in every])  # noqa: E731
    correct, loss_sum = pick("per_client_correct"), pick("per_client_loss_sum")
    total = self._counts.sum()
    return EvalResult(float(correct.sum() / total), float(loss_sum.sum() / total),
                      correct, self._counts.copy(), loss_sum, client_model=choice,
                      per_client_f1=pick("per_client_f1"),
                      client_weight=self._weight.copy())

  def _evaluate_indices(self, weights, client_model: np.ndarray) -> EvalResult:
    """Client k tested with `weights[client_model[k]]`, as given."""
    n = len(self._y)
    correct = np.zeros(n)
    loss_sum = np.zeros(n)
    f1 = np.zeros(n)
    for index in np.unique(client_model):
      members = np.flatnonzero(client_model == index)
      members = members[self._counts[members] > 0]
      if len(members) == 0:
        continue
      models.set_weights(self._model, weights[index])
      y = np.concatenate([self._y[k] for k in members])
      c, l, p = self._stats([self._x[k] for k in members], y)
      bounds = np.cumsum(self._counts[members])[:-1]
      correct[members] = [s.sum() for s in np.split(c, bounds)]
      loss_sum[members] = [s.sum() for s in np.split(l, bounds)]
      f1[members] = per_client_macro_f1(models.scored_targets(self._loss, y), p,
                                        self._counts[members])
    total = self._counts.sum()
    return EvalResult(float(correct.sum() / total), float(loss_sum.sum() / total),
                      correct, self._counts.copy(), loss_sum, client_model=client_model,
                      per_client_f1=f1, client_weight=self._weight.copy())

  def _choose_for_test_only(self, weights, client_model: np.ndarray) -> np.ndarray:
    """Test-only clients (no training data, so no assignment of their own)
    take the model of lowest mean loss on their own test data (ties: the
    lowest index); the others keep `client_model`."""
    members = np.flatnonzero(self._test_only & (self._counts > 0))
    if not len(members):
      return client_model
    out = np.array(client_model, copy=True)
    if len(weights) == 1:
      out[members] = 0
      return out
    x = [self._x[k] for k in members]
    y = np.concatenate([self._y[k] for k in members])
    bounds = np.cumsum(self._counts[members])[:-1]
    mean_loss = []
    for w in weights:
      models.set_weights(self._model, w)
      _, losses, _ = self._stats(x, y)
      mean_loss.append([s.mean() for s in np.split(losses, bounds)])
    out[members] = np.argmin(np.asarray(mean_loss), axis=0)
    return out

  def _all_outputs(self, weights, x: np.ndarray) -> np.ndarray:
    models.set_weights(self._model, weights)
    return np.concatenate([self._outputs(compact.decode(x[i:i + self._batch_size])).numpy()
                           for i in range(0, len(x), self._batch_size)])

  def _evaluate_output_mix(self, weights, mix: OutputMix) -> EvalResult:
    """Every client tested with its mixed outputs (`OutputMix`); a sigmoid
    output is mixed as a probability."""

    def predict(x, members):
      out = self._all_outputs(weights[mix.shared], x).astype(np.float64)
      rows = np.repeat(np.asarray(mix.personal, np.int64)[members], self._counts[members])
      alpha = np.repeat(np.asarray(mix.alpha, np.float64)[members], self._counts[members])
      for j in np.unique(rows[rows >= 0]):
        sel = rows == j
        a = alpha[sel][:, None]
        out[sel] = a * self._all_outputs(weights[j], x[sel]) + (1.0 - a) * out[sel]
      return ensemble_predict(out[None], "logits", self._loss)

    chosen = np.asarray(mix.personal, np.int64).copy()
    chosen[chosen < 0] = mix.shared  # the shared model alone
    return self._evaluate_predictions(predict, chosen)

  def _evaluate_ensemble(self, weights, vote: str, mixture=None) -> EvalResult:
    """Every client tested with the vote of all `weights` (see `ensemble_predict`),
    or with `mixture` ([clients, models]) its own weights over their
    probabilities."""

    def predict(x, members):
      outputs = np.stack([self._all_outputs(w, x) for w in weights])
      if mixture is None:
        return ensemble_predict(outputs, vote, self._loss)
      return mixture_predict(outputs, np.repeat(np.asarray(mixture, np.float64)[members],
                                                self._counts[members], axis=0), self._loss)

    return self._evaluate_predictions(predict, np.full(len(self._y), -1))

  def _evaluate_predictions(self, predict, client_model) -> EvalResult:
    """Every client with test data tested with `predict(x, members)` ->
    (labels, probabilities [n, C]) over its members' examples concatenated;
    the loss is the cross-entropy of those probabilities."""
    if self._loss == models.SEQUENCE_CE_LOGITS:
      raise ValueError(mixed_outputs_refusal(self._loss))
    n = len(self._y)
    members = np.flatnonzero(self._counts > 0)
    correct, loss_sum, f1 = np.zeros(n), np.zeros(n), np.zeros(n)
    if len(members):
      x = compact.concatenate([self._x[k] for k in members])
      y = np.concatenate([self._y[k] for k in members]).reshape(-1).astype(np.int64)
      labels, probs = predict(x, members)
      hit = (labels == y).astype(np.float64)
      nll = -np.log(np.clip(probs[np.arange(len(y)), y], 1e-12, 1.0))
      bounds = np.cumsum(self._counts[members])[:-1]
      correct[members] = [s.sum() for s in np.split(hit, bounds)]
      loss_sum[members] = [s.sum() for s in np.split(nll, bounds)]
      f1[members] = per_client_macro_f1(y, labels, self._counts[members])
    total = self._counts.sum()
    return EvalResult(float(correct.sum() / total), float(loss_sum.sum() / total),
                      correct, self._counts.copy(), loss_sum, client_model=client_model,
                      per_client_f1=f1, client_weight=self._weight.copy())
