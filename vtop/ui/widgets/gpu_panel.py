"""The GPU panel: one card per GPU, or one line per GPU when space is short.

A card draws its whole content in one ``render()`` (text with fixed-scale
sparklines) rather than nesting a widget per number: 8 GPUs x 4 charts would
otherwise be 40+ widgets to lay out every second. Colours come from component
classes in ``vtop.tcss``; severity is also written as a word or glyph, never
by colour alone (NO_COLOR and 16-colour terminals).
"""

from __future__ import annotations

import math
from typing import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Container
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Static

from vtop.core.gpu_history import GpuHistory, GpuTrack
from vtop.core.spark import spark_rows
from vtop.sources.gpu import ABSENT, OFF, GpuSample

GIB = 2**30
CARD_ROWS = 4  # util, SM, mem, bw
CARD_HEIGHT = CARD_ROWS + 2  # + border
MIN_CARD_WIDTH = 70


def pct(v: float | None) -> str:
    return " n/a" if v is None else f"{v:3.0f}%"


def gib(v: int | None) -> str:
    if v is None:
        return "?"
    g = v / GIB
    return f"{g:.0f}" if g >= 100 else f"{g:.1f}"


def short_gpu_name(name: str) -> str:
    for p in ("NVIDIA ", "Tesla ", "GeForce "):
        if name.startswith(p):
            name = name[len(p):]
    return name


def layout_for(n_gpus: int, width: int, height: int) -> tuple[bool, int]:
    """(compact, columns) for ``n_gpus`` in a panel of at most ``height`` rows.

    Full cards when they fit (in up to 4 columns of at least ``MIN_CARD_WIDTH``);
    otherwise one line per GPU.
    """
    if n_gpus <= 0:
        return False, 1
    cols = max(1, min(4, width // MIN_CARD_WIDTH, n_gpus))
    rows = math.ceil(n_gpus / cols)
    if rows * CARD_HEIGHT <= height:
        return False, cols
    return True, 1


class GpuCard(Widget):
    """One GPU. ``compact`` draws a single line."""

    COMPONENT_CLASSES = {
        "gpu-card--label",
        "gpu-card--util",
        "gpu-card--sm",
        "gpu-card--mem",
        "gpu-card--bw",
        "gpu-card--hot",
        "gpu-card--dim",
        "gpu-card--lost",
    }

    compact: reactive[bool] = reactive(False, layout=True)

    def __init__(self, index: int, view: "GpuPanel", **kw: object) -> None:
        super().__init__(id=f"gpu-{index}", **kw)  # type: ignore[arg-type]
        self.index = index
        self.view = view

    def track(self) -> GpuTrack | None:
        return self.view.history.tracks.get(self.index)

    def refresh_titles(self) -> None:
        tr = self.track()
        g = tr.last if tr else None
        if g is None or self.compact:
            self.border_title = None
            self.border_subtitle = None
            return
        bits = [f"GPU {g.index}", short_gpu_name(g.name)]
        if g.lost:
            bits.append("LOST")
        self.border_title = " · ".join(bits)
        self.border_subtitle = self.view.procs_line(g)
        self.set_class(g.lost, "-lost")

    def _style(self, name: str) -> object:
        return self.get_component_rich_style(f"gpu-card--{name}", partial=True)

    def _spark(self, tr: GpuTrack, key: str, width: int, height: int = 1) -> list[Text]:
        vals = tr.series[key].buckets(self.view.now, width, self.view.window_s, max_gap=self.view.max_gap)
        rows = spark_rows(vals, height)
        return [Text(r, style=self._style(key)) for r in rows]  # type: ignore[arg-type]

    def _value(self, v: float | None, *, hot: float = 90.0) -> Text:
        if v is None:
            return Text(" n/a", style=self._style("dim"))  # type: ignore[arg-type]
        return Text(f"{v:3.0f}%", style=self._style("hot") if v >= hot else "")  # type: ignore[arg-type]

    def render(self) -> Text:
        tr = self.track()
        if tr is None or tr.last is None:
            return Text("waiting for the first sample…", style=self._style("dim"))  # type: ignore[arg-type]
        g = tr.last
        width = self.content_region.width or self.size.width
        if self.compact:
            return self._render_line(tr, g, width)
        return self._render_card(tr, g, width)

    # -- full card ---------------------------------------------------------
    def _render_card(self, tr: GpuTrack, g: GpuSample, width: int) -> Text:
        label_w, value_w = 7, 5
        extras = self._card_extras(g)
        extra_w = max((len(e) for e in extras), default=0)
        spark_w = max(8, width - label_w - value_w - extra_w - 3)
        rows: list[tuple[str, str, float | None]] = [("util", "util", g.util_gpu)]
        rows.append(("SM act", "sm", g.sm_active if tr.gpm_seen else None))
        rows.append(("mem", "mem", g.mem_pct))
        rows.append(("bw", "bw", g.dram_bw if g.dram_bw is not None else g.util_mem))
        out = Text(no_wrap=True, overflow="crop")
        for i, (label, key, val) in enumerate(rows):
            if i:
                out.append("\n")
            out.append(f"{label:<{label_w}}", style=self._style("label"))  # type: ignore[arg-type]
            if key == "sm" and not tr.gpm_seen:
                out.append_text(self._value(None))
                out.append(" ")
                note = "SM activity needs GPM (Hopper+)" if g.util_gpu is not None else ""
                out.append(f"{note:<{spark_w}}"[:spark_w], style=self._style("dim"))  # type: ignore[arg-type]
            else:
                out.append_text(self._value(val, hot=95.0 if key == "mem" else 90.0))
                out.append(" ")
                out.append_text(self._spark(tr, key, spark_w)[0])
            out.append(" ")
            out.append(extras[i] if i < len(extras) else "", style=self._style("label"))  # type: ignore[arg-type]
        if g.lost:
            return Text("GPU is lost: NVML says it fell off the bus or hung (see dmesg / nvidia-smi -q). "
                        "Other GPUs go on.", style=self._style("lost"))  # type: ignore[arg-type]
        return out

    def _card_extras(self, g: GpuSample) -> list[str]:
        p = "? W" if g.power_w is None else f"{g.power_w:.0f} W"
        if g.power_limit_w:
            p += f"/{g.power_limit_w:.0f}"
        t = "? °C" if g.temp_c is None else f"{g.temp_c:.0f} °C"
        m = f"{gib(g.mem_used)}/{gib(g.mem_total)} GiB"
        c = "? MHz" if g.sm_clock_mhz is None else f"{g.sm_clock_mhz:.0f} MHz"
        thr = [x for x in (g.throttle or ()) if x != "idle"]
        if thr:
            c += " " + ",".join(thr)
        return [p, t, m, c]

    # -- one line ----------------------------------------------------------
    def _render_line(self, tr: GpuTrack, g: GpuSample, width: int) -> Text:
        out = Text(no_wrap=True, overflow="crop")
        head = f"{g.index} {short_gpu_name(g.name)[:6]:<6} "
        out.append(head, style=self._style("label"))  # type: ignore[arg-type]
        if g.lost:
            out.append("LOST: GPU fell off the bus or hung; others go on", style=self._style("lost"))  # type: ignore[arg-type]
            return out
        mem = f"{gib(g.mem_used)}/{gib(g.mem_total)}G"
        pw = "" if g.power_w is None else f"{g.power_w:.0f}W"
        tc = "" if g.temp_c is None else f"{g.temp_c:.0f}C"
        tail = f" {mem:>9} {pw:>4} {tc:>3}" if width >= 76 else f" {mem:>9}"
        keys = [("util", "util", g.util_gpu)]
        if tr.gpm_seen:
            keys.append(("SM", "sm", g.sm_active))
        keys.append(("mem", "mem", g.mem_pct))
        fixed = len(head) + len(tail) + sum(len(lbl) + 6 for lbl, _, _ in keys)  # "lbl " + "99% " + " "
        spark_w = max(0, (width - fixed) // len(keys))
        for lbl, key, val in keys:
            out.append(f"{lbl} ", style=self._style("label"))  # type: ignore[arg-type]
            out.append_text(self._value(val, hot=95.0 if key == "mem" else 90.0))
            out.append(" ")
            if spark_w >= 4:
                out.append_text(self._spark(tr, key, spark_w - 1)[0])
                out.append(" ")
        out.append(tail, style=self._style("label"))  # type: ignore[arg-type]
        return out


class GpuPanel(Container):
    """Holds the cards; picks cards or lines from the room it has."""

    def __init__(self, history: GpuHistory, *, procs_line: Callable[[GpuSample], str], **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.history = history
        self.procs_line = procs_line
        self.now = 0.0
        self.window_s = history.window_s
        self.max_gap = 3.0
        """A silence longer than this (seconds) draws a gap; set from the poll interval."""
        self.max_height = 1000
        self._compact_forced: bool | None = None
        self._layout: tuple[bool, int] | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="gpu-message")

    @property
    def cards(self) -> list[GpuCard]:
        return list(self.query(GpuCard))

    def toggle_compact(self) -> None:
        compact, _ = self._layout or (False, 1)
        self._compact_forced = not compact
        self.relayout()

    def set_message(self, text: str) -> None:
        msg = self.query_one("#gpu-message", Static)
        msg.update(text)
        msg.display = bool(text)

    def update_view(self, now: float) -> None:
        """Called on the UI thread after each poll (or replay step)."""
        self.now = now
        poll = self.history.last_poll
        if poll is not None and poll.status in (ABSENT, OFF):
            self.set_message(f"GPU: none. {poll.message}")
        elif poll is not None and poll.message:
            self.set_message(f"GPU: {poll.message}")
        else:
            self.set_message("")
        have = {c.index for c in self.cards}
        want = sorted(self.history.tracks)
        new = [GpuCard(i, self) for i in want if i not in have]
        if new:
            self.mount_all(new)
            self.call_after_refresh(self.relayout)
        for c in self.cards:
            c.refresh_titles()
            c.refresh()

    def relayout(self) -> None:
        n = len(self.history.tracks)
        width = self.size.width or self.app.size.width
        compact, cols = layout_for(n, width, self.max_height)
        if self._compact_forced is not None:
            compact = self._compact_forced
            cols = 1 if compact else cols
        if (compact, cols) == self._layout and all(c.compact == compact for c in self.cards):
            return
        self._layout = (compact, cols)
        for k in range(1, 5):
            self.set_class(cols == k and not compact, f"-cols-{k}")
        self.set_class(compact, "-compact")
        for c in self.cards:
            c.compact = compact
            c.set_class(compact, "-line")
            c.refresh_titles()
