"""``kv_saturation``: the KV cache full, with preemptions or a growing queue.

Evidence: KV usage (``kv_cache_usage_perc``) at or above ``kv_saturation_pct`` for
``kv_saturation_s`` in a row, or over the last ``kv_window_s`` at or above it ``kv_window_frac``
of the time with the median within 5 points (usage dips for a scrape as requests finish and
are preempted, then climbs back); and, over ``preempt_window_s``, preemptions counted
(``num_preemptions``) or ``waiting`` growing. A preemption storm (``preempt_storm_ps``) with
requests waiting is critical. The window reaches back before vtop's first sample through the log's
stats lines (their ``KV cache usage``), so ``doctor --window 15`` judges 30 s. A sustained preemption storm with a queue
and a KV median within 10 points of the threshold counts too (vLLM preempts only for want of KV
blocks). Corpus traces: tests/corpus/traces/kv-saturation-many-seqs, kv-saturation-preemptions,
kv-saturation-few-long-seqs; quiet on normal-bursts-long-queue and normal-bursts-waiting-queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vtop.core.engines import flags_of
from vtop.core.rules.alert import Alert, Thresholds
from vtop.core.rules.context import Evidence, Memory, per_server
from vtop.core.rules.util import LIVE, dur, engine_of, num, plural, short_url
from vtop.core.stats import median

if TYPE_CHECKING:
    from vtop.core.loghistory import StatsPoint
    from vtop.core.rules.state import ServerState
    from vtop.core.server import ServerView


class KvSaturation:
    """The KV-saturation rule (see the module's docstring)."""

    ids = ("kv_saturation",)

    def check(self, ctx: Evidence, mem: Memory) -> list[Alert]:
        return per_server(ctx, mem, kv_saturation)


def _kv_high_window(ctx: Evidence, mem: Memory, url: str, st: ServerState) -> float | None:
    """When KV usage began to sit high, judged over the last ``kv_window_s``: at or above
    ``kv_saturation_pct`` most of the time (``kv_window_frac``), the median within 5 points of
    it. Real trace kv-saturation-preemptions: 96-98 % with a dip to 83-94 % every few
    scrapes, 15 s in a row at most."""
    th = mem.th
    s = st.last
    if s is None:
        return None
    pts = [(x.t, x.kv) for x in st.samples[-400:] if x.t >= s.t - th.kv_window_s and x.kv is not None]
    hist = ctx.history_of(url)
    if hist is not None and pts:
        # Before vtop's first sample, the log's stats lines (one every 10 s: the one just
        # before the window counts too, or the window would begin up to 10 s late).
        pts = hist.kv_points(s.t - th.kv_window_s - 10.0, pts[0][0]) + pts
    if len(pts) < 5 or s.t - pts[0][0] < th.kv_window_s * 0.8:
        return None
    high = [t for t, kv in pts if kv >= th.kv_saturation_pct]
    if len(high) < th.kv_window_frac * len(pts):
        return None
    if median(kv for _, kv in pts) < th.kv_saturation_pct - 5.0:
        return None
    return high[0]

def _preempt_storm_window(ctx: Evidence, mem: Memory, url: str, st: ServerState) -> float | None:
    """When a sustained preemption storm began: over the last ``kv_window_s``, at least
    ``preempt_storm_ps`` preemptions a second, a queue waiting in at least half the samples,
    and KV usage with a median within 10 points of ``kv_saturation_pct``. vLLM preempts a
    sequence only when it cannot get KV blocks for the running ones, so a storm that lasts is
    the cache being full even where usage reads a few points under the threshold between
    scrapes. Real trace kv-saturation-few-long-seqs: 6 long streams in an 8 MiB cache, KV 81-100 %
    (median 90-94 %, >= 95 % only 40 % of the seconds), 2.4 preemptions/s, 3 waiting; the
    window rule above never holds there. No normal trace of the corpus has a single preemption.

    Before vtop's first sample (``doctor --window 15``) the log's stats lines give KV usage and
    the queue; the rate itself comes from ``/metrics`` only (the V1 stats line has no
    preemption count), over at least 10 s of it."""
    th = mem.th
    s = st.last
    if s is None or s.preempt is None:
        return None
    t0 = s.t - th.kv_window_s
    pts = [x for x in st.samples[-400:] if x.t >= t0]
    if len(pts) < 5 or pts[0].preempt is None or s.t - pts[0].t < min(10.0, th.kv_window_s * 0.8):
        return None
    rate = (s.preempt - pts[0].preempt) / (s.t - pts[0].t)
    if rate < th.preempt_storm_ps:
        return None
    kvs = [(x.t, x.kv) for x in pts if x.kv is not None]
    waits = [(x.t, x.waiting or 0.0) for x in pts]
    hist = ctx.history_of(url)
    if hist is not None:
        before = [p for p in hist.stats if t0 - 10.0 <= p.mono < pts[0].t]
        kvs = [(p.mono, p.kv_pct) for p in before if p.kv_pct is not None] + kvs
        waits = [(p.mono, float(p.waiting)) for p in before] + waits
    if len(kvs) < 5 or s.t - min(kvs[0][0], waits[0][0]) < th.kv_window_s * 0.8:
        return None
    if median(kv for _, kv in kvs) < th.kv_saturation_pct - 10.0:
        return None
    if sum(1 for _, w in waits if w > 0) < 0.5 * len(waits):
        return None
    return min(kvs[0][0], waits[0][0])


@dataclass(frozen=True)
class KvFinding:
    """A KV cache full: since when (the incident's start), how full, running, and over the window
    ``window_s`` before now: preemptions and the queue then and now."""

    url: str
    since: float
    now: float
    kv_pct: float
    running: float | None
    window_s: float
    preemptions: float
    waiting_then: float
    waiting_now: float
    max_num_seqs: int | None
    #: before vtop's first sample, the bursts the log's stats lines show (``start``, ``end``, peak KV %,
    #: most waiting), when that is what names it; and the preemption counter then (since the start)
    bursts: tuple[tuple[float, float, float, int], ...] = ()
    preempt_total: float | None = None
    #: the engine (:data:`vtop.core.engines.ENGINES`; None: vLLM's words): the fix names its flags
    engine: str | None = None

    @property
    def preempt_ps(self) -> float:
        return self.preemptions / self.window_s if self.window_s > 0 else 0.0

    @property
    def queue_growing(self) -> bool:
        return self.waiting_now > 0 and self.waiting_now > self.waiting_then


def kv_saturation(ctx: Evidence, mem: Memory, url: str, v: ServerView, st: ServerState) -> Alert | None:
    """KV cache full with preemptions or a growing queue: usage at or above the threshold
    for ``kv_saturation_s`` in a row, or most of a ``kv_window_s`` window (it dips as
    requests finish). Traces: kv-saturation-many-seqs, kv-saturation-preemptions; quiet on
    normal-bursts-long-queue and normal-bursts-waiting-queue."""
    f = kv_finding(ctx, mem, url, v, st)
    return kv_alert(f, mem.th) if f is not None else None


def kv_finding(ctx: Evidence, mem: Memory, url: str, v: ServerView, st: ServerState) -> KvFinding | None:
    th = mem.th
    s = st.last
    if s is None or v.state not in LIVE or s.kv is None:
        return None
    if not s.running and not s.waiting:
        # nothing running and nothing waiting: nothing competes for the cache now, however full the window
        # behind was (the real H100 load that ended at 97 %: the window rule still held for 12 s at 0 %,
        # and the alert read "KV cache full: 0 %"); only the bursts the log holds from before vtop looked
        return _burst_finding(ctx, mem, url, st)
    now = ctx.now
    since = st.kv_high_since if st.kv_high_since is not None and now - st.kv_high_since >= th.kv_saturation_s else None
    if since is None:
        since = _kv_high_window(ctx, mem, url, st)
    if since is None:
        since = _preempt_storm_window(ctx, mem, url, st)
    if since is None:
        return _burst_finding(ctx, mem, url, st)
    w0 = st.at(max(since, s.t - th.preempt_window_s)) or s
    pre = (s.preempt - w0.preempt) if s.preempt is not None and w0.preempt is not None else 0.0
    proc = ctx.process_of(url)
    f = KvFinding(url, mem.started("kv_saturation", url, since), now, s.kv, s.running, s.t - w0.t, pre,
                  w0.waiting or 0.0, s.waiting or 0.0, proc.max_num_seqs if proc is not None else None,
                  engine=engine_of(ctx, url))
    return f if f.preemptions > 0 or f.queue_growing else None


def _log_bursts(ctx: Evidence, mem: Memory, url: str, st: ServerState) -> list[tuple[float, float, float, int]]:
    """The KV bursts the log's stats lines show in the ``kv_burst_lookback_s`` before now and
    before vtop's first sample: two lines in a row or more (10 s) with KV usage at or above
    ``kv_saturation_pct`` and requests waiting (or preempted). ``(start, end, peak KV %, most waiting)``."""
    th = mem.th
    hist = ctx.history_of(url)
    if hist is None or st.first_t is None:
        return []
    out: list[tuple[float, float, float, int]] = []
    run: list[StatsPoint] = []
    for p in [*(p for p in hist.stats if ctx.now - th.kv_burst_lookback_s <= p.mono < st.first_t), None]:
        full = p is not None and p.kv_pct is not None and p.kv_pct >= th.kv_saturation_pct \
            and (p.waiting > 0 or bool(p.preemptions))
        if p is not None and full:
            run.append(p)
            continue
        if len(run) >= 2:
            out.append((run[0].mono, run[-1].mono, max(q.kv_pct or 0.0 for q in run), max(q.waiting for q in run)))
        run = []
    return out


def _burst_finding(ctx: Evidence, mem: Memory, url: str, st: ServerState) -> KvFinding | None:
    """KV pressure that comes in bursts, seen before vtop looked (``doctor --window 15`` between two
    bursts): the log's stats lines hold the bursts, the preemption counter says requests were
    preempted (vLLM preempts only for want of KV blocks). No normal trace of the corpus has a
    single preemption."""
    s = st.last
    bursts = _log_bursts(ctx, mem, url, st)
    hist = ctx.history_of(url)
    line_pre = sum(p.preemptions or 0 for p in hist.stats) if hist is not None else 0
    if s is None or not bursts or not ((s.preempt or 0.0) > 0 or line_pre > 0):
        return None
    proc = ctx.process_of(url)
    return KvFinding(url, mem.started("kv_saturation", url, bursts[0][0]), ctx.now, s.kv or 0.0, s.running, 0.0, 0.0,
                     0.0, s.waiting or 0.0, proc.max_num_seqs if proc is not None else None, tuple(bursts),
                     s.preempt, engine_of(ctx, url))


def _burst_alert(f: KvFinding, th: Thresholds, fix: tuple[str, ...]) -> Alert:
    peak = max(b[2] for b in f.bursts)
    most = max(b[3] for b in f.bursts)
    n = len(f.bursts)
    pre = f"{plural(f.preempt_total, 'preemption')} since the server started" if f.preempt_total else "preemptions"
    ev = [f"the log's stats lines: KV cache at {b[2]:.1f} % with up to {b[3]} waiting for {dur(b[1] - b[0] + 10.0)}, "
          f"{dur(f.now - b[1])} ago" for b in f.bursts]
    words = flags_of(f.engine)
    ev.append(f"{pre} ({words['preempt_metric']}): {words['preempt_why']}")
    ev.append(f"now: KV cache at {f.kv_pct:.1f} %, running {num(f.running)}, waiting {num(f.waiting_now)}: "
              "between bursts")
    title = (f"KV cache full in bursts on {short_url(f.url)}: {plural(n, 'burst')} in the last "
             f"{dur(f.now - f.since)} up to {peak:.0f} % with {most} waiting, {pre}")
    return Alert("kv_saturation", "warning", title, tuple(ev), fix, f.url, f.since)


def kv_alert(f: KvFinding, th: Thresholds) -> Alert:
    """The words of a KV saturation."""
    span = dur(f.now - f.since)
    ev = [
        f"KV cache at {f.kv_pct:.1f} % (near or above {th.kv_saturation_pct:.0f} % most of the time) for {span}, "
        f"running {num(f.running)}",
        f"{plural(f.preemptions, 'preemption')} in the last {dur(f.window_s)} ({f.preempt_ps:.2f}/s): preempted "
        "requests lose their KV cache and are recomputed",
        f"waiting {num(f.waiting_then)} -> {num(f.waiting_now)}",
    ]
    target = max(1, int((f.running or 0) * 0.75)) if f.running else None
    fl = flags_of(f.engine)
    fix = (
        f"Lower {fl['seqs']}" + (f" (now {f.max_num_seqs})" if f.max_num_seqs else "")
        + (f", e.g. to {target}, " if target else " ")
        + "so the running sequences fit in the KV cache.",
        f"Give the KV cache more room: raise {fl['mem']} if the GPU has headroom, {fl['kv_fp8']}, "
        f"or more GPUs with {fl['tp']}.",
        "Limit concurrency upstream and set max_tokens in clients so sequences stay short.",
    )
    # a storm with requests waiting: the cache cannot hold the work it is given (a queue that holds
    # steady at 13 under 3.7 preemptions/s is as bad as one that grows; "growing" flipped every scrape)
    if f.bursts:
        return _burst_alert(f, th, fix)
    sev = "critical" if f.preempt_ps >= th.preempt_storm_ps and f.waiting_now > 0 else "warning"
    what = "preemption storm" if f.preemptions > 0 else "queue growing"
    title = f"KV cache full on {short_url(f.url)}: {f.kv_pct:.0f} % for {span}, {what}"
    if f.preemptions > 0:
        title += f" ({num(f.preemptions)} in {dur(f.window_s)})"
    return Alert("kv_saturation", sev, title, tuple(ev), fix, f.url, f.since)

# ------------------------------------------------------------------ rule 6: GPU busy, SMs idle
