"""Where the test suite's time goes: per-test and per-file seconds from the
JUnit files `scripts/test.sh` writes (`.test-reports/<phase>.xml`), and each
phase's seconds by kind of cost when the phase ran with the timing plugin
(`tests/timing.py`, `.test-reports/<phase>.kinds.json`). A test file re-run
in a loopback-only namespace writes its own files (`<phase>.<file>.inner.*`):
its tests are listed, and counted once, in the test that re-ran them.

  python scripts/test_durations.py [REPORTS_DIR] [--top N] [--markdown]

Reads only the standard library (runs with any Python 3).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import sys
import xml.etree.ElementTree as ET


def cases(reports):
  """(phase, file, test name, seconds, outcome) of every test case."""
  out = []
  for path in sorted(glob.glob(os.path.join(reports, "*.xml"))):
    phase = os.path.basename(path)[:-len(".xml")]
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
      module = case.get("classname", "")
      file = module.split(".")[-1] + ".py" if module else "?"
      if any(child.tag in ("failure", "error") for child in case):
        outcome = "failed"
      elif any(child.tag == "skipped" for child in case):
        outcome = "skipped"
      else:
        outcome = "passed"
      out.append((phase, file, case.get("name", "?"), float(case.get("time", 0.0)), outcome))
  return out


def kinds(reports):
  """phase -> {kind: seconds} from the timing plugin's files (a phase's
  pytest-xdist workers' files, `PHASE.gwN.kinds.json`, added up)."""
  out = {}
  for path in sorted(glob.glob(os.path.join(reports, "*.kinds.json"))):
    phase = re.sub(r"\.gw\d+$", "", os.path.basename(path)[:-len(".kinds.json")])
    with open(path) as f:
      spent = json.load(f)
    total = out.setdefault(phase, collections.Counter())
    for kind, seconds in spent.items():
      if kind != "per_test":
        total[kind] += seconds
  return out


def table(rows, header, markdown):
  if markdown:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  else:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths))]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in rows]
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("reports", nargs="?", default=".test-reports")
  parser.add_argument("--top", type=int, default=30)
  parser.add_argument("--markdown", action="store_true")
  args = parser.parse_args(argv)
  everything = cases(args.reports)
  found = [c for c in everything if ".inner" not in c[0]]
  if not found:
    print(f"test_durations.py: error: no JUnit files (*.xml) in {args.reports}; valid: the "
          "folder scripts/test.sh writes (.test-reports)", file=sys.stderr)
    return 2
  total = sum(c[3] for c in found)
  by_phase = collections.Counter()
  for c in found:
    by_phase[c[0]] += c[3]
  print(table([(p, f"{s:.0f}", sum(1 for c in found if c[0] == p)) for p, s in sorted(by_phase.items())]
              + [("all", f"{total:.0f}", len(found))], ("phase", "seconds", "tests"), args.markdown))
  print()
  by_file = collections.Counter()
  count = collections.Counter()
  for c in found:
    by_file[(c[0], c[1])] += c[3]
    count[(c[0], c[1])] += 1
  rows = [(p, f, n, f"{s:.1f}", f"{100 * s / total:.1f}")
          for ((p, f), s), n in ((item, count[item[0]]) for item in by_file.most_common(args.top))]
  print(table(rows, ("phase", "file", "tests", "seconds", "% of all"), args.markdown))
  print()
  top = sorted(everything, key=lambda c: -c[3])[:args.top]
  print(table([(p, f"{f}::{n}", f"{s:.1f}") for p, f, n, s, _ in top],
              ("phase", "test", "seconds"), args.markdown))
  measured = kinds(args.reports)
  if measured:
    print()
    names = sorted({k for v in measured.values() for k in v if k != "tests"})
    every = collections.Counter()
    for phase, spent in measured.items():
      if ".inner" not in phase:  # (counted in the test that re-ran the file)
        every.update(spent)
    rows = []
    for phase, spent in [*sorted(measured.items()), ("all", every)]:
      whole = spent.get("tests", 0.0)
      other = whole - sum(spent.get(k, 0.0) for k in names)
      rows.append((phase, f"{whole:.0f}",
                   *(f"{v:.0f} ({100 * v / (whole or 1.0):.0f} %)"
                     for v in [*(spent.get(k, 0.0) for k in names), other])))
    print(table(rows, ("phase", "tests' seconds", *names, "other"), args.markdown))
  return 0


if __name__ == "__main__":
  sys.exit(main())
