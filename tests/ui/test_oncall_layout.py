"""The incident fits the screen (issue 26, item 1): `vtop demo` at its runaway, at 80x24, 120x40,
60x20 and 40x12, checked on what the screen shows (its text, read back from the screenshot),
not on pixels.

Rules: while a warning is on, the alert's first fix shows whole and the log pane gives up its
rows; the vLLM card keeps its running/waiting rows at 80x24; cards fold to one line before
they go (40x12); the footer shows every key at 60x20 (labels dropped, keys kept); `e` opens
every line of every alert, full height and scrollable.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from tests.helpers.demo_h200 import EV, seek_wall
from tests.helpers.screen_text import screen_lines
from vtop.config import Config
from vtop.faces.demo import demo_path
from vtop.ui.replay import replay_app
from vtop.ui.widgets.keys_bar import KeysBar

FIX = ("Set max_tokens (or max_completion_tokens) in every client request; chat requests without it may "
       "run to max_model_len (131,072).")
SERVER_FIX = "--override-generation-config '{\"max_new_tokens\": 4096}'"


@asynccontextmanager
async def runaway_at(size: tuple[int, int], keys: tuple[str, ...] = ()) -> AsyncIterator[tuple[list[str], Any, Any]]:
    """(the screen's rows, the app, the pilot) at the demo's runaway, after pressing ``keys``."""
    app = replay_app(str(demo_path()), config=Config(), name="demo")
    async with app.run_test(size=size) as pilot:
        app.replay.paused = True
        await pilot.pause()
        seek_wall(app, EV["runaway_begin"] + 150)
        await pilot.pause()
        for k in keys:
            await pilot.press(k)
            await pilot.pause()
        await pilot.pause()
        yield screen_lines(app), app, pilot


def box_text(lines: list[str], title: str) -> str:
    """The text inside the box whose top border holds ``title``, its rows joined."""
    top = next(i for i, ln in enumerate(lines) if title in ln and ln.lstrip()[:1] in "╭┏")
    body = []
    for ln in lines[top + 1:]:
        if ln.lstrip()[:1] in "╰┗":
            break
        body.append(ln.strip().strip("│┃").strip())
    return re.sub(r"\s+", " ", " ".join(body))


def row_of(lines: list[str], pattern: str) -> str | None:
    return next((ln for ln in lines if re.search(pattern, ln)), None)


async def test_80x24_the_fix_is_whole_the_queues_show_and_the_log_yields() -> None:
    async with runaway_at((80, 24)) as (lines, app, _):
        assert app.w_log.display is False
    assert len(lines) <= 24
    alerts = box_text(lines, "alerts")
    assert "WARNING Runaway decode" in alerts and FIX in alerts
    assert row_of(lines, r"^[│┃] running +1 ") and row_of(lines, r"^[│┃] waiting +0 ")
    assert not any("(APIServer pid=" in ln for ln in lines)  # the log pane gave its rows up
    assert row_of(lines, r"^0 H200 +util")  # the GPU card folded to one line, not gone


async def test_120x40_room_for_every_card_and_the_log_gets_the_rest() -> None:
    async with runaway_at((120, 40)) as (lines, app, _):
        assert app.w_log.display is True
    assert FIX in box_text(lines, "alerts")
    assert row_of(lines, r"GPU 0 · H200") and row_of(lines, r"^[│┃] util ")  # the full GPU card
    assert row_of(lines, r"^[│┃] TTFT ") and row_of(lines, r"finished in the last")  # the full vLLM card
    log_rows = [ln for ln in lines if "(APIServer pid=" in ln]
    assert log_rows, "the log pane takes what is left"
    # no empty row between the panels and the log: every row above the footer holds something
    assert all(ln.strip() for ln in lines[:-1])


async def test_60x20_every_key_in_the_footer_and_the_fix_whole() -> None:
    async with runaway_at((60, 20)) as (lines, app, _):
        keys = [k for k, _d, _n, _on in app.query_one(KeysBar).keys()]
    footer = lines[-1].split()
    assert keys and all(k in footer for k in keys), (keys, footer)
    assert footer[-1] == keys[-1]
    assert FIX in box_text(lines, "alerts")
    assert row_of(lines, r"^[│┃] running ") and row_of(lines, r"^[│┃] waiting ")


async def test_40x12_cards_fold_to_one_line_each() -> None:
    async with runaway_at((40, 12)) as (lines, _app, _):
        pass
    assert "WARNING Runaway decode" in box_text(lines, "alerts")
    assert row_of(lines, r"^ ?vLLM :8000 UP · running 1 · waiting 0")
    assert row_of(lines, r"^0 H200 ")
    footer = lines[-1].split()
    assert "?" in footer and "q" in footer


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_e_shows_every_alert_whole_full_height(size: tuple[int, int]) -> None:
    from vtop.ui.screens import AlertsScreen

    async with runaway_at(size, ("e",)) as (lines, app, pilot):
        assert isinstance(app.screen, AlertsScreen)
        assert len(lines) == size[1] and lines[0].startswith("╭") and lines[-1].startswith("╰")  # the whole screen
        first = box_text(lines, "")
        await pilot.press("pagedown", "pagedown", "pagedown")
        await pilot.pause()
        last = box_text(screen_lines(app), "")
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, AlertsScreen)
    assert "WARNING Runaway decode" in first and FIX in first
    # every evidence line and the second fix (the server-side cap), whole, at the end of the scroll
    assert SERVER_FIX in last and "Risky launch flags" in last
    assert "KV cache" in first + last


async def test_cards_as_wide_as_the_boxes_and_no_scrollbar_glyphs() -> None:
    """Item 8: the GPU and vLLM cards ended a column short of the alert and log boxes, with
    the body's scrollbar thumb drawn outside their border; the log's last row held a stray
    eighth-block (its horizontal scrollbar)."""
    async with runaway_at((120, 40)) as (lines, _app, _):
        pass
    right = {ln.rstrip()[-1] for ln in lines[1:-1] if ln.strip()[:1] in "│┃╭╰┏┗"}
    assert right <= set("│┃╮╯┓┛"), right  # every box ends on the last column, nothing after it
    assert all(len(ln) == 120 for ln in lines[1:-2] if ln.strip()[:1] in "│┃╭╰┏┗")
    bottom = max(i for i, ln in enumerate(lines) if ln.startswith("╰"))
    last = lines[bottom - 1]
    # the log's last row is a log line (or the end of vLLM's stats line, which the pane wraps)
    assert "(APIServer pid=" in last or (last.startswith("│  ") and "cache hit rate" in last), last
    assert not re.search(r"[▏▎▍▌▋▊▉]", lines[bottom - 1])


async def test_200x60_no_empty_rows_between_the_startup_panel_and_the_log() -> None:
    app = replay_app(str(demo_path()), config=Config(), name="demo")
    async with app.run_test(size=(200, 60)) as pilot:
        app.replay.paused = True
        await pilot.pause()
        seek_wall(app, EV["health_ready"] + 20)
        await pilot.pause()
        lines = screen_lines(app)
    start = next(i for i, ln in enumerate(lines) if "vLLM start v0.26.0" in ln)
    end_of_startup = next(i for i in range(start, len(lines)) if lines[i].startswith("╰"))
    assert lines[end_of_startup + 1].startswith("╭")  # the log pane's top border, straight after
    assert "(APIServer pid=" in lines[end_of_startup + 2]
    assert all(ln.strip() for ln in lines)


async def test_a_resize_plans_again_for_the_new_size() -> None:
    async with runaway_at((40, 12)) as (small, app, pilot):
        await pilot.resize_terminal(120, 40)
        await pilot.pause()
        await pilot.pause()
        big = screen_lines(app)
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        await pilot.pause()
        mid = screen_lines(app)
    assert row_of(small, r"^ ?vLLM :8000 UP · running 1")
    assert FIX in box_text(big, "alerts") and row_of(big, r"^[│┃] TTFT ") and row_of(big, r"GPU 0 · H200")
    assert FIX in box_text(mid, "alerts") and row_of(mid, r"^[│┃] waiting +0 ")
    assert all(len(ln) <= 80 for ln in mid)
