"""The startup tracker and log pane in the app, fed by real vLLM logs."""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import FIXTURES, fake_gpus, make_app
from vtop.clock import FakeClock
from vtop.config import Config
from vtop.monitor.logwatch import LogWatch
from vtop.sources.logtail import LogTailer, StreamTailer
from vtop.ui.app import VtopApp
from vtop.ui.widgets.log_pane import LogPane
from vtop.ui.widgets.startup_panel import StartupPanel

LOGS = FIXTURES / "logs"


def app_with_log(path: Path, clock: FakeClock | None = None, **kw: object) -> VtopApp:
    watch = LogWatch(LogTailer(path), clock=clock or FakeClock(), **kw)  # type: ignore[arg-type]
    return VtopApp(Config(no_gpu=True), autopoll=False, hostname="t", log_watch=watch)


def panel_text(app: VtopApp) -> str:
    return app.query_one(StartupPanel).build().plain


async def test_real_h200_start_folds_to_one_line_and_unfolds_on_p() -> None:
    app = app_with_log(LOGS / "vllm-0.26.0-h200-startup.log")
    async with app.run_test(size=(120, 40)) as pilot:
        await app.poll_log_once()
        await pilot.pause()
        text = panel_text(app)
        # the recorded log ends with a clean shutdown after serving
        assert text.startswith("■ vLLM start v0.26.0 · /tmp/tiny: stopped")
        await pilot.press("p")
        text = panel_text(app)
        assert "PIECEWISE 51/51" in text and "FULL 51/51" in text
        assert "9,103,456 tokens" in text and "69.45 GiB" in text and "277.8x" in text
        assert "torch.compile" in text and "11.2 s" in text


async def test_startup_walks_phases_as_lines_arrive(tmp_path: Path) -> None:
    src = (LOGS / "vllm-0.26.0-h200-startup.log").read_bytes()
    cut = src.index(b"Capturing CUDA graphs")  # stop in the middle of the start
    log = tmp_path / "vllm.log"
    log.write_bytes(src[:cut])
    clock = FakeClock()
    app = app_with_log(log, clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.poll_log_once()
        await pilot.pause()
        text = panel_text(app)
        assert "starting" in text.splitlines()[0]
        assert "▶ KV cache sizing" in text or "▶ memory profiling" in text
        assert "· API server starting" in text  # still to come
        assert "100% GPU" not in text  # --no-gpu: no GPU to expect anything of (issue 26)
        # the capture begins: progress shows as it goes
        more = src[cut:].split(b"\n", 1)[0]
        with log.open("ab") as f:
            f.write(more + b"\n")
        clock.advance(2)
        await app.poll_log_once()
        await pilot.pause()
        text = panel_text(app)
        assert "▶ CUDA graph capture" in text and "PIECEWISE" in text


async def test_busy_phase_says_100_percent_gpu_is_expected_only_with_gpu_readings(tmp_path: Path) -> None:
    src = (LOGS / "vllm-0.26.0-h200-startup.log").read_bytes()
    log = tmp_path / "vllm.log"
    log.write_bytes(src[: src.index(b"Capturing CUDA graphs")])
    clock = FakeClock()
    gpu, _ = fake_gpus(1, clock)
    app = VtopApp(Config(), gpu_source=gpu, autopoll=False, hostname="t", log_watch=LogWatch(LogTailer(log), clock=clock))
    async with app.run_test(size=(120, 40)) as pilot:
        await app.poll_gpu_once()
        await app.poll_log_once()
        await pilot.pause()
        assert "100% GPU is expected" in panel_text(app)


async def test_failure_shows_the_line_and_the_fix() -> None:
    app = app_with_log(LOGS / "vllm-0.26.0-h200-failure.log")
    async with app.run_test(size=(100, 30)) as pilot:
        await app.poll_log_once()
        await pilot.pause()
        text = panel_text(app)
        assert "FAILED" in text and "No module named 'flashinfer'" in text
        assert "VLLM_USE_FLASHINFER_SAMPLER=0" in text
        assert app.query_one(StartupPanel).has_class("-failed")


async def test_stall_is_flagged_with_gpu_activity_and_clears(tmp_path: Path) -> None:
    src = (LOGS / "vllm-0.26.0-h200-startup.log").read_bytes()
    cut = src.index(b"Capturing CUDA graphs")
    log = tmp_path / "vllm.log"
    log.write_bytes(src[:cut])
    clock = FakeClock()
    gpu, _ = fake_gpus(1, clock)
    watch = LogWatch(LogTailer(log), clock=clock, stall_threshold_s=30)
    app = VtopApp(Config(), gpu_source=gpu, autopoll=False, hostname="t", log_watch=watch)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.poll_log_once()
        for _ in range(40):  # 40 s of silence in the log while the GPU keeps working
            clock.advance(1)
            await app.poll_gpu_once()
        await app.poll_log_once()
        await pilot.pause()
        text = panel_text(app)
        assert "POSSIBLE HANG" in text and "40 s" in text
        assert "GPU during the silence:" in text and "util" in text
        assert "py-spy dump" in text
        assert app.query_one(StartupPanel).has_class("-stall")
        with log.open("ab") as f:  # it moves again
            f.write(src[cut:].split(b"\n", 1)[0] + b"\n")
        await app.poll_log_once()
        await pilot.pause()
        assert "POSSIBLE HANG" not in panel_text(app)


async def test_idle_ready_server_is_not_a_stall() -> None:
    clock = FakeClock()
    app = app_with_log(LOGS / "vllm-0.32.0-cpu-startup.log", clock, stall_threshold_s=5)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.poll_log_once()
        clock.advance(3600)
        await app.poll_log_once()
        await pilot.pause()
        text = panel_text(app)
        assert "ready" in text.splitlines()[0] and "POSSIBLE HANG" not in text


async def test_log_pane_filters_warnings_on_w() -> None:
    app = app_with_log(LOGS / "vllm-0.26.0-h200-failure.log")
    async with app.run_test(size=(100, 40)) as pilot:
        await app.poll_log_once()
        await pilot.pause()
        pane = app.query_one(LogPane)
        all_lines = pane.line_count
        await pilot.press("w")
        await pilot.pause()
        assert 0 < pane.line_count < all_lines
        view = app.log_view
        assert view is not None
        problems = [ln for ln in view.recent if ln.at_least("WARNING")]
        assert pane.line_count == min(300, len(problems))
        assert any(ln.level == "INFO" for ln in view.recent)  # there was something to filter out
        assert any("No module named 'flashinfer'" in ln for ln in pane.lines)
        await pilot.press("l")
        assert not pane.display


async def test_no_log_says_how_to_pass_it() -> None:
    app = make_app(None)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert "--log PATH" in panel_text(app)


async def test_log_from_a_pipe() -> None:
    r, w = os.pipe()
    watch = LogWatch(StreamTailer(r), clock=FakeClock())
    app = VtopApp(Config(no_gpu=True), autopoll=False, hostname="t", log_watch=watch)
    data = (LOGS / "vllm-0.32.0-cpu-startup.log").read_bytes()
    async with app.run_test(size=(120, 40)) as pilot:
        os.write(w, data[: len(data) // 2])
        await app.poll_log_once()
        first = panel_text(app)
        assert "starting" in first.splitlines()[0]
        os.write(w, data[len(data) // 2 :])
        os.close(w)
        for _ in range(3):
            await app.poll_log_once()
        await pilot.pause()
        assert "ready" in panel_text(app).splitlines()[0]


async def test_a_message_that_wraps_gets_all_its_rows() -> None:
    # Seen in a fresh clone at 100x30: "looking…" (one row) became the two-row "no vLLM process…
    # `vtop demo`…" message, and the panel kept one row, cutting the pointer to the demo off.
    app = make_app(None)
    async with app.run_test(size=(100, 30)) as pilot:
        panel = app.w_startup
        panel.set_message("short")
        await pilot.pause()
        assert panel.content_region.height == 1
        long = "vLLM log: no vLLM process on this box to read it from; pass --log PATH (or --log -). " * 2
        panel.set_message(long)
        await pilot.pause()
        rows = len(panel.build().wrap(app.console, panel.content_region.width))
        assert rows >= 2 and panel.content_region.height == rows


async def test_a_stats_line_wraps_whole_in_the_log_pane_at_120_columns(tmp_path: Path) -> None:
    # vLLM's stats line is ~215 columns: cut at the pane's width, it showed "Avg gener" and never the
    # queues or the KV usage. It wraps (at most 3 rows); a request line stays one row; a resize re-wraps.
    stats = ("(APIServer pid=12772) INFO 11-30 09:32:05 [loggers.py:335] Engine 000: Avg prompt throughput: "
             "3.6 tokens/s, Avg generation throughput: 364.1 tokens/s, Running: 4 reqs, Waiting: 1 reqs, "
             "CPU KV cache usage: 0.3%, Prefix cache hit rate: 0.0%")
    request = ("(APIServer pid=12772) INFO 11-30 09:32:06 [request_logger.py:65] Received request cmpl-1: params: "
               "SamplingParams(n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, "
               "temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, seed=None, stop=[], max_tokens=64)")
    (log := tmp_path / "vllm.log").write_text(stats + "\n" + request + "\n")
    app = app_with_log(log)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.poll_log_once()
        await pilot.pause()
        pane = app.query_one(LogPane)
        rows = list(pane.lines)
        width = pane.scrollable_content_region.width
        assert len(stats) > width  # the case: one row could not hold it
        i = next(i for i, r in enumerate(rows) if "Avg prompt throughput" in r)
        whole = " ".join(r.strip() for r in rows[i:i + 3])
        assert "Running: 4 reqs, Waiting: 1 reqs, CPU KV cache usage: 0.3%" in whole, rows
        assert all(len(r) <= width for r in rows[i:i + 3]) and rows[i + 1].startswith("  ")
        (req,) = [r for r in rows if "Received request" in r or "max_tokens=64" in r]
        assert "Received request" in req and req.endswith("max_tokens=64)")  # one row, cut on screen
        await pilot.resize_terminal(200, 40)
        await pilot.pause()
        await pilot.pause()
        wide = list(pane.lines)
        assert any("Avg prompt throughput" in r and "Running: 4 reqs" in r for r in wide), wide


async def test_sglang_batch_lines_wrap_whole_in_the_log_pane_at_120_columns() -> None:
    # SGLang's Prefill batch line is ~210 columns (its #queue-req at ~150), its Decode batch ~150 (#queue-req
    # last): cut at the pane's width, neither showed its queue. They wrap as vLLM's stats line does; its access
    # lines stay one row. The input is the HAND-MADE serving excerpt (tests/fixtures/sglang/README.md), not a
    # recording: no real SGLang server has run beside vtop yet.
    log = FIXTURES / "sglang" / "serving-0.5.17-handmade.log"
    originals = set(log.read_text().splitlines())
    app = app_with_log(log)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.poll_log_once()
        await pilot.pause()
        pane = app.query_one(LogPane)
        rows = list(pane.lines)
        width = pane.scrollable_content_region.width
        heads = [i for i, r in enumerate(rows) if "Prefill batch" in r or "Decode batch" in r]
        assert len(heads) == 13
        for i in heads:
            end = next((j for j in range(i + 1, len(rows)) if not rows[j].startswith("  ")), len(rows))
            assert 2 <= end - i <= 3 and all(len(r) <= width for r in rows[i:end]), rows[i:end]
            whole = " ".join(r.strip() for r in rows[i:end])
            assert "#queue-req: " in whole and whole in originals  # every part of the line, in order
        first = " ".join(r.strip() for r in rows[heads[0]:heads[0] + 2])
        assert first.endswith("#running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, "
                              "input throughput (token/s): 0.31"), first
        access = [r for r in rows if "POST /v1/chat/completions" in r]
        assert len(access) == 5 and all(r.endswith("200 OK") for r in access)


async def test_poll_lines_are_hidden_counted_said_once_and_a_shows_them(tmp_path: Path) -> None:
    # Issue 26 item 3: uvicorn's access lines of the monitoring endpoints (vtop's own polls) are
    # hidden by default, the pane's bottom border counts them and says which vLLM flag keeps
    # them out of the server's log, and `a` shows them.
    poll = '(APIServer pid=7) INFO:     127.0.0.1:50312 - "GET /metrics/?name[]=vllm:num_requests_running HTTP/1.1" 200 OK'
    health = '(APIServer pid=7) INFO:     127.0.0.1:50313 - "GET /health HTTP/1.1" 200 OK'
    work = '(APIServer pid=7) INFO:     127.0.0.1:50400 - "POST /v1/completions HTTP/1.1" 200 OK'
    (log := tmp_path / "vllm.log").write_text("\n".join([poll, work, health, poll]) + "\n")
    app = app_with_log(log)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.poll_log_once()
        await pilot.pause()
        pane = app.query_one(LogPane)
        rows = list(pane.lines)
        assert any("POST /v1/completions" in r for r in rows)
        assert not any("GET /metrics" in r or "GET /health" in r for r in rows), rows
        assert pane.hidden_probes == 3
        assert "3 poll lines hidden (a)" in str(pane.border_subtitle)
        assert "--disable-access-log-for-endpoints" in str(pane.border_subtitle)
        assert not app._notifications  # said under the pane: no toast over the cards
        await pilot.press("a")
        await pilot.pause()
        rows = list(pane.lines)
        assert sum("GET /metrics" in r for r in rows) == 2 and any("GET /health" in r for r in rows), rows
        assert "poll lines shown" in str(pane.border_title) and not pane.border_subtitle
        with log.open("a") as f:
            f.write(poll + "\n")
        await app.poll_log_once()
        await pilot.press("a")
        await pilot.pause()
        assert pane.hidden_probes == 4 and not any("GET /metrics" in r for r in pane.lines)
        assert "4 poll lines hidden (a)" in str(pane.border_subtitle)


async def test_lines_that_arrive_are_appended_once_filtered_and_the_poll_lines_counted(tmp_path: Path) -> None:
    # The pane filters only what arrived since its last redraw (not its whole ring at every line):
    # each new line shows once, in order, poll lines stay out and are counted, and a burst of poll
    # lines alone adds no row.
    poll = '(APIServer pid=7) INFO:     127.0.0.1:50312 - "GET /metrics HTTP/1.1" 200 OK'
    work = '(APIServer pid=7) INFO:     127.0.0.1:50400 - "POST /v1/completions HTTP/1.1" 200 OK ({})'
    (log := tmp_path / "vllm.log").write_text("\n".join([work.format(0), poll]) + "\n")
    app = app_with_log(log)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.poll_log_once()
        await pilot.pause()
        pane = app.query_one(LogPane)
        for k in range(1, 6):
            with log.open("a") as f:
                f.write("\n".join([poll, work.format(k), poll]) + "\n")
            await app.poll_log_once()
            await pilot.pause()
        with log.open("a") as f:
            f.write((poll + "\n") * 3)
        await app.poll_log_once()
        await pilot.pause()
        rows = [r for r in pane.lines if "POST /v1/completions" in r]
        assert [r[-3:] for r in rows] == [f"({k})" for k in range(6)], list(pane.lines)
        assert not any("GET /metrics" in r for r in pane.lines)
        assert pane.hidden_probes == 1 + 2 * 5 + 3
        assert f"{pane.hidden_probes} poll lines hidden (a)" in str(pane.border_subtitle)
        await pilot.press("w")  # a filter change rebuilds from the ring: none of these is a warning
        await pilot.pause()
        assert not any("POST /v1/completions" in r for r in pane.lines)
        await pilot.press("w")
        await pilot.pause()
        assert sum("POST /v1/completions" in r for r in pane.lines) == 6


async def test_the_newest_log_line_stays_at_the_bottom_when_the_pane_shrinks_and_a_scrolled_view_stays(tmp_path: Path) -> None:
    # At 80x24 the layout gives the pane its rows after its lines came (a start's panel grows above it): the
    # pane, at its end before, shows the newest line after, not the lines that were at its bottom; scrolled up
    # by the user, it stays where it was.
    from textual.app import App, ComposeResult

    from vtop.core.phases.types import LogLine

    class Host(App[None]):
        def compose(self) -> ComposeResult:
            yield LogPane(id="pane")

    lines = [LogLine(float(i), None, "INFO", f"line {i:03d}", None) for i in range(60)]

    class View:
        recent = lines
        lines_total = len(lines)
        source_label = None
        snapshot = None

    app = Host()
    async with app.run_test(size=(80, 24)) as pilot:
        pane = app.query_one(LogPane)
        pane.styles.height = 12
        await pilot.pause()
        pane.show(View())  # type: ignore[arg-type]
        await pilot.pause()
        assert pane.scroll_y == pane.max_scroll_y > 0
        pane.styles.height = 4  # the layout shrinks it
        await pilot.pause()
        await pilot.pause()
        assert pane.scroll_y == pane.max_scroll_y, (pane.scroll_y, pane.max_scroll_y)
        pane.scroll_to(y=10, animate=False, immediate=True)  # the user scrolls up to read
        await pilot.pause()
        pane.styles.height = 8
        await pilot.pause()
        await pilot.pause()
        assert pane.scroll_y == 10
