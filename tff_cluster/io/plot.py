"""Curves of one or more runs, from their result directories.

  python -m tff_cluster.io.plot RUN_DIR [RUN_DIR ...] [--out plot.png]
                             [--metric test_accuracy] [--title TEXT]
                             [--separate_seeds] [--dpi 120]

Each RUN_DIR is a directory written by `run_experiment.py` (its `metrics.csv`,
or `metrics.jsonl` when there is no CSV, and `config.json`, read by
`tff_cluster.io.rundir`). Runs whose
settings differ only by `--seed` form one group, drawn as the mean over the
seeds with a +/- one standard deviation band (sample std; the legend says how
many seeds). The title names what all runs share (algorithm, task, model and
the key settings); each legend entry names its algorithm, the settings that
set it apart from the other groups, and its seeds. Panels: the metric, each
group's accuracy (columns `group_<j>_accuracy`, when a single run is drawn) and
the training loss.

The per-run `accuracy.png` that a run writes at its end (`ResultsWriter.plot`)
is drawn by `plot_runs` here too, and a clustered algorithm's `groups.png`
(each client's group per round, from `groups.csv`) by `plot_groups`. Nothing
here imports TensorFlow.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import os
import re
import sys
import textwrap
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from tff_cluster.spec import hparams as hp
from tff_cluster.io import rundir

PROG = "python -m tff_cluster.io.plot"

# The settings that define a run (config.json keys, `rundir`'s, from their
# declarations), in the order labels name them. First the key settings, which
# a title always names: what ran, the number of groups, the learning rate, the
# local work and the runner. Then the algorithm's options (from the config),
# then the rest: the sizes a single run's title names, the number of clients,
# the other training and execution settings and the data settings; the seed
# is what a curve averages over, and `client_chunk` (how many clients train
# side by side) changes no number. Then the task's arguments, as name=value.
KEY_SETTINGS = (*rundir.IDENTITY, hp.NUM_GROUPS.name, hp.CLIENT_LR.name,
                hp.LOCAL_EPOCHS.name, hp.LOCAL_STEPS.name, hp.RUNNER.name)
TITLE_SIZES = (hp.BATCH_SIZE.name, hp.CLIENTS_PER_ROUND.name, hp.ROUNDS.name)
OTHER_SETTINGS = (
    *TITLE_SIZES, "num_clients",
    *(n for n in (*rundir.TRAINING_SETTINGS, *rundir.EXECUTION_SETTINGS)
      if n not in (*KEY_SETTINGS, *TITLE_SIZES, hp.SEED.name, hp.CLIENT_CHUNK.name)),
    *rundir.DATA_SETTINGS)
# Names shown in titles and legends (the others as they are; what ran by its value).
SHORT_NAMES = {hp.NUM_GROUPS.name: "groups", hp.CLIENT_LR.name: "lr",
               hp.LOCAL_EPOCHS.name: "E", hp.LOCAL_STEPS.name: "steps",
               hp.BATCH_SIZE.name: "B", hp.CLIENTS_PER_ROUND.name: "clients/round"}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")
GROUP_ACCURACY = re.compile(r"^group_(\d+)_accuracy$")
MAX_MARKERS = 30  # per line; longer runs mark every n-th point


class PlotError(ValueError):
  """Bad input to the plot tool; the message is the one line shown."""


@dataclasses.dataclass
class Run:
  """One run directory: its config (empty without config.json), its columns in
  file order and its rows (column -> float; NaN/inf as such; None for an empty
  cell, a value not computed that round)."""
  path: str
  config: Dict[str, Any]
  columns: List[str]
  rows: List[Dict[str, Optional[float]]]

  @property
  def name(self) -> str:
    return os.path.basename(os.path.normpath(self.path)) or self.path

  @property
  def seed(self) -> Optional[int]:
    seed = self.config.get("seed")
    return int(seed) if isinstance(seed, (int, float)) and not isinstance(seed, bool) \
        else None


@dataclasses.dataclass
class RunGroup:
  """Runs that differ only by seed; `settings` is what they share."""
  settings: Dict[str, Any]
  runs: List[Run]

  @property
  def seeds(self) -> List[Optional[int]]:
    return [r.seed for r in self.runs]


# ---------------------------------------------------------------------------
# Reading


def load_run(run_dir: str) -> Run:
  """A run directory's config and metrics (`rundir.read_config`,
  `rundir.read_metrics`). Raises PlotError (one line)."""
  if not os.path.exists(run_dir):
    raise PlotError(f"run directory {run_dir} does not exist; valid: a directory "
                    "written by run_experiment.py (its --output_dir)")
  if not os.path.isdir(run_dir):
    raise PlotError(f"{run_dir} is not a directory; valid: a run directory written by "
                    "run_experiment.py (its --output_dir)")
  try:
    columns, rows = rundir.read_metrics(run_dir)
  except rundir.RunDirError as e:
    raise PlotError(str(e)) from None
  try:
    config = rundir.read_config(run_dir, missing_ok=True)
  except rundir.RunDirError as e:
    raise PlotError(f"{e}; valid: the config.json a run wrote") from None
  return Run(run_dir, config, columns, rows)


# ---------------------------------------------------------------------------
# Grouping and labels


def run_settings(config: Mapping[str, Any]) -> Dict[str, Any]:
  """The settings that define a run (the seed aside), from its config.json:
  the training settings, the algorithm's options and the task's arguments
  (as applied, where the config records them)."""
  out: Dict[str, Any] = {}
  for name in KEY_SETTINGS:
    if config.get(name) is not None:
      out[name] = config[name]
  for name, value in sorted((config.get("algo_options") or {}).items()):
    if value is not None and name not in out:
      out[name] = value
  for name in OTHER_SETTINGS:
    if config.get(name) is not None:
      out[name] = config[name]
  task_args = config.get("task_args_applied")
  if task_args is None:
    task_args = config.get("task_args") or {}
  for name, value in sorted(task_args.items()):
    out[f"task_arg.{name}"] = value
  return out


def group_runs(runs: Sequence[Run], separate_seeds: bool = False) -> List[RunGroup]:
  """Runs with equal settings (the seed aside) in one group, in order of first
  appearance; a run without config.json is a group of its own."""
  groups: List[RunGroup] = []
  for run in runs:
    settings = run_settings(run.config) if run.config else {"run": run.name}
    match = None if separate_seeds or not run.config else next(
        (g for g in groups if g.settings == settings and g.runs[0].config), None)
    if match is None:
      groups.append(RunGroup(settings, [run]))
    else:
      match.runs.append(run)
  return groups


def _label_value(value: Any) -> str:
  """A setting's value in a label: `hparams.format_value`'s text, floats in
  their shortest form (`%g`)."""
  if isinstance(value, float):
    return f"{value:g}"
  return hp.format_value(value)


def _setting_text(name: str, value: Any) -> str:
  if name in (*rundir.IDENTITY, "run"):
    return _label_value(value)
  return f"{SHORT_NAMES.get(name, name)}={_label_value(value)}"


def _ordered_names(groups: Sequence[RunGroup]) -> List[str]:
  names: Dict[str, None] = dict.fromkeys(KEY_SETTINGS)
  for g in groups:
    for name in g.settings:
      names.setdefault(name)
  return list(names)


def seeds_text(seeds: Sequence[Optional[int]]) -> str:
  """'seed 0', or 'mean ± std of 2 seeds (0, 1)'."""
  known = [s for s in seeds if s is not None]
  listed = ", ".join(str(s) for s in known) if len(known) == len(seeds) else "?"
  if len(seeds) == 1:
    return f"seed {listed}" if known else ""  # a run without config.json
  return f"mean ± std of {len(seeds)} seeds ({listed})"


def describe(groups: Sequence[RunGroup]) -> Tuple[str, List[str]]:
  """(title, one legend label per group).

  The title holds what every group shares: algorithm, task, model and the key
  settings (and the seeds, for a single group). Each label names its
  algorithm, every setting whose value differs between the groups, and its
  seeds."""
  names = _ordered_names(groups)
  missing = object()
  common = [n for n in names
            if len({repr(g.settings.get(n, missing)) for g in groups}) == 1
            and n in groups[0].settings]
  key = {*KEY_SETTINGS, "run"}  # "run": a run without config.json
  # A key setting differs when its values (or its absence) differ; any other
  # setting (e.g. an algorithm's option) when the groups that have it differ
  # in it: one that only some groups' algorithm has is implied by the name.
  differing = [n for n in names if n not in common and (
      len({repr(g.settings[n]) for g in groups if n in g.settings}) > 1
      or (n in key and any(n in g.settings for g in groups)))]
  parts = []
  shared = {n: groups[0].settings[n] for n in common}
  if "algo" in shared and "task" in shared:
    parts.append(f"{shared['algo']} on {shared['task']}")
  elif "task" in shared:
    parts.append(str(shared["task"]))
  elif "algo" in shared:
    parts.append(str(shared["algo"]))
  if "run" in shared:
    parts.append(str(shared["run"]))
  parts += [_setting_text(n, shared[n]) for n in common
            if n in key and n not in ("algo", "task", "run")]
  if len(groups) == 1:
    parts += [_setting_text(n, shared[n]) for n in common if n not in key and n != "run"
              and n in TITLE_SIZES]
    parts.append(seeds_text(groups[0].seeds))
  title = ", ".join(p for p in parts if p)
  labels = []
  for g in groups:
    bits = [_setting_text(n, g.settings[n]) for n in differing if n in g.settings]
    if "algo" in common and len(groups) > 1:
      bits.insert(0, str(shared["algo"]))
    labels.append(", ".join(b for b in bits + [seeds_text(g.seeds)] if b))
  return title, labels


def metric_label(metric: str) -> str:
  return metric.replace("_", " ")


# ---------------------------------------------------------------------------
# Series


def _finite(value: Optional[float]) -> bool:
  return value is not None and math.isfinite(value)


def series(group: RunGroup, column: str):
  """(rounds, mean, std, n) of `column` over the group's runs, per round where
  any run has a value; the mean and the sample std are over the runs with a
  finite value there (std 0 with one run, NaN mean with none)."""
  import numpy as np
  by_round: Dict[float, List[float]] = {}
  for run in group.runs:
    for row in run.rows:
      value = row.get(column)
      if value is not None:
        by_round.setdefault(row["round"], []).append(value)
  rounds = sorted(by_round)
  mean, std, count = [], [], []
  for r in rounds:
    finite = [v for v in by_round[r] if math.isfinite(v)]
    count.append(len(finite))
    mean.append(float(np.mean(finite)) if finite else math.nan)
    std.append(float(np.std(finite, ddof=1)) if len(finite) > 1 else 0.0)
  return (np.asarray(rounds), np.asarray(mean), np.asarray(std), np.asarray(count))


def group_columns(run: Run) -> List[Tuple[int, str]]:
  """(j, column) of the run's `group_<j>_accuracy` columns with any value."""
  found = []
  for c in run.columns:
    m = GROUP_ACCURACY.match(c)
    if m and any(row.get(c) is not None for row in run.rows):
      found.append((int(m.group(1)), c))
  return sorted(found)


def _last_value(run: Run, column: str) -> Optional[float]:
  for row in reversed(run.rows):
    if _finite(row.get(column)):
      return row[column]
  return None


# ---------------------------------------------------------------------------
# Drawing


def _markevery(n: int) -> int:
  return max(1, int(math.ceil(n / MAX_MARKERS)))


def _style(ax, ylabel: str) -> None:
  from matplotlib.ticker import MaxNLocator
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  ax.set_xlabel("round")
  ax.set_ylabel(ylabel)
  ax.grid(alpha=0.3)


def _draw_groups(ax, groups, column, labels, colors) -> bool:
  drawn = False
  for i, (g, label) in enumerate(zip(groups, labels)):
    rounds, mean, std, _ = series(g, column)
    if not len(rounds):
      continue
    color = colors[i % len(colors)]
    ax.plot(rounds, mean, color=color, marker=MARKERS[i % len(MARKERS)], markersize=4,
            markevery=_markevery(len(rounds)), linewidth=1.5, label=label)
    if len(g.runs) > 1:
      ax.fill_between(rounds, mean - std, mean + std, color=color, alpha=0.18,
                      linewidth=0)
    drawn = True
  return drawn


def plot_runs(runs: Sequence[Run], out: str, metric: str = "test_accuracy",
              title: Optional[str] = None, separate_seeds: bool = False,
              dpi: int = 120) -> str:
  """Draws `runs` into `out` (format from its extension); returns `out`.

  Panels: `metric` per group (mean ± std over seeds), each group's accuracy
  when one run is drawn and it has `group_<j>_accuracy` columns, and the
  training loss when any run has one.
  """
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  groups = group_runs(runs, separate_seeds)
  auto_title, labels = describe(groups)
  title = auto_title if title is None else title
  single = len(runs) == 1
  per_group = group_columns(runs[0]) if single else []
  show_loss = metric != "train_loss" and any(
      any(r.get("train_loss") is not None for r in run.rows) for run in runs)
  panels = 1 + bool(per_group) + show_loss
  legend_rows = 0 if len(groups) == 1 else int(math.ceil(len(groups) / min(len(groups), 2)))
  fig = plt.figure(figsize=(4.6 * panels + 0.4, 3.9 + 0.25 * legend_rows),
                   layout="constrained")
  axes = fig.subplots(1, panels, squeeze=False)[0]
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]

  ax = axes[0]
  _draw_groups(ax, groups, metric, labels, colors)
  _style(ax, metric_label(metric))
  ax.set_title(metric_label(metric), fontsize="medium")
  next_ax = 1
  if per_group:
    gax = axes[next_ax]
    next_ax += 1
    run = runs[0]
    for i, (j, column) in enumerate(per_group):
      points = [(row["round"], row[column]) for row in run.rows
                if row.get(column) is not None]
      size = _last_value(run, f"group_{j}_size")
      label = f"group {j}" + (f" ({int(size)} clients)" if size is not None else "")
      gax.plot([p[0] for p in points], [p[1] for p in points],
               color=colors[i % len(colors)], marker=MARKERS[i % len(MARKERS)],
               markersize=3.5, markevery=_markevery(len(points)), linewidth=1.2,
               label=label)
    _style(gax, "test accuracy")
    gax.set_title("test accuracy per group", fontsize="medium")
    if len(per_group) <= 4:
      gax.legend(fontsize="x-small", loc="best", framealpha=0.8)
    else:  # beside the panel, clear of the curves
      gax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0),
                 ncol=1 if len(per_group) <= 12 else 2, frameon=False)
  if show_loss:
    lax = axes[next_ax]
    _draw_groups(lax, groups, "train_loss", labels, colors)
    _style(lax, "train loss")
    lax.set_title("train loss", fontsize="medium")
  width_chars = int(26 * panels + 10)
  fig.suptitle("\n".join(textwrap.wrap(title, width_chars)), fontsize="medium")
  if len(groups) > 1:
    handles, texts = axes[0].get_legend_handles_labels()
    line_chars = int(13 * panels + 6)  # per legend column at font size "small"
    ncol = 2 if max(len(t) for t in texts) <= line_chars else 1
    texts = ["\n".join(textwrap.wrap(t, line_chars * (3 - ncol))) for t in texts]
    fig.legend(handles, texts, loc="outside lower center", ncol=min(len(groups), ncol),
               fontsize="small", frameon=False)
  fig.savefig(out, dpi=dpi)
  plt.close(fig)
  return out


# ---------------------------------------------------------------------------
# Groups over rounds (groups.png)

NO_GROUP = -1  # groups.csv's -1: the client is in no group that round
NOT_KNOWN = -2  # an empty wide cell / before a long file's first line: not known
# Neutral colours, apart from every group's: light grey for "no group", white
# for "not known".
NO_GROUP_COLOR = (0.8, 0.8, 0.8)
NOT_KNOWN_COLOR = (1.0, 1.0, 1.0)
# The figure is 800 x 500 pixels (8 x 5 inches at 100 dpi): more rows or
# columns than this could not be told apart, so larger tables are thinned to
# evenly spaced clients (of the sorted order) and rounds (the first and the
# last kept).
MAX_GROUP_ROUNDS = 400
MAX_GROUP_CLIENTS = 400
GROUPS_FIGSIZE = (8.0, 5.0)
GROUPS_DPI = 100
MAX_GROUP_LEGEND = 20


@dataclasses.dataclass
class GroupsTable:
  """Each client's group per round: `groups[i, t]` is client `client_ids[i]`'s
  group in round `rounds[t]` (NO_GROUP, NOT_KNOWN or an index >= 0);
  `total_rounds` counts the rounds before any were left out."""
  client_ids: List[str]
  rounds: Any  # np.ndarray [T]
  groups: Any  # np.ndarray [clients, T], int64
  total_rounds: int


def spread(n: int, k: int):
  """At most `k` evenly spaced indices of range(n), the first and last kept."""
  import numpy as np
  if n <= k:
    return np.arange(n)
  return np.unique(np.round(np.linspace(0, n - 1, k)).astype(np.int64))


def read_groups(path: str, rounds: Optional[Sequence[int]] = None,
                max_rounds: int = MAX_GROUP_ROUNDS) -> GroupsTable:
  """A run's groups.csv, wide (`round`, then a column per client; an empty
  row: not known that round) or long (`round,client,group` lines for the
  clients whose group changed: a client's group in round r is its last line
  at a round <= r, NOT_KNOWN before its first). At most `max_rounds` rounds
  are read (`spread`). `rounds`: the rounds to show (a long file writes none
  for a round without changes; default: its rounds 1..last). A torn line (a
  run killed mid-write) is skipped."""
  import numpy as np
  with open(path, newline="") as f:
    lines = f.read().splitlines()
  if not lines:
    raise PlotError(f"{path} is empty; valid: a groups.csv a run wrote")
  header = next(csv.reader([lines[0]]))
  if header == ["round", "client", "group"]:
    return _read_groups_long(lines[1:], rounds, max_rounds)
  if not header or header[0] != "round":
    raise PlotError(f"{path} does not start with a `round` column; valid: a groups.csv "
                    "a run wrote")
  width = len(header)
  numbered = []
  for line in lines[1:]:
    head = line.split(",", 1)[0]
    if head.isdigit():
      numbered.append((int(head), line))
  if rounds is not None:
    wanted = {int(r) for r in rounds}
    numbered = [n for n in numbered if n[0] in wanted]
  total = len(numbered)
  kept_rounds, columns = [], []
  for i in spread(total, max_rounds):
    round_num, line = numbered[int(i)]
    cells = next(csv.reader([line]))
    if len(cells) != width:
      continue  # a torn line
    if cells[1] == "":
      columns.append(np.full(width - 1, NOT_KNOWN, np.int64))
    else:
      columns.append(np.array(cells[1:], np.int64))
    kept_rounds.append(round_num)
  groups = (np.stack(columns, axis=1) if columns
            else np.zeros((width - 1, 0), np.int64))
  return GroupsTable(header[1:], np.asarray(kept_rounds, np.int64), groups, total)


def _read_groups_long(lines: Sequence[str], rounds: Optional[Sequence[int]],
                      max_rounds: int) -> GroupsTable:
  import numpy as np
  index: Dict[str, int] = {}
  line_round, line_client, line_group = [], [], []
  for cells in csv.reader(lines):
    if len(cells) != 3 or not cells[0].isdigit():
      continue
    try:
      group = int(cells[2])
    except ValueError:
      continue  # a torn line
    line_round.append(int(cells[0]))
    line_client.append(index.setdefault(cells[1], len(index)))
    line_group.append(group)
  line_round = np.asarray(line_round, np.int64)
  order = np.argsort(line_round, kind="stable")
  line_round = line_round[order]
  line_client = np.asarray(line_client, np.int64)[order]
  line_group = np.asarray(line_group, np.int64)[order]
  if rounds is None:
    rounds = np.arange(1, int(line_round[-1]) + 1 if len(line_round) else 1)
  rounds = np.asarray(sorted(int(r) for r in rounds), np.int64)
  total = len(rounds)
  rounds = rounds[spread(total, max_rounds)]
  current = np.full(len(index), NOT_KNOWN, np.int64)
  groups = np.empty((len(index), len(rounds)), np.int64)
  done = 0
  for t, r in enumerate(rounds):
    upto = int(np.searchsorted(line_round, r, side="right"))
    # One round's lines name each client once; rounds apply in order.
    while done < upto:
      end = int(np.searchsorted(line_round, line_round[done], side="right"))
      current[line_client[done:end]] = line_group[done:end]
      done = end
    groups[:, t] = current
  return GroupsTable(list(index), rounds, groups, total)


def group_colors(num_groups: int):
  """[num_groups, 3] RGB colours of groups 0..num_groups-1: tab10, then tab20,
  without their greys (kept for "no group"); beyond 18 groups, spread over
  `turbo` with neighbouring indices far apart."""
  import matplotlib
  import numpy as np
  tab10 = [c for i, c in enumerate(matplotlib.colormaps["tab10"].colors) if i != 7]
  if num_groups <= len(tab10):
    return np.asarray(tab10[:num_groups], np.float64).reshape(-1, 3)
  tab20 = [c for i, c in enumerate(matplotlib.colormaps["tab20"].colors) if i not in (14, 15)]
  if num_groups <= len(tab20):
    return np.asarray(tab20[:num_groups], np.float64)
  where = 0.05 + 0.9 * ((np.arange(num_groups) * 0.6180339887) % 1.0)
  return np.asarray(matplotlib.colormaps["turbo"](where))[:, :3]


def groups_order(groups):
  """The clients (rows of `groups`) sorted by their group in the last round,
  ties by the round before, and so on (stable): the clients of a final group
  form one block, split by where they came from. No group and not known sort
  after every group."""
  import numpy as np
  groups = np.asarray(groups)
  if groups.shape[1] == 0:
    return np.arange(groups.shape[0])
  top = max(int(groups.max()), -1) + 1
  keys = np.where(groups >= 0, groups, top - groups)  # -1 -> top + 1, -2 -> top + 2
  return np.lexsort(keys.T)  # the last key (round) is the primary one


def groups_image(groups):
  """The RGB image [clients, rounds, 3] of a groups table: `group_colors` for
  groups, NO_GROUP_COLOR and NOT_KNOWN_COLOR for the rest."""
  import numpy as np
  groups = np.asarray(groups)
  k = max(int(groups.max()), -1) + 1 if groups.size else 0
  palette = np.concatenate([group_colors(k), [NO_GROUP_COLOR, NOT_KNOWN_COLOR]])
  codes = np.where(groups >= 0, groups, np.where(groups == NO_GROUP, k, k + 1))
  return palette[codes]


def groups_figure(table: GroupsTable, title: str = "",
                  max_clients: int = MAX_GROUP_CLIENTS):
  """The figure of `table`: clients (rows, `groups_order`; at most
  `max_clients`, evenly spaced in that order) x rounds (columns), coloured by
  group (`groups_image`), group blocks of the last round named on the left, a
  legend of the groups shown (up to MAX_GROUP_LEGEND). Returns (figure, axes);
  the axes' data coordinates are (round, row)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np
  from matplotlib.patches import Patch

  groups = np.asarray(table.groups)
  num_clients, num_rounds = groups.shape
  order = groups_order(groups)
  shown = order[spread(num_clients, max_clients)]
  view = groups[shown]
  fig = plt.figure(figsize=GROUPS_FIGSIZE, dpi=GROUPS_DPI, layout="constrained")
  ax = fig.add_subplot()
  from matplotlib.ticker import MaxNLocator
  # x in rounds: column t is drawn at rounds[0] + t * step (the rounds kept are
  # evenly spaced), so the axis gets round numbers as ticks.
  first = float(table.rounds[0]) if num_rounds else 1.0
  step = (float(table.rounds[-1]) - first) / (num_rounds - 1) if num_rounds > 1 else 1.0
  if view.size:
    ax.imshow(groups_image(view), aspect="auto", interpolation="nearest",
              extent=(first - step / 2, first + (num_rounds - 0.5) * step,
                      len(shown) - 0.5, -0.5))
  ax.xaxis.set_major_locator(MaxNLocator(nbins=8, integer=True))
  rounds_text = "round"
  if num_rounds < table.total_rounds:
    rounds_text += f" ({num_rounds} of {table.total_rounds} rounds shown, evenly spaced)"
  ax.set_xlabel(rounds_text)
  clients_text = f"{num_clients} clients, sorted by last group"
  if len(shown) < num_clients:
    clients_text += f" ({len(shown)} shown, evenly spaced)"
  ax.set_ylabel(clients_text)
  if view.size:  # name the last round's blocks
    last = view[:, -1]
    starts = np.flatnonzero(np.r_[True, last[1:] != last[:-1]])
    ends = np.r_[starts[1:], len(last)]
    names = {NO_GROUP: "no group", NOT_KNOWN: "not known"}
    if len(starts) <= MAX_GROUP_LEGEND:
      ax.set_yticks((starts + ends - 1) / 2.0,
                    [names.get(int(last[s]), f"group {int(last[s])}") for s in starts],
                    fontsize="small")
    else:
      ax.set_yticks([])
  present = sorted(int(g) for g in np.unique(view))
  k = max(present[-1], -1) + 1 if present else 0
  colors = group_colors(k)
  handles = [Patch(facecolor=colors[g], label=f"group {g}") for g in present if g >= 0]
  if len(handles) > MAX_GROUP_LEGEND:
    handles = []
  if NO_GROUP in present:
    handles.append(Patch(facecolor=NO_GROUP_COLOR, edgecolor="0.5", label="no group"))
  if NOT_KNOWN in present:
    handles.append(Patch(facecolor=NOT_KNOWN_COLOR, edgecolor="0.5", label="not known"))
  if handles:
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              fontsize="x-small", frameon=False)
  if title:
    ax.set_title("\n".join(textwrap.fill(line, 95) for line in title.split("\n")),
                 fontsize="medium")
  return fig, ax


def groups_title(config: Mapping[str, Any], ari: Optional[float] = None,
                 purity: Optional[float] = None, scored: bool = False) -> str:
  """groups.png's title: the run (as accuracy.png's: algorithm, task, key
  settings, seed), then, where the task has true clusters (`scored`), the
  final ARI and purity."""
  run = describe(group_runs([Run("run", dict(config), [], [])]))[0] if config else ""
  what = "each client's group per round"
  if scored:
    what += ("; final ARI and purity: none (no client in a group)" if ari is None
             else f"; final ARI {ari:.3f}, purity {purity:.3f} against the true clusters")
  return f"{run}\n{what}" if run else what


def plot_groups(groups_csv: str, out: str, title: str = "",
                rounds: Optional[Sequence[int]] = None) -> Optional[str]:
  """Draws groups.csv (`read_groups`, `groups_figure`) into `out`; returns
  `out`, or None when the file holds no round."""
  table = read_groups(groups_csv, rounds)
  if not len(table.rounds) or not len(table.client_ids):
    return None
  fig, _ = groups_figure(table, title)
  import matplotlib.pyplot as plt  # (groups_figure chose the Agg backend)
  try:
    fig.savefig(out, dpi=GROUPS_DPI)
  finally:
    plt.close(fig)
  return out


# ---------------------------------------------------------------------------
# Command line


class _Parser(argparse.ArgumentParser):
  def error(self, message):  # one line, exit status 2
    print(f"{PROG}: error: {message} (see --help)", file=sys.stderr)
    raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
  parser = _Parser(prog=PROG, description=(
      "Overlays the curves of run directories written by run_experiment.py; runs that "
      "differ only by --seed are drawn as their mean with a ± std band."))
  parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                      help="a run's --output_dir (holding metrics.csv and config.json)")
  parser.add_argument("--out", default="plot.png",
                      help="image file to write; format from the extension "
                           "(default: plot.png)")
  parser.add_argument("--metric", default="test_accuracy",
                      help="column of metrics.csv for the first panel "
                           "(default: test_accuracy)")
  parser.add_argument("--title", default=None, help="replaces the generated title")
  parser.add_argument("--separate_seeds", action="store_true",
                      help="one curve per run instead of the mean over seeds")
  parser.add_argument("--dpi", type=int, default=120, help="resolution (default: 120)")
  return parser


def _check_out(out: str) -> None:
  from matplotlib.backend_bases import FigureCanvasBase
  formats = FigureCanvasBase.get_supported_filetypes()
  ext = os.path.splitext(out)[1].lower().lstrip(".")
  if ext not in formats:
    raise PlotError(f"--out={out} has no image extension matplotlib writes; valid: a "
                    f"file name ending in .{', .'.join(sorted(formats))}")
  parent = os.path.dirname(os.path.abspath(out))
  if not os.path.isdir(parent):
    raise PlotError(f"--out={out}: directory {parent} does not exist; valid: a file in "
                    "an existing directory")


def main(argv: Optional[Sequence[str]] = None) -> int:
  """The command line (`argv`: the arguments after the program name; default
  sys.argv[1:]). Returns the exit status: 0, or 2 after a one-line error."""
  parser = _parser()
  try:
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
  except SystemExit as e:
    return int(e.code or 0)
  try:
    if args.dpi < 10 or args.dpi > 1200:
      raise PlotError(f"invalid --dpi={args.dpi}; valid: 10..1200")
    _check_out(args.out)
    runs, seen = [], set()
    for run_dir in args.run_dirs:
      key = os.path.realpath(run_dir)
      if key in seen:
        continue
      seen.add(key)
      runs.append(load_run(run_dir))
    available = sorted({c for run in runs for c in run.columns if c != "round"})
    if args.metric not in available:
      raise PlotError(f"--metric={args.metric} is not a column of these runs' metrics; "
                      f"valid: {', '.join(available)}")
    if not any(row.get(args.metric) is not None for run in runs for row in run.rows):
      empty = [run.path for run in runs if not run.rows]
      what = (f"{', '.join(empty)} {'has' if len(empty) == 1 else 'have'} no rows yet"
              if empty else "no round has a value")
      raise PlotError(f"nothing to plot for --metric={args.metric}: {what}; valid: "
                      "runs that have recorded it")
    plot_runs(runs, args.out, metric=args.metric, title=args.title,
              separate_seeds=args.separate_seeds, dpi=args.dpi)
  except PlotError as e:
    print(f"{PROG}: error: {e}", file=sys.stderr)
    return 2
  except OSError as e:
    print(f"{PROG}: error: cannot write --out={args.out} ({e.strerror or e}); valid: a "
          "writable file path", file=sys.stderr)
    return 2
  groups = group_runs(runs, args.separate_seeds)
  print(f"wrote {args.out}: {len(runs)} run{'s' if len(runs) > 1 else ''} in "
        f"{len(groups)} curve{'s' if len(groups) > 1 else ''}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
