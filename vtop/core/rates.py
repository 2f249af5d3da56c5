"""Rates and recent quantiles from cumulative Prometheus series. Pure: no I/O.

Why windows over samples rather than "value now minus value before":

* **Counters reset when vLLM restarts.** A counter that goes down is a new
  process, not negative traffic. The window is re-baselined at the first
  sample of the new process (nothing before it is comparable), the rate
  is never negative, and the result says a reset happened so the UI can
  show "restarted" instead of a silent dip.
* **Lifetime histograms say nothing about now.** After an hour of traffic,
  a minute of slow requests barely moves lifetime percentiles. Quantiles
  here come from the *difference* of cumulative buckets between the oldest
  and newest sample in the window, interpolated like Prometheus'
  ``histogram_quantile``.
* **Time is an argument.** vtop injects a clock (``vtop/clock.py``) so tests
  and replays drive time; nothing here reads ``time``. Late samples (a
  starved monitor: a loaded box delays vtop's own polls) only widen the span between samples;
  rates stay correct because they divide by the real span.

Samples at or before the newest sample's time are ignored (a clock never
goes back); ``None``/NaN/inf values are gaps, not zeros.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

__all__ = [
    "CounterMapWindow",
    "CounterWindow",
    "HistogramDelta",
    "HistogramLike",
    "HistogramWindow",
    "MapDelta",
    "Quantiles",
    "WindowRate",
    "histogram_delta",
    "histogram_quantile",
    "histogram_quantiles",
]

Buckets = tuple[tuple[float, float], ...]


class HistogramLike(Protocol):
    """What :class:`vtop.sources.metrics_text.Histogram` offers (kept structural so
    that ``core`` does not import ``sources``)."""

    @property
    def buckets(self) -> Sequence[tuple[float, float]]: ...

    @property
    def sum(self) -> float | None: ...

    @property
    def count(self) -> float | None: ...


# --- pure functions ---------------------------------------------------------


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The q-quantile of cumulative ``(upper_bound, count)`` buckets.

    Same rules as Prometheus' ``histogram_quantile`` (promql/quantile.go),
    with ``None`` where Prometheus returns NaN:

    * buckets must end with ``+Inf``; fewer than two buckets or no
      observations give ``None``;
    * counts are made monotonic first (float noise, odd exporters);
    * a rank that falls in the ``+Inf`` bucket returns the highest finite
      bound (the true value is only known to be above it);
    * inside a bucket, linear interpolation; the first bucket's lower edge
      is 0 unless its upper bound is <= 0, when the upper bound is returned.
    """
    return histogram_quantiles((q,), buckets)[0]


def histogram_quantiles(qs: Sequence[float], buckets: Sequence[tuple[float, float]]) -> list[float | None]:
    """:func:`histogram_quantile` for each of ``qs``, sorting and accumulating the
    buckets once (a server card asks for p50, p95 and p99 of three histograms
    every second)."""
    for q in qs:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be within [0, 1], got {q!r}")
    bs = sorted(buckets)
    if len(bs) < 2 or bs[-1][0] != math.inf:
        return [None] * len(qs)
    counts: list[float] = []
    top = 0.0
    for _, c in bs:
        if math.isnan(c):
            return [None] * len(qs)
        top = max(top, c)
        counts.append(top)
    total = counts[-1]
    if total <= 0:
        return [None] * len(qs)
    return [_quantile_in(q * total, bs, counts) for q in qs]


def _quantile_in(rank: float, bs: list[tuple[float, float]], counts: list[float]) -> float | None:
    n = len(bs)
    b = bisect_left(counts, rank, 0, n - 1)  # the first bucket whose count reaches the rank
    if b == n - 1:
        return bs[n - 2][0]
    if b == 0 and bs[0][0] <= 0:
        return bs[0][0]
    start = 0.0
    end = bs[b][0]
    count = counts[b]
    if b > 0:
        start = bs[b - 1][0]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    if count <= 0:
        return start
    return start + (end - start) * (rank / count)


@dataclass(frozen=True, slots=True)
class HistogramDelta:
    """Observations between two scrapes of one histogram."""

    buckets: Buckets
    #: observations in the interval (the ``+Inf`` bucket delta, else ``_count``)
    count: float | None
    sum: float | None

    def quantile(self, q: float) -> float | None:
        return histogram_quantile(q, self.buckets)

    @property
    def mean(self) -> float | None:
        if self.sum is None or not self.count:
            return None
        return self.sum / self.count


def _is_reset_hist(old: HistogramLike, new: HistogramLike) -> bool:
    """True when ``new`` cannot follow ``old`` in one process: a count or a
    bucket went down, or the bucket layout changed."""
    if old.count is not None and new.count is not None and new.count < old.count:
        return True
    ob, nb = old.buckets, new.buckets
    if len(ob) != len(nb):
        return True
    return any(ole != nle or nc < oc for (ole, oc), (nle, nc) in zip(ob, nb))


def histogram_delta(old: HistogramLike, new: HistogramLike) -> HistogramDelta | None:
    """``new - old`` bucket by bucket, or ``None`` if ``new`` is not a later
    scrape of the same process (reset, or a different bucket layout)."""
    if _is_reset_hist(old, new):
        return None
    buckets = tuple((le, nc - oc) for (le, oc), (_, nc) in zip(old.buckets, new.buckets))
    if buckets and buckets[-1][0] == math.inf:
        count: float | None = buckets[-1][1]
    elif old.count is not None and new.count is not None:
        count = new.count - old.count
    else:
        count = None
    s = new.sum - old.sum if new.sum is not None and old.sum is not None else None
    return HistogramDelta(buckets=buckets, count=count, sum=s)


# --- windows ----------------------------------------------------------------

V = TypeVar("V")


class _Window(Generic[V]):
    """Samples ``(t, value)`` of one cumulative series within ``window_s``.

    A reset (value lower than the previous sample) drops every older sample:
    the new process is the new baseline.
    """

    def __init__(self, window_s: float, *, max_samples: int = 4096) -> None:
        if not window_s > 0:
            raise ValueError("window_s must be > 0")
        self.window_s = float(window_s)
        self._max_samples = max_samples
        # made at the first sample: most windows of a server stay empty (a family it does not
        # export, a fleet read from Prometheus), and an empty deque is a 0.6 kB block (issue 27:
        # 40 windows a server, 15 MB of a 1,000-instance fleet)
        self._samples: deque[tuple[float, V]] | tuple[()] = ()
        self._last_reset_t: float | None = None
        #: resets seen since creation
        self.resets = 0

    def _valid(self, value: V) -> bool:
        raise NotImplementedError

    def _is_reset(self, old: V, new: V) -> bool:
        raise NotImplementedError

    def add(self, t: float, value: V | None) -> bool:
        """Record a scrape. Returns True when it was a counter reset.

        ``None`` (scrape failed, metric absent) is a gap, not a zero.
        """
        if value is None or not math.isfinite(t) or not self._valid(value):
            return False
        s = self._samples
        if not isinstance(s, deque):
            s = self._samples = deque(maxlen=self._max_samples)
        if s and t <= s[-1][0]:
            return False
        reset = bool(s) and self._is_reset(s[-1][1], value)
        if reset:
            s.clear()
            self._last_reset_t = t
            self.resets += 1
        s.append((t, value))
        edge = t - self.window_s
        while len(s) > 1 and s[0][0] < edge:
            s.popleft()
        return reset

    def clear(self) -> None:
        self._samples = ()
        self._last_reset_t = None

    def _ends(self, now: float | None) -> tuple[tuple[float, V], tuple[float, V]] | None:
        """The oldest and the newest sample in ``[now - window_s, now]``, or None
        when fewer than two are. Every reading is newest minus oldest, so the
        samples in between are not copied: walked from each end, which is one
        step or none (``add`` drops what falls out of the window)."""
        s = self._samples
        if not isinstance(s, deque) or len(s) < 2:
            return None
        n = len(s)
        if now is None:
            now = s[-1][0]
        edge = now - self.window_s
        i = 0
        while i < n and s[i][0] < edge:
            i += 1
        j = n - 1
        while j >= i and s[j][0] > now:
            j -= 1
        if j - i < 1:
            return None
        return s[i], s[j]

    def _reset_in_window(self, now: float | None) -> bool:
        if self._last_reset_t is None or not self._samples:
            return False
        if now is None:
            now = self._samples[-1][0]
        return self._last_reset_t >= now - self.window_s

    def __len__(self) -> int:
        return len(self._samples)


@dataclass(frozen=True, slots=True)
class WindowRate:
    """A counter's increase over the window."""

    #: per second; None with fewer than two samples in the window
    rate: float | None
    delta: float | None
    #: seconds between the oldest and newest sample used (0 if < 2)
    span_s: float
    #: a reset (restart) happened within the window; it was re-baselined
    reset: bool


_NO_RATE = {flag: WindowRate(None, None, 0.0, flag) for flag in (False, True)}


class CounterWindow(_Window[float]):
    """Windowed rate of one counter, e.g. ``generation_tokens_total``."""

    def _valid(self, value: float) -> bool:
        return math.isfinite(value) and value >= 0

    def _is_reset(self, old: float, new: float) -> bool:
        return new < old

    def rate(self, now: float | None = None) -> WindowRate:
        """Rate over the samples in ``[now - window_s, now]`` (``now``
        defaults to the newest sample; pass the clock's time so that a
        series that stopped arriving goes to ``None`` instead of freezing)."""
        ends = self._ends(now)
        reset = self._reset_in_window(now)
        if ends is None:
            return _NO_RATE[reset]  # an empty or one-sample window (most of them): no new object
        (t0, v0), (t1, v1) = ends
        span = t1 - t0
        delta = max(0.0, v1 - v0)
        return WindowRate(delta / span if span > 0 else None, delta, span, reset)


@dataclass(frozen=True, slots=True)
class Quantiles:
    """Recent latency (or token-count) quantiles from bucket deltas."""

    p50: float | None
    p95: float | None
    p99: float | None
    #: observations in the window (None if unknown)
    count: float | None
    mean: float | None
    span_s: float
    reset: bool


class HistogramWindow(_Window[HistogramLike]):
    """Windowed quantiles of one histogram, e.g. ``time_to_first_token_seconds``."""

    def _valid(self, value: HistogramLike) -> bool:
        return bool(value.buckets) or value.count is not None

    def _is_reset(self, old: HistogramLike, new: HistogramLike) -> bool:
        return _is_reset_hist(old, new)

    def delta(self, now: float | None = None) -> HistogramDelta | None:
        """Buckets newest minus oldest in the window; None with < 2 samples."""
        ends = self._ends(now)
        if ends is None:
            return None
        return histogram_delta(ends[0][1], ends[1][1])

    _last_q: tuple[Any, ...] | None = None

    def quantiles(self, now: float | None = None, qs: tuple[float, float, float] = (0.5, 0.95, 0.99)) -> Quantiles:
        """p50/p95/p99 of what was observed within the window. All ``None``
        when nothing was observed (an idle server has no "current" latency).

        The answer depends only on the window's two end samples (and whether a
        reset is in it): asked again with the same ends (histograms are read every
        few seconds, views are made every second), it is not worked out again."""
        ends = self._ends(now)
        reset = self._reset_in_window(now)
        last = self._last_q
        if ends is not None and last is not None and last[0] is ends[0] and last[1] is ends[1] \
                and last[2] == reset and last[3] == qs:
            return last[4]
        if ends is None:
            return _NO_QUANTILES[reset]  # the common answer of an idle or unread histogram: no new object
        d = histogram_delta(ends[0][1], ends[1][1])
        if d is None:
            return Quantiles(None, None, None, None, None, 0.0, reset)
        span = ends[1][0] - ends[0][0]
        p = histogram_quantiles(qs, d.buckets)
        q = Quantiles(p[0], p[1], p[2], d.count, d.mean, span, reset)
        self._last_q = (ends[0], ends[1], reset, qs, q)
        return q


_NO_QUANTILES = {flag: Quantiles(None, None, None, None, None, 0.0, flag) for flag in (False, True)}


@dataclass(frozen=True, slots=True)
class MapDelta:
    """Increase of a labelled counter family over the window."""

    #: key -> increase; None with fewer than two samples in the window
    deltas: Mapping[str, float] | None = field(hash=False)
    span_s: float
    reset: bool

    @property
    def total(self) -> float | None:
        return math.fsum(self.deltas.values()) if self.deltas is not None else None


class CounterMapWindow(_Window[Mapping[str, float]]):
    """Windowed delta of counters by label, e.g. ``request_success_total``
    by finish reason.

    A key absent in the oldest sample counts from 0 (V0 creates a
    ``finished_reason`` series only when the first request ends that way);
    a key that goes down or disappears means a restart.
    """

    def _valid(self, value: Mapping[str, float]) -> bool:
        isfinite = math.isfinite
        for v in value.values():  # a loop, not all(<generator>): half the cost, every poll of every server
            if not (isfinite(v) and v >= 0):
                return False
        return True

    def _is_reset(self, old: Mapping[str, float], new: Mapping[str, float]) -> bool:
        for k, v in old.items():  # a loop, not any(<generator>): every poll of every server
            nv = new.get(k)
            if nv is None or nv < v:
                return True
        return False

    def add(self, t: float, value: Mapping[str, float] | None) -> bool:
        # Copy: the caller may reuse or mutate its dict.
        return super().add(t, None if value is None else dict(value))

    def delta(self, now: float | None = None) -> MapDelta:
        ends = self._ends(now)
        reset = self._reset_in_window(now)
        if ends is None:
            return MapDelta(None, 0.0, reset)
        (t0, old), (t1, new) = ends
        return MapDelta({k: max(0.0, v - old.get(k, 0.0)) for k, v in new.items()}, t1 - t0, reset)
