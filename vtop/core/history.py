"""Time series with gaps, and resampling onto a fixed time axis.

Every chart in vtop shares one time axis: the last ``window_s`` seconds,
``width`` cells, newest on the right. A cell holds the maximum of the samples
that fell into it (a 1-second spike to 100 % must not vanish when 5 minutes
are squeezed into 60 cells), or ``None`` when no sample fell into it or all
were ``None``. So a source that stops answering draws a gap, never a zero.

Points are kept in two parallel lists (times, values) so resampling can find
each cell's slice with :func:`bisect` and reduce it with the C-level ``max``:
with 8 GPUs x 3 charts redrawn every second, a per-point Python loop was the
largest single cost of a tick.

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
from bisect import bisect_right
from collections.abc import Iterator, Sequence

Point = tuple[float, "float | None"]

_NONE = -math.inf  # how a None value is stored, so max() over a slice stays in C


class Series:
    """A bounded series of ``(monotonic_t, value_or_None)``, oldest first."""

    __slots__ = ("_t", "_v", "_lo", "window_s", "max_points", "_cells", "_sealed")

    def __init__(self, window_s: float, max_points: int = 4096) -> None:
        self.window_s = window_s
        self.max_points = max_points
        self._t: list[float] = []
        self._v: list[float] = []
        self._lo = 0  # index of the oldest live point; dead ones are dropped in batches
        # (width, window_s, max_gap) -> (grid index of the last cell, cells)
        self._cells: dict[tuple[int, float, float | None], tuple[int, list[float | None]]] = {}
        self._sealed = -math.inf  # the latest end of a cell remembered as finished

    def append(self, t: float, value: float | None) -> None:
        if self._lo < len(self._t) and t < self._t[-1]:
            # A clock that went back (replay seek, bad input): start over rather
            # than keep a series that is no longer ordered.
            self._t.clear()
            self._v.clear()
            self._lo = 0
            self._cells.clear()
        elif t <= self._sealed:
            # A sample older than a cell drawn as finished (a poll that started
            # before the boundary and landed after the chart was drawn): redo.
            self._cells.clear()
            self._sealed = -math.inf
        self._t.append(t)
        self._v.append(_NONE if value is None or value != value else float(value))
        cutoff = t - self.window_s
        lo = bisect_right(self._t, cutoff, self._lo) if self._t[self._lo] < cutoff else self._lo
        lo = max(lo, len(self._t) - self.max_points)
        self._lo = lo
        # Dead points go once they are an eighth of the lists (they held up to half: at
        # --interval 0.25 a GPU chart's 10 minutes of points stayed for 20, most of vtop's
        # growth from minute 10 to 20 of bench/soak.py); each drop moves the live ones once.
        if lo > 64 and lo > len(self._t) // 8:
            del self._t[:lo]
            del self._v[:lo]
            self._lo = 0

    def __len__(self) -> int:
        return len(self._t) - self._lo

    def __iter__(self) -> Iterator[Point]:
        for i in range(self._lo, len(self._t)):
            v = self._v[i]
            yield self._t[i], (None if v == _NONE else v)

    def latest(self) -> float | None:
        """The newest value, which may be ``None`` (the source gave no value)."""
        if len(self) == 0:
            return None
        v = self._v[-1]
        return None if v == _NONE else v

    def latest_t(self) -> float | None:
        return self._t[-1] if len(self) else None

    def peak(self) -> float | None:
        """The largest value still in the window (``None`` if there is none), computed in C."""
        m = max(self._v[self._lo :], default=_NONE)
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
        fresh = _cells(self._t, self._v, self._lo, now, k, width, cell, start_i, max_gap)
        out = keep + fresh
        if len(self._cells) > 16:
            self._cells.clear()
        self._cells[key] = (k, out)
        self._sealed = max(self._sealed, (k - 1) * cell)
        return tuple(out)


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
    ts = [t for t, _ in pts]
    vs = [_NONE if v is None or v != v else v for _, v in pts]
    return _resample(ts, vs, 0, now, width, window_s, max_gap)


def _grid_index(now: float, cell: float) -> int:
    """Index of the grid cell ``((i-1)*cell, i*cell]`` that holds ``now``."""
    return math.ceil(now / cell - 1e-9)


def _resample(
    ts: list[float], vs: list[float], lo: int, now: float, width: int, window_s: float, max_gap: float | None
) -> tuple[float | None, ...]:
    if width <= 0:
        return ()
    cell = window_s / width
    return tuple(_cells(ts, vs, lo, now, _grid_index(now, cell), width, cell, 0, max_gap))


def _cells(
    ts: list[float], vs: list[float], lo: int, now: float, k: int, width: int, cell: float,
    first: int, max_gap: float | None,
) -> list[float | None]:
    """Cells ``first..width-1`` of the chart whose last cell is grid cell ``k``."""
    start = (k - width) * cell  # the left edge of cell 0
    # Points after `now` are ignored; cell i covers (start + i*cell, start + (i+1)*cell].
    hi_all = bisect_right(ts, now, lo)
    i0 = bisect_right(ts, start + first * cell, lo, hi_all)
    carry_t: float | None = ts[i0 - 1] if i0 > lo else None
    carry_v = vs[i0 - 1] if i0 > lo else _NONE
    out: list[float | None] = []
    a = i0
    for i in range(first, width):
        end = start + (i + 1) * cell
        b = hi_all if i == width - 1 else bisect_right(ts, end, a, hi_all)
        if b > a:
            m = max(vs[a:b])
            out.append(None if m == _NONE else m)
            carry_t, carry_v = ts[b - 1], vs[b - 1]
            a = b
        elif max_gap is not None and carry_t is not None and min(end, now) - carry_t <= max_gap:
            out.append(None if carry_v == _NONE else carry_v)
        else:
            out.append(None)
    return out
