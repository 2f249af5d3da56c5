"""The server card's charts before vtop looked, drawn back from the log's stats lines. Pure: no I/O.

An engineer opens vtop minutes into an incident; ``/metrics`` has no past, but while requests run
vLLM writes a stats line every 10 s (running, waiting, KV %, prompt and generation tok/s,
preemptions), and the monitor already reads the last 15 minutes of them at attach
(:mod:`vtop.core.loghistory`, on the monitor's clock: a log stamped hours off is measured against
arrival by :mod:`vtop.core.logclock`). :class:`Backfill` is those lines up to the server's first
live sample: the cells of a chart before that moment are the log's (:meth:`Backfill.cells`, on the
same grid as :meth:`vtop.core.history.Series.buckets`), the cells from it on are live. The log's
points count in the chart's scale (:meth:`Backfill.peak`) for as long as they are in the window,
so the scale does not jump when the live samples take over.

A restart inside the backlog (a start after a stats line: the log of a server restarted in place)
splits the charts: each run's lines are resampled apart, no cell mixes two runs, and the cell the
restart falls in is a mark (:meth:`Backfill.cells`), never a value.

The values are the lines' own: running and waiting as counted at the line, KV % as logged, the
throughputs as 10 s averages (the live chart's rate is over 5 s), preemptions as the interval's
count over the interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vtop.core.history import _grid_index, resample
from vtop.core.loghistory import SLACK_S, STATS_INTERVAL_S, LogHistoryView, StatsPoint

__all__ = ["BACKFILL_SERIES", "Backfill", "MAX_GAP_S", "backfill_from"]

#: a stats line stands for the cells up to the next one (a busy server logs every interval)
MAX_GAP_S = STATS_INTERVAL_S + SLACK_S

#: the charts the log's lines fill, by the names of the server tracker's series
BACKFILL_SERIES = ("running", "waiting", "kv_pct", "gen_tps", "prompt_tps", "preempt_ps")


def value_of(p: StatsPoint, name: str) -> float | None:
    """The value of chart ``name`` a stats line gives (None: the line does not say)."""
    if name == "running":
        return float(p.running)
    if name == "waiting":
        return float(p.waiting)
    if name == "kv_pct":
        return p.kv_pct
    if name == "gen_tps":
        return p.gen_tps
    if name == "prompt_tps":
        return p.prompt_tps
    if name == "preempt_ps":
        return None if p.preemptions is None else p.preemptions / STATS_INTERVAL_S
    raise KeyError(name)


@dataclass(frozen=True)
class Backfill:
    """The log's stats lines before the server's first live sample, on the monitor's clock."""

    until: float
    """The server's first live sample (monotonic): from then on its charts are live."""
    points: tuple[StatsPoint, ...]
    """The stats lines before ``until``, oldest first."""
    splits: tuple[float, ...] = ()
    """When the server restarted among them (monotonic, in order): the charts split there."""

    def runs(self) -> list[tuple[StatsPoint, ...]]:
        """The points cut at each split: one tuple a run of the server, oldest first."""
        out: list[tuple[StatsPoint, ...]] = []
        cur: list[StatsPoint] = []
        cuts = list(self.splits)
        for p in self.points:
            while cuts and p.mono >= cuts[0]:
                out.append(tuple(cur))
                cur = []
                cuts.pop(0)
            cur.append(p)
        out.append(tuple(cur))
        return [r for r in out if r]

    def series(self, name: str) -> list[tuple[float, float | None]]:
        return [(p.mono, value_of(p, name)) for p in self.points]

    def peak(self, name: str, since: float) -> float | None:
        """The largest value of ``name`` the lines from ``since`` on give (the chart's scale)."""
        vals = [v for p in self.points if p.mono >= since and (v := value_of(p, name)) is not None]
        return max(vals) if vals else None

    def cells(self, name: str, now: float, width: int, window_s: float) -> tuple[tuple[float | None, ...], frozenset[int]]:
        """The log's cells of a chart of ``width`` cells over ``window_s`` ending at ``now`` (the grid of
        :meth:`vtop.core.history.Series.buckets`): a value where the log's lines fill a cell that ends
        before the first live sample (None elsewhere), and the cells a restart falls in."""
        if width <= 0:
            return (), frozenset()
        if self.until <= now - window_s:  # all of it scrolled off the chart: the charts are live only
            return (None,) * width, frozenset()
        cell = window_s / width
        k = _grid_index(now, cell)
        start = (k - width) * cell
        out: list[float | None] = [None] * width
        marks: set[int] = set()
        bounds = [float("-inf"), *self.splits, float("inf")]
        for run in self.runs():
            lo_t = max(b for b in bounds if b <= run[0].mono)
            hi_t = min(b for b in bounds if b > run[-1].mono)
            vals = resample([(p.mono, value_of(p, name)) for p in run], now, width, window_s, max_gap=MAX_GAP_S)
            for i, v in enumerate(vals):
                a, b = start + i * cell, start + (i + 1) * cell
                if v is None or b > self.until or a < lo_t or b > hi_t:
                    continue
                out[i] = v
        for t in self.splits:
            i = _grid_index(t, cell) - (k - width) - 1
            if 0 <= i < width and t <= self.until:
                marks.add(i)
                out[i] = None
        return tuple(out), frozenset(marks)


def backfill_from(history: LogHistoryView | None, until: float | None,
                  starts: Sequence[float | None] = ()) -> Backfill | None:
    """The backfill of a server whose first live sample came at ``until``, from the log's history and
    the times its starts began (on the log's clock, as the phase tracker keeps them: the earlier runs'
    and this one's); None when no stats line came before ``until``."""
    if history is None or until is None:
        return None
    # the backlog read at attach, or a line that arrived before the first live sample: a line that came
    # after it is news, whatever its stamp says (a stamp of the second before the poll would otherwise draw
    # a live line as the past, and the replay of the same session, computed later, would disagree)
    pts = tuple(p for p in history.stats if p.mono < until and (p.arrived is None or p.arrived < until))
    if not pts:
        return None
    splits = sorted(m for t in starts if (m := history.to_mono(t)) is not None and pts[0].mono < m <= until)
    return Backfill(until, pts, tuple(splits))
