"""The fleet table: one row per vLLM or SGLang instance (its engine in a column), drawn a visible line at a time.

A :class:`~textual.scroll_view.ScrollView` with the Line API, not a ``DataTable``: with
1,000 instances refreshed every 5 s, a ``DataTable`` rebuilt (or diffed cell by cell) on
every refresh costs more than the fleet's CPU budget (2 % of a core); here a refresh only
swaps the list of rows, and a frame renders the ~20-50 lines on screen.

Sort by any column (``o`` / ``O`` or a click on its header), ``/`` filters, Enter opens the
instance under the cursor (:class:`FleetTable.Open`). Columns that do not fit go, least
needed first; state, instance and the alert never go. The state is a word (``DOWN``,
``STALE``), never a colour alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from vtop.core.engines import flags_of
from vtop.ui.widgets.server_panel import STATE_WORDS, fmt_num, fmt_secs

_SEV_WORD = {0: "✖", 1: "▲", 2: "●", 3: ""}
_SEV_STYLE = {0: "bold red", 1: "bold yellow", 2: "cyan", 3: ""}
_STATE_STYLE = {"up": "green", "restarted": "yellow", "stale": "bold yellow", "down": "bold red",
                "not vllm": "bold red", "engine dead": "bold red", "starting": "yellow"}


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}%"


def _gpus(r: Any) -> str:
    g = r.gpus
    if g is None:
        return "-"
    s = f"{g.n or '?'}× {_pct(g.util)}"
    if g.sm is not None:
        s += f" SM {_pct(g.sm)}"
    if g.mem_pct is not None:
        s += f" mem {_pct(g.mem_pct)}"
    if g.xid:
        s += " XID " + ",".join(str(int(x)) for x in g.xid.values())
    return s


def _fin(r: Any) -> str:
    f = r.finished
    if f is None:
        return "-"
    if not f:
        return "none"
    return " ".join(f"{k} {fmt_num(v)}" for k, v in sorted(f.items(), key=lambda kv: -kv[1]))


def _alert(r: Any) -> str:
    b = r.on_box
    if not r.alerts and b is not None and (b.alerts or b.phase):
        said = ", ".join(f"{rule} ({sev})" for rule, sev in b.alerts)
        phase = f"starting: {b.phase}" + (f" {b.phase_s:.0f}s" if b.phase_s is not None else "") if b.phase else ""
        return "vtop on the box: " + "; ".join(x for x in (phase, said) if x)
    if not r.alerts:
        return r.message if r.state not in ("up", "restarted") else ""
    a = r.alerts[0]
    more = f" (+{len(r.alerts) - 1})" if len(r.alerts) > 1 else ""
    return a.title + more + (f" · {r.box}" if r.box else "")


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    width: int
    #: lower goes first when the table is narrow (0: never)
    keep: int
    text: Callable[[Any], str]
    sort: Callable[[Any], Any]
    right: bool = False


def _num_key(v: float | None) -> tuple[int, float]:
    return (1, 0.0) if v is None else (0, -v)


COLUMNS: tuple[Column, ...] = (
    Column("worst", "!", 1, 0, lambda r: _SEV_WORD[r.worst], lambda r: (r.worst, r.instance)),
    Column("state", "STATE", 9, 0, lambda r: STATE_WORDS.get(r.state, r.state.upper()), lambda r: (r.state, r.instance)),
    Column("instance", "INSTANCE", 20, 0, lambda r: r.instance, lambda r: r.instance),
    Column("engine", "ENGINE", 6, 1, lambda r: flags_of(r.engine)["name"] if r.engine else "-",
           lambda r: (r.engine or "", r.instance)),
    Column("model", "MODEL", 16, 3, lambda r: (r.model or "-").rsplit("/", 1)[-1], lambda r: r.model or ""),
    Column("running", "RUN", 5, 9, lambda r: fmt_num(r.running) if r.running is not None else "-",
           lambda r: _num_key(r.running), True),
    Column("waiting", "WAIT", 5, 9, lambda r: fmt_num(r.waiting) if r.waiting is not None else "-",
           lambda r: _num_key(r.waiting), True),
    Column("kv", "KV", 4, 8, lambda r: _pct(r.kv_pct), lambda r: _num_key(r.kv_pct), True),
    Column("gen", "TOK/S", 6, 7, lambda r: fmt_num(r.gen_tps) if r.gen_tps is not None else "-",
           lambda r: _num_key(r.gen_tps), True),
    Column("ttft50", "TTFT50", 6, 4, lambda r: fmt_secs(r.ttft_p50), lambda r: _num_key(r.ttft_p50), True),
    Column("ttft99", "TTFT99", 6, 6, lambda r: fmt_secs(r.ttft_p99), lambda r: _num_key(r.ttft_p99), True),
    Column("preempt", "PRE/S", 5, 5, lambda r: "-" if r.preempt_ps is None else f"{r.preempt_ps:.1f}",
           lambda r: _num_key(r.preempt_ps), True),
    Column("finished", "FINISHED/MIN", 16, 2, _fin, lambda r: -sum((r.finished or {}).values())),
    Column("gpus", "GPUS", 24, 5, _gpus, lambda r: _num_key(r.gpus.util if r.gpus else None)),
    Column("alert", "ALERT", 0, 0, _alert, lambda r: (r.worst, r.instance)),
)
SORTABLE = tuple(c.key for c in COLUMNS)


def fit_columns(width: int, instance_w: int = 20) -> list[Column]:
    """The columns that fit ``width`` (the alert takes what is left, at least 16)."""
    cols = list(COLUMNS)

    def need(cs: list[Column]) -> int:
        return sum((instance_w if c.key == "instance" else c.width) + 1 for c in cs if c.key != "alert") + 16

    for lvl in range(1, 10):
        if need(cols) <= width:
            break
        cols = [c for c in cols if c.keep == 0 or c.keep > lvl]
    return cols


class FleetTable(ScrollView, can_focus=True):
    """The rows (:class:`~vtop.monitor.fleet.FleetRow`), sorted and filtered."""

    BINDINGS = [
        Binding("up,k", "cursor(-1)", "Up", show=False),
        Binding("down,j", "cursor(1)", "Down", show=False),
        Binding("pageup", "cursor(-20)", "Page up", show=False),
        Binding("pagedown", "cursor(20)", "Page down", show=False),
        Binding("home", "cursor(-1000000)", "Top", show=False),
        Binding("end", "cursor(1000000)", "Bottom", show=False),
        Binding("enter", "open", "Open"),
        Binding("o", "sort(1)", "Sort"),
        Binding("O", "sort(-1)", "Sort back", show=False),
        Binding("r", "reverse", "Reverse", show=False),
    ]

    class Open(Message):
        def __init__(self, key: str) -> None:
            super().__init__()
            self.key = key

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.all_rows: list[Any] = []
        self.rows: list[Any] = []
        self.sort_key = "worst"
        self.reverse = False
        self.filter = ""
        self.cursor = 0
        self._cursor_key: str | None = None
        self._cols: list[Column] = []
        self._cols_w = -1
        self._strips: dict[tuple[Any, ...], Strip] = {}
        self._iw_key: tuple[int, int] | None = None
        self._iw = 8

    # ------------------------------------------------------------------ data

    def set_rows(self, rows: Sequence[Any]) -> None:
        self.all_rows = list(rows)
        self._iw_key = None
        self._apply()

    def set_filter(self, text: str) -> None:
        self.filter = text.strip().lower()
        self._apply()

    def _apply(self) -> None:
        col = next(c for c in COLUMNS if c.key == self.sort_key)
        rows = self.all_rows
        if self.filter:
            f = self.filter
            rows = [r for r in rows if f in r.instance.lower() or f in (r.model or "").lower() or f in r.job.lower()
                    or f in (r.engine or "")
                    or f in r.state or any(f in a.rule or f in a.title.lower() for a in r.alerts)]
        rows = sorted(rows, key=col.sort, reverse=self.reverse)
        self.rows = rows
        keys = [r.key for r in rows]
        if self._cursor_key in keys:
            self.cursor = keys.index(self._cursor_key)
        self.cursor = max(0, min(self.cursor, len(rows) - 1))
        self._cursor_key = rows[self.cursor].key if rows else None
        self.virtual_size = Size(self.size.width, len(rows) + 1)
        self.refresh()

    @property
    def current(self) -> Any:
        return self.rows[self.cursor] if self.rows else None

    # ------------------------------------------------------------------ keys

    def action_cursor(self, d: int) -> None:
        if not self.rows:
            return
        self.cursor = max(0, min(len(self.rows) - 1, self.cursor + d))
        self._cursor_key = self.rows[self.cursor].key
        top = self.scroll_offset.y
        body = max(1, self.size.height - 1)
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False)
        elif self.cursor >= top + body:
            self.scroll_to(y=self.cursor - body + 1, animate=False)
        self.refresh()

    def action_open(self) -> None:
        if self.current is not None:
            self.post_message(self.Open(self.current.key))

    def action_sort(self, d: int) -> None:
        keys = [c.key for c in self._columns()]
        i = keys.index(self.sort_key) if self.sort_key in keys else 0
        self.sort_key = keys[(i + d) % len(keys)]
        self.reverse = False
        self._apply()

    def action_reverse(self) -> None:
        self.reverse = not self.reverse
        self._apply()

    def sort_by(self, key: str) -> None:
        self.reverse = (not self.reverse) if key == self.sort_key else False
        self.sort_key = key
        self._apply()

    def on_click(self, event: Any) -> None:
        if event.y == 0:
            x = 0
            for c, w in self._layout():
                if x <= event.x < x + w + 1:
                    self.sort_by(c.key)
                    return
                x += w + 1
        else:
            i = self.scroll_offset.y + event.y - 1
            if 0 <= i < len(self.rows):
                self.cursor = i
                self._cursor_key = self.rows[i].key
                self.refresh()

    # ------------------------------------------------------------------ drawing

    def _columns(self) -> list[Column]:
        w = self.size.width
        if w != self._cols_w:
            self._cols_w = w
            self._cols = fit_columns(w, self._instance_w())
        return self._cols

    def _instance_w(self) -> int:
        """The instance column's width, worked out once per set of rows (every line drawn asked it:
        1,000 rows walked for each line of a 50-line screen)."""
        rows = self.all_rows
        key = (id(rows), len(rows))
        if self._iw_key != key:  # (set_rows clears it too: an id can be reused)
            longest = max((len(r.instance) for r in rows[:2000]), default=8)
            self._iw_key, self._iw = key, max(8, min(28, longest))
        return self._iw

    def _layout(self) -> list[tuple[Column, int]]:
        cols = self._columns()
        iw = self._instance_w()
        fixed = sum((iw if c.key == "instance" else c.width) + 1 for c in cols if c.key != "alert")
        out = []
        for c in cols:
            out.append((c, iw if c.key == "instance" else c.width if c.key != "alert" else max(8, self.size.width - fixed)))
        return out

    def on_resize(self) -> None:
        self._cols_w = -1
        self.virtual_size = Size(self.size.width, len(self.rows) + 1)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if y == 0:
            return self._header(width)
        i = self.scroll_offset.y + y - 1
        if i >= len(self.rows):
            if i == 0 and not self.rows:
                msg = "no instance matches the filter" if self.filter and self.all_rows else \
                    "no vLLM instance yet (waiting for Prometheus)"
                return Strip([Segment(msg[:width].ljust(width), Style(dim=True))], width)
            return Strip.blank(width)
        r = self.rows[i]
        pieces = []
        for c, w in self._layout():
            s = c.text(r)
            s = s[:w] if len(s) <= w or w < 2 else s[: w - 1] + "…"
            s = s.rjust(w) if c.right else s.ljust(w)
            style = ""
            if c.key == "worst":
                style = _SEV_STYLE[r.worst]
            elif c.key == "state":
                style = _STATE_STYLE.get(r.state, "")
            elif c.key == "alert" and r.alerts:
                style = _SEV_STYLE[r.worst]
            pieces.append((s + " ", style))
        mark = 2 if i == self.cursor and self.has_focus else 1 if i == self.cursor else 0
        # a refresh every 5 s repaints the visible rows: a row whose text did not change reuses its strip
        # (rich's render of a 12-column line is most of a repaint's CPU)
        sig = (width, mark, tuple(pieces))
        hit = self._strips.get(sig)
        if hit is not None:
            return hit
        t = Text(no_wrap=True, overflow="ellipsis")
        for s, style in pieces:
            t.append(s, style=style)
        line = t.render(self.app.console)
        strip = Strip(line).crop_extend(0, width, None)
        if mark == 2:
            strip = strip.apply_style(Style(reverse=True))
        elif mark == 1:
            strip = strip.apply_style(Style(underline=True))
        if len(self._strips) > 4 * max(50, self.size.height):
            self._strips.clear()
        self._strips[sig] = strip
        return strip

    def _header(self, width: int) -> Strip:
        t = Text(no_wrap=True)
        for c, w in self._layout():
            title = c.title + (("▲" if self.reverse else "▼") if c.key == self.sort_key else "")
            title = title[:w]
            t.append((title.rjust(w) if c.right else title.ljust(w)) + " ", style="bold")
        return Strip(t.render(self.app.console)).crop_extend(0, width, Style(bold=True))

    def row_texts(self) -> list[str]:
        """The rows as text (tests)."""
        return [" ".join(c.text(r) for c, _ in self._layout()) for r in self.rows]
