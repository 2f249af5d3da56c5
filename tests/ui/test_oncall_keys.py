"""The keys an htop/nvitop/k9s user presses first (issue 26, item 2): ``?``/F1 help, space
freeze, ``+``/``-`` poll interval, ``/`` log filter. Each test checks the key's effect on what
the screen shows."""

from __future__ import annotations

from tests.conftest import FIXTURES, fake_gpus
from tests.helpers.screen_text import screen_text
from vtop.clock import FakeClock
from vtop.config import Config
from vtop.monitor.logwatch import LogWatch
from vtop.sources.logtail import LogTailer
from vtop.ui.app import VtopApp
from vtop.ui.screens import HelpScreen
from vtop.ui.widgets.gpu_panel import GpuCard
from vtop.ui.widgets.keys_bar import KeysBar


def gpu_app(clock: FakeClock, **cfg: object) -> VtopApp:
    src, _fake = fake_gpus(1, clock)
    return VtopApp(Config(**cfg), gpu_source=src, autopoll=False, hostname="t",  # type: ignore[arg-type]
                   log_watch=None, clock=clock)


async def test_question_mark_and_f1_open_help_with_every_key_and_the_rows() -> None:
    app = gpu_app(FakeClock())
    async with app.run_test(size=(100, 50)) as pilot:
        footer_keys = [k for k, _d, _n, _on in app.query_one(KeysBar).keys()]
        for key in ("question_mark", "f1"):
            await pilot.press(key)
            await pilot.pause()
            assert isinstance(app.screen, HelpScreen)
            text = screen_text(app)
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, HelpScreen)
    keys_part = text.split("The screen")[0]
    for k in footer_keys:  # every key of the footer is explained
        assert f"│   {k}" in keys_part or f"/{k}" in keys_part or f"│   {k}/" in keys_part, k
    assert "?/F1" in keys_part and "esc" in keys_part and "freeze" in keys_part
    for row in ("status line", "alerts", "GPU card", "vLLM card", "log"):  # what the rows mean
        assert f"{row}:" in text


async def test_space_freezes_the_screen_while_the_history_fills_and_space_catches_up() -> None:
    clock = FakeClock()
    app = gpu_app(clock)
    async with app.run_test(size=(100, 30)) as pilot:
        await app.poll_gpu_once()
        await pilot.pause()
        card = app.query_one(GpuCard)
        before_now, n_before = app.w_gpu.now, len(app.gpu_history.tracks[0].series["util"])
        await pilot.press("space")
        await pilot.pause()
        assert app.frozen and "FROZEN" in screen_text(app).splitlines()[0]
        for _ in range(5):
            clock.advance(1.0)
            await app.poll_gpu_once()
        await pilot.pause()
        # polling went on: the history has the 5 new samples; the screen did not move
        assert len(app.gpu_history.tracks[0].series["util"]) == n_before + 5
        assert app.w_gpu.now == before_now
        frozen_text = card.render().plain
        await pilot.press("space")
        await pilot.pause()
        assert not app.frozen and "FROZEN" not in screen_text(app).splitlines()[0]
        assert app.w_gpu.now > before_now  # caught up at once, without waiting for a poll
        assert app.w_gpu.now == app.gpu_history.last_poll.mono  # type: ignore[union-attr]
        assert card.render().plain != frozen_text  # the fake GPU's readings move with the clock


async def test_plus_and_minus_change_the_interval_live_within_bounds() -> None:
    app = gpu_app(FakeClock(), history=60.0)
    async with app.run_test(size=(140, 30)) as pilot:
        assert app.config.interval == 1.0
        await pilot.press("plus")
        await pilot.pause()
        assert app.config.interval == 0.5 and app.feed is not None and app.feed.config.interval == 0.5
        assert app.monitor.config.interval == 0.5
        status = screen_text(app).splitlines()[0]
        assert "every 0.5 s" in status and "interval now 0.5 s" in status
        await pilot.press("plus", "plus", "plus")
        await pilot.pause()
        assert app.config.interval == 0.25  # the config's lower bound
        assert "interval stays 0.25 s" in screen_text(app).splitlines()[0]
        for _ in range(8):
            await pilot.press("minus")
        await pilot.pause()
        assert app.config.interval == 5.0  # a tenth of the 60 s history: the config's rule
        assert "every 5 s" in screen_text(app).splitlines()[0]


async def test_slash_filters_the_log_pane_and_escape_clears_it() -> None:
    log = FIXTURES / "logs" / "vllm-0.26.0-h200-startup.log"
    clock = FakeClock()
    watch = LogWatch(LogTailer(log), clock=clock)
    app = VtopApp(Config(no_gpu=True), autopoll=False, hostname="t", log_watch=watch, clock=clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.poll_log_once()
        await pilot.pause()
        pane = app.w_log
        all_lines = list(pane.lines)
        with_word = [ln for ln in all_lines if "shutdown" in ln.lower()]
        assert 0 < len(with_word) < len(all_lines)
        await pilot.press("slash")
        await pilot.press(*"ShutDown")  # any case
        await pilot.pause()
        shown = list(pane.lines)
        assert shown == with_word
        assert "'ShutDown'" in str(pane.border_title)
        await pilot.press("enter")  # keeps the filter, the keys are the dashboard's again
        await pilot.press("c")
        await pilot.pause()
        assert list(pane.lines) == shown
        await pilot.press("escape")
        await pilot.pause()
        assert len(pane.lines) == len(all_lines) and pane.substring == ""
