"""The last lines of the vLLM log, optionally only warnings and errors (``w``).

Rebuilt from the tracker's ring only when new lines arrived, so an idle
server costs nothing here. tqdm frames arrive already collapsed (one line per
bar), ANSI codes already stripped.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from textual.widgets import Log

from vtop.model.redact import redact_prompts, scrub_secrets

if TYPE_CHECKING:
    from vtop.core.phase_types import LogLine
    from vtop.monitor.logwatch import LogView


#: uvicorn's access lines for monitoring probes (vtop's own scrapes among them):
#: one a second per monitor, they would bury everything else. Still in snapshots.
_PROBE = re.compile(r'"GET /(?:metrics|health|version|v1/models|ping)/?(?:\?[^ "]*)? HTTP/[\d.]+" 200')


def is_probe(ln: LogLine) -> bool:
    return "GET /" in ln.text and _PROBE.search(ln.text) is not None


def fmt_line(ln: LogLine, *, redact: bool = True) -> str:
    """The line as vLLM wrote it (its own time stamp and level are in it), ANSI removed, with
    secret-shaped values masked and, unless ``--no-redact-prompts``, prompts replaced by their length
    (the README promises prompts are not shown; the bundle's screen.svg is this pane)."""
    text = redact_prompts(ln.text) if redact else ln.text
    return scrub_secrets(text)


class LogPane(Log):
    def __init__(self, **kw: object) -> None:
        super().__init__(max_lines=1000, highlight=False, auto_scroll=True, **kw)  # type: ignore[arg-type]
        self.only_problems = False
        self.redact_prompts = True
        """Prompts out of the pane (the app sets it from --redact-prompts / --no-redact-prompts)."""
        self._key: tuple[int, bool] | None = None
        self.view: LogView | None = None
        self._last: LogLine | None = None
        self._last_text = ""

    def show(self, view: LogView) -> None:
        self.view = view
        self._redraw()

    def toggle_filter(self) -> None:
        self.only_problems = not self.only_problems
        self.border_title = "log: warnings and errors only (w: all)" if self.only_problems else "log (w: warnings and errors only)"
        self._redraw()

    def _redraw(self) -> None:
        """Append what is new; rebuild only when the filter changed or the ring moved past us.

        Rebuilding (clear + 300 lines) on every new log line cost a layout pass
        and a full repaint each second under load.
        """
        v = self.view
        if v is None:
            return
        key = (v.lines_total, self.only_problems)
        if key == self._key:
            return
        rebuild = self._key is None or key[1] != self._key[1]
        self._key = key
        lines = [ln for ln in v.recent
                 if (ln.at_least("WARNING") if self.only_problems else not is_probe(ln))]
        new: list[LogLine] | None = None
        if not rebuild and self._last is not None:
            for i in range(len(lines) - 1, -1, -1):
                if lines[i] is self._last:
                    new = lines[i + 1 :]
                    break
            if new is not None and self._last_text != fmt_line(self._last, redact=self.redact_prompts):
                new = None  # the last line changed in place (a progress bar moved on)
        if new is None:
            self.clear()
            new = lines[-300:]
        if new:
            self.write_lines((fmt_line(ln, redact=self.redact_prompts) for ln in new), scroll_end=False)
            # Log.auto_scroll only follows when the view was already at the end,
            # which clear() undoes; the newest line is what matters here.
            self.scroll_end(animate=False, immediate=True)
        if lines:
            self._last = lines[-1]
            self._last_text = fmt_line(lines[-1], redact=self.redact_prompts)
