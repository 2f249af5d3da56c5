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

from tests.conftest import fake_gpus, make_app
from vtop.clock import FakeClock
from vtop.config import Config
from vtop.demo import demo_path
from vtop.ui.replay import replay_app
from vtop.ui.widgets.frame_memo import FrameMemo, MemoScreen, MemoStatic
from vtop.ui.widgets.gpu_panel import GpuCard, GpuLines, GpuPanel, _RunsWidget


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
        assert framed(app) > 0  # and changed rows were framed by vtop between the checks


def framed(app) -> int:  # type: ignore[no-untyped-def]
    return sum(w.rows_framed for w in app.screen.walk_children() if isinstance(w, _RunsWidget))


@pytest.mark.parametrize("gpus", [8, 2])
async def test_rows_framed_by_vtop_are_the_rows_textual_draws(gpus: int, clock: FakeClock) -> None:
    """A poll, a frame, a comparison: 8 GPUs are lines (no border, no padding), 2 are cards (a
    round border and padding). Changed rows are framed by vtop (counted), and every screen is
    the one Textual draws from scratch; a stale panel (60 % opacity) is framed by Textual only,
    and so are the frames after it, once the tint is gone."""
    src, _ = fake_gpus(gpus, clock)
    app = make_app(src)
    async with app.run_test(size=(120, 40)) as pilot:
        kind = GpuLines if gpus == 8 else GpuCard
        for _ in range(3):
            await app.poll_gpu_once()
            clock.advance(1.0)
            await pilot.pause()
        app.screen._compositor.render_strips()  # every row drawn once by Textual
        assert app.query_one(GpuPanel).compact == (gpus == 8)
        widgets = [w for w in app.query(kind) if w.display]  # the layout this case is about
        assert widgets
        seen = []
        for step in range(16):
            stale = 5 <= step < 8  # the panel fades: Textual redraws the faded widgets whole
            if app.w_gpu.has_class("-stale") != stale:
                app.w_gpu.set_class(stale, "-stale")
                await pilot.pause()
            tinted = 10 <= step < 13  # a tint recolours the content: rows drawn before it stay
            for w in widgets:
                w.styles.tint = "red 30%" if tinted else None
            await pilot.pause()
            before = framed(app)
            await app.poll_gpu_once()
            clock.advance(1.0)
            await pilot.pause()
            drawn = rows(app.screen._compositor.render_strips())
            seen.append(framed(app) - before)
            assert drawn == fresh_screen(app), f"step {step}: a framed row differs from Textual's"
            app.screen._compositor.render_strips()  # the caches fresh_screen dropped, filled again
        # Fresh GPU readings change rows every poll: framed here, but while faded or tinted.
        assert all(n > 0 for i, n in enumerate(seen) if not (5 <= i < 8 or 10 <= i < 13)), seen
        assert seen[5:8] == [0, 0, 0] and seen[10:13] == [0, 0, 0], seen


async def test_switched_off_every_row_goes_through_textual(clock: FakeClock) -> None:
    src, _ = fake_gpus(8, clock)
    app = make_app(src)
    async with app.run_test(size=(120, 40)) as pilot:
        _RunsWidget.FRAME_CHANGED_ROWS = False
        try:
            for _ in range(5):
                await app.poll_gpu_once()
                clock.advance(1.0)
                await pilot.pause()
                app.screen._compositor.render_strips()
            assert framed(app) == 0
        finally:
            _RunsWidget.FRAME_CHANGED_ROWS = True
