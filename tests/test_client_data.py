"""FederatedData <-> tff.simulation.datasets.ClientData, both ways."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tff_cluster import tasks
from tff_cluster.data import client_data
from tff_cluster.data.client_data import from_client_data, to_client_data
from tff_cluster.data.federated import DataError, FederatedData
from tff_cluster.spec.task import DataOptions


@pytest.fixture(scope="module")
def data():
  return tasks.get_task("synthetic_clusters").load_data(
      DataOptions(seed=0, num_clients=5, extra={"num_clusters": 2}))


@pytest.mark.tff
def test_round_trip_keeps_every_client_and_array(data):
  back = from_client_data(client_data.train_client_data(data), client_data.test_client_data(data),
                          num_classes=data.num_classes)
  assert back.client_ids == data.client_ids
  for c in data.client_ids:
    for ours, theirs in ((data.train[c], back.train[c]), (data.test[c], back.test[c])):
      np.testing.assert_array_equal(ours[0], theirs[0])
      np.testing.assert_array_equal(ours[1], theirs[1])


@pytest.mark.tff
def test_client_data_elements_and_ids(data):
  cd = client_data.train_client_data(data)
  assert sorted(cd.client_ids) == sorted(data.client_ids)
  c = data.client_ids[3]
  rows = list(cd.create_tf_dataset_for_client(c).as_numpy_iterator())
  assert len(rows) == len(data.train[c][1])
  np.testing.assert_array_equal(rows[0]["x"], data.train[c][0][0])
  assert set(cd.element_type_structure) == {"x", "y"}


@pytest.mark.tff
def test_serializable_dataset_fn_runs_inside_tf_function_and_tff(data):
  cd = client_data.train_client_data(data)
  c = data.client_ids[2]

  @tf.function
  def count(client_id):
    return cd.serializable_dataset_fn(client_id).reduce(0, lambda n, _: n + 1)

  assert int(count(tf.constant(c))) == len(data.train[c][1])
  import tensorflow_federated as tff

  from tff_cluster.runners.tff import runtime
  runtime.install()

  @tff.tensorflow.computation(tff.TensorType(np.str_))
  def total_label(client_id):
    return cd.serializable_dataset_fn(client_id).reduce(
        tf.constant(0, tf.int64), lambda s, e: s + tf.cast(e["y"], tf.int64))

  with runtime.tff_runtime():
    assert int(total_label(c)) == int(data.train[c][1].sum())


@pytest.mark.tff
def test_from_tff_style_client_data_with_other_keys():
  import tensorflow_federated as tff
  rng = np.random.default_rng(0)
  tensors = {f"w{i}": collections.OrderedDict(
      pixels=rng.random((3 + i, 4, 4)).astype(np.float32),
      label=rng.integers(0, 5, 3 + i).astype(np.int32)) for i in range(3)}
  cd = tff.simulation.datasets.TestClientData(tensors)
  out = from_client_data(cd, cd, x_key="pixels", y_key="label", flatten=True)
  assert out.client_ids == ["w0", "w1", "w2"]
  assert out.train["w2"][0].shape == (5, 16)
  np.testing.assert_array_equal(out.train["w1"][1], tensors["w1"]["label"])
  assert out.num_classes == int(max(t["label"].max() for t in tensors.values())) + 1
  with pytest.raises(DataError, match="x_key/y_key"):
    from_client_data(cd, x_key="image", y_key="label")


@pytest.mark.tff
def test_bad_ids_are_refused(data):
  with pytest.raises(DataError, match="at least one client"):
    to_client_data([], data.train)
  with pytest.raises(DataError, match="'nobody'"):
    to_client_data(["nobody"], data.train)
  only_train = FederatedData(["a"], {"a": data.train[data.client_ids[0]]},
                             {"a": data.test[data.client_ids[0]]}, 10)
  other = FederatedData(["b"], {"b": data.train[data.client_ids[1]]},
                        {"b": data.test[data.client_ids[1]]}, 10)
  with pytest.raises(DataError, match="no test data"):
    from_client_data(client_data.train_client_data(only_train), client_data.test_client_data(other))


@pytest.mark.tff
def test_a_process_initializes_from_client_data_with_other_keys():
  """The keys the error names are what `initialize` takes: EMNIST-style
  'pixels'/'label' elements train as the same arrays would."""
  import tensorflow_federated as tff
  from tff_cluster import api, models
  rng = np.random.default_rng(1)
  tensors = {f"w{i}": collections.OrderedDict(
      pixels=rng.random((6 + i, 2, 2)).astype(np.float32),
      label=rng.integers(0, 3, 6 + i).astype(np.int32)) for i in range(3)}
  cd = tff.simulation.datasets.TestClientData(tensors)

  def process():
    return api.build("fedavg", lambda: models.mclr(4, 3),
                     tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                     client_lr=0.1, local_epochs=1, batch_size=2, seed=0)

  with pytest.raises(DataError, match="x_key/y_key"):
    process().initialize((cd, cd))
  p = process()
  state = p.initialize((cd, cd), x_key="pixels", y_key="label", flatten=True, num_classes=3)
  got = p.next(state, ["w0", "w2"]).metrics
  arrays = from_client_data(cd, cd, x_key="pixels", y_key="label", flatten=True, num_classes=3)
  q = process()
  want = q.next(q.initialize(arrays), ["w0", "w2"]).metrics
  assert got["test_accuracy"] == want["test_accuracy"]
  assert got["train_loss"] == want["train_loss"]
  with pytest.raises(TypeError, match="x_key apply to a .train, test. pair"):
    process().initialize(arrays, x_key="pixels")
