"""The server tracker replaying the real H200 0.26.0 timeline (startup with
the port refused, a 1500-request burst, a runaway request, shutdown), plus
synthetic restarts, staleness, engine death and a non-vLLM answer."""

from __future__ import annotations

import json
import lzma
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from vtop.clock import FakeClock
from vtop.core.server import UNKNOWN, ServerTracker, ServerView
from vtop.sources.discovery import ProcRecord, ServerProcess, discover_servers
from vtop.sources.vllm import ServerPoll, poll_from_body, poll_from_error

FIX = Path(__file__).parent.parent / "fixtures" / "vllm"
URL = "http://127.0.0.1:8000"
LAUNCH = 1796032448.9186
MONO0 = 1000.0  # FakeClock's start; mono = wall - LAUNCH + MONO0


def timeline() -> list[dict[str, Any]]:
    with lzma.open(FIX / "h200-0.26.0-metrics-timeline.jsonl.xz", "rt") as f:
        return [json.loads(line) for line in f]


TIMELINE = timeline()
IDLE = (FIX / "h200-0.26.0-metrics-idle.txt").read_text()


def proc(create_time: float = LAUNCH, pid: int = 982) -> ServerProcess:
    cmd = ("/tmp/site/bin/vllm", "serve", "/tmp/tiny", "--host", "127.0.0.1", "--port", "8000",
           "--max-model-len", "32768", "--gpu-memory-utilization", "0.5")
    return discover_servers([ProcRecord(pid, 1, "vllm", cmd, create_time)])[0]


def to_poll(row: dict[str, Any], mono: float, *, health: int | None = 200) -> ServerPoll:
    if "err" in row:  # httpx ConnectError on loopback while the port is closed
        return poll_from_error(URL, "refused", t=row["t"], mono=mono)
    return poll_from_body(URL, row["text"], t=row["t"], mono=mono, latency_s=row["dt"], status=row["status"],
                          health=health, health_polled=health is not None)


def replay(tracker: ServerTracker, clock: FakeClock, rows: list[dict[str, Any]], process: Any,
           t_offset: float = 0.0) -> list[tuple[float, ServerView]]:
    out = []
    for row in rows:
        mono = row["t"] + t_offset - LAUNCH + MONO0
        clock.advance(max(0.0, mono - clock.monotonic()))
        tracker.feed(to_poll(dict(row, t=row["t"] + t_offset), mono), process=process)
        out.append((mono - MONO0, tracker.view()))
    return out


def states(views: list[tuple[float, ServerView]]) -> list[str]:
    seq: list[str] = []
    for _, v in views:
        if not seq or seq[-1] != v.state:
            seq.append(v.state)
    return seq


def at(views: list[tuple[float, ServerView]], t: float) -> ServerView:
    return min(views, key=lambda tv: abs(tv[0] - t))[1]


# --- the real timeline ------------------------------------------------------------------


def test_replay_with_process_starting_up_then_down() -> None:
    clock = FakeClock()
    tr = ServerTracker(URL, clock=clock)
    views = replay(tr, clock, TIMELINE[:-2], proc())
    assert states(views) == ["starting", "up"]
    v0 = views[10][1]
    assert "starting" in v0.message and "982" in v0.message and "refuses" in v0.message
    assert v0.gen_tps is None and v0.metrics is None
    # the series are live objects: while the port refused, only gaps went in
    assert views[-1][1].series["running"].values()[:86] == [None] * 86
    # the end of the recording: the server stopped and its process is gone
    for row in TIMELINE[-2:]:
        mono = row["t"] - LAUNCH + MONO0
        clock.advance(mono - clock.monotonic())
        tr.feed(to_poll(row, mono), process=None)
    v = tr.view()
    assert v.state == "down" and "no vLLM process" in v.message and "last good data" in v.message
    assert v.series["gen_tps"].latest() is None  # a gap, not a zero
    assert v.gen_tps is None


def test_replay_without_process_is_down_then_up() -> None:
    clock = FakeClock()
    tr = ServerTracker(URL, clock=clock)
    views = replay(tr, clock, TIMELINE, None)
    assert states(views) == ["down", "up", "down"]
    assert "down for" in views[5][1].message


def test_unknown_process_says_it_may_be_starting() -> None:
    clock = FakeClock()
    tr = ServerTracker(URL, clock=clock)
    views = replay(tr, clock, TIMELINE[:5], UNKNOWN)
    assert views[-1][1].state == "down" and "may also be starting" in views[-1][1].message


def test_replay_numbers_burst_and_runaway() -> None:
    clock = FakeClock()
    tr = ServerTracker(URL, clock=clock)
    views = replay(tr, clock, TIMELINE, proc())
    running = [v.series["running"] for _, v in views][-1]
    vals = [x for x in running.values() if x is not None]
    assert max(vals) == 1024
    waiting = [x for x in views[-1][1].series["waiting"].values() if x is not None]
    assert max(waiting) == 708
    # gaps while the port was closed: None, never 0
    assert running.values()[:86] == [None] * 86 and running.values()[86] == 0
    # the runaway request (one request, t = 126..196 s): ~460 tok/s over the 60 s window
    v = at(views, 190.1)
    assert v.state == "up"
    assert v.gen_tps is not None and 430 < v.gen_tps < 490, v.gen_tps
    assert v.metrics is not None and v.metrics.running == 1
    assert v.preemptions_ps == 0
    # the burst: thousands of tok/s, 1500 requests finished by length within the window
    b = at(views, 116.1)
    assert b.gen_tps is not None and b.gen_tps > 5000
    assert b.finished is not None and b.finished["length"] == 1700 - 0  # window reaches back to idle
    assert b.e2e.p50 is not None and b.ttft.p99 is not None
    assert b.total is not None and b.engines[0].label == "0"
    assert b.model_id == "/tmp/tiny" and b.max_model_len == 32768  # from metrics/process: no /v1/models here
    # the sparkline rate follows the burst (short window), the view rate is the 60 s average
    spark = [x for x in b.series["gen_tps"].values() if x is not None]
    assert max(spark) > 20000
    # kv is a percentage
    assert all(0 <= x <= 100 for x in b.series["kv_pct"].values() if x is not None)
    assert max(x for x in b.series["kv_pct"].values() if x is not None) > 5


def test_counter_reset_gives_restarted_and_no_negative_rate() -> None:
    clock = FakeClock()
    tr = ServerTracker(URL, clock=clock, restarted_for_s=30.0)
    rows = [r for r in TIMELINE if "err" not in r][:35]  # idle, first batch, burst
    replay(tr, clock, rows, UNKNOWN)
    assert tr.view().state == "up"
    t = rows[-1]["t"]
    splice = [{"t": t + i, "status": 200, "dt": 0.01, "text": IDLE} for i in range(1, 50)]
    views = replay(tr, clock, splice, UNKNOWN)
    v = views[0][1]
    assert v.state == "restarted" and "counters went back" in v.message
    assert tr.restarts == 1
    for _, vv in views:
        for x in (vv.gen_tps, vv.prompt_tps, vv.preemptions_ps):
            assert x is None or x >= 0
        assert all(x is None or x >= 0 for x in vv.series["gen_tps"].values())
    assert views[1][1].gen_tps == 0  # re-baselined on the new process
    assert views[-1][1].state == "up" and "restarted 1x" in views[-1][1].message


def test_new_process_create_time_is_a_restart() -> None:
    clock = FakeClock()
    tr = ServerTracker(URL, clock=clock)
    rows = [r for r in TIMELINE if "err" not in r][:10]
    replay(tr, clock, rows, proc())
    assert tr.view().state == "up"
    # the process is replaced (same pid reused, new create_time): port refuses while it starts
    t = rows[-1]["t"]
    new = proc(create_time=LAUNCH + 500)
    views = replay(tr, clock, [{"t": t + 1, "err": "ConnectError"}], new)
    assert views[-1][1].state == "starting" and "restarting" in views[-1][1].message
    views = replay(tr, clock, [dict(rows[-1], t=t + 2)], new)  # same counters: only the process says so
    assert views[-1][1].state == "restarted" and "new vLLM process" in views[-1][1].message


def test_stale_slow_answers_timeouts_and_missing_polls() -> None:
    clock = FakeClock()
    tr = ServerTracker(URL, clock=clock, stale_after_s=3.0)
    rows = [r for r in TIMELINE if "err" not in r][:10]
    replay(tr, clock, rows, UNKNOWN)
    assert tr.view().state == "up"
    # slow answer
    t = rows[-1]["t"]
    replay(tr, clock, [dict(rows[-1], t=t + 4, dt=4.2)], UNKNOWN)
    v = tr.view()
    assert v.state == "stale" and "4.2 s" in v.message
    replay(tr, clock, [dict(rows[-1], t=t + 5)], UNKNOWN)
    assert tr.view().state == "up"
    # a timeout keeps the old numbers but marks them
    mono = t + 6 - LAUNCH + MONO0
    clock.advance(mono - clock.monotonic())
    tr.feed(poll_from_error(URL, "timeout", t=t + 6, mono=mono, message="no answer from x within 2.0 s"))
    v = tr.view()
    assert v.state == "stale" and "no answer" in v.message and v.metrics is not None
    assert v.series["running"].latest() is None
    # polls stop arriving at all (a starved monitor): stale after 3 intervals
    replay(tr, clock, [dict(rows[-1], t=t + 7)], UNKNOWN)
    assert tr.view().state == "up"
    clock.advance(2.0)
    assert tr.view().state == "up"
    clock.advance(2.5)
    v = tr.view()
    assert v.state == "stale" and "no fresh data" in v.message
    assert v.since == pytest.approx(t + 7 - LAUNCH + MONO0)


def test_engine_dead_while_metrics_answer() -> None:
    clock = FakeClock()
    tr = ServerTracker(URL, clock=clock)
    rows = [r for r in TIMELINE if "err" not in r][:6]
    replay(tr, clock, rows, proc())
    t = rows[-1]["t"]
    mono = t + 1 - LAUNCH + MONO0
    clock.advance(mono - clock.monotonic())
    tr.feed(to_poll(dict(rows[-1], t=t + 1), mono, health=503), process=proc())
    v = tr.view()
    assert v.state == "engine dead" and "503" in v.message and v.health == 503
    # a later poll without a /health result keeps it dead; /metrics 500 too
    clock.advance(1)
    tr.feed(to_poll(dict(rows[-1], t=t + 2), mono + 1, health=None), process=proc())
    assert tr.view().state == "engine dead"
    clock.advance(1)
    tr.feed(poll_from_body(URL, b"Internal Server Error", t=t + 3, mono=mono + 2, status=500), process=proc())
    assert tr.view().state == "engine dead"
    # /health back to 200: up again
    clock.advance(1)
    tr.feed(to_poll(dict(rows[-1], t=t + 4), mono + 3, health=200), process=proc())
    assert tr.view().state == "up"


def test_not_vllm_answers() -> None:
    clock = FakeClock()
    tr = ServerTracker(URL, clock=clock)
    tr.feed(poll_from_body(URL, b"<html>login</html>", t=1.0, mono=1000.0, latency_s=0.01), process=UNKNOWN)
    v = tr.view()
    assert v.state == "not vllm" and "HTML" in v.message
    clock.advance(1)
    tr.feed(poll_from_body(URL, b"", t=2.0, mono=1001.0, status=404), process=UNKNOWN)
    assert tr.view().state == "not vllm"
    assert tr.view().series["running"].values() == [None, None]


def test_data_parallel_rows() -> None:
    text = (FIX / "written" / "v1-0.33-dp2-metrics.txt").read_text()
    clock = FakeClock()
    tr = ServerTracker(URL, clock=clock)
    tr.feed(poll_from_body(URL, text, t=1.0, mono=1000.0, latency_s=0.01))
    v = tr.view()
    assert [e.label for e in v.engines] == ["0", "1"]
    assert v.total is not None and v.total.running == 78 and v.total.waiting == 3
    assert v.total.kv_pct is not None and math.isclose(v.total.kv_pct, 37.5)
    assert sum(e.running or 0 for e in v.engines) == v.total.running


def test_models_and_version_are_kept_between_info_polls() -> None:
    from vtop.sources.vllm import ModelsInfo

    clock = FakeClock()
    tr = ServerTracker(URL, clock=clock)
    p = poll_from_body(URL, IDLE, t=1.0, mono=1000.0, latency_s=0.01,
                       models=ModelsInfo(("served",), 4096, "/tmp/tiny"), version="0.26.0", info_polled=True)
    tr.feed(p)
    clock.advance(1)
    tr.feed(replace(p, t=2.0, mono=1001.0, models=None, version=None, info_polled=False))
    v = tr.view()
    assert (v.model_id, v.max_model_len, v.version) == ("served", 4096, "0.26.0")


def test_out_of_order_poll_is_ignored() -> None:
    clock = FakeClock(start=1010.0)
    tr = ServerTracker(URL, clock=clock)
    tr.feed(poll_from_body(URL, IDLE, t=10.0, mono=1010.0, latency_s=0.01))
    tr.feed(poll_from_error(URL, "refused", t=5.0, mono=1005.0), process=None)
    assert tr.view().state == "up"


def test_histograms_carried_over_count_once_at_the_time_they_were_read() -> None:
    """A scraper reads the histograms every 5th poll and carries them over between
    (vtop.sources.vllm.with_histograms, with their age). Fed that, the tracker must give the
    latencies of a tracker that got the histograms only when they were read: each filed
    once, at its read time (span, count and quantiles), never the copy at the poll's time."""
    from vtop.sources.metrics_text import HIST_ATTRS
    from vtop.sources.vllm import with_histograms

    clock_a, clock_b = FakeClock(), FakeClock()
    a, b = ServerTracker(URL, clock=clock_a), ServerTracker(URL, clock=clock_b)
    last: tuple[Any, float] | None = None
    compared = 0
    for i, row in enumerate(TIMELINE):
        mono = row["t"] - LAUNCH + MONO0
        for c in (clock_a, clock_b):
            c.advance(max(0.0, mono - c.monotonic()))
        p = to_poll(row, mono)
        pa = pb = p
        m = p.metrics
        if p.ok and m is not None:
            if last is None or i % 5 == 0:
                last = (m, mono)
            else:
                no_hist = replace(m, **{h: None for h in HIST_ATTRS},
                                  engines=tuple(replace(e, **{h: None for h in HIST_ATTRS}) for e in m.engines))
                pa = replace(p, metrics=no_hist)
                pb = replace(p, metrics=with_histograms(no_hist, last[0], mono - last[1]))
                assert pb.metrics is not None and pb.metrics.histograms_age_s > 0
        a.feed(pa, process=proc())
        b.feed(pb, process=proc())
        va, vb = a.view(), b.view()
        assert (va.ttft, va.itl, va.e2e) == (vb.ttft, vb.itl, vb.e2e), (i, va.ttft, vb.ttft)
        compared += va.e2e.p50 is not None
    assert compared > 30  # the burst's latencies were there to compare
