"""The aggregation slot (`--aggregator`): clipping, DP-FedAvg's noise for one
and for K models, adaptive clipping, order statistics, the privacy account,
resume and refusals (docs/privacy.md)."""

import collections
import json
import math
import os

import numpy as np
import pytest
import tensorflow as tf

from tff_cluster.algorithms.fedavg.fedavg import FedAvgDefinition
from tff_cluster.algorithms.ifca.ifca import IFCADefinition
from tff_cluster.core import mechanisms
from tff_cluster.host import privacy
from tff_cluster.learning.trainers import TrainResult
from tests.helpers import (SMALL_ARGS, assert_one_line_error, main_in_process,
                           read_metrics_csv)

dp_accounting = pytest.importorskip("dp_accounting")

SPEC = [tf.TensorSpec([2], tf.float32)]


class _Given:
  """A definition mix-in whose local update is the delta the client's `data`
  holds (n examples, loss 1 each): the mechanism's arithmetic alone."""

  def local_update(self, trainer, start, data, lr, client_state, optimizer=None):
    delta, n = data
    out = TrainResult([tf.constant(delta, tf.float32)], tf.constant(float(n)),
                      tf.constant(float(n)), None)
    return out, client_state


class GivenFedAvg(_Given, FedAvgDefinition):
  pass


class GivenIFCA(_Given, IFCADefinition):
  pass


def _noise(seed, releases, index, shape, stream=mechanisms.NOISE_STREAM):
  """The documented draw: stateless normal at (seed x 1000003 + stream,
  releases x 4096 + index)."""
  return tf.random.stateless_normal(
      shape, seed=tf.constant([seed * 1_000_003 + stream, releases * 4096 + index],
                              tf.int64)).numpy()


def _round(d, state, clients, mode="train", keys=None):
  """One round of wrapper `d` by hand: each client's work, the sum, the
  server update (what every runner does)."""
  received = d.broadcast(state, collections.OrderedDict(lr=np.float32(0.1)), mode)
  total = None
  for i, data in enumerate(clients):
    extra = {} if keys is None else {"key": tf.constant(keys[i])}
    selected = None
    if keys is not None:
      selected = [tf.gather(w, keys[i]) for w in d.database(state, mode)]
    out = d.client_work(None, selected, received, None, data, mode, **extra)
    total = out.summed if total is None else tf.nest.map_structure(tf.add, total, out.summed)
  return d.server_update(state, total, mode), total


def _tensors(state):
  return tf.nest.map_structure(tf.convert_to_tensor, state)


def test_dp_fixed_fedavg_round_by_hand():
  """Two clients, deltas (3, 4) (norm 5, 10 examples) and (0.3, 0.4) (norm
  0.5, 1 example), C = 1, z = 0.5, m = 4: the records are (0.6, 0.8) and
  (0.3, 0.4) whatever their examples (uniform weights), the sum (0.9, 1.2)
  plus C z N(0, 1) from the seed's first draw, over m = 4."""
  inner = GivenFedAvg(SPEC, 1, mu=0.0, weighting="processed")
  mech = mechanisms.Mechanism("dp_fixed", clip=1.0, noise_multiplier=0.5,
                              clients_per_round=4.0, seed=7)
  d = mechanisms.Aggregated(inner, mech)
  state = _tensors(d.initial_state([np.array([1.0, -1.0], np.float32)]))
  new, total = _round(d, state, [([3.0, 4.0], 10), ([0.3, 0.4], 1)])
  noise = _noise(7, 0, 0, [2])
  expected = np.array([1.0, -1.0]) + (np.array([0.9, 1.2]) + 1.0 * 0.5 * noise) / 4.0
  np.testing.assert_allclose(new["model"][0].numpy(), expected, rtol=1e-6)
  assert float(total["clipped_count"]) == 1.0  # only the first was clipped
  assert float(total["weight"]) == 11.0  # the host's metrics keep the examples
  agg = new[mechanisms.STATE_KEY]
  assert int(agg["releases"]) == 1 and float(agg["clip"]) == 1.0
  # The next round draws the next noise (release 1), never the same.
  newer, _ = _round(d, new, [([0.0, 0.0], 1)])
  np.testing.assert_allclose(newer["model"][0].numpy(),
                             expected + 0.5 * _noise(7, 1, 0, [2]) / 4.0, rtol=1e-6)


def test_dp_fixed_ifca_round_by_hand():
  """K = 2 models; client A in cluster 0 with delta (3, 4), client B in
  cluster 1 with (0, 0.5): records clipped to C = 1 in their own rows, every
  row (cluster 1 with one member, cluster 0 with one) noised and divided by
  m = 2; a row without members would move by its noise alone."""
  inner = GivenIFCA(SPEC, 1, 2, aggregation="processed", loss_batches=0)
  mech = mechanisms.Mechanism("dp_fixed", clip=1.0, noise_multiplier=2.0,
                              clients_per_round=2.0, seed=3)
  d = mechanisms.Aggregated(inner, mech)
  w0 = [np.array([[0.0, 0.0], [1.0, 1.0]], np.float32)]
  state = _tensors(d.initial_state([w0[0][0]]))
  state["models"] = [tf.constant(w0[0])]
  new, _ = _round(d, state, [([3.0, 4.0], 5), ([0.0, 0.5], 2)], mode="forced", keys=[0, 1])
  sums = np.array([[0.6, 0.8], [0.0, 0.5]])
  noise = _noise(3, 0, 0, [2, 2])
  np.testing.assert_allclose(new["models"][0].numpy(), w0[0] + (sums + 2.0 * noise) / 2.0,
                             rtol=1e-5, atol=1e-7)


def test_clipped_keeps_the_weighted_mean():
  """--aggregator=clipped: each delta brought within C, then the algorithm's
  own weighted mean: (10 x (0.6, 0.8) + 1 x (0.3, 0.4)) / 11."""
  inner = GivenFedAvg(SPEC, 1, mu=0.0, weighting="processed")
  d = mechanisms.Aggregated(inner, mechanisms.Mechanism("clipped", clip=1.0))
  state = _tensors(d.initial_state([np.zeros(2, np.float32)]))
  new, _ = _round(d, state, [([3.0, 4.0], 10), ([0.3, 0.4], 1)])
  np.testing.assert_allclose(new["model"][0].numpy(),
                             (10 * np.array([0.6, 0.8]) + np.array([0.3, 0.4])) / 11,
                             rtol=1e-6)


def test_adaptive_clip_follows_the_quantile_rule():
  """No noise (z = 0, count stddev tiny): three of four deltas unclipped at
  C = 1 -> b = 3/4; C <- C exp(-0.2 (0.75 - 0.5)); the sums use the old C."""
  inner = GivenFedAvg(SPEC, 1, mu=0.0, weighting="processed")
  mech = mechanisms.Mechanism("dp_adaptive", clip=1.0, noise_multiplier=0.0,
                              clients_per_round=4.0, clip_count_stddev=1e-12)
  d = mechanisms.Aggregated(inner, mech)
  state = _tensors(d.initial_state([np.zeros(2, np.float32)]))
  deltas = [([0.3, 0.4], 1), ([0.0, 0.1], 1), ([0.6, 0.0], 1), ([3.0, 4.0], 1)]
  new, _ = _round(d, state, deltas)
  assert float(new[mechanisms.STATE_KEY]["clip"]) == pytest.approx(
      math.exp(-0.2 * 0.25), rel=1e-6)
  np.testing.assert_allclose(new["model"][0].numpy(),
                             np.array([0.3 + 0.0 + 0.6 + 0.6, 0.4 + 0.1 + 0.0 + 0.8]) / 4,
                             rtol=1e-6)


def test_adaptive_noise_split_is_tffs():
  """dp_adaptive's value noise multiplier: (z^-2 - (2 s)^-2)^-1/2, s = 0.05 m
  by default; refused in one line where the count's noise alone costs z."""
  mech = mechanisms.Mechanism("dp_adaptive", noise_multiplier=1.0, clients_per_round=100.0)
  assert mech.value_noise_multiplier() == pytest.approx((1 - (2 * 5.0) ** -2) ** -0.5)
  with pytest.raises(ValueError, match="clip count noise"):
    mechanisms.Mechanism("dp_adaptive", noise_multiplier=1.0,
                         clients_per_round=10.0).value_noise_multiplier()


def test_median_and_trimmed_mean_per_cluster():
  """Coordinate-wise per cluster over its members: cluster 0's median of
  (0, 1, 10) is 1; cluster 1's trimmed mean (fraction 0.25 of 4: one
  dropped at each end) of (1, 2, 3, 100) is 2.5; the definition's division
  by the cluster's summed weight then leaves them."""
  inner = GivenIFCA([tf.TensorSpec([1], tf.float32)], 1, 2, aggregation="processed",
                    loss_batches=0)
  med = mechanisms.Aggregated(inner, mechanisms.Mechanism("median"))
  trim = mechanisms.Aggregated(inner, mechanisms.Mechanism("trimmed_mean",
                                                           trim_fraction=0.25))

  def contributions(values, keys):
    return [collections.OrderedDict(
        updates=[np.eye(2, dtype=np.float32)[k][:, None] * v],
        weight=np.eye(2, dtype=np.float32)[k]) for v, k in zip(values, keys)]

  total = collections.OrderedDict(update_sums=[np.zeros((2, 1), np.float32)],
                                  weight_sums=np.array([3.0, 4.0], np.float32))
  got = med.combine(total, contributions([0.0, 1.0, 10.0], [0, 0, 0]), "train")
  assert got["update_sums"][0][0, 0] == pytest.approx(3.0 * 1.0)
  got = trim.combine(total, contributions([1.0, 2.0, 3.0, 100.0], [1, 1, 1, 1]), "train")
  assert got["update_sums"][0][1, 0] == pytest.approx(4.0 * 2.5)
  assert mechanisms.trimmed_mean(np.array([[1.0], [2.0], [3.0], [100.0]]), 0.25)[0] == 2.5


def _account(z, n, m, releases, delta):
  accountant = dp_accounting.rdp.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
  accountant.compose(dp_accounting.SelfComposedDpEvent(
      dp_accounting.SampledWithoutReplacementDpEvent(
          n, m, dp_accounting.GaussianDpEvent(z / 2)), releases))
  return accountant.get_epsilon(delta)


def test_calibration_meets_the_target():
  z = privacy.calibrate(2.0, 100, 10, 50, 1e-3)
  assert _account(z, 100, 10, 50, 1e-3) <= 2.0
  assert _account(z * 0.99, 100, 10, 50, 1e-3) > 2.0


def _run(tmp_path, capsys, name, *flags):
  out = str(tmp_path / name)
  code, _, err = main_in_process([*SMALL_ARGS, "--algo=fedavg", f"--output_dir={out}",
                                  "--jit=off", *flags], capsys)
  assert code == 0, err
  with open(os.path.join(out, "summary.json")) as f:
    return out, json.load(f)


def test_fedavg_run_reports_dp_accountings_epsilon_and_resumes_exactly(tmp_path, capsys):
  """A private run's epsilon per round and at the end is dp-accounting's for
  its releases (20 clients, 5 a round, z its summary's, delta 1/20^1.1), and
  a run stopped after round 2 and resumed to 4 gives the uninterrupted run's
  rows, models and epsilon (the noise's counter is in the checkpoint)."""
  flags = ("--aggregator=dp_adaptive", "--noise_multiplier=0.4", "--clip=0.5",
           "--checkpoint_every=2")
  whole, summary = _run(tmp_path, capsys, "whole", "--rounds=4", *flags)
  z, delta = summary["dp_noise_multiplier"], summary["dp_delta"]
  assert delta == pytest.approx(20 ** -1.1)
  rows = read_metrics_csv(os.path.join(whole, "metrics.csv"))
  for r in rows:
    assert r["dp_epsilon"] == pytest.approx(_account(z, 20, 5, int(r["round"]), delta),
                                            rel=1e-9)
  assert summary["dp_epsilon"] == pytest.approx(rows[-1]["dp_epsilon"], rel=1e-12)
  assert summary["dp_releases"] == 4
  # The clip moved (adaptive), and the rows say so.
  assert len({r["clip"] for r in rows}) > 1
  part, _ = _run(tmp_path, capsys, "part", "--rounds=2", *flags)
  code, _, err = main_in_process(["--resume", f"--output_dir={part}", "--rounds=4",
                                  "--progress=false"], capsys)
  assert code == 0, err
  resumed = read_metrics_csv(os.path.join(part, "metrics.csv"))
  timing = ("round_seconds", "eval_seconds")
  assert ([{k: v for k, v in r.items() if k not in timing} for r in resumed]
          == [{k: v for k, v in r.items() if k not in timing} for r in rows])


def test_fedgroup_refuses_a_private_aggregator(tmp_path, capsys):
  out = str(tmp_path / "run")
  code, _, err = main_in_process([*SMALL_ARGS, "--algo=fedgroup", "--rounds=1",
                                  "--aggregator=dp_fixed", f"--output_dir={out}"], capsys)
  assert_one_line_error(code, err, out, "--aggregator=dp_fixed with --algo=fedgroup",
                        "directions of their individual updates")


def test_a_privacy_target_without_a_private_aggregator_is_refused(tmp_path, capsys):
  """--dp_epsilon with the default mean would run without any privacy."""
  out = str(tmp_path / "run")
  code, _, err = main_in_process([*SMALL_ARGS, "--algo=fedavg", "--rounds=1", "--dp_epsilon=8",
                                  f"--output_dir={out}"], capsys)
  assert_one_line_error(code, err, out, "--dp_epsilon=8 asks for privacy",
                        "--aggregator=mean does not give")
