"""Real incidents on a real vLLM server (CPU build), with vtop watching as the app.

* a runaway: a chat request without max_tokens and with ``ignore_eos`` on a server
  with a long ``--max-model-len``: the request shows in the requests view with a
  growing age and a max_tokens near max_model_len, and the runaway alert names it
  once the (test-short) threshold passes; it clears when the client hangs up;
* an engine stall: SIGSTOP on the EngineCore while requests run: flagged, and
  cleared on SIGCONT;
* a normal bounded load: nothing raised;
* ``vtop --once --json`` and ``vtop doctor --json`` against the real server,
  validated against the schema;
* record and replay: the replayed screen shows the live numbers at the same times.

``VTOP_RECORD_DIR=DIR`` keeps vtop's recordings of the incidents (committed under
``tests/fixtures/cpu-incidents/`` for the offline tests); ``VTOP_SCREENSHOTS=DIR``
keeps SVGs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.real import SHOTS, Runaway, Watch, app_for, shot
from vtop.config import Config
from vtop.core.rules import Thresholds

pytestmark = pytest.mark.real

SCHEMA = Path(__file__).parents[2] / "vtop" / "schema" / "report-v2.schema.json"


@pytest.mark.vllm_server(max_model_len=65536)
async def test_runaway_is_named_with_its_max_tokens_and_flagged(real_vllm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    srv = real_vllm
    # 15 s threshold; max_model_len 65,536: the CPU server decodes this request at 220-300 tok/s+, so it
    # runs for minutes unless the test hangs up. (With 8,192 it ended by itself after 27-37 s on a busy
    # box, and once before the alert on a quiet one: a clean-clone CI run saw finish_reason 'length'.)
    app = app_for(srv, tmp_path, "runaway", runaway_threshold=15.0)
    async with app.run_test(size=(120, 40)) as pilot:
        w = Watch(app, srv.url)
        await w.until(pilot, lambda: (v := w.view()) is not None and v.state == "up", 60, "the server up")
        with Runaway(srv) as ra:
            await w.until(pilot, lambda: ra.id is not None and app.log_view is not None and
                          any(r.request_id == ra.id for r in app.log_view.inflight), 60,
                          "the runaway in the requests view")
            req = next(r for r in app.log_view.inflight if r.request_id == ra.id)
            # vLLM filled max_tokens in: max_model_len minus the prompt
            mml = srv.max_model_len
            assert mml == 65536 and mml - 200 < req.max_tokens < mml and req.no_client_max_tokens
            age1 = req.age_s
            await pilot.pause(3.0)
            req2 = next(r for r in app.log_view.inflight if r.request_id == ra.id)
            assert req2.age_s >= age1 + 2.0, "its age grows"
            # the line under the cards, in the words that fit the screen's width (at 120: "(none from client)")
            line = str(app.query_one("#requests-line").render())
            assert "max_tokens from client" in line or "(none from client)" in line or "(client: unset)" in line, line
            assert not [a for a in app.alerts if a.rule == "runaway"] or req2.age_s >= 15.0, \
                "flagged before the 15 s threshold"
            await w.until(pilot, lambda: any(a.rule == "runaway" for a in app.alerts), 60, "the runaway alert")
            assert ra.finish is None and ra.error is None, (ra.finish, ra.error)
            alert = next(a for a in app.alerts if a.rule == "runaway")
            text = " ".join((alert.title, *alert.evidence, *alert.fix))
            assert ra.id in text and f"{req.max_tokens:,}" in text and f"{mml:,}" in text
            assert "max_tokens" in alert.fix[0] and "--override-generation-config" in text
            # The requests view first, then the screenshot of the alerts (slow on a busy box).
            await pilot.press("r")
            await w.until(pilot, lambda: app.screen.query_one("#req-table").row_count >= 1, 10,
                          "the runaway in the requests table")
            if SHOTS:
                app.save_screenshot(str(Path(SHOTS) / "requests-cpu-real-runaway.svg"))
            await pilot.press("escape")
            shot(app, "alerts-cpu-real-runaway.svg")
            ra.stop()  # the client hangs up; vLLM aborts the request
            await w.until(pilot, lambda: not any(a.rule == "runaway" for a in app.alerts), 30,
                          "the alert to clear after the client hung up")
            assert not any(r.request_id == ra.id for r in app.log_view.inflight)


async def test_engine_stall_is_flagged_and_clears_on_sigcont(real_vllm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    srv = real_vllm
    app = app_for(srv, tmp_path, "engine-stall")
    app.diagnoser.thresholds = Thresholds(engine_stall_s=8.0)
    async with app.run_test(size=(120, 40)) as pilot:
        w = Watch(app, srv.url)
        await w.until(pilot, lambda: (v := w.view()) is not None and v.state == "up", 60, "the server up")
        fut = srv.start_load(n=4, concurrency=4, max_tokens=1500)
        try:
            await w.until(pilot, lambda: (v := w.view()) is not None and v.total is not None and (v.total.running or 0) >= 1,
                          30, "requests running")
            srv.sigstop_engine()
            try:
                await w.until(pilot, lambda: any(a.rule == "engine_stall" for a in app.alerts), 40, "the stall alert")
                a = next(a for a in app.alerts if a.rule == "engine_stall")
                assert a.severity == "critical" and "py-spy" in " ".join(a.fix).lower()
                shot(app, "alerts-cpu-real-engine-stall.svg")
            finally:
                srv.sigcont_engine()
            await w.until(pilot, lambda: not any(a.rule == "engine_stall" for a in app.alerts), 30,
                          "the alert to clear after SIGCONT")
        finally:
            fut.result(timeout=300)


async def test_a_normal_bounded_load_raises_nothing(real_vllm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    srv = real_vllm
    app = app_for(srv, tmp_path, "normal-load", runaway_threshold=30.0)
    app.diagnoser.thresholds = Thresholds(runaway_s=30.0, engine_stall_s=8.0)
    seen: set[tuple[str, str]] = set()
    async with app.run_test(size=(120, 40)) as pilot:
        w = Watch(app, srv.url)
        await w.until(pilot, lambda: (v := w.view()) is not None and v.state == "up", 60, "the server up")
        fut = srv.start_load(n=48, concurrency=8, max_tokens=64)
        t0 = time.monotonic()
        in_flight: list[int] = []
        while not fut.done() and time.monotonic() - t0 < 240:
            seen |= {(a.rule, a.severity) for a in app.alerts}
            w.sample()
            in_flight.append(len(app.log_view.inflight) if app.log_view else 0)
            await pilot.pause(0.25)
        res = fut.result(timeout=10)
        for _ in range(8):  # and a few seconds after
            seen |= {(a.rule, a.severity) for a in app.alerts}
            await pilot.pause(0.5)
        # normal requests come and go in the requests view
        assert max(in_flight) >= 2, in_flight
        assert app.log_view.inflight == (), [r.request_id for r in app.log_view.inflight]
        assert len(app.log_view.recent_finished) >= 8
    assert res.ok == 48
    assert max(s["running"] or 0 for s in w.samples) >= 2, "the load really ran"
    assert not [x for x in seen if x[1] in ("warning", "critical")], seen


def _run_vtop(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vtop", *args], capture_output=True, text=True, timeout=timeout)


def test_once_json_and_doctor_against_the_real_server(real_vllm) -> None:  # type: ignore[no-untyped-def]
    jsonschema = pytest.importorskip("jsonschema")
    srv = real_vllm
    schema = json.loads(SCHEMA.read_text())
    r = _run_vtop(["--once", "--json", srv.url, "--log", str(srv.log_path), "--no-gpu"])
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    jsonschema.validate(rep, schema)
    s = rep["servers"][0]
    assert s["state"] == "up" and s["model"] == srv.model and s["max_model_len"] == srv.max_model_len
    assert rep["startup"]["state"] == "ready" and rep["exit_code"] == 0
    r = _run_vtop(["doctor", srv.url, "--log", str(srv.log_path), "--no-gpu", "--window", "3s", "--json"])
    assert r.returncode == 0, r.stderr
    jsonschema.validate(json.loads(r.stdout), schema)
    txt = _run_vtop(["doctor", srv.url, "--no-gpu", "--window", "2s"]).stdout
    assert "vLLM " + srv.url in txt and "UP" in txt


async def test_recorded_real_session_replays_to_the_same_numbers(real_vllm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from tests.helpers.screen_text import card_text
    from vtop.ui.replay import replay_app

    srv = real_vllm
    app = app_for(srv, tmp_path, "round-trip")
    seen: list[tuple[float, list[str]]] = []
    async with app.run_test(size=(120, 40)) as pilot:
        def on_view(entry: Any, view: Any) -> None:
            if view.metrics is not None:
                now = app.monitor.clock.monotonic()
                seen.append((now, card_text(app.cards[entry.url], view, now)))

        app.monitor.on_server_view.append(on_view)
        fut = srv.start_load(n=40, concurrency=4, max_tokens=48)
        t0 = time.monotonic()
        while not fut.done() and time.monotonic() - t0 < 120:
            await pilot.pause(0.25)
        fut.result(timeout=10)
        await pilot.pause(3.0)
    rec = Path(app.config.record)  # type: ignore[arg-type]
    assert len(seen) >= 8, f"only {len(seen)} polls with metrics"
    busy = [lines for _, lines in seen if not lines[0].split()[1] == "0"]
    assert busy, "the load showed on the card"
    rapp = replay_app(str(rec), config=Config())
    async with rapp.run_test(size=(120, 40)) as pilot:
        rapp.replay.paused = True
        await pilot.pause()
        for mono, lines in seen:
            rapp.replay.seek(mono)
            e = rapp.monitor.servers[srv.url]
            assert card_text(app.cards[e.url], e.last_view, mono) == lines, f"at {mono:.3f}"
