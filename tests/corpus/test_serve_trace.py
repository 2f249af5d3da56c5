"""tests/corpus/serve_trace.py: a trace served live answers what was recorded at that second.

The clock is injected (a list the test moves), so nothing here depends on wall time:
each check moves the trace second, calls ``settle()`` and asks.
"""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from tests.corpus.serve_trace import TraceServer, TraceTimeline, start_offset
from tests.helpers.trace_files import write_trace
from vtop.clock import SystemClock
from vtop.sources.http11 import HttpPool
from vtop.sources.vllm import VllmScraper

TRACES = Path(__file__).resolve().parent / "traces"
RUNAWAY = TRACES / "runaway-with-short-traffic"
DEATH = TRACES / "engine-death-enginecore-idle"


class Clock:
    def __init__(self, t: float = 500.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _rows(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def _launch_mono(trace: Path) -> float:
    for line in (trace / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e["what"] == "launch":
            return float(e["mono"])
    raise AssertionError("no launch")


def _get(url: str, path: str) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def _refused(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_trace(
        tmp_path / "tiny",
        [(0.0, None, "refused", None), (1.0, 200, None, "body one\n"), (2.0, 200, None, "body two\n"),
         (3.0, None, "timeout", None), (4.0, None, "refused", None), (5.0, 200, None, "body five\n")],
        [(0.0, 0), (1.0, 6), (2.0, 6), (3.0, 19), (5.0, 24)],
        b"line1\nline2\r\nline3\nline4",
    )


def test_timeline_answers_the_row_at_or_before_each_second(tiny: Path) -> None:
    tl = TraceTimeline(tiny)
    assert tl.end == 6.0 and tl.should_alert_by == 4.0 and tl.began == 2.0
    assert not tl.port_open(0.5) and tl.answer("/metrics", 0.5).kind == "refused"
    assert not tl.port_open(-1.0)  # before the first scrape: nothing listened yet
    a = tl.answer("/metrics", 1.99)
    assert (a.kind, a.status, a.body) == ("ok", 200, b"body one\n")
    assert tl.answer("/metrics?name[]=vllm:x", 2.0).body == b"body two\n"  # no slash: the query is ignored
    assert tl.answer("/metrics", 3.5).kind == "timeout"
    assert tl.answer("/health", 2.5).status == 200
    assert json.loads(tl.answer("/version", 2.0).body) == {"version": "9.9.9"}
    assert json.loads(tl.answer("/v1/models", 2.0).body)["data"][0]["max_model_len"] == 4096
    assert tl.answer("/v1/completions", 2.0).status == 404
    assert [tl.log_size(s) for s in (0.0, 1.5, 2.5, 3.0, 4.9, 5.0)] == [0, 6, 6, 19, 19, 24]
    assert start_offset(tl, before_alert=1.5) == 2.5 and start_offset(tl, start_from=3) == 3.0
    assert start_offset(tl, before_alert=10) == 0.0


def test_server_plays_the_tiny_trace_second_by_second(tiny: Path, tmp_path: Path) -> None:
    clock = Clock()
    log = tmp_path / "out" / "vllm.log"
    with TraceServer(tiny, start_at=1.2, clock=clock, log_path=log, hold_s=0.05) as srv:
        assert srv.offset() == pytest.approx(1.2)
        assert _get(srv.url, "/metrics") == (200, b"body one\n")
        assert log.read_bytes() == b"line1\n"  # the log up to the start, at once
        clock.t += 1.0  # second 2.2
        srv.settle()
        assert _get(srv.url, "/metrics") == (200, b"body two\n")
        assert _get(srv.url, "/health")[0] == 200
        clock.t += 1.0  # 3.2: /metrics times out: held, then dropped without an answer
        srv.settle()
        assert log.read_bytes() == b"line1\nline2\r\nline3\n"
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            _get(srv.url, "/metrics")
        clock.t += 1.0  # 4.2: the port refuses
        srv.settle()
        assert _refused(srv.url)
        clock.t += 1.0  # 5.2: it listens again, on the same port
        srv.settle()
        assert _get(srv.url, "/metrics") == (200, b"body five\n")
        assert log.read_bytes() == b"line1\nline2\r\nline3\nline4"
        assert not srv.ended
        clock.t += 1.0  # 6.2: past the end
        srv.settle()
        assert srv.wait_end(10) and _refused(srv.url)
    assert srv.served["/metrics"] >= 4


def test_a_kept_alive_connection_is_dropped_when_the_port_goes_down(tiny: Path) -> None:
    clock = Clock()
    with TraceServer(tiny, start_at=2.0, clock=clock) as srv:
        host, port = srv.url.removeprefix("http://").split(":")
        c = http.client.HTTPConnection(host, int(port), timeout=10)
        c.request("GET", "/metrics")
        r = c.getresponse()
        assert (r.status, r.read()) == (200, b"body two\n")
        clock.t += 2.5  # 4.5: refused
        srv.settle()
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            c.request("GET", "/metrics")
            c.getresponse().read()
        c.close()
        assert _refused(srv.url)


def test_a_corpus_trace_serves_its_recorded_body_and_log_at_a_given_second(tmp_path: Path) -> None:
    launch = _launch_mono(RUNAWAY)
    rows = [r for r in _rows(RUNAWAY / "metrics.jsonl.gz") if r.get("status") == 200]
    row = rows[len(rows) // 2]
    at = float(row["mono"]) - launch + 0.3  # inside that row's second
    index = [r for r in _rows(RUNAWAY / "log-index.jsonl.gz") if float(r["mono"]) - launch <= at]
    log = gzip.decompress((RUNAWAY / "log.bin.gz").read_bytes())
    clock = Clock()
    with TraceServer(RUNAWAY, start_at=at, clock=clock, log_path=tmp_path / "v.log", shift_time=False) as srv:
        assert srv.end_offset > at
        status, body = _get(srv.url, "/metrics")
        assert status == 200 and body.decode() == row["text"]
        assert (tmp_path / "v.log").read_bytes() == log[:int(index[-1]["size"])]
        models = json.loads(_get(srv.url, "/v1/models")[1])
        assert models["data"][0]["max_model_len"] == 65536
        # vtop's own scraper reads it as the vLLM it was
        poll = asyncio.run(_poll(srv.url))
        assert poll.ok and poll.metrics is not None and poll.version == "0.32.0"
        assert poll.metrics.is_vllm


def test_a_restricted_scrape_gets_only_the_samples_named_as_from_vllm() -> None:
    tl = TraceTimeline(RUNAWAY)
    off = next(o for o, r in zip(tl.metrics.offs, tl.metrics.rows) if r.get("status") == 200) + 30
    full = tl.answer("/metrics", off).body.decode()
    assert tl.answer("/metrics?name[]=vllm:num_requests_running", off).body.decode() == full  # no slash: ignored
    part = tl.answer("/metrics/?name%5B%5D=vllm:num_requests_running&name%5B%5D=vllm:e2e_request_latency_seconds_bucket",
                     off).body.decode()
    samples = {ln.split("{")[0].split()[0] for ln in part.splitlines() if ln and not ln.startswith("#")}
    assert samples == {"vllm:num_requests_running", "vllm:e2e_request_latency_seconds_bucket"}
    assert "# TYPE vllm:num_requests_running gauge" in part and "_sum" not in part
    assert 0 < len(part) < len(full) / 2
    # vtop's scraper then reads histograms only every few polls, as from the real server
    with TraceServer(tl, start_at=off, clock=Clock()) as srv:
        polls, sc = asyncio.run(_polls(srv.url, 3))
    assert all(p.ok for p in polls)
    assert sc.restricted_ok is True and sc.restricted_polls == 2
    assert all(p.body_bytes < polls[0].body_bytes / 2 for p in polls[1:])
    # the last poll's histograms were carried over from an earlier read, with their age
    assert polls[2].metrics is not None and polls[2].metrics.histograms_age_s > 0


def test_vtop_sees_the_port_refused_while_the_trace_was_starting_and_after_the_death() -> None:
    tl = TraceTimeline(DEATH)
    refused = [o for o in tl.metrics.offs if not tl.port_open(o)]
    assert refused and refused[0] < 5  # the trace starts with the port refused
    clock = Clock()
    with TraceServer(tl, start_at=refused[0] + 0.1, clock=clock) as srv:
        poll = asyncio.run(_poll(srv.url))
        assert not poll.ok and poll.error == "refused", poll.message
        ready = next(o for o in tl.metrics.offs if tl.port_open(o))
        clock.t += ready - refused[0] + 0.1
        srv.settle()
        assert asyncio.run(_poll(srv.url)).ok
        dead = next(o for o in tl.metrics.offs if o > ready and not tl.port_open(o))
        clock.t += dead - ready + 0.1
        srv.settle()
        assert asyncio.run(_poll(srv.url)).error == "refused"


async def _polls(url: str, n: int) -> tuple[list[Any], VllmScraper]:
    pool = HttpPool()
    try:
        sc = VllmScraper(url, client=pool, clock=SystemClock())
        return [await sc.poll() for _ in range(n)], sc
    finally:
        await pool.aclose()


async def _poll(url: str) -> Any:
    pool = HttpPool()
    try:
        return await VllmScraper(url, client=pool, clock=SystemClock()).poll()
    finally:
        await pool.aclose()


def test_the_play_is_moved_to_now_stamps_and_start_time_alike(tmp_path: Path) -> None:
    """A live incident's log carries the time of now: played as recorded (hours ago), vtop's log
    history took every stats line for hours old (live doctor named 12 of 26; in-process 25)."""
    import re

    launch = _launch_mono(RUNAWAY)
    rows = [r for r in _rows(RUNAWAY / "metrics.jsonl.gz") if r.get("status") == 200]
    at = float(rows[len(rows) // 2]["mono"]) - launch + 0.3
    index = [r for r in _rows(RUNAWAY / "log-index.jsonl.gz") if float(r["mono"]) - launch <= at]
    log = gzip.decompress((RUNAWAY / "log.bin.gz").read_bytes())
    now = 1_900_000_000.0  # an injected wall clock: 2030
    with TraceServer(RUNAWAY, start_at=at, clock=Clock(), log_path=tmp_path / "v.log", wall=lambda: now) as srv:
        played = (tmp_path / "v.log").read_bytes()
        assert len(played) == int(index[-1]["size"])  # the recorded sizes still hold
        assert played != log[:len(played)]
        tl = srv.timeline
        want = time.strftime("%m-%d %H:%M", time.localtime(now))
        stamps = re.findall(rb"(?:INFO|WARNING|ERROR) (\d\d-\d\d \d\d:\d\d):\d\d \[", played)
        assert stamps and stamps[-1].decode() <= want and len(set(stamps)) > 1
        assert abs(srv.shift_s - (now - tl.origin_t - at)) <= 0.5
    # process_start_time_seconds (where a trace kept it) moves by the same seconds
    text = "process_start_time_seconds 1796180000.5\nvllm:num_requests_running 1.0\n"
    tl2 = TraceTimeline(RUNAWAY)
    row = {"status": 200, "text": text, "mono": 0.0}
    tl2.metrics = type(tl2.metrics)([(0.0, row)])
    tl2.origin_t = tl2.origin_t  # unchanged
    body = tl2.answer("/metrics", 0.5, shift_s=100.0).body.decode()
    assert "process_start_time_seconds 1796180100.5" in body and "vllm:num_requests_running 1.0" in body


def test_the_backlog_keeps_the_age_of_its_last_write(tiny: Path, tmp_path: Path) -> None:
    """The log's modification time is when its last byte was written in the recording, moved to
    now: a backlog written at once at the start of a play must not look freshly written (a tailer
    attaching to a log silent since a tqdm frame reads how long from it: graph capture)."""
    clock = Clock()
    now = 1_900_000_000.0
    log = tmp_path / "v.log"
    # the tiny trace's log reached 19 bytes at second 3 and 24 at second 5; started at 4.5 its
    # backlog is 19 bytes, last written at second 3: 1.5 s before now
    with TraceServer(tiny, start_at=4.5, clock=clock, log_path=log, wall=lambda: now) as srv:
        assert log.stat().st_size == 19
        assert abs(log.stat().st_mtime - (now - 1.5)) < 0.01
        assert srv.timeline.log_written_at(19) == 3.0 and srv.timeline.log_written_at(25) is None
    # a corpus trace silent for a minute before the start: its file says so
    tl = TraceTimeline(TRACES / "h200-startup-stall-graph-capture")
    sab = tl.should_alert_by
    assert sab is not None
    start = sab - 17.0
    size = tl.log_size(start)
    wrote = tl.log_written_at(size)
    assert wrote is not None and start - wrote > 60
    with TraceServer(tl, start_at=start, clock=Clock(), log_path=tmp_path / "g.log", wall=lambda: now):
        assert abs((now - (tmp_path / "g.log").stat().st_mtime) - (start - wrote)) < 0.01
