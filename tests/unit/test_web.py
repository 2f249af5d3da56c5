"""``vtop web``'s own parts without a browser: the command each tab runs (read-only unless
``--allow-actions``), bad usage, and the app's read-only keys saying so (Pilot). The browser test is
tests/ui/test_web_browser.py."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest

from vtop.config import Config
from vtop.faces.web import app_command

ENV = {**os.environ, "XDG_CONFIG_HOME": "/nonexistent"}


def test_each_tab_runs_this_vtop_read_only_unless_actions_are_allowed() -> None:
    ro = shlex.split(app_command(["http://h:8000", "--log", "/var/log/v llm.log"], allow_actions=False))
    assert ro[:3] == [sys.executable, "-m", "vtop"]
    # quoted, in order; no tab delivers alerts (each open tab would send every incident again)
    assert ro[3:] == ["http://h:8000", "--log", "/var/log/v llm.log", "--readonly", "--no-alert-delivery"]
    rw = shlex.split(app_command(["http://h:8000"], allow_actions=True))
    assert "--readonly" not in rw and "--no-alert-delivery" in rw


@pytest.mark.parametrize("args, says", [
    (["--once"], "vtop web serves the screen"),
    (["--interval", "nope"], "interval"),
    (["--port", "70000"], "--port: 0 to 65535"),
])
def test_bad_usage_is_one_line_and_exit_3(args: list[str], says: str) -> None:
    r = subprocess.run([sys.executable, "-m", "vtop", "web", *args], capture_output=True, text=True, timeout=60,
                       env=ENV)
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr
    assert says in r.stderr


async def test_read_only_keys_do_nothing_and_say_so() -> None:
    from vtop.ui.app import VtopApp

    app = VtopApp(Config(readonly=True, no_gpu=True, urls=("http://127.0.0.1:9",)), autopoll=False, discover=None,
                  log_watch=None)
    async with app.run_test(size=(120, 40)) as pilot:
        for key, what in (("s", "snapshot"), ("d", "py-spy dump"), ("t", "test request")):
            await pilot.press(key)
            await pilot.pause()
            said = [n.message for n in app._notifications]
            assert any(m.startswith(f"READ-ONLY: {key} ({what}) is off") for m in said), said
        assert app.last_snapshot is None
        assert len(app.screen_stack) == 1  # no py-spy or test-request screen opened
    app = VtopApp(Config(no_gpu=True, urls=("http://127.0.0.1:9",)), autopoll=False, discover=None, log_watch=None)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("l")
        await pilot.pause()
        assert not any("READ-ONLY" in n.message for n in app._notifications)
