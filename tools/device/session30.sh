#!/bin/bash
# Session 30's GPU call (from the repo root, carry .whl and .lean-base): issue 43's lean table, base (main at
# d367697, session 29's last) against this tree (a quiet monitor no longer says its alerts changed every round;
# the download thread sleeps while nothing downloads), nvitop beside both; the Textual floor, and the floor
# reading NVML (what any Textual GPU monitor's memory is), beside them.
set -u
OUT=${OUT:-/tmp/s30-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,persistence_mode --format=csv,noheader | tee "$OUT/gpu.txt"
OUT="$OUT" timeout 520 bash tools/device/h200_lean_bench.sh .lean-base 2 60 10 > "$OUT/lean-all.txt" 2>&1
echo "lean rc $?"; tail -14 "$OUT/lean.txt"
