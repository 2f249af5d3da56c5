"""How old the oldest in-flight request is at least, from ``/metrics`` alone.

vLLM's gauges say how many requests run, not since when; its end-to-end latency
histogram says, for every request that finished, how long it took. Together they
bound the age of the oldest request still running, whatever other traffic comes and
goes: at a sample ``t0`` with ``r0`` requests running, each of them that has finished
since is a finish after ``t0`` whose latency reaches back to ``t0``. If fewer than
``r0`` finishes *may* be such, at least one request of ``t0`` still runs: the oldest
in flight is at least ``now - t0`` old. So a runaway request (a client without
``max_tokens``) is seen by its age while short requests finish around it, where
"nothing finished for N s" is reset by each of them.

What a finish may be, and why it takes two metrics read at two cadences
------------------------------------------------------------------------
vtop reads the histograms every few seconds only (``vtop.sources.vllm.ScrapePlan``:
every ``HIST_EVERY_S`` = 5 s, the polls between carry them over), and the success
counter (``request_success_total``, every finish reason summed) every second. vLLM
counts a finish in both at once (V1: ``PrometheusStatLogger.record`` increments the
counter and observes the latency for each finished request, in one call; requests a
client aborts are in neither). So:

* **when** a finish happened is known to the second from the counter: a rise between the
  samples ``a`` and ``b`` is a *slot* ``(a, b]``;
* **how long** it took is known from the next histogram read: a bucket ``(lo, le]``;
* which slot goes with which bucket is not known.

A finish in slot ``(a, b]`` with a latency of at most ``le`` began after ``a - le``. It
may be one of the requests running at ``t0`` only if it may have begun by ``t0``
(``a - le < t0``) and had not ended by then (``b > t0``: the counter and the ``running``
gauge come from one scrape, and vLLM updates both from the same engine step, so a finish
counted at ``t0`` had already left ``running`` there). For a candidate ``t0`` the finishes
of one histogram interval are counted as the *largest* number the unknown pairing allows:
a maximum matching of slots to buckets under ``le >= a - t0`` (a threshold structure, so a
greedy pass over both sorted is exact). Whatever the real pairing, no more of those
finishes can be requests of ``t0``: the count never makes a request look older than it
is. The old way (every finish of a 5 s interval placed at the interval's start,
``began_by = t_prev - le``) made every short request that began within ``5 s + le`` after
``t0`` count against it: with short requests every 2-5 s each candidate died at the next
read, and the bound never passed 4 s live (issue 24: the real-tier runaway among short
requests was named at 68.9 s once and not within 100 s twice). With the counter's slots a
1 s request counts only against the candidates of the ~2.5 s before it. (The bucket stays
the limit: a request of 5-10 s may have begun 10 s before it ended.)

What the two do not say, or not yet, is kept on the side of no claim:

* finishes the counter has shown and no histogram has explained yet (*pending*) are of
  unknown length: a candidate they could all be requests of is known alive only up to the
  start of the slot that could end it, and its age is claimed as of then (a request that
  ends is never claimed for the seconds until the next read: the claim lags by up to
  ``HIST_EVERY_S``, it never runs ahead);
* a read where the histogram has fewer finishes than the counter's slots (read apart, or a
  finish reason it lacks): its finishes stay pending until the next read; still short then,
  the extra ones are of unknown length (``le = inf``: they count against every candidate
  they may end) and owed: when a later histogram shows more than the counter, the smallest
  of its buckets are taken as those (which leaves the larger ones, that count against more
  candidates, to the new slots);
* a histogram with more finishes than the counter (no counter, or it lags): the extra ones
  may have ended at any time of the interval, ``(last read, this read]``;
* a request a client aborts is counted nowhere (V1: ``OutputProcessor.abort_requests``
  records no stats), but it leaves ``running``: ``running`` falling by more than the
  finishes and preemptions of that second is an end nobody saw, and every candidate loses
  one for it (it may be any); a candidate also needs ``running`` to stay at or above what
  is left of it, even if every pending finish were its own. An abort in the second a new
  request came in cannot be told from nothing: the one gap, as for any gauge.
* ``running`` at 0 ends every candidate; counters that go back (a restart) start it over.

``SLACK_S`` widens every "may have begun by" by the sub-second skew between a poll's clock
and the scrape's moment.

With the request log on, :class:`MaxTokensLedger` and :func:`oldest_logged` name the
request itself: the log says when it came and its effective ``max_tokens``; the
``request_params_max_tokens`` histogram, read with the latency, says how many finishes of
each ``max_tokens`` bucket came since. A request without ``max_tokens`` is alone in its
bucket (``max_model_len - prompt``, above every ordinary request), so short requests never
count against it. (Before, the log's age was used only while ``/metrics`` had too little
history to judge, ``doctor``'s window, because V1 logs no line when a request ends: an
entry without an end may have ended long ago. That is why the live runaway among short
requests was not named from the log either.)

Every sample is one ``(t, running, e2e histogram, its read time, counter)``; the work per
histogram read is the candidates alive (the samples since ``running`` was last 0 whose
requests have not all finished) times the slots and buckets of that interval (a few of
each: at most one slot per sample, about 20 buckets).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: seconds of doubt on each sample's time (the poll's clock against the scrape's moment)
SLACK_S = 0.25


@dataclass
class _Candidate:
    t: float
    running: float
    finished: int = 0

    @property
    def left(self) -> float:
        return self.running - self.finished


@dataclass(frozen=True, slots=True)
class _Slot:
    """``n`` finishes the counter showed between the samples ``a`` and ``b``."""

    a: float
    b: float
    n: int
    #: of which with finish reason ``length`` (the request reached its max_tokens)
    n_length: int = 0


def _needs(slots: list[_Slot], t0: float) -> list[tuple[float, int]]:
    """What the finishes of ``slots`` need of a bucket to be requests of the sample ``t0``: a
    finish after ``a`` began by ``t0`` (+ slack) only if its latency reaches ``a - t0``;
    sorted from the largest need."""
    return sorted(((s.a - t0 - SLACK_S, s.n) for s in slots), reverse=True)


def max_matched(needs: list[tuple[float, int]], buckets: list[tuple[float, int]]) -> int:
    """The largest number of finishes pairable with buckets when a finish needing ``need``
    takes a bucket with ``le >= need`` (``needs`` and ``buckets`` as ``(value, count)``,
    each sorted from the largest). Greedy: a need above the largest bucket left is matched
    by none; else it takes from the largest (an exchange argument makes this optimal)."""
    i = j = 0
    got = 0
    ni = needs[0][1] if needs else 0
    nj = buckets[0][1] if buckets else 0
    while i < len(needs) and j < len(buckets):
        if needs[i][0] > buckets[j][0]:
            i += 1
            ni = needs[i][1] if i < len(needs) else 0
            continue
        m = min(ni, nj)
        got += m
        ni -= m
        nj -= m
        if ni == 0:
            i += 1
            ni = needs[i][1] if i < len(needs) else 0
        if nj == 0:
            j += 1
            nj = buckets[j][1] if j < len(buckets) else 0
    return got


class OldestInFlight:
    """Feed one sample a poll (:meth:`add`); :attr:`lower_bound_s` is the answer."""

    #: samples (or counter slots) between two histogram reads beyond which nothing is claimed
    #: (a server that stopped answering its histograms: the pending finishes cannot be told)
    MAX_INTERVAL = 120
    #: samples without any e2e histogram after which no candidate is kept until one comes (vtop
    #: reads them with its first poll and every 5 s after on the box: at 1 s polls, two reads missed)
    NO_HIST_GIVE_UP = 12

    def __init__(self, max_candidates: int = 256) -> None:
        self.max_candidates = max_candidates
        self._cands: list[_Candidate] = []
        self._hist: dict[float, float] | None = None
        self._hist_t: float | None = None
        self._now: float | None = None
        self._done: float | None = None
        self._done_t: float | None = None
        self._length: float | None = None
        #: counter slots since the last histogram read (lengths not known yet), in time order
        self._pending: list[_Slot] = []
        #: each pending slot's ``b`` and the finishes of the slots before it (``_cum[i]``: of
        #: ``_pending[:i]``), kept as slots come, so "finishes after t0" is one bisection
        self._pend_b: list[float] = []
        self._pend_cum: list[int] = [0]
        #: (t, running) of the samples since the last histogram read
        self._interval: list[tuple[float, float]] = []
        self._owed = 0
        self._postponed = False
        #: samples seen while no e2e histogram has been read
        self._no_hist = 0
        self._prev: tuple[float, float | None, float | None] | None = None
        self._best: tuple[float, _Candidate | None] = (0.0, None)
        self.finishes = 0
        """Finishes seen (histogram and counter together) since the start."""

    def reset(self) -> None:
        self.__init__(self.max_candidates)  # type: ignore[misc]

    def add(self, t: float, running: float | None, e2e: Any, hist_t: float | None = None,
            done: float | None = None, preempted: float | None = None, length: float | None = None) -> None:
        """One sample: its time, ``vllm:num_requests_running``, the e2e latency histogram
        (an object with ``buckets``: ``(upper_bound, cumulative_count)``), when that
        histogram was read (``t`` unless carried over from an earlier scrape), and the
        finished-requests counter (``request_success_total`` summed, from the same scrape
        as ``running``; None where the server has none: the histogram's read times are
        then all that say when), and the preemptions counter (a preempted request leaves
        ``running`` for ``waiting`` without ending), and the finishes of reason ``length``
        (:meth:`pending_starts` leaves them out for a request that cannot have reached its
        ``max_tokens`` yet)."""
        if running is None:
            return
        self._now = t
        ht = t if hist_t is None else hist_t
        prev = self._prev
        self._prev = (running, done, preempted)
        if prev is not None and prev[1] is not None and done is not None and done >= prev[1]:
            # ``running`` fell by more than what finished (or was preempted) this second: a
            # request ended unseen (a client abort is counted nowhere). It may be any one:
            # every candidate loses one for it.
            moved = 0.0 if preempted is None or prev[2] is None else max(0.0, preempted - prev[2])
            unseen = int(round(prev[0] - running - (done - prev[1]) - moved))
            if unseen > 0:
                for c in self._cands:
                    c.finished += unseen
        if done is not None:
            if self._done is not None and done < self._done:
                self.reset()  # the counter went back: a restart
                self._now = t
            elif self._done is not None and self._done_t is not None and done > self._done:
                n = int(round(done - self._done))
                n_len = 0 if length is None or self._length is None else int(round(length - self._length))
                self._push_pending(_Slot(self._done_t, t, n, min(n, max(0, n_len))))
            self._done, self._done_t = done, t
            self._length = length
        if e2e is not None and getattr(e2e, "buckets", None):
            cur = {float(le): float(c) for le, c in e2e.buckets}
            if self._hist is None:
                # Finishes before the first read have no latency to tell: of any length.
                self._settle([], ht, first=True)
                self._hist, self._hist_t = cur, ht
            elif self._hist_t is not None and ht > self._hist_t:
                if any(cur.get(le, 0.0) < c for le, c in self._hist.items()):
                    self.reset()  # counters went back: a restart
                    self._now = t
                    self._hist, self._hist_t = cur, ht
                else:
                    delta = self._delta(self._hist, cur)
                    behind = sum(n for _, n in delta) < sum(s.n for s in self._pending if s.b <= ht)
                    if behind and not self._postponed:
                        # The histogram lags the counter (read apart): its finishes stay
                        # pending (unknown lengths hold the claims) until the next read.
                        self._postponed = True
                    else:
                        self._postponed = False
                        self._settle(delta, ht)
                        self._hist, self._hist_t = cur, ht
        if self._hist is None:
            self._no_hist += 1
        if running < 1:
            self._cands.clear()  # nothing runs: every request of every earlier sample ended
        elif self._hist is None and self._no_hist > self.NO_HIST_GIVE_UP:
            # No e2e histogram yet after NO_HIST_GIVE_UP samples (a fleet read from Prometheus,
            # which does not ask for the buckets; a server that does not export them): nothing can
            # be told, so no candidate is kept until one comes (before, each sample filtered a list
            # that grew to MAX_INTERVAL: a third of a 1,000-instance fleet refresh's feed).
            self._cands.clear()
            self._interval.clear()
        elif self._hist is not None or self._done is not None:
            if len(self._interval) >= self.MAX_INTERVAL or len(self._pending) >= self.MAX_INTERVAL:
                self._cands.clear()  # no histogram for too long: nothing can be told
                self._interval.clear()
            self._interval.append((t, running))
            # A request of a candidate that ended unseen (a client abort is in no metric)
            # leaves ``running``: running below what is left of it, even if every pending
            # finish were its own, ends the claim.
            after = self._pending_after_fn()
            self._cands = [c for c in self._cands if c.left >= 1 and running + after(c.t) >= c.left]
            if len(self._cands) >= self.max_candidates:
                self._thin()
            self._cands.append(_Candidate(t, running))
        self._best = self._find_best()

    def _thin(self) -> None:
        """Every other candidate of the older half goes (the oldest stays): the candidates thin out
        with age, dense for the last seconds, sparse for the last hour, at most ``max_candidates``.

        Each sample adds one while requests run, and only finishes remove them: with nothing
        finishing (a wedged engine, a runaway alone, a fake whose counters never move) the list grew
        to 4,096 a server (17 minutes at --interval 0.25) and every sample filtered it whole: the
        soak's CPU rose from 5 % of a core to 12-18 % and its memory 20 MB after minute 5 (issue #46).
        Dropping a candidate only weakens a claim (the bound is a survivor's age, each a lower bound
        on its own): after an older one ends, the next survivor may be younger than a dropped one was,
        by at most the gap the thinning left (about its age over ``max_candidates / 4``)."""
        c = self._cands
        half = len(c) // 2
        self._cands = c[:half][::2] + c[half:]

    def _pending_after(self, t0: float) -> int:
        return sum(s.n for s in self._pending if s.b > t0)

    def _pending_after_fn(self) -> Any:
        """:meth:`_pending_after` for many ``t0`` at once: the slots are in time order (``b`` rises),
        so the running sums kept as they came and a bisection answer each in O(log n) instead of a
        pass over them all (a fleet of 1,000 servers without e2e histograms spent 1.4 s a refresh
        here, and rebuilding the sums every sample was still a third of a fleet refresh's feed)."""
        if not self._pending:
            return lambda t0: 0
        bs, cum = self._pend_b, self._pend_cum
        total = cum[-1]
        return lambda t0: total - cum[bisect_right(bs, t0)]

    #: pending slots kept at most (memory): a server that never gives an e2e histogram (a fleet
    #: read from Prometheus, an old vLLM) has its finishes pending for ever; past this the oldest
    #: half is merged into one slot (earliest start, latest end, their finishes summed: every
    #: finish may have happened earlier than it did, which only weakens a claim)
    MAX_PENDING = 4 * MAX_INTERVAL

    def _push_pending(self, slot: _Slot) -> None:
        pend = self._pending
        if pend and slot.b < pend[-1].b:
            # not in time order (never seen; fed in order): the sums are rebuilt in order
            self._set_pending(sorted([*pend, slot], key=lambda x: x.b))
            return
        pend.append(slot)
        self._pend_b.append(slot.b)
        self._pend_cum.append(self._pend_cum[-1] + slot.n)
        if len(pend) > self.MAX_PENDING:
            k = len(pend) // 2
            old = pend[:k]
            merged = _Slot(min(x.a for x in old), old[-1].b, sum(x.n for x in old), sum(x.n_length for x in old))
            self._set_pending([merged, *pend[k:]])

    def _set_pending(self, slots: list[_Slot]) -> None:
        self._pending = slots
        self._pend_b = [x.b for x in slots]
        cum = [0]
        for x in slots:
            cum.append(cum[-1] + x.n)
        self._pend_cum = cum

    @staticmethod
    def _delta(prev: dict[float, float], cur: dict[float, float]) -> list[tuple[float, int]]:
        """The finishes between two reads of a histogram, as ``(le, count)``, largest first."""
        out: list[tuple[float, int]] = []
        below = 0.0
        for le in sorted(cur):
            d = cur[le] - prev.get(le, 0.0)
            n = int(round(d - below))
            below = max(below, d)
            if n > 0:
                out.append((le, n))
        out.reverse()
        return out

    def _settle(self, buckets: list[tuple[float, int]], ht: float, *, first: bool = False) -> None:
        """A histogram read at ``ht``: the finishes since the last read (``buckets``) go with
        the counter's slots up to ``ht``, and count against the candidates they may be of
        (``first``: the first read, whose counts are the baseline: nothing owed)."""
        slots = [s for s in self._pending if s.b <= ht]
        self._set_pending([s for s in self._pending if s.b > ht])
        samples = [x for x in self._interval if x[0] <= ht]
        self._interval = [x for x in self._interval if x[0] > ht]
        n_hist = sum(n for _, n in buckets)
        n_cnt = sum(s.n for s in slots)
        if n_hist > n_cnt:
            extra = n_hist - n_cnt
            pay = min(extra, self._owed)
            if pay:
                # finishes the counter showed earlier, counted then as of any length: the
                # smallest buckets go to them (the larger count against more candidates)
                self._owed -= pay
                extra -= pay
                left = pay
                kept: list[tuple[float, int]] = []
                for le, n in reversed(buckets):
                    take = min(left, n)
                    left -= take
                    if n - take:
                        kept.append((le, n - take))
                buckets = list(reversed(kept))
            if extra:
                start = self._hist_t if self._hist_t is not None else -math.inf
                slots.append(_Slot(start, ht, extra))
        elif n_cnt > n_hist:
            # the counter saw more than the histogram: those are of unknown length (and owed)
            if not first:
                self._owed += n_cnt - n_hist
            buckets = [(math.inf, n_cnt - n_hist), *buckets]
        self.finishes += max(n_hist, n_cnt)
        if not slots or not buckets:
            return
        keep: list[_Candidate] = []
        for c in self._cands:
            mine = [s for s in slots if s.b > c.t]
            got = max_matched(_needs(mine, c.t), buckets) if mine else 0
            # The samples of the interval again, now that the finishes' lengths are known:
            # running below what was left of the candidate then, counting as its own only
            # the finishes that may be (up to then), is an end nothing showed.
            ok = True
            if got:
                for x, r in samples:
                    if x > c.t and r < c.left:
                        upto = [s for s in mine if s.b <= x]
                        if r + (max_matched(_needs(upto, c.t), buckets) if upto else 0) < c.left:
                            ok = False
                            break
            else:
                ok = all(r >= c.left for x, r in samples if x > c.t)
            if ok:
                c.finished += got
                keep.append(c)
        self._cands = keep

    def _alive_until(self, c: _Candidate) -> float | None:
        """How long ``c`` is known to have had a request running: now, or the start of the
        pending slot that could hold its last one (None: it may have ended before)."""
        if self._now is None:
            return None
        spare = c.left - 1
        for s in self._pending:  # in time order
            if s.b <= c.t:
                continue
            if s.n > spare:
                return s.a if s.a > c.t else None
            spare -= s.n
        return self._now

    def _find_best(self) -> tuple[float, _Candidate | None]:
        if self._now is None or self._hist is None:
            return 0.0, None
        best, who = 0.0, None
        for c in self._cands:  # oldest first: stop once none left can beat the best
            if self._now - c.t <= best:
                break
            until = self._alive_until(c)
            if until is not None and until - c.t > best:
                best, who = until - c.t, c
        return best, who

    @property
    def lower_bound_s(self) -> float:
        """Seconds the oldest in-flight request has run at least (0 when none is known; no
        latency histogram, an old vLLM: finishes cannot be told)."""
        return max(0.0, self._best[0])

    @property
    def running_then(self) -> float | None:
        """How many requests ran at :attr:`since`."""
        c = self._best[1]
        return c.running if c is not None else None

    @property
    def since(self) -> float | None:
        """The sample time the oldest known in-flight request was already running at."""
        c = self._best[1]
        return c.t if c is not None else None

    def pending_starts(self, *, but_length: bool = False) -> list[float]:
        """When each finish the counter showed since the last histogram read may have
        happened at the earliest (a slot's start, once per finish in it), in time order;
        ``but_length``: not those of reason ``length`` (for a request that cannot have
        generated its ``max_tokens`` yet: fewer tokens were generated since it came)."""
        return [s.a for s in self._pending for _ in range(s.n - (s.n_length if but_length else 0))]


class MaxTokensLedger:
    """The finishes of each read of ``vllm:request_params_max_tokens``, by bucket: what
    makes the request log's "in flight" a proof.

    V1 logs a request when it comes (``Received request X: params: SamplingParams(...,
    max_tokens=N, ...)``, the *effective* ``max_tokens``, after the server filled its
    default in) and, without ``--enable-log-outputs``, nothing when it ends; so a logged
    request without an end line may have ended long ago (its age is "at most"). But vLLM
    observes the same effective ``max_tokens`` in that histogram when a request finishes
    (one call with the success counter and the latency; a client abort is in none of them
    and is logged, ``Aborted request(s) X``). A logged request whose bucket shows fewer
    finishes since it came than requests of that bucket came before it has not finished:
    see :func:`oldest_logged`. Fed each sample (:meth:`add`); keeps the deltas of the
    reads that had finishes, at most ``keep`` of them.
    """

    def __init__(self, keep: int = 4096) -> None:
        self.keep = keep
        #: when the first histogram was read (finishes before it are not known)
        self.first_t: float | None = None
        self.last_t: float | None = None
        self.bounds: tuple[float, ...] = ()
        self._last: dict[float, float] | None = None
        #: (read time, {bucket upper bound: finishes since the read before})
        self.reads: list[tuple[float, dict[float, int]]] = []
        #: the first read's finishes per bucket (not cumulative): every finish since the server
        #: started (the histogram is cumulative), none lost to ``keep``
        self.first_counts: dict[float, int] | None = None

    def add(self, hist_t: float, hist: Any) -> None:
        buckets = getattr(hist, "buckets", None)
        if not buckets:
            return
        cur = {float(le): float(c) for le, c in buckets}
        if self._last is None or self.last_t is None:
            self._last, self.first_t, self.last_t = cur, hist_t, hist_t
            self.bounds = tuple(sorted(cur))
            below = 0.0
            self.first_counts = {}
            for le in self.bounds:
                self.first_counts[le] = int(round(cur[le] - below))
                below = max(below, cur[le])
            return
        if hist_t <= self.last_t:
            return
        if any(cur.get(le, 0.0) < c for le, c in self._last.items()):
            self.__init__(self.keep)  # type: ignore[misc]  # went back: a restart
            self.add(hist_t, hist)
            return
        delta = {le: n for le, n in OldestInFlight._delta(self._last, cur)}
        self._last, self.last_t = cur, hist_t
        self.bounds = tuple(sorted(cur))
        if delta:
            self.reads.append((hist_t, delta))
            if len(self.reads) > self.keep:
                # the oldest reads go: so must every request from before them
                self.first_t = self.reads[0][0]
                del self.reads[: len(self.reads) - self.keep]
                self.first_counts = None

    def bucket_of(self, max_tokens: float) -> float | None:
        """The upper bound of the bucket ``max_tokens`` is observed in (None: no histogram)."""
        for le in self.bounds:
            if max_tokens <= le:
                return le
        return None


#: seconds a request-log line may be read after the request came (the log is polled
#: about once a second; a backlog's times come from its own stamps)
LOG_LAG_S = 3.0


def _unfinished_at_first_read(reqs: list[tuple[float, float, Any]], ledger: MaxTokensLedger,
                              logged: Sequence[tuple[float, int]] | None, lag_s: float) -> set[int]:
    """The ``id()`` of the requests of ``reqs`` (logged before the ledger's first read) known
    not finished at that read: per bucket, the youngest ``k`` of the requests logged since the
    server's start before it, ``k`` = those requests less the finishes the read counts in
    the bucket (see :func:`oldest_logged`)."""
    first, counts = ledger.first_t, ledger.first_counts
    if not logged or first is None or counts is None:
        return set()
    before = first - lag_s
    arrived: dict[float, list[float]] = {}
    for since, n_max in logged:
        if since < before:
            le = ledger.bucket_of(n_max)
            if le is not None:
                arrived.setdefault(le, []).append(since)
    mine: dict[float, list[tuple[float, Any]]] = {}
    for since, mt_f, r in reqs:
        if since < before:
            le = ledger.bucket_of(mt_f)
            if le is not None and le in arrived:
                mine.setdefault(le, []).append((since, r))
    out: set[int] = set()
    for le, rows in mine.items():
        times = sorted(arrived[le])
        k = len(times) - counts.get(le, 0)
        if k <= 0:
            continue
        oldest_unfinished = times[-k]
        rows.sort(key=lambda x: x[0])
        out.update(id(r) for since, r in rows[-k:] if since >= oldest_unfinished)
    return out


def oldest_logged(reqs: list[tuple[float, float, Any]], ledger: MaxTokensLedger, pending: list[float],
                  now: float, busy: float | None, *, pending_but_length: list[float] | None = None,
                  generated_since: Callable[[float], float | None] | None = None,
                  lag_s: float = LOG_LAG_S,
                  logged_since_start: Sequence[tuple[float, int]] | None = None) -> tuple[float, float, Any] | None:
    """``(seconds, since, request)``: the logged request known to have run longest, or None.

    ``reqs`` are the request log's requests in flight (no end line, no abort line) as
    ``(since, effective max_tokens, request)`` on the samples' clock; ``pending`` the
    counter's finishes since the last histogram read (:meth:`OldestInFlight.pending_starts`),
    ``pending_but_length`` the same without those of reason ``length``, and
    ``generated_since(t)`` the tokens generated since ``t`` (all requests together: a
    request that came at ``t`` cannot have ended by reaching its ``max_tokens`` while
    that is below it); ``busy`` running + waiting now.

    A request that came at ``since`` (at most ``lag_s`` before: when its line was read) may
    be one of the finishes of its ``max_tokens`` bucket at each read after that; those are
    given to the oldest requests of the bucket first (as the facts allow: the answer is
    never older than the truth). The requests left were running at the last read; after it,
    the first ``i + 1`` of them (oldest first) are not all ended before the ``i + 1``-th
    pending finish that could be one of theirs. Only requests that came after the ledger's
    first read count (an earlier one may have ended unseen), unless ``logged_since_start``
    (``(since, max_tokens)`` of every request logged since the server's startup, aborted and
    refused ones left out) says otherwise: vtop attached late (``doctor``), but the first
    read of the histogram is cumulative since the start too, so a bucket with ``k`` more
    requests logged before that read than finishes in it had ``k`` requests not finished
    then. Which ones is not known: the ``k`` youngest are taken (the older ones as
    finished), so the age claimed is never more than the oldest unfinished one's; a
    request alone in its bucket (no ``max_tokens`` from the client) is exactly itself.
    Requests of the ``lag_s`` around the first read are left out of both counts (whether
    the read saw them finish is not known: leaving them out only lowers ``k``). A log that holds more such
    requests than run or wait now has requests that never ran (refused after they were
    logged): it proves nothing then.
    """
    if ledger.first_t is None or ledger.last_t is None:
        return None
    seeded = _unfinished_at_first_read(reqs, ledger, logged_since_start, lag_s)
    by_bucket: dict[float, list[tuple[float, float, Any]]] = {}
    for since, mt, r in reqs:
        if since - lag_s < ledger.first_t and id(r) not in seeded:
            continue
        le = ledger.bucket_of(mt)
        if le is not None:
            by_bucket.setdefault(le, []).append((since, mt, r))
    if not by_bucket:
        return None
    left: list[tuple[float, float, Any]] = []
    reads = ledger.reads
    for le, group in by_bucket.items():
        group.sort(key=lambda x: x[0])
        gone = 0  # the oldest ``gone`` of the group are taken as finished
        eligible = 0  # those that came before the read (both in time order: one pass)
        for ht, delta in reads[bisect_left(reads, group[0][0] - lag_s, key=lambda x: x[0]):]:
            n = delta.get(le, 0)
            if not n:
                continue
            while eligible < len(group) and group[eligible][0] - lag_s < ht:
                eligible += 1
            gone = max(gone, min(eligible, gone + n))
        left.extend(group[gone:])
    if not left or (busy is not None and len(left) - len(pending) > busy):
        return None
    left.sort(key=lambda x: x[0])
    best: tuple[float, float, Any] | None = None
    short_of_max = True  # every request so far cannot have reached its max_tokens
    for i, (since, mt, r) in enumerate(left):
        if short_of_max:
            g = generated_since(since - lag_s) if generated_since is not None else None
            short_of_max = pending_but_length is not None and g is not None and g < mt
        ends = pending_but_length if short_of_max and pending_but_length is not None else pending
        until = min(ends[i], now) if i < len(ends) else now
        if until > since and (best is None or until - since > best[0]):
            best = (until - since, since, r)
    return best
