"""Time series with gaps, and resampling onto a fixed time axis.

Every chart in vtop shares one time axis: the last ``window_s`` seconds,
``width`` cells, newest on the right. A cell holds the maximum of the samples
that fell into it (a 1-second spike to 100 % must not vanish when 5 minutes
are squeezed into 60 cells), or ``None`` when no sample fell into it or all
were ``None``. So a source that stops answering draws a gap, never a zero.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Callable, Iterable, Iterator, Sequence

Point = tuple[float, "float | None"]


class Series:
    """A bounded list of ``(monotonic_t, value_or_None)``, oldest first."""

    __slots__ = ("_pts", "window_s")

    def __init__(self, window_s: float, max_points: int = 4096) -> None:
        self.window_s = window_s
        self._pts: deque[Point] = deque(maxlen=max_points)

    def append(self, t: float, value: float | None) -> None:
        if self._pts and t < self._pts[-1][0]:
            # A clock that went back (replay seek, bad input): start over rather than
            # keep a series that is no longer ordered.
            self._pts.clear()
        self._pts.append((t, value))
        cutoff = t - self.window_s
        while self._pts and self._pts[0][0] < cutoff:
            self._pts.popleft()

    def __len__(self) -> int:
        return len(self._pts)

    def __iter__(self) -> Iterator[Point]:
        return iter(self._pts)

    def latest(self) -> float | None:
        """The newest value, which may be ``None`` (the source gave no value)."""
        return self._pts[-1][1] if self._pts else None

    def latest_t(self) -> float | None:
        return self._pts[-1][0] if self._pts else None

    def values(self) -> list[float | None]:
        return [v for _, v in self._pts]

    def buckets(
        self,
        now: float,
        width: int,
        window_s: float | None = None,
        agg: Callable[[Sequence[float]], float] = max,
        max_gap: float | None = None,
    ) -> tuple[float | None, ...]:
        """Resample onto ``width`` cells covering ``(now - window, now]``."""
        return resample(self._pts, now, width, self.window_s if window_s is None else window_s, agg, max_gap)


def resample(
    pts: Iterable[Point],
    now: float,
    width: int,
    window_s: float,
    agg: Callable[[Sequence[float]], float] = max,
    max_gap: float | None = None,
) -> tuple[float | None, ...]:
    """Cells of ``window_s / width`` seconds, right-closed, newest last.

    With ``max_gap``, a cell that no sample fell into (cells narrower than the
    poll interval, or a poll that came a little late) repeats the last sample
    if that sample is at most ``max_gap`` seconds older than the cell's end:
    only a real silence of the source draws a gap.
    """
    if width <= 0:
        return ()
    cell = window_s / width
    start = now - window_s
    cells: list[list[float]] = [[] for _ in range(width)]
    last: list[Point | None] = [None] * width
    before: Point | None = None
    for t, v in pts:
        if t > now:
            continue
        if t <= start:
            before = (t, v)
            continue
        # Cells are right-closed, (start + i*cell, start + (i+1)*cell], so a
        # sample taken exactly "now" lands in the last cell.
        i = min(width - 1, max(0, math.ceil((t - start) / cell) - 1))
        last[i] = (t, v)
        if v is not None:
            cells[i].append(v)
    out: list[float | None] = []
    carry = before
    for i in range(width):
        if last[i] is not None:
            out.append(agg(cells[i]) if cells[i] else None)
            carry = last[i]
        elif max_gap is not None and carry is not None and start + (i + 1) * cell - carry[0] <= max_gap:
            out.append(carry[1])
        else:
            out.append(None)
    return tuple(out)
