#!/bin/bash
# Session 29's one GPU call (from the repo root, carry .whl and .lean-base): NVML's per-call costs under a
# matmul load (nvmlDeviceGetProcessUtilization included), issue 43's lean table base vs new, and the RSS probe.
set -u
OUT=${OUT:-/tmp/s29-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/lean-site .whl/*.whl || exit 1
nvidia-smi --query-gpu=name,driver_version,persistence_mode --format=csv,noheader | tee "$OUT/gpu.txt"
PYTHONPATH=bench python3 -c 'from lean import MATMUL; open("/tmp/matmul.py", "w").write(MATMUL)'
python3 /tmp/matmul.py & LOAD=$!
sleep 8
PYTHONPATH=/tmp/lean-site:$PWD timeout 150 python3 bench/nvml_calibrate.py --polls 200 --slow-polls 8 \
  --out "$OUT/cal.json" > "$OUT/cal.txt" 2>&1; echo "calibrate rc $?"
kill $LOAD; wait $LOAD 2>/dev/null
OUT="$OUT" timeout 330 bash tools/device/h200_lean_bench.sh .lean-base 2 60 8 > "$OUT/lean-all.txt" 2>&1
echo "lean rc $?"
PYTHONPATH=/tmp/lean-site:$PWD timeout 100 python3 bench/rss_probe.py --window 40 --out "$OUT/rss.json" \
  > "$OUT/rss.txt" 2>&1; echo "rss rc $?"
tail -25 "$OUT/lean.txt"; grep -i "proc_util\|per call" "$OUT/cal.txt" | head -20
