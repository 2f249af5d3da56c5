"""The collectors, the pure core and the actions must work without Textual."""

from __future__ import annotations

import json
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
DEFERRED = ("prometheus_client", "h11", "httpx", "psutil", "vtop.core.phases.tracker", "vtop.core.phases.patterns",
            "vtop.core.rules",
            "vtop.core.requests", "vtop.sources.recording.record", "vtop.monitor.logwatch", "vtop.actions.snapshot",
            # the scraper, the parser and the process scanner (~16 ms): first polled after the first frame
            "vtop.sources.vllm", "vtop.sources.metrics_text", "vtop.sources.discovery",
            # NVML's binding and the simulated GPUs: loaded by the GPU thread's first poll
            "pynvml", "vtop.sources.fake_nvml")


def test_the_first_frame_waits_for_no_deferred_import() -> None:
    code = ("import sys, vtop.cli, vtop.ui.app\n"
            f"print(','.join(m for m in {DEFERRED!r} if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", f"imported at start-up: {r.stdout.strip()}"
    # ...and the same check sees them once they are used
    r = subprocess.run([sys.executable, "-c", code.replace("vtop.ui.app", "vtop.ui.app, vtop.monitor.logwatch")],
                       capture_output=True, text=True, timeout=60)
    assert "vtop.core.phases.tracker" in r.stdout and "vtop.core.phases.patterns" in r.stdout


def test_server_cards_are_drawn_before_the_scraper_is_imported_and_polling_imports_it() -> None:
    code = """
import asyncio, json, sys
from vtop.config import Config
from vtop.ui.app import VtopApp
MODS = ("vtop.sources.vllm", "vtop.sources.metrics_text", "vtop.sources.discovery", "pynvml")
async def main():
    app = VtopApp(Config(urls=("http://127.0.0.1:9",), simulate_gpus=2), autopoll=False, hostname="t")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()  # the cards of the command line's URLs, as in the first frame
        url = next(iter(app.cards))
        before = [m for m in MODS if m in sys.modules]
        made_before = bool(app.feed.scrapers)
        await app.poll_server_once(url)
        after = [m for m in MODS if m in sys.modules]
        print(json.dumps({"before": before, "made_before": made_before, "after": after,
                          "cards": len(app.cards), "state": app.monitor.servers[url].last_view.state}))
asyncio.run(main())
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["before"] == [] and not got["made_before"] and got["cards"] == 1
    assert "vtop.sources.vllm" in got["after"] and got["state"] == "down"  # port 9 refuses: polled for real


def test_the_toml_parser_is_imported_only_when_there_is_a_config_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    code = ("import sys\nfrom vtop.config import build\n"
            f"cfg = build({{}}, {{'HOME': {str(tmp_path)!r}, 'XDG_CONFIG_HOME': {str(tmp_path)!r}}})\n"
            "print(cfg.interval, 'tomllib' in sys.modules or 'tomli' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1.0", "False"]
    (tmp_path / "vtop").mkdir()
    (tmp_path / "vtop" / "config.toml").write_text("interval = 3\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["3.0", "True"]
