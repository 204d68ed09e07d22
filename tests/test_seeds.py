"""The run's named random streams (`tff_cluster.seeds`): no two give the same
sequence unless they never meet in one run, and each is the draw its users
always made."""

from __future__ import annotations

import itertools

import numpy as np

from tff_cluster import seeds

# Streams that give the same sequence but never meet in one run.
APART = {frozenset({"fedsoft_host", "ensemble_run"}):
         "FedSoft's and FedAvg+/FedProx+'s: different algorithms",
         frozenset({"pfedmo_runner", "pfedmo_draws"}):
         "pFedMo's draws take index 1 or 2, never the 0 that is its runner's seed"}


def _can_meet(a, b) -> bool:
  """Whether streams a and b can give the same sequence: the same tag, and
  index values of one that equal the other's padded with zeros (a
  SeedSequence ignores trailing zero words)."""
  return seeds.STREAMS[a][0] == seeds.STREAMS[b][0]


def test_no_two_streams_share_a_sequence():
  clashes = [{a, b} for a, b in itertools.combinations(seeds.STREAMS, 2)
             if _can_meet(a, b) and frozenset({a, b}) not in APART]
  assert not clashes, clashes


def test_the_known_clash_is_real_and_the_rule_sees_it():
  """[s, 31] is [s, 31, 0]: the rule above must flag such a pair."""
  assert _can_meet("fedsoft_host", "ensemble_run")
  np.testing.assert_array_equal(seeds.sequence(4, "fedsoft_host").generate_state(4),
                                seeds.sequence(4, "ensemble_run", 0).generate_state(4))
  assert not _can_meet("ifca_host", "ifca_forced")


def test_a_stream_is_the_sequence_its_users_always_drew():
  assert seeds.int_seed(3, "ifca_init", 1, 2) == int(
      np.random.SeedSequence([3, 17, 1, 2]).generate_state(1)[0] & 0x7FFFFFFF)
  np.testing.assert_array_equal(seeds.generator(5, "client_sampling").integers(0, 1000, 8),
                                np.random.default_rng(np.random.SeedSequence([5, 7]))
                                .integers(0, 1000, 8))
