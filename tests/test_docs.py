"""The README and docs/: every relative link resolves, every code block runs.

Conventions (docs/README.md says them for writers):
- A fenced ```python block runs, in a fresh namespace per page (later blocks
  of a page see the names of earlier ones), from a temporary directory.
- A fenced ```bash block runs each `python run_experiment.py ...` command in
  this process, with `--output_dir` pointed at a temporary directory, and
  requires exit status 0; `python -m tff_cluster.io.plot` lines draw those runs
  (their directories mapped to where the test put them); every other line of
  it must be such a command. A `python -m tff_cluster.sweep ...` line, run or
  not, is checked with `--dry_run` (its cells through the CLI's checks).
- A block whose nearest non-empty line before it starts with
  `*Not run by the tests:` (followed by the reason) is not run; its
  `run_experiment.py` commands still have their flags parsed and checked
  (not `--resume` ones: they read a run's own settings).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import List, NamedTuple

import pytest

from tests.conftest import REPO_ROOT
from tests.helpers import main_in_process

MARKER = "*Not run by the tests:"
PAGES = sorted([REPO_ROOT / "README.md", *(REPO_ROOT / "docs").rglob("*.md"),
                *(REPO_ROOT / "benchmarks").rglob("*.md")])
PAGES = [p for p in PAGES if "results" not in p.relative_to(REPO_ROOT).parts]
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```([a-z]*)\n(.*?)^```", re.S | re.M)


class Block(NamedTuple):
  page: Path
  line: int
  language: str
  code: str
  run: bool


def _rel(path: Path) -> str:
  try:
    return str(path.relative_to(REPO_ROOT))
  except ValueError:  # a page outside the checkout (the checker's own tests)
    return str(path)


def blocks(page: Path) -> List[Block]:
  text = page.read_text()
  out = []
  for m in FENCE.finditer(text):
    before = [l for l in text[:m.start()].splitlines() if l.strip()]
    marked = bool(before) and before[-1].strip().startswith(MARKER)
    if marked:
      assert len(before[-1].strip()) > len(MARKER) + 3, (
          f"{_rel(page)}: the marker must give a reason: {before[-1]!r}")
    out.append(Block(page, text[:m.start()].count("\n") + 1, m.group(1), m.group(2),
                     not marked))
  return out


def slug(heading: str) -> str:
  """GitHub's anchor of a Markdown heading."""
  text = re.sub(r"[`*_]", "", heading.strip().lower())
  text = re.sub(r"[^\w\- ]", "", text)
  return text.replace(" ", "-")


def anchors(page: Path) -> set:
  text = FENCE.sub("", page.read_text())
  return {slug(h) for h in re.findall(r"^#+ (.*)$", text, flags=re.M)}


def broken_links(page: Path) -> List[str]:
  text = FENCE.sub("", page.read_text())
  text = re.sub(r"`[^`\n]*`", "", text)  # code spans are not links
  out = []
  for m in LINK.finditer(text):
    target = m.group(1) or m.group(2)
    if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
      continue
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    if not dest.exists():
      out.append(f"{_rel(page)}: link to {target!r}: no such file")
    elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
      out.append(f"{_rel(page)}: link to {target!r}: no such heading")
  return out


def commands(code: str) -> List[List[str]]:
  """The shell lines of a block, continuations joined, comments dropped."""
  joined = re.sub(r"\\\n", " ", code)
  out = []
  for line in joined.splitlines():
    words = shlex.split(line, comments=True)
    if words:
      out.append(words)
  return out


def cli_args(words: List[str]):
  """The arguments of a `run_experiment.py` command line, or None."""
  for i, w in enumerate(words):
    if w.endswith("run_experiment.py"):
      return words[i + 1:]
  return None


def bench_script(words: List[str]):
  """The `benchmarks/<name>.py` or `.sh` a command line runs, or None."""
  for w in words:
    if re.fullmatch(r"(\./)?benchmarks/\w+\.(py|sh)", w):
      return w
  return None


class _Parsed(Exception):
  pass


def _parse_benchmark_flags(script: str, words: List[str], where: str, monkeypatch):
  """A benchmark command's flags, parsed by the script's own parser and
  nothing run: parse_args raises as soon as it has parsed."""
  import argparse
  import importlib

  path = REPO_ROOT / script
  assert path.exists(), f"{where}: no such script"
  if path.suffix != ".py":
    return
  monkeypatch.syspath_prepend(str(path.parent))
  module = importlib.import_module(path.stem)
  original = argparse.ArgumentParser.parse_args

  def parse_only(self, args=None, namespace=None):
    original(self, args, namespace)
    raise _Parsed()

  monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
  argv = words[words.index(script) + 1:]
  try:
    module.main(argv)
  except _Parsed:
    return
  except SystemExit as e:
    pytest.fail(f"{where}: its flags do not parse (exit {e.code})")
  finally:
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", original)
  pytest.fail(f"{where}: {script} ran without parsing flags")


def test_there_are_pages_and_every_algorithm_has_one():
  from tff_cluster import registry
  names = {p.stem for p in (REPO_ROOT / "docs" / "algorithms").glob("*.md")}
  missing = sorted(set(registry.ALGORITHMS) - names)
  assert not missing, f"algorithms without a page in docs/algorithms/: {missing}"


@pytest.mark.parametrize("name", sorted(__import__("tff_cluster.registry", fromlist=["x"])
                                        .ALGORITHMS))
def test_an_algorithm_page_names_every_option(name):
  from tff_cluster import registry
  text = (REPO_ROOT / "docs" / "algorithms" / f"{name}.md").read_text()
  missing = [h.name for h in registry.ALGORITHMS[name].hparams
             if f"--{h.name}" not in text and f"`{h.name}`" not in text]
  assert not missing, f"docs/algorithms/{name}.md does not name {missing}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_relative_links_resolve(page):
  assert not broken_links(page)


def test_the_link_check_sees_a_broken_link_and_a_missing_heading(tmp_path):
  page = tmp_path / "p.md"
  page.write_text("# Title\n[a](nowhere.md) [b](#title) [c](#other) `[d](x.md)`\n"
                  "```\n[e](y.md)\n```\n")
  found = broken_links(page)
  assert len(found) == 2 and "nowhere.md" in found[0] and "#other" in found[1], found


def _cli_blocks():
  """Every shell block; those that run commands are marked `slow` (their
  runs are the quick tier's largest cost; their flags are still parsed there
  by the blocks that only show them)."""
  return [pytest.param(b, marks=[pytest.mark.slow] if b.run else [],
                       id=f"{_rel(b.page)}:{b.line}")
          for p in PAGES for b in blocks(p) if b.language in ("bash", "sh", "shell")]


def _python_pages():
  return [p for p in PAGES if any(b.language == "python" and b.run for b in blocks(p))]


# README.md's comparison block takes about 31 s: three 30-round runs and the
# plot a user runs, as written; the other blocks a few seconds.
@pytest.mark.parametrize("block", _cli_blocks())
@pytest.mark.xla  # the pages' commands run as users' runs do (3 x 30 rounds: XLA pays)
def test_shell_blocks(block, tmp_path, capsys, monkeypatch):
  from tff_cluster import experiment as run_experiment
  from absl import flags

  monkeypatch.chdir(REPO_ROOT)
  run_dirs = {}  # a command's --output_dir -> where the test put it
  for n, words in enumerate(commands(block.code)):
    args = cli_args(words)
    where = f"{_rel(block.page)}:{block.line}: {' '.join(words)}"
    if words[:3] == ["python", "-m", "tff_cluster.sweep"]:
      # A sweep's cells are checked as its --dry_run checks them (nothing run).
      from tff_cluster.sweep import __main__ as sweep_main
      code = sweep_main.main([*words[3:], "--dry_run"])
      assert code == 0, f"{where}: exit {code}: {capsys.readouterr().err[-2000:]}"
    elif block.run and words[:3] == ["python", "-m", "tff_cluster.io.plot"]:
      # The runs the block made, drawn into the temporary directory.
      from tff_cluster.io import plot
      argv = [run_dirs.get(a, a) for a in words[3:]]
      if "--out" in argv:
        argv[argv.index("--out") + 1] = str(tmp_path / argv[argv.index("--out") + 1])
      assert plot.main(argv) == 0, f"{where}: {capsys.readouterr().err[-2000:]}"
    elif block.run:
      assert args is not None, (
          f"{where}: only `python run_experiment.py` and `python -m tff_cluster.io.plot` "
          f"commands run in the tests; mark the block with a line `{MARKER} <reason>`")
      given = [a.split("=", 1)[1] for a in args if a.startswith("--output_dir=")]
      out = tmp_path / str(n)
      if given:
        run_dirs[given[0]] = str(out)
      args = [a for a in args if not a.startswith("--output_dir")]
      code, _, err = main_in_process([*args, f"--output_dir={out}"], capsys)
      assert code == 0, f"{where}: exit {code}: {err[-2000:]}"
    elif bench_script(words) is not None:
      _parse_benchmark_flags(bench_script(words), words, where, monkeypatch)
    elif args is not None and "--resume" not in args and "--help" not in args:
      # Parse and check the flags only, as the CLI does before a run.
      run_experiment.FLAGS.unparse_flags()
      try:
        rest = run_experiment.FLAGS(["run_experiment.py", *args])
        assert len(rest) == 1, f"{where}: unexpected arguments {rest[1:]}"
        if not run_experiment.FLAGS.eval_only:
          run_experiment.resolve_settings(run_experiment._flag_values())  # noqa: SLF001
      except (flags.Error, run_experiment.UsageError) as e:
        pytest.fail(f"{where}: {e}")
      finally:
        run_experiment.FLAGS.unparse_flags()


@pytest.mark.parametrize("page", _python_pages(), ids=_rel)
def test_python_blocks(page, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  monkeypatch.syspath_prepend(str(REPO_ROOT))
  namespace = {"__name__": "__docs__"}
  for block in blocks(page):
    if block.language == "python" and block.run:
      exec(compile(block.code, f"{_rel(page)}:{block.line}", "exec"), namespace)  # noqa: S102


def test_the_block_reader_sees_the_marker(tmp_path):
  page = tmp_path / "p.md"
  page.write_text("x\n\n```bash\npython run_experiment.py --rounds=1\n```\n\n"
                  f"{MARKER} needs a GPU.*\n\n```bash\npip install x\n```\n")
  got = blocks(page)
  assert [(b.run, b.language) for b in got] == [(True, "bash"), (False, "bash")]
  assert commands("python run_experiment.py \\\n  --a=1  # c\n") == [
      ["python", "run_experiment.py", "--a=1"]]


def test_the_benchmark_flag_check_refuses_an_unknown_flag(monkeypatch):
  with pytest.raises(pytest.fail.Exception, match="do not parse"):
    _parse_benchmark_flags("benchmarks/wecfl_table2.py",
                           ["python", "benchmarks/wecfl_table2.py", "--no_such_flag=1"],
                           "example", monkeypatch)
