#!/bin/bash
# cpu_stop.sh: the stand-in for the GPU recipe's stop.sh (dry run): SIGINT to the pid in
# $VTOP_H200_RUN_DIR/serve.pid, SIGKILL of its process group if anything of it is left after 30 s.
set -u
F=${VTOP_H200_RUN_DIR:-/tmp/vllm}/serve.pid
[ -f "$F" ] || { echo "no $F"; exit 0; }
PID=$(cat "$F")
alive() { local st; st=$(ps -o stat= -p "$PID" 2>/dev/null); [ -n "$st" ] && [ "${st:0:1}" != Z ]; }
group() { ps -eo pgid=,stat= | awk -v g="$PID" '$1 == g && $2 !~ /^Z/ {n++} END {exit n == 0}'; }
if alive; then
  kill -INT "$PID"
  for _ in $(seq 300); do alive || break; sleep 0.1; done
fi
for _ in $(seq 50); do group || break; sleep 0.1; done
group && { echo "SIGKILL to process group $PID"; kill -KILL -- "-$PID"; }
rm -f "$F"
echo "stopped pid $PID"
