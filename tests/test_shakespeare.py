"""`--task=shakespeare`: TFF's federated Shakespeare read without TFF, TFF's
character ids (vocabulary, padding, rows of 81 cut into input and target),
the sequence loss and the accuracy over non-padding characters checked by
hand, the fetch from a server on 127.0.0.1 into an empty cache and a run from
it, and the offline failure (one line, exit 2, nothing left). The database is
written here in TFF's layout. On the TFF stack, the ids, the loss and the
accuracy are also checked against TFF's own preprocessing, model and metric."""

from __future__ import annotations

import dataclasses
import json
import lzma
import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import assert_one_line_error, main_in_process
from tests.test_download import cache, cache_files, closed_port_url, serving  # noqa: F401
from tff_cluster import models, tasks
from tff_cluster.data import download, shakespeare, tff_sqlite
from tff_cluster.data.federated import DataError, FederatedData
from tff_cluster.spec.task import DataOptions

# TFF's layout: every role in both splits, except GHOST (train only: not a client).
ROLES = {
    "train": {
        "ROMEO": [b"But, soft! what light through yonder window breaks?",
                  b"It is the east, and Juliet is the sun." * 3],
        "JULIET": [b"O Romeo, Romeo! wherefore art thou Romeo?", b"Ay me!"],
        "NURSE": [b"Faith, I can tell how to look for thee.", "Anon, anon! \u00e9".encode()],
        "GHOST": [b"Remember me."],
    },
    "test": {
        "ROMEO": [b"He jests at scars that never felt a wound."],
        "JULIET": [b"Deny thy father and refuse thy name;"],
        "NURSE": [b""],
    },
}


def example(snippet: bytes) -> bytes:
  import tensorflow as tf
  return tf.train.Example(features=tf.train.Features(feature={
      "snippets": tf.train.Feature(bytes_list=tf.train.BytesList(value=[snippet]))})
  ).SerializeToString()


def write_database(path: Path, roles=ROLES, proto=example) -> None:
  """`roles` (split -> role -> snippets) in TFF's `SqlClientData` layout."""
  con = sqlite3.connect(str(path))
  tff_sqlite.create_tables(con)
  for split, per_role in roles.items():
    for role, snippets in per_role.items():
      con.executemany("INSERT INTO examples VALUES (?, ?, ?)",
                      [(split, role, proto(s)) for s in snippets])
      con.execute("INSERT INTO client_metadata VALUES (?, ?, ?)", (role, split, len(snippets)))
  con.commit()
  con.close()


@pytest.fixture(scope="module")
def database(tmp_path_factory):
  path = tmp_path_factory.mktemp("shakespeare") / "shakespeare.sqlite"
  write_database(path)
  return path


# ---------------------------------------------------------------------------
# Characters to ids, by hand.


def test_vocabulary_ids_by_hand():
  assert len(shakespeare.CHAR_VOCAB) == 86 and shakespeare.VOCAB_SIZE == 90
  assert (shakespeare.PAD, shakespeare.OOV, shakespeare.BOS, shakespeare.EOS) == (0, 87, 88, 89)
  # CHAR_VOCAB: 'd' is character 0, 'H' 8, ' ' 13, '\n' 62, 'a' 63, 'i' 65, '!' 78,
  # '\r' 85; id = position + 1. 'é' is two UTF-8 bytes, neither in the vocabulary.
  assert shakespeare.to_ids(b"Hi!").tolist() == [9, 66, 79]
  assert shakespeare.to_ids(b"d\n a\r").tolist() == [1, 63, 14, 64, 86]
  assert shakespeare.to_ids("\u00e9".encode()).tolist() == [87, 87]


def test_rows_are_padded_cut_and_shifted_by_hand():
  x, y = shakespeare.snippet_rows([b"Hi!"])
  assert x.shape == y.shape == (1, 80) and x.dtype == y.dtype == np.int32
  assert x[0, :5].tolist() == [88, 9, 66, 79, 89] and not x[0, 5:].any()
  assert y[0, :4].tolist() == [9, 66, 79, 89] and not y[0, 4:].any()
  # Rows of seq_len + 1 = 5: "abcd" is BOS a b c d | EOS and 4 pads (a=64, b=42,
  # c=21, d=1); "" is BOS EOS and 3 pads; "ab" BOS a b EOS and 1 pad. A row's
  # input is its first 4 ids, its target its last 4.
  x, y = shakespeare.snippet_rows([b"abcd", b"", b"ab"], seq_len=4)
  assert x.tolist() == [[88, 64, 42, 21], [89, 0, 0, 0], [88, 89, 0, 0], [88, 64, 42, 89]]
  assert y.tolist() == [[64, 42, 21, 1], [0, 0, 0, 0], [89, 0, 0, 0], [64, 42, 89, 0]]
  # 79 characters + BOS + EOS fill one row of 81 exactly; 80 need two.
  assert shakespeare.snippet_rows([b"a" * 79])[0].shape == (1, 80)
  x, y = shakespeare.snippet_rows([b"a" * 80])
  assert x.shape == (2, 80) and x[1, 0] == 89 and y[0, -1] == 64 and not y[1].any()
  assert shakespeare.snippet_rows([])[0].shape == (0, 80)


def test_reader_gives_each_role_its_rows_in_tff_order(database):
  data = shakespeare.load_database(str(database))
  assert data.client_ids == ["JULIET", "NURSE", "ROMEO"]  # sorted; GHOST has no test split
  assert data.num_classes == 90
  for split, arrays in (("train", data.train), ("test", data.test)):
    for role in data.client_ids:
      want = shakespeare.snippet_rows(ROLES[split][role])
      np.testing.assert_array_equal(arrays[role][0], want[0])
      np.testing.assert_array_equal(arrays[role][1], want[1])
  assert data.train["NURSE"][0][1, 13:15].tolist() == [87, 87]  # é: two OOV bytes
  two = shakespeare.load_database(str(database), num_clients=2, seed=3)
  assert len(two.client_ids) == 2 and set(two.client_ids) <= set(data.client_ids)


def test_bad_databases_are_one_line(database, tmp_path):
  spec = tasks.get_task("shakespeare")
  text = tmp_path / "notes.txt"
  text.write_text("not a database")
  with pytest.raises(DataError, match="invalid --data_dir=.*valid: shakespeare.sqlite") as e:
    spec.load_data(DataOptions(data_dir=str(text)))
  assert "\n" not in str(e.value)
  folder = tmp_path / "folder"
  folder.mkdir()
  (folder / "shakespeare.sqlite").write_bytes(database.read_bytes())
  assert spec.load_data(DataOptions(data_dir=str(folder))).num_clients == 3

  def pixels(_):  # an EMNIST-like Example: no `snippets` feature
    import tensorflow as tf
    return tf.train.Example(features=tf.train.Features(feature={
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[1]))})
    ).SerializeToString()

  wrong = tmp_path / "wrong.sqlite"
  write_database(wrong, proto=pixels)
  with pytest.raises(DataError, match="not TFF's federated Shakespeare.*'snippets'") as e:
    spec.load_data(DataOptions(data_dir=str(wrong)))
  assert "\n" not in str(e.value)
  splits = tmp_path / "splits.sqlite"
  write_database(splits, roles={"all_train": ROLES["train"], "all_test": ROLES["test"]})
  with pytest.raises(DataError, match="no roles under the split name 'train'"):
    spec.load_data(DataOptions(data_dir=str(splits)))


# ---------------------------------------------------------------------------
# The loss and the accuracy, by hand.

# A model whose logits at position t are log p(. | input x_t): probability 1/2
# on x_t itself and 1/8 on each of the other 4 ids. Its prediction is x_t; the
# cross-entropy is ln 2 where the target is x_t, 3 ln 2 elsewhere.
V = 5
LN2 = math.log(2.0)


def repeat_model():
  import tensorflow as tf
  table = np.log(np.full((V, V), 1 / 8) + np.eye(V) * (1 / 2 - 1 / 8)).astype(np.float32)
  inputs = tf.keras.Input(shape=(4,), dtype=tf.int32)
  logits = tf.keras.layers.Embedding(
      V, V, embeddings_initializer=tf.keras.initializers.Constant(table))(inputs)
  return tf.keras.Model(inputs, logits)


def rows(*chunks):
  """Chunks of 5 ids -> (inputs, targets) shifted by one."""
  c = np.asarray(chunks, np.int32)
  return c[:, :-1].copy(), c[:, 1:].copy()


# A: [1 2 2 4 | pad]: targets 2 2 4 (predicted 1 2 2: 1 right of 3).
# B: [3 3 3 3 3] (4 of 4 right) and [1 | pads] (no target counted).
CLIENT_A = rows([1, 2, 2, 4, 0])
CLIENT_B = rows([3, 3, 3, 3, 3], [1, 0, 0, 0, 0])


def test_sequence_loss_is_the_mean_over_every_position():
  model = repeat_model()
  x = np.concatenate([CLIENT_A[0], CLIENT_B[0]])
  y = np.concatenate([CLIENT_A[1], CLIENT_B[1]])
  # Every position counts, padding targets too (TFF's loss): A 3, 1, 3, 3
  # (the last: input 4, target pad); B's first row 1 x 4; its second 3
  # (input 1, target pad), then input pad, target pad: 1, 1, 1 (x ln 2).
  loss = models.per_example_loss(models.SEQUENCE_CE_LOGITS, y, model(x)).numpy()
  np.testing.assert_allclose(loss, [10 / 4 * LN2, LN2, 6 / 4 * LN2], rtol=1e-6)


def test_evaluation_counts_non_padding_characters():
  from tff_cluster.learning.evaluation import Evaluator
  data = FederatedData(["A", "B"], {"A": CLIENT_A, "B": CLIENT_B},
                       {"A": CLIENT_A, "B": CLIENT_B}, V)
  evaluator = Evaluator(repeat_model, models.SEQUENCE_CE_LOGITS, data)
  weights = models.get_weights(repeat_model())
  result = evaluator.evaluate([weights], np.array([0, 0]))
  np.testing.assert_array_equal(result.per_client_count, [3, 4])  # characters, not rows
  np.testing.assert_array_equal(result.per_client_correct, [1, 4])
  assert result.accuracy == pytest.approx(5 / 7)
  np.testing.assert_allclose(result.per_client_loss_sum, [7 * LN2, 4 * LN2], rtol=1e-6)
  assert result.loss == pytest.approx(11 / 7 * LN2, rel=1e-6)
  # F1 over characters: A's targets 2 2 4 against 1 2 2: class 2 scores
  # 2*1/(2+2), classes 1 and 4 score 0: 1/6. B: 1.
  np.testing.assert_allclose(result.per_client_f1, [1 / 6, 1.0])
  np.testing.assert_allclose(evaluator.mean_losses(weights), [7 / 3 * LN2, LN2], rtol=1e-6)


def test_char_lstm_has_tffs_layout():
  model = tasks.get_task("shakespeare").model_fn()
  assert model.count_params() == 820_522
  assert tuple(model.output_shape) == (None, 80, 90)
  assert [w.shape for w in model.weights][:2] == [(90, 8), (8, 1024)]


# ---------------------------------------------------------------------------
# Fetched, cached, run; offline.

RUN = ["--algo=fedavg", "--task=shakespeare", "--rounds=1", "--clients_per_round=2",
       "--noprogress"]


@pytest.fixture(scope="module")
def served(database):
  return {download.SHAKESPEARE.archive: lzma.compress(database.read_bytes(),
                                                      format=lzma.FORMAT_ALONE, preset=0)}


def test_fetch_then_run_then_cache_alone(served, cache, tmp_path, monkeypatch, capsys):  # noqa: F811
  # The task's model with 16 units, not 256 (its layout is checked above): a
  # tenth of the time.
  from tff_cluster import experiment
  task = experiment._TASKS["shakespeare"]  # noqa: SLF001
  monkeypatch.setitem(experiment._TASKS, "shakespeare", dataclasses.replace(  # noqa: SLF001
      task, model_fn=lambda: models.char_lstm(90, 80, units=16)))
  with serving(served) as base:
    monkeypatch.setenv(download.ENV_MIRROR, base + "/files")
    code, _, err = main_in_process([*RUN, f"--output_dir={tmp_path / 'run'}"], capsys)
    assert code == 0, err
  assert cache_files(cache) == [download.SHAKESPEARE.name]  # decompressed, nothing else
  config = json.loads((tmp_path / "run" / "config.json").read_text())
  assert str(cache) in config["data_description"] and config["num_clients_loaded"] == 3
  row = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
  metrics = dict(zip(row[0].split(","), row[1].split(",")))
  # The accuracy's denominator: the test targets that are not padding, each
  # snippet's characters and its EOS.
  chars = sum(len(s) + 1 for role in ("JULIET", "NURSE", "ROMEO") for s in ROLES["test"][role])
  correct = float(metrics["test_accuracy"]) * chars
  assert abs(correct - round(correct)) < 1e-6 and 0 <= correct <= chars
  # The server is gone: the data comes from the cache.
  monkeypatch.setenv(download.ENV_MIRROR, closed_port_url())
  assert tasks.get_task("shakespeare").load_data(DataOptions()).num_clients == 3


def test_offline_with_an_empty_cache_is_one_line(cache, tmp_path, monkeypatch, capsys):  # noqa: F811
  mirror = closed_port_url()
  monkeypatch.setenv(download.ENV_MIRROR, mirror)
  out = tmp_path / "out"
  code, _, err = main_in_process([*RUN, f"--output_dir={out}"], capsys)
  assert_one_line_error(code, err, out, f"could not fetch {download.SHAKESPEARE.name}",
                        f"{mirror}/{download.SHAKESPEARE.archive}", f"in {cache}",
                        "Connection refused")
  assert not cache.exists()


def test_algorithms_needing_a_label_per_example_refuse_in_one_line(database, tmp_path,
                                                                   capsys):
  out = tmp_path / "out"
  code, _, err = main_in_process(["--algo=fedavg_plus", "--task=shakespeare",
                                  f"--data_dir={database}", "--rounds=1",
                                  "--clients_per_round=2", f"--output_dir={out}"], capsys)
  assert_one_line_error(code, err, out, "--algo=fedavg_plus", "one label per example",
                        "'sequence_ce_logits'", "valid: an algorithm")


# ---------------------------------------------------------------------------
# Against TFF's own code (the TFF stack).


@pytest.mark.tff
def test_ids_loss_and_accuracy_are_tffs():
  import tensorflow as tf
  from tensorflow_federated.python.learning.models import keras_utils
  from tensorflow_federated.python.simulation.baselines import client_spec, keras_metrics
  from tensorflow_federated.python.simulation.baselines.shakespeare import (
      char_prediction_models, char_prediction_preprocessing as tff_pre, char_prediction_tasks)
  assert shakespeare.CHAR_VOCAB == "".join(tff_pre.CHAR_VOCAB)
  assert (shakespeare.PAD, shakespeare.OOV, shakespeare.BOS,
          shakespeare.EOS) == tff_pre.get_special_tokens()
  assert shakespeare.VOCAB_SIZE == char_prediction_tasks.VOCAB_LENGTH
  snippets = [s for split in ROLES.values() for per in split.values() for s in per]
  snippets += [b"a" * 79, b"b" * 80, b"~`{|}<>^+=" * 20]
  preprocess = tff_pre.create_preprocess_fn(
      client_spec.ClientSpec(num_epochs=1, batch_size=1000, shuffle_buffer_size=1))
  tff_x, tff_y = next(iter(preprocess(tf.data.Dataset.from_tensor_slices(
      {"snippets": tf.constant(snippets)}))))
  x, y = shakespeare.snippet_rows(snippets)
  np.testing.assert_array_equal(x, tff_x.numpy())
  np.testing.assert_array_equal(y, tff_y.numpy())

  # TFF's model and loss through TFF's forward pass: the mean over every
  # position of the batch, padding included, = the mean of the library's
  # per-sequence losses (every sequence has 80 positions).
  tf.keras.utils.set_random_seed(1)
  keras_model = char_prediction_models.create_recurrent_model(90, 80)
  tff_model = keras_utils.from_keras_model(
      keras_model, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=(tf.TensorSpec([None, 80], tf.int64), tf.TensorSpec([None, 80], tf.int64)))
  ours = models.per_example_loss(models.SEQUENCE_CE_LOGITS, y, keras_model(x)).numpy()
  for rows in (slice(None), slice(0, 1), slice(len(x) - 1, None)):
    tff_loss = tff_model.forward_pass((tff_x[rows], tff_y[rows]), training=False).loss
    assert float(tff_loss) == pytest.approx(float(ours[rows].mean()), rel=1e-5)
  # TFF's masked accuracy = correct non-padding characters / their count.
  accuracy = keras_metrics.MaskedCategoricalAccuracy(masked_tokens=[0])
  accuracy.update_state(tff_y, keras_model(tff_x))
  correct, _, _ = models.sequence_stats(y, keras_model(x))
  assert float(accuracy.result()) == pytest.approx(float(np.mean(correct.numpy())))
  # The library's model with TFF's weights: the same outputs everywhere.
  model = models.char_lstm(90, 80)
  model.set_weights(keras_model.get_weights())
  np.testing.assert_allclose(model(x).numpy(), keras_model(x).numpy(), rtol=1e-5, atol=1e-5)
