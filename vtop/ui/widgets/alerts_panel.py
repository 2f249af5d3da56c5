"""What is wrong and what to do: the diagnosis on screen, and the in-flight requests line.

:class:`AlertsPanel` sits at the top of the body, above the charts, because it
is the answer the on-call engineer came for. It is hidden while there is
nothing to say (a quiet panel would take rows from the charts at 80x24), and
repaints only when the alerts changed: the same alert with a clock that moved
by a second re-renders one Static, not the screen.

Severity is a word and a glyph as well as a colour (``NO_COLOR`` and 256-colour
terminals lose colour, not meaning). Each alert shows its title, then its
first evidence lines and its first fix; ``e`` expands every line of every
alert.

:class:`RequestsLine` is the compact line under the server cards: requests
in flight from the vLLM request log, the oldest named; ``r`` opens the full
view (:class:`~vtop.ui.screens.RequestsScreen`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.text import Text
from textual.widgets import Static

GLYPH = {"critical": "✖ CRITICAL", "warning": "▲ WARNING", "info": "● info"}
STYLE = {"critical": "bold red", "warning": "bold yellow", "info": "cyan"}


def age_text(seconds: float | None, upper: bool = False) -> str:
    if seconds is None:
        return "?"
    s = max(0, int(seconds))
    txt = f"{s}s" if s < 60 else (f"{s // 60}m {s % 60:02d}s" if s < 3600 else f"{s // 3600}h {s % 3600 // 60:02d}m")
    return ("≤" if upper else "") + txt


class AlertsPanel(Static):
    DEFAULT_CLASSES = "-empty"

    def __init__(self, **kw: Any) -> None:
        super().__init__("", **kw)
        self.expanded = False
        self.alerts: tuple[Any, ...] = ()
        self._key: Any = None

    def show_alerts(self, alerts: Sequence[Any]) -> None:
        key = (tuple((a.rule, a.severity, a.title, a.evidence, a.fix) for a in alerts), self.expanded)
        if key == self._key:
            return
        self._key = key
        self.alerts = tuple(alerts)
        self.set_class(not alerts, "-empty")
        worst = alerts[0].severity if alerts else None
        self.set_class(worst == "critical", "-critical")
        self.set_class(worst == "warning", "-warning")
        self.border_title = (f"{len(alerts)} alert{'s' if len(alerts) != 1 else ''}"
                             + ("" if self.expanded else " (e: details)") if alerts else "")
        self.update(self.render_alerts())

    def toggle_expanded(self) -> None:
        self.expanded = not self.expanded
        self._key = None
        self.show_alerts(self.alerts)

    def render_alerts(self) -> Text:
        out = Text()
        many = len(self.alerts) > 2 and not self.expanded
        for i, a in enumerate(self.alerts):
            if i:
                out.append("\n")
            out.append(GLYPH.get(a.severity, a.severity) + " ", style=STYLE.get(a.severity, ""))
            out.append(a.title, style="bold")
            if (many and i >= 1) or (a.severity == "info" and not self.expanded):
                continue  # info, or a third alert: one line each, details with e
            ev = a.evidence if self.expanded else a.evidence[:2]
            for line in ev:
                out.append("\n  · " + line)
            fixes = a.fix if self.expanded else a.fix[:1]
            for line in fixes:
                out.append("\n  fix: ", style="bold green")
                out.append(line)
        return out


class RequestsLine(Static):
    """``requests: 3 in flight · oldest chatcmpl-9f… 2m 05s, max_tokens 130,944 (no max_tokens from client)``."""

    def __init__(self, **kw: Any) -> None:
        super().__init__("", **kw)
        self._text = ""

    def show_requests(self, view: Any) -> None:
        text = self.line(view)
        self.display = bool(text)
        if text != self._text:
            self._text = text
            self.update(text)

    @staticmethod
    def line(view: Any) -> str:
        if view is None or not getattr(view, "request_logging", False):
            return ""
        reqs = view.inflight
        if not reqs:
            return "requests in flight: none (from the vLLM request log; r: recent)"
        oldest = reqs[0]
        out = (f"requests in flight: {len(reqs)} · oldest {oldest.request_id[:24]} "
               f"{age_text(oldest.age_s, oldest.age_is_upper_bound)}, max_tokens "
               f"{oldest.max_tokens:,}" if oldest.max_tokens is not None else
               f"requests in flight: {len(reqs)} · oldest {oldest.request_id[:24]} "
               f"{age_text(oldest.age_s, oldest.age_is_upper_bound)}")
        if oldest.no_client_max_tokens:
            out += " (no max_tokens from client)"
        flagged = sum(1 for r in reqs if r.no_client_max_tokens)
        if flagged > 1:
            out += f" · {flagged} without max_tokens"
        return out + " · r: all"
