#!/bin/bash
# h200_s15.sh S|T   (on the GPU machine, from the repo root): session 15's GPU batch.
#   S  receive the carried parts, install.sh, serve vLLM 0.26.0 with n-gram speculative decoding and
#      prefix caching (falls back to a plain start, keeping the failed log, if 0.26.0 refuses), then
#      tools/device/h200_signals.py records /metrics before/during/after a load -> $OUT/h200-signals.tgz
#   T  against that running server: bench/oneshot.py (vtop --once --json beside nvitop's one-shot) when
#      the tree has it, bench/h200/xid_wait.py (NVML XID event wait) when the tree has it, one
#      `vtop --once --json` and one `nvitop -1` kept as text; then stop.sh and the serve log -> $OUT
# Before S: the recipe's call 1 (part00 + .vllm-gpu/vtop-whl through add_wheels.sh; the wheels include
# nvitop for the side-by-side) and one call per further part (receive.sh), on the same machine.
set -u
CALL=${1:?S or T}
export PYTHONPATH=/tmp/vtop-site:$PWD
D=/tmp/s15; mkdir -p $D
case $CALL in
  S)
    for P in .vllm-gpu/part0*; do [ -f "$P" ] && { bash .vllm-gpu/device/receive.sh "$P" || exit 1; }; done
    bash /tmp/vllm-gpu/install.sh > $D/install.log 2>&1 || { tail -n 30 $D/install.log; exit 1; }
    tail -n 2 $D/install.log
    SPEC='{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
    if bash /tmp/vllm-gpu/serve.sh --wait 420 -- --speculative-config "$SPEC" --enable-prefix-caching > $D/serve-spec.out 2>&1; then
      echo "served with speculative decoding + prefix caching"; MODE=spec
    else
      tail -n 25 $D/serve-spec.out; cp /tmp/vllm/serve.log $D/serve-spec-failed.log 2>/dev/null
      bash /tmp/vllm-gpu/stop.sh >/dev/null 2>&1
      bash /tmp/vllm-gpu/serve.sh --wait 300 -- --enable-prefix-caching > $D/serve-plain.out 2>&1 || { tail -n 25 $D/serve-plain.out; exit 1; }
      echo "served with prefix caching only (speculative decoding refused; log kept)"; MODE=plain
    fi
    python3 -m tools.device.h200_signals --out $D/signals-$MODE --seconds 40
    cp /tmp/vllm/serve.log $D/signals-$MODE/serve-startup.log
    tar -czf "$OUT/h200-signals.tgz" -C $D . ;;
  T)
    [ -x /tmp/site/bin/vllm ] || { echo "vLLM is not installed here (a fresh machine?)"; exit 2; }
    mkdir -p $D/T
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/T/gpu.txt
    python3 -m vtop --once --json http://127.0.0.1:8000 --log /tmp/vllm/serve.log > $D/T/once.json 2> $D/T/once.err; echo "vtop --once rc=$?"
    python3 -m nvitop --once > $D/T/nvitop-once.txt 2>&1; echo "nvitop -1 rc=$?"
    if [ -f bench/oneshot.py ]; then
      timeout 240 python3 bench/oneshot.py --runs 20 --url http://127.0.0.1:8000 --nvitop "python3 -m nvitop" --out $D/T/oneshot.json 2>&1 | tee $D/T/oneshot.txt | tail -n 30
    fi
    if [ -f bench/h200/xid_wait.py ]; then
      timeout 120 python3 bench/h200/xid_wait.py --out $D/T/xid.json 2>&1 | tee $D/T/xid.txt | tail -n 30
    fi
    bash /tmp/vllm-gpu/stop.sh > /dev/null 2>&1; cp /tmp/vllm/serve.log $D/T/serve.log
    tar -czf "$OUT/h200-T.tgz" -C $D/T . ; ls -l $OUT ;;
  *) echo "unknown call $CALL"; exit 2 ;;
esac
