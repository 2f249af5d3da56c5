"""The collectors, the pure core and the actions must work without Textual."""

from __future__ import annotations

import subprocess
import sys

import pytest

import vtop


@pytest.mark.parametrize("pkg", ["vtop.sources", "vtop.core", "vtop.actions"])
def test_layers_do_not_import_textual(pkg: str) -> None:
    from pathlib import Path

    root = Path(vtop.__file__).parent / pkg.split(".")[1]
    mods = [f"{pkg}.{p.stem}" for p in root.glob("*.py") if p.stem != "__init__"] + [pkg]
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in mods) + (
        "bad = sorted(m for m in sys.modules if m == 'textual' or m.startswith('textual.'))\n"
        "print(','.join(bad))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", f"{pkg} pulled in {r.stdout.strip()}"
    assert len(mods) >= 1


def test_the_check_itself_can_fail() -> None:
    r = subprocess.run([sys.executable, "-c", "import vtop.ui.app, sys; print('textual' in sys.modules)"],
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "True"
