"""The package's import layering: no cycle, no upward import.

Every import of a `tff_cluster` module counts: top-level and function-level
ones, `importlib.import_module(f"tff_cluster.x.{name}")` (as an import of
every module under `tff_cluster.x`) and the implicit import of a module's
parent package. A module may import modules of its own layer or lower ones;
the graph as a whole must have no cycle. A function-level import of a
`tff_cluster` module is allowed only for an optional backend (LAZY_ALLOWED),
and only downward. `python -m tests.test_layers` prints the graph.
"""

from __future__ import annotations

import ast
import collections
import pathlib
import sys
from typing import Dict, List, Set, Tuple

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "tff_cluster"

# Lowest first. A name stands for the module and, unless listed itself, every
# module below it (`tff_cluster.data` covers `tff_cluster.data.leaf`); the
# package's own `__init__` stands for itself only.
LAYERS: List[Tuple[str, ...]] = [
    ("tff_cluster", "tff_cluster.stack", "tff_cluster.interrupts", "tff_cluster.clustering",
     "tff_cluster.seeds", "tff_cluster.timing",
     "tff_cluster.data", "tff_cluster.progress"),
    ("tff_cluster.spec", "tff_cluster.models", "tff_cluster.vision_models"),
    ("tff_cluster.learning", "tff_cluster.io"),
    ("tff_cluster.core",),
    ("tff_cluster.runners",),
    ("tff_cluster.host",),
    ("tff_cluster.algorithms",),
    ("tff_cluster.registry", "tff_cluster.tasks"),
    ("tff_cluster.api", "tff_cluster.cli", "tff_cluster.evaluate", "tff_cluster.tff_program",
     "tff_cluster.sweep"),
    # the command: tff-cluster, python -m tff_cluster (run_experiment.py in a checkout)
    ("tff_cluster.experiment", "tff_cluster.console", "tff_cluster.__main__"),
]

# Optional backends a function may import lazily (they import TFF, which may
# be absent): always downward like any other import. `importlib.import_module`
# by name (the registries) is allowed too, downward.
LAZY_ALLOWED = {"tff_cluster.runners.tff.runner", "tff_cluster.runners.tff.runtime", "tff_cluster.runners.tff.types",
                "tff_cluster.runners.tff.workers"}
# The command's modules import what a run needs where it needs it: a refused
# run (bad flags, a folder that cannot take it) stops before TensorFlow loads.
# The registry too: the CLI reads it for its flags, and it imports the host
# (TensorFlow) only when it builds a run's driver.
LAZY_IMPORTERS = {"tff_cluster.experiment", "tff_cluster.console", "tff_cluster.registry"}


def module_files(root: pathlib.Path = ROOT) -> Dict[str, pathlib.Path]:
  out = {}
  for path in sorted((root / PACKAGE).rglob("*.py")):
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
      parts = parts[:-1]
    out[".".join(parts)] = path
  return out


def _resolve(name: str, modules) -> str:
  parts = name.split(".")
  for i in range(len(parts), 0, -1):
    candidate = ".".join(parts[:i])
    if candidate in modules:
      return candidate
  return ""


def import_edges(modules: Dict[str, pathlib.Path]):
  """{module: {imported module: "top" | "function"}} over every kind of import."""
  edges: Dict[str, Dict[str, str]] = collections.defaultdict(dict)

  rank = {"top": 0, "function": 1, "dynamic": 2}

  def add(src, target, where):
    dst = _resolve(target, modules)
    if dst and dst != src and rank[where] < rank[edges[src].get(dst, "dynamic")] + (
        dst not in edges[src]):
      edges[src][dst] = where

  for name, path in modules.items():
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    if "." in name:
      add(name, name.rpartition(".")[0], "top")

    def visit(node, where):
      for child in ast.iter_child_nodes(node):
        inner = "function" if isinstance(
            child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else where
        targets = []
        if isinstance(child, ast.Import):
          targets = [a.name for a in child.names]
        elif isinstance(child, ast.ImportFrom):
          base = child.module or ""
          if child.level:
            up = package.split(".")[:len(package.split(".")) - child.level + 1]
            base = ".".join(up + ([base] if base else []))
          # `from p import m` imports module p.m when it exists, else names of p.
          targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                     for a in child.names]
        elif (isinstance(child, ast.Call) and child.args
              and getattr(child.func, "attr", getattr(child.func, "id", "")) == "import_module"):
          arg = child.args[0]
          prefix = ""
          if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            targets = [arg.value]
          elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(
              arg.values[0], ast.Constant):
            prefix = arg.values[0].value
            targets = [m for m in modules if m.startswith(prefix)]
          where_dyn = "dynamic"
          for target in targets:
            if target.startswith(PACKAGE):
              add(name, target, where_dyn)
          targets = []
        for target in targets:
          if target.startswith(PACKAGE):
            add(name, target, where)
        visit(child, inner)

    visit(tree, "top")
  return edges


def layer_of(module: str) -> int:
  best, depth = None, -1
  for i, names in enumerate(LAYERS):
    for n in names:
      covers = module == n or (n != PACKAGE and module.startswith(n + "."))
      if covers and n.count(".") > depth:
        best, depth = i, n.count(".")
  if best is None:
    raise KeyError(module)
  return best


def cycles(edges) -> List[List[str]]:
  """Strongly connected components of more than one module (Tarjan)."""
  index: Dict[str, int] = {}
  low: Dict[str, int] = {}
  stack: List[str] = []
  on: Set[str] = set()
  found = []
  sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))

  def strong(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in edges.get(v, {}):
      if w not in index:
        strong(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        found.append(sorted(comp))

  for v in list(edges):
    if v not in index:
      strong(v)
  return found


def problems(root: pathlib.Path = ROOT) -> List[str]:
  modules = module_files(root)
  edges = import_edges(modules)
  out = []
  for module in modules:
    try:
      layer_of(module)
    except KeyError:
      out.append(f"{module}: in no layer; add it to LAYERS in tests/test_layers.py")
  if out:
    return out
  for src, targets in sorted(edges.items()):
    for dst, where in sorted(targets.items()):
      if layer_of(dst) > layer_of(src):
        out.append(f"upward import: {src} (layer {layer_of(src)}) imports {dst} "
                   f"(layer {layer_of(dst)})")
      if where == "function" and src not in LAZY_IMPORTERS and dst not in LAZY_ALLOWED \
          and not dst.startswith(tuple(m + "." for m in LAZY_ALLOWED)):
        out.append(f"function-level import of {dst} in {src}: import it at the top "
                   f"(only {sorted(LAZY_ALLOWED)} may be imported lazily)")
  # A catalogue package loading its own submodules by name at call time
  # (`tasks`, whose submodules import it as their parent) is no cycle: the
  # load happens after both are imported. Every other edge counts.
  static = {src: {dst: w for dst, w in targets.items()
                  if not (w == "dynamic" and dst.startswith(src + "."))}
            for src, targets in edges.items()}
  for comp in cycles(static):
    out.append("import cycle among: " + ", ".join(comp))
  return out


# Outside the package, each of these is one unit of the unit graph.
OUTSIDE_UNITS = {"run_experiment.py": "run_experiment.py", "benchmarks": "benchmarks/",
                 "scripts": "scripts/", "tasks": "tasks/ (alias)"}


def unit_of_module(module: str, root: pathlib.Path = ROOT) -> str:
  """A folder of the package is one unit; each root module is one."""
  parts = module.split(".")
  if len(parts) == 1:
    return "tff_cluster/__init__.py"
  if (root / PACKAGE / parts[1]).is_dir():
    return f"tff_cluster/{parts[1]}/"
  return f"tff_cluster/{parts[1]}.py"


def _outside_files(root: pathlib.Path) -> Dict[str, List[pathlib.Path]]:
  out = {"run_experiment.py": [root / "run_experiment.py"]}
  for folder in ("benchmarks", "scripts", "tasks"):
    out[OUTSIDE_UNITS[folder]] = sorted((root / folder).rglob("*.py"))
  return {u: [f for f in files if f.exists()] for u, files in out.items()}


def _imported_names(tree: ast.AST) -> List[str]:
  """Every absolute module name a file imports (any depth, `import_module`
  with a literal or an f-string's literal prefix)."""
  names = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
      names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    elif (isinstance(node, ast.Call) and node.args
          and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"):
      arg = node.args[0]
      if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        names.append(arg.value)
      elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        names.append(arg.values[0].value.rstrip("."))
  return names


def unit_edges(root: pathlib.Path = ROOT) -> Dict[str, Set[str]]:
  """{unit: units it imports}, from every import of the package's modules
  (top-level, function-level, lazy) and of the files outside it (tests
  excluded)."""
  modules = module_files(root)
  edges: Dict[str, Set[str]] = collections.defaultdict(set)
  for src, targets in import_edges(modules).items():
    for dst in targets:
      edges[unit_of_module(src, root)].add(unit_of_module(dst, root))
  files = {unit_of_module(m, root): [] for m in modules}
  for m, path in modules.items():
    files[unit_of_module(m, root)].append(path)
  for unit, paths in _outside_files(root).items():
    files[unit] = paths
  for unit, paths in files.items():
    for path in paths:
      for name in _imported_names(ast.parse(path.read_text(), str(path))):
        top = name.split(".")[0]
        if top == PACKAGE and unit.startswith(("run_experiment", "benchmarks", "scripts", "tasks/")):
          dst = _resolve(name, modules)
          if dst:
            edges[unit].add(unit_of_module(dst, root))
        elif top in OUTSIDE_UNITS and top != "run_experiment.py":
          edges[unit].add(OUTSIDE_UNITS[top])
        elif top == "run_experiment":
          edges[unit].add("run_experiment.py")
  return {u: {d for d in ds if d != u} for u, ds in edges.items()}


def unit_cycles(root: pathlib.Path = ROOT) -> List[List[str]]:
  """Units that import each other, directly or through others."""
  edges = unit_edges(root)
  return cycles({u: dict.fromkeys(ds, "top") for u, ds in edges.items()})


def test_no_two_units_import_each_other():
  found = unit_cycles()
  assert not found, "units importing each other: " + "; ".join(", ".join(c) for c in found)


def test_the_unit_check_sees_folders_importing_each_other(tmp_path):
  # `runners/x.py` imports `host/y.py` at function level, and `host/z.py`
  # imports `runners/w.py`: no module cycle, but the two folders import each
  # other.
  pkg = tmp_path / PACKAGE
  for folder in ("runners", "host"):
    (pkg / folder).mkdir(parents=True)
    (pkg / folder / "__init__.py").write_text("")
  (pkg / "__init__.py").write_text("")
  (pkg / "runners" / "x.py").write_text("def f():\n  from tff_cluster.host import y\n")
  (pkg / "runners" / "w.py").write_text("")
  (pkg / "host" / "y.py").write_text("")
  (pkg / "host" / "z.py").write_text("from tff_cluster.runners import w\n")
  (tmp_path / "benchmarks").mkdir()
  (tmp_path / "benchmarks" / "b.py").write_text("import run_experiment\n")
  (tmp_path / "run_experiment.py").write_text("from benchmarks import b\n")
  found = unit_cycles(tmp_path)
  assert ["tff_cluster/host/", "tff_cluster/runners/"] in found, found
  assert ["benchmarks/", "run_experiment.py"] in found, found


MAX_FUNCTION_LINES = 100


def long_functions(root: pathlib.Path = ROOT, limit: int = MAX_FUNCTION_LINES) -> List[str]:
  """`module:function (lines)` for every function or method of the package
  longer than `limit` lines (decorators and docstring included)."""
  out = []
  for name, path in module_files(root).items():
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        lines = node.end_lineno - first + 1
        if lines > limit:
          out.append(f"{name}:{node.name} ({lines} lines)")
  return sorted(out)


def test_no_library_function_over_100_lines():
  found = long_functions()
  assert not found, "split these: " + ", ".join(found)


def test_the_length_check_counts_a_long_method(tmp_path):
  pkg = tmp_path / PACKAGE
  pkg.mkdir()
  (pkg / "__init__.py").write_text("")
  body = "".join(f"    x{i} = {i}\n" for i in range(99))
  (pkg / "m.py").write_text("class C:\n  def short(self):\n    pass\n\n"
                            "  def long(self):\n" + body + "    return 0\n")
  assert long_functions(tmp_path) == ["tff_cluster.m:long (101 lines)"]
  assert long_functions(tmp_path, limit=101) == []


def test_no_cycle_no_upward_import_no_lazy_import_of_our_modules():
  found = problems()
  assert not found, "\n".join(found)


def test_the_check_sees_a_cycle_through_a_function_level_import(tmp_path):
  # A copy of a small package where `a` imports `b` at the top and `b` imports
  # `a` inside a function: the checker must report the cycle (and the lazy,
  # upward import).
  pkg = tmp_path / PACKAGE
  pkg.mkdir()
  (pkg / "__init__.py").write_text("")
  (pkg / "stack.py").write_text("from tff_cluster import clustering\n")
  (pkg / "clustering.py").write_text(
      "def f():\n  from tff_cluster import stack\n  return stack\n")
  found = problems(tmp_path)
  assert any(p.startswith("import cycle among: tff_cluster.clustering, tff_cluster.stack")
             for p in found), found
  assert any("function-level import of tff_cluster.stack in tff_cluster.clustering" in p
             for p in found), found


def test_the_check_sees_an_upward_import_and_an_unplaced_module(tmp_path):
  pkg = tmp_path / PACKAGE
  (pkg / "algorithms").mkdir(parents=True)
  (pkg / "__init__.py").write_text("")
  (pkg / "algorithms" / "__init__.py").write_text("")
  (pkg / "models.py").write_text("from tff_cluster.algorithms import x\n")
  (pkg / "algorithms" / "x.py").write_text("import importlib\n"
                                           "importlib.import_module(f'tff_cluster.{1}')\n")
  found = problems(tmp_path)
  assert any(p.startswith("upward import: tff_cluster.models") for p in found), found
  (pkg / "newthing.py").write_text("")
  assert problems(tmp_path) == [
      "tff_cluster.newthing: in no layer; add it to LAYERS in tests/test_layers.py"]


if __name__ == "__main__":
  mods = module_files()
  for src, targets in sorted(import_edges(mods).items()):
    print(f"L{layer_of(src)} {src} -> " + ", ".join(
        f"{d}{'' if w == 'top' else ' (lazy)'}" for d, w in sorted(targets.items())))
  print("\n".join(problems()) or "no problems")
  print("unit cycles:", unit_cycles() or "none")
  print("functions over 100 lines:", long_functions() or "none")
