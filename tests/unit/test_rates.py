"""vtop.core.rates: counter rates with resets, windowed quantiles from bucket deltas.

The real-data tests replay the H200 recording (vLLM 0.26.0, one scrape a
second): the 1500-request burst and the 71 s runaway that ran to the
32,768-token limit.
"""

from __future__ import annotations

import json
import lzma
import math
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from vtop.core.rates import (
    CounterMapWindow,
    CounterWindow,
    HistogramDelta,
    HistogramWindow,
    histogram_delta,
    histogram_quantile,
    histogram_quantiles,
)
from vtop.sources.metrics_text import Histogram, VllmMetrics, parse_vllm_metrics

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "vllm"
LAUNCH_T = 1796032448.9186  # events.jsonl "vllm_launch"
INF = math.inf


# --- histogram_quantile ---------------------------------------------------------

BUCKETS = ((0.1, 2.0), (0.5, 6.0), (1.0, 9.0), (INF, 10.0))


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        # rank 1 in (0, 0.1], 2 observations there: 0 + 0.1 * 1/2
        (0.1, 0.05),
        # rank 5 in (0.1, 0.5], 2 below, 4 inside: 0.1 + 0.4 * 3/4
        (0.5, 0.4),
        # rank 8 in (0.5, 1.0], 6 below, 3 inside: 0.5 + 0.5 * 2/3
        (0.8, 0.5 + 0.5 * 2 / 3),
        # rank 9.5 is in +Inf: the highest finite bound
        (0.95, 1.0),
        (0.99, 1.0),
        (0.0, 0.0),
        (1.0, 1.0),
    ],
)
def test_histogram_quantile_by_hand(q: float, expected: float) -> None:
    assert histogram_quantile(q, BUCKETS) == pytest.approx(expected)


def test_histogram_quantile_edge_cases() -> None:
    assert histogram_quantile(0.5, ()) is None
    assert histogram_quantile(0.5, ((INF, 3.0),)) is None  # one bucket
    assert histogram_quantile(0.5, ((1.0, 0.0), (INF, 0.0))) is None  # no observations
    assert histogram_quantile(0.5, ((1.0, 2.0), (2.0, 4.0))) is None  # no +Inf
    assert histogram_quantile(0.5, ((-1.0, 4.0), (INF, 4.0))) == -1.0  # first bound <= 0
    # unsorted input and non-monotonic counts are tolerated like Prometheus
    assert histogram_quantile(0.5, tuple(reversed(BUCKETS))) == pytest.approx(0.4)
    # counts 2, 1, 4 are read as 2, 2, 4: rank 2 is reached in the first bucket
    assert histogram_quantile(0.5, ((0.1, 2.0), (0.5, 1.0), (INF, 4.0))) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        histogram_quantile(1.5, BUCKETS)


def H(counts: list[float], bounds: tuple[float, ...] = (0.1, 0.5, 1.0, INF), s: float | None = None) -> Histogram:
    return Histogram(tuple(zip(bounds, counts)), s, counts[-1])


def test_histogram_delta() -> None:
    d = histogram_delta(H([1, 2, 3, 3], s=1.0), H([1, 6, 9, 10], s=8.0))
    assert d == HistogramDelta(((0.1, 0.0), (0.5, 4.0), (1.0, 6.0), (INF, 7.0)), 7.0, 7.0)
    assert d.mean == 1.0
    assert histogram_delta(H([1, 6, 9, 10]), H([0, 0, 1, 1])) is None  # reset
    assert histogram_delta(H([1, 2, 3, 3]), H([1, 2, 3], bounds=(0.1, 1.0, INF))) is None  # new layout


# --- CounterWindow ------------------------------------------------------------------


def test_counter_rate_simple() -> None:
    w = CounterWindow(10.0)
    assert w.rate().rate is None  # empty
    w.add(0.0, 100.0)
    assert w.rate().rate is None  # one sample is no rate
    for t in range(1, 6):
        w.add(float(t), 100.0 + 50.0 * t)
    r = w.rate()
    assert r.rate == pytest.approx(50.0) and r.delta == 250.0 and r.span_s == 5.0 and not r.reset


def test_counter_reset_mid_window() -> None:
    w = CounterWindow(10.0)
    for t in range(0, 6):
        assert not w.add(float(t), 1000.0 + 100.0 * t)
    # vLLM restarted: the counter starts again from a small value
    assert w.add(6.0, 10.0) is True
    r = w.rate()
    assert r.reset and r.rate is None  # only one sample since the restart
    for t2 in (7.0, 8.0, 9.0):
        w.add(t2, 10.0 + 50.0 * (t2 - 6.0))
    r = w.rate()
    assert r.reset
    assert r.rate == pytest.approx(50.0)  # re-baselined at t=6, not (160-1500)/9
    assert r.span_s == 3.0
    assert w.resets == 1
    # once the reset leaves the window the flag clears
    assert not w.rate(now=16.5).reset
    w.add(17.0, 10.0 + 50.0 * 11)
    assert not w.rate().reset


def test_counter_rate_never_negative_and_ignores_bad_samples() -> None:
    w = CounterWindow(30.0)
    w.add(0.0, 5.0)
    w.add(1.0, None)  # failed scrape: a gap
    w.add(2.0, math.nan)
    w.add(3.0, -4.0)
    w.add(4.0, 9.0)
    w.add(3.5, 0.0)  # time went back: ignored (not a reset)
    w.add(4.0, 0.0)  # same time: ignored
    r = w.rate()
    assert r.rate == pytest.approx(1.0) and not r.reset and len(w) == 2


def test_counter_rate_goes_stale() -> None:
    w = CounterWindow(10.0)
    w.add(0.0, 0.0)
    w.add(5.0, 50.0)
    assert w.rate(now=6.0).rate == pytest.approx(10.0)
    # scrapes stopped: with the clock's time, the old rate is not shown as current
    assert w.rate(now=40.0).rate is None


def test_counter_window_prunes_old_samples() -> None:
    w = CounterWindow(5.0)
    for t in range(100):
        w.add(float(t), float(t * t))
    assert len(w) == 6  # t = 94..99
    assert w.rate().rate == pytest.approx((99 * 99 - 94 * 94) / 5)


def test_bad_window() -> None:
    with pytest.raises(ValueError):
        CounterWindow(0)


# --- HistogramWindow ----------------------------------------------------------------


def test_quantiles_come_from_the_window_not_lifetime() -> None:
    w = HistogramWindow(10.0)
    # a long fast past: 1000 observations under 0.1 s
    w.add(0.0, H([1000, 1000, 1000, 1000]))
    # the last 10 s: 10 slow ones, in (0.5, 1.0]
    w.add(10.0, H([1000, 1000, 1010, 1010]))
    q = w.quantiles()
    assert q.count == 10.0
    assert q.p50 == pytest.approx(0.75)  # 0.5 + 0.5 * 5/10
    assert q.p99 == pytest.approx(0.995)
    # lifetime would say "fast"
    lifetime_p50 = histogram_quantile(0.5, H([1000, 1000, 1010, 1010]).buckets)
    assert lifetime_p50 is not None and lifetime_p50 < 0.1


def test_quantiles_empty_window_is_none() -> None:
    w = HistogramWindow(10.0)
    assert w.quantiles().p50 is None
    w.add(0.0, H([1, 2, 3, 3]))
    assert w.quantiles().p50 is None  # one sample
    w.add(5.0, H([1, 2, 3, 3]))
    q = w.quantiles()  # two samples, nothing observed in between: idle
    assert (q.p50, q.p95, q.p99, q.mean) == (None, None, None, None)
    assert q.count == 0.0
    assert w.quantiles(now=100.0).p50 is None  # stale


def test_quantiles_after_histogram_reset() -> None:
    w = HistogramWindow(60.0)
    w.add(0.0, H([0, 0, 100, 100]))
    w.add(1.0, H([0, 0, 200, 200]))
    assert w.add(2.0, H([2, 2, 2, 2])) is True  # restart
    w.add(3.0, H([6, 6, 6, 6]))
    q = w.quantiles()
    assert q.reset and q.count == 4.0
    assert q.p50 == pytest.approx(0.05)  # all four new ones in (0, 0.1]


def test_quantiles_asked_again_follow_every_change_of_the_window() -> None:
    """quantiles() keeps its last answer for the same two end samples: asked at every
    second of a random run, it must equal a fresh window's answer each time (new samples,
    samples sliding out, a reset in the window and out of it, other quantiles, a stale now)."""
    import random

    rng = random.Random(7)
    w = HistogramWindow(10.0)
    counts = [0, 0, 0, 0]
    added: list[tuple[float, Any]] = []
    for t in range(120):
        if t % 3 == 0:
            if rng.random() < 0.05:
                counts = [0, 0, 0, 0]  # a restart
            for _ in range(rng.randrange(4)):
                b = rng.randrange(4)
                for i in range(b, 4):
                    counts[i] += 1
            h = H(list(counts))
            w.add(float(t), h)
            added.append((float(t), h))
        a, b = (0.5, 0.95, 0.99), (0.1, 0.5, 0.9)
        for now, qs in ((float(t), a), (float(t), b), (float(t), a), (t + 30.0, a)):
            fresh = HistogramWindow(10.0)
            for at, h in added:
                fresh.add(at, h)
            assert w.quantiles(now, qs) == fresh.quantiles(now, qs), (t, now, qs)


# --- CounterMapWindow (finish reasons) ------------------------------------------------


def test_finish_reason_window() -> None:
    w = CounterMapWindow(30.0)
    assert w.delta().deltas is None
    w.add(0.0, {"stop": 5.0})
    w.add(10.0, {"stop": 8.0, "length": 2.0})  # V0: "length" appears at its first use
    d = w.delta()
    assert d.deltas == {"stop": 3.0, "length": 2.0} and d.total == 5.0 and d.span_s == 10.0 and not d.reset
    assert w.add(20.0, {"stop": 1.0}) is True  # went down and "length" vanished: restart
    w.add(25.0, {"stop": 4.0, "abort": 1.0})
    d = w.delta()
    assert d.reset and d.deltas == {"stop": 3.0, "abort": 1.0}


def test_finish_reason_window_copies_input() -> None:
    w = CounterMapWindow(30.0)
    counts = {"stop": 1.0}
    w.add(0.0, counts)
    counts["stop"] = 100.0
    w.add(1.0, {"stop": 2.0})
    assert w.delta().deltas == {"stop": 1.0}


# --- the real H200 recording ----------------------------------------------------------


@cache
def timeline() -> tuple[tuple[float, VllmMetrics | None], ...]:
    """(seconds since launch, snapshot or None while the port was closed)."""
    out = []
    with lzma.open(FIX / "h200-0.26.0-metrics-timeline.jsonl.xz", "rt") as f:
        for line in f:
            row = json.loads(line)
            snap = parse_vllm_metrics(row["text"]) if "text" in row else None
            out.append((row["t"] - LAUNCH_T, snap))
    return tuple(out)


def replay(until: float, window_s: float, pick) -> CounterWindow:  # type: ignore[no-untyped-def]
    w = CounterWindow(window_s)
    for t, snap in timeline():
        if t > until:
            break
        w.add(t, None if snap is None else pick(snap))
    return w


def test_timeline_recording_is_complete() -> None:
    rows = timeline()
    assert len(rows) == 205
    assert sum(s is None for _, s in rows) == 88  # connection refused during startup and after exit
    assert all(s.problems == () for _, s in rows if s is not None)


def test_runaway_generation_rate() -> None:
    """One chat request without max_tokens, 71 s to the 32,768-token limit.

    The client saw 32,495 chunks in 71.02 s (457.9 chunks/s). The counter
    says 32,628 tokens (= 32,768 - 140 prompt tokens) between the last scrape
    before it (t=125.1 s) and the first after it (t=197.1 s).
    """
    gen = lambda s: s.generation_tokens_total  # noqa: E731
    # a 60 s window in the middle of the runaway: scrapes at 126.1 s (339,299)
    # and 186.1 s (366,937), 27,638 tokens in 60 s
    r = replay(186.2, 60.5, gen).rate()
    assert r.delta == 366937 - 339299
    assert r.rate == pytest.approx(27638 / 60, rel=1e-4)
    assert r.rate is not None and 440 < r.rate < 475 and not r.reset
    # the whole runaway
    r = replay(197.2, 72.5, gen).rate()
    assert r.delta == 371828 - 339200 == 32768 - 140
    assert r.rate == pytest.approx(32628 / 72, rel=1e-3)
    # and nothing else was running: the prompt counter moved by exactly 140
    p = replay(197.2, 72.5, lambda s: s.prompt_tokens_total).rate()
    assert p.delta == 140


def test_burst_rates_and_windowed_ttft() -> None:
    """Load B: 1500 requests at once, max_tokens 192, between t=104 and t=117."""
    ttft = HistogramWindow(14.0)
    reasons = CounterMapWindow(14.0)
    max_tokens = HistogramWindow(14.0)
    for t, snap in timeline():
        if t > 117.2:
            break
        if snap is None:
            continue
        ttft.add(t, snap.time_to_first_token_seconds)
        reasons.add(t, snap.request_success_total)
        max_tokens.add(t, snap.request_params_max_tokens)
    q = ttft.quantiles()
    assert q.count == 1500.0
    # By hand from the bucket deltas 104.1 s -> 117.1 s (cumulative):
    # <=0.25: 0, <=0.5: 25, <=0.75: 141, <=1: 242, <=2.5: 791, <=5: 1024, <=7.5: 1186, <=10: 1500
    assert q.p50 == pytest.approx(1.0 + 1.5 * (750 - 242) / (791 - 242))  # 2.388 s
    assert q.p95 == pytest.approx(7.5 + 2.5 * (1425 - 1186) / (1500 - 1186))  # 9.403 s
    assert q.p99 == pytest.approx(7.5 + 2.5 * (1485 - 1186) / (1500 - 1186))  # 9.880 s
    # The lifetime p50 (1701 requests, load A's fast ones included) is different:
    # rank 850.5 in (1, 2.5] with 443 below and 992 at its top.
    lifetime = [snap for _, snap in timeline() if snap is not None][-1]
    assert lifetime is not None and lifetime.time_to_first_token_seconds is not None
    assert histogram_quantile(0.5, lifetime.time_to_first_token_seconds.buckets) == pytest.approx(
        1.0 + 1.5 * (850.5 - 443) / (992 - 443)
    )
    assert reasons.delta().deltas == {"stop": 0.0, "length": 1500.0, "abort": 0.0, "error": 0.0, "repetition": 0.0}
    # every request of the burst asked for max_tokens=192: all in (100, 200]
    mq = max_tokens.quantiles()
    assert mq.count == 1500.0 and mq.p50 == pytest.approx(150.0)


def test_runaway_max_tokens_lands_in_inf_bucket() -> None:
    """The runaway's effective max_tokens (32,628) is above the top bucket
    (20,000): the quantile says "20,000" (the most it can know), not inf."""
    w = HistogramWindow(10.0)
    for t, snap in timeline():
        if snap is not None and t > 190:
            w.add(t, snap.request_params_max_tokens)
    q = w.quantiles()
    assert q.count == 1.0 and q.p50 == 20000.0 and q.p99 == 20000.0


def _quantile_reference(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' bucketQuantile written out plainly (promql/quantile.go), None for NaN."""
    bs = sorted(buckets)
    if len(bs) < 2 or bs[-1][0] != math.inf or any(math.isnan(c) for _, c in bs):
        return None
    mono, top = [], 0.0
    for le, c in bs:
        top = max(top, c)
        mono.append((le, top))
    total = mono[-1][1]
    if total <= 0:
        return None
    rank = q * total
    b = len(mono) - 1
    for i in range(len(mono) - 1):
        if mono[i][1] >= rank:
            b = i
            break
    if b == len(mono) - 1:
        return mono[-2][0]
    if b == 0 and mono[0][0] <= 0:
        return mono[0][0]
    start, end, count = 0.0, mono[b][0], mono[b][1]
    if b > 0:
        start = mono[b - 1][0]
        count -= mono[b - 1][1]
        rank -= mono[b - 1][1]
    if count <= 0:
        return start
    return start + (end - start) * (rank / count)


def test_quantiles_in_one_pass_match_the_reference_on_random_buckets() -> None:
    """histogram_quantiles (one sort, a bisect per q) against the plain algorithm:
    ties at the rank, flat stretches, counts that dip, NaN, zero totals, no +Inf."""
    import random

    rng = random.Random(11)
    qs = (0.0, 0.5, 0.95, 0.99, 1.0)
    for _ in range(3000):
        n = rng.randint(0, 7)
        les = sorted(rng.sample([-1.0, 0.0, 0.001, 0.01, 0.1, 0.5, 1.0, 2.5, 10.0, 60.0], n))
        if rng.random() < 0.9:
            les.append(math.inf)
        counts, c = [], 0.0
        for _le in les:
            c += rng.choice([0.0, 0.0, 1.0, 2.0, 7.5])
            counts.append(c)
        if counts and rng.random() < 0.1:
            counts[rng.randrange(len(counts))] = rng.choice([math.nan, 0.0, 3.0])
        buckets = list(zip(les, counts))
        rng.shuffle(buckets)
        want = [_quantile_reference(q, buckets) for q in qs]
        assert histogram_quantiles(qs, buckets) == want, buckets
        assert [histogram_quantile(q, buckets) for q in qs] == want, buckets


def test_window_ends_are_the_first_and_last_sample_in_the_window() -> None:
    """rate() reads only the window's oldest and newest sample; checked against the
    samples filtered by hand, for a clock ahead of, inside and behind the samples."""
    import random

    rng = random.Random(5)
    for _ in range(500):
        w = CounterWindow(rng.choice([5.0, 10.0, 60.0]))
        t, v = 0.0, 0.0
        pts = []
        for _ in range(rng.randint(0, 30)):
            t += rng.choice([0.5, 1.0, 1.0, 3.0, 20.0])
            v += rng.choice([0.0, 1.0, 10.0])
            w.add(t, v)
            pts.append((t, v))
        now = rng.choice([None, t, t + rng.uniform(0, 40), t - rng.uniform(0, 10)])
        ref_now = pts[-1][0] if now is None and pts else now
        kept = [] if not pts else [p for p in pts if p[0] >= pts[-1][0] - w.window_s or p == pts[-1]]
        inside = [p for p in kept if ref_now is not None and ref_now - w.window_s <= p[0] <= ref_now]
        r = w.rate(now)
        if len(inside) < 2:
            assert r.rate is None and r.delta is None
        else:
            (t0, v0), (t1, v1) = inside[0], inside[-1]
            assert r.span_s == t1 - t0
            assert r.delta == max(0.0, v1 - v0)
