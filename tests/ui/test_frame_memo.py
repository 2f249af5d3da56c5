"""FrameMemo: a clean widget's last lines are handed back, and never once they are stale.

The memo reads two attributes of Textual's StylesCache; the first test fails if a
Textual upgrade renames them or changes what they mean. The others play the real
H200 demo recording through the app and check, frame after frame, that the screen
drawn with the memo is the screen Textual draws from scratch.
"""

from __future__ import annotations

import pytest
from textual._styles_cache import StylesCache
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

from vtop.config import Config
from vtop.demo import demo_path
from vtop.ui.replay import replay_app
from vtop.ui.widgets.frame_memo import FrameMemo, MemoScreen, MemoStatic


def test_textual_keeps_what_the_memo_reads() -> None:
    cache = StylesCache()
    assert cache._dirty_lines == set() and cache._cache == {}
    cache.set_dirty(Region(0, 2, 10, 3))
    assert cache._dirty_lines == {2, 3, 4}
    cache.clear()
    assert cache._dirty_lines == set() and cache._cache == {}


def rows(strips: list[Strip]) -> list[tuple[tuple[str, object], ...]]:
    """Text and style of every segment: what the terminal would be sent."""
    return [tuple((seg.text, seg.style) for seg in s) for s in strips]


def fresh_screen(app) -> list[tuple[tuple[str, object], ...]]:  # type: ignore[no-untyped-def]
    """The screen rendered by Textual alone: every widget's cache dropped, the memo bypassed."""
    widgets = [w for w in app.screen.walk_children(with_self=True) if isinstance(w, Widget)]
    saved = FrameMemo.render_lines
    FrameMemo.render_lines = lambda self, crop: Widget.render_lines(self, crop)  # type: ignore[method-assign]
    try:
        for w in widgets:
            w._styles_cache.clear()
        return rows(app.screen._compositor.render_strips())
    finally:
        FrameMemo.render_lines = saved  # type: ignore[method-assign]
        for w in widgets:
            w._styles_cache.clear()  # the memo's check sees a new first line: no memo outlives this


async def test_a_clean_widget_hands_back_its_last_lines_until_it_changes() -> None:
    app = replay_app(str(demo_path()), config=Config(), name="demo")
    async with app.run_test(size=(100, 30)) as pilot:
        app.replay.paused = True
        await pilot.pause()
        status = app.query_one("#status", MemoStatic)
        crop = Region(0, 0, status.size.width, status.size.height)
        first = status.render_lines(crop)
        assert status.render_lines(crop) is first  # nothing changed: Textual's path is skipped
        status.update("frame memo test line")
        await pilot.pause()
        after = status.render_lines(crop)
        assert after is not first
        assert "frame memo test line" in "".join(s.text for s in after)
        assert status.render_lines(Region(0, 0, 10, 1)) is not after  # another crop: rendered


@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
async def test_frames_drawn_with_the_memo_equal_textuals_own(size: tuple[int, int]) -> None:
    """Play the demo (startup, burst, runaway) with a stale tint, layout keys, a screen over the
    dashboard and a theme switch on the way; compare every few frames."""
    app = replay_app(str(demo_path()), config=Config(), name="demo")
    async with app.run_test(size=size) as pilot:
        app.replay.paused = True
        await pilot.pause()
        d = app.replay
        end = d.duration
        checked = hits = step = 0
        t = 0.0
        while t < end:
            # Several real frames (partial updates, through the memo) between two checks:
            # a check drops every cache, so only frames after it can go stale.
            d.seek(t)
            await pilot.pause()
            step += 1
            t += 6.0
            if step % 6:
                continue
            if checked == 2:  # a hung GPU poll tints the GPU panel; then it answers again
                app.w_gpu.set_class(not app.w_gpu.has_class("-stale"), "-stale")
                await pilot.pause()
            if checked == 4:  # keys that change the layout: cards/lines, phases, the log pane
                for key in ("c", "p", "l"):
                    await pilot.press(key)
                    await pilot.pause()
            if checked == 5:  # the requests screen over the dashboard, and back
                await pilot.press("r")
                await pilot.pause()
                await pilot.press("escape")
                await pilot.pause()
                assert isinstance(app.screen, MemoScreen)
            if checked == 6:
                app.theme = "textual-light" if app.theme != "textual-light" else "textual-dark"
                await pilot.pause()
            memo_before = {w: w._frame_memo for w in app.screen.walk_children(with_self=True)
                           if isinstance(w, FrameMemo)}
            drawn = rows(app.screen._compositor.render_strips())
            hits += sum(1 for w, m in memo_before.items() if m is not None and w._frame_memo is m)
            assert drawn == fresh_screen(app), f"stale lines at t={t:.0f}s of the demo"
            checked += 1
        assert checked >= 8
        assert hits > 0  # the memo was used, not merely harmless
