"""Sent140 from the raw Sentiment140 CSV, preprocessed the way LEAF does it.

The CSV is the Sentiment140 training file (`training.1600000.processed.
noemoticon.csv`, from trainingandtestdata.zip): no header, Latin-1, six
columns ::

    polarity (0 negative, 4 positive), tweet id, date, query, user, text

`load_sent140` also takes LEAF's own JSON (train/*.json and test/*.json, see
`tff_cluster.data.leaf`), which LEAF's `preprocess.sh` has already sampled,
filtered and split.

Fetched on first use (`tff_cluster.data.download`), when no path is given:
the CSV (Stanford's trainingandtestdata.zip, checked against the SHA-256 that
TensorFlow Datasets publishes; only the training CSV is kept) and GloVe
(glove.6B.zip; only `glove.6B.<d>d.txt` of the dimension asked for is kept,
300 by default, the papers'). TensorFlow Datasets' `sentiment140` builder is
not used: it is not a dependency, it downloads the same archive, and it keeps
its own copy as TFRecords, whose rows this module would have to read back
into LEAF's steps; the raw CSV is what those steps start from.

Which file `--data_dir` means:

* a `.csv` file: that file; a `.json` file: one LEAF JSON file.
* a directory with train/*.json and test/*.json: LEAF JSON (any CSV beside
  them is ignored).
* otherwise a directory with CSVs: `training.1600000.processed.noemoticon.csv`
  when present, else the one `*.csv` whose name does not start with `test`
  (which leaves out the official manual test set `testdata.manual.2009.06.14.
  csv`, polarity 0/2/4, and LEAF's copy of it, `raw_data/test.csv`). Several
  candidates are an error that lists them.

LEAF's preprocessing (github.com/TalwalkarLab/leaf, data/sent140/preprocess/
data_to_json.py, data/utils/sample.py, remove_users.py, split_data.py), in
its order:

1. Group by user: tweets are grouped by the user column, users in sorted
   order, each user's tweets in file order; x = [id, date, query, user, text],
   y = 1 for polarity 4 and 0 for polarity 0. (LEAF maps every polarity but 4
   to 0 and also appends the 498 manual test tweets, 139 of them neutral, to
   the training ones; here only 0 and 4 are valid and the test file is not
   read.)
2. Sample (`sample_fraction`, LEAF's `--sf`, non-i.i.d. mode): the fraction
   counts tweets, not users. Users are drawn in a seeded random order until
   int(fraction * all tweets) tweets are taken; the last user drawn keeps only
   its first tweets that fill the count. 1.0 keeps every user and tweet.
3. Remove users (`min_tweets`, LEAF's `-k`): users with fewer tweets (after
   sampling) are dropped.
4. Split each user's tweets (LEAF's `-t sample`, `--tf 0.9`): users with
   fewer than 2 tweets are dropped; a user with n >= 2 tweets gets
   max(1, int(0.9 * n)) random training tweets, and exactly 1 when n == 2;
   the rest are its test tweets. So 2 tweets -> 1 train + 1 test, 3 -> 2 + 1,
   10 -> 9 + 1, 20 -> 18 + 2. Both sides keep file order.

Users stay in sorted order (LEAF writes them in its sampling order). The
draws use numpy generators seeded by `seed` (one stream for the sample, one
for the split), not LEAF's Python `random` stream, so the same seed number
does not pick LEAF's tweets.
"""

from __future__ import annotations

import csv
import functools
import os
from typing import Dict, List, Optional, Tuple

import numpy as np

from tff_cluster.data import download, leaf
from tff_cluster.data.federated import DataError, FederatedData, open_data_file

TRAINING_CSV = "training.1600000.processed.noemoticon.csv"
COLUMNS = ("polarity", "tweet id", "date", "query", "user", "text")
POLARITY_LABELS = {"0": 0, "4": 1}
TRAIN_FRACTION = 0.9  # LEAF split_data.py --frac default.
DEFAULT_MIN_TWEETS = 3  # LEAF's small-sized sent140 command: -k 3.
DEFAULT_SAMPLE_FRACTION = 1.0
DEFAULT_GLOVE_DIM = 300  # the papers' (FedGroup, LEAF): glove.6B.300d.txt

CSV_HINT = (
    f"the raw CSV is {TRAINING_CSV} from trainingandtestdata.zip "
    f"({download.SENT140_CSV.origin})")
EXPECTED = (f"train/*.json and test/*.json (LEAF JSON) or the raw Sentiment140 "
            f"CSV ({TRAINING_CSV} or one *.csv not named test*)")

# user -> (x rows [id, date, query, user, text], labels 0/1), file order.
Users = Dict[str, Tuple[List[list], List[int]]]


# ---------------------------------------------------------------------------
# Which file.


def find_data(path: Optional[str]) -> Tuple[str, str]:
  """("json" | "csv", path) for `--data_dir` (see the module docstring)."""
  if path is None or not str(path):
    raise DataError(f"no data path given: pass --data_dir, a directory with "
                    f"{EXPECTED}; {leaf.SENT140_HINT}; or {CSV_HINT}")
  path = os.path.expanduser(str(path))
  if os.path.isfile(path):
    if path.lower().endswith(".csv"):
      return "csv", path
    if path.lower().endswith(".json"):
      return "json", path
    raise DataError(f"{path}: not a .csv or .json file; expected {EXPECTED}")
  if not os.path.isdir(path):
    raise DataError(f"{path} does not exist: expected a directory with "
                    f"{EXPECTED}; {leaf.SENT140_HINT}; or {CSV_HINT}")
  if (leaf._json_files(os.path.join(path, "train"))
      and leaf._json_files(os.path.join(path, "test"))):
    return "json", path
  csvs = sorted(n for n in os.listdir(path) if n.lower().endswith(".csv")
                and os.path.isfile(os.path.join(path, n)))
  if TRAINING_CSV in csvs:
    return "csv", os.path.join(path, TRAINING_CSV)
  candidates = [n for n in csvs if not n.lower().startswith("test")]
  if len(candidates) == 1:
    return "csv", os.path.join(path, candidates[0])
  if len(candidates) > 1:
    raise DataError(
        f"{path}: {len(candidates)} candidate training CSVs "
        f"({', '.join(candidates)}); valid: one *.csv not named test*, or one "
        f"named {TRAINING_CSV}, or the file itself as --data_dir")
  if os.path.isdir(os.path.join(path, "train")) or os.path.isdir(
      os.path.join(path, "test")):
    leaf.read_leaf(path, leaf.SENT140_HINT)  # names the missing JSON split.
  skipped = f" (test* files such as {csvs[0]} are not training data)" if csvs else ""
  raise DataError(f"{path}: no LEAF JSON and no training CSV{skipped}: expected "
                  f"{EXPECTED}; {leaf.SENT140_HINT}; or {CSV_HINT}")


# ---------------------------------------------------------------------------
# Reading the CSV.


def read_csv(path: str) -> Users:
  """The CSV's tweets grouped by user (users sorted, tweets in file order).

  Raises a DataError naming the file and line for a row without exactly six
  columns, a polarity other than 0 or 4, an empty user, binary content (a NUL
  byte) or CSV syntax errors, and for a file with no rows.
  """
  users: Users = {}
  try:
    with open_data_file(path, "r", expected="the Sentiment140 CSV", encoding="latin-1",
                        newline="") as f:
      reader = csv.reader(f)
      for row in _rows(reader, path):
        label = POLARITY_LABELS.get(row[0].strip())
        if label is None:
          raise DataError(
              f"{path} line {reader.line_num}: polarity {row[0][:20]!r}; valid: 0 "
              f"(negative) or 4 (positive) (2, neutral, is only in the manual "
              f"test set, which is not training data)")
        user = row[4]
        if not user:
          raise DataError(f"{path} line {reader.line_num}: empty user column "
                          f"(column 5 of {', '.join(COLUMNS)})")
        x, y = users.setdefault(user, ([], []))
        x.append(row[1:])
        y.append(label)
  except OSError as e:
    raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
  if not users:
    raise DataError(f"{path}: no rows; expected the Sentiment140 CSV, rows of "
                    f"{', '.join(COLUMNS)} (no header, Latin-1)")
  return {u: users[u] for u in sorted(users)}


def _rows(reader, path):
  # Non-blank rows, checked for width and binary content.
  while True:
    try:
      row = next(reader)
    except StopIteration:
      return
    except csv.Error as e:
      raise DataError(f"{path} line {reader.line_num}: not CSV ({e}); expected "
                      f"the Sentiment140 CSV (Latin-1 text)") from None
    if not row:
      continue
    if any("\x00" in field for field in row):
      raise DataError(f"{path} line {reader.line_num}: binary data (a NUL "
                      f"byte), not the Sentiment140 CSV (Latin-1 text)")
    if len(row) != len(COLUMNS):
      raise DataError(f"{path} line {reader.line_num}: expected {len(COLUMNS)} "
                      f"columns ({', '.join(COLUMNS)}), got {len(row)}")
    yield row


def check_csv(path: str) -> None:
  """Raises a DataError unless the first row of `path` is a Sentiment140 row
  (six columns, polarity 0 or 4): the check of a fetched CSV."""
  try:
    with open_data_file(path, "r", expected="the Sentiment140 CSV", encoding="latin-1",
                        newline="") as f:
      reader = csv.reader(f)
      row = next(_rows(reader, path), None)
  except OSError as e:
    raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
  if row is None or row[0].strip() not in POLARITY_LABELS:
    raise DataError(f"{path}: not the Sentiment140 CSV (rows of "
                    f"{', '.join(COLUMNS)}, polarity 0 or 4)")


def fetch_csv() -> str:
  """The path of the Sentiment140 training CSV: from a cache, or fetched."""
  return download.fetch(download.SENT140_CSV, check_csv)


def fetch_glove(dim: int = DEFAULT_GLOVE_DIM) -> str:
  """The path of `glove.6B.<dim>d.txt`: from a cache, or fetched."""
  return download.fetch(download.glove(dim), functools.partial(leaf.check_glove, dim=dim))


# ---------------------------------------------------------------------------
# LEAF's sample, remove-users and split steps.


def sample_users(users: Users, fraction: float, rng: np.random.Generator
                 ) -> Users:
  """LEAF's non-i.i.d. sample: whole users in random order until
  int(fraction * total tweets) tweets; the last one keeps its first tweets
  that fill the count. Users stay in their input order."""
  if fraction >= 1.0:
    return users
  names = list(users)
  target = int(fraction * sum(len(y) for _, y in users.values()))
  kept: Dict[str, int] = {}
  count = 0
  for i in rng.permutation(len(names)):
    if count >= target:
      break
    n = min(len(users[names[i]][1]), target - count)
    kept[names[i]] = n
    count += n
  return {u: (users[u][0][:kept[u]], users[u][1][:kept[u]])
          for u in names if u in kept}


def remove_users(users: Users, min_tweets: int) -> Users:
  """LEAF's remove_users: users with at least `min_tweets` tweets."""
  return {u: xy for u, xy in users.items() if len(xy[1]) >= min_tweets}


def num_train(n: int, train_fraction: float = TRAIN_FRACTION) -> int:
  """Training tweets of a user with n >= 2 tweets (LEAF split_data.py,
  sample mode): max(1, int(train_fraction * n)), and 1 when n == 2."""
  return 1 if n == 2 else max(1, int(train_fraction * n))


def split_users(users: Users, rng: np.random.Generator,
                train_fraction: float = TRAIN_FRACTION
                ) -> Tuple[Users, Users]:
  """LEAF's per-user split: (train, test) users; users with < 2 tweets are
  dropped; random training tweets (`num_train`), both sides in file order."""
  train: Users = {}
  test: Users = {}
  for user, (x, y) in users.items():
    n = len(y)
    if n < 2:
      continue
    chosen = np.zeros(n, bool)
    chosen[rng.choice(n, num_train(n, train_fraction), replace=False)] = True
    if chosen.all():  # a train_fraction of 1 would leave no test tweet.
      continue
    train[user] = ([x[i] for i in range(n) if chosen[i]],
                   [y[i] for i in range(n) if chosen[i]])
    test[user] = ([x[i] for i in range(n) if not chosen[i]],
                  [y[i] for i in range(n) if not chosen[i]])
  return train, test


# ---------------------------------------------------------------------------
# Loading.


def _ids(tokens: List[str], vocab: Dict[str, int], seq_len: int) -> np.ndarray:
  unk = len(vocab) + 1
  ids = [vocab.get(t, unk) for t in tokens[:seq_len]]
  return np.asarray(ids + [0] * (seq_len - len(ids)), np.int32)


def load_csv(path: str, glove_path: Optional[str], seed: int = 0,
             min_tweets: int = DEFAULT_MIN_TWEETS,
             sample_fraction: float = DEFAULT_SAMPLE_FRACTION,
             seq_len: int = leaf.SENT140_SEQ_LEN, dim: Optional[int] = None
             ) -> Tuple[FederatedData, np.ndarray]:
  """Raw Sentiment140 CSV -> (FederatedData, GloVe embedding matrix), with
  LEAF's sample / remove-users / split steps (module docstring). x holds the
  first `seq_len` tokens of each tweet as GloVe row ids (0 = padding, last row
  = unknown word), y is 0/1 int64. The GloVe dimension is the file's; a
  `dim` given must be it."""
  if not 0 < sample_fraction <= 1:
    raise DataError(f"invalid sample_fraction={sample_fraction}; valid: a "
                    f"number in (0, 1]")
  if min_tweets < 0:
    raise DataError(f"invalid min_tweets={min_tweets}; valid: an integer >= 0")
  glove_path = leaf.find_glove(glove_path)  # fail fast, before the CSV.
  users = read_csv(path)
  total = sum(len(y) for _, y in users.values())
  sampled = sample_users(users, sample_fraction, np.random.default_rng([seed, 0]))
  if not sampled:
    raise DataError(f"{path}: sample_fraction={sample_fraction:g} keeps no "
                    f"tweet of {total}; valid: a larger sample_fraction")
  kept = remove_users(sampled, min_tweets)
  train, test = split_users(kept, np.random.default_rng([seed, 1]))
  if not train:
    most = max(len(y) for _, y in sampled.values())
    valid = (f"min_tweets <= {most}" if most >= 2 else
             "a larger sample_fraction (LEAF's split needs 2 tweets per user)")
    raise DataError(
        f"{path}: min_tweets={min_tweets} with sample_fraction="
        f"{sample_fraction:g} leaves no user with 2 or more tweets (the most "
        f"any user has is {most}); valid: {valid}")
  tokens = {u: [[leaf.tokenize(r[4]) for r in split[u][0]]
                for split in (train, test)] for u in train}
  words = {t for per_split in tokens.values() for rows in per_split
           for toks in rows for t in toks}
  vocab, embedding = leaf.load_glove(glove_path, dim, words=words)

  def arrays(rows, labels):
    return (np.stack([_ids(t, vocab, seq_len) for t in rows]),
            np.asarray(labels, np.int64))

  client_ids = list(train)
  data = FederatedData(
      client_ids,
      {u: arrays(tokens[u][0], train[u][1]) for u in client_ids},
      {u: arrays(tokens[u][1], test[u][1]) for u in client_ids}, 2,
      description=(
          f"Sent140 (raw CSV {path}, {len(users)} users / {total} tweets; LEAF "
          f"preprocessing: sample_fraction={sample_fraction:g}, min_tweets="
          f"{min_tweets}, per-user {TRAIN_FRACTION:g} split), "
          f"{len(client_ids)} users, GloVe {embedding.shape[1]}-d, "
          f"{len(vocab)} words"))
  return data, embedding


def load_sent140(path: Optional[str] = None, glove_path: Optional[str] = None,
                 seed: int = 0, min_tweets: Optional[int] = None,
                 sample_fraction: Optional[float] = None,
                 seq_len: int = leaf.SENT140_SEQ_LEN,
                 glove_dim: Optional[int] = None
                 ) -> Tuple[FederatedData, np.ndarray]:
  """Sent140 from LEAF JSON or the raw CSV (`find_data`).

  `path=None` fetches the CSV and `glove_path=None` GloVe 6B of `glove_dim`
  (None: 300) (module docstring); a `glove_dim` given with a `glove_path`
  must be that file's dimension (None: whatever it is). `min_tweets` /
  `sample_fraction` (None = not given: 3 and 1.0) apply to the CSV only;
  LEAF JSON is already sampled and filtered, so giving either with it is a
  DataError.
  """
  kind, path = find_data(path) if path else ("csv", fetch_csv())
  if kind == "json":
    given = [f"{name}={value:g}" for name, value in (
        ("min_tweets", min_tweets), ("sample_fraction", sample_fraction))
             if value is not None]
    if given:
      raise DataError(
          f"task arg {', '.join(given)}: applies to the raw Sentiment140 CSV "
          f"only; {path} "
          f"is LEAF JSON, already sampled and filtered by LEAF's preprocess.sh "
          f"(--sf, -k); valid: leave it out, or pass the CSV as --data_dir")
  if not glove_path:
    glove_dim = glove_dim or DEFAULT_GLOVE_DIM
    glove_path = fetch_glove(glove_dim)
  if kind == "json":
    return leaf.load_sent140(path, glove_path, seed=seed, seq_len=seq_len, dim=glove_dim)
  return load_csv(path, glove_path, seed=seed,
                  min_tweets=DEFAULT_MIN_TWEETS if min_tweets is None else min_tweets,
                  sample_fraction=(DEFAULT_SAMPLE_FRACTION if sample_fraction is None
                                   else sample_fraction),
                  seq_len=seq_len, dim=glove_dim)
