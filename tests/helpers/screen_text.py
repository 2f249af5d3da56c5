"""The text of a screen, read back from Textual's SVG screenshot (``App.export_screenshot``).

Layout tests check what a user sees (which rows hold what), not pixels: the SVG's
``<text>`` elements carry their row (the clip path ``line-N``) and column (``x`` in
cells of a fixed width), so the screen's characters are put back on a grid. Also
used on the SVG files in screenshots/ (tests/unit/test_screenshots_current.py).
"""

from __future__ import annotations

import html
import re

_TEXT = re.compile(r'<text class="[^"]*" x="([\d.]+)" y="[\d.]+" textLength="([\d.]+)" '
                   r'clip-path="url\(#[\w-]+-line-(\d+)\)">([^<]*)</text>')
_CELL = re.compile(r'<clipPath id="[\w-]+-line-0">\s*<rect x="0" y="[\d.]+" width="([\d.]+)"')


def svg_lines(svg: str) -> list[str]:
    """The rows of text of a Textual SVG screenshot."""
    runs = [(float(x), float(w), int(row), html.unescape(t).replace("\xa0", " "))
            for x, w, row, t in _TEXT.findall(svg)]
    if not runs:
        return []
    # the narrowest one-character run gives the cell width (12.2 in Textual's SVGs)
    cell = min(w / len(t) for _, w, _, t in runs if t)
    rows: dict[int, dict[int, str]] = {}
    for x, _w, row, t in runs:
        col = round(x / cell)
        line = rows.setdefault(row, {})
        for i, ch in enumerate(t):
            line[col + i] = ch
    n = max(rows) + 1
    out = []
    for r in range(n):
        cells = rows.get(r, {})
        out.append("".join(cells.get(c, " ") for c in range(max(cells) + 1 if cells else 0)).rstrip())
    return out


def screen_lines(app: object) -> list[str]:
    """The rows of text the app shows now (its screenshot, read back)."""
    return svg_lines(app.export_screenshot())  # type: ignore[attr-defined]


def screen_text(app: object) -> str:
    return "\n".join(screen_lines(app))


def card_text(card, view, now, width: int = 96):  # type: ignore[no-untyped-def]
    """The card's rows for ``view`` at ``now``: what the server's polls say, without the cells drawn back
    from the log before vtop's first poll. Those come from the log watch, which the live app applies a
    moment after it reads the backlog, so a card rendered live before that moment and the same card later
    differ; the late look's own tests check them (tests/corpus/test_late_look.py)."""
    backfill = getattr(card, "backfill", None)
    card.backfill = None
    try:
        card.show(view, now)
        return ["".join(run[0] for run in line) for line in card.lines_cached(width)]
    finally:
        card.backfill = backfill
