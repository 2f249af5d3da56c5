#!/bin/bash
# h200_corpus.sh A|B|C|D|E|F   (on the GPU machine, from the repo root): one `run` call of the H200 corpus.
#   A  receive the carried .vllm-gpu/part0* (part01, or part02 of three), install.sh, then h200-runaway-short-traffic (the cold first start)
#   B  h200-startup-stall-graph-capture
#   C  h200-startup-failure-cuda-oom, then h200-normal-burst-queue
#   D  h200-engine-stall-load
#   E  as A (receive the carried parts, install.sh), then h200-runaway-nonstreaming-short-traffic
#   F  h200-normal-long-nonstreaming (E and F: ~300 + ~45 s of install and ~280 s do not fit in one call)
#   G  as A (receive the carried parts, install.sh), then h200-engine-stall-streams-nolog (issue 49: vLLM's stdout
#      a pipe, 3 streams, the EngineCore SIGSTOPped, `vtop doctor --window 15` started 30 s after the stop)
#   H  as A, then h200-neighbour-matmul and h200-startup-failure-max-model-len (K: that one alone);
#   J  as A, then h200-starts-history-budget
#   N  as A, then h200-neighbour-gpu-bound (the neighbour beside a 7B-shaped copy of the tiny model served with
#      --load-format dummy: a decode bound by the GPU)
#   I  as A, then h200-runtime-oom-prompt-logprobs (it makes /tmp/tiny-v151936 from /tmp/tiny first, ~2 s, and
#      serves it with VLLM_USE_V2_MODEL_RUNNER=0 through a copy of serve.sh)
# Part00 (with .vllm-gpu/vtop-whl through add_wheels.sh) must have been received by an earlier call on the
# same machine (the shared recipe's call 1). Traces go to /tmp/h200-corpus/CALL/SCENARIO/, packed with the
# recorder's output into $OUT/h200-corpus-CALL.tgz. The recorder stops by itself before 570 s of the call.
# Dry run elsewhere: VTOP_H200_VLLM_BIN (the vllm that must exist), VTOP_H200_EXTRA (e.g. "--small --scale 0.5")
# and the recorder's VTOP_H200_SERVE / VTOP_H200_STOP / VTOP_H200_RUN_DIR (README-corpus.md).
set -u
CALL=${1:?A, B, C, D, E, F, G, H, I, J, K or N}
D=/tmp/h200-corpus; mkdir -p "$D/$CALL"
export PYTHONPATH=/tmp/vtop-site:$PWD
install() {
  # nothing carried and vLLM already installed on this (warm) machine: an earlier call installed it
  if ! ls .vllm-gpu/part0* > /dev/null 2>&1 && [ -x /tmp/site/bin/vllm ] && [ -d /tmp/tiny ]; then
    echo "vLLM installed by an earlier call: no install"; return 0
  fi
  # the parts this call carries (part01, or the last of three with PART_MIB=40)
  for P in .vllm-gpu/part0*; do [ -f "$P" ] && { bash .vllm-gpu/device/receive.sh "$P" || exit 1; }; done
  bash /tmp/vllm-gpu/install.sh > "$D/install.log" 2>&1 || { tail -n 30 "$D/install.log"; exit 1; }
  tail -n 3 "$D/install.log"
  # vLLM 0.26.0 imports sniffio (through openai); the image lacks it since 2026-12-02 and add_wheels.sh puts
  # it in /tmp/vtop-site only: without this, `vllm serve` exits at import
  [ -d /tmp/site/sniffio ] || cp -r /tmp/vtop-site/sniffio* /tmp/site/ 2>/dev/null
}
case $CALL in
  A) install; S=h200-runaway-short-traffic ;;
  B) S=h200-startup-stall-graph-capture ;;
  C) S=h200-startup-failure-cuda-oom,h200-normal-burst-queue ;;
  D) S=h200-engine-stall-load ;;
  E) install; S=h200-runaway-nonstreaming-short-traffic ;;
  F) S=h200-normal-long-nonstreaming ;;
  G) install; S=h200-engine-stall-streams-nolog ;;
  H) install; S=h200-neighbour-matmul,h200-startup-failure-max-model-len ;;   # issue 40's noisy neighbour (needs the image's torch), then a real KV-cache failure and vtop's fit
  K) install; S=h200-startup-failure-max-model-len ;;
  N) install; S=h200-neighbour-gpu-bound ;;   # issue 40's noisy neighbour beside a decode bound by the GPU
  I) install; S=h200-runtime-oom-prompt-logprobs ;;   # issue 40's runtime OOM by stage
  J) install; S=h200-starts-history-budget ;;   # issue 40's start history and memory budget
  *) echo "unknown call $CALL"; exit 2 ;;
esac
[ -x "${VTOP_H200_VLLM_BIN:-/tmp/site/bin/vllm}" ] || { echo "vLLM is not installed here (a fresh machine?): redo part00, then call A"; exit 2; }
LEFT=$((565 - SECONDS))
timeout -s TERM "$LEFT" python3 -m tools.device.h200_corpus "$S" --out "$D/$CALL" --budget-s $((LEFT - 25)) \
  ${VTOP_H200_EXTRA:-} > "$D/$CALL.log" 2>&1
RC=$?
cp -f "$D/$CALL.log" "$D/$CALL/recorder.log"
grep -E '^\[|"(duration_s|size|class|began|should_alert_by|ended)"' "$D/$CALL.log" | cut -c1-220 | tail -n 60
for F in "$D/$CALL"/*/doctor-*.txt; do [ -f "$F" ] && { echo "=== $F"; cat "$F"; }; done
echo "recorder rc=$RC after ${SECONDS} s"
tar -czf "$OUT/h200-corpus-$CALL.tgz" -C "$D/$CALL" .
ls -l "$OUT"
