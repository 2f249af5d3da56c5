"""The code's own checks, in the fast tier: the layers (import-linter, contracts in
pyproject.toml), mypy and ruff. Each runs the real tool on the tree as it is."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        found = shutil.which(name)
        if found is None:
            pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
        return found
    return str(path)


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_layers_hold() -> None:
    r = run(tool("lint-imports"), "--no-cache")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def test_a_layer_that_imports_upward_is_caught(tmp_path: Path) -> None:
    """The contracts can fail: a copy of the package where a source imports the core breaks them."""
    pkg = tmp_path / "vtop"
    shutil.copytree(ROOT / "vtop", pkg, ignore=shutil.ignore_patterns("__pycache__", "data"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (pkg / "sources" / "urls.py").write_text((pkg / "sources" / "urls.py").read_text()
                                           + "\nfrom vtop.core import server  # noqa\n")
    r = subprocess.run([tool("lint-imports"), "--no-cache"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert r.returncode != 0 and "vtop.sources.urls -> vtop.core.server" in r.stdout, r.stdout[-2000:]


def test_mypy_is_clean() -> None:
    r = run(tool("mypy"))
    assert r.returncode == 0, r.stdout[-4000:]


def test_ruff_is_clean() -> None:
    r = run(tool("ruff"), "check", "vtop", "tests", "bench", "tools")
    assert r.returncode == 0, r.stdout[-4000:]
