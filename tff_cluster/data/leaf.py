"""LEAF-format JSON data: FEMNIST, FedProx MNIST, FedProx Synthetic, Sent140.

Format (LEAF, Caldas et al., "LEAF: A Benchmark for Federated Settings",
github.com/TalwalkarLab/leaf; FedProx, github.com/litian96/FedProx, uses the
same layout): a data directory holds `train/*.json` and `test/*.json`, each
file ::

    {"users": [u, ...], "num_samples": [n_u, ...],
     "user_data": {u: {"x": [...], "y": [...]}, ...}}

A dataset is sharded over several files (LEAF writes `all_data_<k>_..._train_9
.json`); a user's train and test samples sit in files of the same shard index,
so users are merged by id across all files of a split. Within one file a user
is listed once: a user listed twice in `users` is an error (its one
`user_data` entry would count twice). Undecodable, mistyped or duplicated
input is refused with a `DataError` of one line naming the file and the user.

Pixel and label conventions are kept as LEAF/FedProx wrote them:

* FEMNIST: 784 floats in [0, 1] per image (28x28 row-major), 1.0 = background
  (white paper) and 0.0 = ink, the inverse of Keras' MNIST; labels 0-61
  (0-9 digits, 10-35 upper case A-Z, 36-61 lower case a-z).
* FedProx MNIST: 784 floats standardized by FedProx's `generate_niid.py`
  (per-pixel (x - mean) / (std + 0.001)), so values are not in [0, 1];
  labels 0-9.
* FedProx Synthetic: 60 floats; labels 0-9, which FedProx stores as floats
  (4.0); they are converted to int (a non-integral label is an error).
* Sent140: x = [tweet id, date, query, user, text], y in {0, 1}; the text is
  tokenized like LEAF's `language_utils.split_line` and mapped to GloVe word
  ids (see `load_glove`, `tweet_to_ids`). GloVe may have any dimension, plain
  text or .gz. The raw Sentiment140 CSV is read by `tff_cluster.data.sent140`.

Train/test users: LEAF's `-t sample` split gives every user samples in both
splits, which clustered FL needs (every client is trained and evaluated). A
`-t user` split (disjoint users) is rejected by default; `unmatched="drop"`
drops one-sided users with a warning and `unmatched="split"` splits their
samples 90/10 like a single file.

A single JSON file (e.g. FedProx's `mytest.json`) has no train/test split:
with `split_single_file=True` (default) each user's samples are shuffled and
split 90/10 with `split_train_test`, seeded by `seed`.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import warnings
import zlib
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from tff_cluster.data import compact
from tff_cluster.data.federated import (DataError, FederatedData, open_data_file, packed,
                                        split_train_test)

# (client id, raw x list, raw y list) -> (x array, y array).
Parser = Callable[[str, list, list], Tuple[np.ndarray, np.ndarray]]

FEMNIST_NUM_CLASSES = 62
MNIST_NUM_CLASSES = 10
SYNTHETIC_NUM_CLASSES = 10
SYNTHETIC_NUM_FEATURES = 60
IMAGE_PIXELS = 784
SENT140_SEQ_LEN = 25
LEAF_JSON_MAX_BYTES = 4 << 30  # LEAF's largest files are a few hundred MB
GLOVE_FILE = "glove.6B.300d.txt"
GLOVE_SUFFIXES = (".txt", ".txt.gz")

# Where users get each dataset: appended to the "missing files" errors.
FEMNIST_HINT = (
    "make them with LEAF (github.com/TalwalkarLab/leaf): cd data/femnist && "
    "./preprocess.sh -s niid --sf 0.05 -k 0 -t sample, then pass "
    "--data_dir data/femnist/data; or leave --data_dir out to fetch TFF's "
    "federated EMNIST (all writers)")
FEDPROX_MNIST_HINT = (
    "make them with the FedProx repo (github.com/litian96/FedProx): "
    "python data/mnist/generate_niid.py, then pass --data_dir data/mnist/data")
FEDPROX_SYNTHETIC_HINT = (
    "make them with the FedProx repo (github.com/litian96/FedProx): "
    "python data/synthetic_1_1/generate_synthetic.py, then pass "
    "--data_dir data/synthetic_1_1/data (or one .json file)")
SENT140_HINT = (
    "make them with LEAF (github.com/TalwalkarLab/leaf): cd data/sent140 && "
    "./preprocess.sh -s niid --sf 0.3 -k 30 -t sample, then pass "
    "--data_dir data/sent140/data; or leave --data_dir out to fetch the "
    "Sentiment140 CSV")
GLOVE_HINT = (
    f"download glove.6B.zip from https://nlp.stanford.edu/projects/glove/ "
    f"(LEAF: data/sent140/get_embs.sh), unzip it and pass --glove_path "
    f".../{GLOVE_FILE}, or leave --glove_path out to fetch it")

UNMATCHED_CHOICES = ("error", "drop", "split")

RawUsers = Dict[str, Tuple[list, list]]


# ---------------------------------------------------------------------------
# Reading the JSON files.


def _natural_key(path: str):
  # all_data_2 before all_data_10, so the client order follows LEAF's shards.
  return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]


def _json_files(split_dir: str) -> List[str]:
  if not os.path.isdir(split_dir):
    return []
  names = [n for n in os.listdir(split_dir) if n.endswith(".json")]
  return [os.path.join(split_dir, n) for n in sorted(names, key=_natural_key)]


def _kind(value) -> str:
  # A JSON value's kind, in JSON's words, for the messages.
  if value is None:
    return "null"
  if isinstance(value, bool):
    return "a boolean"
  if isinstance(value, (int, float)):
    return f"the number {value!r}"
  if isinstance(value, str):
    return f"the text {value[:40]!r}"
  return "an object" if isinstance(value, dict) else "a list"


def _load_json(path: str):
  # The file's JSON value; DataError (one line, naming the file) for a file
  # that cannot be read, is not UTF-8 text, or is not JSON.
  try:
    with open_data_file(path, "rb", LEAF_JSON_MAX_BYTES, "a LEAF .json file") as f:
      raw = f.read()
  except OSError as e:
    raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise DataError(f"{path}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset "
                    f"{e.start}); expected a LEAF .json file (JSON text)") from None
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise DataError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
  except RecursionError:
    raise DataError(f"{path}: not valid LEAF JSON (nested too deeply); expected an "
                    f"object with keys 'users', 'num_samples', 'user_data'") from None


def read_leaf_file(path: str) -> RawUsers:
  """Reads one LEAF JSON file: user id -> (raw x list, raw y list).

  Raises DataError (one line naming the file, and the user where there is
  one) for a file that is not UTF-8 JSON, a missing top-level key, a value of
  the wrong kind (`users` not a list of ids, `num_samples` not a list of
  counts, `user_data` not an object, a user's `x`/`y` not lists), a user
  listed twice in `users`, or a user in `users` without an entry in
  `user_data`.
  """
  blob = _load_json(path)
  if not isinstance(blob, dict):
    raise DataError(f"{path}: the file holds {_kind(blob)}; expected a JSON object "
                    f"with keys 'users', 'num_samples', 'user_data'")
  for key in ("users", "user_data"):
    if key not in blob:
      raise DataError(f"{path}: missing key {key!r} (LEAF files have 'users', "
                      f"'num_samples', 'user_data')")
  users, user_data = blob["users"], blob["user_data"]
  counts = blob.get("num_samples")
  if not isinstance(users, list):
    raise DataError(f"{path}: 'users' is {_kind(users)}; expected a list of user ids")
  if not isinstance(user_data, dict):
    raise DataError(f"{path}: 'user_data' is {_kind(user_data)}; expected an object "
                    f"mapping each user id to {{\"x\": [...], \"y\": [...]}}")
  if counts is not None and not isinstance(counts, list):
    raise DataError(f"{path}: 'num_samples' is {_kind(counts)}; expected a list of "
                    f"sample counts, one per user in 'users'")
  if counts is not None and len(counts) != len(users):
    raise DataError(f"{path}: 'num_samples' has {len(counts)} entries but "
                    f"'users' has {len(users)}")
  out: RawUsers = {}
  first_entry: Dict[str, int] = {}
  for i, user in enumerate(users):
    if isinstance(user, bool) or not isinstance(user, (str, int)):
      raise DataError(f"{path}: users[{i}] is {_kind(user)}; expected a user id "
                      f"(a string)")
    user = str(user)
    if user in first_entry:
      raise DataError(f"{path}: user {user!r} is listed twice in 'users' (entries "
                      f"{first_entry[user]} and {i}); valid: each user once")
    first_entry[user] = i
    if user not in user_data:
      raise DataError(f"{path}: user {user!r} is in 'users' but missing from "
                      f"'user_data'")
    record = user_data[user]
    for key in ("x", "y"):
      if not isinstance(record, dict) or key not in record:
        raise DataError(f"{path}: user {user!r}: missing key {key!r} in "
                        f"'user_data'")
    x, y = record["x"], record["y"]
    for key, value in (("x", x), ("y", y)):
      if not isinstance(value, list):
        raise DataError(f"{path}: user {user!r}: {key!r} is {_kind(value)}; expected "
                        f"a list with one entry per sample")
    if len(x) != len(y):
      raise DataError(f"{path}: client {user!r} has {len(x)} inputs (x) but "
                      f"{len(y)} labels (y)")
    if counts is not None:
      count = counts[i]
      if isinstance(count, bool) or not isinstance(count, int):
        raise DataError(f"{path}: client {user!r}: num_samples[{i}] is "
                        f"{_kind(count)}; expected its number of samples, {len(y)}")
      if count != len(y):
        raise DataError(f"{path}: client {user!r}: num_samples says {count} "
                        f"but it has {len(y)} samples")
    out[user] = (list(x), list(y))
  return out


class _SplitUsers(dict):
  """RawUsers of one split, with the files each user was read from (named by
  the errors of its samples)."""

  def __init__(self):
    super().__init__()
    self.sources: Dict[str, List[str]] = {}


def _read_split(files: Sequence[str]) -> RawUsers:
  # Merges users across the shards of one split (first-appearance order).
  merged = _SplitUsers()
  for path in files:
    for user, (x, y) in read_leaf_file(path).items():
      if user in merged:
        merged[user] = (merged[user][0] + x, merged[user][1] + y)
        merged.sources[user].append(path)
      else:
        merged[user] = (x, y)
        merged.sources[user] = [path]
  return merged


def _in_files(split: RawUsers, user: str, error: DataError) -> DataError:
  # `error` (about one user's samples) prefixed with the file(s) it came from.
  files = getattr(split, "sources", {}).get(user)
  return DataError(f"{', '.join(files)}: {error}") if files else error


def _parsed(parser: Parser, split: RawUsers, user: str, x: list, y: list):
  # parser(user, x, y); its DataError names the user's file(s).
  try:
    return parser(user, x, y)
  except DataError as e:
    raise _in_files(split, user, e) from None


def read_leaf(path: str, hint: str = ""
              ) -> Tuple[RawUsers, Optional[RawUsers]]:
  """Reads a LEAF directory (train/ + test/) or one JSON file.

  Returns (train users, test users); test is None for a single file.
  `hint` (where users get the data) is appended to missing-file errors.
  """
  suffix = f"; {hint}" if hint else ""
  expected = "train/*.json and test/*.json (or one LEAF .json file)"
  if path is None or not str(path):
    raise DataError(f"no data path given: pass --data_dir, a directory with "
                    f"{expected}{suffix}")
  path = os.path.expanduser(str(path))
  if os.path.isfile(path):
    return _read_split([path]), None
  if not os.path.isdir(path):
    raise DataError(f"{path} does not exist: expected a directory with "
                    f"{expected}{suffix}")
  train_files = _json_files(os.path.join(path, "train"))
  test_files = _json_files(os.path.join(path, "test"))
  missing = [name for name, files in (("train/*.json", train_files),
                                      ("test/*.json", test_files)) if not files]
  if missing:
    raise DataError(f"{path}: no {' or '.join(missing)} found: expected "
                    f"{expected}{suffix}")
  return _read_split(train_files), _read_split(test_files)


# ---------------------------------------------------------------------------
# Per-dataset parsers.


def _labels(client: str, y: list, num_classes: int) -> np.ndarray:
  """Integer labels in [0, num_classes), one number per sample; float labels
  must be integral."""
  try:
    arr = np.asarray(y, dtype=np.float64)
  except (TypeError, ValueError):
    arr = None
  if arr is None or arr.ndim != 1:
    bad = next((i for i, v in enumerate(y) if isinstance(v, bool) or not isinstance(
        v, (int, float))), 0)
    raise DataError(f"client {client!r}: label {bad} is {_kind(y[bad])}; expected "
                    f"an integer in 0..{num_classes - 1}")
  bad = ~np.isfinite(arr) | (arr != np.round(arr))
  if bad.any():
    raise DataError(f"client {client!r}: label {y[int(np.argmax(bad))]!r} is "
                    f"not an integer")
  out = arr.astype(np.int64)
  bad = (out < 0) | (out >= num_classes)
  if bad.any():
    raise DataError(f"client {client!r}: label {out[int(np.argmax(bad))]} is out "
                    f"of range 0..{num_classes - 1}")
  return out


def _bad_sample(client: str, x: list, num_features: int) -> DataError:
  # The error naming x's first sample that is not `num_features` numbers.
  for i, sample in enumerate(x):
    if not isinstance(sample, list):
      got = _kind(sample)
    elif len(sample) != num_features:
      got = f"{len(sample)} values"
    else:
      bad = next((v for v in sample if isinstance(v, bool)
                  or not isinstance(v, (int, float))), None)
      if bad is None and not any(isinstance(v, bool) for v in sample):
        continue
      got = f"a value that is {_kind(bad)}"
    return DataError(f"client {client!r}: expected {num_features} features per sample "
                     f"(numbers); sample {i} of x has {got}")
  return DataError(f"client {client!r}: expected {num_features} features per sample "
                   f"(numbers)")


def dense_parser(num_features: int, num_classes: int) -> Parser:
  """Parser for fixed-length float feature vectors (images, synthetic)."""
  def parse(client: str, x: list, y: list):
    try:
      arr = np.asarray(x, dtype=np.float32)
    except (TypeError, ValueError):
      raise _bad_sample(client, x, num_features) from None
    if len(x) == 0:
      arr = arr.reshape(0, num_features)
    if arr.ndim != 2 or arr.shape[1] != num_features:
      raise _bad_sample(client, x, num_features)
    if not np.isfinite(arr).all():
      raise DataError(f"client {client!r}: x has NaN or infinite values")
    return arr, _labels(client, y, num_classes)
  return parse


# ---------------------------------------------------------------------------
# Building the FederatedData.


def load_leaf(path: str, parser: Parser, num_classes: int, *, name: str,
              hint: str = "", seed: int = 0, train_fraction: float = 0.9,
              split_single_file: bool = True, unmatched: str = "error",
              ) -> FederatedData:
  """LEAF directory or file -> FederatedData (client order: order in files).

  Args:
    path: directory with train/*.json and test/*.json, or one .json file.
    parser: (client, x, y) -> (x array, y array); validates the samples.
    num_classes: number of labels.
    name: dataset name for the description.
    hint: where users get the data (appended to missing-file errors).
    seed: seed of the 90/10 splits (single file, `unmatched="split"`).
    train_fraction: training share of those splits.
    split_single_file: a single file is split 90/10 per user; False makes a
      single file an error (it has no test split).
    unmatched: a user in only one of train/test: "error" (default), "drop"
      (warn and drop it) or "split" (split its samples 90/10).
  """
  return _assemble(path, read_leaf(path, hint), parser, num_classes, name=name,
                   seed=seed, train_fraction=train_fraction,
                   split_single_file=split_single_file, unmatched=unmatched)


def _assemble(path, raw, parser, num_classes, *, name, seed, train_fraction,
              split_single_file, unmatched):
  # read_leaf output -> FederatedData (see load_leaf).
  if unmatched not in UNMATCHED_CHOICES:
    raise ValueError(f"unmatched must be one of {UNMATCHED_CHOICES}, got "
                     f"{unmatched!r}")
  train_raw, test_raw = raw
  rng = np.random.default_rng(seed)
  client_ids, train, test, empty = [], {}, {}, []

  def add(user, tr, te):
    if len(tr[1]) == 0:  # nothing to train on: not a usable client.
      empty.append(user)
      return
    client_ids.append(user)
    train[user], test[user] = tr, te

  if test_raw is None:
    if not split_single_file:
      raise DataError(f"{path}: a single file has no train/test split; pass a "
                      f"directory with train/*.json and test/*.json or allow "
                      f"the 90/10 per-user split")
    for user, (x, y) in train_raw.items():
      xs, ys = _parsed(parser, train_raw, user, x, y)
      add(user, *split_train_test(xs, ys, rng, train_fraction))
    how = f"each user split {train_fraction:g}/{1 - train_fraction:g}"
  else:
    only_train = [u for u in train_raw if u not in test_raw]
    only_test = [u for u in test_raw if u not in train_raw]
    one_sided = set(only_train + only_test)
    if one_sided and unmatched == "error":
      side = "train" if only_train else "test"
      example = (only_train or only_test)[0]
      raise DataError(
          f"{path}: {len(one_sided)} users are in only one split (e.g. "
          f"{example!r} only in {side}/); clustered FL needs every client in "
          f"both: make the data with LEAF's '-t sample' split, or load with "
          f"unmatched='drop' or 'split'")
    if one_sided and unmatched == "drop":
      warnings.warn(f"{path}: dropping {len(one_sided)} users that are in only "
                    f"one of train/ and test/ (e.g. "
                    f"{(only_train or only_test)[0]!r})")
    for user, (x, y) in list(train_raw.items()) + [
        (u, test_raw[u]) for u in only_test]:
      if user in one_sided:
        if unmatched == "drop":
          continue
        side = train_raw if user in train_raw else test_raw
        xs, ys = _parsed(parser, side, user, x, y)
        add(user, *split_train_test(xs, ys, rng, train_fraction))
        continue
      add(user, _parsed(parser, train_raw, user, x, y),
          _parsed(parser, test_raw, user, *test_raw[user]))
    how = "LEAF train/test split"
  if empty:
    warnings.warn(f"{path}: skipping {len(empty)} clients with no training "
                  f"samples: {', '.join(repr(u) for u in empty[:5])}"
                  f"{' ...' if len(empty) > 5 else ''}")
  if not client_ids:
    raise DataError(f"{path}: no client has any training samples")
  return FederatedData(
      client_ids, train, test, num_classes,
      description=f"{name} (LEAF JSON, {path}), {len(client_ids)} clients, {how}")


def sample_clients(data: FederatedData, num_clients: Optional[int],
                   seed: int) -> FederatedData:
  """A seeded random subset of `num_clients` clients (file order kept);
  all clients when num_clients is None or not smaller than their number."""
  if num_clients is None or num_clients >= data.num_clients:
    return data
  if num_clients < 1:
    raise DataError(f"--num_clients must be >= 1, got {num_clients}")
  rng = np.random.default_rng(seed)
  keep = np.sort(rng.choice(data.num_clients, num_clients, replace=False))
  return data.subset([data.client_ids[i] for i in keep])


def compact_parser(parse: Parser) -> Parser:
  """`parse` whose inputs come as `compact.CodedArray`s where every value is
  k/255 (8-bit images), bit for bit the same float32 values when read."""
  def compacted(client: str, x: list, y: list):
    arr, labels = parse(client, x, y)
    return compact.compact(arr), labels
  return compacted


def load_femnist(path: str, seed: int = 0, **kwargs) -> FederatedData:
  """LEAF FEMNIST: x [n, 784] float32 in [0, 1] (1.0 = background), y 0-61,
  kept as 8-bit codes (`compact_parser`) in one buffer a split (`packed`)."""
  return packed(load_leaf(path, compact_parser(dense_parser(IMAGE_PIXELS, FEMNIST_NUM_CLASSES)),
                   FEMNIST_NUM_CLASSES, name="FEMNIST", hint=FEMNIST_HINT,
                   seed=seed, **kwargs))


def load_fedprox_mnist(path: str, seed: int = 0, **kwargs) -> FederatedData:
  """FedProx MNIST (LEAF JSON): x [n, 784] float32 (standardized), y 0-9."""
  return load_leaf(path, dense_parser(IMAGE_PIXELS, MNIST_NUM_CLASSES),
                   MNIST_NUM_CLASSES, name="FedProx MNIST",
                   hint=FEDPROX_MNIST_HINT, seed=seed, **kwargs)


def load_fedprox_synthetic(path: str, seed: int = 0, **kwargs) -> FederatedData:
  """FedProx Synthetic (LEAF JSON): x [n, 60] float32, y 0-9 (float -> int)."""
  return load_leaf(path, dense_parser(SYNTHETIC_NUM_FEATURES,
                                      SYNTHETIC_NUM_CLASSES),
                   SYNTHETIC_NUM_CLASSES, name="FedProx Synthetic",
                   hint=FEDPROX_SYNTHETIC_HINT, seed=seed, **kwargs)


# ---------------------------------------------------------------------------
# Sent140: tokens and GloVe.

# LEAF models/utils/language_utils.py `split_line`: words (with apostrophes)
# and a few punctuation marks are tokens.
_TOKEN_RE = re.compile(r"[\w']+|[.,!?;]")


def tokenize(text: str) -> List[str]:
  """Lower-cased word and punctuation tokens of a tweet."""
  return _TOKEN_RE.findall(str(text).lower())


def find_glove(path: Optional[str]) -> str:
  """The GloVe file to read: `path` itself, or the one `glove*.txt` /
  `glove*.txt.gz` file in the directory `path` (DataError when there is none
  or more than one, listing them)."""
  if not path:
    raise DataError(f"no GloVe file given: expected {GLOVE_FILE} or any "
                    f"glove*.txt[.gz] (any dimension, or its directory); "
                    f"{GLOVE_HINT}")
  path = os.path.expanduser(str(path))
  if os.path.isdir(path):
    found = sorted(n for n in os.listdir(path)
                   if n.lower().startswith("glove")
                   and n.lower().endswith(GLOVE_SUFFIXES)
                   and os.path.isfile(os.path.join(path, n)))
    if not found:
      raise DataError(f"{path}: no glove*.txt or glove*.txt.gz file in this "
                      f"directory; {GLOVE_HINT}")
    if len(found) > 1:
      raise DataError(f"{path}: {len(found)} GloVe files ({', '.join(found)}); "
                      f"valid: pass one of them as --glove_path")
    return os.path.join(path, found[0])
  if not os.path.isfile(path):
    raise DataError(f"GloVe file {path} not found: expected {GLOVE_FILE} or "
                    f"any glove*.txt[.gz]; {GLOVE_HINT}")
  return path


def _is_number(text: str) -> bool:
  try:
    float(text)
  except ValueError:
    return False
  return True


def _glove_lines(path: str):
  # (line number, line without its end) of a plain or gzip GloVe file.
  with open_data_file(path, "rb", expected="GloVe vectors (text, plain or .gz)") as raw:
    binary = gzip.GzipFile(fileobj=raw) if path.lower().endswith(".gz") else raw
    with io.TextIOWrapper(binary, encoding="utf-8", errors="replace") as f:
      for lineno, line in enumerate(f, 1):
        yield lineno, line.rstrip("\r\n").rstrip(" ")


def check_glove(path: str, dim: int) -> None:
  """Raises a DataError unless the first line of `path` is a word and `dim`
  numbers: the check of a fetched GloVe file."""
  try:
    first = next((line for _, line in _glove_lines(path) if line), "")
  except (OSError, EOFError, zlib.error) as e:
    raise DataError(f"{path}: cannot read ({e.__class__.__name__}: {e})") from None
  parts = first.split(" ")
  if len(parts) != dim + 1 or not all(_is_number(v) for v in parts[1:]):
    raise DataError(f"{path} line 1: expected a word and {dim} numbers, got "
                    f"{len(parts) - 1} fields")


def load_glove(path: Optional[str], dim: Optional[int] = None,
               words: Optional[Iterable[str]] = None
               ) -> Tuple[Dict[str, int], np.ndarray]:
  """Reads GloVe vectors: text lines `word v1 ... v<dim>`, plain or `.gz`.

  `path` is the file or a directory holding one `glove*.txt[.gz]` (see
  `find_glove`). `dim=None` takes the dimension from the first line; every
  line must then have it (a DataError names the file and line otherwise).
  Returns (vocab, embedding): vocab maps word -> row of `embedding`
  (float32, [len(vocab) + 2, dim]); row 0 is padding and the last row is
  the unknown word, both zeros. With `words`, only those words are kept
  (Sent140 passes the tokens its tweets use, so the matrix stays small).
  """
  path = find_glove(path)
  keep = None if words is None else set(words)
  vocab: Dict[str, int] = {}
  vectors = []
  try:
    for lineno, line in _glove_lines(path):
      if not line:
        continue
      spaces = line.count(" ")
      if dim is None:
        parts = line.split(" ")
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
          raise DataError(f"{path} line {lineno}: {line!r} looks like a word2vec "
                          f"header; expected GloVe text, 'word v1 ... vD' per line")
        if spaces < 1:
          raise DataError(f"{path} line {lineno}: expected a word and its "
                          f"vector, got {line[:40]!r}")
        dim = spaces
      # Every line is checked for its width; a line with more fields is a
      # word containing spaces (some GloVe releases have them) unless its
      # second field is a number.
      if spaces < dim or (spaces > dim and _is_number(line.split(" ", 2)[1])):
        raise DataError(f"{path} line {lineno}: expected a word and {dim} "
                        f"numbers, got {spaces} numbers")
      # Cheap skip of unwanted words (400k lines in glove.6B) before splitting.
      if keep is not None and line.split(" ", 1)[0] not in keep:
        continue
      parts = line.split(" ")
      word = " ".join(parts[:-dim])
      if word in vocab or (keep is not None and word not in keep):
        continue
      try:
        vec = np.asarray(parts[-dim:], dtype=np.float32)
      except ValueError:
        raise DataError(f"{path} line {lineno}: non-numeric vector") from None
      if not np.isfinite(vec).all():  # nan, inf, or past float32's range (1e39)
        raise DataError(f"{path} line {lineno}: the vector of {word!r} has NaN or "
                        "infinite values (or numbers beyond float32's 3.4e38); valid: "
                        "finite numbers")
      vocab[word] = len(vectors) + 1
      vectors.append(vec)
  except (OSError, EOFError, zlib.error) as e:
    raise DataError(f"{path}: cannot read ({e.__class__.__name__}: {e}); "
                    f"expected GloVe text, plain or .gz") from None
  if dim is None:
    raise DataError(f"{path}: empty, no word vectors found")
  if keep is None and not vocab:
    raise DataError(f"{path}: no word vectors found")
  zero = np.zeros((1, dim), np.float32)  # row 0: padding; last: unknown word.
  return vocab, np.concatenate([zero, np.asarray(vectors, np.float32).reshape(
      -1, dim), zero])


def tweet_to_ids(text: str, vocab: Dict[str, int],
                 seq_len: int = SENT140_SEQ_LEN) -> np.ndarray:
  """First `seq_len` tokens as vocab ids (unknown = len(vocab) + 1), 0-padded."""
  unk = len(vocab) + 1
  ids = [vocab.get(t, unk) for t in tokenize(text)[:seq_len]]
  return np.asarray(ids + [0] * (seq_len - len(ids)), dtype=np.int32)


def _tweet_text(client: str, row) -> str:
  # LEAF sent140 x: [tweet id, date, query, user, text].
  if not isinstance(row, (list, tuple)) or len(row) < 5:
    raise DataError(f"client {client!r}: a Sent140 sample must be [id, date, "
                    f"query, user, text], got {str(row)[:60]!r}")
  return str(row[4])


def load_sent140(path: str, glove_path: Optional[str], seed: int = 0,
                 seq_len: int = SENT140_SEQ_LEN, dim: Optional[int] = None,
                 **kwargs) -> Tuple[FederatedData, np.ndarray]:
  """LEAF Sent140 JSON -> (FederatedData with int32 token ids [n, seq_len],
  y 0/1, embedding matrix [V + 2, dim] for those ids).

  The GloVe file is found before the JSON is parsed so a missing file fails
  fast; its dimension is read from the file unless `dim` is given. Only words
  occurring in the tweets are kept from GloVe. (The raw Sentiment140 CSV is
  read by `tff_cluster.data.sent140`.)
  """
  # Fail fast, before parsing JSON: a missing data path, then a missing GloVe.
  if not path or not os.path.exists(os.path.expanduser(str(path))):
    read_leaf(path, SENT140_HINT)  # raises the DataError naming the files.
  glove_path = find_glove(glove_path)  # raises the DataError naming the file.
  raw = read_leaf(path, SENT140_HINT)
  train_raw, test_raw = raw
  words = set()
  for split in (train_raw, test_raw or {}):
    for user, (x, _) in split.items():
      try:
        for row in x:
          words.update(tokenize(_tweet_text(user, row)))
      except DataError as e:
        raise _in_files(split, user, e) from None
  vocab, embedding = load_glove(glove_path, dim, words=words)

  def parse(client: str, x: list, y: list):
    ids = np.stack([tweet_to_ids(_tweet_text(client, r), vocab, seq_len)
                    for r in x]) if x else np.zeros((0, seq_len), np.int32)
    return ids, _labels(client, y, 2)

  options = dict(train_fraction=0.9, split_single_file=True, unmatched="error")
  options.update(kwargs)
  data = _assemble(path, raw, parse, 2, name="Sent140", seed=seed, **options)
  return data, embedding
