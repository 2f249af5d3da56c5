"""vtop itself against a real vLLM server (CPU build): the server panel and the startup tracker.

Each test runs the real app (real polling threads, the real scraper, the real
log tailer) headless beside the session's real server. Set
``VTOP_SCREENSHOTS=DIR`` to keep SVG screenshots of what it showed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.helpers.real import Watch, shot
from vtop.config import Config
from vtop.core.phases import Phase
from vtop.ui.app import VtopApp

pytestmark = pytest.mark.real


def make(srv: Any, **cfg: Any) -> VtopApp:
    cfg.setdefault("interval", 0.5)
    return VtopApp(Config(urls=(srv.url,), log=str(srv.log_path), no_gpu=True, **cfg), hostname="cpu-box")


async def test_startup_walks_to_ready_and_the_panel_goes_starting_then_up_under_load(real_vllm_fresh_start) -> None:  # type: ignore[no-untyped-def]
    srv = real_vllm_fresh_start  # launched just now, not ready
    app = make(srv)
    async with app.run_test(size=(120, 44)) as pilot:
        w = Watch(app, srv.url)
        # the tracker walks the phases while the port refuses
        await w.until(pilot, lambda: bool(app.log_view and app.log_view.snapshot.current
                                          and app.log_view.snapshot.current is not Phase.PROCESS_START),
                      240, "a phase after process start")
        assert w.server_states and w.server_states[0] == "starting"  # a process, no port yet
        shot(app, "startup-cpu-real-starting.svg")
        await w.until(pilot, lambda: bool(app.log_view and app.log_view.state == "ready"), 300, "ready in the log")
        await w.until(pilot, lambda: w.view() is not None and w.view().state == "up", 60, "the panel to say up")
        snap = app.log_view.snapshot  # type: ignore[union-attr]
        order = [p.value for p in Phase]
        seen = [p.phase.value for p in snap.phases]
        assert seen == sorted(seen, key=order.index)  # in vLLM's order
        for must in ("process_start", "engine_init", "weights", "kv_cache", "api_server", "ready"):
            assert must in seen, (must, seen)
        durations = [p.duration_s for p in snap.phases if p.phase is not Phase.READY]
        assert all(d is not None and d >= 0 for d in durations)
        assert snap.total_s is not None and 5 < snap.total_s < 600
        assert abs(sum(durations) - snap.total_s) < 3  # the phases tile the start (log stamps: 1 s)
        assert snap.facts.kv_cache_tokens and snap.facts.kv_cache_tokens > 0
        assert w.phases == [p for p in w.phases if p in order]  # live order too
        assert w.phases.index("engine_init") < w.phases.index("api_server")
        # running / waiting move under a bounded real load (more requests than max_num_seqs is not
        # needed: 48 at concurrency 24 on 2 cores queues some)
        # max_tokens 192: the burst lasts tens of seconds on 2 cores, so vtop's 1 s view sees it
        # running however the box schedules it (with 48 tokens it was over in ~10 s, and one CI
        # run's samples missed it)
        fut = srv.start_load(n=48, concurrency=24, max_tokens=192)
        await w.until(pilot, lambda: any((s["running"] or 0) > 0 for s in w.samples), 120, "running > 0")
        shot(app, "server-cpu-real-load.svg")
        res = await asyncio.wrap_future(fut)
        assert res.ok == 48, res
        await w.until(pilot, lambda: (w.view().finished or {}).get("length", 0) >= 48, 60, "48 finished: length")
        assert max(s["running"] or 0 for s in w.samples) >= 2
        assert any((s["gen_tps"] or 0) > 0 for s in w.samples)
        assert all((s["gen_tps"] or 0) >= 0 and (s["prompt_tps"] or 0) >= 0 for s in w.samples)


async def test_stop_is_down_and_restart_is_restarted_with_sane_rates(real_vllm) -> None:  # type: ignore[no-untyped-def]
    srv = real_vllm
    app = make(srv)
    async with app.run_test(size=(120, 44)) as pilot:
        w = Watch(app, srv.url)
        await w.until(pilot, lambda: w.view() is not None and w.view().state == "up", 30, "up")
        res = await asyncio.wrap_future(srv.start_load(n=8, concurrency=4, max_tokens=16))
        assert res.ok == 8
        await w.until(pilot, lambda: (w.view().gen_tps or 0) > 0, 30, "a generation rate")
        await asyncio.to_thread(srv.stop)
        await w.until(pilot, lambda: w.view().state == "down", 30, "down")
        assert "no vLLM process" in w.view().message or "refus" in w.view().message
        shot(app, "server-cpu-real-down.svg")
        await asyncio.to_thread(srv.start)  # waits for /health
        await w.until(pilot, lambda: w.view().state in ("restarted", "up") and w.view().restarts >= 1, 60,
                      "restarted")
        assert "restarted" in w.server_states
        # after the restart the counters began again at 0: rates re-baselined, never negative
        res = await asyncio.wrap_future(srv.start_load(n=8, concurrency=4, max_tokens=16))
        assert res.ok == 8
        await w.until(pilot, lambda: (w.view().gen_tps or 0) > 0, 30, "a rate after the restart")
        assert all((s["gen_tps"] or 0) >= 0 for s in w.samples)
        assert w.server_states[:2] == ["up", "starting"] or "down" in w.server_states


async def test_a_stopped_engine_mid_start_is_flagged_and_clears(real_vllm_fresh_start) -> None:  # type: ignore[no-untyped-def]
    srv = real_vllm_fresh_start
    app = make(srv, stall_threshold=8)
    async with app.run_test(size=(120, 44)) as pilot:
        w = Watch(app, srv.url)
        # Stopped once its worker exists: a worker still being spawned when the engine stops goes on
        # and logs (vLLM's CPU start is silent ~10 s between the engine's lines and the worker's first),
        # which is progress, and rightly clears the alarm (seen once in CI).
        await w.until(pilot, lambda: srv.engine_pid() is not None and bool(srv.worker_pids()) and bool(app.log_view)
                      and app.log_view.snapshot.current not in (None, Phase.PROCESS_START), 240,
                      "the engine and its worker to start their phases")
        stopped_in = app.log_view.snapshot.current  # type: ignore[union-attr]
        srv.sigstop_engine(with_workers=True)
        t0 = time.monotonic()
        try:
            from vtop.ui.widgets.startup_panel import StartupPanel

            seen: dict[str, object] = {}

            def flagged() -> bool:
                # what the panel shows (painted once an interval) and what the tracker knows, at one moment
                lv = app.log_view
                text = app.query_one(StartupPanel).build().plain
                if lv is None or lv.stall is None or "POSSIBLE HANG" not in text:
                    return False
                seen.update(text=text, phase=lv.stall.phase, current=lv.snapshot.current)
                return True

            await w.until(pilot, flagged, 60, "the stall alarm on screen")
            took = time.monotonic() - t0
            assert took < 8 + 15  # threshold + polls + a last line that may still come
            assert "py-spy dump" in str(seen["text"])
            assert seen["phase"] in (stopped_in, seen["current"])
            shot(app, "startup-cpu-real-stall.svg")
        finally:
            srv.sigcont_engine()
        await w.until(pilot, lambda: app.log_view is not None and app.log_view.stall is None
                      and app.log_view.state in ("starting", "ready"), 240, "the alarm to clear")
    await asyncio.to_thread(srv.wait_health)


async def test_action_keys_on_the_real_server(real_vllm, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """d dumps the real EngineCore; t sends a real request with max_tokens; s bundles the real log."""
    from vtop.ui.screens import ProbeScreen, PySpyScreen

    srv = real_vllm
    app = VtopApp(Config(urls=(srv.url,), log=str(srv.log_path), no_gpu=True, interval=0.5,
                         snapshot_dir=str(tmp_path)), hostname="cpu-box")
    async with app.run_test(size=(120, 44)) as pilot:
        w = Watch(app, srv.url)
        await w.until(pilot, lambda: w.view() is not None and w.view().state == "up"
                      and app.monitor.servers[srv.url].process is not None, 30, "up, with its process")
        await pilot.press("d")
        screen = app.screen
        assert isinstance(screen, PySpyScreen)
        assert screen.target.pid == srv.engine_pid()
        await w.until(pilot, lambda: screen.result is not None, 60, "the py-spy dump")
        assert screen.result.ok, screen.result.message
        frames = [f.text for th in screen.result.threads for f in th.frames]
        assert any("vllm" in f for f in frames)
        shot(app, "pyspy-real-enginecore.svg")
        await pilot.press("escape")
        await pilot.press("t")
        probe = app.screen
        assert isinstance(probe, ProbeScreen)
        probe.query_one("#max-tokens").value = "16"
        probe.query_one("#max-tokens").focus()
        await pilot.press("enter")
        await w.until(pilot, lambda: probe.result is not None, 120, "the test request")
        r = probe.result
        assert r.ok and r.finish_reason == "length" and r.output_tokens == 16, r
        shot(app, "test-request-real.svg")
        await pilot.press("escape")
        await pilot.press("s")
        await w.until(pilot, lambda: app.last_snapshot is not None, 60, "the snapshot")
        assert app.last_snapshot.ok, app.last_snapshot.message
        assert (app.last_snapshot.path / "vllm.log").stat().st_size == srv.log_path.stat().st_size or \
            (app.last_snapshot.path / "vllm.log").stat().st_size > 0
