#!/usr/bin/env bash
# The test suite on every stack this machine's interpreters allow, one phase each:
#
#   tff     the TFF stack (Python 3.11, else 3.10): TF 2.14.1 + TFF 0.87, the
#           tests that need TFF (the `tff` runner, the runner parity tests) and
#           the test files whose outcome depends on the TF / Keras version
#           (`-m "tff or stack"`; the files: tests/conftest.py's STACK_SENSITIVE),
#           with checkpoints resumed across the two stacks when today's
#           environment exists
#   today   the suite less the TFF-only tests on today's stack with Keras 3
#           (Python 3.12, else 3.13, 3.11, 3.10), the metrics checked against
#           the TFF stack's reference
#   sweep   the sweeps (tests/test_sweep*.py, out of the today phase): cells
#           as processes on this machine, stopped and resumed, and on a
#           three-node Ray cluster that loses a node, on today's stack
#   keras2  the model and training tests with Keras 2 (tf_keras,
#           TF_USE_LEGACY_KERAS=1) in the same environment
#   colab   a Colab-like runtime (Python 3.13 with Colab's pins,
#           .ci/colab-constraints.txt): the notebook installs the checkout with
#           a plain `pip install` that must change none of them, then a 3-round
#           CLI run and the API on Keras 3 and tf_keras
#   pip     `pip install '.[legacy-keras]'` into a fresh Python 3.12 venv
#           (today's TensorFlow from PyPI, no TFF), then the same checks
#
# The phases run one after the other: run side by side on two cores, tff and
# today each took longer than both in a row.
#
# Usage: scripts/test.sh [TIER] [PHASE ...]
#
#   TIER   ci (the default: what CI runs), quick (contributors: the today
#          phase alone unless phases are named, no test marked slow and no
#          exhaustive-only case) or exhaustive (every case; the same as
#          TFF_CLUSTER_EXHAUSTIVE=1). tests/conftest.py says what each holds.
#   PHASE  default: all six (quick: today).
#
# The CI tier runs one slice of the exhaustive-only cases: TFF_CLUSTER_SLICE
# if set, else int(commit[:8], 16) % 8 of the checkout's commit (printed).
# Environments are built from uv.lock with uv (installed with pip when
# missing): .venv-tff, .venv-py3.X (today's stack, with the legacy-keras, ray
# and tfds extras: tests/test_tfds.py runs there); .venv-colab and .venv-pip
# are made anew each time (the pip phase's default install has no TFDS).
# Each is installed with its bytecode compiled (uv's --compile-bytecode; pip
# compiles by default): where PYTHONDONTWRITEBYTECODE is set, as on these
# machines, a process otherwise compiles TensorFlow's sources again at every
# start (`import tensorflow, keras`: 21 s against 8 s measured here), and the
# suite starts many (pytest workers, the CLI runs, Ray's actors, sweep cells).
# Within the tff, today and keras2 phases the tests run on
# TFF_CLUSTER_TEST_WORKERS processes (pytest-xdist; default: the CPU count,
# at most 4; 1: one process), after the tests marked `serial` (those timed
# against the clock) in one process. (TensorFlow keeps its default threads:
# one thread a process measured 6 % faster here but rounds a CNN's sums in
# another order, past the cross-stack reference's 1e-5.)
# A phase whose interpreter is missing is skipped with the reason. Each phase
# prints its time; the last lines sum the tests of every phase and list the
# slowest (scripts/test_durations.py reads .test-reports/ for the whole
# table). Exit status: non-zero when any phase failed. Extra pytest options:
# PYTEST_ADDOPTS.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
export PYTHONUNBUFFERED=1
REPORTS="$ROOT/.test-reports"
rm -rf "$REPORTS" && mkdir -p "$REPORTS"

TIER=ci
case ${1:-} in ci|quick|exhaustive) TIER=$1; shift ;; esac
if [ "$TIER" = ci ] && [ -n "${TFF_CLUSTER_EXHAUSTIVE:-}" ] && [ "$TFF_CLUSTER_EXHAUSTIVE" != 0 ]; then
  TIER=exhaustive
fi
export TFF_CLUSTER_TIER=$TIER
PHASES=("$@")
if [ ${#PHASES[@]} -eq 0 ]; then
  if [ "$TIER" = quick ]; then PHASES=(today); else PHASES=(tff today sweep keras2 colab pip); fi
fi
for phase in "${PHASES[@]}"; do
  case $phase in tff|today|sweep|keras2|colab|pip) ;;
    *) echo "scripts/test.sh: error: unknown phase or tier '$phase'; valid tiers: ci, quick, exhaustive; valid phases: tff, today, sweep, keras2, colab, pip" >&2
       exit 2 ;;
  esac
done
if [ -z "${TFF_CLUSTER_SLICE:-}" ]; then
  commit=$(git rev-parse HEAD 2>/dev/null || true)
  if [ -n "$commit" ]; then
    TFF_CLUSTER_SLICE=$(( 16#${commit:0:8} % 8 ))
    slice_from="commit ${commit:0:8}"
  else
    TFF_CLUSTER_SLICE=0
    slice_from="no commit: the first"
  fi
else
  slice_from="TFF_CLUSTER_SLICE"
fi
case $TFF_CLUSTER_SLICE in 0|1|2|3|4|5|6|7) ;;
  *) echo "scripts/test.sh: error: TFF_CLUSTER_SLICE=$TFF_CLUSTER_SLICE; valid: 0..7" >&2; exit 2 ;;
esac
export TFF_CLUSTER_SLICE
case $TIER in
  ci) echo "tier ci: exhaustive-only cases of slice $TFF_CLUSTER_SLICE of 8 ($slice_from)" ;;
  quick) echo "tier quick: no test marked slow, no exhaustive-only case" ;;
  exhaustive) echo "tier exhaustive: every case" ;;
esac
WORKERS=${TFF_CLUSTER_TEST_WORKERS:-$(python3 -c 'import os; print(min(os.cpu_count() or 1, 4))')}
case $WORKERS in ''|*[!0-9]*|0)
  echo "scripts/test.sh: error: TFF_CLUSTER_TEST_WORKERS=$WORKERS; valid: 1 or more" >&2; exit 2 ;;
esac
wants() { local p; for p in "${PHASES[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }

if ! python3 -m uv --version >/dev/null 2>&1; then
  python3 -m pip install --quiet uv || { echo "error: cannot install uv with pip" >&2; exit 1; }
fi
UV=(python3 -m uv)

# An interpreter of version $1 (e.g. 3.12) that runs: on PATH, in pyenv's
# versions (uv takes it by path), or one uv knows; empty if none.
find_python() {
  local v=$1 p candidates=()
  p=$(command -v "python$v" 2>/dev/null) && candidates+=("$p")
  if command -v pyenv >/dev/null 2>&1; then
    while IFS= read -r p; do candidates+=("$p"); done < <(
      ls -d "$(pyenv root)"/versions/"$v".*/bin/"python$v" 2>/dev/null | sort -rV)
  fi
  p=$("${UV[@]}" python find --no-python-downloads "$v" 2>/dev/null) && candidates+=("$p")
  for p in "${candidates[@]}"; do
    if [ "$("$p" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$v" ]; then
      echo "$p"; return 0
    fi
  done
  return 1
}
first_python() { local v; for v in "$@"; do find_python "$v" && return 0; done; return 1; }

declare -A STATUS SECONDS_OF
ORDER=()
record() { ORDER+=("$1"); STATUS[$1]=$2; SECONDS_OF[$1]=$3; }
skip() { echo "== $1: skipped ($2)"; record "$1" "skipped: $2" 0; }

# uv sync of a project environment: sync NAME PYTHON [uv args...]
sync() {
  local env=$1 py=$2; shift 2
  UV_PROJECT_ENVIRONMENT="$env" "${UV[@]}" sync --frozen --compile-bytecode --python "$py" "$@"
}

pytest_once() {  # pytest_once REPORT PYTHON [pytest args...]: one pytest, timed by kind
  local report=$1 py=$2; shift 2
  TFF_CLUSTER_TIMING_OUT="$REPORTS/$report.kinds.json" "$py" -m pytest -p no:cacheprovider \
    -p tests.timing --durations=15 --junitxml="$REPORTS/$report.xml" "$@"
}

# run_pytest PHASE PYTHON MARKS [pytest args...]: the tests MARKS selects,
# those marked `serial` in one process, then the others on $WORKERS
# processes where pytest-xdist is installed. Exit status 5 (no test selected)
# counts as success.
run_pytest() {
  local phase=$1 py=$2 marks=$3 rc=0 r; shift 3
  if [ "$WORKERS" -gt 1 ] && "$py" -c "import xdist" 2>/dev/null; then
    pytest_once "$phase.serial" "$py" -m "($marks) and serial" "$@"
    r=$?; [ $r -eq 5 ] && r=0; [ $r -ne 0 ] && rc=$r
    pytest_once "$phase" "$py" -m "($marks) and not serial" -n "$WORKERS" --dist worksteal "$@"
    r=$?
  else
    pytest_once "$phase" "$py" -m "$marks" "$@"
    r=$?
  fi
  [ $r -eq 5 ] && r=0; [ $r -ne 0 ] && rc=$r
  return $rc
}

phase() {  # phase NAME COMMAND...: runs it, records status and seconds
  local name=$1; shift
  echo "== $name: $*"
  local start=$SECONDS
  "$@"
  local rc=$?
  record "$name" "$([ $rc -eq 0 ] && echo passed || echo "failed (exit $rc)")" $((SECONDS - start))
  echo "== $name: $([ $rc -eq 0 ] && echo passed || echo "FAILED (exit $rc)") in $((SECONDS - start)) s"
}

# ---------------------------------------------------------------------------
# Interpreters and environments.

PY_TFF=$(first_python 3.11 3.10) || PY_TFF=""
PY_TODAY=$(first_python 3.12 3.13 3.11 3.10) || PY_TODAY=""
PY_COLAB=$(find_python 3.13) || PY_COLAB=""
PY_PIP=$(first_python 3.12 3.13) || PY_PIP=""
TODAY_ENV=""
[ -n "$PY_TODAY" ] && TODAY_ENV=".venv-py$("$PY_TODAY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

install_all() {
  local rc=0
  if wants tff && [ -n "$PY_TFF" ]; then sync .venv-tff "$PY_TFF" --extra tff || rc=1; fi
  # (the tff phase resumes checkpoints with today's interpreter too)
  if { wants today || wants sweep || wants keras2 || wants tff; } && [ -n "$PY_TODAY" ]; then
    sync "$TODAY_ENV" "$PY_TODAY" --extra legacy-keras --extra ray --extra tfds --extra privacy || rc=1
  fi
  if wants colab && [ -n "$PY_COLAB" ]; then
    rm -rf .venv-colab
    "${UV[@]}" venv --quiet --python "$PY_COLAB" .venv-colab &&
      "${UV[@]}" pip install --quiet --compile-bytecode --python .venv-colab/bin/python \
        -r .ci/colab-constraints.txt || rc=1
  fi
  if wants pip && [ -n "$PY_PIP" ]; then  # pip resolves today's stack itself
    rm -rf .venv-pip
    "$PY_PIP" -m venv .venv-pip &&
      .venv-pip/bin/python -m pip install --quiet --disable-pip-version-check \
        ".[legacy-keras]" pytest nbclient nbformat ipykernel || rc=1
  fi
  return $rc
}
phase install install_all

# ---------------------------------------------------------------------------
# The phases.

tff_phase() {
  ( unset TF_USE_LEGACY_KERAS
    # The cross-stack tests (tests/test_cross_stack.py) resume checkpoints
    # written on this stack with today's interpreter, and the other way round.
    [ -n "$TODAY_ENV" ] && [ -x "$TODAY_ENV/bin/python" ] &&
      export TFF_CLUSTER_TODAY_PYTHON="$ROOT/$TODAY_ENV/bin/python"
    run_pytest tff .venv-tff/bin/python "tff or stack" )
}
# The today phase runs its test files in groups, fresh interpreters each
# (two groups on two or more test processes, four on one). In one
# interpreter, TF 2.21 keeps every XLA-compiled function for the life of the
# process (memory grows with each compilation, and
# benchmarks/xla_compile_growth.py measures it), and the whole phase in one
# process ended twice in a segmentation fault inside a compiled round function
# at the same point of the run (about 57 % of its tests, a different test each
# time; each passes alone): each process holds about a quarter of the phase.
if [ "$WORKERS" -gt 1 ]; then
  TODAY_GROUPS=("tests/test_[a-o]*.py" "tests/test_[p-z]*.py")
else
  TODAY_GROUPS=("tests/test_[a-c]*.py" "tests/test_[d-o]*.py" "tests/test_[p-r]*.py"
                "tests/test_[s-z]*.py")
fi
today_phase() {
  ( unset TF_USE_LEGACY_KERAS
    rc=0 i=0
    for group in "${TODAY_GROUPS[@]}"; do
      i=$((i + 1))
      files=()  # the group's files, less the sweep phase's
      # shellcheck disable=SC2086  # the group is a glob
      for f in $group; do case $f in tests/test_sweep*) ;; *) files+=("$f") ;; esac; done
      run_pytest "today-$i" "$TODAY_ENV/bin/python" "not tff" "${files[@]}"
      r=$?
      [ $r -ne 0 ] && rc=$r
    done
    exit $rc )
}
sweep_phase() {
  ( unset TF_USE_LEGACY_KERAS
    run_pytest sweep "$TODAY_ENV/bin/python" "not tff" tests/test_sweep*.py )
}
keras2_phase() {
  ( export TF_USE_LEGACY_KERAS=1
    run_pytest keras2 "$TODAY_ENV/bin/python" "not tff" tests/test_models.py \
      tests/test_local_training.py tests/test_api.py tests/test_cross_stack.py \
      tests/test_stack.py tests/test_model_shapes.py tests/test_untrusted_input.py )
}
colab_phase() {
  ( unset TF_USE_LEGACY_KERAS; export TFF_CLUSTER_PIP_PHASE=colab
    run_pytest colab .venv-colab/bin/python "not tff" tests/test_pip_install.py )
}
pip_phase() {
  ( unset TF_USE_LEGACY_KERAS; export TFF_CLUSTER_PIP_PHASE=pip
    run_pytest pip .venv-pip/bin/python "not tff" tests/test_pip_install.py )
}

# maybe_phase NAME INTERPRETER WHY-SKIPPED: runs NAME_phase when asked for and
# its interpreter was found.
maybe_phase() {
  wants "$1" || return 0
  if [ -z "$2" ]; then skip "$1" "$3"; else phase "$1" "$1_phase"; fi
}
maybe_phase tff "$PY_TFF" "no Python 3.10/3.11 interpreter: TFF 0.87 installs on those only"
maybe_phase today "$PY_TODAY" "no Python 3.10-3.13 interpreter"
maybe_phase sweep "$PY_TODAY" "no Python 3.10-3.13 interpreter"
maybe_phase keras2 "$PY_TODAY" "no Python 3.10-3.13 interpreter"
maybe_phase colab "$PY_COLAB" "no Python 3.13 interpreter (Colab's)"
maybe_phase pip "$PY_PIP" "no Python 3.12/3.13 interpreter"

# ---------------------------------------------------------------------------
# Summary: each phase's time, then the tests of every phase added up.

echo
echo "phase     seconds  result"
failed=0
for name in "${ORDER[@]}"; do
  printf "%-8s %8s  %s\n" "$name" "${SECONDS_OF[$name]}" "${STATUS[$name]}"
  case ${STATUS[$name]} in failed*) failed=1 ;; esac
done
python3 - "$REPORTS" <<'EOF'
import glob, sys
import xml.etree.ElementTree as ET
passed = failed = skipped = 0
for path in sorted(glob.glob(sys.argv[1] + "/*.xml")):
  if ".inner." in path:  # a file re-run in a namespace: counted as the test that re-ran it
    continue
  root = ET.parse(path).getroot()
  for suite in ([root] if root.tag == "testsuite" else root.iter("testsuite")):
    tests, fail = int(suite.get("tests", 0)), int(suite.get("failures", 0)) + int(suite.get("errors", 0))
    skip = int(suite.get("skipped", 0))
    passed += tests - fail - skip; failed += fail; skipped += skip
print(f"total: {passed} passed, {failed} failed, {skipped} skipped")
EOF
echo "tier $TIER$([ "$TIER" = ci ] && echo ", slice $TFF_CLUSTER_SLICE of 8 ($slice_from)"); the slowest tests (scripts/test_durations.py .test-reports: the whole table):"
python3 scripts/test_durations.py "$REPORTS" --top 10 | sed -n '/^phase  *test  /,/^$/p'
exit $failed
