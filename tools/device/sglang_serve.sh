#!/usr/bin/env bash
# sglang_serve.sh [--log PATH] [--wait [S]] [-- EXTRA_ARGS]   (the GPU machine, after sglang_install.sh)
# Starts SGLang 0.5.17 from /tmp/sglsite on /tmp/tiny (made by sglang_tiny.py when missing) under setsid, so it
# outlives the call: http://127.0.0.1:30000, its stdout+stderr in /tmp/sglang/serve.log (or --log PATH; unbuffered), its pid
# (= its process group) in /tmp/sglang/serve.pid, {"pid","t_launch","log","port","cmd"} in /tmp/sglang/serve.json.
# The flags, and why: --enable-metrics (the sglang: families vtop reads), --attention-backend triton (the bundle
# leaves out sgl-kernel's FlashAttention 3, 1.1 GB), --sampling-backend pytorch (no flashinfer JIT for sampling),
# --mem-fraction-static 0.5, --context-length 32768. --wait polls /health (default 600 s) and prints the time.
# Stop it: kill -INT "$(cat /tmp/sglang/serve.pid)"; kill -KILL -- -"$(cat /tmp/sglang/serve.pid)" after 30 s.
set -uo pipefail
PY=${PYTHON:-/opt/torch/.venv/bin/python3}; [ -x "$PY" ] || PY=python3
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
WAIT=""; LOG=/tmp/sglang/serve.log
while [ $# -gt 0 ]; do
  case $1 in
    --log) LOG=$2; shift 2 ;;
    --wait) shift; WAIT=600; case ${1:-} in [0-9]*) WAIT=$1; shift ;; esac ;;
    --) shift; break ;;
    *) break ;;
  esac
done
[ -d /tmp/sglsite/sglang ] || { echo "not installed: run sglang_install.sh first"; exit 2; }
if [ ! -f /tmp/tiny/config.json ]; then "$PY" "$HERE/sglang_tiny.py" /tmp/tiny || exit 3; fi
mkdir -p /tmp/sglang "$(dirname "$LOG")"
export PYTHONPATH=/tmp/sglsite PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=1
CMD=("$PY" -m sglang.launch_server --model-path /tmp/tiny --host 127.0.0.1 --port 30000 --enable-metrics
     --attention-backend triton --sampling-backend pytorch --mem-fraction-static 0.5 --context-length 32768 "$@")
T0=$(date +%s.%N)
setsid "${CMD[@]}" > "$LOG" 2>&1 < /dev/null &
PID=$!
echo "$PID" > /tmp/sglang/serve.pid
"$PY" -c 'import json,sys; print(json.dumps({"pid": int(sys.argv[1]), "t_launch": float(sys.argv[2]),
  "log": sys.argv[3], "port": 30000, "cmd": sys.argv[4:]}))' "$PID" "$T0" "$LOG" "${CMD[@]}" > /tmp/sglang/serve.json
echo "sglang pid $PID, log $LOG"
[ -n "$WAIT" ] || exit 0
for ((i = 0; i < WAIT; i++)); do
  if "$PY" -c 'import urllib.request as u; u.urlopen("http://127.0.0.1:30000/health", timeout=2)' 2>/dev/null; then
    echo "ready: /health 200 after $(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"; exit 0
  fi
  kill -0 "$PID" 2>/dev/null || { echo "sglang exited before ready; the log's end:"; tail -n 60 "$LOG"; exit 4; }
  sleep 1
done
echo "not ready after $WAIT s; the log's end:"; tail -n 30 "$LOG"; exit 5
