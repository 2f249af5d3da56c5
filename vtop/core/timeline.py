"""What the vLLM log says happened, before vtop started and since: a short timeline. Pure: no I/O.

Built from what the monitor already reads at attach, nothing parsed again: the phase tracker's
starts (this one and the earlier ones of a server restarted in the same log, with their phases
and durations, ready, failure or death, clean shutdown), its counts of warnings and errors by
kind, and the log's last stats line (:mod:`vtop.core.loghistory`). Times are the log's stamps
put on the monitor's clock by the measured log clock (:mod:`vtop.core.logclock`): "12 min ago"
is right for a log whose clock is hours off; each event also says the stamp as the log wrote it.

One answer for every face: the timeline key, the top of the snapshot bundle, ``doctor`` (a few
lines, :meth:`Timeline.lines`) and ``--json`` (:meth:`Timeline.to_json`, documented in
``vtop/schema/report-v2.schema.json``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vtop.core.loghistory import LogHistoryView, StatsPoint
from vtop.core.phases.types import Phase, StartupSnapshot
from vtop.model.fmt import dur

__all__ = ["Timeline", "TimelineEvent", "build_timeline"]

#: the events a timeline keeps (the latest)
MAX_EVENTS = 12
#: the kinds of warning and error it names (the most frequent)
MAX_KINDS = 3
#: a vLLM line's prefix before its message (``(APIServer pid=1) ERROR 12-02 01:02:00 [core.py:1] ``)
_PREFIX_RE = re.compile(r"^.*?\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d [\d:]+ \[[^\]]*\] ")


@dataclass(frozen=True)
class TimelineEvent:
    kind: str
    """``start``, ``ready``, ``failed`` (the start failed), ``died`` (the engine died after ready),
    ``stopped`` (a clean shutdown), ``earlier`` (stats lines of a run before the first start read: the
    log is read from its last start on), ``attach`` (vtop started reading the log)."""
    text: str
    at: float | None
    """When, on the monitor's monotonic clock (None: the log does not say)."""
    stamp: str | None
    """When, as the log's stamp says it (``MM-DD HH:MM:SS`` on the log's own clock)."""
    run: int
    """Which start of the server in the log (1 the first read); 0 for ``attach`` and ``earlier``."""


@dataclass(frozen=True)
class Timeline:
    now: float
    attached: float | None
    """When vtop started reading the log (monotonic)."""
    events: tuple[TimelineEvent, ...]
    starts: int
    """Starts of the server the log shows (a restart in place makes two)."""
    warnings: int
    errors: int
    kinds: tuple[tuple[str, int, str], ...]
    """(level, count, an example message) of the most frequent kinds of warning and error."""
    last_stats: StatsPoint | None

    def ago(self, at: float | None) -> str:
        if at is None:
            return "?"
        s = max(0.0, self.now - at)
        return f"{dur(s)} ago"

    def event_line(self, e: TimelineEvent) -> str:
        if e.kind == "attach":
            return f"{self.ago(e.at):>12}  -- vtop started reading the log --"
        stamp = f" [{e.stamp}]" if e.stamp else ""
        return f"{self.ago(e.at):>12}  {e.text}{stamp}"

    def problems_line(self) -> str:
        if not self.warnings and not self.errors:
            return "warnings 0, errors 0"
        top = "; ".join(f"{n}x {lvl.lower()} {msg[:70]}" for lvl, n, msg in self.kinds)
        return f"warnings {self.warnings}, errors {self.errors}" + (f": {top}" if top else "")

    def stats_line(self) -> str:
        p = self.last_stats
        if p is None:
            return "last stats line: none read (vLLM writes one every 10 s while requests run)"
        kv = "" if p.kv_pct is None else f", KV {p.kv_pct:.1f}%"
        pre = "" if p.preemptions is None else f", {p.preemptions} preempted"
        return (f"last stats line {self.ago(p.mono)}: running {p.running}, waiting {p.waiting}{kv}, "
                f"generation {p.gen_tps:g} tok/s, prompt {p.prompt_tps:g} tok/s{pre}")

    def header(self) -> str:
        at = "" if self.attached is None else f" (vtop started reading it {self.ago(self.attached)})"
        runs = f"{self.starts} starts read" if self.starts != 1 else "1 start read"
        return f"what the log says happened{at}: {runs}"

    def lines(self, max_events: int | None = None) -> list[str]:
        """The timeline in a few lines (``doctor``, the snapshot bundle's top): the header, the events
        (the latest ``max_events``, the rest counted), the warnings and errors, the last stats line."""
        evs = list(self.events)
        out = [self.header()]
        if max_events is not None and len(evs) > max_events:
            out.append(f"{'':>12}  ({len(evs) - max_events} earlier event(s) left out)")
            evs = evs[-max_events:]
        return [*out, *(self.event_line(e) for e in evs), self.problems_line(), self.stats_line()]

    def to_json(self) -> dict[str, Any]:
        p = self.last_stats
        return {
            "attached_ago_s": None if self.attached is None else round(max(0.0, self.now - self.attached), 1),
            "starts": self.starts,
            "events": [{"kind": e.kind, "text": e.text, "run": e.run, "log_stamp": e.stamp,
                        "ago_s": None if e.at is None else round(max(0.0, self.now - e.at), 1)} for e in self.events],
            "warnings": self.warnings,
            "errors": self.errors,
            "problem_kinds": [{"level": lvl, "count": n, "example": msg} for lvl, n, msg in self.kinds],
            "last_stats": None if p is None else {
                "ago_s": round(max(0.0, self.now - p.mono), 1), "running": p.running, "waiting": p.waiting,
                "kv_cache_pct": p.kv_pct, "generation_tps": p.gen_tps, "prompt_tps": p.prompt_tps,
                "preemptions": p.preemptions},
        }


def _stamp(t: float | None) -> str | None:
    if t is None:
        return None
    try:
        return time.strftime("%m-%d %H:%M:%S", time.gmtime(t))
    except (OverflowError, ValueError, OSError):
        return None


def _start_events(s: StartupSnapshot, run: int, to_mono: Any) -> list[TimelineEvent]:
    out: list[TimelineEvent] = []
    phases = [f"{v.label} {dur(v.duration_s)}" for v in s.phases
              if v.phase is not Phase.READY and v.duration_s is not None and v.duration_s >= 1.0]
    began = "start" if s.started is not None else "start (its beginning not in the log read)"
    text = f"{began}: " + (", ".join(phases) if phases else "no phase seen")
    out.append(TimelineEvent("start", text, to_mono(s.started), _stamp(s.started), run))
    if s.ready_at is not None:
        total = f" after {dur(s.total_s)}" if s.total_s is not None else ""
        src = {"log": "the log says so", "health": "/health answered", "inferred": "it served requests"}
        out.append(TimelineEvent("ready", f"ready{total} ({src.get(s.ready_source or '', s.ready_source)})",
                                 to_mono(s.ready_at), _stamp(s.ready_at), run))
    f = s.failure
    if s.state == "failed" and f is not None:
        line = _PREFIX_RE.sub("", f.line.strip())[:100]
        if f.phase is Phase.READY:
            after = s.died_after_ready_s
            when = f" {dur(after)} after ready" if after is not None else ""
            out.append(TimelineEvent("died", f"engine died{when}: {f.kind}: {line}", to_mono(f.at), _stamp(f.at), run))
        else:
            where = f" in {f.phase.label}" if f.phase is not None else ""
            out.append(TimelineEvent("failed", f"start failed{where}: {f.kind}: {line}", to_mono(f.at),
                                     _stamp(f.at), run))
    elif s.state == "stopped":
        out.append(TimelineEvent("stopped", "shut down (a clean shutdown)", None, None, run))
    return out


def build_timeline(current: StartupSnapshot, past: Sequence[StartupSnapshot], history: LogHistoryView | None,
                   kinds: Sequence[tuple[str, int, str, float | None, float | None]], *, warnings: int,
                   errors: int, attached: float | None, now: float) -> Timeline:
    """The timeline of a log: its earlier starts (``past``, oldest first) and the current one, placed
    on the monitor's clock by ``history``'s measured offset, with the attach among them."""
    def to_mono(t: float | None) -> float | None:
        m = history.to_mono(t) if history is not None else None
        return None if m is None else min(m, now)

    starts = [*past, current] if current.state != "idle" else list(past)
    events: list[TimelineEvent] = []
    first = to_mono(starts[0].started) if starts else None
    earlier = [p for p in history.stats if first is not None and p.mono < first] if history is not None else []
    if earlier:
        # the forward read begins at the log's last start: the stats lines read at attach reach further back
        events.append(TimelineEvent(
            "earlier", f"an earlier run of the server: {len(earlier)} stats line(s) up to {dur(now - earlier[-1].mono)} "
                       f"ago, the last with running {earlier[-1].running}, waiting {earlier[-1].waiting} (it restarted)",
            earlier[0].mono, None, 0))
    for i, s in enumerate(starts, 1):
        events += _start_events(s, i, to_mono)
    if attached is not None:
        # after the last event the log placed before it (an event with no time goes with the one before)
        pos, last = 0, None
        for j, e in enumerate(events):
            last = e.at if e.at is not None else last
            if last is not None and last <= attached:
                pos = j + 1
        events.insert(pos, TimelineEvent("attach", "vtop started reading the log", attached, None, 0))
    stats = history.last if history is not None else None
    return Timeline(now, attached, tuple(events[-MAX_EVENTS:]), len(starts), warnings, errors,
                    tuple((lvl, n, msg) for lvl, n, msg, _a, _b in kinds[:MAX_KINDS]), stats)
