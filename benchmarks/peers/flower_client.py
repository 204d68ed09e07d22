"""The Flower client of `flower_run.py`, in a module of its own so that Ray's
actors import it by name (not a copy pickled per call): each actor process
builds its Keras model, compiles it and opens the arrays once, then trains
whichever client a round's message names.

A client's `fit`: the round's global weights in, `model.fit(x, y,
batch_size, epochs=local_epochs, shuffle=True)` (Keras 3 on TensorFlow, plain
SGD at the client lr; Keras reshuffles each epoch), the new weights and the
client's sample count out (Flower's FedAvg weights by that count).
"""

from __future__ import annotations

from typing import Any, Dict

from peer_common import Arrays, build_model, load_spec, round_seed

_STATE: Dict[str, Any] = {}


def _state(spec_path: str) -> Dict[str, Any]:
  if not _STATE:
    spec = load_spec(spec_path)
    import tensorflow as tf
    threads = int(spec.get("flower_client_cpus") or 1)
    # The actor's share of the machine (its Ray num_cpus), before TF starts
    # its thread pools.
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    import keras
    keras.utils.set_random_seed(int(spec["seed"]))
    model = build_model(keras, spec)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=float(spec["client_lr"])),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    _STATE.update(spec=spec, keras=keras, model=model,
                  arrays=Arrays(spec["data"], with_test=False))
  return _STATE


def client_fn(spec_path: str, context):
  """Flower's `client_fn(context)` (bound to the spec by functools.partial):
  the client of `context.node_config['partition-id']`, i.e. exported client
  number partition-id."""
  from flwr.client import NumPyClient

  state = _state(spec_path)
  spec, keras, model, arrays = (state["spec"], state["keras"], state["model"],
                                state["arrays"])
  index = int(context.node_config["partition-id"])

  class KerasClient(NumPyClient):

    def fit(self, parameters, config):
      x, y = arrays.client(index)
      keras.utils.set_random_seed(round_seed(spec, int(config["round"]), index))
      model.set_weights(parameters)
      model.fit(x, y, batch_size=int(spec["batch_size"]), epochs=int(spec["local_epochs"]),
                shuffle=True, verbose=0)
      return model.get_weights(), len(y), {}

  return KerasClient().to_client()
