"""How old the oldest request is at least, from the time requests spent running against the time
the finished ones took: what still holds under a closed loop of short requests.

:class:`vtop.core.requests.metrics_bound.OldestInFlight` follows the requests running at each sample
until enough finishes *may* be theirs. Under a closed loop of N short requests (each client sends
its next request when its last one is answered) beside one runaway, ``running`` never drops below
N + 1, and within a second or two after any sample N + 1 finishes may be that sample's requests
(each short one, alone, could have begun before it): every candidate dies, whatever N is, and the
runaway was never named (issue 38 item 10: 3 at a time, request logging off, no connection counters).

What does hold: the requests in flight at ``now`` have, together, spent
``F(Y) = ∫ running dt over [now - Y, now] - (that time spent by requests that ended)`` running in the
last ``Y`` seconds, a sum over them that stops growing with ``Y`` past each one's age. If no request in
flight now were older than ``Y1``, ``F`` would not grow past ``Y1``; so ``F(Y2) > F(Y1)`` for some
``Y2 > Y1`` proves one has been in flight longer than ``Y1``. A request runs within its end-to-end
latency (queued, preempted or answering, it is not in ``running``), so the latency bounds what it ran. ``F(Y2)`` is bounded below by taking every finish since ``now - Y2`` as
wholly inside the window (its end-to-end latency, the histogram's ``_sum``), ``F(Y1)`` above by
taking only the time finishes must have spent after ``now - Y1`` (a finish of a read that began
after ``now - Y1`` plus its largest latency bucket began after it; in the read across it, a finish
in the counter's slot ``(a, b]`` with a latency of at least ``lo`` (its bucket's lower edge) spent at
least ``min(lo, a - (now - Y1))`` after it, paired the way that gives least). Every short request
then counts on both sides and only the runaway's time is left over: with N short ones at a time, a
window ``Y2 - Y1`` of about 5 N s (the histograms come every 5 s) proves an age of ``Y1``.

Kept on the side of no claim: ``now`` is the last histogram read (a finish after it is of unknown
length); the window starts over when ``running`` drops to 0, when a request ends unseen (``running``
fell by more than the finishes and preemptions of that second: a client abort is in no histogram),
and when a counter goes back; an end hidden by a request that came in the same second (the gauge
cannot tell it) stops a claim within ``RECENT_S``: a request must also be proven over a window of
the last ``RECENT_S``. The gauge is read once a second and taken, between two reads, as the lesser
of them (a closed loop's next request follows a finish within milliseconds; a dip between two reads
is not seen). Work: per histogram read (every 5 s), the samples kept times the reads near each.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OccupancyBound"]

#: seconds of doubt on a read's time (the poll's clock against the scrape's moment)
SLACK_S = 0.25
#: seconds added to the upper side of every comparison
MARGIN_S = 1.0
#: a claim holds only while a request is also proven to have run over a window of the last this many
#: seconds (an end nothing saw, hidden by a request that came in the same second, stops it within this)
RECENT_S = 30.0


@dataclass(slots=True)
class _Read:
    """One read of the e2e latency histogram: the finishes since the read before."""

    h: float
    dsum: float = 0.0
    n: int = 0
    #: the largest bucket bound holding one of them (inf for +Inf)
    top: float = 0.0
    #: the lower edge of each one's bucket, largest first
    lows: list[float] = field(default_factory=list)
    #: the upper bound of each one's bucket, largest first
    highs: list[float] = field(default_factory=list)
    #: the counter's slot start of each one, earliest first ([] when the counter does not match)
    slots: list[float] = field(default_factory=list)


class OccupancyBound:
    """Feed one sample a poll (:meth:`add`); :attr:`age_s` (at :attr:`at`) is the answer, None when
    nothing is proven."""

    #: seconds of samples kept (the window never needs more than the alert's few minutes)
    KEEP_S = 600.0

    def __init__(self) -> None:
        self._t: list[float] = []
        self._r: list[float] = []
        self._reads: list[_Read] = []
        self._cum: dict[float, float] | None = None
        self._sum: float | None = None
        self._prev: tuple[float, float, float | None, float | None] | None = None
        self._slots: list[tuple[float, float, int]] = []
        self.age_s: float | None = None
        """Seconds the oldest request running at :attr:`at` has run at least (None: not proven)."""
        self.at: float | None = None
        """The histogram read the claim is made at."""
        self.since: float | None = None
        """When that request was already running (``at - age_s``)."""
        self.top_s: float | None = None
        """The longest latency bucket of the finishes of the window."""

    def _restart(self) -> None:
        self._t.clear()
        self._r.clear()
        self._reads.clear()
        self._slots.clear()
        self.age_s = self.at = self.since = self.top_s = None

    def add(self, t: float, running: float | None, e2e: Any, hist_t: float | None = None,
            done: float | None = None, preempted: float | None = None, waiting: float | None = None) -> None:
        """One sample (as :meth:`OldestInFlight.add`; ``waiting`` is not needed: a request that waits
        spends that time within its end-to-end latency, not in ``running``)."""
        prev, self._prev = self._prev, (t, running or 0.0, done, preempted)
        if running is None or done is None or running < 1 or self._ended_unseen(prev, running, done, preempted):
            self._restart()
            self._cum = None  # the next read is the new baseline
            return
        if prev is not None and prev[2] is not None and done > prev[2]:
            self._slots.append((prev[0], t, int(round(done - prev[2]))))
        self._t.append(t)
        self._r.append(running)
        buckets = getattr(e2e, "buckets", None)
        ht = t if hist_t is None else hist_t
        if buckets and (not self._reads or ht > self._reads[-1].h):
            self._read(ht, buckets, getattr(e2e, "sum", None))
        self._trim(t)

    @staticmethod
    def _ended_unseen(prev: tuple[float, float, float | None, float | None] | None, running: float, done: float,
                      preempted: float | None) -> bool:
        if prev is None or prev[2] is None:
            return False
        if done < prev[2]:
            return True  # the counter went back: a restart
        moved = 0.0 if preempted is None or prev[3] is None else max(0.0, preempted - prev[3])
        return prev[1] - running - (done - prev[2]) - moved >= 0.5

    def _read(self, ht: float, buckets: Any, total: float | None) -> None:
        cum = {float(le): float(c) for le, c in buckets}
        old, old_sum = self._cum, self._sum
        self._cum, self._sum = cum, total
        if old is None or old_sum is None or total is None:
            self._reads = [_Read(ht)]  # the baseline: finishes before it are not known
            self._slots = [s for s in self._slots if s[1] > ht]
            return
        rd = _Read(ht, max(0.0, total - old_sum))
        below_new = below_old = 0.0
        lower = 0.0
        for le in sorted(cum):
            c = int(round((cum[le] - below_new) - (old.get(le, 0.0) - below_old)))
            below_new, below_old = cum[le], old.get(le, 0.0)
            if c < 0:
                self._restart()
                return
            if c:
                rd.n += c
                rd.top = le
                rd.lows[:0] = [lower] * c
                rd.highs[:0] = [le] * c
            lower = le
        mine = [s for s in self._slots if s[1] <= ht + SLACK_S]
        self._slots = [s for s in self._slots if s[1] > ht + SLACK_S]
        starts = [a for a, _b, n in mine for _ in range(n)]
        rd.slots = starts if len(starts) == rd.n else []
        if len(starts) > rd.n:
            # the counter saw finishes the histogram has not (read apart, or a finish reason it lacks): of
            # unknown length, they may be anything's end; the window starts over from this read
            self._restart()
            self._reads = [_Read(ht)]
            return
        self._reads.append(rd)
        self._claim()

    def _trim(self, t: float) -> None:
        cut = bisect_left(self._t, t - self.KEEP_S)
        if cut > 32:
            del self._t[:cut]
            del self._r[:cut]
            k = 0
            while k < len(self._reads) - 1 and self._reads[k].h < self._t[0]:
                k += 1
            del self._reads[:k]
            if self._reads:
                self._reads[0] = _Read(self._reads[0].h)  # the new baseline

    # ------------------------------------------------------------------ the claim

    def _prefix(self) -> list[float]:
        """``pre[k]``: ∫ running from the first sample to sample ``k``, each interval at the lesser of its
        two reads."""
        ts, rs = self._t, self._r
        pre = [0.0]
        for k in range(len(ts) - 1):
            pre.append(pre[-1] + min(rs[k], rs[k + 1]) * (ts[k + 1] - ts[k]))
        return pre

    def _at(self, pre: list[float], x: float, *, up: bool) -> float:
        """``pre`` at the first sample at or after ``x`` (``up``), else the last one at or before it."""
        k = bisect_left(self._t, x) if up else bisect_right(self._t, x) - 1
        return pre[max(0, min(len(pre) - 1, k))]

    def _before(self, rd: _Read, prev_h: float, x: float) -> float:
        """Seconds the finishes of ``rd`` (read after ``prev_h``) may have spent running before ``x`` at most
        (a request runs within its end-to-end latency: a finish at ``e`` ran before ``x`` at most its
        latency less ``e - x``)."""
        if rd.h <= x - SLACK_S:
            return rd.dsum  # all ended before x
        if prev_h - rd.top - SLACK_S >= x:
            return 0.0  # all began after x
        if not rd.slots or not math.isfinite(rd.top):
            return rd.dsum
        gaps = sorted(max(0.0, a - x - SLACK_S) for a in rd.slots)
        # all their latencies less what each spent after x at least: the shorter of its latency (its
        # bucket's lower edge) and the time from x to its slot, the latest slots with the shortest
        # latencies (the pairing that gives least) ...
        after = sum(min(g, lo) for g, lo in zip(gaps, rd.lows))
        # ... or each at most the read's largest bucket bound less the time from x to its slot, and those
        # that may have run before x at most the largest bounds of the read
        ups = [rd.top - g for g in gaps if rd.top > g]
        return max(0.0, min(rd.dsum - after, sum(ups), sum(rd.highs[: len(ups)])))

    def _claim(self) -> None:
        """``F(now - h_i) - F(now - x) = ∫ running over [h_i, x] - the time finished requests ran in
        [h_i, x]`` (requests that ran only after ``x`` are in both: they cancel); above 0, a request
        running now has run since before ``x``. ``h_i`` a read (the finishes since are known), ``x`` any
        sample; the earliest ``x`` that proves it gives the age."""
        reads = self._reads
        self.age_s = self.at = self.since = None
        if len(reads) < 3:
            return
        now = reads[-1].h
        pre = self._prefix()
        cum = [0.0]
        for rd in reads[1:]:
            cum.append(cum[-1] + rd.dsum)
        # best[i]: the most cum[i'] - ∫ up to h_i' gives, over the reads i' <= i
        best: list[float] = []
        for i, rd in enumerate(reads):
            v = cum[i] - self._at(pre, rd.h, up=True)
            best.append(max(best[-1], v) if best else v)
        hs = [r.h for r in reads]
        first: float | None = None
        recent = False
        for x in self._t:
            if x >= now:
                break
            j = bisect_right(hs, x - SLACK_S) - 1  # the reads all before x
            if j < 0:
                continue
            ran = sum(self._before(reads[k], reads[k - 1].h, x) for k in range(j + 1, len(reads))
                      if reads[k - 1].h - reads[k].top - SLACK_S < x)
            base = self._at(pre, x, up=False) - cum[j] - ran
            if first is None and base + best[j] > MARGIN_S:
                first = x
            # ... and proven again over the last RECENT_S: a request that ended unseen in the second
            # another came (a client's hang-up hidden by a new request) stops counting within it
            k0 = bisect_left(hs, now - RECENT_S)
            if first is not None and k0 <= j and base + max(cum[i] - self._at(pre, hs[i], up=True)
                                                            for i in range(k0, j + 1)) > MARGIN_S:
                recent = True
                break
        if first is not None and recent:
            self.age_s, self.at, self.since = now - first, now, first
            self.top_s = max((r.top for r in reads[1:]), default=None)
