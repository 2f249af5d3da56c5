"""How old the oldest in-flight request is at least, from ``/metrics`` alone.

vLLM's gauges say how many requests run, not since when; its end-to-end latency
histogram says, for every request that finished, how long it took. Together they
bound the age of the oldest request still running, whatever other traffic comes and
goes: at a sample ``t0`` with ``r0`` requests running, every one of them that has
finished since shows up as a finish after ``t0`` whose latency reaches back to
``t0`` (a finish seen in ``(t_prev, t]`` with a latency in the bucket ``(lo, le]``
began no earlier than ``t_prev - le``). If fewer than ``r0`` such finishes were seen,
at least one request of ``t0`` still runs: the oldest in flight is at least
``now - t0`` old. So a runaway request (a client without ``max_tokens``) is seen by
its age while short requests finish around it, where "nothing finished for N s" is
reset by each of them.

Conservative by construction: a finish is counted against ``t0`` whenever it *may*
have begun by then (the bucket's upper bound, the earliest possible finish time), and
a candidate ``t0`` also needs ``running`` to have stayed at or above what it claims
is left. Counters that go back (a restart) start it over. Every sample is one
``(t, running, e2e histogram, its read time)``; the work per sample is the number of
candidates still alive (the samples since ``running`` was last 0 whose requests
have not all finished), times the finishes in that sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass
class _Candidate:
    t: float
    running: float
    finished: int = 0
    min_running: float = math.inf

    @property
    def left(self) -> float:
        return self.running - self.finished


class OldestInFlight:
    """Feed one sample a poll (:meth:`add`); :attr:`lower_bound_s` is the answer."""

    def __init__(self, max_candidates: int = 4096) -> None:
        self.max_candidates = max_candidates
        self._cands: list[_Candidate] = []
        self._hist: dict[float, float] | None = None
        self._hist_t: float | None = None
        self._now: float | None = None
        self._done_at_hist: float | None = None
        self.finishes = 0
        """Finishes seen (from the latency histogram) since the start."""

    def reset(self) -> None:
        self.__init__(self.max_candidates)  # type: ignore[misc]

    def add(self, t: float, running: float | None, e2e: Any, hist_t: float | None = None,
            done: float | None = None) -> None:
        """One sample: its time, ``vllm:num_requests_running``, the e2e latency histogram
        (an object with ``buckets``: ``(upper_bound, cumulative_count)``), when that
        histogram was read (``t`` unless carried over from an earlier scrape), and the
        finished-requests counter (``request_success_total`` summed). Finishes the counter
        has and the histogram does not are taken as of any length: they count against
        every sample (a histogram that lags or leaves some out never makes a request look
        older than it is)."""
        if running is None:
            return
        self._now = t
        ht = t if hist_t is None else hist_t
        if e2e is not None and getattr(e2e, "buckets", None):
            cur = {float(le): float(c) for le, c in e2e.buckets}
            last_t = -math.inf if self._hist_t is None else self._hist_t
            if self._hist is not None and ht > last_t:
                if any(cur.get(le, 0.0) < c for le, c in self._hist.items()):
                    self.reset()  # counters went back: a restart
                    self._now = t
                else:
                    seen = self._take(self._hist, cur, last_t)
                    if done is not None and self._done_at_hist is not None and done > self._done_at_hist:
                        unexplained = int(round(done - self._done_at_hist)) - seen
                        if unexplained > 0:
                            self.finishes += unexplained
                            for c in self._cands:
                                c.finished += unexplained
            if self._hist is None or ht > last_t:
                self._hist, self._hist_t = cur, ht
                self._done_at_hist = done
        if running < 1:
            self._cands.clear()  # nothing runs: every request of every earlier sample ended
            return
        for c in self._cands:
            c.min_running = min(c.min_running, running)
        self._cands = [c for c in self._cands if c.left >= 1 and c.min_running >= c.left]
        if len(self._cands) < self.max_candidates:
            self._cands.append(_Candidate(t, running, 0, running))

    def _take(self, prev: dict[float, float], cur: dict[float, float], t_prev: float) -> int:
        """Count the finishes between two reads of the histogram; returns how many."""
        seen = 0
        below = 0.0
        for le in sorted(cur):
            d = cur[le] - prev.get(le, 0.0)
            n = int(round(d - below))
            below = max(below, d)
            if n <= 0:
                continue
            seen += n
            self.finishes += n
            began_by = -math.inf if math.isinf(le) else t_prev - le
            for c in self._cands:
                if c.t >= began_by:
                    c.finished += n
        return seen

    @property
    def lower_bound_s(self) -> float:
        """Seconds the oldest in-flight request has run at least (0 when none is known)."""
        if self._now is None or not self._cands or self._hist is None:
            return 0.0  # no latency histogram (an old vLLM): finishes cannot be told
        return max(0.0, self._now - self._cands[0].t)

    @property
    def running_then(self) -> float | None:
        """How many requests ran at :attr:`since`."""
        return self._cands[0].running if self._cands else None

    @property
    def since(self) -> float | None:
        """The sample time the oldest known in-flight request was already running at."""
        return self._cands[0].t if self._cands else None
