"""Progress bars: `tqdm.auto`, a widget in a notebook (Jupyter, Colab; where
ipywidgets is installed) and text on a terminal or in a log."""

from __future__ import annotations


def progress_bar(**kwargs):
  """A tqdm bar of `kwargs`. `disable=None`: drawn in a notebook or on a
  terminal only (tqdm's notebook bar draws whatever `disable=None` says)."""
  from tqdm.auto import tqdm  # a dependency of the package; deferred: it imports IPython's state
  return tqdm(**kwargs)
