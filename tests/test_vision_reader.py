"""CIFAR-10's python batches are read without running code a file names: a
batch as the real files are written (protocol 2, numpy arrays) reads; a
crafted batch is refused in one line naming the file, its payload not run."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from tff_cluster.data import vision
from tff_cluster.data.federated import DataError


def _batch(i: int, n: int = 3) -> dict:
  """A batch as CIFAR-10 holds it; pixel values 10 * channel + i."""
  img = np.concatenate([np.full(1024, 10 * c + i) for c in range(3)])
  return {b"batch_label": b"batch %d" % i, b"labels": [(i + j) % 10 for j in range(n)],
          b"data": np.tile(img, (n, 1)).astype(np.uint8),
          b"filenames": [b"img_%d_%d.png" % (i, j) for j in range(n)]}


def _write_dir(folder, protocol: int = 2, replace=None) -> str:
  """The six batches in `folder/cifar-10-batches-py`; `replace`: {name: object}."""
  batches = folder / vision.CIFAR10_DIR
  batches.mkdir(parents=True)
  for i, name in enumerate(vision.CIFAR10_FILES):
    value = (replace or {}).get(name, _batch(i))
    with open(batches / name, "wb") as f:
      pickle.dump(value, f, protocol=protocol)
  return str(batches)


class _Payload:
  """What a crafted batch holds: unpickling it would create `marker`."""

  def __init__(self, marker: str):
    self.marker = marker

  def __reduce__(self):
    return (os.mkdir, (self.marker,))


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_cifar10_batches_as_written_read(tmp_path, protocol):
  _write_dir(tmp_path, protocol)
  (x, y), (xt, yt) = vision.read_cifar10_dir(str(tmp_path))
  assert x.shape == (15, 32, 32, 3) and x.dtype == np.uint8 and xt.shape == (3, 32, 32, 3)
  assert y.tolist() == [(i + j) % 10 for i in range(5) for j in range(3)]
  assert yt.tolist() == [5, 6, 7]
  # Stored channel-major: channel c of batch i is 10 * c + i once channels are last.
  assert x[0, 5, 7].tolist() == [0, 10, 20] and xt[2, 31, 0].tolist() == [5, 15, 25]


def test_numpy_scalar_labels_read(tmp_path):
  """Labels pickled as numpy integers (numpy's scalar reconstruction)."""
  batch = _batch(0)
  batch[b"labels"] = list(np.arange(3, dtype=np.int64))
  _write_dir(tmp_path, replace={"data_batch_1": batch})
  (_, y), _ = vision.read_cifar10_dir(str(tmp_path))
  assert y[:3].tolist() == [0, 1, 2]


@pytest.mark.parametrize("where", ["top", "inside"])
def test_a_crafted_batch_is_refused_and_its_payload_not_run(tmp_path, where):
  marker = tmp_path / "payload_ran"
  payload = _Payload(str(marker))
  crafted = payload if where == "top" else {**_batch(2), b"labels": payload}
  folder = _write_dir(tmp_path / "data", replace={"data_batch_3": crafted})
  with pytest.raises(DataError) as raised:
    vision.read_cifar10_dir(str(tmp_path / "data"))
  assert not marker.exists(), "the crafted batch's payload ran"
  message = str(raised.value)
  assert "\n" not in message
  assert message.startswith(os.path.join(folder, "data_batch_3") + ": ")
  assert "posix.mkdir" in message and "not run" in message, message


def test_a_codec_other_than_latin1_is_refused(tmp_path):
  """`_codecs.encode` (bytes at protocol 2) is admitted for latin-1 only."""
  import codecs

  class _Rot13:
    def __reduce__(self):
      return (codecs.encode, ("text", "rot13"))

  _write_dir(tmp_path, replace={"test_batch": {b"data": _Rot13()}})
  with pytest.raises(DataError, match="test_batch: not a CIFAR-10 python batch: it asks "
                     "_codecs.encode for 'rot13'"):
    vision.read_cifar10_dir(str(tmp_path))
