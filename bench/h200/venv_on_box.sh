#!/bin/bash
# On the GPU machine: install vtop into a fresh venv from carried wheels, as the README installs it
# (a venv and `pip install .`), so that the bench measures what a user runs rather than the GPU image's
# system Python with vtop on PYTHONPATH (its site-packages are read at every start: ~26 ms of first frame).
#
#   bash bench/h200/venv_on_box.sh WHEELDIR [VENV]       # WHEELDIR: vtop's wheel + its dependencies' (cp312)
#   VENV/bin/python bench/run.py --skip record            # then the bench starts VENV/bin/vtop
#
# Make WHEELDIR here (it is not in git): pip wheel --no-deps . -w DIR, then pip download --only-binary=:all:
# --python-version 3.12 --platform manylinux_2_28_x86_64 ... -d DIR DIR/vtop-*.whl (bench/h200/README.md).
set -euo pipefail
WHL=$1; VENV=${2:-/tmp/vv}
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --no-index --find-links "$WHL" vtop
(cd / && "$VENV/bin/python" -c "import vtop, sys; print('vtop', vtop.__version__, 'from', vtop.__file__, 'on', sys.version.split()[0])")
