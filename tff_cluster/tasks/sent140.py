"""Sent140 (tweets by user, binary sentiment) with the stacked LSTM.

Data: with no `--data_dir`, the raw Sentiment140 CSV, fetched on first use
(`tff_cluster.data.download`: Stanford's trainingandtestdata.zip, checked
against TensorFlow Datasets' published SHA-256; the training CSV is kept in
`$TFF_CLUSTER_DATA`) and preprocessed as below. `--data_dir`, either:

* LEAF's Sent140 JSON: a directory with train/*.json and test/*.json, e.g.
  from `./preprocess.sh -s niid --sf 0.3 -k 30 -t sample` in LEAF's
  data/sent140 (already sampled, filtered and split: the task args below are
  refused with it); or
* the raw Sentiment140 CSV (`training.1600000.processed.noemoticon.csv`, no
  header, Latin-1, columns polarity 0/4, tweet id, date, query, user, text),
  given as the file or its directory; in a directory the official name wins,
  else the one `*.csv` not named `test*` (the manual test set
  `testdata.manual.2009.06.14.csv` is not training data); several candidates
  are an error listing them. It gets LEAF's preprocessing
  (`tff_cluster.data.sent140`): grouped by user, label 1 for polarity 4 and
  0 for 0; `--task_arg=sample_fraction=F` (LEAF `--sf`, default 1.0) keeps
  whole users, drawn in seeded random order, up to a fraction F of all
  tweets; `--task_arg=min_tweets=K` (LEAF `-k`, default 3 as in LEAF's
  small-sized command `--sf 0.05 -k 3`) drops users with fewer tweets; then
  each user's tweets are split like LEAF's `-t sample --tf 0.9`:
  max(1, int(0.9 n)) train tweets and the rest test, users with < 2 tweets
  dropped, so a 2-tweet user gets 1 train + 1 test tweet.

GloVe: with no `--glove_path`, `glove.6B.<d>d.txt` fetched on first use from
Stanford's glove.6B.zip (only that file is kept), d from
`--task_arg=glove_dim=d` (50, 100, 200 or 300; default 300, the papers').
`--glove_path`: a text file `word v1 ... vD` of any dimension D, plain or .gz
(e.g. glove.6B.300d.txt), or a directory holding one glove*.txt[.gz]; a
glove_dim given with it must be the file's D. Each user is a client; tweets become their first 25 tokens
(LEAF's tokenization) as GloVe ids (0 = padding, last = unknown word); only
words that occur in the tweets are taken from GloVe, so the frozen embedding
stays small.

Model: LEAF / FedGroup's LSTM(100) x 2 -> dense 30 -> sigmoid over a frozen
GloVe embedding of the file's dimension. Its vocabulary comes from the data,
so `model_fn` needs `load_data` to have run first in the same process (it
raises otherwise).

Defaults follow FedGroup (Duan et al., Section 5.1): lr 0.3, batch 10, E = 20
local epochs, 20 clients per round, mu = 0.01, and T = 800 rounds (FedProx's and
both FedGroup authors' codes'; the paper does not state T).
"""

from __future__ import annotations

from tff_cluster import models
from tff_cluster.data import download, leaf
from tff_cluster.data import sent140 as sent140_data
from tff_cluster.data.federated import DataError, FederatedData
from tff_cluster.spec.hparams import HParam, HParamError
from tff_cluster.spec.task import DataOptions, TaskSpec, task_arg

DEFAULTS = dict(rounds=800, clients_per_round=20, local_epochs=20, batch_size=10,
                client_lr=0.3, mu=0.01, num_clients=None)  # None: all users

MIN_TWEETS = HParam(
    "min_tweets", int, sent140_data.DEFAULT_MIN_TWEETS,
    "raw CSV only: keep users with at least this many tweets (LEAF -k)", low=0)
SAMPLE_FRACTION = HParam(
    "sample_fraction", float, sent140_data.DEFAULT_SAMPLE_FRACTION,
    "raw CSV only: share of all tweets kept, as whole users drawn at random "
    "(LEAF --sf)", low=0, low_open=True, high=1)
GLOVE_DIM = HParam(
    "glove_dim", int, sent140_data.DEFAULT_GLOVE_DIM,
    "GloVe 6B dimension fetched when --glove_path is not given: 50, 100, 200 or 300 "
    "(with --glove_path: that file's, checked when given)", low=50, high=300)
TASK_ARGS = (MIN_TWEETS, SAMPLE_FRACTION, GLOVE_DIM)

# The embedding matrix of the last load_data call (the model's vocabulary).
_EMBEDDING = {"matrix": None}


def load_sent140(options: DataOptions) -> FederatedData:
  given = {d.name: task_arg(options, d) for d in TASK_ARGS if d.name in options.extra}
  glove_dim = given.pop(GLOVE_DIM.name, None)
  if glove_dim is not None and glove_dim not in download.GLOVE_DIMS:
    raise HParamError(f"invalid --task_arg={GLOVE_DIM.name}={glove_dim}; valid: "
                      f"{', '.join(map(str, download.GLOVE_DIMS))} (GloVe 6B's files)")
  data, embedding = sent140_data.load_sent140(
      options.data_dir, options.glove_path, seed=options.seed, glove_dim=glove_dim,
      **given)
  data = leaf.sample_clients(data, options.num_clients, options.seed)
  if not options.data_dir or sent140_data.find_data(options.data_dir)[0] == "csv":
    # The CLI names these when too few users are left for --clients_per_round.
    named = [d for d in (MIN_TWEETS, SAMPLE_FRACTION) if d.name in given] or [MIN_TWEETS]
    data.client_count_setting = " and ".join(
        f"--task_arg={d.name}={given.get(d.name, d.default)}" for d in named) + (
            "" if given else " (the default)")
  _EMBEDDING["matrix"] = embedding
  return data


def model_fn():
  if _EMBEDDING["matrix"] is None:
    raise DataError("the sent140 model's vocabulary comes from the data: load "
                    "the data (TaskSpec.load_data) before building the model")
  return models.sent140_lstm(_EMBEDDING["matrix"], seq_len=leaf.SENT140_SEQ_LEN)


TASKS = [
    TaskSpec(
        name="sent140",
        description="Sent140, one client per user, binary sentiment: the raw "
                    "Sentiment140 CSV (fetched on first use, or --data_dir) with LEAF's "
                    "preprocessing (users with >= min_tweets, 90/10 per-user split: 2 "
                    "tweets -> 1+1) or LEAF JSON (--data_dir); GloVe (glove_dim, "
                    "fetched, or --glove_path of any dimension) + LSTM 100x2",
        load_data=load_sent140, model_fn=model_fn, model_name="lstm", loss=models.BINARY_PROBS,
        defaults=DEFAULTS, task_args=TASK_ARGS,
        source="FedGroup (Duan et al.) Sent140 setting; LEAF Sent140 data/model/preprocessing"),
]
