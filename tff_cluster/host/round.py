"""One round and its evaluation: what the CLI's training loop
(`tff_cluster.host.loop.run_training`) and `tff_cluster.api.Process.next`
both run.

A round trains the driver on the sampled clients (`Driver.run_round`), takes
the models it would hand out now (`Driver.eval_models`) and, when an
evaluator is given, tests them on every client (`EVAL_METRICS` and the
algorithm's own metrics). With a `LossRatio`, the round is checked for
divergence first (a non-finite training loss or model, or a loss past the
ratio's limit raise `Diverged`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, List, Optional

import numpy as np

from tff_cluster.host import privacy
from tff_cluster.host.driver import Diverged, Driver, LossRatio, _all_finite
from tff_cluster.learning.evaluation import EvalResult, Evaluator

# The test metrics of every evaluation, in the order rows hold them.
# test_accuracy: pooled (weighted by test examples); _clientavg: weighted by
# training examples (the WeCFL paper's); _client_mean: every client with test
# data once; _p10/_p50/_p90: the spread of the clients' accuracies.
EVAL_METRICS = ("test_accuracy", "test_loss", "test_accuracy_clientavg", "test_macro_f1",
                "test_accuracy_client_mean", "test_accuracy_p10", "test_accuracy_p50",
                "test_accuracy_p90")
# What a row holds besides the metrics: the round and its timings.
BOOKKEEPING = ("round", "round_seconds", "eval_seconds")


def eval_metrics(result: EvalResult) -> Dict[str, float]:
  """`EVAL_METRICS` of an evaluation, by name."""
  values = (result.accuracy, result.loss, result.accuracy_clientavg, result.macro_f1,
            result.accuracy_client_mean, *(result.accuracy_percentile(q) for q in (10, 50, 90)))
  return dict(zip(EVAL_METRICS, values))


@dataclasses.dataclass
class RoundOutcome:
  """What one round gave.

  row: "round", the driver's training metrics, "round_seconds", the
    "loss_ratio" (when checked) and, when evaluated, `EVAL_METRICS`, the
    algorithm's evaluation metrics and "eval_seconds" (in that order);
  weights, client_model: the models and which one each client receives
    now (`Driver.eval_models`);
  result: the evaluation (None: not evaluated this round).
  """
  row: Dict[str, Any]
  weights: List[Any]
  client_model: Any
  result: Optional[EvalResult] = None

  @property
  def metrics(self) -> Dict[str, Any]:
    """The row without its bookkeeping (the round and its timings)."""
    return {k: v for k, v in self.row.items() if k not in BOOKKEEPING}


def check_round(round_num: int, row: Dict[str, Any], weights, sampled,
                loss_ratio: LossRatio) -> None:
  """Raises `Diverged` for a non-finite training loss or model, or a training
  loss past `loss_ratio`'s limit; records the ratio in `row`."""
  if not np.isfinite(row["train_loss"]):
    raise Diverged(round_num, what="the training loss")
  row["loss_ratio"] = loss_ratio.check(round_num, row["train_loss"], sampled)
  if not _all_finite(weights):
    raise Diverged(round_num, what="a model")


def run_round(driver: Driver, round_num: int, sampled: np.ndarray,
              evaluator: Optional[Evaluator] = None,
              loss_ratio: Optional[LossRatio] = None) -> RoundOutcome:
  """Round `round_num` of `driver` on the `sampled` client indices, checked
  by `loss_ratio` (None: not checked) and evaluated by `evaluator` (None: not
  evaluated)."""
  t0 = time.perf_counter()
  row: Dict[str, Any] = {"round": round_num}
  row.update(driver.run_round(round_num, sampled))
  row.update(privacy.round_metrics(driver))
  row["round_seconds"] = time.perf_counter() - t0
  weights, client_model = (driver.eval_models() if evaluator is not None
                           else driver.round_models())
  if loss_ratio is not None:
    check_round(round_num, row, weights, sampled, loss_ratio)
  outcome = RoundOutcome(row, weights, client_model)
  if evaluator is not None:
    t1 = time.perf_counter()
    outcome.result = result = evaluator.evaluate(weights, client_model)
    row.update(eval_metrics(result))
    row.update(driver.round_eval_metrics(result))
    row["eval_seconds"] = time.perf_counter() - t1
  return outcome
