"""Sent140 from the raw Sentiment140 CSV (LEAF's preprocessing) and GloVe of
any dimension: the reader on small files and on the real partial corpus in
../shared/data/sent140_partial (skipped when absent), and bad input through
the CLI (one line, exit 2)."""

from __future__ import annotations

import collections
import csv
import gzip
from pathlib import Path

import numpy as np
import pytest

from tff_cluster import tasks
from tff_cluster.tasks import sent140 as sent140_task
from tests.conftest import SHARED_DATA
from tests.helpers import main_in_process
from tests.helpers import assert_one_line_error
from tff_cluster.data import leaf
from tff_cluster.data import sent140
from tff_cluster.data.federated import DataError
from tff_cluster.spec.task import DataOptions

PARTIAL = SHARED_DATA / "sent140_partial"
PARTIAL_CSV = PARTIAL / "sent140_train_partial_union.csv"
SPEC = tasks.registry()["sent140"]


def _row(polarity, user, text, tweet_id="1"):
  return [str(polarity), tweet_id, "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", user, text]


def write_csv(path: Path, rows) -> Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, "w", encoding="latin-1", newline="") as f:
    csv.writer(f, quoting=csv.QUOTE_ALL).writerows(rows)
  return path


def write_glove(path: Path, words, dim=4, bad_line=None) -> Path:
  lines = [f"{w} " + " ".join(f"{0.5 * i + j:.1f}" for j in range(dim))
           for i, w in enumerate(words)]
  if bad_line is not None:
    lines[bad_line - 1] = lines[bad_line - 1].rsplit(" ", 1)[0]  # one number short
  text = "".join(line + "\n" for line in lines)
  path.parent.mkdir(parents=True, exist_ok=True)
  if str(path).endswith(".gz"):
    path.write_bytes(gzip.compress(text.encode("utf-8")))
  else:
    path.write_text(text, encoding="utf-8")
  return path


WORDS = ["i", "love", "hate", "it", "good", "bad", "day", ",", "!"]

# bob 2 tweets, carol 5, dave 1, ann 3 (file order is not user order).
SMALL_ROWS = [
    _row(4, "bob", "I love it", "10"), _row(0, "carol", "bad day", "11"),
    _row(0, "ann", "hate it", "12"), _row(4, "carol", "good day", "13"),
    _row(0, "bob", "bad, bad", "14"), _row(4, "dave", "love", "15"),
    _row(4, "carol", "love it!", "16"), _row(4, "ann", "good", "17"),
    _row(0, "carol", "hate", "18"), _row(4, "ann", "love it", "19"),
    _row(0, "carol", "bad", "20")]


@pytest.fixture
def small(tmp_path):
  return (write_csv(tmp_path / "data" / "tweets.csv", SMALL_ROWS),
          write_glove(tmp_path / "glove" / "glove.test.4d.txt", WORDS))


# ---------------------------------------------------------------------------
# LEAF's rules on small files.


def test_read_csv_groups_by_sorted_user_and_maps_polarity(small):
  users = sent140.read_csv(str(small[0]))
  assert list(users) == ["ann", "bob", "carol", "dave"]
  x, y = users["carol"]
  assert [r[0] for r in x] == ["11", "13", "16", "18", "20"]  # file order
  assert y == [0, 1, 1, 0, 0]  # polarity 4 -> 1, 0 -> 0
  assert x[0] == ["11", "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", "carol", "bad day"]


@pytest.mark.parametrize("n,train", [(2, 1), (3, 2), (4, 3), (5, 4), (9, 8), (10, 9),
                                     (11, 9), (20, 18), (25, 22)])
def test_num_train_rounds_like_leaf_split(n, train):
  assert sent140.num_train(n) == train


def test_split_keeps_file_order_and_drops_single_tweet_users(small):
  users = sent140.read_csv(str(small[0]))
  train, test = sent140.split_users(users, np.random.default_rng(0))
  assert list(train) == list(test) == ["ann", "bob", "carol"]  # dave: 1 tweet
  assert [len(train[u][1]) for u in train] == [2, 1, 4]
  assert [len(test[u][1]) for u in test] == [1, 1, 1]
  for user in train:
    ids = [r[0] for r in train[user][0]] + [r[0] for r in test[user][0]]
    assert sorted(ids) == [r[0] for r in users[user][0]]
    assert [r[0] for r in train[user][0]] == sorted(r[0] for r in train[user][0])


def test_loader_applies_min_tweets_then_split(small):
  data, emb = sent140.load_sent140(str(small[0]), str(small[1]), min_tweets=3)
  assert data.client_ids == ["ann", "carol"]
  assert list(data.num_train_samples()) == [2, 4]
  assert list(data.num_test_samples()) == [1, 1]
  # Only the words of the kept users' tweets: hate it good love bad day !
  assert emb.shape == (7 + 2, 4)
  x, y = data.train["carol"]
  assert x.shape == (4, 25) and x.dtype == np.int32 and set(y) <= {0, 1}
  data, _ = sent140.load_sent140(str(small[0]), str(small[1]), min_tweets=0)
  assert data.client_ids == ["ann", "bob", "carol"]  # the split drops dave
  assert data.train["bob"][1].shape == data.test["bob"][1].shape == (1,)


def test_sample_fraction_counts_tweets_of_whole_users_seeded():
  users = {f"u{i:02d}": ([[str(i)]] * (i + 1), [0] * (i + 1)) for i in range(20)}
  total = sum(i + 1 for i in range(20))  # 210
  picks = []
  for seed in (0, 0, 1):
    got = sent140.sample_users(users, 0.3, np.random.default_rng(seed))
    assert sum(len(y) for _, y in got.values()) == int(0.3 * total)
    full = [u for u in got if len(got[u][1]) == len(users[u][1])]
    assert len(got) - len(full) <= 1  # only the last user drawn is cut
    assert list(got) == sorted(got)
    picks.append(sorted(got))
  assert picks[0] == picks[1] and picks[0] != picks[2]
  assert sent140.sample_users(users, 1.0, np.random.default_rng(0)) is users


def test_find_data_prefers_the_official_name_and_skips_test_files(tmp_path):
  rows = [_row(0, "a", "x")]
  write_csv(tmp_path / "testdata.manual.2009.06.14.csv", [_row(2, "a", "x")])
  with pytest.raises(DataError, match="no LEAF JSON and no training CSV"):
    sent140.find_data(str(tmp_path))
  write_csv(tmp_path / "mine.csv", rows)
  assert sent140.find_data(str(tmp_path)) == ("csv", str(tmp_path / "mine.csv"))
  write_csv(tmp_path / "other.csv", rows)
  with pytest.raises(DataError, match=r"2 candidate training CSVs \(mine.csv, other.csv\)"):
    sent140.find_data(str(tmp_path))
  write_csv(tmp_path / sent140.TRAINING_CSV, rows)
  assert sent140.find_data(str(tmp_path))[1].endswith(sent140.TRAINING_CSV)
  assert sent140.find_data(str(tmp_path / "other.csv")) == ("csv", str(tmp_path / "other.csv"))


def test_task_args_with_leaf_json_are_refused(tmp_path):
  from tests.test_tasks import write_sent140
  data_dir, glove = write_sent140(tmp_path)
  assert SPEC.load_data(DataOptions(data_dir=data_dir, glove_path=glove)).num_clients == 2
  with pytest.raises(DataError, match="min_tweets=5: applies to the raw Sentiment140 CSV"):
    SPEC.load_data(DataOptions(data_dir=data_dir, glove_path=glove,
                               extra={"min_tweets": 5}))


# ---------------------------------------------------------------------------
# GloVe of any dimension.


@pytest.mark.parametrize("name", ["glove.x.7d.txt", "glove.x.7d.txt.gz"])
def test_glove_dimension_from_the_file(tmp_path, name):
  path = write_glove(tmp_path / name, ["the", "love", "hate"], dim=7)
  vocab, emb = leaf.load_glove(str(path))
  assert vocab == {"the": 1, "love": 2, "hate": 3} and emb.shape == (5, 7)
  np.testing.assert_allclose(emb[2], np.arange(7) + 0.5)
  vocab, emb = leaf.load_glove(str(tmp_path), words={"hate"})  # the directory
  assert vocab == {"hate": 1} and emb.shape == (3, 7)


def test_glove_row_of_the_wrong_dimension_names_file_and_line(tmp_path):
  path = write_glove(tmp_path / "glove.txt", ["the", "love", "hate"], dim=5, bad_line=3)
  for words in (None, {"the"}):  # checked even where the word is not wanted
    with pytest.raises(DataError, match=r"glove.txt line 3: expected a word and 5 "
                                        r"numbers, got 4"):
      leaf.load_glove(str(path), words=words)
  path.write_text("the 1 2 3\nlove 1 2 3 4\n")
  with pytest.raises(DataError, match="line 2: expected a word and 3 numbers, got 4"):
    leaf.load_glove(str(path))
  path.write_text("400000 50\nthe 1 2\n")
  with pytest.raises(DataError, match="line 1: .* word2vec header"):
    leaf.load_glove(str(path))


def test_glove_directory_must_hold_exactly_one(tmp_path):
  with pytest.raises(DataError, match="no glove\\*.txt or glove\\*.txt.gz"):
    leaf.find_glove(str(tmp_path))
  write_glove(tmp_path / "glove.a.txt", ["a"])
  write_glove(tmp_path / "glove.b.txt.gz", ["a"])
  with pytest.raises(DataError, match=r"2 GloVe files \(glove.a.txt, glove.b.txt.gz\)"):
    leaf.find_glove(str(tmp_path))


# ---------------------------------------------------------------------------
# The real partial corpus.


@pytest.fixture(scope="module")
def partial():
  if not PARTIAL_CSV.is_file():
    pytest.skip(f"real data {PARTIAL} absent (../shared/data)")
  return PARTIAL


def _raw_counts():
  with open(PARTIAL_CSV, encoding="latin-1", newline="") as f:
    return collections.Counter(row[4] for row in csv.reader(f))


@pytest.mark.parametrize("min_tweets,users", [(5, 124), (2, 3434)])
def test_real_csv_users_labels_and_split(partial, min_tweets, users):
  data, emb = sent140.load_sent140(str(partial), str(partial), min_tweets=min_tweets)
  assert data.num_clients == users
  counts = _raw_counts()
  assert sorted(data.client_ids) == sorted(u for u, n in counts.items() if n >= min_tweets)
  n_train, n_test = data.num_train_samples(), data.num_test_samples()
  for cid, tr, te in zip(data.client_ids, n_train, n_test):
    assert tr + te == counts[cid] and tr == sent140.num_train(counts[cid])
  assert emb.shape[1] == 50
  for split in (data.train, data.test):
    ys = np.concatenate([split[c][1] for c in data.client_ids])
    assert set(np.unique(ys)) == {0, 1}
  if min_tweets == 2:
    two = [c for c in data.client_ids if counts[c] == 2]
    assert len(two) > 1000
    assert all(len(data.train[c][1]) == len(data.test[c][1]) == 1 for c in two)


def test_real_glove_50d_gz_and_the_model(partial, monkeypatch):
  monkeypatch.setitem(sent140_task._EMBEDDING, "matrix", None)
  data = SPEC.load_data(DataOptions(data_dir=str(partial), glove_path=str(partial),
                                    extra={"min_tweets": 5}))
  assert data.num_clients == 124
  assert data.client_count_setting == "--task_arg=min_tweets=5"
  matrix = sent140_task._EMBEDDING["matrix"]
  assert matrix.shape[1] == 50 and matrix.shape[0] > 1000
  model = SPEC.model_fn()
  layer = model.get_layer("embedding")
  assert layer.output_dim == 50 and layer.input_dim == matrix.shape[0]
  np.testing.assert_allclose(layer.get_weights()[0], matrix)
  x, _ = data.train[data.client_ids[0]]
  assert model(x).shape == (len(x), 1)


def test_real_sample_fraction_is_seeded(partial):
  def load(seed):
    data, _ = sent140.load_sent140(str(partial), str(partial), seed=seed, min_tweets=2,
                                   sample_fraction=0.3)
    return data
  a, b, c = load(0), load(0), load(1)
  assert a.client_ids == b.client_ids and a.client_ids != c.client_ids
  assert 0.2 * 3434 < a.num_clients < 0.4 * 3434
  for cid in a.client_ids:
    np.testing.assert_array_equal(a.train[cid][0], b.train[cid][0])
    np.testing.assert_array_equal(a.test[cid][1], b.test[cid][1])


# ---------------------------------------------------------------------------
# Bad input through the CLI: one line, exit 2.


def _damaged_csv(tmp_path, rows=None, raw=None):
  path = tmp_path / "data" / "tweets.csv"
  if raw is not None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw)
  else:
    write_csv(path, rows)
  return path.parent


def _glove(tmp_path, **kwargs):
  return write_glove(tmp_path / "glove" / "glove.t.txt", WORDS, **kwargs)


def _two_csvs(tmp_path):
  for name in ("a.csv", "b.csv", "testdata.manual.2009.06.14.csv"):
    write_csv(tmp_path / "data" / name, _good_rows())
  return tmp_path / "data"


def _good_rows():
  return [_row(4 * (i % 2), f"user{i % 3}", "i love it") for i in range(12)]


CLI_CASES = {
    "too_few_columns": lambda t: (
        _damaged_csv(t, _good_rows()[:5] + [["4", "1", "date", "user", "text"]]),
        _glove(t), [], ["tweets.csv line 6", "expected 6 columns", "got 5"]),
    "bad_polarity": lambda t: (
        _damaged_csv(t, _good_rows()[:3] + [_row(2, "u", "meh")]), _glove(t), [],
        ["tweets.csv line 4", "polarity '2'", "valid: 0 (negative) or 4 (positive)"]),
    "binary_file": lambda t: (
        _damaged_csv(t, raw=gzip.compress(b'"0","1","d","q","u","text"\n' * 50)),
        _glove(t), [], ["tweets.csv line", "binary data"]),
    "empty_csv": lambda t: (_damaged_csv(t, raw=b""), _glove(t), [],
                            ["tweets.csv: no rows", "polarity, tweet id"]),
    "two_candidate_csvs": lambda t: (
        _two_csvs(t), _glove(t), [], ["2 candidate training CSVs (a.csv, b.csv)", "valid:"]),
    "glove_wrong_dimension": lambda t: (
        _damaged_csv(t, _good_rows()), _glove(t, bad_line=4), [],
        ["glove.t.txt line 4", "expected a word and 4 numbers, got 3"]),
    "min_tweets_leaves_too_few_clients": lambda t: (
        _damaged_csv(t, _good_rows()), _glove(t), ["--task_arg=min_tweets=4"],
        ["invalid --task_arg=min_tweets=4: leaves 3 clients, fewer than "
         "--clients_per_round=20", "--clients_per_round <= 3"]),
    "min_tweets_leaves_no_user": lambda t: (
        _damaged_csv(t, _good_rows()), _glove(t), ["--task_arg=min_tweets=50"],
        ["min_tweets=50", "leaves no user", "valid: min_tweets <= 4"]),
    "sample_fraction_out_of_range": lambda t: (
        _damaged_csv(t, _good_rows()), _glove(t), ["--task_arg=sample_fraction=1.5"],
        ["invalid --task_arg=sample_fraction=1.5", "(0, 1]"]),
}


# These cases run in tests/test_reliability.py's bad-input matrix.


def test_min_tweets_on_the_real_data_names_both_numbers(partial, tmp_path, capsys):
  out = tmp_path / "out"
  code, _, err = main_in_process(
      ["--task=sent140", f"--data_dir={partial}", f"--glove_path={partial}",
       "--task_arg=min_tweets=15", "--clients_per_round=20", f"--output_dir={out}"], capsys)
  assert_one_line_error(code, err, out, "invalid --task_arg=min_tweets=15: leaves ",
                         "fewer than --clients_per_round=20")
