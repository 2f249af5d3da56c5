#!/bin/bash
# cpu_serve.sh [--log PATH] [--wait [S]] [-- ARGS]: a stand-in for the GPU recipe's serve.sh, for the dry run
# of tools/device/h200_corpus.py on a box without the GPU: starts the vLLM CPU build ($VTOP_VLLM_VENV, default
# /tmp/vllmcpu) on $VTOP_VLLM_MODEL (/tmp/tinyllama) on a free loopback port, in a process group of its own
# (not a new session: with sched_autogroup a new session starves the recorder on a 2-core box), and writes
# $VTOP_H200_RUN_DIR/serve.pid and serve.json {"pid", "t_launch", "log", "port", "cmd"} as serve.sh does.
set -euo pipefail
RUN=${VTOP_H200_RUN_DIR:-/tmp/vllm}; LOG=$RUN/serve.log; WAIT=
while [ $# -gt 0 ]; do
  case $1 in
    --log) LOG=$2; shift 2 ;;
    --wait) if [[ ${2:-} =~ ^[0-9]+$ ]]; then WAIT=$2; shift 2; else WAIT=300; shift; fi ;;
    --) shift; break ;;
    *) echo "cpu_serve.sh: unknown argument $1"; exit 2 ;;
  esac
done
VENV=${VTOP_VLLM_VENV:-/tmp/vllmcpu}; MODEL=${VTOP_VLLM_MODEL:-/tmp/tinyllama}
mkdir -p "$RUN" "$(dirname "$LOG")"
# $VTOP_CPU_PORT: a port known before the launch (h200_sglang.py's dry run starts vtop against it first)
PORT=${VTOP_CPU_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} VLLM_HOST_IP=127.0.0.1 HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PYTHONUNBUFFERED=1 \
  VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-$VENV/cache} HF_HOME=$VENV/hf PATH=$VENV/bin:$PATH \
  VLLM_USE_AOT_COMPILE=${VLLM_USE_AOT_COMPILE:-0}  # as tests/helpers/vllm_env.py says why
unset PYTHONPATH
CMD=("$VENV/bin/vllm" serve "$MODEL" --host 127.0.0.1 --port "$PORT" --max-model-len 2048 --dtype bfloat16 "$@")
rm -f "$RUN/serve.pid"
T_LAUNCH=$(date +%s.%N)
python3 -c 'import os, sys; os.setpgid(0, 0); open(sys.argv[1], "w").write(str(os.getpid())); os.execv(sys.argv[2], sys.argv[2:])' \
  "$RUN/serve.pid" "${CMD[@]}" > "$LOG" 2>&1 < /dev/null &
for _ in $(seq 50); do [ -s "$RUN/serve.pid" ] && break; sleep 0.1; done
PID=$(cat "$RUN/serve.pid")
python3 -c 'import json, sys; a = sys.argv
json.dump({"pid": int(a[1]), "t_launch": float(a[2]), "log": a[3], "port": int(a[4]), "cmd": a[6:]}, open(a[5], "w"))' \
  "$PID" "$T_LAUNCH" "$LOG" "$PORT" "$RUN/serve.json" "${CMD[@]}"
echo "vLLM (CPU stand-in) started: pid $PID, log $LOG, http://127.0.0.1:$PORT"
[ -z "$WAIT" ] || for _ in $(seq $((WAIT * 2))); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && { echo ready; exit 0; }; sleep 0.5; done
