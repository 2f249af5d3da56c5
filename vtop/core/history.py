"""Time series with gaps, and resampling onto a fixed time axis.

Every chart in vtop shares one time axis: the last ``window_s`` seconds,
``width`` cells, newest on the right. A cell holds the maximum of the samples
that fell into it (a 1-second spike to 100 % must not vanish when 5 minutes
are squeezed into 60 cells), or ``None`` when no sample fell into it or all
were ``None``. So a source that stops answering draws a gap, never a zero.

Points are kept in a ring of two parallel ``array('d')`` (times, values) so
resampling can find each cell's slice with :func:`bisect` and reduce it with
the C-level ``max`` (a run that wraps the ring is two slices): with 8 GPUs x
3 charts redrawn every second, a per-point Python loop was the largest single
cost of a tick.

Cells sit on a fixed grid in monotonic time (multiples of the cell width),
not on "now": a chart then only moves when a cell boundary passes (a 5 min
chart of 60 cells shifts once every 5 s) instead of every sample re-sorting
into slightly different cells, which made still data shimmer and repainted
every chart row every second. All charts with the same window and width
share the grid, whichever source's "now" draws them. Only the last cell is
still filling, so :meth:`Series.buckets` remembers the finished cells of its
last answer and computes just the cells that are new or still open.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections.abc import Iterator, Sequence

Point = tuple[float, "float | None"]

_NONE = -math.inf  # how a None value is stored, so max() over a slice stays in C

#: the ring a Series starts with when it is given no size hint (it grows as needed)
_START_CAPACITY = 64


def capacity_for(window_s: float, interval_s: float, max_points: int = 4096) -> int:
    """How many points a series of ``window_s`` fed every ``interval_s`` holds, with room
    for polls that come a little early (a ring this size is never outgrown by them)."""
    if not (interval_s > 0 and math.isfinite(window_s) and math.isfinite(interval_s)):
        return _START_CAPACITY
    return max(_START_CAPACITY, min(max_points, math.ceil(window_s / interval_s * 1.1) + 8))


class Series:
    """A bounded series of ``(monotonic_t, value_or_None)``, oldest first.

    Stored in a ring of two ``array('d')`` (time, value; a ``None`` is ``-inf``):
    16 bytes a point and no Python object per point. A list of floats held 40 and
    grew with every point until the window was full: at ``--interval 0.25`` the
    charts' 10 minutes of 52 series were most of vtop's memory growth after
    minute 5 of bench/soak.py (issue #25). ``capacity`` (see :func:`capacity_for`)
    allocates the ring at once, so the memory is flat from the first point; a
    series fed faster than that grows its ring (doubling, up to ``max_points``),
    and past ``max_points`` the oldest point goes.
    """

    __slots__ = ("_t", "_v", "_cap", "_s", "_n", "window_s", "max_points", "_cells", "_sealed")

    def __init__(self, window_s: float, max_points: int = 4096, capacity: int | None = None) -> None:
        self.window_s = window_s
        self.max_points = max_points
        cap = max(1, min(max_points, capacity if capacity is not None else _START_CAPACITY))
        self._cap = cap
        self._t = array("d", bytes(8 * cap))
        self._v = array("d", bytes(8 * cap))
        self._s = 0  # physical index of the oldest live point
        self._n = 0  # live points
        # (width, window_s, max_gap) -> (grid index of the last cell, cells)
        self._cells: dict[tuple[int, float, float | None], tuple[int, list[float | None]]] = {}
        self._sealed = -math.inf  # the latest end of a cell remembered as finished

    # -- the ring ------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self._cap

    def _phys(self, i: int) -> int:
        j = self._s + i
        return j - self._cap if j >= self._cap else j

    def _t_at(self, i: int) -> float:
        return self._t[self._phys(i)]

    def _v_at(self, i: int) -> float:
        return self._v[self._phys(i)]

    def _resize(self, cap: int) -> None:
        """A ring of ``cap`` slots holding the live points, oldest at 0."""
        t, v = self._ordered()
        pad = bytes(8 * (cap - len(t)))
        self._t = t + array("d", pad)
        self._v = v + array("d", pad)
        self._cap, self._s = cap, 0

    def reserve(self, capacity: int) -> None:
        """Make room for ``capacity`` points now (a wider window), not as they come."""
        capacity = min(self.max_points, capacity)
        if capacity > self._cap:
            self._resize(capacity)

    def _ordered(self) -> tuple[array[float], array[float]]:
        """The live times and values, oldest first (copies)."""
        s, n, cap = self._s, self._n, self._cap
        if s + n <= cap:
            return self._t[s : s + n], self._v[s : s + n]
        return self._t[s:] + self._t[: s + n - cap], self._v[s:] + self._v[: s + n - cap]

    def _bisect(self, x: float, lo: int, hi: int) -> int:
        """``bisect_right`` over the live times (logical indexes ``lo..hi``), in C."""
        if lo >= hi:
            return lo
        s, cap = self._s, self._cap
        first = cap - s  # live points before the ring wraps
        if hi <= first:  # all in the first run
            return bisect_right(self._t, x, s + lo, s + hi) - s
        if lo >= first:  # all in the wrapped run
            return bisect_right(self._t, x, lo - first, hi - first) + first
        if x < self._t[0]:  # the answer is in the first run (the wrapped run starts later)
            return bisect_right(self._t, x, s + lo, cap) - s
        return bisect_right(self._t, x, 0, hi - first) + first

    def _max(self, a: int, b: int) -> float:
        """The largest stored value of logical ``a..b`` (b > a), in C."""
        s, cap = self._s, self._cap
        pa, pb = s + a, s + b
        if pb <= cap:
            return max(self._v[pa:pb])
        if pa >= cap:
            return max(self._v[pa - cap : pb - cap])
        return max(max(self._v[pa:]), max(self._v[: pb - cap]))

    def _drop(self, k: int) -> None:
        """Forget the ``k`` oldest points."""
        self._n -= k
        self._s = self._phys(k) if self._n else 0

    # -- the series ----------------------------------------------------------------
    def append(self, t: float, value: float | None) -> None:
        if self._n and t < self._t_at(self._n - 1):
            # A clock that went back (replay seek, bad input): start over rather
            # than keep a series that is no longer ordered.
            self._s = self._n = 0
            self._cells.clear()
        elif t <= self._sealed:
            # A sample older than a cell drawn as finished (a poll that started
            # before the boundary and landed after the chart was drawn): redo.
            self._cells.clear()
            self._sealed = -math.inf
        # Points at or before the window's start go once the oldest is before it.
        cutoff = t - self.window_s
        if self._n and self._t[self._s] < cutoff:
            self._drop(self._bisect(cutoff, 0, self._n))
        if self._n == self._cap:
            if self._cap < self.max_points:
                self._resize(min(self.max_points, 2 * self._cap))
            else:
                self._drop(1)  # at max_points: the oldest goes
        j = self._phys(self._n)
        self._t[j] = t
        self._v[j] = _NONE if value is None or value != value else float(value)
        self._n += 1

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[Point]:
        t, v = self._ordered()
        for a, b in zip(t, v):
            yield a, (None if b == _NONE else b)

    def latest(self) -> float | None:
        """The newest value, which may be ``None`` (the source gave no value)."""
        if not self._n:
            return None
        v = self._v_at(self._n - 1)
        return None if v == _NONE else v

    def latest_t(self) -> float | None:
        return self._t_at(self._n - 1) if self._n else None

    def peak(self) -> float | None:
        """The largest value still in the window (``None`` if there is none), computed in C."""
        m = self._max(0, self._n) if self._n else _NONE
        return None if m == _NONE else m

    def values(self) -> list[float | None]:
        return [v for _, v in self]

    def buckets(
        self,
        now: float,
        width: int,
        window_s: float | None = None,
        max_gap: float | None = None,
    ) -> tuple[float | None, ...]:
        """Resample onto ``width`` grid cells, the last one holding ``now`` (max per cell).

        Same answer as :func:`resample`; the cells that were already finished
        at the previous call are reused (new samples never land in them: they
        come in time order and later than the ``now`` they were drawn for).
        """
        win = self.window_s if window_s is None else window_s
        if width <= 0:
            return ()
        cell = win / width
        k = _grid_index(now, cell)
        key = (width, win, max_gap)
        prev = self._cells.get(key)
        if prev is not None and prev[0] <= k < prev[0] + width:
            shift = k - prev[0]
            keep = prev[1][shift : width - 1]  # finished cells still on the chart
            start_i = len(keep)  # recompute from here (the old open cell onwards)
        else:
            keep, start_i = [], 0
        fresh = self._cells_from(now, k, width, cell, start_i, max_gap)
        out = keep + fresh
        if len(self._cells) > 16:
            self._cells.clear()
        self._cells[key] = (k, out)
        self._sealed = max(self._sealed, (k - 1) * cell)
        return tuple(out)

    def _cells_from(
        self, now: float, k: int, width: int, cell: float, first: int, max_gap: float | None,
    ) -> list[float | None]:
        """Cells ``first..width-1`` of the chart whose last cell is grid cell ``k``."""
        start = (k - width) * cell  # the left edge of cell 0
        # Points after `now` are ignored; cell i covers (start + i*cell, start + (i+1)*cell].
        hi_all = self._bisect(now, 0, self._n)
        i0 = self._bisect(start + first * cell, 0, hi_all)
        carry_t: float | None = self._t_at(i0 - 1) if i0 > 0 else None
        carry_v = self._v_at(i0 - 1) if i0 > 0 else _NONE
        out: list[float | None] = []
        a = i0
        for i in range(first, width):
            end = start + (i + 1) * cell
            b = hi_all if i == width - 1 else self._bisect(end, a, hi_all)
            if b > a:
                m = self._max(a, b)
                out.append(None if m == _NONE else m)
                carry_t, carry_v = self._t_at(b - 1), self._v_at(b - 1)
                a = b
            elif max_gap is not None and carry_t is not None and min(end, now) - carry_t <= max_gap:
                out.append(None if carry_v == _NONE else carry_v)
            else:
                out.append(None)
        return out


def resample(
    pts: Sequence[Point],
    now: float,
    width: int,
    window_s: float,
    max_gap: float | None = None,
) -> tuple[float | None, ...]:
    """Cells of ``window_s / width`` seconds, right-closed, newest last.

    With ``max_gap``, a cell that no sample fell into (cells narrower than the
    poll interval, or a poll that came a little late) repeats the last sample
    if that sample is at most ``max_gap`` seconds older than the cell's end:
    only a real silence of the source draws a gap. ``pts`` must be in time order.
    """
    if width <= 0:
        return ()
    s = Series(math.inf, max_points=max(1, len(pts)), capacity=max(1, len(pts)))
    for t, v in pts:
        s.append(t, v)
    cell = window_s / width
    return tuple(s._cells_from(now, _grid_index(now, cell), width, cell, 0, max_gap))


def _grid_index(now: float, cell: float) -> int:
    """Index of the grid cell ``((i-1)*cell, i*cell]`` that holds ``now``."""
    return math.ceil(now / cell - 1e-9)
