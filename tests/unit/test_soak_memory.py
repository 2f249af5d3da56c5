"""What a live vtop keeps grows with time only as far as a bound (#25 item 5).

bench/soak.py measures RSS over 30 minutes; these count the structures that kept
growing, so that a regression shows here in seconds: the monitor's log of alert
changes and each server's list of states (one entry per change, for as long as vtop
ran; a replayed H200 timeline changed the alerts about twice a minute), the
histogram buckets each /metrics read made anew, and the parser's caches."""

from __future__ import annotations

import json
import lzma
import random
from pathlib import Path
from typing import Any

from tests.helpers import diag_fixtures as F
from vtop.clock import FakeClock
from vtop.config import Config
from vtop.core.rules import Alert
from vtop.monitor import monitor as monitor_module
from vtop.monitor.monitor import Monitor
from vtop.sources import metrics_text as prom
from vtop.sources.vllm import poll_from_error

URL = "http://127.0.0.1:8000"
KEEP_CHANGES: int = getattr(monitor_module, "KEEP_CHANGES", 1000)  # (so that the old code fails on what it kept)


class FlappingDiagnoser:
    """Says a KV warning on every other look."""

    def __init__(self) -> None:
        self.n = 0

    def update(self, ev: Any) -> list[Alert]:
        self.n += 1
        return [Alert("kv_saturation", "warning", f"KV cache full ({self.n})", target=URL)] if self.n % 2 else []


def _flap(live: bool, looks: int) -> Monitor:
    clock = FakeClock()
    m = Monitor(Config(urls=(URL,)), clock=clock, live=live)
    m.diagnoser = FlappingDiagnoser()  # type: ignore[assignment]
    for _ in range(looks):
        clock.advance(0.25)
        m.diagnose()
    return m


def test_a_live_monitor_keeps_the_last_alert_changes() -> None:
    m = _flap(True, 5 * KEEP_CHANGES)
    assert KEEP_CHANGES <= len(m.alert_log) <= 2 * KEEP_CHANGES, len(m.alert_log)
    assert m.alert_log[-1].mono == m.clock.monotonic()  # the newest change is kept
    assert m.alert_log[-1].alerts == tuple(m.alerts)
    monos = [c.mono for c in m.alert_log]
    assert monos == sorted(monos) and all(b - a == 0.25 for a, b in zip(monos, monos[1:]))  # the latest, in order


def test_a_replay_keeps_every_alert_change() -> None:
    m = _flap(False, 3 * KEEP_CHANGES)
    assert len(m.alert_log) == 3 * KEEP_CHANGES


def test_a_flapping_server_keeps_the_last_states() -> None:
    clock = FakeClock()
    m = Monitor(Config(urls=(URL,)), clock=clock, live=True)
    metrics = F.fixture_metrics("h200-0.26.0-metrics-burst-running1024.txt")
    for i in range(3 * KEEP_CHANGES):
        clock.advance(1.0)
        mono = clock.monotonic()
        if i % 2:
            m.apply_server(URL, poll_from_error(URL, "refused", t=clock.time(), mono=mono))
        else:
            m.apply_server(URL, F.poll(URL, metrics, mono=mono, wall_offset=clock.time() - mono))
    h = m.servers[URL].history
    assert len(set(h)) >= 2, h[:6]  # it did flap
    assert len(h) <= 2 * KEEP_CHANGES, len(h)
    assert h[-1] == m.servers[URL].last_view.state  # type: ignore[union-attr]


# --- /metrics histograms -------------------------------------------------------------------
TIMELINE = Path(__file__).parent.parent / "fixtures" / "vllm" / "h200-0.26.0-metrics-timeline.jsonl.xz"
KEPT = ("request_params_max_tokens", "request_prompt_tokens", "e2e_request_latency_seconds")


def _timeline_texts(n: int) -> list[str]:
    rows = [json.loads(line) for line in lzma.open(TIMELINE, "rt")]
    return [r["text"] for r in sorted((r for r in rows if "text" in r), key=lambda r: r["t"])][:n]


def test_histograms_kept_across_reads_share_what_did_not_change() -> None:
    # The diagnoser keeps each sample's histograms for 15 minutes (the three it reads, KEPT):
    # every read made new (bound, count) tuples and floats, ~5.6 KB, though 5 s later 88 % of
    # the pairs of the H200 timeline are the same. Equal pairs must be one object.
    texts = _timeline_texts(120)
    # from an empty cache: the intern table is emptied when full, and the tests before this one in the
    # same worker may have left it near full (an emptying in the middle unshares the pairs read after it)
    prom.clear_line_cache()
    kept = [[getattr(prom.parse_vllm_metrics(t), a) for a in KEPT] for t in texts]
    pairs = [p for hs in kept for h in hs for p in h.buckets]
    assert len(pairs) > 100 * 50
    distinct_values = len(set(pairs))
    distinct_objects = len({id(p) for p in pairs})
    assert distinct_values < len(pairs) // 4  # the timeline repeats most pairs
    assert distinct_objects == distinct_values, (distinct_objects, distinct_values, len(pairs))
    # an idle server: the same payload twice gives the very same bucket tuples
    again = [getattr(prom.parse_vllm_metrics(texts[-1]), a) for a in KEPT]
    assert all(a.buckets is b.buckets for a, b in zip(again, kept[-1]))


def test_interned_buckets_stay_bounded_as_counts_change() -> None:
    rnd = random.Random(5)
    lines = []
    for _ in range(4000):  # 4000 reads of a histogram whose counts always change
        les = [0.1, 0.5, 1.0, 5.0]
        counts = sorted(rnd.randrange(10**9) for _ in les)
        body = "".join(f'vllm:e2e_request_latency_seconds_bucket{{engine="0",le="{le}",model_name="m"}} {c}.0\n'
                       for le, c in zip(les, counts))
        body += f'vllm:e2e_request_latency_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {counts[-1]}.0\n'
        m = prom.parse_vllm_metrics(body)
        assert m.e2e_request_latency_seconds is not None
        lines.append(len(m.e2e_request_latency_seconds.buckets))
    assert set(lines) == {5}
    assert len(prom._BUCKETS) <= prom._BUCKETS_MAX_ENTRIES


def test_the_line_cache_stays_bounded_as_label_values_change() -> None:
    # a label value that changes with every scrape (a model renamed, a pod hash) makes new lines
    for i in range(300):
        body = "".join(f'vllm:num_requests_running{{engine="{e}",model_name="m-{i}"}} 1.0\n' for e in range(80))
        assert prom.parse_vllm_metrics(body).running == 80.0
    assert len(prom._LINE_CACHE) <= prom._CACHE_MAX_ENTRIES


def test_requests_that_never_finish_keep_a_bounded_list_of_candidates() -> None:
    """Issue #46's soak: 20 minutes at --interval 0.25 with requests running and nothing finishing (a
    fake whose counters never move, a wedged engine): each sample added a candidate for the oldest
    request and only finishes removed them, up to 4,096 a server, each filtered at every sample (the
    soak's CPU rose to 12-18 % of a core). Bounded now, and the answer still the whole age."""
    from types import SimpleNamespace

    from vtop.core.requests.metrics_bound import OldestInFlight

    o = OldestInFlight()
    e2e = SimpleNamespace(buckets=[(1.0, 5.0), (10.0, 9.0), (float("inf"), 10.0)])  # read, never moving
    t0 = 1000.0
    n = 20 * 60 * 4
    for i in range(n + 1):
        o.add(t0 + i * 0.25, 8.0, e2e, done=10.0)
    assert len(o._cands) <= o.max_candidates <= 256, len(o._cands)
    assert o.lower_bound_s == n * 0.25  # the first sample's requests still run: at least 20 minutes


def test_the_still_time_of_the_generation_counter_is_the_scan_s_at_every_cut() -> None:
    """ServerState.flat_s (two bisections over kept cumulative sums) against the pass over the samples it
    replaced (issue #46's soak: that pass, over up to 15 minutes of samples every tick, grew the CPU with a
    stall's age), on samples kept as the diagnoser keeps them (about one a second, the oldest dropped)."""
    from vtop.core.rules.runaway import _flat_s_scan
    from vtop.core.rules.state import Sample, ServerState

    rng = random.Random(46)
    for _ in range(20):
        st = ServerState()
        t, gen = 0.0, 0.0
        for _ in range(rng.randint(2, 400)):
            t += rng.choice((0.25, 0.3, 0.5, 1.0, 1.7))
            gen += rng.choice((0.0, 0.0, 3.0)) if rng.random() > 0.05 else -gen  # still, moving, a restart
            st.add(Sample(t=t, running=1.0, waiting=0.0, kv=None, gen=gen if rng.random() > 0.03 else None,
                          prompt=None, preempt=None, done=None, length=None, max_tokens=None, prompt_hist=None,
                          hist_t=t), kv_thr=90.0, keep_s=120.0)
        for _ in range(30):
            a = rng.uniform(-5.0, t + 2.0)
            b = rng.uniform(a, t + 2.0)
            assert abs(st.flat_s(a, b) - _flat_s_scan(st, a, b)) < 1e-6, (a, b)
