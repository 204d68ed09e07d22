"""Malformed data files: every loader refuses undecodable, mistyped and
duplicated input in one line naming the file and the record, never a
traceback of numpy or json (issue 40, item 5). No TensorFlow: these run in
about a second."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tff_cluster.data import leaf, sent140
from tff_cluster.data.federated import DataError


def write(path: Path, blob) -> Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(blob))
  return path


def images(n: int, label: int, dim: int = 784):
  return [[label / 100.0] * dim for _ in range(n)], [label] * n


def refused(load, *parts: str) -> str:
  """The DataError `load()` raises: one line holding every one of `parts`."""
  with pytest.raises(DataError) as e:
    load()
  message = str(e.value)
  assert "\n" not in message, message
  for part in parts:
    assert part in message, message
  return message


def test_binary_garbage_is_named_not_a_unicode_traceback(tmp_path):
  path = tmp_path / "all_data_0.json"
  path.write_bytes(bytes(range(256)) * 4)
  refused(lambda: leaf.load_femnist(str(path)), str(path), "not UTF-8 text",
          "byte 0x80 at offset 128")
  # The same file as Sent140's LEAF JSON (GloVe found first, then the JSON).
  glove = tmp_path / "glove.6B.5d.txt"
  glove.write_text("the 1 2 3 4 5\n")
  refused(lambda: sent140.load_sent140(str(path), str(glove)), str(path),
          "not UTF-8 text")


def test_num_samples_that_is_not_a_list_is_named(tmp_path):
  x, y = images(3, 1)
  path = write(tmp_path / "f.json", {"users": ["w"], "num_samples": 5,
                                     "user_data": {"w": {"x": x, "y": y}}})
  refused(lambda: leaf.load_femnist(str(path)), str(path),
          "'num_samples' is the number 5", "expected a list of sample counts")
  write(path, {"users": ["w"], "num_samples": ["3"], "user_data": {"w": {"x": x, "y": y}}})
  refused(lambda: leaf.load_femnist(str(path)), str(path), "client 'w'",
          "num_samples[0] is the text '3'")


def test_a_writer_listed_twice_is_refused_not_loaded_twice(tmp_path):
  x, y = images(3, 1)
  path = write(tmp_path / "f.json", {"users": ["w", "v", "w"], "num_samples": [3, 3, 3],
                                     "user_data": {"w": {"x": x, "y": y},
                                                   "v": {"x": x, "y": y}}})
  refused(lambda: leaf.load_femnist(str(path)), str(path),
          "user 'w' is listed twice in 'users' (entries 0 and 2)")


@pytest.mark.parametrize("blob, parts", [
    ({"users": 5, "user_data": {}}, ["'users' is the number 5", "a list of user ids"]),
    ({"users": [["w"]], "user_data": {}}, ["users[0] is a list", "a user id"]),
    ({"users": ["w"], "user_data": []}, ["'user_data' is a list", "an object"]),
    ({"users": ["w"], "user_data": {"w": {"x": 7, "y": [1]}}},
     ["user 'w': 'x' is the number 7", "a list with one entry per sample"]),
    ({"users": ["w"], "user_data": {"w": {"x": [[0.5] * 784], "y": "1"}}},
     ["user 'w': 'y' is the text '1'"]),
    ({"users": ["w"], "user_data": {"w": {"x": [[0.5] * 784], "y": [[1, 2]]}}},
     ["client 'w': label 0 is a list", "an integer in 0..61"]),
    ({"users": ["w"], "user_data": {"w": {"x": [[0.5] * 784], "y": ["a"]}}},
     ["client 'w': label 0 is the text 'a'"]),
    ({"users": ["w"], "user_data": {"w": {"x": [[0.5] * 783 + ["a"]], "y": [1]}}},
     ["client 'w': expected 784 features", "sample 0 of x has a value that is the text 'a'"]),
    ([1, 2], ["the file holds a list", "keys 'users', 'num_samples', 'user_data'"]),
])
def test_mistyped_records_name_the_file_and_the_record(tmp_path, blob, parts):
  path = write(tmp_path / "all_data_3.json", blob)
  refused(lambda: leaf.load_femnist(str(path)), str(path), *parts)


def test_deeply_nested_json_is_refused_in_one_line(tmp_path):
  path = tmp_path / "f.json"
  path.write_text("[" * 100_000)
  refused(lambda: leaf.load_fedprox_synthetic(str(path)), str(path), "nested too deeply")


def test_a_bad_sample_names_the_shard_it_is_in(tmp_path):
  # Two train shards: the bad label is in the second one, which is named.
  write(tmp_path / "train" / "all_data_0.json", {
      "users": ["a"], "user_data": {"a": dict(zip("xy", images(2, 1)))}})
  bad = write(tmp_path / "train" / "all_data_1.json", {
      "users": ["b"], "user_data": {"b": dict(zip("xy", images(2, 70)))}})
  write(tmp_path / "test" / "all_data_0.json", {
      "users": ["a", "b"], "user_data": {"a": dict(zip("xy", images(1, 1))),
                                         "b": dict(zip("xy", images(1, 2)))}})
  message = refused(lambda: leaf.load_femnist(str(tmp_path)), str(bad),
                    "client 'b': label 70 is out of range 0..61")
  assert "all_data_0.json" not in message


def test_sent140_leaf_sample_of_the_wrong_shape_names_the_file(tmp_path):
  glove = tmp_path / "glove.6B.5d.txt"
  glove.write_text("the 1 2 3 4 5\n")
  path = write(tmp_path / "s.json", {"users": ["u"], "user_data": {
      "u": {"x": [["id", "date", "q", "u", "the"], "just text"], "y": [0, 1]}}})
  refused(lambda: sent140.load_sent140(str(path), str(glove)), str(path), "client 'u'",
          "a Sent140 sample must be [id, date, query, user, text]")


def test_data_error_is_one_line():
  assert str(DataError("f.json: bad\n  text\r\nhere")) == "f.json: bad text here"
