#!/bin/bash
# On the GPU machine: scenario (c) for two builds of vtop on the same box, alternating, so that a change
# shows against the box's own speed (one code's (c) moves 0.8 -> 1.0 % from box to box).
#
#   bash bench/h200/ab_on_box.sh DEPS A_DIR B_DIR ROUNDS OUT [bench/run.py args...]
#
# DEPS: vtop's dependencies' wheels (cp312, as for venv_on_box.sh); A_DIR, B_DIR: one vtop wheel each, built
# here from the two commits (git archive COMMIT | tar -x -C /tmp/a && pip wheel --no-deps /tmp/a -w A_DIR).
# Each build gets its own venv (/tmp/ab-a, /tmp/ab-b) and runs `bench/run.py --only c` from it (the bench
# starts the venv's own `vtop`); the order flips every round. Prints one line per run; JSON in OUT.
# Time: ~70-85 s a run, so 3 rounds (6 runs) fit one 600 s call.
set -euo pipefail
DEPS=$1; A=$2; B=$3; ROUNDS=$4; OUT=$5; shift 5
mkdir -p "$OUT"
for k in a b; do
    dir=$A; [ "$k" = b ] && dir=$B
    rm -rf "/tmp/ab-$k"
    python3 -m venv "/tmp/ab-$k"
    "/tmp/ab-$k/bin/python" -m pip install -q --no-index --find-links "$DEPS" --find-links "$dir" "$dir"/vtop-*.whl
done
for i in $(seq 1 "$ROUNDS"); do
    order="a b"; [ $((i % 2)) -eq 0 ] && order="b a"
    for k in $order; do
        "/tmp/ab-$k/bin/python" bench/run.py --only c --skip parse,attach,record --floor-starts 0 --starts 1 \
            --out "$OUT/ab-$i-$k.json" "$@" 2>/dev/null | grep '^(c)' | sed "s/^/round $i $k: /"
    done
done
