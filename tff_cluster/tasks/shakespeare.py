"""Shakespeare next-character prediction, one client per speaking role, with
the character LSTM.

Data (`tff_cluster.data.shakespeare`): without `--data_dir`, TFF's federated
Shakespeare (`shakespeare.sqlite`: 715 roles), fetched on first use into
`$TFF_CLUSTER_DATA` (`tff_cluster.data.download`) and read without TFF;
`--data_dir` naming such a database (any file name), or a folder holding
`shakespeare.sqlite`: that file. Snippets become sequences of 80 character
ids with TFF's vocabulary (90 ids: 86 characters, padding, out-of-vocabulary,
beginning, end), each row's target its input shifted by one character.
`--num_clients` keeps a seeded random subset of the roles.

Model: the two-layer LSTM of TFF's `create_recurrent_model` (embedding 8,
LSTM 256 x 2, a logit per position over the 90 ids; `models.char_lstm`).
Loss kind `sequence_ce_logits`: a sequence's loss is the mean cross-entropy
over all its 80 positions, padding targets included, as TFF's training loss
is (its Keras loss never sees the model's mask); accuracy counts the
non-padding target characters (TFF's masked accuracy), a client's count is
its number of such characters, and the reported test loss is the
cross-entropy per such character.

Defaults: TFF's Shakespeare baseline in Reddi et al., "Adaptive Federated
Optimization" (google-research/federated `optimization/docs/hyperparameters.md`):
10 clients per round, 1 local epoch, batch size 4, 1,200 rounds, FedAvg's
client learning rate 10^0 = 1 (server learning rate 1, the library's); mu =
0.001, FedProx's Shakespeare value (litian96/FedProx `plot_final_e20.py`).
"""

from __future__ import annotations

import os
from typing import Optional

from tff_cluster import models
from tff_cluster.data import shakespeare
from tff_cluster.data.federated import DataError, FederatedData
from tff_cluster.spec.task import DataOptions, TaskSpec

DEFAULTS = dict(rounds=1200, clients_per_round=10, local_epochs=1, batch_size=4,
                client_lr=1.0, mu=0.001, num_clients=None)  # None: all roles

SOURCE = ("Reddi et al. (Adaptive Federated Optimization) Shakespeare setting, TFF's "
          "baseline; TFF's federated Shakespeare, vocabulary and char-LSTM; FedProx's mu")


def find_database(data_dir: Optional[str]) -> str:
  """The database `--data_dir` names (module docstring); without it, TFF's
  file, fetched when no cache holds it."""
  if not data_dir:
    return shakespeare.fetch_database()
  path = os.path.expanduser(str(data_dir))
  if os.path.isdir(path) and os.path.isfile(os.path.join(path, shakespeare.DB_FILE)):
    return os.path.join(path, shakespeare.DB_FILE)
  if os.path.isfile(path) and shakespeare.is_database(path):
    return path
  raise DataError(f"invalid --data_dir={data_dir}: not TFF's federated Shakespeare; valid: "
                  f"{shakespeare.DB_FILE} (an SQLite file, any name) or a folder holding it, "
                  "or leave --data_dir out to fetch it")


def load_shakespeare(options: DataOptions) -> FederatedData:
  return shakespeare.load_database(find_database(options.data_dir),
                                   num_clients=options.num_clients, seed=options.seed)


def char_lstm():
  return models.char_lstm(shakespeare.VOCAB_SIZE, shakespeare.SEQ_LEN)


TASKS = [
    TaskSpec(
        name="shakespeare",
        description="TFF's federated Shakespeare, one client per role (715), next "
                    "character over 80-character sequences (TFF's 90-id vocabulary; "
                    "fetched on first use, or --data_dir: shakespeare.sqlite); "
                    "char-LSTM 8-256-256-90",
        load_data=load_shakespeare, model_fn=char_lstm, model_name="char_lstm",
        loss=models.SEQUENCE_CE_LOGITS, defaults=DEFAULTS, source=SOURCE),
]
