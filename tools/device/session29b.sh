#!/bin/bash
# Session 29's second GPU call (from the repo root, carry .whl and .lean-base): issue 43's lean table, base (main at
# 6aa26da) against this tree (the one-shot's NVML poll begun at once; a lone process's SM share read every 30 s).
set -u
OUT=${OUT:-/tmp/s29b-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,persistence_mode --format=csv,noheader | tee "$OUT/gpu.txt"
OUT="$OUT" timeout 500 bash tools/device/h200_lean_bench.sh .lean-base 2 60 10 > "$OUT/lean-all.txt" 2>&1
echo "lean rc $?"; tail -12 "$OUT/lean.txt"
