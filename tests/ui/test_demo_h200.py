"""`vtop demo`: the real H200 recording (vLLM 0.26.0: startup, burst, runaway) played through the app.

The recording is vtop's own (tests/fixtures/h200-demo/README.md); the recipe's event timeline from the
same run (events.jsonl, the GPU machine's clock) says when each phase happened, so these tests check the
replayed screen against an independent account of the run.
"""

from __future__ import annotations

import json
import lzma

import pytest

from tests.helpers.demo_h200 import DEMO, EV, seek_wall
from vtop.config import Config
from vtop.core.requests.log import RequestTracker
from vtop.faces.demo import demo_path
from vtop.ui.replay import replay_app

RUNAWAY_ID = "chatcmpl-9de525035798bf8b"


@pytest.fixture
async def demo():  # type: ignore[no-untyped-def]
    app = replay_app(str(demo_path()), config=Config(), name="demo")
    async with app.run_test(size=(120, 40)) as pilot:
        app.replay.paused = True
        await pilot.pause()
        yield app


async def test_startup_is_tracked_to_ready(demo) -> None:  # type: ignore[no-untyped-def]
    app = demo
    seek_wall(app, EV["health_ready"] + 5)
    snap = app.log_view.snapshot
    assert snap.state == "ready"
    names = [p.phase.value for p in snap.phases]
    for a, b in [("engine_init", "weights"), ("weights", "torch_compile"), ("torch_compile", "cuda_graphs"),
                 ("cuda_graphs", "warmup")]:
        assert names.index(a) < names.index(b)
    graphs = snap.phase(next(p.phase for p in snap.phases if p.phase.value == "cuda_graphs"))
    assert {g.label: (g.n, g.total) for g in graphs.progress} == {"PIECEWISE": (51, 51), "FULL": (51, 51)}
    # the recipe says ready 91.3 s after launch; the tracker's total is from the log's own stamps
    assert snap.total_s == pytest.approx(EV["health_ready"] - EV["vllm_launch"], abs=3.0)
    assert not any(a.severity in ("warning", "critical") for a in app.alerts)


async def test_burst_fills_the_queue_and_raises_nothing(demo) -> None:  # type: ignore[no-untyped-def]
    app = demo
    seek_wall(app, EV["load_b_end"])
    v = next(iter(app.monitor.servers.values())).last_view
    running = [x for _, x in v.series["running"] if x is not None]
    waiting = [x for _, x in v.series["waiting"] if x is not None]
    assert max(running) == 1024  # max_num_seqs on a >= 70 GiB GPU
    assert 500 < max(waiting) < 1500
    assert [a.rule for a in app.alerts if a.severity != "info"] == []


async def test_runaway_is_flagged_within_a_minute_with_the_request_named(demo) -> None:  # type: ignore[no-untyped-def]
    """Default settings: the request without max_tokens is named within 60 s of its start
    (its age from /metrics passes 45 s while the burst's requests are still finishing)."""
    app = demo
    begin = EV["runaway_begin"]
    seek_wall(app, begin + 35)
    assert "runaway" not in [a.rule for a in app.alerts], "flagged before its age could be known"
    line = app.query_one("#requests-line").render()  # at 120 columns: the id whole, in fewer words
    assert RUNAWAY_ID[:20] in str(line) and "(none from client)" in str(line), str(line)
    seek_wall(app, begin + 60)
    runaway = [a for a in app.alerts if a.rule == "runaway"]
    assert runaway, [a.title for a in app.alerts]
    text = " ".join((runaway[0].title, *runaway[0].evidence, *runaway[0].fix))
    assert RUNAWAY_ID in text and "130,917" in text and "131,072" in text
    assert "--override-generation-config" in text
    assert not app.query_one("#alerts").has_class("-empty")  # the panel is on screen
    # the client hung up at +200 s: vLLM aborted it, the alert goes
    seek_wall(app, EV["runaway_end"] + 8)
    assert "runaway" not in [a.rule for a in app.alerts]
    assert app.log_view.inflight == ()


def test_the_real_log_read_from_its_start_leaves_only_the_runaway_in_flight() -> None:
    """What `vtop doctor` does: read the whole log at once. The burst's 1,700 completion requests
    (no finish lines in V1 without --enable-log-outputs) are retired by the log's own
    'Running: 0 reqs' stats line; the chat request without max_tokens stays."""
    lines = lzma.open(DEMO / "serve.log.xz", "rt", errors="replace").read().split("\n")
    abort = next(i for i, ln in enumerate(lines) if "Aborted request" in ln and RUNAWAY_ID in ln)
    t = RequestTracker(max_model_len=131072)
    for ln in lines[:abort]:
        t.feed(ln, 1000.0)
    inflight = t.inflight(1000.0)
    assert [(r.request_id, r.max_tokens, r.no_client_max_tokens) for r in inflight] == [(RUNAWAY_ID, 130917, True)]
    assert 190 <= inflight[0].age_s <= 205 and inflight[0].age_is_upper_bound
    for ln in lines[abort:]:
        t.feed(ln, 1001.0)
    assert t.inflight(1001.0) == [] and t.recent_finished()[0].reason == "aborted"


def test_doctor_on_the_h200_named_the_runaway() -> None:
    """The live `vtop doctor` runs of that session (10 s and 5 s windows, 130 s into the runaway)."""
    txt = (DEMO / "doctor-runaway.txt").read_text()
    assert "Runaway decode on :8000" in txt and RUNAWAY_ID in txt and "130,917" in txt
    rep = json.loads(lzma.open(DEMO / "doctor-runaway.json.xz", "rt").read())
    assert rep["schema"] == "vtop.report/1"  # recorded by the vtop of that session (exit codes before version 2)
    assert [a["rule"] for a in rep["alerts"]][0] == "runaway"


async def test_seeking_back_forgets_what_came_later(demo) -> None:  # type: ignore[no-untyped-def]
    """Back before the runaway began: its request, and the rules' memory of it, are gone."""
    app = demo
    seek_wall(app, EV["runaway_begin"] + 150)
    assert any(r.request_id == RUNAWAY_ID for r in app.log_view.inflight)
    assert any(a.rule == "runaway" for a in app.alerts)
    seek_wall(app, EV["runaway_begin"] - 3)
    assert not any(r.request_id == RUNAWAY_ID for r in app.log_view.inflight)
    assert not any(a.rule == "runaway" for a in app.alerts)
    seek_wall(app, EV["runaway_begin"] + 35)  # and forward again: not flagged before its time
    assert any(r.request_id == RUNAWAY_ID for r in app.log_view.inflight)
    assert not any(a.rule == "runaway" for a in app.alerts)
