"""FedProx's 10-letter nist sample (`femnist_fedprox`): recipe, run-out rule, sources.

Synthetic source arrays carry each image's source index as its only pixel, so
every sample of the built data can be traced back to the image it copies.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tff_cluster import tasks
from tff_cluster.tasks import femnist_fedprox as task_module
from tests.helpers import write_emnist_sqlite
from tff_cluster.data import fedprox_nist as nist
from tff_cluster.data.federated import DataError
from tff_cluster.spec.hparams import HParamError
from tff_cluster.spec.task import DataOptions

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
FEMNIST_DIR = SHARED / "femnist_leaf"
SPEC = tasks.registry()["femnist_fedprox"]


def fake_source(per_letter=4100, digits=500):
  """Raw labels: `per_letter` images of each of a-j (36..45), interleaved, plus
  `digits` images of other classes; x = [[source index]]."""
  labels = np.concatenate([np.tile(np.arange(36, 46), per_letter),
                           np.arange(digits) % 36, 46 + np.arange(digits) % 16])
  return np.arange(len(labels), dtype=np.float64)[:, None], labels


def ids_by_letter(data, cid):
  """{letter: sorted source indices} of a client's train + test samples."""
  x = np.concatenate([data.train[cid][0], data.test[cid][0]])[:, 0].astype(np.int64)
  y = np.concatenate([data.train[cid][1], data.test[cid][1]])
  return {int(c): np.sort(x[y == c]) for c in np.unique(y)}


def hand_sizes(seed, num_devices=200):
  # The recipe by hand: n = lognormal(4, 1) + 5, k = max(int(n / 3), 2), drawn
  # from the second of three streams spawned from the seed.
  rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(3)[1])
  n = rng.lognormal(4.0, 1.0, num_devices) + 5
  return np.maximum((n / 3).astype(np.int64), 2)


@pytest.fixture(scope="module")
def plenty():
  x, y = fake_source()
  return x, y, {reuse: (nist.partition(y, seed=3, reuse_prefix=reuse),
                        nist.build_federated(x, y, seed=3, reuse_prefix=reuse))
                for reuse in (True, False)}


# ---------------------------------------------------------------------------
# The recipe on plenty of images.


@pytest.mark.parametrize("reuse", [True, False])
def test_devices_hold_three_consecutive_letters(plenty, reuse):
  x, y, built = plenty
  part, data = built[reuse]
  assert data.num_clients == 200 and data.num_classes == 26
  assert data.client_ids == [f"f_{u:05d}" for u in range(200)]
  for u, cid in enumerate(data.client_ids):
    want = [u % 10, (u + 1) % 10, (u + 2) % 10]
    assert part.device_classes[u].tolist() == want
    assert sorted(ids_by_letter(data, cid)) == sorted(want)
    for c, ids in ids_by_letter(data, cid).items():  # labels are the letters 0..9
      np.testing.assert_array_equal(y[ids], 36 + c)


@pytest.mark.parametrize("reuse", [True, False])
def test_sizes_and_split_follow_the_recipe(plenty, reuse):
  _, _, built = plenty
  part, data = built[reuse]
  k = hand_sizes(3)
  np.testing.assert_array_equal(part.per_class, k)
  assert k.min() >= 2 and k.max() > 100  # the lognormal tail occurs
  n = 3 * k  # plenty of images: every letter gives the full k
  np.testing.assert_array_equal(data.num_train_samples(), (0.9 * n).astype(np.int64))
  np.testing.assert_array_equal(data.num_test_samples(), n - (0.9 * n).astype(np.int64))
  for cid, ku in zip(data.client_ids, k):
    assert all(len(ids) == ku for ids in ids_by_letter(data, cid).values())
  total = int(n.sum())
  assert f"{total} samples ({int((0.9 * n).astype(np.int64).sum())} train" in data.description
  assert f"reuse_prefix={str(reuse).lower()}" in data.description


def test_sizes_floor_at_two_per_letter():
  class Draws:  # lognormal draws of 0, 0.9, 1.1, 4 and 100: n = draw + 5
    def lognormal(self, mean, sigma, size):
      assert (mean, sigma, size) == (4.0, 1.0, 5)
      return np.array([0.0, 0.9, 1.1, 4.0, 100.0])
  np.testing.assert_array_equal(nist.draw_per_class(5, Draws()), [2, 2, 2, 3, 35])


def test_letter_order_is_a_seeded_sample_of_at_most_4000(plenty):
  _, y, built = plenty
  part, _ = built[True]
  for c, order in enumerate(part.class_order):
    assert len(order) == 4000 and len(np.unique(order)) == 4000  # 4,100 available
    np.testing.assert_array_equal(y[order], 36 + c)
    assert not np.all(np.diff(order) > 0)  # shuffled, not the source order


def test_reuse_prefix_true_takes_the_first_k_of_each_letter(plenty):
  _, _, built = plenty
  part, data = built[True]
  for u, cid in enumerate(data.client_ids):
    for c, ids in ids_by_letter(data, cid).items():
      np.testing.assert_array_equal(ids, np.sort(part.class_order[c][:part.per_class[u]]))
  # Distinct images: per letter, the largest k among its 60 devices.
  distinct = sum(max(part.per_class[u] for u in range(200) if c in part.device_classes[u])
                 for c in range(10))
  used = int(3 * part.per_class.sum())
  assert f"from {distinct} distinct source images" in data.description
  assert f"each used {used / distinct:.2f}x" in data.description
  assert used / distinct > 5  # the reuse the papers' data has


def test_reuse_prefix_false_uses_no_image_twice(plenty):
  _, _, built = plenty
  part, data = built[False]
  holders = [[u for u in range(200) if c in part.device_classes[u]] for c in range(10)]
  assert all(part.per_class[h].sum() <= 4000 for h in holders)  # images last
  for c in range(10):
    cursor = 0
    for u in holders[c]:  # device order: the next k images of the letter
      ids = ids_by_letter(data, data.client_ids[u])[c]
      np.testing.assert_array_equal(
          ids, np.sort(part.class_order[c][cursor:cursor + part.per_class[u]]))
      cursor += part.per_class[u]
  every = np.concatenate([ids for cid in data.client_ids
                          for ids in ids_by_letter(data, cid).values()])
  assert len(np.unique(every)) == len(every) == 3 * part.per_class.sum()
  assert f"from {len(every)} distinct source images (each used 1.00x" in data.description


def test_same_seed_same_data_other_seed_other_data():
  x, y = fake_source(per_letter=500, digits=0)
  a = nist.build_federated(x, y, seed=7)
  b = nist.build_federated(x, y, seed=7)
  c = nist.build_federated(x, y, seed=8)
  assert a.description == b.description
  for cid in a.client_ids:
    for split in ("train", "test"):
      for u, v in zip(getattr(a, split)[cid], getattr(b, split)[cid]):
        np.testing.assert_array_equal(u, v)
  assert not np.array_equal(a.num_train_samples(), c.num_train_samples())


# ---------------------------------------------------------------------------
# Run-out rule: truncate (never cycle).


def tiny_source(per_letter):
  labels = np.repeat(np.arange(36, 46), per_letter)
  return np.arange(len(labels), dtype=np.float64)[:, None], labels


def test_run_out_truncates_with_reuse_prefix():
  x, y = tiny_source(3)  # 3 images a letter, 5 asked
  part = nist.partition(y, seed=0, reuse_prefix=True, num_devices=4, per_class=[5] * 4)
  data = nist.build_federated(x, y, seed=0, reuse_prefix=True, num_devices=4,
                              per_class=[5] * 4)
  for u, cid in enumerate(data.client_ids):
    assert len(part.device_indices[u]) == 9  # 3 letters x all 3 images, no repeat
    assert len(np.unique(part.device_indices[u])) == 9
    for c, ids in ids_by_letter(data, cid).items():
      np.testing.assert_array_equal(ids, np.flatnonzero(y == 36 + c))
  np.testing.assert_array_equal(data.num_train_samples(), [8] * 4)  # int(0.9 * 9)


def test_run_out_truncates_with_advancing_cursor():
  x, y = tiny_source(5)  # 5 images a letter, 4 asked by each of 3 devices
  part = nist.partition(y, seed=0, reuse_prefix=False, num_devices=3, per_class=[4] * 3)
  # Letter 2 is held by devices 0, 1, 2: it gives 4, then 1 (the rest), then 0.
  # Letter 3 by devices 1, 2: 4 then 1. Letters 0, 1, 4: 4 to their first holder.
  assert [len(i) for i in part.device_indices] == [12, 1 + 1 + 4, 0 + 1 + 4]
  order = part.class_order[2]
  np.testing.assert_array_equal(part.device_indices[0][8:], order[:4])
  np.testing.assert_array_equal(part.device_indices[1][1:2], order[4:5])
  assert len(np.unique(np.concatenate(part.device_indices))) == 23


def test_devices_left_without_training_samples_are_dropped():
  x, y = tiny_source(2)
  with pytest.warns(UserWarning, match="3 of 11 devices got fewer than 2 images"):
    data = nist.build_federated(x, y, seed=0, reuse_prefix=False, num_devices=11,
                                per_class=[2] * 11)
  # Device 0 takes letters 0-2, devices 1..7 find only their third letter
  # unused, devices 8-10 find all three used up.
  assert data.client_ids == [f"f_{u:05d}" for u in range(8)]
  np.testing.assert_array_equal(data.num_train_samples() + data.num_test_samples(),
                                [6] + [2] * 7)
  assert "3 devices dropped" in data.description
  assert "from 20 distinct source images" in data.description
  # One image left (letter 3): a 90/10 split would give no training sample.
  x, y = tiny_source(1)
  with pytest.warns(UserWarning, match="1 of 2 devices"):
    data = nist.build_federated(x, y, reuse_prefix=False, num_devices=2, per_class=[1, 1])
  assert data.client_ids == ["f_00000"] and data.num_train_samples().tolist() == [2]


def test_a_letter_without_images_is_one_data_error_line():
  x, y = tiny_source(3)
  keep = y != 41  # no 'f'
  with pytest.raises(DataError, match=r"no images of lower-case f \(41\)") as e:
    nist.build_federated(x[keep], y[keep])
  assert "\n" not in str(e.value)
  with pytest.raises(DataError, match="same number of samples"):
    nist.build_federated(x[:5], y)


# ---------------------------------------------------------------------------
# The task: models, options, sources.


def test_models_are_26_way_with_the_papers_parameter_counts():
  mlp = SPEC.model_fn()
  mclr = SPEC.with_model("mclr").model_fn()
  assert SPEC.model_name == "mlp" and set(SPEC.model_names) == {"mlp", "mclr"}
  assert mlp.output_shape[-1] == mclr.output_shape[-1] == 26
  assert mlp.count_params() == 415_258 and mclr.count_params() == 20_410
  assert SPEC.defaults == dict(rounds=200, clients_per_round=20, local_epochs=20,
                               batch_size=10, client_lr=0.003, mu=1.0, num_clients=None)
  assert [d.name for d in SPEC.task_args] == ["reuse_prefix"]
  assert SPEC.task_args[0].type is bool and SPEC.task_args[0].default is True


def _leaf_labels_count(root):
  counts = np.zeros(62, np.int64)
  for path in sorted(root.glob("*/*.json")):
    for record in json.loads(path.read_text())["user_data"].values():
      counts += np.bincount(np.asarray(record["y"], np.int64), minlength=62)
  return counts[36:46]


@pytest.fixture(scope="module")
def shared_pool():
  if not FEMNIST_DIR.is_dir():
    pytest.skip(f"real data {FEMNIST_DIR} absent (../shared/data)")
  return task_module.pool_source(str(FEMNIST_DIR))


def test_builds_from_the_shared_leaf_sample(shared_pool, monkeypatch):
  x, y, _ = shared_pool
  per_letter = _leaf_labels_count(FEMNIST_DIR)
  assert len(y) == per_letter.sum() == 431 and x.shape == (431, 784)
  assert x.mean() > 0.5  # LEAF's 1.0 = background, not inverted
  monkeypatch.setattr(task_module, "pool_source", lambda data_dir: shared_pool)
  data = SPEC.load_data(DataOptions(data_dir=str(FEMNIST_DIR), seed=0))
  part = nist.partition(y, seed=0, reuse_prefix=True)
  # Prefix reuse: letter c uses min(its images, the largest k of its holders).
  distinct = sum(min(per_letter[c], max(part.per_class[u] for u in range(200)
                                        if c in part.device_classes[u]))
                 for c in range(10))
  assert data.num_clients == 200
  total = int(data.num_train_samples().sum() + data.num_test_samples().sum())
  assert total == sum(len(i) for i in part.device_indices) > 10 * distinct
  assert f"{total} samples" in data.description
  assert f"from {distinct} distinct source images" in data.description
  assert "reuse_prefix=true" in data.description
  for cid in data.client_ids[:20]:
    assert data.train[cid][0].shape[1] == 784
    u = int(cid[2:])
    assert set(np.concatenate([data.train[cid][1], data.test[cid][1]]).tolist()) == {
        u % 10, (u + 1) % 10, (u + 2) % 10}


def test_shared_leaf_sample_without_reuse_runs_out(shared_pool, monkeypatch):
  monkeypatch.setattr(task_module, "pool_source", lambda data_dir: shared_pool)
  with pytest.warns(UserWarning, match="devices got fewer than 2 images"):
    data = SPEC.load_data(DataOptions(data_dir=str(FEMNIST_DIR), seed=0,
                                      extra={"reuse_prefix": False}))
  total = int(data.num_train_samples().sum() + data.num_test_samples().sum())
  assert 1 < data.num_clients < 200
  assert total == 431  # every image once, then the letters are used up
  assert "from 431 distinct source images (each used 1.00x" in data.description
  assert "reuse_prefix=false" in data.description
  with pytest.raises(HParamError, match="reuse_prefix"):
    SPEC.load_data(DataOptions(data_dir=str(FEMNIST_DIR), extra={"reuse_prefix": "no"}))


def write_leaf(root: Path, labels):
  for split in ("train", "test"):
    path = root / split / "d.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"users": ["w"], "num_samples": [len(labels)],
                                "user_data": {"w": {"x": [[1.0] * 784] * len(labels),
                                                    "y": list(labels)}}}))


def test_sources_are_dispatched_by_what_data_dir_holds(tmp_path, monkeypatch):
  # No --data_dir: TFF's database is fetched; here from a stopped server on 127.0.0.1.
  import socket
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  monkeypatch.setenv("TFF_CLUSTER_DATA", str(tmp_path / "cache"))
  monkeypatch.setenv("TFF_CLUSTER_DATA_MIRROR", f"http://127.0.0.1:{port}")
  monkeypatch.delenv("KERAS_HOME", raising=False)
  with pytest.raises(DataError, match=r"could not fetch emnist_all.sqlite from "
                                      r"http://127.0.0.1:\d+/emnist_all.sqlite.lzma"):
    SPEC.load_data(DataOptions())
  with pytest.raises(DataError, match=r"holds neither train/ and test/ LEAF JSON nor "
                                      r"emnist_all.sqlite"):
    SPEC.load_data(DataOptions(data_dir=str(tmp_path)))
  with pytest.raises(DataError, match="does not exist"):
    SPEC.load_data(DataOptions(data_dir=str(tmp_path / "nope")))
  bad = tmp_path / "bad"
  bad.mkdir()
  (bad / "emnist_all.sqlite").write_bytes(b"not a database at all" * 10)
  with pytest.raises(DataError, match="emnist_all.sqlite: not TFF's federated EMNIST "
                                      "database") as e:
    SPEC.load_data(DataOptions(data_dir=str(bad)))
  assert "\n" not in str(e.value)
  leaf_dir = tmp_path / "leaf"
  write_leaf(leaf_dir, list(range(36, 46)) * 2 + [3, 50])
  x, y, source = task_module.pool_source(str(leaf_dir))
  assert len(y) == 40 and sorted(set(y.tolist())) == list(range(36, 46))
  assert "LEAF FEMNIST JSON" in source


def test_reads_tffs_emnist_sqlite(tmp_path):
  letters = list(range(36, 46))
  write_emnist_sqlite(tmp_path / "emnist_all.sqlite", {
      "all_train": {"w1": letters + [1, 12, 50], "w2": letters[:5] * 2},
      "all_test": {"w1": [40, 7], "w2": letters[5:]},
      "digits_only_train": {"w1": [1]}}, pixel=lambda label, i: (i % 7) / 7)
  x, y, source = task_module.pool_source(str(tmp_path))
  assert x.shape == (26, 784) and "TFF EMNIST" in source
  np.testing.assert_array_equal(np.bincount(y - 36, minlength=10),
                                [3, 3, 3, 3, 4, 2, 2, 2, 2, 2])
  # The file itself may be given too, and the task builds from it.
  data = SPEC.load_data(DataOptions(data_dir=str(tmp_path / "emnist_all.sqlite"),
                                    num_clients=20))
  assert data.num_clients == 20 and "from 26 distinct source images" in data.description


# The CLI's one-line error for a LEAF JSON without letters a-j is a case of
# tests/test_reliability.py's bad-input matrix.
