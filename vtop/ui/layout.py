"""Who gets the screen's rows: a plan made from the room there is and what is worth showing.

Textual's own layout shares rows by fractions; it cannot say "the vLLM card keeps
its queue rows before the log pane gets any" or "collapse a card to one line
before hiding it". This module does, and nothing else: each part of the screen
offers a few heights (its *levels*, smallest first: 0 is hidden, then one line,
then more), and :func:`plan` raises the parts level by level in a priority order
while rows are left. What no part takes goes to the log pane (when it is shown
and has at least :data:`LOG_MIN_ROWS`), so no rows are left empty between the
panels and the log.

Two orders: the quiet one (charts first, then the log), and the incident one
(a warning or critical alert is on screen): the alert's title, every card on
one line, the server's queue rows (running, waiting), then the alert's first
evidence and its whole fix, then fuller cards; the log pane only gets the rest.

Plain Python (no Textual): tests/unit/test_layout_plan.py checks the orders.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: the log pane's smallest useful height: its border and two lines
LOG_MIN_ROWS = 4


@dataclass(frozen=True)
class Part:
    name: str
    levels: tuple[int, ...]
    """Heights in rows, smallest first; ``levels[0]`` is what the part gets for nothing (often 0)."""


def plan(total: int, parts: Sequence[Part], order: Sequence[tuple[str, int]]) -> dict[str, int]:
    """The level of each part: all start at level 0, then each ``(name, level)`` step of
    ``order`` raises that part to that level if the extra rows fit (a step that does not
    fit is skipped; later, smaller steps may still fit)."""
    by_name = {p.name: p for p in parts}
    level = {p.name: 0 for p in parts}
    used = sum(p.levels[0] for p in parts)
    for name, want in order:
        p = by_name.get(name)
        if p is None or want >= len(p.levels) or want <= level[name]:
            continue
        extra = p.levels[want] - p.levels[level[name]]
        if used + extra <= total:
            used += extra
            level[name] = want
    return level


def heights(parts: Sequence[Part], level: dict[str, int]) -> dict[str, int]:
    return {p.name: p.levels[level[p.name]] for p in parts}
