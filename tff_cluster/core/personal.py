"""The personal part of a model: which of its weights a client keeps.

Personalized methods split a model's weights (trainable first, then the
non-trainable ones, `models.model_variables`' order) into a shared part,
averaged by the server, and a personal part, kept per client in its client
state: FedPer and FedRep keep the head (the model's last layers), LG-FedAvg
the body (the layers below the head), FedBN the BatchNorm layers. The split
is chosen by layer, where "layer" means a layer that holds weights, in the
model's layer order (nested models' layers in place):

  head_indices(model, head_layers=1)           the last layer's weights
  head_indices(model, 0, head_names="d1,out")  those layers' weights, by name
  batchnorm_indices(model)                     every BatchNorm layer's weights
  merge(rest, personal, indices)               one client's full weight list

A choice that does not fit the model is refused in one line naming the
model's layers with weights.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tff_cluster import models


def weight_layers(model: tf.keras.Model) -> List[Tuple[str, List[int]]]:
  """(name, indices of its weights in the model's weight list) of every
  layer that holds weights, in layer order; a nested model's layers stand
  for it."""
  variables = models.model_variables(model)
  out = []
  for layer in models._all_layers(model):  # noqa: SLF001 -- the module's own walk
    if isinstance(layer, tf.keras.Model):
      continue
    own = [models.weight_index(variables, w) for w in layer.weights
           if any(w is v for v in variables)]
    if own:
      out.append((layer.name, sorted(own)))
  return out


def describe_layers(model: tf.keras.Model) -> str:
  """The model's layers with weights, for an error message:
  "dense (60x16, 16), dense_1 (16x10, 10)"."""
  variables = models.model_variables(model)
  return ", ".join(
      f"{name} ({', '.join('x'.join(str(d) for d in variables[i].shape) for i in idx)})"
      for name, idx in weight_layers(model))


def head_indices(model: tf.keras.Model, head_layers: int, head_names: str = "",
                 algo: str = "") -> List[int]:
  """The indices of the head's weights: the last `head_layers` layers with
  weights, or the layers named in `head_names` (comma-separated; it wins
  when given). The body is every other weight, so a head must leave at
  least one layer below it."""
  layers = weight_layers(model)
  names = [name for name, _ in layers]
  where = f"model {model.name!r} has {len(layers)} layer(s) with weights: {describe_layers(model)}"
  if head_names:
    chosen = [n.strip() for n in head_names.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in names]
    if unknown or not chosen or len(set(chosen)) == len(layers):
      raise ValueError(f"invalid --head_names={head_names}: {where}; valid: comma-separated "
                       "names of some of them, not all")
    picked = [idx for name, idx in layers if name in chosen]
  elif len(layers) < 2:
    raise ValueError(f"--algo={algo} splits the model into a body and a head, but {where}; "
                     "valid: a model with 2 or more such layers (e.g. the task's --model=mlp)")
  else:
    if not 1 <= head_layers < len(layers):
      raise ValueError(f"invalid --head_layers={head_layers}: {where}; valid: "
                       f"1..{len(layers) - 1}")
    picked = [idx for _, idx in layers[-head_layers:]]
  return sorted(i for idx in picked for i in idx)


def check_head_names(model: tf.keras.Model, head_names: str) -> None:
  """Refuses `--head_names` that name no head of `model` (one line, as
  `head_indices`); nothing when none are given."""
  if head_names:
    head_indices(model, 1, head_names)


def batchnorm_indices(model: tf.keras.Model, algo: str = "") -> List[int]:
  """The indices of every BatchNorm layer's weights (scale, offset, moving
  mean and variance)."""
  variables = models.model_variables(model)
  out = [models.weight_index(variables, w)
         for layer in models._all_layers(model)  # noqa: SLF001
         if isinstance(layer, tf.keras.layers.BatchNormalization)
         for w in layer.weights if any(w is v for v in variables)]
  if not out:
    raise ValueError(f"--algo={algo} keeps the BatchNorm layers personal, but model "
                     f"{model.name!r} has none (its layers with weights: "
                     f"{describe_layers(model)}); valid: a model with BatchNorm layers "
                     "(e.g. --task=fmnist_clientwise_class)")
  return sorted(out)


def merge(rest: Sequence, personal: Sequence, indices: Sequence[int]) -> list:
  """The full weight list from `rest` (the weights not in `indices`, in
  order) and `personal` (one per index of `indices`, in the same order)."""
  put = dict(zip((int(i) for i in indices), personal))
  rest = list(rest)
  others = iter(rest)
  return [put[i] if i in put else next(others) for i in range(len(put) + len(rest))]


def split_flags(num_weights: int, indices: Sequence[int]) -> np.ndarray:
  """A bool per weight: True where `indices` name it."""
  flags = np.zeros(num_weights, bool)
  flags[list(indices)] = True
  return flags
