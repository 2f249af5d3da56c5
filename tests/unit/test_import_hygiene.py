"""The collectors, the pure core and the actions must work without Textual."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
            "vtop.core.requests.log", "vtop.sources.recording.record", "vtop.monitor.logwatch", "vtop.actions.snapshot",
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


#: What ``vtop --once`` without a log never imports (issue 43: the one-shot at or under nvitop's): the screen's
#: libraries and the exporter's, and the log's own modules: its request parser and phase patterns (some hundred
#: regular expressions), the tracker and the snapshot's types (dataclasses), the stats history, the memory
#: budget, the redaction patterns (only for a URL with credentials, a refused URL, a shown command line).
ONE_SHOT_NEVER = ("textual", "rich", "plotext", "textual_plotext", "prometheus_client", "httpx", "psutil", "vtop.ui")
ONE_SHOT_LOG_ONLY = ("vtop.monitor.logwatch", "vtop.core.phases.patterns", "vtop.core.phases.tracker",
                     "vtop.core.phases.types", "vtop.core.requests.log", "vtop.core.requests.sglang_log",
                     "vtop.core.loghistory", "vtop.core.membudget", "vtop.model.logtext", "vtop.model.redact")


def _one_shot_modules(*extra: str) -> tuple[set[str], str]:
    """The modules a whole ``vtop --once --json`` run (a new interpreter: the CLI, one round, the report)
    imported: one simulated GPU, the process scan, a port that refuses, the rules."""
    code = ("import json, sys\nfrom vtop.cli import main\n"
            f"rc = main(['--once', '--json', '--simulate-gpus', '1', '--interval', '30', 'http://127.0.0.1:9', *{extra!r}])\n"
            "print('MODULES', json.dumps(sorted(sys.modules)), rc)\n")
    env = {**os.environ, "HOME": "/nonexistent", "XDG_CONFIG_HOME": "/nonexistent"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("MODULES "), r.stdout[-2000:]
    mods, rc = last.removeprefix("MODULES ").rsplit(" ", 1)
    return set(json.loads(mods)), rc


def _loaded(mods: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if n in mods or any(m.startswith(n + ".") for m in mods))


def test_a_one_shot_without_a_log_imports_neither_the_screen_nor_the_log_modules() -> None:
    mods, rc = _one_shot_modules()
    assert rc == "2"  # the port refuses: down, critical (docs/exit-codes.md); the run went to its end
    assert {"vtop.faces.headless", "vtop.core.rules.diagnoser", "vtop.sources.vllm"} <= mods  # it ran
    assert _loaded(mods, ONE_SHOT_NEVER) == []
    assert _loaded(mods, ONE_SHOT_LOG_ONLY) == []


def test_a_one_shot_with_a_log_imports_the_log_modules() -> None:
    # The other side of the check above (it can fail): given a log, the one round reads it with them.
    log = Path(__file__).parents[1] / "fixtures" / "logs" / "vllm-0.26.0-h200-startup.log"
    mods, _rc = _one_shot_modules("--log", str(log))
    assert _loaded(mods, ONE_SHOT_NEVER) == []
    assert {"vtop.monitor.logwatch", "vtop.core.phases.patterns", "vtop.core.phases.tracker", "vtop.core.phases.types",
            "vtop.core.requests.log", "vtop.core.loghistory"} <= mods
