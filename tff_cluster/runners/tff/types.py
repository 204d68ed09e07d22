"""TensorFlow specs -> TFF types (TFF 0.87's `tff.types.to_type` takes no TF specs)."""

from __future__ import annotations

from tff_cluster import stack

stack.require_tff()  # one line naming the install routes, not a ModuleNotFoundError

import tensorflow as tf  # noqa: E402
import tensorflow_federated as tff  # noqa: E402


def _tensor_type(spec) -> tff.TensorType:
  return tff.TensorType(tf.as_dtype(spec.dtype).as_numpy_dtype,
                        tf.TensorShape(spec.shape).as_list())


def to_tff_type(structure) -> tff.Type:
  """Converts a (nested) structure of `tf.TensorSpec`/`tf.Variable` to a TFF type."""
  return tff.types.to_type(tf.nest.map_structure(_tensor_type, structure))


def sequence_type(element_spec) -> tff.SequenceType:
  """TFF type of a `tf.data.Dataset` with this element spec."""
  return tff.SequenceType(to_tff_type(element_spec))
