#!/bin/bash
# sglang_stop.sh   (the GPU machine): stops the SGLang that sglang_serve.sh started. SIGCONT to its process group
# first (a scenario may have left the scheduler stopped), SIGINT to the launcher (its pid = the group, setsid), then
# SIGKILL of whatever of the group is left after 30 s; waits (15 s at most) for the group to be gone, so the next
# start finds the GPU's memory free. Exit 0 also when nothing was running.
set -u
F=/tmp/sglang/serve.pid
[ -f "$F" ] || { echo "no $F"; exit 0; }
PID=$(cat "$F")
alive() { local st; st=$(ps -o stat= -p "$PID" 2>/dev/null); [ -n "$st" ] && [ "${st:0:1}" != Z ]; }
group() { ps -eo pgid=,stat= | awk -v g="$PID" '$1 == g && $2 !~ /^Z/ {n++} END {exit n == 0}'; }
kill -CONT -- "-$PID" 2>/dev/null
if alive; then
  kill -INT "$PID"
  for _ in $(seq 300); do alive || break; sleep 0.1; done
fi
for _ in $(seq 100); do group || break; sleep 0.1; done
group && { echo "SIGKILL to process group $PID"; kill -KILL -- "-$PID"; }
for _ in $(seq 150); do group || break; sleep 0.1; done
rm -f "$F"
echo "stopped sglang pid $PID"
