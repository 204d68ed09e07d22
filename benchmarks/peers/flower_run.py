"""One benchmark run on Flower (PyPI `flwr[simulation]`), Ray simulation.

Run by `benchmarks/peers.py` as `<flower env>/bin/python flower_run.py
SPEC.json`, always inside `unshare -n` with only the loopback interface up:
Ray's processes and Flower's messages stay on 127.0.0.1, and nothing can
leave the machine. Flower's telemetry and Ray's usage stats are switched off
as well (FLWR_TELEMETRY_ENABLED=0, RAY_USAGE_STATS_ENABLED=0).

What runs, with Flower's public API (`flwr.simulation.start_simulation`, the
Ray-backed simulation that Flower 1.x keeps, deprecated since 1.13 in favour of
`flwr run`, which needs a packaged Flower app):
  * one virtual client per exported client (`num_clients`), Keras 3 on
    TensorFlow (`flower_client.py`), `client_resources` = {"num_cpus":
    flower_client_cpus} (Flower's default is 1: on 2 cores, 2 actors train
    at once, each with TensorFlow limited to that many threads);
  * a `FedAvg` whose `configure_fit` sends round r's global weights to the
    exported schedule's clients for round r (tff-cluster's clients), and
    whose `aggregate_fit` is Flower's sample-weighted mean (server lr 1);
  * central evaluation (`evaluate_fn`) on the pooled test set in the server
    process, after the rounds tff-cluster evaluates (every `eval_every` and
    the last); no federated evaluation (`fraction_evaluate=0`).
Timing: a round's training runs from `configure_fit` to the end of
`aggregate_fit` (dispatch through Ray, the clients' fits, the transfers and
the aggregation); the central evaluation comes after it and is not in it.
"""

from __future__ import annotations

import functools
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ.pop("TF_USE_LEGACY_KERAS", None)
# Ray's workers (the client actors) import flower_client and peer_common by name.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

from peer_common import (Arrays, Stopwatch, build_model, check_users, emit,  # noqa: E402
                         evaluates_after, load_spec, prepare_cifar10_users)


def main() -> None:
  clock = Stopwatch()
  spec_path = os.path.abspath(sys.argv[1])
  spec = load_spec(spec_path)
  import importlib.metadata as md

  import keras
  import tensorflow  # noqa: F401  (Keras 3's backend, imported before Ray's workers)
  from flwr.common import FitIns, ndarrays_to_parameters
  from flwr.server import ServerConfig
  from flwr.server.strategy import FedAvg
  from flwr.simulation import start_simulation

  import flower_client

  versions = {p: md.version(p) for p in ("flwr", "ray", "tensorflow", "keras")}
  cpus = int(spec.get("flower_client_cpus") or 1)
  emit("start", versions=versions, keras=f"keras {keras.__version__}",
       backend=f"Flower start_simulation (Ray), Keras 3 client model.fit, {cpus} CPU per "
               "client actor", import_seconds=clock.seconds())

  arrays = Arrays(spec["data"])
  if spec.get("cifar_dir"):  # the setting's own data preparation, in this process
    prepared = prepare_cifar10_users(spec["cifar_dir"], int(spec["seed"]))
    check_users(prepared, arrays)
    emit("prepared", seconds=clock.seconds())
  schedule = arrays.schedule
  rounds = int(spec["rounds"])
  keras.utils.set_random_seed(int(spec["seed"]))
  server_model = build_model(keras, spec)
  server_model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                       metrics=["accuracy"])

  def evaluate_fn(server_round, ndarrays, config):
    if server_round == 0 or not evaluates_after(server_round, spec):
      return None
    started = time.perf_counter()
    server_model.set_weights(ndarrays)
    loss, accuracy = server_model.evaluate(arrays.x_test, arrays.y_test, verbose=0,
                                           batch_size=int(spec["eval_batch_size"]))
    emit("eval", round=server_round, accuracy=accuracy,
         seconds=time.perf_counter() - started)
    return float(loss), {"accuracy": float(accuracy)}

  class ScheduledFedAvg(FedAvg):
    """Flower's FedAvg on the exported schedule's clients, timed per round."""

    def configure_fit(self, server_round, parameters, client_manager):
      self._round_start = time.perf_counter()
      by_partition = {proxy.partition_id: proxy for proxy in client_manager.all().values()}
      instructions = FitIns(parameters, {"round": server_round})
      return [(by_partition[int(c)], instructions) for c in schedule[server_round - 1]]

    def aggregate_fit(self, server_round, results, failures):
      out = super().aggregate_fit(server_round, results, failures)
      emit("round", round=server_round, clients=len(results), failures=len(failures),
           train_seconds=time.perf_counter() - self._round_start)
      if failures:
        raise RuntimeError(f"round {server_round}: {len(failures)} clients failed: "
                           f"{failures[0]!r}")
      return out

  strategy = ScheduledFedAvg(
      fraction_evaluate=0.0, min_evaluate_clients=0,
      initial_parameters=ndarrays_to_parameters(server_model.get_weights()),
      evaluate_fn=evaluate_fn)
  history = start_simulation(
      client_fn=functools.partial(flower_client.client_fn, spec_path),
      num_clients=arrays.num_clients,
      client_resources={"num_cpus": cpus, "num_gpus": 0.0},
      config=ServerConfig(num_rounds=rounds),
      strategy=strategy,
      ray_init_args={"include_dashboard": False, "ignore_reinit_error": True,
                     "num_cpus": os.cpu_count(), "num_gpus": 0,
                     "_node_ip_address": "127.0.0.1",
                     # Ray's session files in the harness's temp folder (removed with it).
                     **({"_temp_dir": spec["ray_temp_dir"]} if spec.get("ray_temp_dir") else {}),
                     "object_store_memory": int(spec.get("ray_object_store_bytes")
                                                or 512 * 1024 * 1024)})
  rounds_done = len(history.losses_centralized)
  emit("done", evaluations=rounds_done, seconds=clock.seconds())


if __name__ == "__main__":
  main()
