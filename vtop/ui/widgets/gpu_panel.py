"""The GPU panel: one card per GPU, or one line per GPU when space is short.

A card draws its whole content in one ``render()`` (text with fixed-scale
sparklines) rather than nesting a widget per number: 8 GPUs x 4 charts would
otherwise be 40+ widgets to lay out every second. Colours come from component
classes in ``vtop.tcss``; severity is also written as a word or glyph, never
by colour alone (NO_COLOR and 16-colour terminals).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Container
from textual.filter import ANSIToTruecolor, LineFilter
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Static

from vtop.core.gpu_history import GpuHistory, GpuTrack
from vtop.core.spark import SparkLines
from vtop.model.gpu import ABSENT, OFF, GpuSample
from vtop.ui.widgets.styles import component_style

GIB = 2**30
CARD_ROWS = 5  # util, SM, power, mem, bw
CARD_HEIGHT = CARD_ROWS + 2  # + border
MIN_CARD_WIDTH = 70

# Every card (GPU or server) puts its sparklines between the same two columns,
# so at equal card widths the charts share a time axis cell for cell: a memory
# climb on a GPU card sits right above the waiting queue that caused it.
SPARK_LEFT = 16  # label + value + a space
RIGHT_COL = 30  # the right-hand column of numbers


def spark_width(width: int) -> int:
    return max(8, width - SPARK_LEFT - RIGHT_COL - 1)


Run = tuple[str, str]
"""A piece of text and the name of its style (a component class, "" for plain)."""


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


def head_name(name: str, width: int = 6) -> str:
    """The GPU's name in ``width`` cells of the one-line card, cut at a word (or a dash): ``H100 80GB HBM3``
    is ``H100``, not ``H100 8``, which read as a count on the real H100 of issue 39; cut in a word only where
    its first word is longer."""
    n = short_gpu_name(name)
    if len(n) <= width:
        return n
    m = re.match(rf"^(.{{1,{width}}})(?=[ -])", n)
    return m.group(1) if m else n[:width]


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



def spark_run(view: GpuPanel, tr: GpuTrack, key: str, width: int) -> Run:
    vals = tr.series[key].buckets(view.now, width, view.window_s, max_gap=view.max_gap)
    return (view.sparks.draw((tr.index, key, width), vals), key)


def value_run(v: float | None, *, hot: float = 90.0) -> Run:
    if v is None:
        return (" n/a", "dim")
    return (f"{v:3.0f}%", "hot" if v >= hot else "")


def gpu_line(view: GpuPanel, tr: GpuTrack, width: int) -> list[Run]:
    """One GPU on one line: ``0 H200   util  99% ▅▇█ SM  95% ▅▇█ mem  71% ▅▅▅  101/140G 471W 65C``."""
    g = tr.last
    if g is None:
        return [(f"{tr.index} waiting for the first sample…", "dim")]
    head = f"{g.index} {head_name(g.name):<6} "
    runs: list[Run] = [(head, "label")]
    if g.lost:
        runs.append(("LOST: GPU fell off the bus or hung; others go on", "lost"))
        return runs
    mem = f"{gib(g.mem_used)}/{gib(g.mem_total)}G"
    pw = "" if g.power_w is None else f"{g.power_w:.0f}W"
    tc = "" if g.temp_c is None else f"{g.temp_c:.0f}C"
    tail = f" {mem:>9} {pw:>4} {tc:>3}" if width >= 100 else f" {mem:>9}"  # charts first when narrow
    keys = [("util", "util", g.util_gpu)]
    if tr.gpm_seen:
        keys.append(("SM", "sm", g.sm_active))
    keys.append(("mem", "mem", g.mem_pct))
    fixed = len(head) + len(tail) + sum(len(lbl) + 6 for lbl, _, _ in keys)  # "lbl " + "99%" + " " + " "
    spark_w = max(0, (width - fixed) // len(keys))
    for lbl, key, val in keys:
        runs += [(f"{lbl} ", "label"), value_run(val, hot=95.0 if key == "mem" else 90.0), (" ", "")]
        if spark_w >= 4:
            runs += [spark_run(view, tr, key, spark_w - 1), (" ", "")]
    runs.append((tail, "label"))
    return runs


def runs_strip(runs: list[Run], width: int, base: Style, style_of: Callable[[str, Style], Style]) -> Strip:
    """A row of runs as a strip of exactly ``width`` cells (cut or padded with ``base``).

    One segment per run of equal style (fewer segments for Textual to filter,
    crop and join on every frame), measured once and padded here, so the strip
    is made once with its known length: ``Strip(segs).crop_extend()`` measured
    every segment twice and built three strips, 40 % of a row's cost.
    """
    segs: list[Segment] = []
    total = 0
    text_acc, key_acc = "", None
    for text, k in runs:
        if not text:
            continue
        if k == key_acc:
            text_acc += text
            continue
        if text_acc:
            segs.append(Segment(text_acc, style_of(key_acc or "", base)))
            total += cell_len(text_acc)
        text_acc, key_acc = text, k
    if text_acc:
        segs.append(Segment(text_acc, style_of(key_acc or "", base)))
        total += cell_len(text_acc)
    if total > width:
        return Strip(segs, total).crop(0, width)
    if total < width:
        segs.append(Segment(" " * (width - total), base))
    return Strip(segs, width)


class _RunsWidget(Widget):
    """A Line API widget drawn from lists of styled runs, rebuilt once per poll.

    Measured with 8 GPUs at 1 Hz on a 2-core box: drawing through ``render()``
    (Rich Text -> Content -> strips on every paint) cost about 3 ms a card;
    building segments directly from cached styles is a fraction of that.

    After new data only the rows whose runs changed are marked dirty
    (``refresh(region)``): Textual then re-renders those lines and composes
    only their part of the screen, and each row's strip is kept until its runs
    change. A server card at rest repaints nothing; under load the latency
    and "finished" rows, and charts that did not move, are not redrawn.
    """

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self._version = 0
        self._styles: dict[str, Style] = {}
        self._lines_key: tuple[int, int] | None = None
        self._lines: list[list[Run]] = []
        self._row_strips: dict[int, tuple[list[Run], int, Strip]] = {}
        self._shown: list[list[Run]] | None = None
        self._shown_width = 0

    def lines(self, width: int) -> list[list[Run]]:
        raise NotImplementedError

    def invalidate(self) -> None:
        """New data: repaint the rows that changed on the next paint."""
        self._version += 1
        self.repaint_changed()

    def content_width(self) -> int:
        """The content area's width, from the size the layout gave this widget.

        ``content_region`` (and ``size``) ask the screen where the widget is, a walk
        up the DOM and a map lookup on every call: 2.6 % of vtop's CPU when every row
        of every frame asked it (py-spy, 8 GPUs + 2 servers). Same number: the
        layout's size less padding and border."""
        return max(0, self.outer_size.width - self.styles.gutter.width)

    def repaint_changed(self) -> None:
        width = self.content_width()
        shown = self._shown
        if not width or shown is None or width != self._shown_width:
            self.refresh()
            return
        new = self.lines_cached(width)
        if len(new) != len(shown):
            self.refresh()
            return
        changed = [Region(0, y, width, 1) for y, (a, b) in enumerate(zip(shown, new)) if a != b]
        if changed:
            self.repaint_rows(changed)

    def repaint_rows(self, regions: list[Region]) -> None:
        """Redraw these rows (content coordinates) at the screen's next update."""
        self.refresh(*regions)

    def notify_style_update(self) -> None:
        self._styles.clear()
        self._row_strips.clear()
        super().notify_style_update()

    def get_line_filters(self) -> Sequence[LineFilter]:
        """The app's line filters (``NO_COLOR``'s among them) less ANSI-to-truecolor.

        That filter rewrites ANSI colours and ``dim`` into truecolor; every style in
        these rows is a component class or the widget's own, which Textual resolves to
        truecolor, without ``dim`` (tests/ui/test_server_panel.py checks the filter would
        change nothing). These rows are the ones drawn anew every second, and the
        filter re-made each of them: about 3 % of vtop's CPU with 8 GPUs + 2 servers."""
        return [f for f in super().get_line_filters() if not isinstance(f, ANSIToTruecolor)]

    def _seg_style(self, key: str, base: Style) -> Style:
        st = self._styles.get(key)
        if st is None:
            st = base if not key else base + component_style(self, f"gpu-card--{key}")
            self._styles[key] = st
        return st

    def lines_cached(self, width: int) -> list[list[Run]]:
        """``lines(width)``, computed once per data version and width."""
        key = (self._version, width)
        if key != self._lines_key:
            self._lines_key = key
            self._lines = self.lines(width)
        return self._lines

    def render_line(self, y: int) -> Strip:
        width = self.content_width()
        lines = self.lines_cached(width)
        self._shown, self._shown_width = lines, width
        base = self._base_style()
        if y >= len(lines):
            return Strip.blank(width, base)
        runs = lines[y]
        cached = self._row_strips.get(y)
        if cached is not None and cached[1] == width and cached[0] == runs:
            return cached[2]
        strip = runs_strip(runs, width, base, self._seg_style)
        self._row_strips[y] = (runs, width, strip)
        return strip

    def _base_style(self) -> Style:
        """``self.rich_style``, kept until the styles change: Textual recomputes
        it (walking every ancestor's styles) after each ``refresh()``."""
        st = self._styles.get("\0base")
        if st is None:
            st = self._styles["\0base"] = self.rich_style
        return st

    def render(self) -> Text:
        """The same lines as plain rich Text (tests, and a readable repr)."""
        width = self.content_width() or 80
        out = Text(no_wrap=True, overflow="crop")
        for i, runs in enumerate(self.lines(width)):
            if i:
                out.append("\n")
            for text, _k in runs:
                out.append(text)
        return out


class GpuLines(_RunsWidget):
    """Every GPU on one line each, in a single widget: with 8 GPUs this is one
    repaint of 8 lines instead of 8 widget repaints (measured: the per-widget
    cost of Textual's compositor dominated the tick)."""

    COMPONENT_CLASSES = {
        "gpu-card--label", "gpu-card--util", "gpu-card--sm", "gpu-card--mem",
        "gpu-card--bw", "gpu-card--hot", "gpu-card--dim", "gpu-card--lost",
    }

    def __init__(self, view: GpuPanel, **kw: object) -> None:
        super().__init__(**kw)
        self.view = view

    def lines(self, width: int) -> list[list[Run]]:
        return [gpu_line(self.view, tr, width) for _, tr in sorted(self.view.history.tracks.items())]

    def get_content_height(self, container: object, viewport: object, width: int) -> int:
        return max(1, len(self.view.history.tracks))

    def line_of(self, index: int) -> str:
        width = self.content_width() or 80
        tr = self.view.history.tracks[index]
        return "".join(t for t, _ in gpu_line(self.view, tr, width))



class GpuCard(_RunsWidget):
    """One GPU as a bordered card (util, SM activity, power against its limit, memory, bandwidth)."""

    COMPONENT_CLASSES = {
        "gpu-card--label",
        "gpu-card--util",
        "gpu-card--sm",
        "gpu-card--power",
        "gpu-card--mem",
        "gpu-card--bw",
        "gpu-card--hot",
        "gpu-card--dim",
        "gpu-card--lost",
    }


    def __init__(self, index: int, view: GpuPanel, **kw: object) -> None:
        super().__init__(id=f"gpu-{index}", **kw)
        self.index = index
        self.view = view

    def track(self) -> GpuTrack | None:
        return self.view.history.tracks.get(self.index)

    def refresh_titles(self) -> None:
        tr = self.track()
        g = tr.last if tr else None
        if g is None or not self.display:
            # Setting a border title, even to the same value, costs a refresh.
            if self.border_title is not None:
                self.border_title = None
            if self.border_subtitle is not None:
                self.border_subtitle = None
            return
        bits = [f"GPU {g.index}", short_gpu_name(g.name)]
        if g.lost:
            bits.append("LOST")
        title, sub = " · ".join(bits), self.view.procs_line(g)
        if title != self.border_title:
            self.border_title = title
        if sub != self.border_subtitle:
            self.border_subtitle = sub
        if g.lost != self.has_class("-lost"):
            self.set_class(g.lost, "-lost")


    def lines(self, width: int) -> list[list[Run]]:
        tr = self.track()
        if tr is None or tr.last is None:
            return [[("waiting for the first sample…", "dim")]]
        g = tr.last
        return self._card(tr, g, width)

    # -- full card ---------------------------------------------------------
    def _card(self, tr: GpuTrack, g: GpuSample, width: int) -> list[list[Run]]:
        if g.lost:
            return [[("GPU is lost: NVML says it fell off the bus or hung", "lost")],
                     [("(see dmesg, nvidia-smi -q). The other GPUs go on.", "lost")]]
        extras = self._card_extras(g)
        spark_w = spark_width(width)
        label_w = SPARK_LEFT - 5
        rows: list[tuple[str, str, float | None]] = [
            ("util", "util", g.util_gpu),
            ("SM act", "sm", g.sm_active if tr.gpm_seen else None),
            # power as a share of the enforced limit, on a fixed 0-100 % scale: a GPU at 100 % util
            # that draws a fifth of its limit is waiting, not working
            ("power", "power", g.power_pct),
            ("mem", "mem", g.mem_pct),
            ("bw", "bw", g.dram_bw if g.dram_bw is not None else g.util_mem),
        ]
        out: list[list[Run]] = []
        for i, (label, key, val) in enumerate(rows):
            runs: list[Run] = [(f"{label:<{label_w}}", "label")]
            if key == "sm" and not tr.gpm_seen:
                note = "SM activity needs GPM (Hopper+)" if g.util_gpu is not None else ""
                runs += [value_run(None), (" ", ""), (f"{note:<{spark_w}}"[:spark_w], "dim")]
            else:
                runs += [value_run(val, hot=95.0 if key == "mem" else 90.0), (" ", ""), spark_run(self.view, tr, key, spark_w)]
            runs += [(" ", ""), (extras[i][:RIGHT_COL], "label")]
            out.append(runs)
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
        return [t, c, p, m, fault_text(g)]


def fault_text(g: GpuSample) -> str:
    """The card's fault corner: uncorrected ECC errors and row remaps when there are any, else
    PCIe throughput (read every 30 s), else ``ECC ok`` where ECC is counted; "" where none is known."""
    bad = []
    if g.ecc_uncorrected:
        bad.append(f"ECC unc {g.ecc_uncorrected}")
    rows = (g.rows_remapped or 0) + (g.retired_pages or 0)
    if rows or g.remap_pending or g.remap_failed:
        bad.append(f"remap {rows}" + (" FAILED" if g.remap_failed else " pending" if g.remap_pending else ""))
    if bad:
        return " · ".join(bad)
    if g.pcie_tx_kbs is not None and g.pcie_rx_kbs is not None:
        return f"PCIe tx {g.pcie_tx_kbs / 1e6:.1f} rx {g.pcie_rx_kbs / 1e6:.1f} GB/s"
    if g.ecc_uncorrected is not None:
        return "ECC ok" + (f" ({g.ecc_corrected} corrected)" if g.ecc_corrected else "")
    return ""


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
        self._message: str | None = None
        self._cards: dict[int, GpuCard] = {}
        self._msg_widget: Static | None = None
        self._lines_widget: GpuLines | None = None
        self.sparks = SparkLines()
        """Each chart's last sparkline, by (GPU, field, width)."""
        self.late_note = ""
        """Said above the cards while a server card shows charts from before vtop started (from its
        log): the GPU charts have no such past (NVML keeps no history)."""

    def compose(self) -> ComposeResult:
        # Kept, not queried: a poll that lands while the app starts or shuts down
        # must not fail on a DOM lookup (it did, once, in the fast tier).
        self._msg_widget = Static("", id="gpu-message")
        yield self._msg_widget
        self._lines_widget = GpuLines(self, id="gpu-lines")
        yield self._lines_widget

    @property
    def compact(self) -> bool:
        return bool(self._layout and self._layout[0])

    @property
    def cards(self) -> list[GpuCard]:
        """The cards in GPU order; kept as they are mounted (no DOM query per tick)."""
        return [self._cards[i] for i in sorted(self._cards)]

    @property
    def compact_forced(self) -> bool:
        """``c`` asked for one line per GPU."""
        return bool(self._compact_forced)

    def message_text(self) -> str:
        return self._message or ""

    def toggle_compact(self) -> None:
        compact, _ = self._layout or (False, 1)
        self._compact_forced = not compact
        self.relayout()

    def set_message(self, text: str) -> None:
        # Static.update() asks for a new layout: only touch it when the text changes.
        if text == self._message:
            return
        msg = self._msg_widget
        if msg is None:
            return
        self._message = text
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
            self.set_message(self.late_note if self.history.tracks else "")
        have = {c.index for c in self.cards}
        want = sorted(self.history.tracks)
        new = [GpuCard(i, self) for i in want if i not in have]
        for c in new:
            c.display = not self.compact
            self._cards[c.index] = c
        if new:
            self.mount_all(new)
            self.call_after_refresh(self.relayout)
        if self.compact and self._lines_widget is not None:
            self._lines_widget.invalidate()
        else:
            for c in self.cards:
                c.refresh_titles()
                c.invalidate()

    def relayout(self) -> None:
        n = len(self.history.tracks)
        width = self.size.width or self.app.size.width
        compact, cols = layout_for(n, width, self.max_height)
        if self._compact_forced is not None:
            compact = self._compact_forced
            cols = 1 if compact else cols
        if (compact, cols) == self._layout and all(c.display != compact for c in self.cards):
            return
        self._layout = (compact, cols)
        for k in range(1, 5):
            self.set_class(cols == k and not compact, f"-cols-{k}")
        self.set_class(compact, "-compact")
        lines = self._lines_widget
        if lines is None:  # not composed yet
            self._layout = None
            return
        lines.display = compact
        for c in self.cards:
            c.display = not compact
            c.refresh_titles()
            c.invalidate()
        lines.invalidate()
