"""The key hints: in the first frame, clickable, dimmed when read-only, hidden in a replay."""

from __future__ import annotations

from vtop.config import Config
from vtop.ui.app import VtopApp
from vtop.ui.widgets.keys_bar import KeysBar


def bar_text(app: VtopApp) -> str:
    return str(app.query_one(KeysBar).render())


async def test_keys_are_in_the_first_frame_and_a_click_presses_the_key() -> None:
    app = VtopApp(Config(no_gpu=True, log="/dev/null"), autopoll=False, hostname="t")
    async with app.run_test(size=(160, 24)) as pilot:
        text = bar_text(app)
        assert text.startswith("? Help q Quit e Alerts space Freeze + Faster - Slower c Cards p Phases l Log")
        assert "s Snap" in text and "d py-spy" in text and "t Test" in text
        log = app.w_log
        shown = log.display
        col = text.index("l Log")
        await pilot.click(KeysBar, offset=(1 + col, 0))  # padding 1, then the text
        await pilot.pause()
        assert log.display is not shown


async def test_read_only_dims_the_action_keys_and_they_do_nothing() -> None:
    app = VtopApp(Config(no_gpu=True, readonly=True), autopoll=False, hostname="t")
    async with app.run_test(size=(100, 24)) as pilot:
        bar = app.query_one(KeysBar)
        keys = {k: enabled for k, _d, _n, enabled in bar.keys()}
        assert keys["s"] is False and keys["d"] is False and keys["t"] is False
        assert keys["q"] is True and keys["l"] is True
        await pilot.press("s")
        await pilot.pause()
        assert app.last_snapshot is None
