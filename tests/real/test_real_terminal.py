"""vtop in a real terminal (tmux, 120x40) watching the real vLLM CPU server: the log pane
toggled several times leaves nothing of itself or of the cards behind.

Each capture is checked as a user would look at it: the box drawing is whole (every
line of a bordered box begins and ends with its border, the frame's corners line up),
no eighth-block glyph (a sparkline's, or a scrollbar thumb's) sits inside the log pane,
and with the pane hidden no row below the cards still shows a piece of it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

from tests.helpers.real import capture, log_box

pytestmark = pytest.mark.real

BLOCKS = set("▁▂▃▄▅▆▇█")


def check_frame(rows: list[str], *, log_shown: bool) -> None:
    box = log_box(rows)
    if log_shown:
        assert box is not None, "\n".join(rows)
        top, bottom = box
        width = len(rows[top])
        assert rows[top].endswith("╮") and rows[bottom].endswith("╯") and len(rows[bottom]) == width
        for r in rows[top + 1 : bottom]:
            assert r.startswith("│") and r.endswith("│") and len(r) == width, r
            assert not BLOCKS & set(r), f"a chart glyph inside the log pane: {r!r}"
    else:
        # No log text anywhere: every vLLM log line the pane shows carries one of these.
        assert not any(("INFO" in r and "│INFO" in r) or "(APIServer pid=" in r for r in rows), "\n".join(rows)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_the_log_pane_toggled_leaves_no_stray_cells(real_vllm: Any) -> None:
    srv = real_vllm
    sess = f"vtop-real-term-{os.getpid()}"
    env = {**os.environ, "XDG_CONFIG_HOME": "/nonexistent", "TERM": "xterm-256color"}
    cmd = f"exec {sys.executable} -m vtop --no-gpu {srv.url} --log {srv.log_path}"
    subprocess.run(["tmux", "new", "-d", "-s", sess, "-x", "120", "-y", "40", cmd], check=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("UP" in r for r in capture(sess)[:5]):
            time.sleep(0.5)
        # some traffic, so the log pane fills and scrolls
        with httpx.Client(timeout=30) as c:
            for _ in range(12):
                c.post(f"{srv.url}/v1/completions", json={"model": srv.model or str(srv.model_dir), "prompt": "hello", "max_tokens": 16})
        time.sleep(2.5)
        shown = True
        check_frame(capture(sess), log_shown=shown)
        for _ in range(6):
            subprocess.run(["tmux", "send-keys", "-t", sess, "l"], check=True)
            shown = not shown
            time.sleep(1.5)  # past a paint tick: the cards have been redrawn since
            check_frame(capture(sess), log_shown=shown)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", sess], capture_output=True)
