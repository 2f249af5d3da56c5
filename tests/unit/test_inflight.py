"""The oldest in-flight request's age from /metrics alone (vtop/core/inflight.py), on the real
traces of the incident corpus and on the edge cases the real ones do not reach."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.corpus.score import traces
from vtop.core.inflight import MaxTokensLedger, OldestInFlight, oldest_logged
from vtop.sources.recording.trace import load_trace

TRACES = {p.name: p for p in traces()}


def lower_bounds(path: Path) -> tuple[dict, list[tuple[float, float]]]:
    header, events = load_trace(path)
    o = OldestInFlight()
    out = []
    for e in events:
        if e.kind == "server" and e.data.ok and e.data.metrics is not None:
            m = e.data.metrics
            succ = m.request_success_total or {}
            o.add(e.data.t, m.running, m.e2e_request_latency_seconds, e.data.t - m.histograms_age_s,
                  float(sum(succ.values())) if succ else None)
            out.append((e.data.t, o.lower_bound_s))
    return header["truth"], out


RUNAWAYS = [n for n in TRACES if n.startswith(("runaway", "h200-runaway"))]
# A legitimate long generation really is old: its age is not bounded by ordinary traffic's
LONG = [n for n in TRACES if n.startswith("normal-long-generation")]
NORMAL = [n for n in TRACES if n.startswith("normal") and n not in LONG]


@pytest.mark.parametrize("name", RUNAWAYS)
def test_a_runaway_is_seen_by_its_age_even_while_other_requests_finish(name: str) -> None:
    """Real vLLM (0.32 CPU, 0.26 H200): a chat request without max_tokens, alone or among short
    and long requests that come and go, read at the live cadence (histograms every 5 s): by
    55 s after it began its age is known to be >= 45 s (the bound is claimed as of the last
    histogram read while a finish it has not explained is pending: up to 5 s behind)."""
    truth, lbs = lower_bounds(TRACES[name])
    began = truth["began"]
    by = next((t for t, lb in lbs if lb >= 45.0), None)
    assert by is not None and by - began <= 55.0, (by and by - began, max(lb for _, lb in lbs))
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
    import json

    from vtop.config import Config
    from vtop.monitor.player import open_recording

    m = open_recording(str(TRACES[name]), config=Config()).play_to_end()
    runaway = [a for c in m.alert_log for a in c.alerts if a.rule == "runaway"]
    assert all(a.severity == "info" and a.title.startswith("Long request") for a in runaway), runaway
    # the request named is the long one (proven in flight by the request log and the
    # max_tokens histogram), not the log's oldest entry (a short /v1/completions request
    # whose end V1 never logs)
    events = [json.loads(x) for x in (TRACES[name] / "events.jsonl").read_text().splitlines() if x.strip()]
    ids = {e["request_id"] for e in events if e.get("what") == "long_request_id"}
    assert all(any(i in a.evidence[0] for i in ids) for a in runaway), [a.evidence[0] for a in runaway]


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


# --- the live cadence: histograms every 5 s, the counter every second (issue 24) -------------

#: vLLM's e2e latency buckets (vllm/v1/metrics/loggers.py, request_latency)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0, 1920.0, 7680.0, float("inf"))


def e2e_of(durations: list[float]) -> SimpleNamespace:
    return SimpleNamespace(buckets=tuple((le, float(sum(1 for d in durations if d <= le))) for le in E2E_BUCKETS))


def play_live(requests: list[tuple[float, float]], until: float, hist_every: float = 5.0,
              aborted: frozenset[int] = frozenset()) -> list[tuple[float, float, float]]:
    """Samples once a second as the live scraper gives them: ``running`` (a request is running
    at t when begin <= t < end) and the success counter every second, the e2e histogram read
    every ``hist_every`` s and carried over in between. ``aborted`` requests (by index) end
    without a finish (a client hang-up: in no metric). Returns ``(t, lower bound, the truth)``:
    the truth is the longest a request lived that was running at the last histogram read or
    since (what the bound may claim at most)."""
    o = OldestInFlight()
    out = []
    hist_t = 0.0
    hist = e2e_of([])
    for i in range(int(until) + 1):
        t = float(i)
        finished = [(b, e) for k, (b, e) in enumerate(requests) if e <= t and k not in aborted]
        running = sum(1 for b, e in requests if b <= t < e)
        if t - hist_t >= hist_every or t == 0.0:
            hist_t, hist = t, e2e_of([e - b for b, e in finished])
        o.add(t, running, hist, hist_t, float(len(finished)))
        lived = [min(e, t) - b for b, e in requests if b <= t and e > hist_t - 1.0]
        out.append((t, o.lower_bound_s, max(lived, default=0.0)))
    return out


def short_traffic(seed: int, start: float, end: float, dur: tuple[float, float]) -> list[tuple[float, float]]:
    import random

    rng = random.Random(seed)
    out = []
    t = start
    while t < end:
        t += rng.uniform(2.0, 5.0)
        out.append((t, t + rng.uniform(*dur)))
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("dur", [(0.5, 1.5), (1.0, 4.0), (3.0, 9.0)])
def test_at_the_live_cadence_short_finishes_do_not_hide_a_long_request(seed: int, dur: tuple[float, float]) -> None:
    """The live test's shape: short requests every 2-5 s, one long request from t=10.5, the
    histograms read every 5 s, the counter every second. The bound never claims more than a
    request really lived, and for short requests of up to 4 s (the live test's and the
    corpus's) the long one's age is known to be 45 s by 55 s after it began. (On the old
    count every short finish of a 5 s interval was placed at the interval's start and
    counted against every candidate: the bound never passed 5-10 s. Requests of 3-9 s land
    in the (5, 10] s bucket: each may have begun up to 10 s before it ended, so a candidate
    needs a lull in arrivals; that is the histogram's resolution, not the cadence's.)"""
    reqs = short_traffic(seed, 0.0, 130.0, dur) + [(10.5, 1000.0)]
    rows = play_live(reqs, 120.0)
    assert all(lb <= truth + 1e-9 for _, lb, truth in rows), [(t, lb, truth) for t, lb, truth in rows if lb > truth]
    if dur[1] <= 4.0:
        by = next((t for t, lb, _ in rows if lb >= 45.0), None)
        assert by is not None and by - 10.5 <= 55.0, (by, max(lb for _, lb, _ in rows))


def overlapping(seed: int) -> tuple[list[tuple[float, float]], frozenset[int]]:
    import random

    rng = random.Random(seed)
    reqs = []
    t = 0.0
    while t < 200.0:
        t += rng.uniform(0.2, 3.0)
        reqs.append((t, t + rng.choice((rng.uniform(0.5, 3.0), rng.uniform(5.0, 30.0)))))
    return reqs, frozenset(k for k in range(len(reqs)) if rng.random() < 0.1)


@pytest.mark.parametrize("seed", range(8))
def test_at_the_live_cadence_the_bound_never_outlives_the_requests(seed: int) -> None:
    """No long request: many overlapping requests of 1-30 s. Whatever the histograms' lag,
    the bound never claims more than a request lived."""
    reqs, _ = overlapping(seed)
    rows = play_live(reqs, 200.0)
    assert all(lb <= truth + 1e-9 for _, lb, truth in rows), [(t, lb, truth) for t, lb, truth in rows if lb > truth]


def test_a_client_abort_that_running_shows_ends_the_claim() -> None:
    """A client that hangs up is in no metric (vLLM counts no finish): only ``running`` says
    it. The long request aborted at 60 while one short request runs: nothing old is claimed
    after (an abort hidden by a request that came in the same second cannot be told)."""
    reqs = [(1.0, 60.5), (55.0, 80.0)]
    rows = dict((t, lb) for t, lb, _ in play_live(reqs, 70.0, aborted=frozenset({0})))
    assert rows[60.0] == pytest.approx(59.0)
    assert all(rows[t] <= t - 55.0 for t in range(61, 71))


def test_a_long_request_that_ends_is_not_claimed_while_its_latency_is_unread() -> None:
    """The long request ends 1 s after a histogram read (another one goes on): for the 4 s
    until the next read the counter says one finished, of a length not known yet: the bound
    stays at the age it had when that finish may have happened, and drops at the read."""
    reqs = [(1.0, 60.5), (30.0, 200.0)]
    rows = dict((t, lb) for t, lb, _ in play_live(reqs, 70.0))
    assert rows[60.0] == pytest.approx(59.0)  # the one of t=1 is alive at the read of t=60
    assert rows[61.0] == pytest.approx(59.0) and rows[64.0] == pytest.approx(59.0)  # held at 60
    assert rows[65.0] == pytest.approx(35.0)  # read: 50-60 s long, it was the one of t=1


def test_a_histogram_that_lags_the_counter_holds_the_claim_until_it_catches_up() -> None:
    """A read where the counter says 1 finished and the histogram (read apart) 0: that finish
    may be the long one, so the claim holds at its slot; the next read shows it was 9 s long
    (it began after t=30): the long one is given back its age."""
    o = OldestInFlight()
    o.add(0.0, 1.0, e2e_of([]), 0.0, 0.0)
    for t in range(1, 40):
        o.add(float(t), 2.0 if t >= 30 else 1.0, e2e_of([]), float(t), 0.0)
    assert o.lower_bound_s == pytest.approx(39.0)
    o.add(40.0, 1.0, e2e_of([]), 40.0, 1.0)  # a finish the histogram does not have yet
    assert o.lower_bound_s == pytest.approx(39.0)
    o.add(45.0, 1.0, e2e_of([9.0]), 45.0, 1.0)
    assert o.lower_bound_s == pytest.approx(45.0)


# --- the request log as proof: logged requests and the max_tokens histogram -----------------

MT_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0,
              50000.0, float("inf"))


def mt_hist(values: list[int]) -> SimpleNamespace:
    return SimpleNamespace(buckets=tuple((le, float(sum(1 for v in values if v <= le))) for le in MT_BUCKETS))


def ledger_of(reads: list[tuple[float, list[int]]]) -> MaxTokensLedger:
    led = MaxTokensLedger()
    for t, finished in reads:
        led.add(t, mt_hist(finished))
    return led


def test_a_logged_request_without_max_tokens_is_proven_running_among_short_ones() -> None:
    """The request log's entry (no end line in V1) is proof once its max_tokens bucket shows
    no finish since it came: short requests (max_tokens 16-64) finish in other buckets."""
    shorts = [16, 40, 64, 33, 20, 50]
    reads = [(0.0, [])] + [(5.0 * k, shorts[: k]) for k in range(1, 7)]
    led = ledger_of(reads)
    reqs = [(4.0, 65516.0, "runaway"), (5.0, 40.0, "short-1"), (9.0, 64.0, "short-2")]
    got = oldest_logged(reqs, led, [], 31.0, busy=1.0)
    assert got is not None and got[2] == "runaway" and got[0] == pytest.approx(27.0)
    # a finish in its bucket since it came may be it: then nothing of that bucket is proven
    led2 = ledger_of(reads + [(35.0, shorts + [65000])])
    got2 = oldest_logged(reqs, led2, [], 36.0, busy=1.0)
    assert got2 is None or got2[2] != "runaway"


def test_a_pending_finish_holds_the_logged_proof_unless_it_ended_by_length_too_soon() -> None:
    """A finish the counter shows after the last read may be the request (held at its slot),
    unless it ended by reason ``length`` while fewer tokens than the request's max_tokens
    were generated since it came."""
    led = ledger_of([(0.0, []), (5.0, []), (10.0, [])])
    reqs = [(4.0, 65516.0, "runaway")]
    held = oldest_logged(reqs, led, [11.0], 14.0, busy=1.0)
    assert held is not None and held[0] == pytest.approx(7.0)
    free = oldest_logged(reqs, led, [11.0], 14.0, busy=1.0, pending_but_length=[],
                         generated_since=lambda t: 3000.0)
    assert free is not None and free[0] == pytest.approx(10.0)
    maybe = oldest_logged(reqs, led, [11.0], 14.0, busy=1.0, pending_but_length=[],
                          generated_since=lambda t: 70000.0)  # it may have reached its max_tokens
    assert maybe is not None and maybe[0] == pytest.approx(7.0)


def test_the_request_log_proves_nothing_it_cannot_see_the_end_of() -> None:
    """A request logged before the histogram's first read may have ended before it; more
    logged requests left than run or wait now means some never ran (refused)."""
    led = ledger_of([(10.0, []), (15.0, []), (20.0, [])])
    assert oldest_logged([(5.0, 65516.0, "before")], led, [], 60.0, busy=1.0) is None
    two = [(14.0, 65516.0, "a"), (15.0, 65516.0, "b")]
    assert oldest_logged(two, led, [], 60.0, busy=1.0) is None
    assert oldest_logged(two, led, [], 60.0, busy=2.0) is not None


def test_attached_late_a_request_the_first_read_has_not_seen_finish_is_proven_from_the_log_since_start() -> None:
    """doctor attaches at 100 s: the histogram's first read is cumulative since the start, the
    request log (from the startup banner) has every arrival. A bucket with more logged
    arrivals before that read than finishes in it has that many unfinished: the youngest
    of them are taken, so the age is never more than the truth."""
    # before attach: 30 short requests (finished), one without max_tokens at 40 s
    logged = [(float(t), 64) for t in range(10, 40)] + [(40.0, 65516)]
    led = ledger_of([(100.0, [64] * 30), (105.0, [64] * 30), (110.0, [64] * 30)])
    reqs = [(40.0, 65516.0, "runaway")]
    assert oldest_logged(reqs, led, [], 112.0, busy=1.0) is None  # without the log since start: no claim
    got = oldest_logged(reqs, led, [], 112.0, busy=1.0, logged_since_start=logged)
    assert got is not None and got[2] == "runaway" and got[0] == pytest.approx(72.0)
    # the first read counts a finish in its bucket: it may be it, no claim
    done = ledger_of([(100.0, [64] * 30 + [65516]), (105.0, [64] * 30 + [65516])])
    assert oldest_logged(reqs, done, [], 112.0, busy=1.0, logged_since_start=logged) is None
    # a finish of its bucket after the first read may be it too
    later = ledger_of([(100.0, [64] * 30), (105.0, [64] * 30 + [65000])])
    assert oldest_logged(reqs, later, [], 112.0, busy=1.0, logged_since_start=logged) is None
    # two arrivals in the bucket, one finished by the first read: the younger is claimed (its age)
    two = logged + [(60.0, 65000)]
    one_done = ledger_of([(100.0, [64] * 30 + [65000]), (105.0, [64] * 30 + [65000])])
    both = [(40.0, 65516.0, "a"), (60.0, 65000.0, "b")]
    got2 = oldest_logged(both, one_done, [], 112.0, busy=2.0, logged_since_start=two)
    assert got2 is not None and got2[2] == "b" and got2[0] == pytest.approx(52.0)
    # a request logged in the few seconds before the first read is in neither count
    assert oldest_logged([(99.0, 65516.0, "edge")], led, [], 112.0, busy=1.0,
                         logged_since_start=[(99.0, 65516)]) is None


def test_the_log_since_start_needs_the_startup_banner_and_leaves_aborts_out() -> None:
    from vtop.core.requests import RequestTracker

    def received(rid: str, mt: int, sec: int) -> str:
        return (f"INFO 12-02 06:00:{sec:02d} [logger.py:43] Received request {rid}: prompt: 'hi', "
                f"params: SamplingParams(n=1, temperature=0.7, max_tokens={mt}), prompt_token_ids: [1, 2]")

    mid = RequestTracker(year=2026)
    mid.feed(received("cmpl-a", 64, 1), 1.0)
    assert mid.logged_since_start() is None  # picked up mid-run: no claim
    tr = RequestTracker(year=2026)
    tr.feed("INFO 12-02 06:00:00 [api_server.py:1] vLLM API server version 0.11.0", 0.0)
    tr.feed(received("cmpl-a", 64, 1), 1.0)
    tr.feed(received("cmpl-b", 65516, 2), 2.0)
    tr.feed("INFO 12-02 06:00:03 [async_llm.py:1] Aborted request(s) cmpl-a.", 3.0)
    got = tr.logged_since_start()
    assert got is not None and [mt for _, mt in got] == [65516]
    tr.reset()  # a restart seen by /metrics: the log no longer says what came since
    assert tr.logged_since_start() is None


def test_without_histograms_the_pending_finishes_stay_bounded_and_conservative() -> None:
    """A server that never gives an e2e histogram (a fleet read from Prometheus) had every finish
    pending for ever: a list that grew by one slot a scrape (~24 MB an hour at 1,000 instances scraped
    every 15 s, by estimate) and
    was walked at every sample. Now the oldest half is merged past MAX_PENDING: the same finishes,
    each no later than it was (fails on the old code: 3,000 slots)."""
    o = OldestInFlight()
    done = 0.0
    for t in range(3000):
        done += 1 + t % 3
        o.add(float(t), 2, None, done=done)
    assert len(o._pending) <= o.MAX_PENDING
    starts = o.pending_starts()
    assert len(starts) == sum(1 + t % 3 for t in range(1, 3000))  # every finish after the first sample
    assert starts == sorted(starts) and starts[0] == 0.0
    assert o.lower_bound_s == 0.0 and not o._cands  # nothing claimed, no candidate kept


def test_the_running_sums_answer_as_a_pass_over_the_pending_finishes() -> None:
    o = OldestInFlight()
    done = 0.0
    for t in range(40):
        done += t % 4
        o.add(float(t), 3, None, done=done)
    after = o._pending_after_fn()
    for t0 in (-1.0, 0.0, 3.5, 17.0, 39.0, 50.0):
        assert after(t0) == o._pending_after(t0)
    assert after(-1.0) > 0
