"""The oldest in-flight request's age from /metrics alone (vtop/core/inflight.py), on the real
traces of the incident corpus and on the edge cases the real ones do not reach."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.corpus.score import traces
from vtop.core.inflight import OldestInFlight
from vtop.sources.trace import load_trace

TRACES = {p.name: p for p in traces()}


def lower_bounds(path: Path) -> tuple[dict, list[tuple[float, float]]]:
    header, events = load_trace(path)
    o = OldestInFlight()
    out = []
    for e in events:
        if e.kind == "server" and e.data.ok and e.data.metrics is not None:
            m = e.data.metrics
            o.add(e.data.t, m.running, m.e2e_request_latency_seconds, e.data.t - m.histograms_age_s)
            out.append((e.data.t, o.lower_bound_s))
    return header["truth"], out


RUNAWAYS = [n for n in TRACES if n.startswith("runaway")]
# A legitimate long generation really is old: its age is not bounded by ordinary traffic's
LONG = [n for n in TRACES if n.startswith("normal-long-generation")]
NORMAL = [n for n in TRACES if n.startswith("normal") and n not in LONG]


@pytest.mark.parametrize("name", RUNAWAYS)
def test_a_runaway_is_seen_by_its_age_even_while_other_requests_finish(name: str) -> None:
    """Real vLLM 0.32 CPU: a chat request without max_tokens, alone or among short and long
    requests that come and go: by 50 s after it began its age is known to be >= 45 s."""
    truth, lbs = lower_bounds(TRACES[name])
    began = truth["began"]
    by = next((t for t, lb in lbs if lb >= 45.0), None)
    assert by is not None and by - began <= 50.0, (by and by - began, max(lb for _, lb in lbs))
    # it never claims more than the request's real age
    assert all(lb <= t - began + 2.0 for t, lb in lbs if t >= began)


@pytest.mark.parametrize("name", NORMAL)
def test_ordinary_traffic_never_looks_old(name: str) -> None:
    """Bursts with a waiting queue, idle minutes: the bound stays under 30 s."""
    _, lbs = lower_bounds(TRACES[name])
    assert lbs and max(lb for _, lb in lbs) < 30.0


@pytest.mark.parametrize("name", LONG)
def test_a_long_generation_the_client_asked_for_is_shown_not_alarmed(name: str) -> None:
    """A request with max_tokens set (the request log says so) that runs long: if its age
    passes the runaway's, it is an info "long request", never a warning."""
    from vtop.config import Config
    from vtop.monitor.player import open_recording

    m = open_recording(str(TRACES[name]), config=Config()).play_to_end()
    runaway = [a for c in m.alert_log for a in c.alerts if a.rule == "runaway"]
    assert all(a.severity == "info" and a.title.startswith("Long request") for a in runaway), runaway


def test_the_corpus_has_both_kinds() -> None:
    assert len(RUNAWAYS) >= 3 and len(NORMAL) >= 3, sorted(TRACES)


def hist(*counts: float) -> SimpleNamespace:
    """An e2e histogram with buckets 0.5, 10, 100 s and +Inf (cumulative counts)."""
    return SimpleNamespace(buckets=tuple(zip((0.5, 10.0, 100.0, float("inf")), counts)))


def test_short_requests_finishing_do_not_hide_a_long_one() -> None:
    o = OldestInFlight()
    o.add(0.0, 1, hist(0, 0, 0, 0))  # the long one starts alone
    done = 0
    for t in range(1, 61):
        done += 1  # a 0.5 s request comes and goes every second
        o.add(float(t), 2, hist(done, done, done, done))
    # each short one may have begun up to 0.5 s before the second it was seen in: the first
    # second is given up to that doubt, the rest is known
    assert o.lower_bound_s == pytest.approx(59.0)


def test_a_finish_that_may_reach_back_counts_against_it() -> None:
    o = OldestInFlight()
    o.add(0.0, 1, hist(0, 0, 0, 0))
    o.add(30.0, 1, hist(0, 0, 0, 0))
    o.add(31.0, 1, hist(0, 0, 1, 1))  # one finished, 10-100 s long: it may be the one of t=0 or 30
    assert o.lower_bound_s == 0.0  # so nothing is known to run from before now
    o.add(40.0, 1, hist(0, 0, 1, 1))
    assert o.lower_bound_s == pytest.approx(9.0)


def test_running_at_zero_ends_everything_and_a_restart_starts_over() -> None:
    o = OldestInFlight()
    o.add(0.0, 1, hist(0, 0, 0, 0))
    o.add(50.0, 1, hist(0, 0, 0, 0))
    assert o.lower_bound_s == 50.0
    o.add(51.0, 0, hist(0, 0, 0, 0))
    assert o.lower_bound_s == 0.0
    o.add(52.0, 1, hist(5, 5, 5, 5))
    o.add(80.0, 1, hist(0, 0, 0, 0))  # counters back to 0: a new server process
    assert o.lower_bound_s == 0.0
    o.add(90.0, 1, hist(0, 0, 0, 0))
    assert o.lower_bound_s == 10.0


def test_without_a_latency_histogram_nothing_is_claimed() -> None:
    o = OldestInFlight()
    for t in range(100):
        o.add(float(t), 3, None)
    assert o.lower_bound_s == 0.0
