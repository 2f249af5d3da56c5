#!/bin/bash
# h200_two_servers.sh   (on the GPU machine, from the repo root): issue 39's two vLLM servers on one GPU, an H200
# or an H100 (the name is the plan's; the script runs on either card). The recording of session 25 (2026-12-05,
# VTOP_TWO_BUDGET_S=360) ran on a lent H100 80GB: it is tests/fixtures/h100-two-servers/ (named for its card).
# One `run` call after the shared recipe's call 1 (part00 and vtop-whl received on the same machine). With
# .vllm-gpu/part01 and .vllm-gpu/device carried, it receives part01 and runs install.sh first (as
# h200_corpus.sh A does, ~45 s); without them vLLM (/tmp/site) and /tmp/tiny must be installed already
# (a server the recipe started on port 8000 is stopped first). It starts `vllm serve /tmp/tiny --gpu-memory-utilization 0.4` on 8000, then on 8001,
# with vtop recording both from before the first launch (`vtop --once --json --window ... --record`,
# no --log), then: both idle, load on 8000, a runaway on 8000 while 8001's EngineCore is SIGSTOPped,
# and stops both (tools/device/h200_two_servers.py says the timeline). About 7 minutes.
# Comes back as $OUT/h200-two-servers.tgz: rec.jsonl.gz (for tests/fixtures/<card>-two-servers/), report.json,
# the servers' logs, events.jsonl, nvidia-smi.txt. Dry run elsewhere: VTOP_H200_VLLM_BIN, VTOP_H200_MODEL.
set -u
D=/tmp/two; rm -rf "$D"; mkdir -p "$D"
export PYTHONPATH=/tmp/vtop-site:$PWD PATH=/tmp/site/bin:$PATH
if ls .vllm-gpu/part0* > /dev/null 2>&1; then
  for P in .vllm-gpu/part0*; do bash .vllm-gpu/device/receive.sh "$P" || exit 1; done
  bash /tmp/vllm-gpu/install.sh > "$D/install.log" 2>&1 || { tail -n 30 "$D/install.log"; exit 1; }
  tail -n 3 "$D/install.log"
fi
[ -x "${VTOP_H200_VLLM_BIN:-/tmp/site/bin/vllm}" ] || { echo "vLLM is not installed here (a fresh machine?): redo the recipe's calls 1 and 2"; exit 2; }
[ -d /tmp/site/sniffio ] || cp -r /tmp/vtop-site/sniffio* /tmp/site/ 2>/dev/null   # as h200_corpus.sh
if [ -f /tmp/vllm/serve.pid ] && kill -0 "$(cat /tmp/vllm/serve.pid)" 2>/dev/null; then
  bash /tmp/vllm-gpu/stop.sh   # the recipe's own server holds port 8000 and half the GPU
fi
LEFT=$((560 - SECONDS))
# VTOP_TWO_BUDGET_S: a shorter run where device time is short (360: idle 15 s, load 30 s, ~120 s of incident)
BUDGET=${VTOP_TWO_BUDGET_S:-420}
timeout -s TERM "$LEFT" python3 -m tools.device.h200_two_servers --out "$D" --budget-s $((LEFT - 100 > BUDGET ? BUDGET : LEFT - 100)) \
  ${VTOP_TWO_ARGS:-} > "$D/driver.log" 2>&1
RC=$?
grep -E '"ev": "(vllm_launch|health_ready|engines|sigstop|sigcont|runaway_end|load_end|vtop_done|abandoned|vllm_exited)"' "$D/driver.log" | cut -c1-200
python3 - "$D/report.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("no report:", e); raise SystemExit
for g in r.get("gpus", []):
    print("gpu", g["index"], [(p["pid"], p.get("owner"), p["used_bytes"]) for p in g["processes"]])
for s in r.get("servers", []):
    print("server", s["url"], s["state"], s.get("pid"))
for a in r.get("alerts", []):
    print("alert", a["rule"], a["severity"], a["title"][:150])
PY
echo "driver rc=$RC after ${SECONDS} s"
tar -czf "$OUT/h200-two-servers.tgz" -C "$D" .
ls -l "$OUT"
