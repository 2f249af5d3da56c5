"""Engine deaths on a real vLLM server (CPU build), with vtop watching (and recording) as the app.

``kill -9`` of a process of the real server's tree, the way an engine dies for real (the
OOM killer, a segfault in a kernel):

* the ``VLLM::EngineCore`` process under a steady bounded load of short requests;
* the ``VLLM::Worker`` process (the CPU build runs one, a child of EngineCore) under the
  same load;
* the ``VLLM::EngineCore`` process of an idle server.

vLLM 0.32.0 (CPU) then exits by itself: the API server logs ``EngineDeadError`` and is gone
within a second under load; idle, it answers ``/health`` with 503 for ~4 s first.  vtop must
leave ``UP`` (``ENGINE DEAD`` while /health says 503, ``DOWN`` once nothing listens) and raise
the ``engine_died`` alert from the log lines, live and in a replay of its recording.

Each test records ~20 s before the kill and ~20 s after it, at the 0.5 s interval of the
other incidents, with a ``mark`` event at the kill (``label`` ``kill -9 ...``, ``mono`` and
``t`` the clocks of the recording, ``pid``).  ``VTOP_RECORD_DIR=DIR`` keeps the recordings
(committed under ``tests/fixtures/cpu-incidents/``, see ENGINE-DEATH.md there).

Each test ends with the session's server stopped (it is dead): the next test that uses
``real_vllm`` starts a new one (~35-70 s).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.real import Watch, app_for, shot
from vtop.config import Config
from vtop.sources.recording.record import load
from vtop.ui.replay import replay_app

pytestmark = pytest.mark.real

#: recorded before the kill (under load: after the first request is seen running)
BEFORE_S = 20.0
#: recorded after the kill
AFTER_S = 25.0
DEATH_STATES = ("engine dead", "down")


async def _death(srv: Any, tmp_path: Path, name: str, *, target: str, load: bool) -> dict[str, Any]:
    """Record ``name`` while ``target`` ("engine" or "worker") is killed; returns what was seen."""
    app = app_for(srv, tmp_path, name)
    seen: dict[str, Any] = {"states": [], "alerts": [], "tracker": []}
    fut = None

    def note(t0: float | None) -> None:
        now = app.monitor.clock.monotonic()
        rel = None if t0 is None else round(now - t0, 2)
        v = w.view()
        if v is not None and (not seen["states"] or seen["states"][-1][1] != v.state):
            seen["states"].append((rel, v.state))
        st = app.log_view.state if app.log_view is not None else None
        if not seen["tracker"] or seen["tracker"][-1][1] != st:
            seen["tracker"].append((rel, st))
        for a in app.alerts:
            key = (a.rule, a.severity)
            if key not in {(r, s) for _, r, s, _ in seen["alerts"]}:
                seen["alerts"].append((rel, a.rule, a.severity, a.title))

    async def pause_for(seconds: float, t0: float | None) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            w.sample()
            note(t0)
            await pilot.pause(0.25)

    async with app.run_test(size=(120, 40)) as pilot:
        w = Watch(app, srv.url)
        await w.until(pilot, lambda: (v := w.view()) is not None and v.state == "up", 60, "the server up")
        rec = app.recorder
        assert rec is not None
        try:
            if load:
                # short requests, 3 at a time, bounded in count and time (a fast box serves
                # ~30 a second, so 2000 outlast the kill); those sent after the death fail at
                # once (counted by LoadResult, never raised)
                fut = srv.start_load(n=2000, concurrency=3, max_tokens=32, time_limit_s=BEFORE_S + 40.0,
                                     request_timeout_s=20.0)
                rec.mark(app.monitor.clock.time(), "load start: /v1/completions max_tokens=32, concurrency 3",
                         mono=app.monitor.clock.monotonic())
                await w.until(pilot, lambda: (v := w.view()) is not None and v.total is not None
                              and (v.total.running or 0) >= 1, 30, "requests running")
            await pause_for(BEFORE_S, None)
            assert w.view().state == "up", seen
            if target == "engine":
                pid = srv.engine_pid(timeout=5)
                title = "VLLM::EngineCore"
            else:
                pids = srv.worker_pids()
                if not pids:
                    pytest.skip("this vLLM build runs no separate VLLM::Worker process")
                pid, title = pids[0], "VLLM::Worker"
            assert pid is not None, srv.log_tail()
            assert fut is None or not fut.done(), "the load ended before the kill"
            t_kill, mono_kill = app.monitor.clock.time(), app.monitor.clock.monotonic()
            os.kill(pid, signal.SIGKILL)
            rec.mark(t_kill, f"kill -9 {title}", mono=mono_kill, pid=pid, signal="SIGKILL", target=title)
            seen.update(kill_t=t_kill, kill_mono=mono_kill, pid=pid, title=title)
            await pause_for(AFTER_S, mono_kill)
            shot(app, f"{name}.svg")
            rec.flush()
        finally:
            if fut is not None:
                seen["load"] = fut.result(timeout=180)
    seen["api_server_exited"] = not srv.is_running()
    seen["log"] = srv.log_text()
    seen["record"] = str(app.config.record)
    return seen


async def _replayed(record: str) -> list[tuple[float, str, str]]:
    """Replay the recording half a second at a time: (seconds after the kill mark, rule, severity), first showings."""
    _, events = load(record)
    kill = next(e for e in events if e.kind == "mark" and str(e.data.get("label", "")).startswith("kill -9"))
    app = replay_app(record, config=Config())
    out: list[tuple[float, str, str]] = []
    async with app.run_test(size=(120, 40)) as pilot:
        d = app.replay
        d.paused = True
        await pilot.pause()
        while not d.ended:
            d.seek(d.pos + 0.5)
            now = app.monitor.clock.monotonic()
            for a in app.alerts:
                if (a.rule, a.severity) not in {(r, s) for _, r, s in out}:
                    out.append((round(now - kill.mono, 2), a.rule, a.severity))
    return out


async def _check(seen: dict[str, Any]) -> None:
    """What must hold after a kill -9 of the engine (or its worker)."""
    replayed = await _replayed(seen["record"])
    res = seen.get("load")
    summary = None if res is None else {"ok": res.ok, "failed": res.failed, "status": dict(res.status_codes)}
    print(json.dumps({**{k: seen.get(k) for k in ("pid", "title", "kill_mono", "kill_t", "states", "tracker",
                                                 "alerts", "api_server_exited", "record")},
                      "load": summary, "replayed": replayed}, default=repr))
    # quiet while it served
    assert not [a for a in seen["alerts"] if a[0] is None and a[2] in ("warning", "critical")], seen["alerts"]
    # the card leaves UP: ENGINE DEAD while /health says 503, DOWN once nothing listens
    after = [s for rel, s in seen["states"] if rel is not None]
    assert any(s in DEATH_STATES for s in after) and after[-1] in DEATH_STATES, seen["states"]
    assert seen["api_server_exited"], "vLLM's API server did not exit after its engine died"
    # the recording holds the kill and what came after it
    _, events = load(seen["record"])
    marks = [e for e in events if e.kind == "mark" and str(e.data.get("label", "")).startswith("kill -9")]
    assert len(marks) == 1 and marks[0].data["pid"] == seen["pid"]
    assert any(e.kind == "server" and e.at > marks[0].mono + 10 for e in events)
    assert any(e.kind == "log" and e.at > marks[0].mono for e in events)
    # the death is named from the log lines: in a replay of the recording, and live
    assert any(r == "engine_died" and sev == "critical" and 0 <= at <= 10 for at, r, sev in replayed), replayed
    # (live it can be lost: see "What vtop showed" in tests/fixtures/cpu-incidents/ENGINE-DEATH.md)
    died = [a for a in seen["alerts"] if a[1] == "engine_died"]
    assert died and died[0][2] == "critical" and died[0][0] is not None, \
        f"live, the engine_died alert never showed: alerts {seen['alerts']}, startup tracker {seen['tracker']}"


@pytest.fixture
def dead_after(real_vllm: Any) -> Any:
    """The session's server, stopped after the test (its engine was killed)."""
    yield real_vllm
    real_vllm.stop()


@pytest.mark.vllm_leaves_down
async def test_enginecore_killed_under_load(dead_after: Any, tmp_path: Path) -> None:
    seen = await _death(dead_after, tmp_path, "engine-death-enginecore-load", target="engine", load=True)
    res = seen["load"]
    assert res.ok >= 10 and res.failed >= 1, res  # served, then cut off
    await _check(seen)


@pytest.mark.vllm_leaves_down
async def test_worker_killed_under_load(dead_after: Any, tmp_path: Path) -> None:
    seen = await _death(dead_after, tmp_path, "engine-death-worker-load", target="worker", load=True)
    res = seen["load"]
    assert res.ok >= 10 and res.failed >= 1, res
    assert "Worker proc VllmWorker-0 died unexpectedly" in seen["log"], seen["log"][-3000:]
    await _check(seen)


@pytest.mark.vllm_leaves_down
async def test_enginecore_killed_idle(dead_after: Any, tmp_path: Path) -> None:
    seen = await _death(dead_after, tmp_path, "engine-death-idle", target="engine", load=False)
    await _check(seen)
