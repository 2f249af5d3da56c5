"""The server card against the real H200 recording and in its edge states."""

from __future__ import annotations

import re

from tests.conftest import make_app
from tests.helpers import h200_replay as rp
from vtop.config import Config
from vtop.ui.app import VtopApp
from vtop.ui.widgets.server_panel import ServerCard


def app_for_replay(clock):  # type: ignore[no-untyped-def]
    app = VtopApp(Config(no_gpu=False, history=120), gpu_source=None, autopoll=False, hostname="h200", clock=clock)
    return app


async def test_burst_shows_running_1024_and_waiting_queue() -> None:
    clock = rp.make_clock()
    app = app_for_replay(clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await rp.feed(app, clock, until_t=107.5)  # the waiting queue's peak
        await pilot.pause()
        card = app.query_one(ServerCard)
        text = card.render().plain
        assert re.search(r"running\s+792 ", text) and re.search(r"waiting\s+708 ", text)
        e = app.monitor.servers[rp.URL]
        assert e.history[0] == "starting" or e.history[0] == "down"
        assert "up" in e.history
        await rp.feed(app, clock, until_t=108.5, from_t=107.5)
        await pilot.pause()
        text = card.render().plain
        assert re.search(r"running\s+1024 ", text) and re.search(r"waiting\s+476 ", text)
        # the H200's memory is on the same time axis: the KV-cache allocation made it ~71 GiB
        assert "71.4/140 GiB" in app.query_one("GpuCard").render().plain


async def test_runaway_generation_rate_and_up_state() -> None:
    clock = rp.make_clock()
    app = app_for_replay(clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await rp.feed(app, clock, until_t=190)
        await pilot.pause()
        v = app.monitor.servers[rp.URL].last_view
        assert v is not None and v.state == "up"
        assert v.gen_tps is not None and 440 < v.gen_tps < 480  # one request decoding alone
        text = app.query_one(ServerCard).render().plain
        assert re.search(r"running\s+1 ", text) and "gen tok/s" in text
        assert "max_model_len 32,768" in (app.query_one(ServerCard).border_title or "")


async def test_down_without_metrics_is_just_the_message() -> None:
    app = make_app(None)
    async with app.run_test(size=(80, 24)) as pilot:
        app.apply_procs([])  # nothing on this box: watch the fallback
        e = app.monitor.servers["http://localhost:8000"]
        from vtop.sources.vllm import poll_from_error

        app.apply_server(e.url, poll_from_error(e.url, "refused", t=1.0, mono=app.monitor.clock.monotonic()))
        await pilot.pause()
        text = app.cards[e.url].render().plain
        assert text.startswith("DOWN:") and "localhost:8000" in text
        assert "gen tok/s" not in text and "KV cache" not in text  # no empty charts
        assert app.cards[e.url].has_class("-down")
        assert app.server_status_text() == "vLLM: down"


async def test_polls_back_off_while_nothing_listens() -> None:
    from vtop.sources.vllm import poll_from_error

    app = make_app(None, interval=1.0)
    async with app.run_test(size=(80, 24)):
        app.apply_procs([])
        e = app.monitor.servers["http://localhost:8000"]
        app.apply_server(e.url, poll_from_error(e.url, "refused", t=1.0, mono=app.monitor.clock.monotonic()))
        delays = [app.feed.next_delay(e.url, n) for n in range(5)]
        assert delays[0] == 1.0 and delays == sorted(delays) and delays[-1] == 5.0


async def test_process_scans_slow_down_once_every_server_answers_even_without_a_local_process() -> None:
    from vtop.monitor.polling import PollLoop

    clock = rp.make_clock()
    app = app_for_replay(clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await rp.feed(app, clock, until_t=190)  # the replayed server is up; no process of it on this box
        await pilot.pause()
        e = app.monitor.servers[rp.URL]
        assert e.last_view is not None and e.last_view.state == "up" and e.process is None
        loop = PollLoop("discovery", 5.0, lambda: [], lambda r, err: None)  # not started: only its interval
        app.feed.disc_loop = loop
        app.feed.on_discovery([], None)
        assert loop.interval == app.feed.SETTLED_SCAN_S
        # a server that stops answering brings the fast scans back
        from vtop.sources.vllm import poll_from_error

        app.apply_server(e.url, poll_from_error(e.url, "refused", t=1.0, mono=clock.monotonic()))
        app.feed.on_discovery([], None)
        assert loop.interval == 5.0


async def test_rows_drawn_every_second_skip_a_filter_that_would_change_nothing(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Cards and GPU rows leave out Textual's ANSI-to-truecolor filter: every style they
    draw with (component classes, the widget's own) is already truecolor and not ``dim``,
    so the filter returns each rendered line unchanged, borders and titles included. The
    other filters (``NO_COLOR``'s) still apply."""
    from rich.segment import Segment
    from textual.filter import ANSIToTruecolor, Monochrome
    from textual.geometry import Region

    from vtop.ui.widgets.gpu_panel import GpuCard, _RunsWidget

    monkeypatch.delenv("NO_COLOR", raising=False)
    clock = rp.make_clock()
    app = app_for_replay(clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await rp.feed(app, clock, until_t=108.5)  # 1024 running: "hot" values in the card
        await pilot.pause()
        ansi = ANSIToTruecolor(app.ansi_theme)
        widgets = [app.query_one(ServerCard), app.query_one(GpuCard)]
        for w in widgets:
            assert isinstance(w, _RunsWidget) and not any(isinstance(f, ANSIToTruecolor) for f in w.get_line_filters())
            assert any(isinstance(f, ANSIToTruecolor) for f in app.get_line_filters())  # the app still has it
            base_bg, bg = w.background_colors
            back = (base_bg + bg).rich_color
            for key in {k.split("--", 1)[1] for k in w.COMPONENT_CLASSES} | {""}:
                st = w._seg_style(key, w._base_style())
                assert ansi.truecolor_style(st, back) == st, (type(w).__name__, key, st)
            lines = w.render_lines(Region(0, 0, w.outer_size.width, w.outer_size.height))
            assert len(lines) == w.outer_size.height >= 6
            for strip in lines:
                assert list(ansi.apply(list(strip), base_bg + bg)) == [Segment(t, s) for t, s, _ in strip]
    monkeypatch.setenv("NO_COLOR", "1")
    clock = rp.make_clock()
    app = app_for_replay(clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await rp.feed(app, clock, until_t=30)
        await pilot.pause()
        assert any(isinstance(f, Monochrome) for f in app.query_one(ServerCard).get_line_filters())


async def test_a_fast_scrape_reads_under_10ms_so_its_jitter_repaints_nothing_and_a_slow_one_shows() -> None:
    import dataclasses

    from vtop.ui.widgets.server_panel import fmt_scrape

    assert fmt_scrape(0.0021) == fmt_scrape(0.0098) == "<10ms"
    assert fmt_scrape(0.012) == "12ms" and fmt_scrape(0.31) == "310ms" and fmt_scrape(2.5) == "2.50s"
    assert fmt_scrape(None) == "-"
    clock = rp.make_clock()
    app = app_for_replay(clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await rp.feed(app, clock, until_t=190)
        await pilot.pause()
        card = app.query_one(ServerCard)
        view = app.monitor.servers[rp.URL].last_view
        assert view is not None
        width = card.content_width()

        def lines_at(latency_s: float) -> list[list[tuple[str, str]]]:
            card.view = dataclasses.replace(view, latency_s=latency_s)
            return card.lines(width)

        assert lines_at(0.002) == lines_at(0.004)  # the row would not be repainted
        slow = lines_at(0.240)
        assert slow != lines_at(0.004)
        assert any("scrape 240ms" in text for row in slow for text, _ in row)
