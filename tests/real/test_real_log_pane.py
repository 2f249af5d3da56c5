"""The live log pane in a real terminal (tmux, 120x40) against the real vLLM CPU server under a
little load (issue #26 item 3's proof): the pane carries vLLM's own lines, its stats line whole
(``Avg prompt throughput ... Running: N reqs, Waiting: N reqs, ... KV cache usage``), and none of
vtop's own polls, although vLLM's uvicorn writes an access line for every one of them (``GET
/metrics`` or ``GET /metrics/?name[]=...`` every second at vtop's 1 s interval, ``/health`` and
``/v1/models`` beside it at first; vLLM 0.32's ``--disable-access-log-for-endpoints`` keeps them
out of the server's own log).

``VTOP_SCREENSHOTS=DIR`` keeps the capture (``log-pane-cpu-real-tmux.txt``, and ``.ansi`` with
its colours, which ``python -m tools.make_screenshots`` turns into an SVG in screenshots/live-runs/).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.real import capture, log_box

pytestmark = pytest.mark.real

SHOTS = os.environ.get("VTOP_SCREENSHOTS")
#: uvicorn's access line for a monitoring endpoint, as vLLM 0.32 writes it for vtop's polls
POLL_LINE = re.compile(r'"GET /(?:metrics|health|v1/models|version)\S* HTTP/1\.1"')
RUNNING = re.compile(r"Running: (\d+) reqs, Waiting: (\d+) reqs")


def pane_text(rows: list[str]) -> str:
    """The log pane's rows, borders off, a wrapped stats line joined back into one."""
    box = log_box(rows)
    assert box is not None, "\n".join(rows)
    top, bottom = box
    inner = [r[1:-1].rstrip() for r in rows[top + 1 : bottom]]
    out: list[str] = []
    for r in inner:
        if r.startswith("  ") and out:  # a continuation row of a wrapped stats line
            out[-1] += " " + r.strip()
        else:
            out.append(r)
    return "\n".join(out)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_the_log_pane_shows_vllms_stats_lines_and_not_vtops_polls(real_vllm: Any, tmp_path: Path) -> None:
    srv = real_vllm
    sess = f"vtop-real-logpane-{os.getpid()}"
    env = {**os.environ, "XDG_CONFIG_HOME": "/nonexistent", "TERM": "xterm-256color"}
    log_before = len(srv.log_text().splitlines())
    cmd = f"exec {sys.executable} -m vtop --no-gpu {srv.url} --log {srv.log_path}"
    subprocess.run(["tmux", "new", "-d", "-s", sess, "-x", "120", "-y", "40", cmd], check=True, env=env)
    best: list[str] | None = None
    best_ansi = ""
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(" UP " in r for r in capture(sess)[:6]):
            time.sleep(0.5)
        # A little load: one request at a time, long enough that a stats line (every 10 s) falls in it.
        fut = srv.start_load(n=40, concurrency=1, max_tokens=300, time_limit_s=45)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            rows = capture(sess)
            pane = pane_text(rows)
            m = [int(r) for r, _ in RUNNING.findall(pane)]
            if m and "Avg prompt throughput" in pane:
                best = rows
                best_ansi = subprocess.run(["tmux", "capture-pane", "-p", "-e", "-t", sess], capture_output=True,
                                           text=True).stdout
                if max(m) >= 1:  # a stats line written while the load ran
                    break
            time.sleep(0.25)
        res = fut.result(timeout=120)
    finally:
        final = capture(sess) if best is None else best
        subprocess.run(["tmux", "kill-session", "-t", sess], capture_output=True)
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        (Path(SHOTS) / "log-pane-cpu-real-tmux.txt").write_text("\n".join(final) + "\n")
        if best_ansi:  # the same moment with its colours (for the SVG)
            (Path(SHOTS) / "log-pane-cpu-real-tmux.ansi").write_text(best_ansi)
    assert res.ok >= 1, res
    assert best is not None, "no stats line with its queues ever showed in the pane:\n" + "\n".join(final)
    pane = pane_text(best)
    stats = [ln for ln in pane.splitlines() if "Avg prompt throughput" in ln]
    # vLLM's own stats line, whole: the queues and the KV usage, not cut at the pane's edge
    assert any(RUNNING.search(ln) and "KV cache usage" in ln for ln in stats), pane
    assert "(APIServer pid=" in pane
    # vtop's polls: vLLM logged them, the pane shows none
    new_log = srv.log_text().splitlines()[log_before:]
    polls = [ln for ln in new_log if POLL_LINE.search(ln)]
    assert len(polls) >= 5, f"vLLM logged {len(polls)} access lines of vtop's polls"
    assert not POLL_LINE.search(pane), pane
