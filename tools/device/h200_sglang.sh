#!/bin/bash
# h200_sglang.sh CALL   (on the GPU machine, from the repo root): one `run` call of issue 42's SGLang proof.
#   P        receive the carried .sglang-gpu/partNN (sglang_install.sh: it installs once all five are here) and,
#            when carried, vtop's wheels .sglang-gpu/vtop-whl into /tmp/vtop-site; nvidia-smi -L. Calls 1-4.
#   A B C D  the same receive first (call A carries part04: the install, ~1-2 min), then the recorder
#            (tools/device/h200_sglang.py) on the scenarios not yet recorded on this machine, in this order:
#              h200-sglang-launch-burst-runaway   (A: SGLang's first start on the machine, JIT and CUDA graphs)
#              h200-sglang-scheduler-stall
#              h200-sglang-normal-load
#            each with vtop's own recording; a scenario whose estimate does not fit in what is left of the call
#            waits for the next call (B, then C; D only if one failed).
# Traces go to /tmp/h200-sglang/CALL/SCENARIO/, vtop's recordings to /tmp/h200-sglang/CALL.vtop/SCENARIO/, packed
# with the recorder's output into $OUT/h200-sglang-CALL.tgz. The recorder stops by itself by 565 s of the call.
# Dry run elsewhere (README-sglang.md): VTOP_SGL_ENGINE=vllm-cpu, VTOP_SGL_EXTRA="--small --scale 0.5",
# VTOP_SGL_ROOT (default /tmp/h200-sglang).
set -u
CALL=${1:?P, A, B, C or D}
ROOT=${VTOP_SGL_ROOT:-/tmp/h200-sglang}; D=$ROOT/$CALL; mkdir -p "$D"
ENGINE=${VTOP_SGL_ENGINE:-sglang}
export PYTHONPATH=/tmp/vtop-site:$PWD
S=h200-sglang-launch-burst-runaway,h200-sglang-scheduler-stall,h200-sglang-normal-load

receive() {
  # the parts this call carries; sglang_install.sh copies them to /tmp/sglparts and installs once all are there
  local parts=(.sglang-gpu/part[0-9][0-9])
  if [ -f "${parts[0]}" ]; then
    bash .sglang-gpu/device/sglang_install.sh "${parts[@]}" > "$ROOT/install-$CALL.log" 2>&1
    local rc=$?
    grep -E '^\[sglang_install|missing|MISMATCH|Error|error:' "$ROOT/install-$CALL.log" | tail -n 25
    [ $rc = 0 ] || { echo "sglang_install.sh rc=$rc"; tail -n 30 "$ROOT/install-$CALL.log"; exit 1; }
  fi
  # vtop's dependencies the image lacks (textual, plotext, ...) or has older, into /tmp/vtop-site
  if [ -d .sglang-gpu/vtop-whl ]; then
    python3 - .sglang-gpu/vtop-whl > "$ROOT/vtop-whl.txt" <<'PY'
import importlib.metadata as md, re, sys
from pathlib import Path
from packaging.version import Version
for w in sorted(Path(sys.argv[1]).glob("*.whl")):
    name, ver = w.name.split("-")[:2]
    try:
        have = md.version(re.sub(r"[-_.]+", "-", name).lower())
    except md.PackageNotFoundError:
        have = None
    if have is None or Version(have) < Version(ver):
        print(w)
PY
    if [ -s "$ROOT/vtop-whl.txt" ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/vtop-site \
        $(cat "$ROOT/vtop-whl.txt") && echo "vtop's wheels: $(wc -l < "$ROOT/vtop-whl.txt") installed into /tmp/vtop-site"
    fi
    python3 -c "import textual, h11, pynvml, httpx, vtop; print('vtop deps ok')"
  fi
}

receive
if [ "$CALL" = P ]; then nvidia-smi -L 2>/dev/null; exit 0; fi
if [ "$ENGINE" = sglang ] && [ ! -d /tmp/sglsite/sglang ]; then
  echo "SGLang is not installed here (a fresh machine, or a part missing): carry part00..part04 again (calls 1-5)"; exit 2
fi
LEFT=$((565 - SECONDS))
timeout -s TERM "$LEFT" python3 -m tools.device.h200_sglang "$S" --out "$D" --engine "$ENGINE" --skip-recorded "$ROOT" \
  --budget-s $((LEFT - 25)) ${VTOP_SGL_EXTRA:-} > "$D/recorder.log" 2>&1
RC=$?
grep -E '^\[(scenario|skip|serve|stop)\]|"(duration_s|class|began|should_alert_by|ended)"|vtop_(start|end)|load_end|sigstop|sigcont|client_hangup|scenario_error' \
  "$D/recorder.log" | cut -c1-220 | tail -n 60
python3 - "$ROOT" "$D" <<'PY'
import gzip, json, sys
from pathlib import Path
root, here = Path(sys.argv[1]), Path(sys.argv[2])
for t in sorted(here.glob("*/truth.json")):
    tr = json.loads(t.read_text())
    if "scenario error" in tr.get("notes", ""):
        print(f"=== {t.parent.name}: scenario error; the log's end:")
        try:
            print("\n".join(gzip.open(t.parent / "log.bin.gz").read().decode(errors="replace").splitlines()[-30:]))
        except OSError as e:
            print(e)
    rec = here.with_name(here.name + ".vtop") / t.parent.name / "rec.jsonl.gz"
    print(f"{t.parent.name}: {tr['class']}, capture {tr.get('capture')}, burst {tr.get('burst', {}).get('waiting_max')}, "
          f"vtop rec {rec.stat().st_size if rec.exists() else None} B")
names = ["h200-sglang-launch-burst-runaway", "h200-sglang-scheduler-stall", "h200-sglang-normal-load"]
def ok(n):
    for t in root.glob(f"*/{n}/truth.json"):
        if "scenario error" not in json.loads(t.read_text()).get("notes", ""):
            return t.parent.parent.name
print("recorded on this machine:", {n: ok(n) for n in names})
PY
echo "recorder rc=$RC after ${SECONDS} s"
cp -f "$ROOT/install-$CALL.log" "$D/" 2>/dev/null
tar -czf "$OUT/h200-sglang-$CALL.tgz" -C "$ROOT" "$CALL" $( [ -d "$D.vtop" ] && echo "$CALL.vtop" )
ls -l "$OUT"
