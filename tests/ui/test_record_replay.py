"""Record a live session, replay it, and see the same numbers at the same timestamps.

The live side is the real app with its real poll loops (threads, httpx, the
log tailer) against a local HTTP server that answers with real vLLM 0.26.0
/metrics payloads from the H200 recording, two simulated GPUs, and a log file
written while it runs. The replay side is ``vtop replay``'s app on the same
file. The real-tier twin of this test does the same against a real vLLM.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from tests.helpers.metrics_server import MetricsServer, h200_payloads
from tests.helpers.screen_text import card_text
from vtop.config import Config
from vtop.sources.recording.record import load, read
from vtop.ui.app import VtopApp
from vtop.ui.replay import replay_app

WIDTH = 96
REQ_LOG = FIXTURES / "logs" / "requests" / "vllm-0.26.0-v1.log"


async def record_live(tmp_path: Path, suffix: str = ".jsonl") -> tuple[Path, list[tuple[float, str, list[str]]], VtopApp]:
    rec = tmp_path / f"rec{suffix}"
    log = tmp_path / "serve.log"
    lines = [ln for ln in REQ_LOG.read_text().splitlines() if not ln.startswith("#")]
    log.write_text("\n".join(lines[:3]) + "\n")
    seen: list[tuple[float, str, list[str]]] = []
    with MetricsServer(h200_payloads(5, 40)) as srv:
        cfg = Config(urls=(srv.url,), interval=0.25, history=30, simulate_gpus=2, record=str(rec), log=str(log))
        app = VtopApp(cfg, hostname="testhost")

        def on_view(entry, view) -> None:  # type: ignore[no-untyped-def]
            if view.metrics is not None:
                seen.append((app.monitor.clock.monotonic(), entry.url, card_text(app.cards[entry.url], view, app.monitor.clock.monotonic())))

        async with app.run_test(size=(120, 40)) as pilot:
            app.monitor.on_server_view.append(on_view)
            for i, ln in enumerate(lines[3:]):
                with log.open("a") as f:
                    f.write(ln + "\n")
                await pilot.pause(0.12)
                if i > 30:
                    break
            deadline = time.monotonic() + 30
            while len(seen) < 12 and time.monotonic() < deadline:
                await pilot.pause(0.1)
            live_inflight = [(r.request_id, r.max_tokens) for r in (app.log_view.inflight if app.log_view else ())]
            app._live_inflight = live_inflight  # type: ignore[attr-defined]
            app._live_gpu = app.gpu_history.last_poll  # type: ignore[attr-defined]
        app.recorder.close()  # type: ignore[union-attr]
    return rec, seen, app


@pytest.fixture(scope="module")
def live_recording(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[float, str, list[str]]], VtopApp]:
    """One live session (about 5 s) shared by the tests below; recorded gzipped."""
    return asyncio.run(record_live(tmp_path_factory.mktemp("live"), ".jsonl.gz"))


async def test_live_session_replays_to_the_same_numbers_at_the_same_timestamps(live_recording) -> None:  # type: ignore[no-untyped-def]
    rec, seen, live = live_recording
    assert len(seen) >= 12, "the live app should have scraped the local server at least 12 times"
    kinds = {r["kind"] for r in read(rec)}
    assert {"header", "gpu", "server", "log"} <= kinds

    app = replay_app(str(rec), config=Config())
    async with app.run_test(size=(120, 40)) as pilot:
        driver = app.replay
        driver.paused = True
        await pilot.pause()
        compared = 0
        for mono, url, live_lines in seen:
            driver.seek(mono)
            entry = app.monitor.servers[url]
            assert entry.last_view is not None
            assert card_text(app.cards[entry.url], entry.last_view, mono) == live_lines, f"at mono {mono:.3f}"
            compared += 1
        assert compared == len(seen)
        # the GPU readings and the requests from the log match at the end too
        gpu = live._live_gpu  # type: ignore[attr-defined]
        driver.seek(gpu.mono)
        assert app.gpu_history.last_poll.mono == gpu.mono
        assert app.gpu_history.last_poll.gpus == gpu.gpus
        driver.seek(driver.end)
        assert [(r.request_id, r.max_tokens) for r in app.log_view.inflight] == live._live_inflight  # type: ignore[attr-defined]
        assert app.log_view.request_logging
        # the status bar shows the recorded clock, not now
        stamp = time.strftime("%H:%M:%S", time.gmtime(driver.clock.time()))
        assert stamp in str(app.query_one("#status").render())


async def test_seek_back_rebuilds_the_same_state(live_recording) -> None:  # type: ignore[no-untyped-def]
    rec, seen, _ = live_recording
    with gzip.open(rec, "rt") as f:
        assert json.loads(f.readline())["schema"] == "vtop-record"
    app = replay_app(str(rec), config=Config())
    async with app.run_test(size=(120, 40)) as pilot:
        d = app.replay
        d.paused = True
        mono, url, live_lines = seen[len(seen) // 2]
        d.seek(mono)
        first = card_text(app.cards[url], app.monitor.servers[url].last_view, mono)
        d.seek(d.end)
        d.seek(mono)  # back: everything is rebuilt from the start of the file
        again = card_text(app.cards[url], app.monitor.servers[url].last_view, mono)
        assert first == again == live_lines
        await pilot.pause()


async def test_replay_keys_pause_step_speed_seek(live_recording) -> None:  # type: ignore[no-untyped-def]
    rec, _, _ = live_recording
    _, events = load(rec)
    app = replay_app(str(rec), config=Config(), speed=1.0)
    app.replay.paused = True  # as `--paused`: a busy box may take longer to start than the file lasts
    async with app.run_test(size=(100, 30)) as pilot:
        d = app.replay
        await pilot.press("space")
        assert not d.paused
        await pilot.press("space")
        assert d.paused
        pos = d.pos
        await pilot.pause(0.5)
        assert d.pos == pos, "paused: the recorded clock must not move"
        await pilot.press("full_stop")
        assert d.pos == pytest.approx(min(d.end, pos + d.interval), abs=1e-6)
        await pilot.press("plus")
        await pilot.press("plus")
        assert d.speed == 5
        await pilot.press("minus")
        assert d.speed == 2
        await pilot.press("end")
        assert d.ended and d.pos == d.end
        assert "END" in str(app.query_one("#status").render())
        await pilot.press("home")
        assert d.pos == d.start
        await pilot.press("right")
        assert d.pos == pytest.approx(min(d.end, d.start + 10), abs=1e-6)
        await pilot.press("space")  # play again at 2x
        assert not d.paused
        before = d.pos
        deadline = time.monotonic() + 30  # a hang guard: the replay's timer moves it on
        while d.pos <= before and not d.ended:
            assert time.monotonic() < deadline, "the replay did not play on"
            await pilot.pause(0.05)
        # the action keys act on this box, not the recorded one: hidden in a replay
        assert app.check_action("snapshot", ()) is False


def test_replay_of_garbage_is_a_clear_error(tmp_path: Path) -> None:
    from vtop.cli import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n{\"kind\": \"gpu\"}\n")
    with pytest.raises(SystemExit) as ei:
        main(["replay", str(bad)])
    assert ei.value.code == 3
    with pytest.raises(SystemExit) as ei:
        main(["replay", str(tmp_path / "missing.jsonl")])
    assert ei.value.code == 3


async def test_recorder_never_blocks_the_caller(tmp_path: Path) -> None:
    """Writes go through a queue to one writer thread: while the disk is stuck (the writer
    holds the file), callers still return at once, and nothing is lost once it moves."""
    import threading

    from vtop.sources.fake_nvml import simulated
    from vtop.sources.nvml import NvmlSource
    from vtop.sources.recording.record import Recorder, gpu_polls

    poll = NvmlSource(simulated(2)).poll()
    r = Recorder(tmp_path / "x.jsonl")
    done = threading.Event()

    def caller() -> None:
        for _ in range(200):
            r.gpu(poll)
        done.set()

    with r._lock:  # the writer cannot write or flush: a disk that does not answer
        t = threading.Thread(target=caller, daemon=True)
        t.start()
        assert done.wait(10), "a caller waited on the stuck writer"
    assert r.flush(120)  # a hang guard on a busy box, not a time bound
    r.close()
    assert len(gpu_polls(tmp_path / "x.jsonl")) == 200


async def test_status_bar_says_recording_and_when_the_size_limit_stopped_it(tmp_path: Path) -> None:
    from vtop.sources.fake_nvml import simulated
    from vtop.sources.nvml import NvmlSource

    app = VtopApp(Config(record=str(tmp_path / "r.jsonl"), record_max_mb=1), gpu_source=NvmlSource(simulated(48)),
                  autopoll=False, hostname="t")
    async with app.run_test(size=(120, 30)) as pilot:
        await app.poll_gpu_once()
        await pilot.pause()
        assert "● REC" in str(app.query_one("#status").render())
        poll = app.gpu_history.last_poll
        for _ in range(150):  # what the poll thread writes, 48 GPUs a poll: past 1 MB
            app.recorder.gpu(poll)
        assert app.recorder.flush(120)  # a hang guard, not a time bound: 150 polls of 48 GPUs take seconds to encode on a busy box
        app.update_status()
        status = str(app.query_one("#status").render())
        assert "size limit" in status and "● REC" not in status
    assert (tmp_path / "r.jsonl").stat().st_size <= 2**20
