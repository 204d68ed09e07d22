"""The public entry point of every algorithm: a process object that cannot be misused.

    process = tff_cluster.api.build("fedgroup", model_fn, loss, client_lr=0.01,
                                    local_epochs=10, batch_size=10, num_groups=5)
    state = process.initialize(data)            # FedGroup: the group cold start runs here
    out = process.next(state, ["f_00001", ...])  # client ids; keys and groups handled inside
    out.state, out.metrics, out.client_results  # like tff.learning's LearningProcessOutput
    process.get_model_weights(out.state)        # one ModelWeights per model / cluster
    process.evaluate(out.state)                 # test metrics of every client

For TFF research pipelines, `computations(algo, model_fn, loss, element_spec,
options)` returns an algorithm's definition and its raw TFF computations (the
`tff` runner's), and `tff_cluster.algorithms.fedavg.build_fedavg` a
`tff.learning` process. The process object sits on a runner
(`runner='local'`, TFF-free; `'tff'`; or `'ray'`, local's client loop on Ray
actors) and the algorithm's host side, and checks what it is given:

* `build(algo, model_fn, loss, **settings)` takes every training and runner
  setting of the CLI by its flag's name (`SETTINGS`; not clients_per_round:
  `next` is given its clients) and the algorithm's options, built and checked
  by the constructor the CLI builds a run's settings with
  (`TrainingConfig.checked`, through `training_config`); `Process(algo,
  model_fn, loss, training, options)` takes them as values.
* `initialize(data)` takes a `FederatedData` (or a pair of TFF `ClientData`,
  train and test) and runs the algorithm's set-up, e.g. FedGroup's cold
  start. Only a state made by `initialize` (or returned by `next`) of this
  process is accepted by `next`; a state from another process, or an object
  of another type, is refused with a `TypeError`.
* `next(state, clients)` takes client ids (or indices into the data's
  clients); unknown or repeated clients, and test-only clients (no training
  data), are refused with a `ValueError` naming them and what is valid. The
  algorithm picks each client's key/group itself.
  `next` may be given an older state: the process returns to it first.
* `state_to_bytes(state)` / `state_from_bytes(payload)` write a state (the
  server's, every client's and the host's) as bytes and restore it into an
  initialized process with the same settings and data (a program's state
  manager keeps them; `tff_cluster.tff_program.train_program`).
* The model is a Keras `model_fn` (a fresh model per call: a
  `keras.Sequential` with or without `keras.Input`, a functional or a
  subclassed model; one without weights yet is built by `initialize` for the
  data's input shape) and a loss:
  a Keras loss object or name for sparse categorical cross-entropy on logits
  (`tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)`) or
  binary cross-entropy on a sigmoid output (`from_logits=False`), or the
  library's kinds `'sparse_ce_logits'` / `'binary_probs'`. Other losses, and
  `tff.learning.models` functional models, are refused with a clear message:
  both runners train Keras variables with these two losses.
* Initial weights are optional: without them the model's own initializer,
  seeded by `seed`.
* `client_batching='parallel'` (clients side by side) takes any Keras 3
  model whose layers have side-by-side forms (convolutions, BatchNorm,
  Dropout, recurrent layers among them; `learning/layer_forms.py`), and under
  tf_keras a `keras.Sequential` or functional chain of Dense, Flatten,
  Reshape and Activation layers; any other model is refused by `build` in one
  line (`'auto'` trains it one client at a time).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Union

import numpy as np

from tff_cluster import models, registry, stack
from tff_cluster.learning import functional
from tff_cluster.learning import layer_forms
from tff_cluster.learning import optimizers
from tff_cluster.spec import hparams as hp
from tff_cluster.data.client_data import from_client_data
from tff_cluster.learning.evaluation import Evaluator, deployment
from tff_cluster.host import round as host_round
from tff_cluster.host.model_spec import ModelSpec
from tff_cluster.host import driver as host_driver
from tff_cluster.host.driver import Context, LossRatio, TrainingConfig
from tff_cluster.core.definition import LocalSolver
from tff_cluster.io import checkpoint
from tff_cluster.data.federated import FederatedData
from tff_cluster.sweep.driver import sweep  # noqa: F401  (the API's: a grid of runs, docs/sweeps.md)

_PROCESS_IDS = itertools.count()


class ModelWeights(NamedTuple):
  """One model's weights (the field names of `tff.learning.models.ModelWeights`)."""
  trainable: List[np.ndarray]
  non_trainable: List[np.ndarray]


@dataclasses.dataclass(frozen=True)
class ProcessState:
  """An opaque state of one process (made only by `initialize` and `next`)."""
  process_id: int
  round_num: int
  snapshot: Any = dataclasses.field(repr=False, compare=False)


@dataclasses.dataclass(frozen=True)
class ProcessOutput:
  """What `next` returns (cf. `tff.learning.templates.LearningProcessOutput`).

  state: the new state; metrics: the round's training metrics (train_loss,
  bytes, the algorithm's own) and, when evaluated, test_accuracy, test_loss,
  test_accuracy_clientavg, test_macro_f1, test_accuracy_client_mean and
  test_accuracy_p10/_p50/_p90 (`host.round.EVAL_METRICS`); client_results: client id ->
  {'model': the index of the model (cluster/group) it uses now, -1 if none}
  for every client of the data.
  """
  state: ProcessState
  metrics: Dict[str, Any]
  client_results: Dict[str, Dict[str, Any]]


def _check_model_fn(model_fn):
  if stack.keras_problem() is not None:
    raise ImportError(stack.keras_problem())
  import tensorflow as tf
  if not callable(model_fn):
    raise TypeError(f"model_fn must be a function returning a fresh Keras model, got "
                    f"{type(model_fn).__name__}")
  model = model_fn()
  other = _other_keras(model, tf.keras.Model)
  if other:
    raise TypeError(other)
  if not isinstance(model, tf.keras.Model):
    raise TypeError(f"model_fn returned a {type(model).__name__}; valid: a "
                    "tf.keras.Model (tff.learning.models functional models are not "
                    "supported: the runners train Keras variables)")
  if model.built and not model.weights:
    raise ValueError("model_fn returned a Keras model without weights; valid: a model "
                     "with at least one weight to train")
  if models.has_weights(model) and _no_trainable_problem(model):
    raise ValueError(_no_trainable_problem(model))
  return model


def _no_trainable_problem(model) -> Optional[str]:
  """One line when the (built) model has nothing to train, else None."""
  if model.trainable_variables:
    return None
  return (f"model_fn's model has no trainable variables ({len(model.weights)} weights, all "
          "non-trainable: layers frozen with trainable=False?); valid: a model with at "
          "least one trainable weight")


# The rounds a process plans for when `rounds` is not given (the last one is
# evaluated whatever `eval_every`).
DEFAULT_ROUNDS = 100
# The settings `build` takes besides the algorithm's options and the model's:
# every training and runner setting of the CLI (`SETTINGS`, the same
# names) but clients_per_round, since `next` is given its clients.
SETTINGS = tuple(name for name in host_driver.SETTINGS if name != "clients_per_round")


def _in_api_words(error: hp.HParamError, given) -> hp.HParamError:
  """A refusal of a setting (in flag words) as the API says it: argument=value
  with Python values (`given`: the argument's), the choices quoted."""
  decl = error.setting
  if decl is None:
    return hp.HParamError(str(error).replace("--", ""))
  valid = error.valid or decl.valid_text()
  if decl.choices:
    valid = ", ".join(repr(c) for c in decl.choices)
  elif decl.type is bool:
    valid = "True or False"
  return hp.HParamError(f"invalid {decl.name}={given!r}; valid: {valid}")


def training_config(**settings) -> TrainingConfig:
  """`TrainingConfig.checked` of `settings` (`SETTINGS` by name;
  `rounds` `DEFAULT_ROUNDS` when not given; clients_per_round every client
  with training data), each refusal one line in the API's words."""
  unknown = sorted(set(settings) - set(SETTINGS))
  if unknown:
    raise ValueError(f"unknown setting {unknown[0]!r}; valid: {', '.join(SETTINGS)}")
  try:
    return TrainingConfig.checked(**{"rounds": DEFAULT_ROUNDS, **settings})
  except hp.HParamError as e:
    raise _in_api_words(e, settings.get(e.setting.name) if e.setting else None) from None


def _declared_input_shape(model) -> Optional[tuple]:
  """One example's input shape the model declares (None: any size on that
  axis), or None when it declares none (a subclassed model) or several inputs."""
  spec = models.model_input_spec(model)
  return None if spec is None else tuple(None if d is None else int(d) for d in spec.shape)


def _first_line(e: Exception) -> str:
  return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _model_data_problem(model, loss: str, data: FederatedData) -> Optional[str]:
  """One line when `model` does not fit `data` under `loss` (its input width,
  its outputs against the classes, the labels against the loss), else None.
  Checked before any training, on two of the data's examples."""
  shape, dtype = _data_input(data)
  declared = _declared_input_shape(model)
  if declared is not None and (len(declared) != len(shape) or any(
      d is not None and d != s for d, s in zip(declared, shape))):
    shown = tuple("None" if d is None else d for d in declared)
    return (f"initialize(): model_fn's model takes inputs of shape {shown} per example "
            f"but the data's examples have shape {shape} ({dtype}); valid: a model whose "
            f"input matches the data")
  x = next(np.asarray(data.train[c][0])[:2] for c in data.client_ids
           if len(data.train[c][0]))
  try:
    out = model(x, training=False)
  except Exception as e:  # noqa: BLE001  (Keras raises many types for a bad input)
    return (f"initialize(): model_fn's model cannot be applied to the data's inputs of "
            f"shape {shape} ({dtype}): {_first_line(e)}")
  if isinstance(out, (list, tuple, dict)):
    return (f"initialize(): model_fn's model returns {len(out)} outputs; valid: one "
            "output tensor")
  out = np.asarray(out)
  if out.ndim != 2:
    return (f"initialize(): model_fn's model gives outputs of shape {out.shape[1:]} per "
            "example; valid: one vector per example (shape (k,))")
  width = int(out.shape[1])
  classes = data.num_classes
  if loss == models.SPARSE_CE_LOGITS and width != classes:
    return (f"initialize(): model_fn's model has {width} outputs but the data has "
            f"{classes} classes (labels 0..{classes - 1}); valid: a model with {classes} "
            "outputs, one logit per class, for SparseCategoricalCrossentropy"
            "(from_logits=True)")
  if loss == models.BINARY_PROBS and width != 1:
    return (f"initialize(): model_fn's model has {width} outputs; valid: one sigmoid "
            "output (the probability of label 1) for BinaryCrossentropy"
            "(from_logits=False), or SparseCategoricalCrossentropy(from_logits=True) "
            f"with {classes} outputs")
  valid_labels = ("0 or 1 for BinaryCrossentropy(from_logits=False)"
                  if loss == models.BINARY_PROBS else
                  f"integers 0..{classes - 1} (the data's num_classes={classes})")
  for split_name, split in (("training", data.train), ("test", data.test)):
    for c in data.client_ids:
      y = np.asarray(split[c][1])
      if not len(y):
        continue
      if y.dtype.kind not in "iub":
        if y.dtype.kind != "f":
          return (f"initialize(): client {c!r}'s {split_name} labels are {y.dtype}; "
                  f"valid: {valid_labels}")
        bad = ~np.isfinite(y) | (y != np.round(y))
        if bad.any():
          return (f"initialize(): client {c!r} has {split_name} label "
                  f"{y.reshape(-1)[int(np.argmax(bad.reshape(-1)))].item()!r}; valid: "
                  f"{valid_labels}")
      high = 2 if loss == models.BINARY_PROBS else classes
      bad = (y < 0) | (y >= high)
      if bad.any():
        return (f"initialize(): client {c!r} has {split_name} label "
                f"{y.reshape(-1)[int(np.argmax(bad.reshape(-1)))].item()!r}; valid: "
                f"{valid_labels}")
  if loss == models.BINARY_PROBS and (not np.all(np.isfinite(out)) or out.min() < 0
                                      or out.max() > 1):
    bad = out[~np.isfinite(out) | (out < 0) | (out > 1)].reshape(-1)[0]
    return (f"initialize(): model_fn's model outputs {float(bad):g}, not a probability; "
            "valid: a sigmoid output for BinaryCrossentropy(from_logits=False), or logits "
            f"with SparseCategoricalCrossentropy(from_logits=True) and {classes} outputs")
  return None


def _side_by_side_problem(model, input_spec=None) -> Optional[str]:
  """Why `model` cannot train clients side by side (one line, the API's
  words), or None. Without weights yet (or, under Keras 3, without an input
  shape: `input_spec`, else the model's own), only its class and layer types
  are read; otherwise its side-by-side function is made and checked
  (`functional.stateless_model`)."""
  keras3 = hasattr(model, "stateless_call")
  problem = (layer_forms.side_by_side_problem(model) if keras3
             else functional.chain_problem(model))
  known = input_spec is not None or models.model_input_spec(model) is not None
  if problem is None and models.has_weights(model) and (known or not keras3):
    try:
      functional.stateless_model(model, input_spec)
    except functional.UnsupportedModel as e:
      problem = str(e)
  if problem is None:
    return None
  needs = ("a Keras 3 model whose layers have side-by-side forms" if keras3 else
           f"a keras.Sequential or functional model whose layers are one chain of "
           f"{functional.CHAIN_LAYERS}")
  return (f"client_batching='parallel' needs {needs}; {problem}; valid for "
          "this model: client_batching='auto' or 'sequential'")


def _data_input(data: FederatedData):
  """(one example's shape, dtype) of the data's training inputs."""
  found = data.example_input()
  if found is not None:
    return found
  raise ValueError("initialize(): no client has training data; valid: data with at "
                   "least one client holding training samples")


def _keras_package(cls) -> str:
  """'keras' (Keras 3) or 'tf_keras' (Keras 2): the package a Keras class comes from."""
  for klass in cls.__mro__:
    root = klass.__module__.split(".")[0]
    if root in ("keras", "tf_keras"):
      return root
    if klass.__module__.startswith("tensorflow.python.keras"):
      return "tf_keras"
  return ""


def _other_keras(model, tf_keras_model) -> Optional[str]:
  """One line when `model` is a model of the other Keras than `tf.keras` (whose
  choice TF_USE_LEGACY_KERAS makes), else None."""
  mine, theirs = _keras_package(tf_keras_model), _keras_package(type(model))
  if not mine or not theirs or mine == theirs:
    return None
  name = {"keras": "Keras 3 (`keras`)", "tf_keras": "Keras 2 (`tf_keras`)"}
  fix = ("set TF_USE_LEGACY_KERAS=1 before TensorFlow is imported (and install the "
         "legacy-keras extra)" if theirs == "tf_keras" else
         "unset TF_USE_LEGACY_KERAS (it must not be 1 when TensorFlow is imported)")
  return (f"model_fn returned a {name[theirs]} model, but tf.keras is {name[mine]} in "
          f"this process; build the model with tf.keras, or {fix}")


class Process:
  """One algorithm on one runner; see the module docstring."""

  def __init__(self, algo: str, model_fn, loss, training: TrainingConfig,
               options: Optional[Dict[str, Any]] = None, *, initial_weights=None,
               evaluate: bool = True):
    """`training`: the training and runner settings (`training_config`);
    `options`: the algorithm's, by name (checked here, the declared defaults
    filling the rest); `initial_weights`: the model's (default its own
    initializer, seeded by `training.seed`); `evaluate`: test every client
    after every `training.eval_every`-th round (and round `training.rounds`)."""
    spec = registry.get_algorithm(algo)  # KeyError names the valid algorithms
    declared = {d.name: d for d in spec.hparams}
    options = dict(options or {})
    unknown = sorted(set(options) - set(declared))
    if unknown:
      raise ValueError(f"unknown setting {unknown[0]!r} for {algo}; valid: "
                       f"{', '.join([*sorted(declared), *SETTINGS])}")
    for name, value in options.items():  # each by its declaration, in the API's words
      try:
        declared[name].check(value)
      except hp.HParamError as e:
        raise _in_api_words(e, value) from None
    resolved = spec.options(**options)  # checked, the declared defaults filled in
    if not isinstance(evaluate, bool):
      raise ValueError(f"invalid evaluate={evaluate!r}; valid: True or False")
    runner = training.runner
    if runner.name == "tff":
      stack.require_tff()
    model = _check_model_fn(model_fn)
    if runner.client_batching == "parallel" and runner.name != "tff":
      problem = _side_by_side_problem(model)
      if problem is not None:
        raise ValueError(problem)
    self.algo = algo
    self.loss = models.loss_kind(loss)
    self._model_fn = model_fn
    self._model: Optional[ModelSpec] = None  # made by initialize: built for the data
    self._layout = self._num_trainable = None
    if models.has_weights(model):
      self._set_layout(model)
    self._training = training
    self._options = resolved
    self._all_clients = spec.all_clients
    self._initial_weights = None if initial_weights is None else [
        np.asarray(w) for w in initial_weights]
    if self._layout is not None:
      self._check_initial_weights()
    self._evaluate = evaluate
    self._id = next(_PROCESS_IDS)
    self._driver = None
    self._loss_ratio = None
    self._data: Optional[FederatedData] = None
    self._evaluator = None
    self._latest: Optional[ProcessState] = None

  # -- the model -------------------------------------------------------------

  def _set_layout(self, model) -> None:
    self._layout = [v.shape for v in models.model_variables(model)]
    self._num_trainable = len(model.trainable_variables)

  def _check_initial_weights(self) -> None:
    if self._initial_weights is None:
      return
    shapes = [tuple(w.shape) for w in self._initial_weights]
    if shapes != [tuple(s) for s in self._layout]:
      raise ValueError(f"initial_weights have shapes {shapes}; valid: the model's "
                       f"{[tuple(s) for s in self._layout]} (trainable, then "
                       "non-trainable)")

  def _built_model_fn(self, data: FederatedData):
    """A model function whose models have their weights: `model_fn` itself
    when its models come built, else one that builds each for the data's
    input shape (a keras.Sequential without keras.Input, a subclassed model
    never called). Sets the weight layout from it."""
    if self._layout is not None:
      return self._model_fn
    shape, dtype = _data_input(data)
    model_fn = functools.partial(models.built_model, self._model_fn, shape, dtype)
    try:
      model = model_fn()
    except Exception as e:  # noqa: BLE001  (Keras raises many types for a bad shape)
      first = (str(e).strip().splitlines() or [type(e).__name__])[0]
      raise ValueError(f"initialize(): model_fn's model cannot be built for the data's "
                       f"inputs of shape {shape} ({dtype}): {first}") from None
    if not model.weights:
      raise ValueError("model_fn returned a Keras model without weights; valid: a model "
                       "with at least one weight to train")
    if _no_trainable_problem(model):
      raise ValueError(_no_trainable_problem(model))
    runner = self._training.runner
    if runner.client_batching == "parallel" and runner.name != "tff":
      import tensorflow as tf
      problem = _side_by_side_problem(model, tf.TensorSpec(shape, tf.as_dtype(dtype)))
      if problem is not None:
        raise ValueError(problem)
    self._set_layout(model)
    self._check_initial_weights()
    return model_fn

  # -- data ----------------------------------------------------------------

  @staticmethod
  def _as_federated_data(client_data, client_data_args) -> FederatedData:
    if isinstance(client_data, FederatedData):
      if client_data_args:
        raise TypeError(f"{', '.join(sorted(client_data_args))} apply to a (train, test) pair "
                        "of TFF ClientData only, not to a FederatedData")
      return client_data
    if isinstance(client_data, (tuple, list)) and len(client_data) == 2:
      return from_client_data(client_data[0], client_data[1], **client_data_args)
    raise TypeError(f"client data must be a FederatedData or a (train, test) pair of TFF "
                    f"ClientData, got {type(client_data).__name__}")

  # -- the process ---------------------------------------------------------

  def initialize(self, client_data, *, x_key: str = "x", y_key: str = "y",
                 flatten: bool = False, num_classes: Optional[int] = None) -> ProcessState:
    """Builds the runner on `client_data` and runs the algorithm's set-up (cold
    start). Returns the first state.

    `client_data`: a `FederatedData`, or a (train, test) pair of TFF
    `ClientData`, whose elements' input and label keys are `x_key` and `y_key`
    (TFF's EMNIST: 'pixels' and 'label'), inputs reshaped to vectors with
    `flatten`, and `num_classes` default 1 + the largest label
    (`tff_cluster.data.client_data.from_client_data`)."""
    defaults = dict(x_key="x", y_key="y", flatten=False, num_classes=None)
    given = dict(x_key=x_key, y_key=y_key, flatten=flatten, num_classes=num_classes)
    pair_args = {k: v for k, v in given.items() if v != defaults[k]}
    data = self._as_federated_data(client_data, pair_args)
    if self._driver is not None:
      raise RuntimeError("this process is already initialized; build a new process "
                         "for other data (states of one process cannot mix with another's)")
    if data.num_training_clients == 0:
      raise ValueError("initialize(): no client has training data; valid: data with at "
                       "least one client holding training samples")
    model_fn = self._built_model_fn(data)
    problem = _model_data_problem(model_fn(), self.loss, data)
    if problem is not None:
      raise ValueError(problem)
    self._model = ModelSpec(model_fn, self.loss)
    config = dataclasses.replace(self._training,
                                 clients_per_round=data.num_training_clients)
    driver = registry.build_driver(self.algo, self._model, data, config, self._options,
                                   initial_weights=self._initial_weights)
    # The divergence rule of the training loop (`training.divergence_ratio`).
    self._loss_ratio = LossRatio(self._model, data, driver.w0, config.divergence_ratio,
                                 evaluator=driver.make_evaluator("train"))
    driver.setup()
    self._driver, self._data = driver, data
    self._evaluator = Evaluator(self._model.model_fn, self.loss, data)
    self._latest = ProcessState(self._id, 0, driver.snapshot())
    return self._latest

  def _check_state(self, state) -> None:
    if not isinstance(state, ProcessState):
      raise TypeError(f"state must be a ProcessState from this process's initialize() or "
                      f"next(), got {type(state).__name__}")
    if state.process_id != self._id or self._driver is None:
      raise TypeError("state belongs to another process; valid: a state returned by this "
                      "process's initialize() or next()")

  def _client_indices(self, clients) -> np.ndarray:
    ids = self._data.client_ids
    index = {c: i for i, c in enumerate(ids)}
    out = []
    for c in clients:
      if isinstance(c, (int, np.integer)) and not isinstance(c, bool):
        if not 0 <= int(c) < len(ids):
          raise ValueError(f"invalid client index {int(c)}; valid: 0..{len(ids) - 1}")
        out.append(int(c))
      elif c in index:
        out.append(index[c])
      else:
        raise ValueError(f"unknown client {c!r}; valid: the ids of the data given to "
                         f"initialize() (e.g. {ids[0]!r}) or indices 0..{len(ids) - 1}")
    if len(set(out)) != len(out):
      raise ValueError("a client appears twice in one round; valid: distinct clients")
    if not out:
      raise ValueError("next() needs at least one client")
    test_only = self._data.test_only()
    bad = [ids[k] for k in out if test_only[k]]
    if bad:
      raise ValueError(f"client {bad[0]!r} is test-only (it has no training data) and is "
                       "never trained; valid: clients with training data")
    training = self._data.num_training_clients
    if self._all_clients and len(out) != training:
      raise ValueError(f"{self.algo} trains every client every round; valid: all "
                       f"{training} clients with training data")
    return np.sort(np.asarray(out, np.int64))

  def next(self, state: ProcessState, clients: Optional[Sequence[Union[str, int]]] = None
           ) -> ProcessOutput:
    """One round on `clients` (ids or indices; default every client with
    training data; test-only clients are refused)."""
    self._check_state(state)
    driver = self._driver
    if state is not self._latest:
      driver.restore(driver.snapshot_numpy(state.snapshot))
    if clients is None:  # every client with training data
      clients = self._data.training_clients().tolist()
    sampled = self._client_indices(clients)
    round_num = state.round_num + 1
    training = self._training
    evaluate = self._evaluate and (round_num % training.eval_every == 0
                                   or round_num == training.rounds)
    outcome = host_round.run_round(driver, round_num, sampled,
                                   self._evaluator if evaluate else None, self._loss_ratio)
    client_model = (outcome.client_model if outcome.result is None
                    else outcome.result.client_model)
    new = ProcessState(self._id, round_num, driver.snapshot())
    self._latest = new
    return ProcessOutput(new, outcome.metrics, self._client_results(client_model))

  def _client_results(self, client_model) -> Dict[str, Dict[str, Any]]:
    ids = self._data.client_ids
    if deployment(client_model).rule:
      return {c: {"model": -1} for c in ids}
    assignment = np.asarray(client_model).reshape(-1)
    return {c: {"model": int(assignment[i]) if assignment[i] >= 0 else -1}
            for i, c in enumerate(ids)}

  def _restore(self, state: ProcessState) -> None:
    self._check_state(state)
    if state is not self._latest:
      self._driver.restore(self._driver.snapshot_numpy(state.snapshot))
      self._latest = state

  def state_to_bytes(self, state: ProcessState) -> bytes:
    """`state` (server state, every client state, the host's state and its
    round) as bytes, no pickle: what a program's state manager saves."""
    self._check_state(state)
    return checkpoint.dumps({"round": state.round_num,
                             "driver": self._driver.snapshot_numpy(state.snapshot)})

  def state_from_bytes(self, payload: bytes) -> ProcessState:
    """The state `state_to_bytes` wrote, restored into this initialized
    process (the same algorithm, settings and data); `next` goes on from it."""
    if self._driver is None:
      raise RuntimeError("initialize() this process first (the same data and settings as "
                         "the process that saved the state)")
    saved = checkpoint.loads(payload)
    self._driver.restore(saved["driver"])
    self._latest = ProcessState(self._id, int(saved["round"]), self._driver.snapshot())
    return self._latest

  def get_model_weights(self, state: ProcessState) -> List[ModelWeights]:
    """Every model of `state` (one, or one per cluster/group/ensemble member)."""
    self._restore(state)
    weights, _ = self._driver.eval_models()
    n = self._num_trainable
    return [ModelWeights([np.asarray(w) for w in m[:n]], [np.asarray(w) for w in m[n:]])
            for m in weights]

  def evaluate(self, state: ProcessState, client_data=None, *, x_key: str = "x",
               y_key: str = "y", flatten: bool = False,
               num_classes: Optional[int] = None) -> Dict[str, Any]:
    """Test metrics of `state` on the test data of `client_data` (default the
    data given to initialize; other data must have the same client ids when
    the algorithm assigns models per client): a `FederatedData` or a (train,
    test) pair of TFF `ClientData`, with `initialize`'s keys and options."""
    self._restore(state)
    weights, client_model = self._driver.eval_models()
    evaluator = self._evaluator
    if client_data is not None:
      defaults = dict(x_key="x", y_key="y", flatten=False, num_classes=None)
      given = dict(x_key=x_key, y_key=y_key, flatten=flatten, num_classes=num_classes)
      data = self._as_federated_data(
          client_data, {k: v for k, v in given.items() if v != defaults[k]})
      if deployment(client_model).per_client and data.client_ids != self._data.client_ids:
        raise ValueError("evaluate(): the data's client ids differ from initialize()'s; "
                         "valid: the same clients (each is tested with its own model)")
      problem = _model_data_problem(self._model.model_fn(), self.loss, data)
      if problem is not None:
        raise ValueError(problem.replace("initialize():", "evaluate():", 1))
      evaluator = Evaluator(self._model.model_fn, self.loss, data)
    result = evaluator.evaluate(weights, client_model)
    return {**host_round.eval_metrics(result),
            "client_model": np.asarray(result.client_model).tolist()}


def build(algo: str, model_fn, loss, *, initial_weights=None, evaluate: bool = True,
          **settings) -> Process:
  """The process of `algo` (see `Process` and the module docstring):
  `settings` are the training and runner settings (`SETTINGS`, the CLI's
  flags of the same names, checked by `training_config`) and the
  algorithm's options, by name."""
  spec = registry.get_algorithm(algo)  # KeyError names the valid algorithms
  own = {d.name for d in spec.hparams}
  options = {name: value for name, value in settings.items() if name in own}
  unknown = sorted(set(settings) - own - set(SETTINGS))
  if unknown:
    raise ValueError(f"unknown setting {unknown[0]!r} for {algo}; valid: "
                     f"{', '.join([*sorted(own), *SETTINGS])}")
  training = training_config(**{name: value for name, value in settings.items()
                                if name not in own})
  return Process(algo, model_fn, loss, training, options,
                 initial_weights=initial_weights, evaluate=evaluate)


def computations(algo: str, model_fn, loss, element_spec, options=None, data=None,
                 client_momentum: float = 0.0, server_optimizer=None, client_optimizer=None):
  """An algorithm's TFF computations, for TFF research pipelines.

  Returns `(definition, {mode: computation})`: the algorithm's `Definition`
  made from its `options` (a mapping of its option names to values, checked;
  the declared defaults fill the rest) and `tff_runner.build_computations` of
  it. Each computation is called `(state, params, datasets[, keys][,
  client_states]) -> (state, summed, per-client results[, client_states])`;
  its `.computation` is the TFF computation itself, every output at SERVER
  (the per-client outputs gathered with their positions; see
  `tff_cluster.runners.tff.runner`); the state starts as
  `definition.initial_state(weights)`. `data` (a `FederatedData`) is read by
  the definitions made from the clients (CFL-MGD's number of clients,
  pFedMo's public set, FedSoft's and FedRC's sizes; without it they are
  refused in one line); `client_momentum` is the clients' heavy-ball beta
  (a buffer that starts at zero every round). `server_optimizer` /
  `client_optimizer`: a `tff.learning.optimizers` optimizer (or a
  `learning.optimizers` chain) replacing the definition's server optimizer /
  the clients' local step (`optimizers.from_tff`). What the host does between
  modes (cold starts, assignments) is the algorithm's driver's. The TFF
  stack only.
  """
  spec = registry.get_algorithm(algo)
  stack.require_tff()
  from tff_cluster.runners.tff import runner as tff_runner
  model = _check_model_fn(model_fn)
  if not models.has_weights(model):  # built for the batches' inputs
    x = element_spec["x"]
    model_fn = functools.partial(models.built_model, model_fn,
                                 tuple(x.shape)[1:], x.dtype.name)
    model = model_fn()
  spec.check_client_momentum(client_momentum, "client_momentum")
  if client_optimizer is not None and (spec.own_momentum or client_momentum):
    raise ValueError(f"invalid client_optimizer for {algo}: "
                     f"{spec.own_momentum or 'client_momentum is given too'}; valid: None")
  local = None if client_optimizer is None else optimizers.from_tff(client_optimizer)
  context = Context(ModelSpec(model_fn, models.loss_kind(loss)), data, None,
                    spec.options(**dict(options or {})), models.weights_type_spec(model),
                    len(model.trainable_variables), models.get_weights(model),
                    LocalSolver(float(client_momentum), optimizer=local))
  definition = spec.load_definition()(context)
  if server_optimizer is not None:
    definition = definition.with_server_optimizer(optimizers.from_tff(server_optimizer))
  return definition, tff_runner.build_computations(definition, model_fn, models.loss_kind(loss),
                                                   element_spec)
