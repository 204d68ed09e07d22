"""LEAF Sent140 (tweets by user, binary sentiment) with the stacked LSTM.

Data: LEAF's Sent140 JSON (`--data_dir` with train/*.json and test/*.json,
e.g. `./preprocess.sh -s niid --sf 0.3 -k 30 -t sample` in LEAF's
data/sent140) and GloVe 6B 300-d vectors (`--glove_path .../glove.6B.300d.txt`).
Each user is a client; tweets become their first 25 tokens as GloVe ids
(0 = padding, last = unknown word); only words that occur in the tweets are
taken from GloVe, so the frozen embedding stays small.

Model: LEAF / FedGroup's LSTM(100) x 2 -> dense 30 -> sigmoid over a frozen
GloVe embedding. Its vocabulary comes from the data, so `model_fn` needs
`load_data` to have run first in the same process (it raises otherwise).

Defaults follow FedGroup (Duan et al., Section 5.1): lr 0.3, batch 10, E = 20
local epochs, 20 clients per round, mu = 0.01, and T = 800 rounds (FedProx's and
both FedGroup authors' codes'; the paper does not state T).
"""

from __future__ import annotations

import numpy as np

from tff_cluster import models
from tff_cluster.data import leaf
from tff_cluster.data.federated import DataError, FederatedData
from tff_cluster.task import DataOptions, TaskSpec

DEFAULTS = dict(rounds=800, clients_per_round=20, local_epochs=20, batch_size=10,
                client_lr=0.3, mu=0.01, num_clients=None)  # None: all users

# The embedding matrix of the last load_data call (the model's vocabulary).
_EMBEDDING = {"matrix": None}


def load_sent140(options: DataOptions) -> FederatedData:
  data, embedding = leaf.load_sent140(options.data_dir, options.glove_path,
                                      seed=options.seed)
  data = leaf.sample_clients(data, options.num_clients, options.seed)
  _EMBEDDING["matrix"] = embedding
  return data


def set_embedding(matrix: np.ndarray) -> None:
  """Sets the model's embedding without loading data (e.g. a saved model)."""
  _EMBEDDING["matrix"] = np.asarray(matrix, np.float32)


def model_fn():
  if _EMBEDDING["matrix"] is None:
    raise DataError("the sent140 model's vocabulary comes from the data: load "
                    "the data (TaskSpec.load_data) before building the model")
  return models.sent140_lstm(_EMBEDDING["matrix"], seq_len=leaf.SENT140_SEQ_LEN)


TASKS = [
    TaskSpec(
        name="sent140",
        description="LEAF Sent140, one client per user, binary sentiment, "
                    "GloVe-300 + LSTM 100x2 (--data_dir, --glove_path)",
        load_data=load_sent140, model_fn=model_fn, model_name="lstm", loss=models.BINARY_PROBS,
        defaults=DEFAULTS,
        source="FedGroup (Duan et al.) Sent140 setting; LEAF Sent140 data/model"),
]
