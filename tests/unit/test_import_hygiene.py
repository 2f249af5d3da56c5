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


#: What the dashboard must not import before its first frame (each is 10-60 ms
#: on a 2-core box; they are imported where first used).
DEFERRED = ("prometheus_client", "h11", "httpx", "psutil", "vtop.core.phases", "vtop.core.diagnose",
            "vtop.core.requests", "vtop.sources.record", "vtop.sources.logwatch", "vtop.actions.snapshot")


def test_the_first_frame_waits_for_no_deferred_import() -> None:
    code = ("import sys, vtop.cli, vtop.ui.app\n"
            f"print(','.join(m for m in {DEFERRED!r} if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", f"imported at start-up: {r.stdout.strip()}"
    # ...and the same check sees them once they are used
    r = subprocess.run([sys.executable, "-c", code.replace("vtop.ui.app", "vtop.ui.app, vtop.core.diagnose")],
                       capture_output=True, text=True, timeout=60)
    assert "vtop.core.phases" in r.stdout
