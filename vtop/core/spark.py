"""Fixed-scale sparklines as plain strings.

Textual's built-in ``Sparkline`` scales to the min..max of its data, so a GPU
steady at 95 % draws the same flat line as an idle one. Here the scale is
fixed (0-100 by default), ``None`` is a blank cell (a gap: no data) and 0 is
the lowest bar, so "idle" and "unknown" never look alike.
"""

from __future__ import annotations

from typing import Sequence

BLOCKS = "▁▂▃▄▅▆▇█"
GAP = " "


def level(value: float, height: int, lo: float = 0.0, hi: float = 100.0) -> int:
    """Number of eighth-cells filled, 1..8*height (a value at or under ``lo`` still shows one)."""
    span = hi - lo
    frac = 0.0 if span <= 0 else (value - lo) / span
    frac = min(1.0, max(0.0, frac))
    return max(1, round(frac * 8 * height))


def spark_rows(
    values: Sequence[float | None], height: int = 1, lo: float = 0.0, hi: float = 100.0
) -> list[str]:
    """Rows of a sparkline, top row first; one character per value."""
    height = max(1, height)
    rows = [[GAP] * len(values) for _ in range(height)]
    for x, v in enumerate(values):
        if v is None or v != v:  # None or NaN: a gap
            continue
        n = level(v, height, lo, hi)
        for r in range(height):  # r = 0 is the bottom row
            fill = min(8, max(0, n - 8 * r))
            if fill:
                rows[height - 1 - r][x] = BLOCKS[fill - 1]
    return ["".join(r) for r in rows]


def spark(values: Sequence[float | None], lo: float = 0.0, hi: float = 100.0) -> str:
    """One row; the hot path of every redraw, so it avoids the general multi-row code."""
    span = hi - lo
    if span <= 0:
        return spark_rows(values, 1, lo, hi)[0]
    k = 8.0 / span
    out = []
    for v in values:
        if v is None or v != v:
            out.append(GAP)
            continue
        n = round((v - lo) * k)
        out.append(BLOCKS[0 if n < 1 else 7 if n > 8 else n - 1])
    return "".join(out)
