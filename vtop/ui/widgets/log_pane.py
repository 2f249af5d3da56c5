"""The last lines of the vLLM log, optionally only warnings and errors (``w``).

Rebuilt from the tracker's ring only when new lines arrived, so an idle
server costs nothing here. tqdm frames arrive already collapsed (one line per
bar), ANSI codes already stripped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.binding import Binding
from textual.widgets import Input, Log

from vtop.core.engines import flags_of
from vtop.core.loghistory import STATS_NEEDLES
from vtop.model.redact import redact_prompts, scrub_secrets

if TYPE_CHECKING:
    from vtop.core.phases.types import LogLine
    from vtop.monitor.logwatch import LogView


#: uvicorn's access lines for monitoring probes (vtop's own scrapes among them):
#: one a second per monitor, they would bury everything else. Still in snapshots.
def is_probe(ln: LogLine) -> bool:
    """An access line of a monitoring endpoint (decided when the line was read: ``LogLine.probe``)."""
    return ln.probe


#: Said under the pane while it hides probe lines: the engine's own switch (``probe_flag`` of
#: :data:`vtop.core.engines.ENGINE_FLAGS`, by the engine whose log it is). vLLM's (its
#: ``vllm/entrypoints/.../cli_args.py``): ``--disable-access-log-for-endpoints`` takes a
#: comma-separated list of paths whose uvicorn access lines are dropped (newer releases, 0.32
#: has it); ``--disable-uvicorn-access-log`` drops every access line (older ones too). The
#: help screen (``?``, key ``a``) says both.


#: The engine's periodic stats line (any engine's, by its needle: :data:`vtop.core.loghistory.STATS_NEEDLES`,
#: vLLM's "Avg prompt throughput", SGLang's "Decode batch" and "Prefill batch"): the pane's most
#: telling line and one of its longest. vLLM's (every 10 s while requests run) ``(APIServer pid=N) INFO 12-02
#: 07:47:33 [loggers.py:335] Engine 000: Avg prompt throughput: 22.4 tokens/s, Avg generation throughput: 112.3
#: tokens/s, Running: 4 reqs, Waiting: 0 reqs, CPU KV cache usage: 0.1%, ...`` is ~215 columns: in a 120-column
#: terminal it was cut after "Avg gener", so the queues and the KV usage never showed. SGLang's ``Prefill batch,
#: #new-seq: ...`` is ~210 (its ``#queue-req`` at ~150), its ``Decode batch, #running-req: ...`` ~150 (its
#: ``#queue-req`` last).

#: Rows a stats line may take in the pane, wrapped; other lines stay one row (cut): a request line
#: (``Received request ... params: SamplingParams(...)``) or a traceback wrapped would bury the rest.
WRAP_ROWS = 3
WRAP_INDENT = "  "


def pane_rows(text: str, width: int) -> list[str]:
    """The pane's rows for one line: an engine's stats line too wide for ``width`` is wrapped at
    its ", " (else anywhere) into at most :data:`WRAP_ROWS` rows, the rest indented; any
    other line is one row."""
    if width < 40 or len(text) <= width or not any(n in text for n in STATS_NEEDLES):
        return [text]
    rows: list[str] = []
    rest = text
    while rest and len(rows) < WRAP_ROWS:
        room = width - (len(WRAP_INDENT) if rows else 0)
        if len(rest) <= room or len(rows) == WRAP_ROWS - 1:
            piece, rest = rest, ""
        else:
            cut = rest.rfind(", ", 0, room)
            cut = cut + 2 if cut > room // 2 else room
            piece, rest = rest[:cut].rstrip(), rest[cut:]
        rows.append((WRAP_INDENT if rows else "") + piece)
    return rows


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
        self.substring = ""
        """``/``: only lines holding this text (any case)."""
        self.show_probes = False
        """``a``: uvicorn's access lines of the monitoring endpoints shown too."""
        self.hidden_probes = 0
        """Probe lines in the pane's ring that the pane left out (0 while shown)."""
        self.redact_prompts = True
        """Prompts out of the pane (the app sets it from --redact-prompts / --no-redact-prompts)."""
        self._key: tuple[int, bool, str, bool] | None = None
        self.view: LogView | None = None
        self._last: LogLine | None = None
        """The newest line shown."""
        self._seen: LogLine | None = None
        """The newest line of the ring at the last redraw, shown or filtered out."""
        self._last_text = ""
        self._rows = 0
        """The pane's rows at its last resize."""
        self._wrap_width = 0
        """The width the rows were wrapped to (a resize rebuilds them)."""

    def on_resize(self) -> None:
        old_rows, self._rows = self._rows, self.scrollable_content_region.height
        if self._wrap_width and self._room() != self._wrap_width:
            self._key = None  # wrapped for another width: rebuild
            self._redraw()
        elif old_rows and self.scroll_y >= self.virtual_size.height - old_rows - 1:
            # The layout gives the pane its rows after the lines came (a start's panel growing above it at 80x24):
            # the newest line stays at the bottom if it was there (scrolled up to read, the view stays put).
            self.scroll_end(animate=False, immediate=True)

    def _room(self) -> int:
        return self.scrollable_content_region.width

    @staticmethod
    def _label_of(view: LogView | None) -> tuple[str | None, str | None]:
        """What the pane's title and subtitle say of the log: its source, and its engine (whose switch
        keeps the polls out)."""
        snap = getattr(view, "snapshot", None)
        return getattr(view, "source_label", None), (snap.facts.engine if snap is not None else None)

    def show(self, view: LogView) -> None:
        relabel = self._label_of(self.view) != self._label_of(view)
        self.view = view
        if relabel:
            self._title()
        self._redraw()

    def toggle_filter(self) -> None:
        self.only_problems = not self.only_problems
        self._title()
        self._redraw()

    def toggle_probes(self) -> None:
        self.show_probes = not self.show_probes
        self._redraw()

    def set_substring(self, text: str) -> None:
        if text == self.substring:
            return
        self.substring = text
        self._title()
        self._redraw()

    def _title(self) -> None:
        bits = ["warnings and errors only (w: all)"] if self.only_problems else []
        if self.substring:
            bits.append(f"lines with {self.substring!r} (Esc: all)")
        if self.show_probes and not self.only_problems:
            bits.append("poll lines shown (a: hide)")
        label, engine = self._label_of(self.view)
        head = f"log · {label}" if label else "log"
        eng = flags_of(engine)
        self.border_title = f"{head}: " + ", ".join(bits) if bits else f"{head} (w: warnings and errors only)"
        self.border_subtitle = (
            f"{self.hidden_probes} poll lines hidden (a) · out of {eng['name']}'s log: {eng['probe_flag']}"
            if self.hidden_probes and not self.only_problems else ""
        )

    def keep(self, ln: LogLine) -> bool:
        if not (ln.at_least("WARNING") if self.only_problems else self.show_probes or not is_probe(ln)):
            return False
        return not self.substring or self.substring.lower() in ln.text.lower()

    def _redraw(self) -> None:
        """Append what is new; rebuild only when the filter changed or the ring moved past us.

        Rebuilding (clear + 300 lines) on every new log line cost a layout pass
        and a full repaint each second under load.
        """
        v = self.view
        if v is None:
            return
        key = (v.lines_total, self.only_problems, self.substring, self.show_probes)
        if key == self._key:
            return
        rebuild = self._key is None or key[1:] != self._key[1:]
        self._key = key
        recent = v.recent
        hidden = 0 if self.show_probes else sum(1 for ln in recent if ln.probe)
        if hidden != self.hidden_probes:
            self.hidden_probes = hidden
            self._title()
        # What came since the last redraw: the ring's lines after the last one seen (found by identity
        # from the end), filtered. The whole ring is filtered only on a rebuild: filtering its 1,000
        # lines at every new line was a third of the dashboard's tick while vtop's own scrapes
        # wrote an access line a second.
        new: list[LogLine] | None = None
        lines: list[LogLine] = []
        if not rebuild and self._seen is not None:
            for i in range(len(recent) - 1, -1, -1):
                if recent[i] is self._seen:
                    lines = new = [ln for ln in recent[i + 1 :] if self.keep(ln)]
                    break
            if (new is not None and self._last is not None
                    and self._last_text != fmt_line(self._last, redact=self.redact_prompts)):
                new = None  # the last line changed in place (a progress bar moved on)
        if new is None:
            self.clear()
            lines = [ln for ln in recent if self.keep(ln)]
            new = lines[-300:]
            self._last = None
        self._seen = recent[-1] if recent else None
        if new:
            width = self._wrap_width = self._room()
            self.write_lines((row for ln in new for row in pane_rows(fmt_line(ln, redact=self.redact_prompts), width)),
                             scroll_end=False)
            # Log.auto_scroll only follows when the view was already at the end,
            # which clear() undoes; the newest line is what matters here.
            self.scroll_end(animate=False, immediate=True)
        if lines:
            self._last = lines[-1]
            self._last_text = fmt_line(lines[-1], redact=self.redact_prompts)


class LogFilter(Input):
    """``/``: the log pane's filter, above the keys while it is in use; Esc clears it."""

    BINDINGS = [Binding("escape", "app.clear_filter", "Clear", show=False)]
