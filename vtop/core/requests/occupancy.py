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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OccupancyBound"]

#: seconds of doubt on a read's time against a latency (the poll's clock against the scrape's moment)
SLACK_S = 0.25
#: seconds two reads' times may differ by and be one scrape (the counters, gauges and histograms of one
#: scrape are at one moment; a histogram carried over has its read time worked out again each poll)
EPS_S = 0.05
#: seconds (of time running) and tokens added to the upper side of every comparison
MARGIN_S = 1.0
MARGIN_TOKENS = 2.0
#: a claim holds only while a request is also proven to have run over a window of the last this many
#: seconds (an end nothing saw, hidden by a request that came in the same second, stops it within this)
RECENT_S = 15.0


@dataclass(slots=True)
class _Hist:
    """What one read of a histogram adds: the finishes since the read before."""

    total: float = 0.0
    n: int = 0
    #: the largest bucket bound holding one of them (inf for +Inf)
    top: float = 0.0
    #: the lower edge and the upper bound of each one's bucket, largest first
    lows: list[float] = field(default_factory=list)
    highs: list[float] = field(default_factory=list)


@dataclass(slots=True)
class _Read:
    """One read of the histograms: the finishes since the read before, their latencies and tokens."""

    h: float
    lat: _Hist = field(default_factory=_Hist)
    #: their generated tokens (None: the histogram is not there, or its count does not match)
    tok: _Hist | None = None
    #: the counter's slot start of each one, earliest first ([] when the counter does not match)
    slots: list[float] = field(default_factory=list)


def _delta(old: dict[float, float] | None, cum: dict[float, float], total: float | None,
           old_total: float | None) -> _Hist | None:
    """The finishes between two reads of a cumulative histogram (None: not comparable)."""
    if old is None or total is None or old_total is None:
        return None
    out = _Hist(max(0.0, total - old_total))
    below_new = below_old = 0.0
    lower = 0.0
    for le in sorted(cum):
        c = int(round((cum[le] - below_new) - (old.get(le, 0.0) - below_old)))
        below_new, below_old = cum[le], old.get(le, 0.0)
        if c < 0:
            return None  # went back: a restart
        if c:
            out.n += c
            out.top = le
            out.lows[:0] = [lower] * c
            out.highs[:0] = [le] * c
        lower = le
    return out


def _cum(h: Any) -> tuple[dict[float, float], float | None] | None:
    buckets = getattr(h, "buckets", None)
    if not buckets:
        return None
    return {float(le): float(c) for le, c in buckets}, getattr(h, "sum", None)


class OccupancyBound:
    """Feed one sample a poll (:meth:`add`); :attr:`age_s` (at :attr:`at`) is the answer, None when
    nothing is proven."""

    #: seconds of samples kept (the window never needs more than the alert's few minutes)
    KEEP_S = 600.0

    def __init__(self) -> None:
        self._t: list[float] = []
        self._r: list[float] = []
        self._g: list[float | None] = []
        #: running + waiting at each sample (inf where waiting is not known): the requests alive then
        self._busy: list[float] = []
        self._reads: list[_Read] = []
        self._lat: tuple[dict[float, float], float | None] | None = None
        self._tok: tuple[dict[float, float], float | None] | None = None
        self._prev: tuple[float, float, float | None, float | None] | None = None
        self._slots: list[tuple[float, float, int]] = []
        self.age_s: float | None = None
        """Seconds the oldest request in flight at :attr:`at` has been in flight at least (None: not proven)."""
        self.at: float | None = None
        """The histogram read the claim is made at."""
        self.since: float | None = None
        """When that request was already in flight (``at - age_s``)."""
        self.top_s: float | None = None
        """The longest latency bucket of the finishes of the window."""
        self.by: str | None = None
        """``"time"`` or ``"tokens"``: which measure proved it."""

    def _restart(self) -> None:
        self._t.clear()
        self._r.clear()
        self._g.clear()
        self._busy.clear()
        self._reads.clear()
        self._slots.clear()
        self._lat = self._tok = None  # the next read is the new baseline
        self.age_s = self.at = self.since = self.top_s = self.by = None

    def add(self, t: float, running: float | None, e2e: Any, hist_t: float | None = None,
            done: float | None = None, preempted: float | None = None, waiting: float | None = None,
            gen: float | None = None, gen_hist: Any = None) -> None:
        """One sample (as :meth:`OldestInFlight.add`), with the generation tokens counter (``gen``) and
        the ``request_generation_tokens`` histogram (``gen_hist``, read with the latency); ``waiting`` is
        not needed: a request that waits spends that time within its end-to-end latency, not in
        ``running``, and generates nothing."""
        prev, self._prev = self._prev, (t, running or 0.0, done, preempted)
        if running is None or done is None or running < 1 or self._ended_unseen(prev, running, done, preempted):
            self._restart()
            return
        if prev is not None and prev[2] is not None and done > prev[2]:
            self._slots.append((prev[0], t, int(round(done - prev[2]))))
        self._t.append(t)
        self._r.append(running)
        self._g.append(gen)
        self._busy.append(running + waiting if waiting is not None else math.inf)
        lat = _cum(e2e)
        ht = t if hist_t is None else hist_t
        if lat is not None and (not self._reads or ht > self._reads[-1].h + EPS_S):
            self._read(ht, lat, _cum(gen_hist))
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

    def _read(self, ht: float, lat: tuple[dict[float, float], float | None],
              tok: tuple[dict[float, float], float | None] | None) -> None:
        old_lat, old_tok = self._lat, self._tok
        self._lat, self._tok = lat, tok
        d = _delta(old_lat[0], lat[0], lat[1], old_lat[1]) if old_lat is not None else None
        if d is None:
            self._reads = [_Read(ht)]  # the baseline: finishes before it are not known
            self._slots = [s for s in self._slots if s[1] > ht]
            return
        dt = _delta(old_tok[0], tok[0], tok[1], old_tok[1]) if old_tok is not None and tok is not None else None
        rd = _Read(ht, d, dt if dt is not None and dt.n == d.n else None)
        mine = [s for s in self._slots if s[1] <= ht + SLACK_S]
        self._slots = [s for s in self._slots if s[1] > ht + SLACK_S]
        starts = [a for a, _b, n in mine for _ in range(n)]
        rd.slots = starts if len(starts) == d.n else []
        if len(starts) > d.n:
            # the counter saw finishes the histogram has not (read apart, or a finish reason it lacks): of
            # unknown length, they may be anything's end; the window starts over from this read
            self._restart()
            self._lat, self._tok = lat, tok
            self._reads = [_Read(ht)]
            return
        self._reads.append(rd)
        self._claim()

    def _trim(self, t: float) -> None:
        cut = bisect_left(self._t, t - self.KEEP_S)
        if cut > 32:
            del self._t[:cut]
            del self._r[:cut]
            del self._g[:cut]
            del self._busy[:cut]
            k = 0
            while k < len(self._reads) - 1 and self._reads[k].h < self._t[0]:
                k += 1
            del self._reads[:k]
            if self._reads:
                self._reads[0] = _Read(self._reads[0].h)  # the new baseline

    # ------------------------------------------------------------------ the claim

    def _time_level(self) -> list[float]:
        """∫ running from the first sample to each sample, each interval at the lesser of its two reads."""
        ts, rs = self._t, self._r
        pre = [0.0]
        for k in range(len(ts) - 1):
            pre.append(pre[-1] + min(rs[k], rs[k + 1]) * (ts[k + 1] - ts[k]))
        return pre

    def _token_level(self) -> list[float] | None:
        """The generation tokens counter at each sample (None where a sample lacks it)."""
        g = self._g
        if any(x is None for x in g) or any(rd.tok is None for rd in self._reads[1:]):
            return None
        return [float(x) for x in g if x is not None]

    def _at(self, level: list[float], x: float, *, up: bool) -> float:
        """``level`` at the first sample at or after ``x`` (``up``), else the last one at or before it."""
        k = bisect_left(self._t, x) if up else bisect_right(self._t, x) - 1
        return level[max(0, min(len(level) - 1, k))]

    @staticmethod
    def _before(rd: _Read, prev_h: float, x: float, of: _Hist, alive: float) -> float:
        """How much of ``of`` (the read's latencies, or tokens) its finishes may have run (made) before
        ``x`` at most; ``alive``: how many requests were in flight at ``x`` (a finish that began before
        ``x`` and ended after it is one of them)."""
        if rd.h <= x + EPS_S:
            return of.total  # all ended by x
        if not rd.slots or not math.isfinite(rd.lat.top):
            return of.total
        gaps = [max(0.0, a - x - SLACK_S) for a in rd.slots]  # the slots are in time order
        # those that may have begun before x: a latency reaching back from their slot past x; of them,
        # those that may have ended by x (their whole share: a slot that began before x), and of the
        # others, which were in flight at x, no more than were
        ended = sum(1 for a in rd.slots if a < x - EPS_S)
        maybe = min(sum(1 for g in gaps if rd.lat.top > g), int(min(ended + alive, float(of.n))))
        # at most the largest ``maybe`` of them, and at most the total less the least the others hold
        rest = of.n - maybe
        most = min(of.total, of.total - sum(of.lows[of.n - rest:]) if rest > 0 else of.total)
        if math.isfinite(of.top):
            most = min(most, sum(of.highs[:maybe]))
        if of is not rd.lat:
            return most
        # a latency: all of them less what each spent after x at least (the shorter of its bucket's lower
        # edge and the time from x to its slot, the latest slots with the shortest: the pairing that
        # gives least), or each at most the largest bound less the time from x to its slot
        after = sum(min(g, lo) for g, lo in zip(gaps, rd.lat.lows))
        return max(0.0, min(most, rd.lat.total - after, sum(rd.lat.top - g for g in gaps[:maybe] if rd.lat.top > g)))

    def _prove(self, level: list[float], amount: Callable[[_Read], _Hist], margin: float) -> float | None:
        """The earliest sample ``x`` such that the requests in flight now ran (made) more over
        ``[h_i, x]`` than the finishes can account for, for some read ``h_i`` before it; and the same
        over a window of the last ``RECENT_S``. None: not proven."""
        reads = self._reads
        now = reads[-1].h
        hs = [r.h for r in reads]
        cum = [0.0]
        for rd in reads[1:]:
            cum.append(cum[-1] + amount(rd).total)
        start = [cum[i] - self._at(level, h, up=True) for i, h in enumerate(hs)]
        best = [max(start[: i + 1]) for i in range(len(start))]
        k0 = bisect_left(hs, now - RECENT_S)
        first = None
        i = 0
        while i < len(self._t) and self._t[i] < now:
            x = self._t[i]
            i += 1
            j = bisect_right(hs, x + EPS_S) - 1  # the reads all by x
            if j < 0 or (first is not None and j < k0):
                continue
            alive = self._busy[i - 1]
            ran = sum(self._before(reads[k], hs[k - 1], x, amount(reads[k]), alive) for k in range(j + 1, len(reads))
                      if hs[k - 1] - reads[k].lat.top - SLACK_S < x)
            base = self._at(level, x, up=False) - cum[j] - ran
            if first is None and base + best[j] > margin:
                first = x
                # then only a window of the last RECENT_S is left to find: on from its first read
                i = max(i - 1, bisect_left(self._t, hs[k0] + SLACK_S) if k0 < len(hs) else i)
                continue
            if first is not None and base + max(start[k0: j + 1]) > margin:
                return first
        return None

    def _claim(self) -> None:
        """``F(now - h_i) - F(now - x)``: what the requests in flight now ran (made) in ``[h_i, x]``, the
        level over it less the finishes' share (requests that ran only after ``x`` are in both: they
        cancel); above 0, a request in flight now was already before ``x``. By time running and by
        tokens made (the counter is exact at each read: no dip between two reads is missed)."""
        self.age_s = self.at = self.since = self.by = None
        if len(self._reads) < 3:
            return
        got: list[tuple[float, str]] = []
        x = self._prove(self._time_level(), lambda rd: rd.lat, MARGIN_S)
        if x is not None:
            got.append((x, "time"))
        tokens = self._token_level()
        if tokens is not None:
            x = self._prove(tokens, lambda rd: rd.tok or _Hist(), MARGIN_TOKENS)
            if x is not None:
                got.append((x, "tokens"))
        if got:
            x, by = min(got)
            now = self._reads[-1].h
            self.age_s, self.at, self.since, self.by = now - x, now, x, by
            self.top_s = max((r.lat.top for r in self._reads[1:]), default=None)
