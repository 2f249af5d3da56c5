"""Alert hysteresis: an incident keeps its identity, its start and its severity while it lasts.

The rules judge each tick afresh, and the numbers they judge wobble: a KV cache at 95-100 % dips
under the threshold for a scrape as requests finish, its preemption rate crosses the storm line
and falls back; on the corpus's KV traces the raw verdict flipped CRITICAL <-> WARNING 23 to 41
times in one incident, and each flip restarted the title's "for Ns" (issue 38 item 5). An on-call
engineer (and a pager fed by ``vtop_alert``) must see one incident: so a severity rises at once,
and falls to a lower severity only after the rules said lower for ``alert_hold_s`` in a row, on vtop's own clock (the ticks' ``now``: injected, a replay gives the
same answer at any speed). While it lasts the incident keeps the start of its first alert (the
earliest ``since`` any of its alerts gave), and the rules word "for Ns" from there
(:meth:`AlertHold.started`). An alert the rules stop raising clears at once (an incident that ended must
not read as on: the scoreboard's "cleared", a pager's resolve), but its incident is remembered for
``alert_clear_hold_s``: an alert of the same rule and target back within that is the same incident, with
its start and its severity (a scrape that dipped under a line). One place for every rule and every face: the screen, ``doctor``,
``--once``, the exporter all read the alerts after this.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vtop.core.rules.alert import RANK, Alert

__all__ = ["AlertHold", "Incident"]

Key = tuple[str, str | None]


def _rank(severity: str) -> int:
    return RANK.get(severity, len(RANK))


@dataclass(slots=True)
class Incident:
    """One alert's incident: its start, the severity shown, and since when the rules said less."""

    start: float
    severity: str
    #: the last alert shown
    shown: Alert
    #: since when the rules have said a lower severity (None: they say as much as shown)
    lower_since: float | None = None
    #: since when the rules have said nothing of it (None: they say it now)
    gone_since: float | None = None


class AlertHold:
    """What is shown of each rule's alerts across ticks (see the module's docstring)."""

    def __init__(self, hold_s: float, clear_hold_s: float | None = None) -> None:
        self.hold_s = hold_s
        self.clear_hold_s = hold_s if clear_hold_s is None else clear_hold_s
        self.incidents: dict[Key, Incident] = {}

    def started(self, key: Key, since: float) -> float:
        """The start of ``key``'s incident if one is going on, ``since`` at the latest: what a rule's
        title counts "for Ns" from."""
        inc = self.incidents.get(key)
        return since if inc is None else min(inc.start, since)

    def apply(self, alerts: list[Alert], now: float) -> list[Alert]:
        """The alerts to show, given what the rules said at ``now``."""
        out: list[Alert] = []
        said: set[Key] = set()
        for a in alerts:
            said.add(a.key)
            out.append(self._said(a, now))
        for key in [k for k in self.incidents if k not in said]:
            inc = self.incidents[key]
            if inc.gone_since is None:
                inc.gone_since = now
            if now - inc.gone_since >= self.clear_hold_s:
                del self.incidents[key]  # it ended: the next alert is a new incident
        return out

    def _said(self, a: Alert, now: float) -> Alert:
        inc = self.incidents.get(a.key)
        start = a.since if a.since is not None else now
        if inc is None:
            self.incidents[a.key] = Incident(start, a.severity, a)
            return a if a.since is not None else replace(a, since=start)
        inc.start = min(inc.start, start)
        inc.gone_since = None
        if _rank(a.severity) <= _rank(inc.severity):
            # as bad or worse: at once
            inc.severity, inc.lower_since = a.severity, None
        elif inc.lower_since is None:
            inc.lower_since = now
        elif now - inc.lower_since >= self.hold_s:
            inc.severity, inc.lower_since = a.severity, None
        shown = a if (a.severity, a.since) == (inc.severity, inc.start) else replace(
            a, severity=inc.severity, since=inc.start)
        inc.shown = shown
        return shown
