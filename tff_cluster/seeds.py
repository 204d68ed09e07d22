"""The run's named random streams, drawn from `--seed`.

A named draw of a run comes from `np.random.SeedSequence([seed, tag, *index])`
of one of the streams below; `tests/test_seeds.py` fails when two of them can
give the same sequence (a SeedSequence ignores trailing zero words: [s, t] is
[s, t, 0]) unless they never meet in one run, so a new stream takes a tag of
its own here. The values are the ones the streams have always used: changing
one changes every run that draws from it. (The clients' per-round data
shuffles, `learning.schedule.client_seed`, draw `[seed, round, client]`,
rounds from 1: a named tag t is also round t's; kept, as the numbers are.)
"""

from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

# name -> (tag, number of index values after it). Two streams may share a tag
# only with another number of index values (their sequences differ in length).
STREAMS: Dict[str, Tuple[int, int]] = {
    "synthetic_clusters": (5, 1),        # data/synthetic.py: cluster k's generator
    "synthetic_shared": (6, 0),          # data/synthetic.py: the clusters' shared draw
    "client_sampling": (7, 0),           # host/loop.py and tff_program.py: each round's clients
    "fedgroup_host": (11, 0),            # FedGroup: pre-training and newcomer draws
    "ifca_host": (13, 0),                # IFCA: good_init's sample, kmeans_loss's draws
    "ifca_init": (17, 2),                # IFCA: (attempt, cluster) initial model seeds
    "ifca_init_torch": (41, 2),          # IFCA: (attempt, cluster) fan-in uniform draws
    "fedgwc_sample": (43, 2),            # FedGWC: (round, slot) a cluster's clients
    "hcflplus_head": (47, 1),            # HCFL+: cluster m's initial head
    "ifca_forced": (19, 0),              # IFCA: fedavg_warm's forced groups
    "fedem_init": (23, 1),               # FedEM / FedRC: component m's initial model
    "wecfl_kmeans": (29, 1),             # WeCFL / FeSEM: round r's K-Means seed
    "fedsoft_host": (31, 0),             # FedSoft: cluster-wise client selection
    "ensemble_run": (31, 1),             # FedAvg+ / FedProx+: run r's seed
    "fedsoft_init": (37, 1),             # FedSoft: cluster s's initial model
    "pfedmo_runner": (91, 0),            # pFedMo: the representation model's runner
    "pfedmo_draws": (91, 1),             # pFedMo: 1 the public set, 2 the scoring batch
    "rotated_order": (4040, 1),          # tasks/rotated.py: a stream's permutation
    "mnist_workers_split": (2024, 0),    # tasks/mnist_workers.py
    "mnist_workers_public": (2025, 0),   # tasks/mnist_workers.py
}


def sequence(seed: int, name: str, *index: int) -> np.random.SeedSequence:
  """The seed sequence of stream `name` for `seed` (and its index values)."""
  tag, arity = STREAMS[name]
  if len(index) != arity:
    raise ValueError(f"stream {name!r} takes {arity} index values, got {len(index)}")
  return np.random.SeedSequence([int(seed), tag, *map(int, index)])


def generator(seed: int, name: str, *index: int) -> np.random.Generator:
  """A generator of stream `name` (`sequence`)."""
  return np.random.default_rng(sequence(seed, name, *index))


def int31(seq: np.random.SeedSequence) -> int:
  """The first 31 bits a seed sequence generates: an integer seed (a Keras
  initializer's, a K-Means', a data shuffle's)."""
  return int(seq.generate_state(1)[0] & 0x7FFFFFFF)


def int_seed(seed: int, name: str, *index: int) -> int:
  """A 31-bit integer seed of stream `name` (`int31`)."""
  return int31(sequence(seed, name, *index))
