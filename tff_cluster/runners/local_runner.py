"""The `local` runner: an algorithm's definition executed in-process.

No TFF. The clients' training arrays are placed on the device once
(concatenated, with each client's offset). Each round, the sampled clients'
batches become index batches into them (`schedule.stacked_padded_batches`:
the same batches, in the same order, as the `tff` runner's datasets), every
client padded to the largest step count of any client so that the shapes
never change. The round's whole client loop is then one compiled call: a
`tf.while_loop` over the stacked clients, each running its local SGD as a
`tf.while_loop` over its batches, the clients' sum carried in the loop and
their results and new states collected in `TensorArray`s. Nothing returns to
the host inside a round. XLA compiles it (`jit`) where that is faster:

  jit='auto'  on a GPU: yes; on a CPU: dense models (MCLR, MLP) yes,
              convolutional and recurrent models no (TF 2.14's XLA made CNN
              steps 10-30x slower on CPU; `benchmarks/runner_speed.py`
              measures LeNet-5 both ways);
              models with BatchNorm: no (their batches are sliced to the real
              size, a dynamic shape XLA cannot compile).
  jit='on'    always (refused for BatchNorm models, see above);
  jit='off'   never.

The server-side functions (broadcast, database, server update) run as
`tf.function`s on the same device.
"""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Sequence

import subprocess
import sys

import numpy as np
import tensorflow as tf

from tff_cluster.learning import functional
from tff_cluster.learning import schedule
from tff_cluster.learning import trainers
from tff_cluster import models
from tff_cluster.core import aggregators
from tff_cluster.core.definition import round_params
from tff_cluster.runners.base import RoundOutput, Runner, check_keys, combine_clients, to_numpy

JIT_CHOICES = ("auto", "on", "off")
BATCHING_CHOICES = ("auto", "sequential", "parallel")
# Clients trained side by side in one vectorized step, at most (a chunk;
# `--client_chunk`): 4 was the fastest width measured on CPUs
# (benchmarks/client_batching.py).
DEFAULT_CHUNK = 4
# A chunk may use at most this share of the memory available.
MEMORY_SHARE = 0.25


def available_memory(device: str) -> Optional[int]:
  """Bytes available for a chunk on `device`: on a CPU, MemAvailable of
  /proc/meminfo; on a GPU, the card's memory (`nvidia-smi`) less what
  TensorFlow's allocator holds there now (TF reserves the card for itself,
  so the card's own free figure says nothing); None where unknown."""
  if device.startswith("/GPU"):
    return _gpu_memory(device)
  if not device.startswith("/CPU"):
    return None
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return None


def _gpu_memory(device: str) -> Optional[int]:
  index = device.rsplit(":", 1)[-1]
  try:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,"
                          "nounits", f"--id={index}"], capture_output=True, text=True,
                         timeout=20)
    total = int(out.stdout.split()[0]) * 2**20
    held = int(tf.config.experimental.get_memory_info(device.lstrip("/"))["current"])
  except (OSError, ValueError, IndexError, KeyError, subprocess.SubprocessError):
    return None
  return max(0, total - held)


def chunk_bytes_per_client(num_params: int, activations: int, batch_size: int) -> int:
  """An upper estimate of one client's memory inside a chunk: 10 float32
  copies of its weights (start, current, anchor, velocity, gradients, their
  updates, delta, sums) and 4 of a batch's activations (forward, backward)."""
  return 4 * (10 * num_params + 4 * batch_size * activations)


def choose_device() -> str:
  """'/GPU:0' when TensorFlow sees a GPU, else '/CPU:0'."""
  return "/GPU:0" if tf.config.list_physical_devices("GPU") else "/CPU:0"


def resolve_jit(setting: str, family: str, exact_batches: bool, device: str) -> bool:
  """Whether to XLA-compile the client loop (see the module docstring)."""
  if setting not in JIT_CHOICES:
    raise ValueError(f"invalid --jit={setting}; valid: {', '.join(JIT_CHOICES)}")
  if setting == "on" and exact_batches:
    raise ValueError("invalid --jit=on for a model with BatchNorm: its batches must keep "
                     "their real size, which XLA cannot compile; valid: auto or off")
  if setting != "auto":
    return setting == "on"
  if exact_batches:
    return False
  return device.startswith("/GPU") or family == "dense"



# TensorFlow keeps every XLA-compiled function's machine code for the life of
# the process (a dropped runner's too), in about 10.5 memory maps a function on
# Linux (benchmarks/xla_compile_growth.py; a small run compiles some 150-220
# maps' worth). When the process reaches the kernel's limit on maps
# (vm.max_map_count, 65,530 by default) LLVM's next allocation fails and
# TensorFlow crashes the interpreter with a segmentation fault. A runner is
# refused instead while fewer than MAP_HEADROOM maps are left.
MAP_HEADROOM = 4000


class CompiledCodeLimit(RuntimeError):
  """This process is too close to the kernel's memory-map limit to compile
  another run with XLA (one line)."""


def memory_maps() -> Optional[tuple]:
  """(maps this process holds, the kernel's limit), or None where the system
  does not say (not Linux)."""
  try:
    with open("/proc/sys/vm/max_map_count") as f:
      limit = int(f.read())
    with open("/proc/self/maps", "rb") as f:
      held = sum(1 for _ in f)
  except (OSError, ValueError):
    return None
  return held, limit


def check_map_headroom(maps=None) -> None:
  """Raises `CompiledCodeLimit` when fewer than MAP_HEADROOM memory maps are
  left to this process; `maps`: (held, limit) (default `memory_maps()`)."""
  maps = memory_maps() if maps is None else maps
  if maps is None:
    return
  held, limit = maps
  if limit - held < MAP_HEADROOM:
    raise CompiledCodeLimit(
        f"this process holds {held:,} of the {limit:,} memory maps the kernel allows "
        "(vm.max_map_count): TensorFlow keeps every XLA-compiled function for the life of "
        "the process, and compiling another run would crash it; valid: a new process (a "
        "new notebook kernel), jit='off' (--jit=off), or a higher limit (sysctl -w "
        "vm.max_map_count=262144)")


# `--client_batching=auto`: side by side only where it was measured faster on
# that device kind for that model kind (docs/runners.md, "Clients side by
# side"); each entry's reason is written in config.json's runner_info.
AUTO_RULES = {
    ("gpu", "mlp"): ("parallel", "H100 (exported round, benchmarks/recorded/gpu_cohort_round"
                     ".csv): FEMNIST MLP, 20 clients x 10 epochs, 0.0294 s side by side "
                     "against 0.1111 s one after another"),
    ("gpu", "mclr"): ("sequential", "H100: Synthetic MCLR, 20 clients x 20 epochs, 0.5404 s "
                      "side by side against 0.5089 s one after another"),
    ("gpu", "cnn"): ("sequential", "not measured on a GPU in this runner's form (patches "
                     "times a matrix)"),
    ("gpu", "rnn"): ("sequential", "not measured on a GPU"),
    ("cpu", "any"): ("sequential", "CPUs (benchmarks/client_batching.py): side by side at "
                     "most 1.25x faster, slower for most tasks and chunk widths"),
}


def model_kind(model) -> str:
  """'mclr' (one Dense layer), 'mlp' (more), 'cnn' or 'rnn': the model kinds
  `AUTO_RULES` tells apart."""
  family = models.model_family(model)
  if family != "dense":
    return family
  return "mlp" if models.num_dense_layers(model) > 1 else "mclr"


def auto_rule(model, device: str):
  """(the `--client_batching=auto` choice, the measurement it rests on)."""
  if not device.startswith("/GPU"):
    return AUTO_RULES[("cpu", "any")]
  return AUTO_RULES[("gpu", model_kind(model))]


def auto_side_by_side(model, device: str) -> bool:
  return auto_rule(model, device)[0] == "parallel"


def resolve_client_batching(setting: str, forward_error: Optional[str], device: str) -> str:
  """'sequential' or 'parallel' (see `LocalRunner`); `forward_error` is why
  the model has no stateless forward (None when it has one)."""
  if setting not in BATCHING_CHOICES:
    raise ValueError(f"invalid --client_batching={setting}; valid: "
                     f"{', '.join(BATCHING_CHOICES)}")
  if setting == "parallel" and forward_error is not None:
    raise ValueError(f"invalid --client_batching=parallel for this model: {forward_error}; "
                     "valid: auto or sequential")
  if setting != "auto":
    return setting
  del device
  return "sequential" if forward_error is not None else "parallel"


def chunk_plan(num_steps: Sequence[int], width: int):
  """(order [num_chunks, width], bounds [num_chunks]): the clients
  (positions 0..n-1) from the most steps to the fewest, cut into chunks of
  `width`, the last chunk padded with its last client (trained twice, read
  once); `bounds` is each chunk's largest step count."""
  steps = np.asarray(num_steps, np.int64)
  order = np.argsort(-steps, kind="stable")
  n = len(order)
  chunks = -(-n // width)
  padded = np.concatenate([order, np.full(chunks * width - n, order[-1])]).astype(np.int32)
  bounds = steps[padded.reshape(chunks, width)[:, 0]].astype(np.int32)
  return padded.reshape(chunks, width), bounds


class RoundInputs(NamedTuple):
  """A call's stacked inputs, one row per client (`x`, `y`: every client's
  examples): what the compiled round functions take, and client `c`'s share
  of them what `client_work` trains on."""
  database: Any  # the definition's database of the call (None: it keys nothing)
  keys: Any  # each client's key (int32)
  received: Any  # what the server broadcast
  client_states: Any  # the stacked client states, or None
  indices: Any  # the padded batches' example indices (`schedule.stacked_padded_batches`)
  sizes: Any
  num_steps: Any
  seeds: Any
  x: Any
  y: Any
  offsets: Any = None  # each client's first row in x, y (int64)


def _input_spec(data) -> Optional[tf.TensorSpec]:
  """One example's input (shape, dtype) of the data's training inputs, or None."""
  found = data.example_input()
  return None if found is None else tf.TensorSpec(found[0], tf.as_dtype(found[1]))


def stack_client_states(client_states: Sequence[Any]):
  """The clients' states stacked leaf by leaf ([num_clients, ...] tensors).

  Leaves that are the same memory (e.g. CFL-MGD I's client buffers, which
  are views of their cluster's buffer) are converted once and gathered:
  converting 2,400 numpy buffers of 159,010 floats one by one took most of
  a rotated-MNIST round. States are never changed in place, so equal
  memory means equal values.
  """
  leaves_per_client = [tf.nest.flatten(s) for s in client_states]
  stacked = []
  for leaves in zip(*leaves_per_client):
    held, unique, index, seen = [], [], [], {}
    for leaf in leaves:
      a = np.asarray(leaf)
      held.append(a)  # alive until the stack: no address is reused meanwhile
      key = (a.__array_interface__["data"][0], a.shape, a.strides, a.dtype.str)
      if key not in seen:
        seen[key] = len(unique)
        unique.append(a)
      index.append(seen[key])
    table = tf.convert_to_tensor(np.stack(unique))
    stacked.append(table if len(unique) == len(leaves) else tf.gather(table, index))
  return tf.nest.pack_sequence_as(client_states[0], stacked)

class ServerSide(Runner):
  """What the in-process runners (`local`, `ray`) share: the server state as
  tensors on `self.device` and the definition's server functions there.
  Needs `self.definition`, `self.device` and a `self._server` dict."""

  def _server_fns(self, mode: str):
    """(broadcast_fn, database_fn, server_fn) of `mode`, as tf.functions."""
    if mode not in self._server:
      self._server[mode] = server_functions(self.definition, mode)
    return self._server[mode]

  def put_state(self, state):
    """The server state as tensors on this runner's device."""
    with tf.device(self.device):
      return tf.nest.map_structure(tf.convert_to_tensor, state)

  @staticmethod
  def numpy_state(state):
    return to_numpy(state)

  def server_update(self, mode: str, state, total):
    """The definition's server update of `mode` on this runner's device."""
    with tf.device(self.device):
      return self._server_fns(mode)[2](self.put_state(state), total)


class LocalRunner(ServerSide):
  """Runs a `Definition` in-process (see the module docstring).

  Args:
    definition: the algorithm's `Definition`.
    model_fn: builds a fresh built Keras model.
    loss: `tff_cluster.models` loss kind.
    data: the `FederatedData` (training arrays of every client).
    seed: the run's seed (fixes each client's shuffles, as the tff runner).
    jit: 'auto', 'on' or 'off'.
    device: a TF device string; default `choose_device()`.
    client_index: each of `data`'s clients' index in the whole federation
      (default: its position), which seeds its shuffles.
  """

  name = "local"

  def __init__(self, definition, model_fn, loss: str, data, seed: int,
               jit: str = "auto", device: Optional[str] = None,
               client_index: Optional[Sequence[int]] = None,
               client_batching: str = "auto", chunk: Optional[int] = None):
    self.definition = definition
    self.model_fn, self.loss, self.data = model_fn, loss, data  # (`make_evaluator`'s)
    self._data = data
    self._seed = seed
    # Client k's shuffles are seeded by its index in the whole federation
    # (`client_index[k]`; default k), so a shard of the clients (the `ray`
    # runner's actors) draws the same batches as the whole.
    self._client_index = (np.arange(len(data.client_ids)) if client_index is None
                          else np.asarray(client_index, np.int64))
    self.device = device or choose_device()
    with tf.device(self.device):
      self._model = model_fn()
    self.model_family = models.model_family(self._model)
    self.exact_batches = models.has_batch_statistics(self._model)
    self.jit = resolve_jit(jit, self.model_family, self.exact_batches, self.device)
    if self.jit:
      check_map_headroom()
    self._forward, forward_error = None, None
    if client_batching == "parallel" or (client_batching == "auto" and
                                         not getattr(definition, "sequential_only", "") and
                                         auto_side_by_side(self._model, self.device)):
      try:
        with tf.device(self.device):
          self._forward = functional.stateless_model(self._model, _input_spec(data))
      except functional.UnsupportedModel as e:
        forward_error = str(e)
    else:
      forward_error = "not asked for"
    self.client_batching = resolve_client_batching(client_batching, forward_error, self.device)
    self._batching_setting = client_batching
    self._num_params = models.num_parameters(self._model)
    # Floats of one example's activations (the input and every layer's
    # output), for a chunk's memory: only side by side, whose chain of layers
    # gives them (a subclassed model has no layer outputs to read).
    self._activations = None if self._forward is None else self._forward.activations
    self.chunk_capped: Optional[str] = None
    chunk = DEFAULT_CHUNK if chunk is None else chunk
    if int(chunk) < 1:
      raise ValueError(f"invalid chunk={chunk}; valid: 1 or more clients")
    self.chunk = int(chunk)
    self._loss = loss
    ys = [data.train[c][1] for c in data.client_ids]
    self._sizes = np.array([len(y) for y in ys], np.int64)
    self._offsets = np.concatenate([[0], np.cumsum(self._sizes)[:-1]]).astype(np.int64)
    # Every client's training rows in one pool on the device; images kept as
    # 8-bit codes stay codes there (`schedule.gather_rows` looks them up).
    self._x = schedule.device_rows([data.train[c][0] for c in data.client_ids], self.device)
    with tf.device(self.device):
      self._y = tf.constant(np.concatenate(ys))
    self._server: Dict[str, Any] = {}
    self._rounds: Dict[str, Any] = {}
    self._steps_cache: Dict[schedule.LocalWork, int] = {}

  def _max_steps(self, work: schedule.LocalWork) -> int:
    """The largest step count of any client: every client's index batches are
    padded to it, so each mode compiles once."""
    if work not in self._steps_cache:
      self._steps_cache[work] = max(1, max(work.num_steps(int(n)) for n in self._sizes))
    return self._steps_cache[work]

  def describe(self) -> Dict[str, Any]:
    """What `config.json` records about this runner."""
    info = {"runner": self.name, "device": self.device, "jit": self.jit,
            "model_family": self.model_family, "exact_batches": self.exact_batches,
            "client_batching": self.client_batching}
    if self._batching_setting == "auto":
      info["client_batching_auto"] = auto_rule(self._model, self.device)[1]
    if self.client_batching == "parallel":
      info["chunk"] = self.chunk
      info["chunk_bytes_per_client_b10"] = chunk_bytes_per_client(
          self._num_params, self._activations, 10)
    return info

  def _one_client(self, mode: str, bound=None, side_by_side: bool = False):
    """Client c of a round's stacked inputs -> (summed, result, state).
    `side_by_side`: local SGD on the weights as values (`FunctionalTrainer`,
    whose loops run `bound` masked iterations when `bound` is given)."""
    d, model, loss = self.definition, self._model, self._loss
    keyed = d.num_keys(mode) > 0  # the client's key goes to `client_work`

    def one(c, inputs: RoundInputs):
      if side_by_side:
        trainer = functional.FunctionalTrainer(self._forward, loss, inputs.x, inputs.y,
                                               bound=bound)
      else:
        trainer = trainers.PaddedTrainer(model, loss, inputs.x, inputs.y,
                                         exact_batches=self.exact_batches)
      key = tf.gather(inputs.keys, c) if keyed else None
      selected = None if inputs.database is None else tf.nest.map_structure(
          lambda t: tf.gather(t, key), inputs.database)
      client_state = None if inputs.client_states is None else tf.nest.map_structure(
          lambda t: tf.gather(t, c), inputs.client_states)
      data = schedule.PaddedBatches(
          tf.gather(inputs.indices, c), tf.gather(inputs.sizes, c),
          tf.gather(inputs.num_steps, c), tf.gather(inputs.seeds, c),
          None if inputs.offsets is None else tf.gather(inputs.offsets, c))
      out = d.client_work(trainer, selected, inputs.received, client_state, data, mode,
                          **({"key": key} if keyed else {}))
      return out.summed, out.result, () if out.state is None else out.state

    return one

  def _round_fn(self, mode: str, inputs: RoundInputs):
    """Trains every client of the round in one compiled call: a
    `tf.while_loop` over the stacked clients whose carry holds the running
    sum, their results and new states going to `TensorArray`s."""
    if mode in self._rounds:
      return self._rounds[mode]
    # Traced once: the trace that gives the outputs' specs is the function
    # the loop calls (a second trace in the loop's body was about a sixth
    # of short runs' time: the local resume tests, 33 of 222 s).
    one = tf.function(self._one_client(mode), autograph=False)
    summed_spec, result_spec, state_spec = output_specs(one, inputs)

    @tf.function(jit_compile=self.jit, autograph=False)
    def round_fn(inputs: RoundInputs, count):
      # `count` (a tensor) of the `num_clients` stacked clients are trained,
      # the rest are padding (see `train_clients`), never run; None: all of
      # them (the loop's bound then is a constant, as it always was for local).
      num_clients = inputs.indices.shape[0]
      bound = num_clients if count is None else count

      def arrays(spec):
        return [tf.TensorArray(s.dtype, size=num_clients, element_shape=s.shape)
                for s in tf.nest.flatten(spec)]

      def body(c, total, results, states):
        summed, result, state = one(c, inputs)
        total = aggregators.Sum.add(total, summed)
        results = [a.write(c, v) for a, v in zip(results, tf.nest.flatten(result))]
        states = [a.write(c, v) for a, v in zip(states, tf.nest.flatten(state))]
        return c + 1, total, results, states

      zeros = tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), summed_spec)
      _, total, results, states = tf.while_loop(
          lambda c, *_: c < bound, body,
          (tf.constant(0), zeros, arrays(result_spec), arrays(state_spec)))
      stack = lambda spec, arrs: tf.nest.pack_sequence_as(  # noqa: E731
          spec, [a.stack() for a in arrs])
      return total, stack(result_spec, results), stack(state_spec, states)

    self._rounds[mode] = round_fn
    return round_fn

  def _chunk_width(self, count: int, batch_size: int) -> int:
    """`self.chunk` clients (at most `count`), fewer where a chunk's estimated
    memory would pass MEMORY_SHARE of what is available (then
    `chunk_capped` says so, and a line goes to stderr once)."""
    width = min(self.chunk, count)
    available = available_memory(self.device)
    if available is None:
      return width
    per_client = chunk_bytes_per_client(self._num_params, self._activations, batch_size)
    fits = max(1, int(MEMORY_SHARE * available // per_client))
    if fits < width:
      text = (f"client_batching: chunks of {fits} clients, not {width}: about "
              f"{per_client / 2**20:.1f} MiB per client, {available / 2**20:.0f} MiB available")
      if self.chunk_capped != text:
        print(f"warning: {text}", file=sys.stderr)
      self.chunk_capped = text
      return fits
    return width

  def _parallel_round_fn(self, mode: str, inputs: RoundInputs):
    """Trains the round's clients side by side: chunks of `self.chunk`
    clients (from the most steps to the fewest, `chunk_plan`), each chunk one
    `tf.vectorized_map` of the client function whose loops run the chunk's
    largest step count, a client's later steps masked; a `tf.while_loop`
    over the chunks writes each chunk's sums, results and states, and the
    sums are then added in client order (the sequential loop's order)."""
    key = ("parallel", mode)
    if key in self._rounds:
      return self._rounds[key]
    summed_spec, result_spec, state_spec = output_specs(
        tf.function(self._one_client(mode, side_by_side=True), autograph=False), inputs)

    @tf.function(jit_compile=self.jit, autograph=False)
    def round_fn(inputs: RoundInputs, order, bounds, inverse):
      num_chunks, width = order.shape

      def arrays(spec):
        return [tf.TensorArray(s.dtype, size=num_chunks, element_shape=[width] + s.shape)
                for s in tf.nest.flatten(spec)]

      def body(j, total, results, states):
        one = self._one_client(mode, bound=bounds[j], side_by_side=True)
        def client(c):
          out = one(c, inputs)
          # An output that is the same for every client (e.g. the round's
          # learning rate) made to depend on c (+ 0): pfor's stacking of an
          # output taken straight from a captured input does not compile
          # under XLA.
          return tf.nest.map_structure(
              lambda v: v if v.dtype == tf.bool else v + tf.cast(0 * c, v.dtype), out)

        summed, result, state = tf.vectorized_map(client, order[j],
                                                  fallback_to_while_loop=False)
        sums = [a.write(j, v) for a, v in zip(total, tf.nest.flatten(summed))]
        results = [a.write(j, v) for a, v in zip(results, tf.nest.flatten(result))]
        states = [a.write(j, v) for a, v in zip(states, tf.nest.flatten(state))]
        return j + 1, sums, results, states

      _, sums, results, states = tf.while_loop(
          lambda j, *_: j < num_chunks, body,
          (tf.constant(0), arrays(summed_spec), arrays(result_spec), arrays(state_spec)))

      def unchunk(spec, arrs):
        return tf.nest.pack_sequence_as(spec, [
            tf.gather(tf.reshape(a.stack(), [num_chunks * width] + s.shape), inverse)
            for s, a in zip(tf.nest.flatten(spec), arrs)])

      # The clients' sum in client order, as the sequential loop adds them
      # (the same float32 additions in the same order: equal totals).
      per_client = tf.nest.flatten(unchunk(summed_spec, sums))

      def add(c, total):
        return c + 1, [t + tf.gather(s, c) for t, s in zip(total, per_client)]

      zeros = [tf.zeros(s.shape, s.dtype) for s in tf.nest.flatten(summed_spec)]
      _, total = tf.while_loop(lambda c, *_: c < tf.shape(inverse)[0], add,
                               (tf.constant(0), zeros))
      total = tf.nest.pack_sequence_as(summed_spec, total)
      return total, unchunk(result_spec, results), unchunk(state_spec, states)

    self._rounds[key] = round_fn
    return round_fn

  def run(self, mode: str, state, clients: Sequence[int], round_num: int,
          work: schedule.LocalWork, lr: float,
          keys: Optional[Sequence[int]] = None,
          client_states: Optional[List[Any]] = None) -> RoundOutput:
    """One call of `mode` for `clients` (indices into the data's clients)."""
    with tf.device(self.device):
      state = self.put_state(state)
      total, per_client, new_states = self.train_clients(
          mode, state, clients, round_num, work, lr, keys, client_states)
      total, per_client = combine_clients(self.definition, mode, total, per_client)
      new_server_state = self.server_update(mode, state, total)
    return RoundOutput(new_server_state, total, per_client, new_states)

  def train_clients(self, mode: str, state, clients: Sequence[int], round_num: int,
                    work: schedule.LocalWork, lr: float,
                    keys: Optional[Sequence[int]] = None,
                    client_states: Optional[List[Any]] = None, pad_to: int = 0):
    """The client half of `run`: (the clients' sum, one result per client,
    one new state per client or None), all numpy; no server update.

    `pad_to`: where the number of clients varies from call to call (a
    shard's share of a round's sample), the stacked inputs are padded to
    `pad_to` clients by repeating the last one, so that one compiled round
    serves every call; the padding is never trained.
    """
    d = self.definition
    clients = [int(k) for k in clients]
    count = len(clients)
    dynamic = pad_to > 0  # the loop's bound a tensor: one trace for every count
    if dynamic and 0 < count < pad_to:
      size = pad_to
      clients = clients + [clients[-1]] * (size - count)
      if keys is not None:
        keys = list(keys) + [keys[-1]] * (size - count)
      if client_states is not None:
        client_states = list(client_states) + [client_states[-1]] * (size - count)
    batches = schedule.stacked_padded_batches(
        self._sizes[clients], self._offsets[clients], work,
        [schedule.client_seed(self._seed, round_num, int(self._client_index[k]))
         for k in clients],
        self._max_steps(work))
    if d.num_keys(mode):
      check_keys(keys, d.num_keys(mode), len(clients))
      key_array = np.asarray(keys, np.int32)
    else:
      key_array = np.zeros(len(clients), np.int32)
    with tf.device(self.device):
      state = self.put_state(state)
      stacked_states = None
      if client_states is not None:
        stacked_states = stack_client_states(client_states)
      broadcast_fn, database_fn, _ = self._server_fns(mode)
      received = broadcast_fn(state, round_params(lr))
      database = database_fn(state) if d.num_keys(mode) else None
      inputs = RoundInputs(database, key_array, received, stacked_states, batches.indices,
                           batches.sizes, batches.num_steps, batches.seed, self._x, self._y,
                           batches.offset if d.example_rows else None)
      if self.client_batching == "parallel" and count:
        # Only the first `count` clients are trained (the rest pad a shard).
        order, bounds = chunk_plan(batches.num_steps[:count],
                                   self._chunk_width(count, work.batch_size))
        inverse = np.empty(count, np.int32)
        inverse[order.reshape(-1)[:count]] = np.arange(count, dtype=np.int32)
        total, results, new_states = self._parallel_round_fn(mode, inputs)(
            inputs, order, bounds, inverse)
      else:
        total, results, new_states = self._round_fn(mode, inputs)(
            inputs, tf.constant(count) if dynamic else None)
    # Each client's slice is copied out of the round's stacked arrays: a view
    # would keep all of them alive for as long as any one client's state is
    # kept (with model-size client states, memory grew with the rounds).
    box = [results]
    del results
    per_client = split_clients(box, count)
    if client_states is None:
      return to_numpy(total), per_client, None
    box = [new_states]
    del new_states
    return to_numpy(total), per_client, split_clients(box, count)


def split_clients(box: List[Any], count: int) -> List[Any]:
  """The first `count` clients' slices of a round's stacked outputs, each a
  copy (numpy). `box`: a one-item list holding the stacked outputs, emptied
  here, so that a leaf's tensor is freed once its slices are out: at most one
  leaf is held twice (100 clients of a 1.2M-parameter model: 483 MB a copy)."""
  stacked = box.pop()
  leaves = tf.nest.flatten(stacked)
  skeleton = tf.nest.map_structure(lambda _: 0, stacked)
  del stacked
  columns = []
  for j in range(len(leaves)):
    array = np.asarray(leaves[j])
    leaves[j] = None
    columns.append([array[i].copy() for i in range(count)])
    del array
  return [tf.nest.pack_sequence_as(skeleton, [column[i] for column in columns])
          for i in range(count)]


def output_specs(one, inputs: RoundInputs):
  """The output structure (shapes, dtypes) of client function `one` (a
  `tf.function`) on a round's stacked inputs, from its trace."""
  traced = one.get_concrete_function(tf.constant(0), inputs)
  return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype),
                               traced.structured_outputs)


def server_functions(definition, mode: str):
  """(broadcast_fn, database_fn, server_fn) of `definition`'s `mode`, as
  tf.functions."""
  d = definition
  return (tf.function(lambda state, params: d.broadcast(state, params, mode), autograph=False),
          tf.function(lambda state: d.database(state, mode), autograph=False),
          tf.function(lambda state, summed: d.server_update(state, summed, mode),
                      autograph=False))
