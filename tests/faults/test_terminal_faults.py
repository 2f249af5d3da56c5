"""Fault matrix, terminals (issue #25 item 9 and the matrix's terminal rows): small sizes, a resize,
NO_COLOR, and the log pane hidden under CPU load leaving no stale rows.

Real terminals are tmux panes (what ``tmux capture-pane`` returns is what a user sees). Nothing is
timed: waits are for what the screen shows, with a hang guard that never decides a healthy run.
TERM=dumb is tests/faults/test_bad_input.py's; SIGHUP (the terminal closed) is
tests/unit/test_headless.py's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from vtop.config import Config
from vtop.ui.app import VtopApp
from vtop.ui.widgets.log_pane import LogPane

GUARD_S = 90.0  # hang guard only
LOG = FIXTURES / "logs" / "vllm-0.32.0-cpu-startup.log"
needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


class Tmux:
    def __init__(self, cmd: str, x: int, y: int, env: dict[str, str]) -> None:
        self.sess = f"vtop-faults-{os.getpid()}-{x}x{y}-{time.monotonic_ns()}"
        subprocess.run(["tmux", "new", "-d", "-s", self.sess, "-x", str(x), "-y", str(y), cmd], check=True, env=env)

    def capture(self, escapes: bool = False) -> list[str]:
        args = ["tmux", "capture-pane", "-p", "-t", self.sess] + (["-e"] if escapes else [])
        return subprocess.run(args, capture_output=True, text=True).stdout.splitlines()

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.sess, *keys], check=True)

    def resize(self, x: int, y: int) -> None:
        subprocess.run(["tmux", "resize-window", "-t", self.sess, "-x", str(x), "-y", str(y)], check=True)

    def until(self, cond: Callable[[list[str]], bool], what: str) -> list[str]:
        end = time.monotonic() + GUARD_S
        while True:
            rows = self.capture()
            if cond(rows):
                return rows
            if time.monotonic() > end:
                raise AssertionError(f"hang guard: {what}\n" + "\n".join(rows))
            time.sleep(0.05)

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.sess], capture_output=True)


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "XDG_CONFIG_HOME": "/nonexistent", "TERM": "xterm-256color", **extra}


def _masked(rows: list[str]) -> list[str]:
    """The screen with its ticking numbers (ages, the clock) masked."""
    return [re.sub(r"\d+", "#", r).rstrip() for r in rows]


def _settled(t: Tmux) -> list[str]:
    """The screen once two captures in a row agree (numbers masked): the paint is done."""
    prev: list[str] | None = None

    def same(rows: list[str]) -> bool:
        nonlocal prev
        ok = prev is not None and _masked(rows) == _masked(prev)
        prev = rows
        return ok

    return t.until(same, "the screen settling")


def _log_rows(rows: list[str]) -> list[str]:
    return [r for r in rows if "(APIServer pid=" in r or "[api_server.py" in r]


@pytest.fixture
def cpu_load() -> Iterator[None]:
    """Two busy loops (the dev box has 2 cores): vtop paints on a starved CPU."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def check_frame(rows: list[str], *, log_shown: bool) -> None:
    """What a user would see as wrong: a log row with the pane hidden, a box not whole (every row
    between a rounded box's corners begins and ends with its border), a box too many or too few
    (the startup panel's, and the log pane's when shown), or anything drawn below the last box."""
    screen = "\n".join(rows)
    assert bool(_log_rows(rows)) == log_shown, screen
    tops = [i for i, r in enumerate(rows) if r.startswith("╭")]
    bottoms = [i for i, r in enumerate(rows) if r.startswith("╰")]
    assert len(tops) == len(bottoms) == (2 if log_shown else 1), screen
    for top, bottom in zip(tops, bottoms):
        width = len(rows[top])
        assert rows[top].endswith("╮") and rows[bottom].endswith("╯") and len(rows[bottom]) == width, screen
        for r in rows[top + 1:bottom]:
            assert r.startswith("│") and r.endswith("│") and len(r) == width, screen
    keys_bar = max(i for i, r in enumerate(rows) if " Quit" in r)
    assert all(not r.strip() for r in rows[bottoms[-1] + 1:keys_bar]), screen


@pytest.mark.slow
@needs_tmux
def test_hiding_the_log_pane_under_cpu_load_leaves_no_stale_rows(cpu_load: None) -> None:
    # Issue #25 item 9: under load, `l` left old rows and borders over the DOWN card until a
    # resize (3 runs in 6). After each toggle, once the screen has settled, the frame is whole.
    t = Tmux(f"exec {sys.executable} -m vtop --no-gpu http://127.0.0.1:9 --log {LOG}", 80, 24, _env())
    try:
        t.until(lambda rows: any("DOWN" in r for r in rows) and bool(_log_rows(rows)), "the DOWN card and the log")
        shown = True
        check_frame(_settled(t), log_shown=shown)
        for _ in range(6):
            t.keys("l")
            shown = not shown
            t.until(lambda rows, s=shown: bool(_log_rows(rows)) == s, "the key's effect")  # type: ignore[misc]
            check_frame(_settled(t), log_shown=shown)
    finally:
        t.close()


@needs_tmux
def test_no_color_gives_grey_only_and_keys_answer() -> None:
    t = Tmux(f"exec {sys.executable} -m vtop --no-gpu http://127.0.0.1:9", 80, 24, _env(NO_COLOR="1"))
    try:
        t.until(lambda rows: any("DOWN" in r for r in rows), "the DOWN card")
        esc = "\n".join(t.capture(escapes=True))
        assert "38;2;" not in esc and "48;2;" not in esc  # no 24-bit colour
        # (256-colour greys remain, as Textual's NO_COLOR filter makes them; one navy, 17, too:
        # the README's reliability table says so)
        t.keys("r")  # the requests screen opens: the UI answers a key
        t.until(lambda rows: any("Requests in flight" in r for r in rows), "the requests screen")
    finally:
        t.close()


@pytest.mark.parametrize("size", [(40, 12), (60, 20), (80, 24)])
async def test_small_terminals_and_a_resize_draw_and_answer_keys(size: tuple[int, int], tmp_path: Path) -> None:
    from vtop.clock import FakeClock
    from vtop.monitor.logwatch import LogWatch
    from vtop.sources.logtail import LogTailer

    watch = LogWatch(LogTailer(LOG), clock=FakeClock())
    app = VtopApp(Config(urls=("http://127.0.0.1:9",), no_gpu=True), autopoll=False, hostname="t", log_watch=watch)
    async with app.run_test(size=size) as pilot:
        await app.poll_log_once()
        await pilot.pause()
        text = app.export_screenshot()
        assert "vtop" in text
        pane = app.query_one(LogPane)
        shown = pane.display
        await pilot.press("l")
        await pilot.pause()
        assert pane.display != shown
        await pilot.resize_terminal(size[0] + 20, size[1] + 6)
        await pilot.pause()
        await pilot.resize_terminal(*size)
        await pilot.pause()
        await pilot.press("l")
        await pilot.pause()
        assert pane.display == shown
        assert app.is_running


# --- the status line at 120 and 80 columns (issue #38 item 9) --------------------------------------

@pytest.mark.parametrize("width", [120, 80])
async def test_the_status_line_drops_driver_and_model_before_any_servers_state(width: int) -> None:
    """The servers' state was cut (``... │ 1 × NVIDIA H200 · driver 580.159.04 │ vLLM:`` at 120 columns,
    ``│ 1 ×`` at 80): the driver version goes first, then the model name, never the servers' state."""
    from tests.helpers.badserver import BadServer
    from tests.helpers.screen_text import screen_lines
    from vtop.model.gpu import OK, GpuPoll, GpuSample

    with BadServer("ok") as a, BadServer("ok") as b, BadServer("refused") as c:
        app = VtopApp(Config(urls=(a.url, b.url, c.url), no_gpu=True, interval=0.5, readonly=True),
                      hostname="gpu-node-017.prod.example")
        async with app.run_test(size=(width, 30)) as pilot:
            for _ in range(600):  # hang guard only: three servers' first polls are events
                views = app.monitor.views()
                if len(views) == 3 and sum(v.state == "up" for v in views.values()) == 2:
                    break
                await pilot.pause(0.05)
            app.apply_gpu(GpuPoll(t=0.0, mono=app.monitor.clock.monotonic(), status=OK, driver="580.159.04",
                                  gpus=(GpuSample(0, "NVIDIA H200", mem_total=2**37),)))
            await pilot.pause()
            line = screen_lines(app)[0].rstrip()
    want = "vLLM: 2 up, 1 down" if "2 up, 1 down" in line else "vLLM: 1 down, 2 up"
    assert want in line, line  # every server's state is on screen
    assert line.endswith("READ-ONLY") and len(line) <= width, line
    if width == 120:  # room for the model, not for the driver
        assert "1 × NVIDIA H200" in line and "driver" not in line, line
    else:
        assert "1 GPU" in line and "H200" not in line and "driver" not in line, line


async def test_a_replay_at_80_columns_keeps_the_servers_state() -> None:
    from tests.helpers.screen_text import screen_lines
    from vtop.faces.demo import demo_path
    from vtop.ui.replay import replay_app

    app = replay_app(str(demo_path()), config=Config(), name="demo", demo=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("3")  # the runaway chapter, paused with its note
        await pilot.pause()
        line = screen_lines(app)[0].rstrip()
    assert line.endswith("│ vLLM: up") and "runaway 3/4" in line, line
