"""``kv_saturation``: the KV cache full, with preemptions or a growing queue.

Evidence: KV usage (``kv_cache_usage_perc``) at or above ``kv_saturation_pct`` for
``kv_saturation_s`` in a row, or over the last ``kv_window_s`` at or above it ``kv_window_frac``
of the time with the median within 5 points (usage dips for a scrape as requests finish and
are preempted, then climbs back); and, over ``preempt_window_s``, preemptions counted
(``num_preemptions``) or ``waiting`` growing. A preemption storm (``preempt_storm_ps``) with a
growing queue is critical. The window reaches back before vtop's first sample through the log's
stats lines (their ``KV cache usage``), so ``doctor --window 15`` judges 30 s. Corpus traces: tests/corpus/traces/kv-saturation-many-seqs,
kv-saturation-preemptions; quiet on normal-bursts-long-queue and normal-bursts-waiting-queue.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from vtop.core.rules.alert import Alert
from vtop.core.rules.context import Ctx, per_server
from vtop.core.rules.util import LIVE, dur, is_proc, num, plural, short_url

if TYPE_CHECKING:
    from vtop.core.rules.state import ServerState
    from vtop.core.server import ServerView


class KvSaturation:
    """The KV-saturation rule (see the module's docstring)."""

    ids = ("kv_saturation",)

    def check(self, ctx: Ctx) -> list[Alert]:
        return per_server(ctx, kv_saturation)


def _kv_high_window(ctx: Ctx, url: str, st: ServerState) -> float | None:
    """When KV usage began to sit high, judged over the last ``kv_window_s``: at or above
    ``kv_saturation_pct`` most of the time (``kv_window_frac``), the median within 5 points of
    it. Real trace kv-saturation-preemptions: 96-98 % with a dip to 83-94 % every few
    scrapes, 15 s in a row at most."""
    th = ctx.th
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
    if statistics.median(kv for _, kv in pts) < th.kv_saturation_pct - 5.0:
        return None
    return high[0]

def kv_saturation(ctx: Ctx, url: str, v: ServerView, st: ServerState) -> Alert | None:
    """KV cache full with preemptions or a growing queue: usage at or above the threshold
    for ``kv_saturation_s`` in a row, or most of a ``kv_window_s`` window (it dips as
    requests finish). Traces: kv-saturation-many-seqs, kv-saturation-preemptions; quiet on
    normal-bursts-long-queue and normal-bursts-waiting-queue."""
    th = ctx.th
    s = st.last
    if s is None or v.state not in LIVE or s.kv is None:
        return None
    now = ctx.now
    since = st.kv_high_since if st.kv_high_since is not None and now - st.kv_high_since >= th.kv_saturation_s else None
    if since is None:
        since = _kv_high_window(ctx, url, st)
    if since is None:
        return None
    w0 = st.at(max(since, s.t - th.preempt_window_s)) or s
    win = s.t - w0.t
    pre = (s.preempt - w0.preempt) if s.preempt is not None and w0.preempt is not None else 0.0
    pre_ps = pre / win if win > 0 else 0.0
    wait_now, wait_then = s.waiting or 0.0, w0.waiting or 0.0
    growing = wait_now > 0 and wait_now > wait_then
    if not (pre > 0 or growing):
        return None
    short = short_url(url)
    ev = [
        f"KV cache at {s.kv:.1f} % (>= {th.kv_saturation_pct:.0f} % most of the time) for {dur(now - since)}, "
        f"running {num(s.running)}",
        f"{plural(pre, 'preemption')} in the last {dur(win)} ({pre_ps:.2f}/s): preempted requests lose their KV "
        "cache and are recomputed",
        f"waiting {num(wait_then)} -> {num(wait_now)}",
    ]
    proc = v.process
    seqs = getattr(proc, "max_num_seqs", None) if is_proc(proc) else None
    target = max(1, int((s.running or 0) * 0.75)) if s.running else None
    fix = [
        "Lower --max-num-seqs" + (f" (now {seqs})" if seqs else "")
        + (f", e.g. to {target}, " if target else " ")
        + "so the running sequences fit in the KV cache.",
        "Give the KV cache more room: raise --gpu-memory-utilization if the GPU has headroom, --kv-cache-dtype fp8, "
        "or more GPUs with --tensor-parallel-size.",
        "Limit concurrency upstream and set max_tokens in clients so sequences stay short.",
    ]
    sev = "critical" if pre_ps >= th.preempt_storm_ps and growing else "warning"
    what = "preemption storm" if pre > 0 else "queue growing"
    title = f"KV cache full on {short}: {s.kv:.0f} % for {dur(now - since)}, {what}"
    if pre > 0:
        title += f" ({num(pre)} in {dur(win)})"
    return Alert("kv_saturation", sev, title, tuple(ev), tuple(fix), url, since)

# ------------------------------------------------------------------ rule 6: GPU busy, SMs idle
