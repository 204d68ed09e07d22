"""Which stack this process runs on: TensorFlow Federated present or not, which Keras.

tff-cluster installs on two stacks (README, "Install"):

* today's stack (the default): Python 3.10-3.13, TensorFlow 2.16+ with Keras 3
  (or Keras 2 through the `legacy-keras` extra and TF_USE_LEGACY_KERAS=1); the
  `local` runner, the CLI and the API;
* the TFF stack (the `tff` extra): Python 3.10/3.11, TensorFlow 2.14.1 and
  TensorFlow Federated 0.87.0, for the `tff` runner and the TFF
  computations.

Nothing here imports TensorFlow or TFF: the checks read package metadata, so
the CLI answers a `--runner=tff` it cannot serve at once.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import tempfile
from importlib import metadata
from typing import Optional

TFF_VERSION = "0.87.0"

ROUTES = ("the TFF stack: `UV_PROJECT_ENVIRONMENT=.venv-tff uv sync --extra tff` on "
          "Python 3.10/3.11, or `pip install --no-deps -r requirements-tff.txt` then "
          "`pip install --no-deps .` in a Python 3.10/3.11 virtual environment; "
          "never a plain `pip install tensorflow-federated` on Python 3.12+ (it "
          "resolves to 0.1.0 from 2019)")


RAY_MISSING = ("--runner=ray needs Ray, which is not installed; install the ray extra (pip "
               "install 'tff-cluster[ray]', or uv sync --extra ray; today's stack only, not "
               "with the tff extra)")


class TffUnavailableError(ImportError):
  """TensorFlow Federated 0.87 cannot be imported here; the message is one line."""


def _version(package: str) -> Optional[str]:
  try:
    return metadata.version(package)
  except metadata.PackageNotFoundError:
    return None


def tff_problem() -> Optional[str]:
  """Why the `tff` runner cannot run here (one line), or None when TFF 0.87 is
  installed. Reads metadata only; the import itself may still fail."""
  version = _version("tensorflow-federated")
  if version is None or importlib.util.find_spec("tensorflow_federated") is None:
    return (f"TensorFlow Federated is not installed (Python "
            f"{sys.version_info.major}.{sys.version_info.minor}); the tff runner and "
            f"the TFF computations need {ROUTES}. The local runner needs no TFF")
  if version != TFF_VERSION:
    return (f"tensorflow-federated {version} is installed, but the tff runner needs "
            f"{TFF_VERSION} (TensorFlow 2.14.1, Python 3.10/3.11): {ROUTES}. The local "
            "runner needs no TFF")
  return None


def has_module(name: str) -> bool:
  """Whether `name` can be imported here (found, not imported)."""
  return importlib.util.find_spec(name) is not None


def require_tff() -> None:
  """Raises `TffUnavailableError` (one line naming both install routes) unless
  TFF 0.87 is installed. Called before any `import tensorflow_federated`."""
  problem = tff_problem()
  if problem is not None:
    raise TffUnavailableError(problem)


def legacy_keras_requested() -> bool:
  """Whether TF_USE_LEGACY_KERAS asks TensorFlow 2.16+ for Keras 2 (tf_keras)."""
  return os.environ.get("TF_USE_LEGACY_KERAS", "").strip().lower() in ("1", "true", "yes")


def _minor(version: str) -> tuple:
  return tuple(int(part) for part in re.findall(r"\d+", version)[:2])


def keras_problem() -> Optional[str]:
  """Why tf.keras cannot be what TF_USE_LEGACY_KERAS asks for (one line), or
  None. With the variable set, TensorFlow 2.16+ takes Keras 2 from tf_keras,
  whose minor version must be TensorFlow's."""
  if not legacy_keras_requested():
    return None
  tf_version = _version("tensorflow")
  if tf_version is None or _minor(tf_version) < (2, 16):
    return None  # TensorFlow 2.15 and older are Keras 2 already
  tf_keras = _version("tf-keras")
  fix = ("`pip install '.[legacy-keras]'` (or `pip install \"tf-keras~={}.0\"`), or unset "
         "TF_USE_LEGACY_KERAS for Keras 3".format(".".join(map(str, _minor(tf_version)))))
  if tf_keras is None:
    return (f"TF_USE_LEGACY_KERAS=1 asks TensorFlow {tf_version} for Keras 2, but tf-keras is "
            f"not installed: {fix}")
  if _minor(tf_keras) != _minor(tf_version):
    return (f"TF_USE_LEGACY_KERAS=1 asks for Keras 2, but tf-keras {tf_keras} does not match "
            f"TensorFlow {tf_version}: {fix}")
  return None


def versions() -> dict:
  """Python's and the installed numpy, TensorFlow, Keras, tf_keras and TFF
  versions (None: not installed), and whether TF_USE_LEGACY_KERAS is set."""
  return {"python": sys.version.split()[0],
          "numpy": _version("numpy"),
          "tensorflow": _version("tensorflow"),
          "keras": _version("keras"),
          "tf_keras": _version("tf-keras"),
          "tf_use_legacy_keras": legacy_keras_requested(),
          "tensorflow_federated": _version("tensorflow-federated")}


# What TensorFlow 2.20+'s C++ code prints at import whatever TF_CPP_MIN_LOG_LEVEL
# says (its messages before absl::InitializeLog go straight to stderr): notes
# on oneDNN, on missing CUDA drivers and on CPU instructions. Anything else it
# prints is passed on.
_IMPORT_NOTES = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written "
    r"to STDERR|I\d{4} [\d:.]+ +\d+ (port|cudart_stub|cpu_feature_guard|cuda_executor|"
    r"gpu_device)\.cc:\d+\] .*)$")

_LOG_LINE = re.compile(r"^[IWEF]\d{4} [\d:.]+ +\d+ \S+:\d+\] ")


def without_import_notes(text: str) -> list:
  """The lines of `text` that are not TensorFlow's start-up notes (a note's
  continuation lines go with it)."""
  kept, dropping = [], False
  for line in text.splitlines():
    if _LOG_LINE.match(line) or line.startswith("WARNING: All log messages"):
      dropping = bool(_IMPORT_NOTES.match(line))
    if line and not dropping:
      kept.append(line)
  return kept


def import_tensorflow():
  """`import tensorflow`, without the informational lines TensorFlow 2.20+
  writes to the process's stderr while it loads (the CLI's output stays one
  line on bad input). Other output of the import is written through."""
  if "tensorflow" in sys.modules:
    return sys.modules["tensorflow"]
  sys.stderr.flush()
  try:
    saved = os.dup(2)
  except OSError:  # no file descriptor 2: nothing to keep quiet
    import tensorflow
    return tensorflow
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      import tensorflow
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      kept = without_import_notes(captured.read().decode(errors="replace"))
      if kept:
        sys.stderr.write("\n".join(kept) + "\n")
  return tensorflow
