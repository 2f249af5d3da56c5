"""vtop/core/loghistory.py: the stats lines of every vLLM version, their clock, and what the
rules ask of them."""

from __future__ import annotations

import calendar

from vtop.core.loghistory import LogHistory, parse_stats
from vtop.core.phases import parse_line

WALL = float(calendar.timegm((2026, 12, 2, 10, 0, 0, 0, 0, 0)))


def test_stats_line_forms_of_every_version() -> None:
    v0 = ("Avg prompt throughput: 2.4 tokens/s, Avg generation throughput: 0.2 tokens/s, Running: 1 reqs, "
          "Swapped: 0 reqs, Pending: 3 reqs, GPU KV cache usage: 12.5%, CPU KV cache usage: 0.0%.")
    assert parse_stats(v0) == ("-", 2.4, 0.2, 1, 3, 12.5, None)
    v1 = ("Engine 000: Avg prompt throughput: 10.8 tokens/s, Avg generation throughput: 34.3 tokens/s, Running: 0 reqs, "
          "Waiting: 0 reqs, GPU KV cache usage: 0.1%, Prefix cache hit rate: 85.7%")
    assert parse_stats(v1) == ("000", 10.8, 34.3, 0, 0, 0.1, None)
    v26 = ("Engine 001: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 900.0 tokens/s, Running: 64 reqs, "
           "Waiting: 12 reqs, Deferred: 0 reqs, Preemptions: 7, GPU KV cache usage: 99.1%, Prefix cache hit rate: 1.0%")
    assert parse_stats(v26) == ("001", 0.0, 900.0, 64, 12, 99.1, 7)
    v33 = ("Engine 000: Avg prompt throughput: 5.0 tokens/s, Avg generation throughput: 8.0 tokens/s, Running: 2 reqs, "
           "Waiting: 0 reqs, KV fetch: 0 waiting to start, 1 in progress, 0 completed waiting, CPU KV cache usage: 3.2%")
    assert parse_stats(v33) == ("000", 5.0, 8.0, 2, 0, 3.2, None)
    agg = ("2 Engines Aggregated: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, "
           "Running: 3 reqs, Waiting: 1 reqs, GPU KV cache usage: 50.0%")
    assert parse_stats(agg) == ("agg2", 1.0, 2.0, 3, 1, 50.0, None)
    assert parse_stats("Received request cmpl-1: params: SamplingParams(max_tokens=5)") is None
    assert parse_stats("Avg prompt throughput: garbage") is None


def _line(t: float, body: str, offset: float = 0.0, tag: str = "(APIServer pid=7) ") -> str:
    import time

    return f"{tag}INFO {time.strftime('%m-%d %H:%M:%S', time.gmtime(t + offset))} [loggers.py:1] {body}"


def _stats(running: int, gen: float, prompt: float = 0.0, kv: float = 1.0, waiting: int = 0) -> str:
    return (f"Engine 000: Avg prompt throughput: {prompt} tokens/s, Avg generation throughput: {gen} tokens/s, "
            f"Running: {running} reqs, Waiting: {waiting} reqs, GPU KV cache usage: {kv}%")


def _feed(h: LogHistory, lines: list[tuple[float, str]], read_at: float, offset: float = 0.0) -> None:
    for t, body in lines:
        h.feed(parse_line(_line(t, body, offset)), read_at)


def test_the_stamp_clock_is_found_for_utc_local_and_a_container() -> None:
    lines = [(WALL - 30 + 10 * i, _stats(1, 50.0)) for i in range(3)]  # last one 10 s before it is read
    # UTC box, read live: offset 0, points on the monotonic clock
    h = LogHistory(local_offset=lambda w: 0.0)
    _feed(h, lines, WALL)
    v = h.snapshot(500.0, WALL)
    assert v.offset_s == 0.0 and [round(p.mono - 500.0, 1) for p in v.stats] == [-29.5, -19.5, -9.5]
    # a box at UTC+1 stamping local time
    h = LogHistory(local_offset=lambda w: 3600.0)
    _feed(h, lines, WALL, offset=3600.0)
    assert h.snapshot(500.0, WALL).offset_s == 3600.0
    # vtop at UTC-5, the server in a container on UTC: the local offset would put the lines in the future
    h = LogHistory(local_offset=lambda w: -18000.0)
    _feed(h, lines, WALL, offset=0.0)
    assert h.snapshot(500.0, WALL).offset_s == 0.0
    # the server's box at UTC+9, vtop elsewhere: a whole time-zone offset near the bound is taken for it
    # (issue 38 item 6; before, the bound itself, 10 s short)
    h = LogHistory(local_offset=lambda w: 0.0)
    _feed(h, lines, WALL, offset=9 * 3600.0)
    assert h.snapshot(500.0, WALL).offset_s == 9 * 3600.0
    h = LogHistory(local_offset=lambda w: 0.0)
    _feed(h, lines, WALL, offset=30.0)  # the server's clock 30 s ahead
    v = h.snapshot(500.0, WALL)
    assert v.offset_s == 20.0 and v.stats[-1].mono == 500.0  # not 15 min in the past
    assert h.backlog_lag(500.0, WALL) == 0.0


def test_quiet_since_an_engine_that_stopped() -> None:
    h = LogHistory(local_offset=lambda w: 0.0)
    t0 = WALL - 60
    _feed(h, [(t0, _stats(4, 900.0, 200.0)), (t0 + 10, _stats(4, 27.0, 7.0)), (t0 + 20, _stats(4, 0.0))], WALL)
    v = h.snapshot(1000.0, WALL)
    q = v.quiet_since(1000.0)
    assert q is not None and abs(q[0] - (1000.0 - 50 + 0.5)) < 0.01 and q[1] == 4  # since the 27 tok/s line
    assert v.stalled_since(1000.0, 1000.0 - 15) is not None
    # a line with tokens after it: moving again
    _feed(h, [(t0 + 30, _stats(4, 800.0, 100.0))], WALL)
    assert h.snapshot(1000.0, WALL).quiet_since(1000.0) is None
    # an idle server's last lines (nothing running) are no stall
    h = LogHistory(local_offset=lambda w: 0.0)
    _feed(h, [(t0, _stats(1, 5.0)), (t0 + 10, _stats(0, 0.0))], WALL)
    assert h.snapshot(1000.0, WALL).quiet_since(1000.0) is None


def test_no_new_request_since_and_busy_through() -> None:
    h = LogHistory(local_offset=lambda w: 0.0)
    t0 = WALL - 70
    lines = [(t0, _stats(1, 200.0, 2.0))] + [(t0 + 10 * k, _stats(1, 150.0, 0.0)) for k in range(1, 7)]
    _feed(h, lines, WALL)
    v = h.snapshot(1000.0, WALL)
    nn = v.no_new_request_since()
    assert nn is not None and abs(nn[0] - (1000.0 - 70 + 0.5)) < 0.01 and nn[1] == 1
    assert v.busy_through(1000.0 - 65, 1000.0)
    assert not v.busy_through(1000.0 - 200, 1000.0)  # no line that far back
    got = v.oldest_running(1000.0, 1000.0 - 12, True, None)
    assert got is not None and abs(got[0] - nn[0]) < 0.01
    assert v.oldest_running(1000.0, 1000.0 - 12, False, None) is None  # /metrics saw a prompt taken
    # a prompt taken in a later interval: the requests may be new
    _feed(h, [(t0 + 70, _stats(1, 150.0, 3.0))], WALL + 1)
    assert h.snapshot(1000.0, WALL).no_new_request_since() is None
    # a gap in the lines (idle between): no claim across it
    h = LogHistory(local_offset=lambda w: 0.0)
    _feed(h, [(t0, _stats(1, 200.0)), (t0 + 40, _stats(1, 150.0)), (t0 + 50, _stats(1, 150.0))], WALL)
    nn = h.snapshot(1000.0, WALL).no_new_request_since()
    assert nn is not None and nn[0] > 1000.0 - 31


def test_engines_of_one_second_are_summed() -> None:
    h = LogHistory(local_offset=lambda w: 0.0)
    _feed(h, [(WALL - 5, _stats(2, 10.0, kv=40.0)),
              (WALL - 5, _stats(3, 20.0, kv=70.0).replace("Engine 000", "Engine 001"))], WALL)
    [p] = h.snapshot(100.0, WALL).stats
    assert (p.running, p.gen_tps, p.kv_pct) == (5, 30.0, 70.0)


def test_backlog_lag_is_the_age_of_the_last_line_read_at_once() -> None:
    from vtop.core.phases import LogEvent

    h = LogHistory(local_offset=lambda w: 0.0)
    # read live: no lag
    h.feed(parse_line(_line(WALL - 1, "Loading weights took 3.2 seconds")), WALL, 100.0)
    assert h.backlog_lag(100.0, WALL) == 0.0
    # a backlog whose last line was written 80 s before it was read
    h = LogHistory(local_offset=lambda w: 0.0)
    h.feed(parse_line(_line(WALL - 80, "Warming up model for the compilation...")), WALL, 100.0)
    assert abs(h.backlog_lag(100.0, WALL) - 79.5) < 0.01
    # a shm-broadcast wait after it is a symptom, not activity: the lag stays
    h.feed(parse_line(_line(WALL - 20, "No available shared memory broadcast block found in 60 seconds.")), WALL, 100.0)
    assert abs(h.backlog_lag(100.0, WALL) - 79.5) < 0.01
    # an unstamped line after it (a tqdm frame): when it came, the log does not say
    h.feed(LogEvent("Loading: 50%|#| 2/4 [00:01<00:01]", "", "progress"), WALL, 100.0)
    assert h.backlog_lag(100.0, WALL) == 0.0


def _busy_history(now: float, running: int, seconds: int = 90) -> object:
    from vtop.core.loghistory import LogHistoryView, StatsPoint

    pts = tuple(StatsPoint(now - seconds + 10 * k, 5.0, 900.0, running, 0, 1.0, None) for k in range(seconds // 10 + 1))
    return LogHistoryView(now, pts)


def _doctor_on_a_busy_server(running: float, finishing: bool) -> list[object]:
    """15 s of /metrics (a real H200 payload grown by hand), the log's stats lines showing
    requests running for 90 s, and the request log holding a chat request without
    max_tokens received 70 s ago with no end line (V1 logs none: it may have ended)."""
    from tests.helpers import diag_fixtures as F

    ses = F.Session()
    base = F.fixture_metrics("h200-0.26.0-metrics-burst-running1024.txt")
    t0 = ses.now + 1
    alerts: list[object] = []
    for i in range(16):
        done = dict(base.request_success_total)
        if finishing:
            done["stop"] = done.get("stop", 0.0) + 40.0 * i  # short requests finish all the time
        m = F.grow(base, running=running, waiting=0.0, generation_tokens_total=base.generation_tokens_total + 9000.0 * i,
                   prompt_tokens_total=base.prompt_tokens_total + 800.0 * i, request_success_total=done)
        ses.metrics(m, mono=t0 + i, max_model_len=32768)
        now = t0 + i
        stale = F.InFlight("chatcmpl-stale", 70.0 + i, True, 32000, True, since=t0 - 70.0)
        alerts = ses.tick(requests={F.URL: [stale]}, request_logging={F.URL: True},
                          log_history=_busy_history(now, int(running)))
    return alerts


def test_a_stale_request_log_entry_on_a_busy_server_is_no_runaway() -> None:
    """V1 logs no end for a request that stops by itself: a chat request without max_tokens
    received 70 s ago may have ended long since while short requests keep the server busy.
    /metrics says every request running at its first sample finished (40 a second of 20
    running): none is old, and the log's history must not claim one is."""
    assert not [a for a in _doctor_on_a_busy_server(20.0, finishing=True) if getattr(a, "rule", "") == "runaway"]
    # one request running and nothing finishing: it may well be that one; the log names it
    named = [a for a in _doctor_on_a_busy_server(1.0, finishing=False) if getattr(a, "rule", "") == "runaway"]
    assert named and any("chatcmpl-stale came 8" in e for e in named[0].evidence), named


def test_the_interval_an_engine_stopped_in_is_read_from_its_collapsed_throughput() -> None:
    """engine-stall-*: SIGSTOP just after a stats line; the next line still counts the outputs
    made before the stop (27 tok/s after 1259), then a zero line. The stop is about the start of
    that interval, not its end: 10 s earlier than the zero lines alone say (issue 24, the live
    doctor named the stalls 1-2 s late without it)."""
    h = LogHistory(local_offset=lambda w: 0.0)
    t0 = WALL - 40  # lines at -40, -30 (collapsed), -20 (zero); read at WALL
    _feed(h, [(t0, _stats(4, 1259.1, 288.4)), (t0 + 10, _stats(4, 27.1, 7.3)), (t0 + 20, _stats(4, 0.0))], WALL)
    now = 1000.0
    v = h.snapshot(now, WALL)
    q = v.quiet_since(now)
    assert q is not None and round(now - q[0]) == 30  # the zero line covers (-30, -20]: since -30
    est = v.stopped_within(now)
    assert est is not None
    # decoding at half the rate or more: 271 tokens took at most 0.43 s; 73 prompt tokens at the
    # fastest prompt rate logged (288.4 tok/s) at most 0.25 s: stopped about 39.3 s ago
    assert abs((now - est[0]) - (40.0 - 0.5 - 0.43 - 0.25)) < 0.05, now - est[0]
    got = v.stalled_since(now, now - 15)
    assert got is not None and got[0] == est[0] and got[2] is True and "stopped about 39 s ago" in got[1]


def test_no_interval_estimate_without_a_collapse_or_running_requests() -> None:
    now = 1000.0
    t0 = WALL - 40
    cases = [
        [(t0, _stats(4, 1000.0)), (t0 + 10, _stats(4, 400.0)), (t0 + 20, _stats(4, 0.0))],  # a slowdown, 40 %
        [(t0, _stats(0, 0.0)), (t0 + 10, _stats(4, 27.0)), (t0 + 20, _stats(4, 0.0))],  # nothing before it
        [(t0, _stats(4, 1000.0)), (t0 + 10, _stats(0, 27.0)), (t0 + 20, _stats(4, 0.0))],  # idle in between
        [(t0 - 20, _stats(4, 1000.0)), (t0 + 10, _stats(4, 27.0)), (t0 + 20, _stats(4, 0.0))],  # a gap: unknown
        [(t0, _stats(4, 1000.0)), (t0 + 10, _stats(4, 27.0)), (t0 + 20, _stats(4, 50.0))],  # moving again
    ]
    for lines in cases:
        h = LogHistory(local_offset=lambda w: 0.0)
        _feed(h, lines, WALL)
        v = h.snapshot(now, WALL)
        assert v.stopped_within(now) is None, lines
        got = v.stalled_since(now, now - 15)
        assert got is None or got[2] is False


def test_a_backlog_ending_in_a_frame_is_dated_by_the_files_modification_time() -> None:
    """A tqdm frame has no stamp: the backlog's lag came out 0 and a progress bar stopped for
    72 s looked silent only since the attach (h200-startup-stall-graph-capture, live doctor).
    The file's modification time says when its last byte was written."""
    h = LogHistory(local_offset=lambda w: 0.0)
    mono = 5000.0
    _feed(h, [(WALL - 80, "Skipping CuTeDSL warmup because no compile units were requested.")], WALL)
    frame = parse_line("Capturing CUDA graphs (PIECEWISE):  10%|#         | 5/51 [00:00<00:00, 48.73it/s]")
    h.feed(frame, WALL, mono)
    assert h.backlog_lag(mono, WALL) == 0.0  # no stamp, no modification time: unknown
    lag = h.backlog_lag(mono, WALL, written=WALL - 79.0)
    assert abs(lag - 79.0) < 1e-6 and h.lag_from == "mtime"
    assert h.backlog_lag(mono + 30, WALL + 30, written=WALL - 79.0) == lag  # the same as time passes
    assert h.backlog_lag(mono, WALL, written=WALL - 2.0) == 0.0  # written just now: live, no lag
    assert h.backlog_lag(mono, WALL, written=WALL + 600.0) == 0.0  # a clock ahead: never a guess
    # a stamped last line is dated by its stamp, as before
    h2 = LogHistory(local_offset=lambda w: 0.0)
    h2.feed(parse_line(_line(WALL - 80, "Initializing a V1 LLM engine")), WALL, mono)
    assert abs(h2.backlog_lag(mono, WALL, written=WALL - 1.0) - 79.5) < 1e-6 and h2.lag_from == "stamp"


def test_a_stats_line_read_after_the_first_poll_is_never_drawn_as_the_past() -> None:
    """vtop's clock is its own: a line that came after vtop's first poll of the server is news, even when
    its stamp (a whole second, its middle taken) places it a moment before that poll. The live screen
    decided at the poll and the replay of the same session later: both must leave it out."""
    from vtop.core.backfill import backfill_from

    h = LogHistory(local_offset=lambda w: 0.0)
    # the backlog at attach (mono 100): two lines 20 s and 10 s old
    for age in (20, 10):
        h.feed(parse_line(_line(WALL - age, _stats(2, 50.0))), WALL, 100.0)
    first_poll = 100.6
    # a line stamped in the second of the first poll, read 0.3 s after it
    h.feed(parse_line(_line(WALL, _stats(3, 60.0))), WALL + 0.9, 100.9)
    v = h.snapshot(101.0, WALL + 1.0)
    late = [p for p in v.stats if p.running == 3]
    assert late and late[0].mono < first_poll and late[0].arrived == 100.9  # its stamp says "before"
    bf = backfill_from(v, first_poll)
    assert bf is not None and [p.running for p in bf.points] == [2, 2]  # only what was there before vtop
    # read twice (the attach's tail read and the forward read): the backlog's read counts
    h.feed(parse_line(_line(WALL - 10, _stats(2, 50.0))), WALL + 1.0, 101.0)
    assert [p.arrived for p in h.snapshot(101.5, WALL + 1.5).stats if p.running == 2] == [None, None]
