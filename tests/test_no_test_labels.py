"""No algorithm's evaluation reads a test label before its model is fixed.

Each registered algorithm (its first parity case, `local` runner) runs twice
from the same seed: once on the data as it is, once with every test label
moved to another class. Training never sees a test label, so the training
columns must agree; and if no evaluation reads a test label to choose, adapt
or fine-tune a model, each client is tested with the same model both times:
the same deployed weights, the same per-client choice (cluster, mixture,
personal model). A method that picks by test loss (IFCA's protocol for
clients without training data, `--ifca_eval=test_loss`) or fine-tunes on test
batches (one public Per-FedAvg code) fails here; the last test shows the
check catching a choice by test loss and a selection on test accuracy.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tff_cluster import registry
from tff_cluster.host import round as host_round
from tff_cluster.learning import evaluation
from tests import test_runners
from tests.test_runners import PARITY_CASES, _run

ROUNDS = 2
cluster_data = test_runners.cluster_data  # the parity cases' data (module fixture)


def _relabelled(data):
  """The same data with each test label y moved to (y + 1) mod classes."""
  test = {c: (x, (np.asarray(y) + 1) % data.num_classes) for c, (x, y) in data.test.items()}
  return dataclasses.replace(data, test=test)


def _deployed(algo, options, task, data, tmp_path, name):
  rows, _, weights, client_model = _run(task, data, algo, options, "local", tmp_path / name,
                                        {"local_epochs": 1, "jit": "off"}, rounds=ROUNDS)
  return rows, weights, client_model


def _assert_same_models(a, b, what):
  rows_a, weights_a, model_a = a
  rows_b, weights_b, model_b = b
  assert evaluation.deployment(model_a) != evaluation.CHOOSE_BY_TEST_LOSS, (
      f"{what}: every client chooses its model by its test loss")
  scores = set(host_round.EVAL_METRICS) | {"round_seconds", "eval_seconds"}
  for ra, rb in zip(rows_a, rows_b):  # training, and each cluster's size, read no test label
    for key in ra:
      if key not in scores and "test" not in key and not key.endswith("_accuracy"):
        np.testing.assert_array_equal(ra[key], rb[key], err_msg=f"{what}: {key}")
  evaluation.deployment(model_a).assert_same(model_b)  # exactly
  for wa, wb in zip(weights_a, weights_b):
    for x, y in zip(wa, wb):
      np.testing.assert_array_equal(x, y, err_msg=f"{what}: deployed weights")


@pytest.mark.parametrize("algo", sorted(registry.ALGORITHMS))
def test_no_evaluation_reads_a_test_label_before_its_model_is_fixed(algo, cluster_data, tmp_path):
  task, data = cluster_data
  options = PARITY_CASES[algo][0]
  a = _deployed(algo, options, task, data, tmp_path, "labels")
  b = _deployed(algo, options, task, _relabelled(data), tmp_path, "moved")
  assert a[0][-1]["test_accuracy"] != b[0][-1]["test_accuracy"]  # the labels did move
  _assert_same_models(a, b, algo)


def test_the_check_catches_a_choice_by_test_loss_and_a_fine_tuning_on_test_data(
    cluster_data, tmp_path, monkeypatch):
  task, data = cluster_data
  # IFCA's protocol for clients without training data, asked for every client.
  options = dict(PARITY_CASES["ifca"][0], ifca_eval="test_loss")
  a = _deployed("ifca", options, task, data, tmp_path, "a")
  b = _deployed("ifca", options, task, _relabelled(data), tmp_path, "b")
  with pytest.raises(AssertionError, match="test loss"):
    _assert_same_models(a, b, "ifca")
  # FedAvg + FT keeping, for each client, the global model where it scores
  # better than the fine-tuned copy on the client's test labels (a selection on
  # test accuracy, as one public LG-FedAvg code makes).
  host = registry.get_algorithm("fedavg_ft").load_host()
  honest = host.eval_models

  def leaky(self):
    weights, index = honest(self)
    glob = len(weights) - 1
    for k, cid in enumerate(self.data.client_ids):  # MCLR: logits x W + b
      x, y = self.data.test[cid]
      accuracy = lambda w: np.mean(np.argmax(x @ w[0] + w[1], -1) == y)  # noqa: E731
      if accuracy(weights[glob]) > accuracy(weights[index[k]]):
        index[k] = glob
    return weights, index

  monkeypatch.setattr(host, "eval_models", leaky)
  options = PARITY_CASES["fedavg_ft"][0]
  a = _deployed("fedavg_ft", options, task, data, tmp_path, "c")
  b = _deployed("fedavg_ft", options, task, _relabelled(data), tmp_path, "d")
  with pytest.raises(AssertionError, match="each client's model"):
    _assert_same_models(a, b, "fedavg_ft")
