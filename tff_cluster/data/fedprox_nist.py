"""FedProx's 10-letter "nist" sample: the FEMNIST of the FedProx and FedGroup papers.

FedProx (Li et al., "Federated Optimization in Heterogeneous Networks") builds
its FEMNIST with `data/nist/data/my_sample.py` of github.com/litian96/FedProx;
FedGroup (Duan et al.) reports its FEMNIST numbers on that data (200 devices,
18,345 samples, 26-way MCLR/MLP). This module re-implements the recipe on
pooled (images, labels) arrays with the LEAF/EMNIST 62-class labels:

1. Letters: keep raw labels 36..45 (lower-case a-j), relabelled 0..9. Each
   letter's images are put in a seeded random order and cut to the first
   4,000 (`MAX_PER_CLASS`). A letter with no image is an error.
2. Classes: device u (0..199) holds the 3 consecutive letters
   (u, u+1, u+2) mod 10, so there are only 10 distinct label sets.
3. Sizes: n_u = lognormal(mean 4, sigma 1) + 5 and k_u = max(int(n_u / 3), 2)
   images of each of its 3 letters.
4. Which images (`reuse_prefix`):
   * True (default; the data the papers' numbers come from): every device
     takes the *first* k_u images of each of its letters. FedProx's generator
     keeps a cursor per letter, but its reset test is inverted (it resets to
     0 whenever there is room), which yields exactly this whenever
     cursor + k_u < images of the letter: always with 4,000 images a letter.
     About 2k distinct images are then reused ~9.5x, and a device's test
     images are other devices' training images.
   * False: the cursor advances, each device takes the next k_u images of
     each letter, so no image is used twice while images last.
   Run-out rule, both modes: **truncate**. A letter that has fewer images than
   asked gives the device only what the slice holds (as slicing past the end
   does in FedProx's generator): with reuse_prefix=True all of the letter's
   images, with False the rest after the cursor, possibly none. Nothing is
   cycled, so no image repeats within a device.
5. Split: each device's samples are shuffled (seeded) and split train =
   int(0.9 n), test = the rest (`split_train_test`). A device left with fewer
   than 2 samples (only when reuse_prefix=False runs out) has no training
   sample: it is dropped with a warning and the description counts it.

Randomness: one `np.random.SeedSequence(seed)` is spawned into three streams
(letter orders, sizes, per-device shuffles), so the sizes of a seed do not
depend on how many images the source has.

Pixels are passed through unchanged. LEAF FEMNIST, TFF's EMNIST and FedProx's
sample all use floats in [0, 1] with 1.0 = background: FedProx's generator
reads the NIST PNGs with the same PIL steps LEAF's `data_to_json.py` uses
(grey scale, 28x28 thumbnail, / 255), so no inversion is needed to match it.
The models have a 26-way output (FedProx's `nist.mclr: (26,)`; the papers'
parameter counts 20,410 and 415,258), so `num_classes` is `OUTPUT_CLASSES`
= 26 although the labels are 0..9.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import List, Optional, Sequence

import numpy as np

from tff_cluster.data.federated import DataError, FederatedData, split_train_test

FIRST_RAW_LABEL = 36      # 'a' among LEAF/EMNIST's 62 labels
NUM_LETTERS = 10          # a..j
LETTERS = "abcdefghij"
OUTPUT_CLASSES = 26       # width of the models' output layer
NUM_DEVICES = 200
CLASSES_PER_DEVICE = 3
MAX_PER_CLASS = 4000
SIZE_MEAN, SIZE_SIGMA, SIZE_SHIFT = 4.0, 1.0, 5.0
MIN_PER_CLASS = 2
TRAIN_FRACTION = 0.9
RUN_OUT_RULE = "truncate"


@dataclasses.dataclass
class NistPartition:
  """Which source images each device takes (before its shuffle and split).

  Attributes:
    class_order: per letter 0..9, the indices (into the source arrays) of its
      kept images, in the order devices take them (at most MAX_PER_CLASS).
    device_classes: [devices, 3] letters of each device, (u, u+1, u+2) mod 10.
    per_class: [devices] images asked of each of a device's letters (k_u).
    device_indices: per device, its source indices, letter by letter in
      `device_classes` order (shorter than 3 k_u where a letter ran out).
    device_letters: per device, the letter (0..9) of each of its indices.
    reuse_prefix: the mode that made it.
  """
  class_order: List[np.ndarray]
  device_classes: np.ndarray
  per_class: np.ndarray
  device_indices: List[np.ndarray]
  device_letters: List[np.ndarray]
  reuse_prefix: bool


def letter_indices(labels) -> List[np.ndarray]:
  """Source indices of each letter a..j (raw labels 36..45), in source order.

  Raises DataError when the labels are not 1-D integers or a letter is absent.
  """
  y = np.asarray(labels)
  if y.ndim != 1:
    raise DataError(f"labels must be a 1-D array of LEAF/EMNIST class ids "
                    f"0..61, got shape {y.shape}")
  if y.size and not np.issubdtype(y.dtype, np.integer):
    if not np.issubdtype(y.dtype, np.number) or not np.all(np.mod(y, 1) == 0):
      raise DataError(f"labels must be integer LEAF/EMNIST class ids 0..61, got "
                      f"dtype {y.dtype}")
  y = y.astype(np.int64)
  out = [np.flatnonzero(y == FIRST_RAW_LABEL + c) for c in range(NUM_LETTERS)]
  missing = [c for c in range(NUM_LETTERS) if len(out[c]) == 0]
  if missing:
    names = ", ".join(f"{LETTERS[c]} ({FIRST_RAW_LABEL + c})" for c in missing)
    raise DataError(
        f"FedProx nist sample: no images of lower-case {names} among "
        f"{y.size} samples; it needs every letter a-j (LEAF/EMNIST labels "
        f"{FIRST_RAW_LABEL}..{FIRST_RAW_LABEL + NUM_LETTERS - 1}): pass "
        f"62-class FEMNIST/EMNIST data")
  return out


def draw_per_class(num_devices: int, rng: np.random.Generator) -> np.ndarray:
  """k_u = max(int((lognormal(4, 1) + 5) / 3), 2) for each device."""
  sizes = rng.lognormal(SIZE_MEAN, SIZE_SIGMA, num_devices) + SIZE_SHIFT
  return np.maximum((sizes / CLASSES_PER_DEVICE).astype(np.int64), MIN_PER_CLASS)


def _streams(seed: int):
  if isinstance(seed, bool) or int(seed) != seed or seed < 0:
    raise DataError(f"seed must be an integer >= 0, got {seed!r}")
  return [np.random.default_rng(s)
          for s in np.random.SeedSequence(int(seed)).spawn(3)]


def partition(labels, seed: int = 0, reuse_prefix: bool = True,
              num_devices: int = NUM_DEVICES,
              max_per_class: int = MAX_PER_CLASS,
              per_class: Optional[Sequence[int]] = None) -> NistPartition:
  """The recipe's steps 1-4 on LEAF/EMNIST labels (0..61).

  Args:
    labels: [n] raw labels of the pooled source images.
    seed: seeds the letter orders and the sizes (see the module docstring).
    reuse_prefix: True: every device takes the first k_u images of each of
      its letters; False: a cursor per letter advances. Truncate on run-out.
    num_devices: number of devices (200 in the recipe).
    max_per_class: images kept per letter (4,000 in the recipe).
    per_class: k_u of each device instead of drawing them (for hand-made cases).
  """
  if isinstance(num_devices, bool) or int(num_devices) != num_devices or num_devices < 1:
    raise DataError(f"number of devices must be an integer >= 1, got {num_devices!r}")
  if isinstance(max_per_class, bool) or int(max_per_class) != max_per_class or max_per_class < 1:
    raise DataError(f"max_per_class must be an integer >= 1, got {max_per_class!r}")
  num_devices = int(num_devices)
  order_rng, size_rng, _ = _streams(seed)
  by_letter = letter_indices(labels)
  class_order = [idx[order_rng.permutation(len(idx))][:max_per_class]
                 for idx in by_letter]
  if per_class is None:
    k = draw_per_class(num_devices, size_rng)
  else:
    k = np.asarray(per_class, dtype=np.int64).reshape(-1)
    if k.shape != (num_devices,) or np.any(k < 0):
      raise DataError(f"per_class must give {num_devices} counts >= 0, got "
                      f"{np.asarray(per_class).tolist()}")
  classes = (np.arange(num_devices)[:, None] +
             np.arange(CLASSES_PER_DEVICE)[None, :]) % NUM_LETTERS
  cursor = np.zeros(NUM_LETTERS, np.int64)
  devices, letters = [], []
  for u in range(num_devices):
    parts = []
    for c in classes[u]:
      start = 0 if reuse_prefix else cursor[c]
      parts.append(class_order[c][start:start + k[u]])  # truncates at the end
      cursor[c] += k[u]
    devices.append(np.concatenate(parts).astype(np.int64))
    letters.append(np.repeat(classes[u], [len(p) for p in parts]).astype(np.int64))
  return NistPartition(class_order, classes, k, devices, letters, bool(reuse_prefix))


def build_federated(images, labels, seed: int = 0, reuse_prefix: bool = True,
                    num_devices: int = NUM_DEVICES, source: str = "",
                    max_per_class: int = MAX_PER_CLASS,
                    per_class: Optional[Sequence[int]] = None) -> FederatedData:
  """FedProx's nist sample of pooled (images, labels) as `FederatedData`.

  `images` is [n, ...] (any per-sample shape; 784 floats for the task),
  `labels` the [n] raw LEAF/EMNIST labels 0..61. Client ids are f"f_{u:05d}"
  (device u holds letters (u, u+1, u+2) mod 10); labels are 0..9 and
  `num_classes` is 26. The description records the devices, samples,
  distinct source images used, reuse factor and `reuse_prefix`.
  """
  x = np.asarray(images)
  y = np.asarray(labels)
  if x.ndim < 1 or len(x) != len(y):
    raise DataError(f"images and labels must have the same number of samples, "
                    f"got {len(x) if x.ndim else 0} images and {len(y)} labels")
  part = partition(y, seed, reuse_prefix, num_devices, max_per_class, per_class)
  _, _, split_rng = _streams(seed)
  ids, train, test, used, dropped = [], {}, {}, [], []
  for u, idx in enumerate(part.device_indices):
    if len(idx) < 2:  # no training sample after a 90/10 split
      dropped.append(u)
      continue
    letters = part.device_letters[u]
    cid = f"f_{u:05d}"
    ids.append(cid)
    train[cid], test[cid] = split_train_test(x[idx], letters, split_rng,
                                             TRAIN_FRACTION)
    used.append(idx)
  if dropped:
    warnings.warn(f"FedProx nist sample: {len(dropped)} of {num_devices} devices "
                  f"got fewer than 2 images (reuse_prefix=false ran out of "
                  f"images) and are dropped")
  if not ids:
    raise DataError(f"FedProx nist sample: every device got fewer than 2 images; "
                    f"use reuse_prefix=true or more source images")
  all_used = np.concatenate(used)
  distinct = len(np.unique(all_used))
  n_train = sum(len(train[c][1]) for c in ids)
  n_test = sum(len(test[c][1]) for c in ids)
  where = f" from {source}" if source else ""
  text = (f"FedProx nist sample{where}: letters a-j (labels "
          f"{FIRST_RAW_LABEL}-{FIRST_RAW_LABEL + NUM_LETTERS - 1} -> 0-9, "
          f"{OUTPUT_CLASSES}-way output), {len(ids)} devices x "
          f"{CLASSES_PER_DEVICE} consecutive letters, lognormal(4,1)+5 sizes, "
          f"reuse_prefix={str(bool(reuse_prefix)).lower()}, run-out rule "
          f"{RUN_OUT_RULE}, seed {seed}: {len(all_used)} samples ({n_train} "
          f"train / {n_test} test) from {distinct} distinct source images "
          f"(each used {len(all_used) / distinct:.2f}x on average)")
  if dropped:
    text += f"; {len(dropped)} devices dropped (fewer than 2 images)"
  return FederatedData(ids, train, test, OUTPUT_CLASSES, description=text)
