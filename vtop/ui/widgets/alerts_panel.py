"""What is wrong and what to do: the diagnosis on screen, and the in-flight requests line.

:class:`AlertsPanel` sits at the top of the body, above the charts, because it
is the answer the on-call engineer came for. It is hidden while there is
nothing to say (a quiet panel would take rows from the charts at 80x24), and
repaints only when the alerts changed: the same alert with a clock that moved
by a second re-renders one Static, not the screen.

Severity is a word and a glyph as well as a colour (``NO_COLOR`` and 256-colour
terminals lose colour, not meaning). Each alert shows its title, then its
first evidence lines and its first fix, as far as the room allows
(:mod:`vtop.ui.layout`); ``e`` opens every line of every alert, scrollable
(:class:`~vtop.ui.screens.AlertsScreen`).

:class:`RequestsLine` is the compact line under the server cards: how many
requests are in flight, the oldest named with its age as a lower bound; ``r``
opens the full view (:class:`~vtop.ui.screens.RequestsScreen`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.text import Text
from textual.widgets import Static

from vtop.core.engines import flags_of
from vtop.model.requests import ServerRequests, age_words, dur_text, silent_words, state_word

GLYPH = {"critical": "✖ CRITICAL", "warning": "▲ WARNING", "info": "● info"}
STYLE = {"critical": "bold red", "warning": "bold yellow", "info": "cyan"}


def age_text(seconds: float | None, upper: bool = False) -> str:
    if seconds is None:
        return "?"
    s = max(0, int(seconds))
    txt = f"{s}s" if s < 60 else (f"{s // 60}m {s % 60:02d}s" if s < 3600 else f"{s // 3600}h {s % 3600 // 60:02d}m")
    return ("≤" if upper else "") + txt


#: how much of the alerts the panel shows (the app's layout plan picks one from the room):
#: every alert's title; the worst one's first evidence line and its whole fix as well;
#: the first two evidence lines and the fix of the first two alerts
TITLES, FOCUS, FULL = 1, 2, 3


def is_incident(alerts: Sequence[Any]) -> bool:
    """A warning or a critical alert: the screen gives it room (:mod:`vtop.ui.layout`)."""
    return any(a.severity in ("warning", "critical") for a in alerts)


def render_alerts(alerts: Sequence[Any], level: int = FULL, *, width: int = 80, everything: bool = False) -> Text:
    """The alerts as text. ``everything``: every evidence line and every fix of every
    alert (the ``e`` view). Info alerts below ``FULL`` take one line (cut to ``width``)."""
    out = Text()
    for i, a in enumerate(alerts):
        if i:
            out.append("\n")
        head = GLYPH.get(a.severity, a.severity) + " "
        if a.severity == "info" and not everything:
            title = a.title if len(head) + len(a.title) <= width else a.title[: max(1, width - len(head) - 1)] + "…"
            out.append(head, style=STYLE.get(a.severity, ""))
            out.append(title, style="bold")
            continue
        out.append(head, style=STYLE.get(a.severity, ""))
        out.append(a.title, style="bold")
        if everything:
            ev, fixes = list(a.evidence), list(a.fix)
        elif level <= TITLES or (level == FOCUS and i > 0) or (level == FULL and i > 1):
            continue
        else:
            ev, fixes = list(a.evidence[: 1 if level == FOCUS else 2]), list(a.fix[:1])
        for line in ev:
            out.append("\n  · " + line)
        for line in fixes:
            out.append("\n  fix: ", style="bold green")
            out.append(line)
    return out


class AlertsPanel(Static):
    """The alerts, as much of them as the layout plan gives rows for (:attr:`level`)."""

    DEFAULT_CLASSES = "-empty"

    def __init__(self, **kw: Any) -> None:
        super().__init__("", **kw)
        self.level = FULL
        self.alerts: tuple[Any, ...] = ()
        self._key: Any = None
        #: the ``x`` key is on (not --readonly, not a replay): a runaway alert's title says it stops it
        self.stop_key = False

    def show_alerts(self, alerts: Sequence[Any]) -> None:
        key = (tuple((a.rule, a.severity, a.title, a.evidence, a.fix) for a in alerts), self.level,
               self._width())
        if key == self._key:
            return
        self._key = key
        self.alerts = tuple(alerts)
        self.set_class(not alerts, "-empty")
        worst = alerts[0].severity if alerts else None
        self.set_class(worst == "critical", "-critical")
        self.set_class(worst == "warning", "-warning")
        # a runaway whose client the alert names (its connection is known): x can stop it
        stop = " · x: stop the runaway" if self.stop_key and any(
            a.rule == "runaway" and "(client " in a.title for a in alerts) else ""
        self.border_title = (f"{len(alerts)} alert{'s' if len(alerts) != 1 else ''}{stop} (e: all, with every fix)"
                             if alerts else "")
        self.update(self.render_alerts())

    def _width(self) -> int:
        return max(10, (self.app.size.width if self.is_attached else 80) - 4)

    def set_level(self, level: int) -> None:
        if level != self.level:
            self.level = level
            self.show_alerts(self.alerts)

    def rows(self, alerts: Sequence[Any], level: int, width: int) -> int:
        """Rows of text the alerts take at ``level`` in ``width`` columns."""
        return len(render_alerts(alerts, level, width=width).wrap(self.app.console, width))

    def render_alerts(self) -> Text:
        return render_alerts(self.alerts, self.level, width=self._width())


class RequestsLine(Static):
    """``requests in flight: 4 (vLLM: 4 running, 0 waiting) · oldest chatcmpl-9f… running at least 2m 05s,
    max_tokens 130,944 (no max_tokens from client) · r: all``: the one answer of the server's requests
    (:func:`vtop.core.requests.requests_in_flight`), as the alert and every other face name them."""

    def __init__(self, **kw: Any) -> None:
        super().__init__("", **kw)
        self._text = ""
        self._shown: tuple[ServerRequests | None, Any] = (None, None)

    @property
    def has_text(self) -> bool:
        """Something to say (the app's layout plan shows the line when there is room)."""
        return bool(self._text)

    def show_requests(self, answer: ServerRequests | None, down: Any = None) -> None:
        self._shown = (answer, down)
        width = self.content_size.width or max(0, self.app.size.width - 2)
        text = self.line(answer, down, width=width or None)
        if text != self._text:
            self._text = text
            self.update(text)

    def on_resize(self) -> None:
        self.show_requests(*self._shown)

    @staticmethod
    def line(answer: ServerRequests | None, down: Any = None, *, width: int | None = None) -> str:
        """``down``: the server's gauges as last seen when it is down or its engine died
        (:meth:`vtop.monitor.Monitor.log_target_down`): then nothing is in flight any more.
        ``width``: the columns there are; where the whole line does not fit, the same facts in
        fewer words (at 80 columns the oldest request's age and its limit were cut off)."""
        if down is not None:
            text = f"requests in flight: none (server {down.state.upper()}; {down.lost()})"
            if width is None or len(text) <= width:
                return text
            # narrower (80 columns, where the DOWN card has no room for its "last seen" line): the age of
            # the gauges above is what tells them from live ones
            run = "?" if down.running is None else f"{down.running:.0f}"
            wait = "?" if down.waiting is None else f"{down.waiting:.0f}"
            return (f"none in flight (server {down.state.upper()}) · last seen {down.age()} ago: {run} running, "
                    f"{wait} waiting")
        if answer is None or (answer.oldest is None and not answer.request_logging):
            return ""  # nothing the server card does not say already
        count = "?" if answer.count is None else str(answer.count)
        o = answer.oldest
        text = ""
        # 0: every word; 1: fewer words, without the requests received lately; 2: the count and the oldest
        # request, its id cut, its age as a bound sign; 3: the same without the id (the alert and r name it)
        for level in range(4):
            head = (f"requests in flight: {count}" if level == 0 else f"in flight {count}" if level == 1
                    else f"{count} in flight")
            if answer.running is not None and level < 2:
                head += (f" ({flags_of(answer.engine)['name']}: {answer.running:,.0f} running, {answer.waiting or 0:,.0f} waiting)" if level == 0
                         else f" ({answer.running:,.0f} run, {answer.waiting or 0:,.0f} wait)")
            parts = [head]
            if o is not None:
                state = state_word(o.answer_pending, o.answer_silent_s)
                name = o.short_name  # a request id cut at the narrowest; a client's address kept whole
                if level >= 2 and o.request_id and len(name) > 14:
                    name = name[:13] + "…"
                elif level >= 2 and not o.request_id and o.client:
                    name = o.client
                age = age_words(o)
                if level >= 2 and o.age_min_s is not None:
                    age = "≥" + dur_text(o.age_min_s)  # the same lower bound, as a sign
                oldest = (f"oldest {name} {state} {age}" if level == 0 else f"oldest {name} {age}" if level < 3
                          else f"oldest {age}")
                if o.answer_silent_s is not None:  # not running: said at every width
                    oldest += (", " + silent_words(o.answer_silent_s) if level < 2
                               else f", silent {dur_text(o.answer_silent_s)}")
                if o.max_tokens is not None:
                    oldest += f", max_tokens {o.max_tokens:,}"
                if o.no_client_max_tokens:
                    oldest += (" (no max_tokens from client)" if level == 0 else " (none from client)" if level == 1
                               else " (client: unset)")
                parts.append(oldest)
            if answer.received_recent is not None and level == 0:
                parts.append(f"{answer.received_recent} received in the last 10 s (request log)")
            text = " · ".join(parts) + (" · r: all" if level == 0 else " · r" if level == 1 else "")
            if width is None or len(text) <= width:
                return text
        return text
        return text
        return text
