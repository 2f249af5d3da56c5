"""The startup-phase tracker: which phase, for how long, its progress, stalls and failures.

While vLLM starts (or when it failed, or stalled) the panel shows the whole
timeline; once the server is ready it folds to one line ("started in 84 s:
weights 1 s, compile 12 s, graphs 1 s") that the ``p`` key unfolds. The text
is rebuilt only when it changes, so an idle server costs no repaint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from rich.text import Text
from textual.widgets import Static

from vtop.core.engines import flags_of
from vtop.core.phases.types import Phase, PhaseView, StartupSnapshot
from vtop.model.fmt import clip

if TYPE_CHECKING:
    from vtop.core.download import DownloadProgress
    from vtop.core.membudget import MemoryBudget
    from vtop.core.phases.types import Failure
    from vtop.core.rules import Alert
    from vtop.core.rules.startup import FailureWords
    from vtop.core.start_history import StartUsual
    from vtop.monitor.logwatch import LogView

# Phases that pin the GPU at 100 % by design.
BUSY_PHASES = {Phase.MEMORY_PROFILING, Phase.CUDA_GRAPHS, Phase.TORCH_COMPILE, Phase.WARMUP, Phase.KV_CACHE}


def fmt_s(s: float | None) -> str:
    if s is None:
        return ""
    if s < 60:
        return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"
    m, sec = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m} min {sec:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


def _words(f: Failure, budgets: Sequence[MemoryBudget] = ()) -> FailureWords:
    """A failure's words and fix: the startup rules' (loaded once a failure is drawn, not at the first frame),
    with the memory budget's fit where it has a KV cache size that fits (the alert's words)."""
    from vtop.core.rules.startup import failure_words

    return failure_words(f, budgets)


def bar(frac: float, width: int = 12) -> str:
    n = max(0, min(width, round(frac * width)))
    return "█" * n + "░" * (width - n)


def phase_facts(v: PhaseView, snap: StartupSnapshot) -> str:
    f = snap.facts
    bits: list[str] = []
    if v.phase is Phase.WEIGHTS:
        if f.model_memory_gib is not None:
            bits.append(f"{f.model_memory_gib:.2f} GiB")
        if f.model_load_s is not None:
            bits.append(f"in {f.model_load_s:.1f} s")
    elif v.phase is Phase.TORCH_COMPILE and (f.compile_s is not None or f.compile_cached is not None):
        if f.compile_s is not None:
            bits.append(f"{f.compile_s:.1f} s")
        if f.compile_cached is not None:
            bits.append("compile cache hit" if f.compile_cached else "compile cache miss (compiled afresh)")
    elif v.phase is Phase.KV_CACHE:
        if f.kv_cache_gib is not None:
            bits.append(f"{f.kv_cache_gib:.2f} GiB")
        if f.kv_cache_tokens is not None:
            bits.append(f"{f.kv_cache_tokens:,} tokens")
        if f.max_concurrency is not None:
            at = f" @ {f.max_concurrency_len:,} tok" if f.max_concurrency_len else ""
            bits.append(f"max concurrency {f.max_concurrency:.1f}x{at}")
    elif v.phase is Phase.CUDA_GRAPHS and f.graph_memory_gib is not None:
        bits.append(f"{f.graph_memory_gib:.2f} GiB of graphs")
    elif v.phase is Phase.READY and f.url:
        bits.append(f.url)
    return " · ".join(bits)


def progress_text(v: PhaseView) -> str:
    parts = []
    for p in v.progress:
        label = "" if p.label in ("", "weights", "shards") else f"{p.label} "
        parts.append(f"{label}{p.n}/{p.total} {bar(p.fraction, 8)}")
    return "  ".join(parts)


#: the memory budget's bar: a part's words -> its colour (others red, the rest dim)
_PART_STYLE = {"weights": "blue", "weights + non-torch": "blue", "non-torch": "magenta", "activation peak": "yellow",
               "CUDA graphs": "cyan", "KV cache": "green", "all but the KV cache": "blue"}


def budget_bar(out: Text, b: MemoryBudget, width: int = 40) -> None:
    """A stacked bar of one GPU's memory (vLLM's parts, the other processes, what is left, '|' at
    --gpu-memory-utilization), then the budget's line."""
    total = b.total_gib
    out.append("\n  mem ")
    if total:
        cells = 0
        segs = [(g, _PART_STYLE.get(w, "white")) for w, g in b.bar_parts] + [(b.others_gib or 0.0, "red")]
        for g, style in segs:
            n = min(width - cells, round(g / total * width))
            if n > 0:
                out.append("█" * n, style=style)
                cells += n
        mark = round((b.utilization or 0) * width) if b.utilization else None
        rest = "".join("|" if mark is not None and cells + i == mark else "·" for i in range(width - cells))
        out.append(rest, style="dim")
        out.append(" ")
    out.append(b.text(), style="bold red" if b.util_fit is not None else "")


class StartupPanel(Static):
    """Timeline of the current vLLM start."""

    def __init__(self, *, gpu_activity: Callable[[float], tuple[float | None, float | None]],
                 download: Callable[[], DownloadProgress | None] | None = None,
                 usual: Callable[[], StartUsual | None] | None = None,
                 budget: Callable[[], list[MemoryBudget]] | None = None,
                 oom: Callable[[], Alert | None] | None = None, **kw: object) -> None:
        super().__init__("", **kw)  # type: ignore[arg-type]
        self.gpu_activity = gpu_activity
        #: what this start's phases usually take on this box (vtop.core.start_history), when it has history
        self.usual = usual
        #: the start's GPU memory budget per GPU (vtop.core.membudget)
        self.budget = budget
        #: the OOM rules' finding of a CUDA OOM (its stage and fix): an engine that died of one after ready is
        #: said in those words, the alert's, not as a start's failure
        self.oom = oom
        #: the Hub download of this start (vtop.core.download), while one is seen
        self.download = download
        self.view: LogView | None = None
        self.unfolded = False
        #: a start in progress drawn short, where the screen has no room for its whole timeline (80x24): the
        #: phases done as one line, the current (or failed) phase with its usual time, the budget, any failure
        self.compact = False
        self.message: str | None = None
        self._last: str | None = None
        self._lines = 0
        self._rows_memo: dict[bool, tuple[tuple[str, int], int]] = {}
        """:meth:`rows`' last answer for the whole and the short form: (text, width) -> rows."""

    def set_message(self, text: str | None) -> None:
        """A line about the log itself (not found, how to pass it)."""
        self.message = text
        self.redraw()

    def show(self, view: LogView) -> None:
        self.view = view
        self.redraw()

    def toggle(self) -> None:
        self.unfolded = not self.unfolded
        self.redraw()

    def set_compact(self, compact: bool) -> None:
        """The screen's layout gave the panel its short form (or its whole one back)."""
        if compact != self.compact:
            self.compact = compact
            self.redraw()

    def redraw(self) -> None:
        text = self.build()
        plain = text.plain
        if plain == self._last:
            return
        # A layout pass re-renders the whole screen; only ask for one when the
        # panel's height changes (the elapsed time ticking does not change it).
        # The height is in screen rows: a long line wraps (it was counted as one
        # row, and a message growing from one row to two was cut off).
        width = self.content_region.width
        rows = len(text.wrap(self.app.console, width)) if width > 0 else -1
        self.update(text, layout=rows < 0 or rows != self._lines)
        self._lines = rows
        self._last = plain
        v = self.view
        state = v.state if v else "none"
        for s in ("starting", "ready", "failed", "idle", "stopped", "none"):
            self.set_class(state == s, f"-{s}")
        self.set_class(bool(v and v.stall), "-stall")

    def rows(self, width: int, *, compact: bool = False) -> int:
        """Rows of text the panel takes in ``width`` columns (``compact``: in its short form)."""
        text = self.build(compact=compact)
        key = (text.plain, max(10, width))
        memo = self._rows_memo.get(compact)
        if memo is not None and memo[0] == key:
            return memo[1]
        # Wrapping is most of this (the layout asks every tick, once or twice): done again only when
        # the text or the width changed (the same text wraps the same way at one width).
        n = max(1, len(text.wrap(self.app.console, key[1])))
        self._rows_memo[compact] = (key, n)
        return n

    def is_story(self) -> bool:
        """A start in progress, failed, or stalled: the panel is what the user came for."""
        v = self.view
        return v is not None and (v.state in ("starting", "failed") or v.stall is not None)

    def build(self, *, compact: bool | None = None) -> Text:
        """The panel's text; ``compact``: its short form (None: as the layout last said)."""
        short = self.compact if compact is None else compact
        v = self.view
        problem = v.problem if v is not None else None
        if problem and v is not None:
            # what is wrong with the log itself (missing, a directory, unreadable, binary, ended)
            if v.state == "idle":
                return Text(f"⚠ {problem}", style="bold yellow")
            out = self._build(short)
            out.append(f"\n⚠ {problem}", style="bold yellow")
            return out
        return self._build(short)

    def _build(self, compact: bool = False) -> Text:
        v = self.view
        out = Text()
        if v is None or (v.state == "idle" and not v.recent):
            msg = self.message or "vLLM log: not watched (pass --log PATH, or --log - to read a pipe)"
            out.append(msg, style="dim")
            if v is not None and v.tail.message:
                out.append(f"\n{v.tail.message}", style="dim")
            return out
        snap = v.snapshot
        f = snap.facts
        eng = flags_of(f.engine)  # the engine whose log this is: SGLang's start is not "vLLM start"
        head = f"{eng['name']} start"
        if f.version:
            head += f" v{f.version}"
        if f.model:
            head += f" · {f.model}"
        if snap.world_size and snap.world_size > 1:
            head += f" · TP={snap.world_size}"
        died = snap.died_after_ready_s
        if snap.state == "ready" or died is not None:
            # A start that was ready stays "ready in 1 min 29 s" when its engine dies later: the
            # death is its own line (it was redrawn "✗ FAILED ... ✗ ready 0.0 s").
            total = fmt_s(snap.total_s)
            out.append(f"✓ {head}: ready" + (f" in {total}" if total else ""), style="bold")
            slow = sorted((p for p in snap.phases if p.duration_s), key=lambda p: -(p.duration_s or 0))[:3]
            if slow:
                out.append("  (" + ", ".join(f"{p.label} {fmt_s(p.duration_s)}" for p in slow) + ")")
            if died is not None and snap.failure is not None:
                fl = snap.failure
                words = _words(fl)
                message, fix = words.message, words.fix
                found = self.oom() if self.oom is not None and fl.kind == "cuda_oom" else None
                if found is not None:  # one finding, one wording: the OOM rules' stage and fix
                    message, fix = found.title, " ".join(found.fix)
                out.append(f"\n✗ the engine died {fmt_s(died) or '0 s'} after ready: {message}",
                           style="bold red")
                out.append(f"\n  line: {clip(fl.line)}", style="red")
                out.append(f"\n  fix:  {fix}", style="bold")
            if not self.unfolded:
                return out
            out.append("\n")
        elif snap.state == "stopped":
            total = fmt_s(snap.total_s)
            out.append(f"■ {head}: stopped (the log shows a shutdown)", style="bold")
            if total:
                out.append(f"; it had started in {total}")
            if not self.unfolded:
                return out
            out.append("\n")
        elif snap.state == "failed":
            out.append(f"✗ {head}: FAILED", style="bold red")
            out.append("\n")
        else:
            out.append(f"▶ {head}: starting", style="bold")
            if snap.restarts:
                out.append(f" (restart #{snap.restarts})")
            out.append("\n")
        self._timeline(out, v, compact=compact)
        budgets = self.budget() if self.budget is not None else []
        for b in budgets:
            if b.parts or b.util_fit is not None:
                budget_bar(out, b)
        dl = self.download() if self.download is not None and snap.state == "starting" else None
        if dl is not None:
            frac = dl.done / dl.total if dl.total else None
            out.append("\n  ⇣ " + dl.text() + (f"  {bar(frac)}" if frac is not None else ""),
                       style="bold yellow" if dl.quiet_s >= 30 else "bold")
        if snap.failure is not None and died is None:
            fl = snap.failure
            words = _words(fl, budgets)
            out.append("\n✗ ", style="bold red")
            out.append(words.message, style="bold red")
            out.append(f"\n  line: {clip(fl.line)}", style="red")
            out.append(f"\n  fix:  {words.fix}", style="bold")
        if v.stall is not None:
            st = v.stall
            util, sm = self.gpu_activity(v.mono - st.silent_s)
            out.append(f"\n⚠ POSSIBLE HANG: no log line and no progress for {fmt_s(st.silent_s)} in {st.label}.",
                       style="bold yellow")
            if util is None:
                gpu = "GPU activity unknown (no GPU data)"
            else:
                busy = util >= 50
                gpu = f"GPU during the silence: {'busy' if busy else 'idle'} (util {util:.0f}%"
                gpu += f", SM activity {sm:.0f}%)" if sm is not None else ")"
            out.append(f"\n  {gpu}. Take a py-spy dump of {eng['engine_proc']} to see where it is stuck"
                       f" (py-spy dump --pid {eng['engine_pid']}).")
            if st.hint:
                out.append(f"\n  {st.hint}", style="dim")
        elif (not compact and snap.state == "starting" and snap.current in BUSY_PHASES
              and self.gpu_activity(v.mono - 30.0)[0] is not None):
            # Only where there are GPU readings: on a box with no GPU (a CPU vLLM) the line
            # spoke of a 100 % GPU that does not exist.
            out.append(f"\n  100% GPU is expected while {eng['name']} compiles, profiles memory and captures CUDA "
                       "graphs.", style="dim")
        return out

    def _timeline(self, out: Text, v: LogView, *, compact: bool = False) -> None:
        snap = v.snapshot
        usual = self.usual() if self.usual is not None else None
        done = {p.phase: p for p in snap.phases}
        shown = [p for p in Phase if p in done or (snap.state == "starting" and p is not Phase.READY)]
        if compact:
            # the phases done as one line, then only the phase the start is in (or failed in)
            now = [p for p in shown if (snap.state == "starting" and p is snap.current)
                   or (snap.failure is not None and snap.failure.phase is p)]
            past = [done[p] for p in shown if p not in now and p in done and done[p].done]
            if past:
                took = fmt_s(sum(p.duration_s or 0.0 for p in past))
                span = past[0].label if len(past) == 1 else f"{past[0].label} … {past[-1].label}"
                out.append(f" ✓ {span}: {len(past)} phase{'' if len(past) == 1 else 's'}"
                           + (f" in {took}" if took else ""))
                if now:
                    out.append("\n")
            shown = now
        for i, ph in enumerate(shown):
            if i:
                out.append("\n")
            pv = done.get(ph)
            current = snap.state == "starting" and ph is snap.current
            failed_here = snap.failure is not None and snap.failure.phase is ph and snap.died_after_ready_s is None
            if failed_here:
                mark, style = "✗", "bold red"
            elif current:
                mark, style = "▶", "bold reverse"
            elif pv is not None and (pv.done or ph is Phase.READY):
                mark, style = "✓", ""
            else:
                mark, style = "·", "dim"
            if current:
                dur = fmt_s(v.current_elapsed_s)
            elif pv is not None:
                dur = fmt_s(pv.duration_s)
            else:
                dur = ""
            out.append(f" {mark} {ph.label:<20}", style=style)
            out.append(f" {dur:>11}", style=style)
            if pv is not None:
                extra = "  ".join(x for x in (progress_text(pv), phase_facts(pv, snap)) if x)
                if pv.slowest_rank is not None and len(pv.ranks) > 1:
                    extra += f"  slowest: {pv.slowest_rank.name}"
                if extra:
                    out.append("  " + extra, style="" if not current else "bold")
            u = usual.of(ph) if usual is not None and ph is not Phase.READY else None
            if u is not None and (pv is not None or current):
                out.append(f"  · {u.words()}", style="dim")
