#!/bin/bash
# On the GPU machine, from the repo root: issue 43's table (bench/lean.py), the vtop of an older commit
# against this tree's, alternating, with nvitop beside both, all watching the H200 under a bf16 matmul.
#
#   bash tools/device/h200_lean_bench.sh BASE_DIR [ROUNDS] [WINDOW_S] [ONCE_RUNS]    (defaults 2, 60, 8)
#
# BASE_DIR: a copy of the older commit's tree (it needs its vtop/ only), carried; .whl: the wheels of what
# the GPU image lacks (vtop's Textual side and nvitop), carried. Made here, in the repo root, before the call:
#
#   echo /.lean-base/ >> .git/info/exclude; rm -rf .lean-base; mkdir .lean-base
#   git archive COMMIT vtop | tar -x -C .lean-base
#   python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     textual==8.2.8 textual-plotext==1.0.1 plotext==5.3.2 mdit-py-plugins platformdirs rich markdown-it-py \
#     mdurl pygments typing-extensions linkify-it-py uc-micro-py h11==0.16.0 nvidia-ml-py==13.615.71 nvitop==1.7.2
#
# The Textual floor (bench/textual_floor.py --tick: what any Textual monitor pays) runs live beside them.
# (.whl is in .gitignore.) Time: ~75 s a round (10 s warm-up, the window, the stops) plus ~20 s of
# one-shots and the install: 2 rounds of 60 s fit a 420 s call. Writes $OUT/lean.json and $OUT/lean.txt; then
# (~15 s, the matmul stopped) where each one-shot's wall time goes, step by step, for both codes
# (bench/once_timeline.py: no profiler, whose 3.12 form mixes the threads), in $OUT/once-timeline.txt.
set -u
BASE=${1:?BASE_DIR (a copy of the older commit with its vtop/)}; ROUNDS=${2:-2}; WINDOW=${3:-60}; RUNS=${4:-8}
[ -f "$BASE/vtop/__init__.py" ] || { echo "no $BASE/vtop/__init__.py"; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/lean-site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/lean-site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "base: $(cd "$BASE" && python3 -c 'import vtop; print(vtop.__version__)') from $BASE; new: $(git log --oneline -1 2>/dev/null || echo 'this tree')"
OUT=${OUT:-/tmp/lean-out}; mkdir -p "$OUT"
set -o pipefail
python3 bench/lean.py --code "base=$BASE" --code new=. --gpu real --load matmul --rounds "$ROUNDS" \
  --window "$WINDOW" --warmup 10 --once-runs "$RUNS" --floor --out "$OUT/lean.json" 2>&1 | tee "$OUT/lean.txt"
rc=$?
for code in "$BASE" .; do
  echo "## $code"; python3 bench/once_timeline.py --runs 8 --code "$code" 2>&1
done | tee "$OUT/once-timeline.txt"
exit $rc
