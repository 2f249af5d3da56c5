"""One card per vLLM server: state, queues and KV cache on the GPU panel's time axis, rates, latency.

Laid out like a GPU card (label, value, sparkline, a right-hand column) so
the sparklines of both panels start and end in the same columns and cover
the same window: a memory climb on a GPU card and a waiting queue on a
server card line up by eye. Running and waiting have no natural ceiling, so
their charts scale to the larger of the window's maximum and the server's
``--max-num-seqs`` when known, and say which.
"""

from __future__ import annotations

import re
import textwrap

from rich.text import Text

from vtop.core.backfill import Backfill
from vtop.core.rates import Quantiles
from vtop.core.server import LastSeen, ServerView
from vtop.core.spark import GAP, SparkLines, spark
from vtop.model.fmt import dur
from vtop.ui.widgets.gpu_panel import RIGHT_COL, SPARK_LEFT, Run, _RunsWidget, spark_width

STATE_WORDS = {
    "up": "UP",
    "starting": "STARTING",
    "stale": "STALE",
    "down": "DOWN",
    "restarted": "RESTARTED",
    "not vllm": "NOT vLLM",
    "engine dead": "ENGINE DEAD",
}
BAD_STATES = {"down", "engine dead", "not vllm"}
#: a card's levels (:meth:`ServerCard.set_level`)
ONE_LINE, QUEUES, FULL_CARD = 1, 2, 3
WARN_STATES = {"stale", "starting", "restarted"}


def fmt_num(v: float | None) -> str:
    if v is None:
        return "n/a"
    if v >= 10_000:
        return f"{v / 1000:.0f}k"
    if v >= 1000:
        return f"{v / 1000:.1f}k"
    if v >= 100 or v == int(v):
        return f"{v:.0f}"
    return f"{v:.1f}"


def fmt_secs(v: float | None) -> str:
    if v is None:
        return "-"
    if v < 1:
        return f"{v * 1000:.0f}ms"
    return f"{v:.2f}s" if v < 10 else f"{v:.0f}s"


#: Below this a scrape is simply fast: the card says so instead of the exact figure.
FAST_SCRAPE_S = 0.010


def fmt_scrape(v: float | None) -> str:
    """How long ``/metrics`` took, for the card. Under 10 ms it reads ``<10ms``: a healthy
    server answers in 1-5 ms and the digit only jittered, repainting its row every
    second for nothing; what matters is a slow one (an API server busy tokenizing or
    stalled), which shows in full."""
    if v is not None and v < FAST_SCRAPE_S:
        return f"<{FAST_SCRAPE_S * 1000:.0f}ms"
    return fmt_secs(v)


def fmt_q(name: str, q: Quantiles) -> str:
    if q.p50 is None:
        return f"{name} -"
    return f"{name} p50 {fmt_secs(q.p50)} p95 {fmt_secs(q.p95)} p99 {fmt_secs(q.p99)}"


def state_word(v: ServerView) -> str:
    """The card's state word: SLEEPING for a live server whose engine was put to sleep (it
    answers, makes no tokens on purpose, and holds requests until ``/wake_up``)."""
    if v.sleep_level and v.state in ("up", "restarted"):
        return "SLEEPING"
    return STATE_WORDS.get(v.state, v.state.upper())


_DOWN_FOR = re.compile(r"^down for .+? \(since ")


def _state_line(v: ServerView, now: float | None = None) -> str:
    word = STATE_WORDS.get(v.state, v.state)
    msg = v.message
    if now is not None and v.state == "down" and now >= v.since:
        # The tracker wrote the duration at its last poll, and a refusing server is polled
        # every 5 s: the card counts on from when it went down, a second at a time.
        msg = _DOWN_FOR.sub(f"down for {dur(now - v.since)} (since ", msg, count=1)
    if msg.lower().startswith(v.state + ":"):
        msg = msg[len(v.state) + 1 :].lstrip()
    return f"{word}: {msg}"


class ServerCard(_RunsWidget):
    COMPONENT_CLASSES = {
        "gpu-card--label", "gpu-card--util", "gpu-card--sm", "gpu-card--mem",
        "gpu-card--bw", "gpu-card--hot", "gpu-card--dim", "gpu-card--lost",
        "gpu-card--warn", "gpu-card--log",
    }

    def __init__(self, key: str, *, window_s: float, max_gap: float, **kw: object) -> None:
        super().__init__(**kw)
        self.key = key
        self.view: ServerView | None = None
        self.window_s = window_s
        self.max_gap = max_gap
        self.now = 0.0
        self.max_num_seqs: int | None = None
        self.seen: LastSeen | None = None
        """The gauges as last seen, as the monitor words them (:meth:`vtop.monitor.Monitor.last_seen`)."""
        self.extra_title = ""
        self.backfill: Backfill | None = None
        """The charts before vtop first polled the server, from the log's stats lines
        (:meth:`vtop.monitor.Monitor.backfill`): drawn in their own shade, the legend says so."""
        self.since_wall: str | None = None
        """When vtop first polled the server (``HH:MM:SS``), for the legend."""
        self._nlines: int | None = None
        self._sparks = SparkLines(64)
        self._all_n: tuple[tuple[int, int], int] | None = None
        self.detail = False
        """The #29 signals in full (key ``i``): a line each for spec decoding, prefix cache, queue and
        errors, LoRA, cache config. Folded (the default), one line says the headline of each present."""
        self.level = FULL_CARD
        """How much of the card the layout plan gives rows for: :data:`ONE_LINE` (no border,
        one summary line), :data:`QUEUES` (running and waiting), :data:`FULL_CARD`."""

    def level_heights(self, width: int) -> tuple[int, ...]:
        """Rows (with the border) at each level: hidden, one line, queue rows, the whole card."""
        key = (self._version, width)
        if self._all_n is None or self._all_n[0] != key:
            # the full card's lines are the ones drawn: computed once for both
            rows = self.lines_cached(width) if self.level == FULL_CARD else self.all_lines(width)
            self._all_n = (key, len(rows))
        full = self._all_n[1] + 2
        return (0, 1, min(full, 4), full)

    def set_level(self, level: int) -> None:
        if level == self.level:
            return
        self.level = level
        self.set_class(level == ONE_LINE, "-line")
        self.display = level > 0
        self._version += 1
        self.refresh(layout=True)

    def show(self, view: ServerView, now: float) -> None:
        self.view = view
        self.now = now
        word = state_word(view)
        bits = [f"{view.engine_name} {view.url}", word]
        if self.extra_title:  # its process and GPUs before the model: they stay in an 80-column title
            bits.append(self.extra_title)
        if view.model_id:
            bits.append(view.model_id)
        if view.version:
            bits.append(f"v{view.version}")
        if view.max_model_len:
            bits.append(f"{view.len_word} {view.max_model_len:,}")
        title = " · ".join(bits)
        if title != self.border_title:
            self.border_title = title
        for st in STATE_WORDS:
            cls = "-" + st.replace(" ", "-")
            if (view.state == st) != self.has_class(cls):
                self.set_class(view.state == st, cls)
        self._version += 1
        n = len(self.lines_cached(self.content_width() or 80))
        if n != self._nlines:
            self._nlines = n
            self.refresh(layout=True)
        self.repaint_changed()

    def _spark(self, name: str, width: int, hi: float) -> list[Run]:
        assert self.view is not None
        s = self.view.series.get(name)
        if s is None:
            return [(" " * width, "dim")]
        vals = s.buckets(self.now, width, self.window_s, max_gap=self.max_gap)
        style = "util" if name != "kv_pct" else "mem"
        bf = self.backfill
        if bf is not None:
            logged, marks = bf.cells(name, self.now, width, self.window_s)
            if marks or any(v is not None for v in logged):
                return _merged_runs(vals, logged, marks, hi, style)
        return [(self._sparks.draw((name, width), vals, 0.0, hi), style)]

    def log_shown(self, width: int) -> bool:
        """The log's cells are on the charts now (the legend line says so)."""
        bf = self.backfill
        if bf is None:
            return False
        logged, marks = bf.cells("running", self.now, spark_width(width), self.window_s)
        return bool(marks) or any(v is not None for v in logged)

    def _scale(self, name: str) -> tuple[float, str]:
        assert self.view is not None
        if name == "kv_pct":
            return 100.0, ""
        s = self.view.series.get(name)
        peak = (s.peak() if s is not None else None) or 0.0
        if self.backfill is not None and s is not None:
            # the log's points count while the live series would still hold them: no jump at the switch
            peak = max(peak, self.backfill.peak(name, self.now - s.window_s) or 0.0)
        if name == "running" and self.max_num_seqs:
            return float(max(self.max_num_seqs, peak, 1)), f"of {self.max_num_seqs}"
        return max(peak, 1.0), f"max {peak:.0f}" if name in ("running", "waiting") and peak < 100_000 else f"max {fmt_num(peak)}"

    def lines(self, width: int) -> list[list[Run]]:
        if self.level == ONE_LINE:
            return [self.summary_line()]
        rows = self.all_lines(width)
        return rows[:2] if self.level == QUEUES else rows

    def summary_line(self) -> list[Run]:
        """The card on one line: ``vLLM :8000 UP · running 1 · waiting 0 · KV 1% · 414 tok/s``."""
        v = self.view
        port = self.key.rsplit(":", 1)[-1] if ":" in self.key.split("//")[-1] else self.key
        if v is None:
            return [(f":{port} waiting for the first poll…", "dim")]
        word = state_word(v)
        style = "lost" if v.state in BAD_STATES else "warn" if v.state in WARN_STATES or word == "SLEEPING" else "label"
        out: list[Run] = [(f"{v.engine_name} :{port} ", "label"), (word, style)]
        t = v.total
        seen = self.seen if self.seen is not None else v.last_seen(self.now)
        if seen is not None:
            # not live (down, a dead engine, late polls): the last values, greyed, with their age
            out.append((f" · {seen.words()}", "dim"))
        elif t is not None:
            kv = "n/a" if t.kv_pct is None else f"{t.kv_pct:.0f}%"
            out.append((f" · running {fmt_num(t.running)} · waiting {fmt_num(t.waiting)} · KV {kv}", "label"))
        if v.gen_tps_now is not None:
            out.append((f" · {fmt_num(v.gen_tps_now)} tok/s ({v.now_window_s:.0f} s)", "label"))
        return out

    def all_lines(self, width: int) -> list[list[Run]]:
        v = self.view
        if v is None:
            return [[("waiting for the first poll…", "dim")]]
        if v.metrics is None:
            # Never answered with metrics: empty charts would only hide the message.
            style = "lost" if v.state in BAD_STATES else "warn"
            return [[(ln, style)] for ln in textwrap.wrap(_state_line(v, self.now), max(20, width))]
        label_w = SPARK_LEFT - 6
        extras = self._extras(v)
        spark_w = spark_width(width)
        total = v.total
        rows = [
            ("running", "running", total.running if total else None),
            ("waiting", "waiting", total.waiting if total else None),
            ("KV cache", "kv_pct", total.kv_pct if total else None),
            # the sparkline's rate, over its window (the note says which): one number for one rate
            ("gen tok/s", "gen_tps", v.gen_tps_now),
        ]
        scales = [self._scale(name) for _, name, _ in rows]
        scales[3] = (scales[3][0], f"{v.now_window_s:.0f}s {scales[3][1]}")
        note_w = max(len(note) for _, note in scales)
        # Down, a dead engine, late polls: the gauges are the last values seen, never shown as live
        # (the DOWN card read "running 4" in full colour): greyed, and a line says their age.
        seen = self.seen if self.seen is not None else v.last_seen(self.now)
        out: list[list[Run]] = []
        for i, (label, name, val) in enumerate(rows):
            hi, note = scales[i]
            if name == "kv_pct":
                value: Run = (" n/a " if val is None else f"{val:4.0f}%", "hot" if (val or 0) >= 95 else "")
            elif name in ("running", "waiting"):
                # Queue lengths are counted exactly: "1.0k" would hide max_num_seqs=1024.
                txt = "n/a" if val is None else f"{val:.0f}" if val < 100_000 else fmt_num(val)
                value = (f"{txt:>5}", "hot" if name == "waiting" and (val or 0) > 0 else "")
            else:
                value = (f"{fmt_num(val):>5}", "")
            if seen is not None and name != "gen_tps":
                value = (value[0], "dim")
            row: list[Run] = [(f"{label:<{label_w}}", "label"), value, (" ", ""), *self._spark(name, spark_w, hi)]
            right = f"{note:<{note_w}} " if note_w else ""
            row += [(" ", ""), (right, "dim"), ((extras[i] if i < len(extras) else "")[: RIGHT_COL - len(right)], "label")]
            out.append(row)
        if self.log_shown(width):
            out.append([(_fit(log_legend(self.backfill, self.since_wall), width), "log")])
        out.append([(fmt_q("TTFT", v.ttft) + " · " + fmt_q("ITL", v.itl) + " · " + fmt_q("e2e", v.e2e), "label")])
        fin = v.finished or {}
        done = " · ".join(f"{k} {fmt_num(n)}" for k, n in sorted(fin.items()) if n) or "none"
        out.append([(f"finished in the last {v.window_s:.0f} s: {done}", "label")])
        out += signal_lines(v, width, self.detail)
        if len(v.engines) > 1:
            eng = "  ".join(
                f"engine {e.label}: run {fmt_num(e.running)} wait {fmt_num(e.waiting)} KV {fmt_num(e.kv_pct)}%"
                for e in v.engines
            )
            out.append([(eng, "label")])
        if v.state != "up":
            style = "lost" if v.state in BAD_STATES else "warn"
            for ln in textwrap.wrap(_state_line(v, self.now), max(20, width)):
                out.append([(ln, style)])
        if seen is not None:
            for ln in textwrap.wrap(f"gauges above: {seen.words()}", max(20, width)):
                out.append([(ln, "dim")])
        return out

    @staticmethod
    def _extras(v: ServerView) -> list[str]:
        # every rate says its window: prompt over the sparklines' (as gen tok/s), the rest over the card's
        win = f" {v.rate_span_s:.0f}s" if v.rate_span_s else ""
        pre = "-" if v.preemptions_ps is None else f"{v.preemptions_ps:.1f}/s{win}"
        hit = "" if v.prefix_hit_rate is None else f"hit {100 * v.prefix_hit_rate:.0f}%{win}"
        return [
            "prompt -" if v.prompt_tps_now is None else f"prompt {fmt_num(v.prompt_tps_now)}/s {v.now_window_s:.0f}s",
            f"preempt {pre}",
            f"scrape {fmt_scrape(v.latency_s)}",
            hit,
        ]

    def get_content_height(self, container: object, viewport: object, width: int) -> int:
        return max(1, len(self.lines_cached(width)))

    def render(self) -> Text:  # noqa: D102 - plain text for tests
        return super().render()


#: the cell a restart of the server falls in, on a chart drawn back from its log
RESTART_MARK = "┊"


def log_legend(bf: Backfill | None, since: str | None) -> str:
    """The charts' label while the log's cells are on them: what they are, and where they end."""
    when = f" before {since}" if since else ""
    split = f"; {RESTART_MARK} the server restarted" if bf is not None and bf.splits else ""
    return f"charts{when} from the log's 10 s stats (vtop was not running){split}"


def _merged_runs(live: tuple[float | None, ...], logged: tuple[float | None, ...], marks: frozenset[int],
                 hi: float, style: str) -> list[Run]:
    """A chart whose cells come from the live samples, or, where none and the log has one, from the log
    (shaded ``log``), a restart's cell a mark: one scale for all."""
    runs: list[Run] = []
    for i, v in enumerate(live):
        if i in marks:
            ch, st = RESTART_MARK, "warn"
        elif v is None and logged[i] is not None:
            ch, st = spark((logged[i],), 0.0, hi), "log"
        else:
            ch, st = (GAP if v is None else spark((v,), 0.0, hi)), style
        if runs and runs[-1][1] == st:
            runs[-1] = (runs[-1][0] + ch, st)
        else:
            runs.append((ch, st))
    return runs


# --------------------------------------------------------------------------- issue #29's signals

SLEEP_WORDS = {1: "level 1: weights offloaded", 2: "level 2: all discarded"}
SOURCE_WORDS = (("local_compute", "computed"), ("local_cache_hit", "cached"), ("external_kv_transfer", "transferred"))


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%" if x >= 0.1 or x == 0 else f"{100 * x:.1f}%"


def _names(xs: tuple[str, ...] | None) -> str:
    return ", ".join(xs) if xs else "-"


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(1, width - 1)] + "…"


def signal_lines(v: ServerView, width: int, detail: bool) -> list[list[Run]]:
    """The #29 rows of a card: only what the server exports (a missing family is not a zero).

    Folded: one line of headlines (sleep, spec acceptance, queue time, 5xx, LoRA). ``detail``: a line
    per family, each cut to ``width``."""
    m = v.metrics
    if m is None:
        return []
    out: list[list[Run]] = []
    sp, q = v.spec, v.queue
    if v.sleep_level:
        # vLLM 0.26.0 on the H200: a completion sent at level 1 got no answer in 20 s and counted nowhere
        # (tests/fixtures/vllm/signals/h200-0.26.0/sleep): it waits for the wake-up, the engine is not stalled
        out.append([(_fit(f"SLEEPING ({SLEEP_WORDS.get(v.sleep_level, 'sleeping')}; requests wait until /wake_up)"
                          " · not a stall", width), "warn")])
    if not detail:
        bits: list[str] = []
        if sp is not None:
            bits.append(f"spec acc {_pct(sp.acceptance)}" + (f" len {sp.mean_len:.2f}" if sp.mean_len else ""))
        if q.p50 is not None:
            bits.append(f"queue p50 {fmt_secs(q.p50)} p99 {fmt_secs(q.p99)}")
        if v.http_5xx_ps is not None:
            bits.append(f"5xx {v.http_5xx_ps:.1f}/s" if v.http_5xx_ps else "5xx 0")
        if m.lora_running is not None:
            bits.append(f"LoRA {_names(m.lora_running)} (wait {len(m.lora_waiting or ())})")
        if bits:
            hot = (sp is not None and sp.acceptance is not None and sp.acceptance < 0.05) or bool(v.http_5xx_ps)
            out.append([(_fit(" · ".join(bits) + "   [i] detail", width), "hot" if hot else "dim")])
        return out
    if sp is not None:
        line = f"spec: accepted {_pct(sp.acceptance)} of {fmt_num(sp.draft_tokens)} drafted"
        if sp.mean_len is not None:
            line += f" · mean len {sp.mean_len:.2f}"
        if sp.per_pos:
            line += " · per pos " + " ".join(f"{p:.2f}" for p in sp.per_pos)
        out.append([(_fit(line, width), "hot" if sp.acceptance is not None and sp.acceptance < 0.05 else "label")])
    pc = []
    if v.prefix_hit_rate is not None:
        pc.append(f"hit {_pct(v.prefix_hit_rate)}")
    if v.prompt_by_source:
        pc.append("prompt " + ", ".join(f"{word} {fmt_num(v.prompt_by_source.get(k, 0.0))}"
                                        for k, word in SOURCE_WORDS if k in v.prompt_by_source))
    if pc:
        out.append([(_fit("prefix cache: " + " · ".join(pc), width), "label")])
    t = v.total
    qb = [f"queue p50 {fmt_secs(q.p50)} p99 {fmt_secs(q.p99)}" if q.p50 is not None else "queue -"]
    if t is not None and t.running is not None and t.waiting is not None:
        qb.append(f"in flight {fmt_num(t.running + t.waiting)} ({fmt_num(t.running)} run, "
                  f"{fmt_num(t.waiting)} queued)")
    if v.http_ps is not None:
        qb.append(f"5xx {fmt_num(v.http_5xx_ps or 0.0)} of {fmt_num(v.http_ps)}/s")
    out.append([(_fit(" · ".join(qb), width), "hot" if v.http_5xx_ps else "label")])
    if v.offload_store_bps is not None or v.offload_load_bps is not None:
        def mbs(x: float | None) -> str:
            return "-" if x is None else f"{x / 1e6:.1f} MB/s"
        out.append([(_fit(f"KV offload: store {mbs(v.offload_store_bps)} · load {mbs(v.offload_load_bps)}", width),
                     "label")])
    if m.lora_running is not None:
        mx = f" · max {m.lora_max}" if m.lora_max is not None else ""
        out.append([(_fit(f"LoRA: running {_names(m.lora_running)} · waiting {_names(m.lora_waiting)}{mx}", width),
                     "label")])
    if m.cache_config:
        cc = dict(m.cache_config)
        parts = [f"block {cc['block_size']}" if cc.get("block_size") else "",
                 cc.get("cache_dtype", ""),
                 f"{int(cc['num_gpu_blocks']):,} blocks" if (cc.get("num_gpu_blocks") or "").isdigit() else "",
                 f"gpu-mem {cc['gpu_memory_utilization']}" if cc.get("gpu_memory_utilization") else "",
                 "prefix " + ("on" if cc.get("enable_prefix_caching") == "True" else "off")
                 if cc.get("enable_prefix_caching") else "",
                 f"offload {cc['kv_offloading_backend']} {cc['kv_offloading_size']}"
                 if cc.get("kv_offloading_size") not in (None, "", "None") else ""]
        out.append([(_fit("cache: " + " · ".join(p for p in parts if p), width), "dim")])
    return out
