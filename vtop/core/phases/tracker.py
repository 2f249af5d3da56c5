"""The startup tracker: a state machine over a vLLM log's lines (phases, facts, failure, silence).

Pure logic, no I/O: :class:`PhaseTracker` is fed ``(line, arrival)`` pairs, ``arrival`` being the
monotonic time the line was read, and answers a :class:`~vtop.core.phases.types.StartupSnapshot`.
It knows the phases of a start (process start, engine init, weights, torch.compile, memory
profiling, KV cache sizing, CUDA graph capture, warmup, API server, ready), the facts each one
reports, per tensor-parallel rank timings, the fatal errors (their kind: the words and the usual
fix are the startup rules', :func:`vtop.core.rules.startup.failure_words`), and how long a start
has been silent.

Why it is built this way:

* The log's own timestamps (``MM-DD HH:MM:SS``, no year, no zone, local time of the vLLM host) say
  how long phases took, so a log replayed from disk gives the same durations as one watched live.
  Lines without a stamp (tqdm bars, uvicorn, tracebacks) get the last stamp plus the arrival time
  elapsed since it. The launch time of the process (an epoch time) goes on the log's clock by the
  offset measured (:meth:`PhaseTracker.set_clock_offset`, :mod:`vtop.core.logclock`); silence is
  counted on the arrival clock: a line vtop saw arrive is news whatever its stamp says.
* The timeline is contiguous: a phase with no start line of its own (torch.compile starts inside
  the profiling run, the warmup after graph capture is silent) starts where the previous one
  ended, so the durations add up to the total.
"""

from __future__ import annotations

import calendar
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vtop.core.loghistory import parse_stats
from vtop.core.phases.patterns import (
    ACCESS_RE,
    API_MARK_RE,
    ARCH_RE,
    BUDGET_DEVICE_RE,
    BUDGET_OLD_PARTS_RE,
    BUDGET_OLD_TOTAL_RE,
    C10D_ERR_RE,
    C10D_WARN_RE,
    CAPTURE_BAR_RE,
    CAPTURE_END_RE,
    CAPTURE_START_RE,
    CAUSE_WINDOW_S,
    CFG_RES,
    COMPILE_CACHED_RE,
    COMPILE_END_RE,
    COMPILE_FRESH_RE,
    COMPILE_MARK_RE,
    DEATH_KINDS,
    ENGINE_INIT_RE,
    ENGINE_WAIT_RE,
    ERROR_PATTERNS,
    EXC_LINE_RE,
    GRAPH_EST_RE,
    GRAPH_PROFILING_RE,
    INIT_ENGINE_RE,
    KV_AVAILABLE_RE,
    KV_BLOCKS_RE,
    KV_CONC_RE,
    KV_CPU_SET_RE,
    KV_TOKENS_RE,
    LAUNCH_RES,
    MAX_LEN_RE,
    MODEL_LOADING_RE,
    NONDEFAULT_ARGS_RE,
    NONDEFAULT_RES,
    NUM_BLOCKS_RE,
    PROFILE_RUN_RE,
    PROFILING_MARK_RE,
    PROFILING_TAKES_RE,
    PYWARN_RE,
    READY_RE,
    SERVER_URL_RE,
    SGL_CAPTURE_BAR_RE,
    SGL_CAPTURE_BEGIN_RE,
    SGL_CAPTURE_END_RE,
    SGL_CFG_RES,
    SGL_DIST_RE,
    SGL_KV_ALLOC_RE,
    SGL_LIMITS_RE,
    SGL_POOL_END_RE,
    SGL_PREFILL_CAPTURE_END_RE,
    SGL_READY_RE,
    SGL_SERVER_ARGS_RE,
    SGL_WEIGHTS_BEGIN_RE,
    SGL_WEIGHTS_END_RE,
    SHARDS_RE,
    SHM_WAIT_RE,
    SHUTDOWN_RE,
    TQDM_ELAPSED_RE,
    TRACEBACK_RE,
    WARMUP_MARK_RE,
    WEIGHTS_START_RE,
    WEIGHTS_TOOK_RE,
    LogEvent,
    parse_line,
)
from vtop.core.phases.types import (
    _FACT_NAMES,
    _INDEX,
    _ORDER,
    Failure,
    LogLine,
    Phase,
    PhaseView,
    Progress,
    Quiet,
    RankTiming,
    StallInfo,
    StartupFacts,
    StartupSnapshot,
    stall_hint,
)
from vtop.model.logtext import BANNER_RES, LOGO_MODEL_RE

__all__ = ["DEFAULT_STALL_S", "PhaseTracker", "summarize"]

#: Silence (no new line, no progress) after which a start counts as stalled.
#: Real cold starts have 18-30 s silent gaps (imports, EngineCore spawn, warmup)
#: and first torch.compile runs of big models take several minutes.
DEFAULT_STALL_S = 600.0
#: the earlier starts of a log a tracker remembers (:attr:`PhaseTracker.past_starts`)
PAST_STARTS = 8
#: the kinds of warning and error a tracker counts apart (:attr:`PhaseTracker.problem_kinds`)
MAX_KINDS = 64
#: what is blanked in a message to tell its kind: numbers, hex ids, paths, quoted values
_KIND_RE = re.compile(r"0x[0-9a-fA-F]+|[0-9a-f]{8,}|/[\w./-]+|'[^']*'|\"[^\"]*\"|\d+(?:\.\d+)?")

# --------------------------------------------------------------------------- phase lines, as tables


def _int(s: str) -> int:
    return int(s.replace(",", ""))


#: a fact a line reports: (name, the match groups it is in (the first non-empty one), conversion,
#: how it is kept: "set", "max" (the largest over ranks), "min" (the smallest) or "default" (the first one seen))
_Fact = tuple[str, tuple[str, ...], Callable[[str], Any], str]


@dataclass(frozen=True)
class _Line:
    """One kind of phase line: its pattern, the facts it reports, and what it does to its phase."""

    rx: re.Pattern[str]
    #: "enter" the phase, "end" it (a line one process logs), "rank_done" (a line each rank logs),
    #: "ready", or None (facts only)
    then: str | None = "enter"
    facts: tuple[_Fact, ...] = ()
    #: run with the tracker and the message before ``then`` (for what a line says beyond facts)
    extra: Callable[[PhaseTracker, str], None] | None = None
    #: the line may carry the next rows' facts too: look on; when the group ends, enter its phase
    more: bool = False
    #: whose log the row reads: "*" any; None vLLM's (no engine fact); "sglang" SGLang's (the engine fact
    #: its record format sets). Uvicorn's "Application startup complete." comes before SGLang's warmup
    #: request, so it is no ready there.
    engine: str | None = "*"


def _config_facts(table: dict[str, re.Pattern[str]]) -> Callable[[PhaseTracker, str], None]:
    """The reader of an engine's config dump, by its table of facts (vLLM's ``CFG_RES``: model, parallel
    sizes, eager mode, max_seq_len; SGLang's ``SGL_CFG_RES`` of ``server_args=ServerArgs(...)``): the
    facts it names and the world size (tensor x pipeline parallel)."""

    def read(tr: PhaseTracker, msg: str) -> None:
        for name, rx in table.items():
            c = rx.search(msg)
            if not c:
                continue
            v = c.group("v")
            if name == "enforce_eager":
                tr._fact(name, v == "True")
            elif name == "model":
                tr._facts.setdefault("model", v)
            else:
                tr._fact(name, int(v))
        tp = int(tr._facts.get("tensor_parallel_size", 1) or 1)
        pp = int(tr._facts.get("pipeline_parallel_size", 1) or 1)
        tr._world = tp * pp

    return read


def _nondefault_args(tr: PhaseTracker, msg: str) -> None:
    """The API server's "non-default args: {...}": the facts of :data:`NONDEFAULT_RES` it gives (the first
    start's word stands: an earlier value is kept)."""
    for name, rx in NONDEFAULT_RES.items():
        c = rx.search(msg)
        if c:
            v = c.group("v")
            tr._facts.setdefault(name, float(v) if name == "gpu_memory_utilization" else int(v))


_engine_config = _config_facts(CFG_RES)
_sglang_config = _config_facts(SGL_CFG_RES)


_SGL = "sglang"
#: engines whose server sends itself requests before it is ready (SGLang's warmup: GET /model_info, POST
#: /generate, then "The server is fired up and ready to roll!"): an access line is no ready there, a stats line
#: (its warmup's Prefill batch) only when nothing of the start was seen
_OWN_WARMUP_TRAFFIC = frozenset({_SGL})


def _sglang_kv(tr: PhaseTracker, msg: str) -> None:
    """SGLang's KV pool size: one number (MLA, "KV size") or K and V apart (MHA), in GiB."""
    m = SGL_KV_ALLOC_RE.search(msg)
    if m is None:
        return
    if m.group("kv"):
        tr._facts.setdefault("kv_cache_gib", float(m.group("kv")))
    elif m.group("k") and m.group("v"):
        tr._facts.setdefault("kv_cache_gib", round(float(m.group("k")) + float(m.group("v")), 2))


def _compile_cache(tr: PhaseTracker, msg: str) -> None:
    """Whether torch.compile loads its graphs from the cache or compiles them afresh."""
    if COMPILE_CACHED_RE.search(msg):
        tr._fact("compile_cached", True)
    elif COMPILE_FRESH_RE.search(msg) and "compile_cached" not in tr._facts:
        tr._fact("compile_cached", False)


#: Every phase line, grouped by the phase it belongs to, in the order they are tried (the first
#: row that matches decides, unless it says ``more``). Progress frames (shards, graph capture) are
#: :meth:`PhaseTracker._on_progress`'s.
_PHASE_LINES: tuple[tuple[Phase, tuple[_Line, ...]], ...] = (
    (Phase.READY, (_Line(READY_RE, "ready", engine=None),)),
    (Phase.ENGINE_INIT, (
        _Line(ENGINE_INIT_RE, facts=(("engine_version", ("ver",), str, "set"),), extra=_engine_config),
        _Line(ENGINE_WAIT_RE),
        _Line(ARCH_RE, None, (("architecture", ("v",), str, "set"),)),
        _Line(MAX_LEN_RE, None, (("max_model_len", ("v",), int, "set"),)),
        _Line(NONDEFAULT_ARGS_RE, None, extra=_nondefault_args),
    )),
    (Phase.WEIGHTS, (
        _Line(WEIGHTS_START_RE, facts=(("model", ("model",), str, "default"),)),
        _Line(WEIGHTS_TOOK_RE, "rank_done", (("weights_load_s", ("s",), float, "max"),)),
        _Line(MODEL_LOADING_RE, "rank_done", (
            ("model_memory_gib", ("gib", "gb"), float, "max"), ("model_load_s", ("s",), float, "max"),
        )),
    )),
    (Phase.TORCH_COMPILE, (
        _Line(COMPILE_END_RE, "rank_done", (("compile_s", ("s", "s2"), float, "max"),)),
        _Line(COMPILE_MARK_RE, extra=_compile_cache),
    )),
    (Phase.MEMORY_PROFILING, (
        _Line(PROFILING_TAKES_RE, "rank_done", (("profiling_s", ("s",), float, "max"),)),
        _Line(PROFILE_RUN_RE, facts=(("profile_run_s", ("s",), float, "max"),)),
        _Line(GRAPH_EST_RE, facts=(("graph_memory_estimate_gib", ("gib",), float, "max"),)),
        _Line(GRAPH_PROFILING_RE, facts=(
            ("graph_memory_profiled", ("on",), lambda s: s == "enabled", "set"),
            ("gpu_memory_utilization", ("util",), float, "default"),
        )),
        _Line(PROFILING_MARK_RE),
        _Line(KV_AVAILABLE_RE, "rank_done", (
            ("kv_cache_gib", ("gib",), float, "default"), ("kv_available_gib", ("gib", "neg"), float, "min"),
        )),
        _Line(KV_CPU_SET_RE, "rank_done", (("kv_cache_gib", ("gib",), float, "default"),)),
    )),
    (Phase.KV_CACHE, (
        _Line(KV_BLOCKS_RE, None, (("gpu_blocks", ("gpu",), int, "set"), ("cpu_blocks", ("cpu",), int, "set")),
              more=True),
        _Line(KV_TOKENS_RE, None, (("kv_cache_tokens", ("tok",), _int, "set"),), more=True),
        _Line(KV_CONC_RE, "end", (
            ("max_concurrency", ("x",), float, "set"), ("max_concurrency_len", ("len",), _int, "set"),
        )),
    )),
    (Phase.KV_CACHE, (_Line(NUM_BLOCKS_RE, None, (("gpu_blocks", ("n",), int, "default"),)),)),
    # the memory budget (facts only; vtop/core/membudget.py reads them)
    (Phase.MEMORY_PROFILING, (
        _Line(BUDGET_DEVICE_RE, None, (
            ("mem_free_at_start_gib", ("free",), float, "max"), ("mem_total_gib", ("total",), float, "max"),
            ("gpu_memory_utilization", ("util",), float, "set"), ("mem_requested_gib", ("req",), float, "max"),
            ("weights_gib", ("w",), float, "max"), ("activation_peak_gib", ("a", "a2"), float, "max"),
            ("non_torch_gib", ("n",), float, "max"), ("consumed_gib", ("c",), float, "max"),
            ("cuda_graph_gib", ("g",), float, "max"), ("kv_cache_gib", ("kv",), float, "default"),
        )),
        _Line(BUDGET_OLD_TOTAL_RE, None, (
            ("mem_total_gib", ("total",), float, "max"), ("gpu_memory_utilization", ("util",), float, "set"),
            ("mem_requested_gib", ("req",), float, "max"),
        )),
        _Line(BUDGET_OLD_PARTS_RE, None, (
            ("weights_gib", ("w",), float, "max"), ("non_torch_gib", ("n",), float, "max"),
            ("activation_peak_gib", ("a",), float, "max"), ("kv_cache_gib", ("kv",), float, "default"),
        )),
    )),
    (Phase.CUDA_GRAPHS, (
        _Line(CAPTURE_START_RE),
        _Line(CAPTURE_END_RE, "rank_done", (
            ("graph_capture_s", ("s",), float, "max"), ("graph_memory_gib", ("gib",), float, "max"),
        )),
    )),
    (Phase.WARMUP, (
        _Line(INIT_ENGINE_RE, "end", (
            ("init_engine_s", ("s",), float, "set"), ("init_compilation_s", ("c",), float, "set"),
        )),
        _Line(WARMUP_MARK_RE),
    )),
    (Phase.API_SERVER, (_Line(SERVER_URL_RE), _Line(API_MARK_RE))),
    # SGLang's start, the same phases (patterns.py names each line's source): its config, weights, the KV pool
    # (each rank's "Memory pool end" ends it), CUDA graphs (progress: SGL_CAPTURE_BAR_RE), ready.
    (Phase.READY, (_Line(SGL_READY_RE, "ready", engine=_SGL),)),
    (Phase.ENGINE_INIT, (_Line(SGL_SERVER_ARGS_RE, extra=_sglang_config, engine=_SGL),
                         _Line(SGL_DIST_RE, engine=_SGL))),
    (Phase.WEIGHTS, (
        _Line(SGL_WEIGHTS_BEGIN_RE, engine=_SGL),
        _Line(SGL_WEIGHTS_END_RE, "rank_done", (
            ("weights_load_s", ("s",), float, "max"), ("model_memory_gib", ("gib",), float, "max"),
        ), engine=_SGL),
    )),
    (Phase.KV_CACHE, (
        _Line(SGL_KV_ALLOC_RE, facts=(("kv_cache_tokens", ("tok",), int, "default"),), extra=_sglang_kv,
              engine=_SGL),
        _Line(SGL_POOL_END_RE, "rank_done", engine=_SGL),
        _Line(SGL_LIMITS_RE, None, (
            ("kv_cache_tokens", ("tok",), int, "default"), ("max_model_len", ("ctx",), int, "default"),
        ), engine=_SGL),
    )),
    (Phase.CUDA_GRAPHS, (
        _Line(SGL_CAPTURE_BEGIN_RE, engine=_SGL),
        _Line(SGL_PREFILL_CAPTURE_END_RE, engine=_SGL),  # still capturing: the decode graphs come next
        _Line(SGL_CAPTURE_END_RE, "rank_done", (
            ("graph_capture_s", ("s", "s2"), float, "max"), ("graph_memory_gib", ("gib",), float, "max"),
        ), engine=_SGL),
    )),
)

# --------------------------------------------------------------------------- tracker


@dataclass
class _Rec:
    start: float | None = None
    end: float | None = None
    start_arrival: float | None = None
    end_arrival: float | None = None
    progress: dict[str, tuple[int, int]] = field(default_factory=dict)
    rank_end: dict[str, float] = field(default_factory=dict)


class PhaseTracker:
    """State machine over a vLLM log: phases, facts, failure, stall.

    Feed every line with :meth:`feed` (``arrival`` = monotonic seconds when it was
    read), then read :meth:`snapshot`. A new version banner starts over (a
    restart); the ring of recent lines survives restarts.
    """

    # Per start (see _reset_startup).
    _phases: dict[Phase, _Rec]
    _current: Phase | None
    _state: str
    _facts: dict[str, Any]  # StartupFacts fields, filled as lines report them
    _failure: Failure | None
    _failure_prio: int
    _candidate: tuple[Failure, int] | None
    _first_t: float | None
    _last_activity: float | None
    _last_line: str
    _world: int | None
    _rank_names: dict[str, str]
    _ready_t: float | None
    _ready_source: str | None
    _progress_seen: dict[str, int]
    #: per phase: the arrival of its last progress step, and its longest step so far
    _step_last: dict[Phase, float]
    _step_max: dict[Phase, float]
    _expect_logo_model: bool

    def __init__(self, *, year: int | None = None, ring_size: int = 5000) -> None:
        self._year = year if year is not None else time.localtime().tm_year
        self._last_month: int | None = None
        self._anchor: tuple[float, float] | None = None  # (log time, arrival) of the last stamped line
        self._stamp_cache: tuple[tuple[int, int, int, int, int] | None, float] = (None, 0.0)
        self._ring: deque[LogLine] = deque(maxlen=ring_size)
        self._tb_open: dict[str, bool] = {}
        self._closed_raw_traceback = False
        self._restarts = 0
        self._warnings = 0
        self._errors = 0
        #: the starts before this one, oldest first (a restart inside the log: :attr:`past_starts`)
        self._past: deque[StartupSnapshot] = deque(maxlen=PAST_STARTS)
        #: warnings and errors by kind (:attr:`problem_kinds`): signature -> [count, level, example, first t, last t]
        self._kinds: dict[str, list[Any]] = {}
        self._launch_t: float | None = None
        self._launch_arrival: float | None = None
        self._launch_epoch: float | None = None
        self._launch_off: float | None = None
        self._reset_startup()

    # ------------------------------------------------------------------ public API

    def feed(self, line: str, arrival: float) -> LogEvent:
        """Take one line (as read, ANSI allowed) that arrived at monotonic time ``arrival``."""
        ev = parse_line(line)
        if ev.kind == "blank" and not ev.proc:
            return ev
        self._closed_raw_traceback = False
        t = self._time_of(ev, arrival)
        level = self._classify(ev)
        if ev.kind != "blank":
            self._remember(ev, t, level, arrival)
        if self._first_t is None:
            self._first_t = t
        active = self._handle(ev, t, arrival, level)
        if active:
            self._last_activity = arrival
            if ev.kind != "blank":
                self._last_line = ev.text
        return ev

    def feed_lines(self, lines: Iterable[str], arrival: float) -> None:
        """Feed a batch read in one poll."""
        for line in lines:
            self.feed(line, arrival)

    def mark_process_start(
        self, epoch: float, *, utc_offset_s: float | None = None, arrival: float | None = None
    ) -> None:
        """Record the launch time (e.g. psutil ``create_time()``), so the first phase starts there.

        vLLM stamps lines in the local time of its host with no zone; ``utc_offset_s``
        is that host's offset (default: this machine's, right when both run on one
        box). ``arrival`` (monotonic, same clock as :meth:`feed`) lets :meth:`stalled`
        count silence from the launch before the first line.
        """
        if utc_offset_s is None:
            utc_offset_s = float(time.localtime(epoch).tm_gmtoff)
        self._launch_epoch = epoch
        self._launch_off = utc_offset_s
        self._launch_t = epoch + utc_offset_s
        self._launch_arrival = arrival
        rec = self._phases[Phase.PROCESS_START]
        if self._state == "idle":
            if arrival is not None:
                self._begin(self._launch_t, arrival)
                self._last_activity = arrival
        elif rec.start is not None and self._launch_t < rec.start:
            rec.start = self._launch_t

    def set_clock_offset(self, offset_s: float) -> None:
        """The log's clock minus the wall clock as measured (:mod:`vtop.core.logclock`): the launch
        time marked goes on it (a log stamped 8 h behind, a container in UTC beside a host in UTC+8,
        made "process start 8 h" or "ready in -8 h" on this box's offset)."""
        epoch, old = self._launch_epoch, self._launch_t
        if epoch is None or old is None or offset_s == self._launch_off:
            return
        self._launch_off = offset_s
        new = epoch + offset_s
        self._launch_t = new
        rec = self._phases[Phase.PROCESS_START]
        if rec.start is not None and (rec.start == old or new < rec.start):
            rec.start = new if rec.end is None else min(new, rec.end)

    def mark_ready(self, arrival: float, source: str = "health") -> None:
        """The server answered ``/health`` 200 (or is otherwise known to be up).

        A failure the log showed is never undone by a ready of the same start: an
        engine that died under load leaves a /health 200 from the second before
        queued behind its death lines (a new start, with its banner or a new
        process, begins a new record)."""
        if self._state in ("ready", "stopped", "failed"):
            return
        self._ready(self._time_at(arrival), arrival, source)

    def elapsed(self, now: float, phase: Phase | None = None) -> float | None:
        """Seconds spent in ``phase`` (default: the current one) as of monotonic ``now``.

        A finished phase gives its duration; a running one the log-clock time since it
        began (the last stamp extrapolated with arrival time).
        """
        phase = phase or self._current
        if phase is None:
            return None
        rec = self._phases[phase]
        if rec.start is None:
            return None
        end = rec.end if rec.end is not None else self._time_at(now)
        return max(0.0, end - rec.start)

    def stalled(self, now: float, threshold_s: float = DEFAULT_STALL_S) -> StallInfo | None:
        """Info when a start in progress has shown no new line and no progress for ``threshold_s``.

        A ready server that prints nothing is idle, not stalled; a failed or stopped
        one is not stalled either. The shm-broadcast "No available shared memory
        broadcast block" line is a hang symptom, so it does not count as activity.
        """
        if self._state != "starting" or self._last_activity is None:
            return None
        silent = now - self._last_activity
        if silent <= threshold_s:
            return None
        phase = self._current
        return StallInfo(phase, silent, self._last_line, stall_hint(phase, self._facts.get("engine")))

    def quiet(self, now: float) -> Quiet | None:
        """How long a start in progress has been silent at monotonic ``now`` (whatever the
        threshold), with what the current phase's progress bars say; None when not starting."""
        if self._state != "starting" or self._last_activity is None:
            return None
        phase = self._current
        progressing = False
        step: float | None = None
        if phase is not None:
            bars = self._phases[phase].progress.values()
            progressing = any(n < tot for n, tot in bars)
            step = self._step_max.get(phase)
        return Quiet(phase, max(0.0, now - self._last_activity), self._last_line,
                     stall_hint(phase, self._facts.get("engine")), progressing, step, now)

    @property
    def state(self) -> str:
        return self._state

    @property
    def current(self) -> Phase | None:
        return self._current

    def recent(self, *, min_level: str | None = None, limit: int | None = None) -> list[LogLine]:
        """Recent lines for the log pane, optionally only ``WARNING`` and up, newest last."""
        lines = list(self._ring) if min_level is None else [ln for ln in self._ring if ln.at_least(min_level)]
        return lines[-limit:] if limit else lines

    @property
    def warning_count(self) -> int:
        return self._warnings

    @property
    def error_count(self) -> int:
        return self._errors

    def snapshot(self) -> StartupSnapshot:
        views = []
        for p in _ORDER:
            rec = self._phases[p]
            if rec.start is None:
                continue
            ranks = tuple(
                sorted(
                    (RankTiming(self._rank_names.get(k, k), k, e, e - rec.start) for k, e in rec.rank_end.items()),
                    key=lambda r: r.end,
                )
            )
            progress = tuple(Progress(label, n, tot) for label, (n, tot) in rec.progress.items())
            views.append(PhaseView(p, rec.start, rec.end, rec.start_arrival, progress, ranks))
        facts = StartupFacts(**{k: v for k, v in self._facts.items() if k in _FACT_NAMES})
        started = self._phases[Phase.PROCESS_START].start
        return StartupSnapshot(
            state=self._state,
            phases=tuple(views),
            current=self._current,
            facts=facts,
            failure=self._failure,
            started=started,
            ready_at=self._ready_t,
            ready_source=self._ready_source,
            restarts=self._restarts,
            world_size=self._world,
        )

    # ------------------------------------------------------------------ time

    def _time_of(self, ev: LogEvent, arrival: float) -> float:
        if ev.stamp is not None and ev.stamp == self._stamp_cache[0] and self._anchor is not None:
            cached = self._stamp_cache[1]
            self._anchor = (cached, arrival)
            return cached
        if ev.stamp is not None:
            mon, day, hh, mi, ss = ev.stamp
            if self._last_month is not None and mon < self._last_month - 6:
                self._year += 1  # December -> January
            self._last_month = mon
            t: float | None
            try:
                t = float(calendar.timegm((self._year, mon, day, hh, mi, ss, 0, 0, 0)))
            except (ValueError, OverflowError):
                t = None
            if t is not None:
                if self._anchor is None:
                    self._rebase(t - arrival - self._pre_stamp_offset())
                self._anchor = (t, arrival)
                self._stamp_cache = (ev.stamp, t)
                return t
        return self._time_at(arrival)

    def _time_at(self, arrival: float) -> float:
        if self._anchor is None:
            return arrival + self._pre_stamp_offset()
        return self._anchor[0] + max(0.0, arrival - self._anchor[1])

    def _pre_stamp_offset(self) -> float:
        """Before any stamped line: the launch (an epoch time on the log's clock) with its arrival
        anchors the log's clock; else times stay on the arrival clock. Without it a ready seen
        before any stamp (a log that is missing, binary or quiet) was a monotonic time minus an
        epoch: "ready in -1796162519.7 s"."""
        if self._launch_t is not None and self._launch_arrival is not None:
            return self._launch_t - self._launch_arrival
        return 0.0

    def _rebase(self, delta: float) -> None:
        """Move times taken on the arrival clock (before any stamp) onto the log's clock."""
        for p, rec in self._phases.items():
            if p is Phase.PROCESS_START and self._launch_t is not None and rec.start == self._launch_t:
                continue
            if rec.start is not None:
                rec.start += delta
            if rec.end is not None:
                rec.end += delta
            rec.rank_end = {k: v + delta for k, v in rec.rank_end.items()}
        if self._first_t is not None:
            self._first_t += delta
        if self._ready_t is not None:
            self._ready_t += delta

    # ------------------------------------------------------------------ bookkeeping

    def _reset_startup(self) -> None:
        """Forget the current start (a new banner): everything but the ring and counters."""
        self._phases = {p: _Rec() for p in _ORDER}
        self._current = None
        self._state = "idle"
        self._facts = {}
        self._failure = None
        self._failure_prio = 0
        self._candidate = None
        self._first_t = None
        self._last_activity = None
        self._last_line = ""
        self._world = None
        self._rank_names = {}
        self._ready_t = None
        self._ready_source = None
        self._progress_seen = {}
        self._step_last = {}
        self._step_max = {}
        self._expect_logo_model = False

    def _restart(self, t: float) -> None:
        # A launch time marked for the new process (after the old start's first line) stays.
        old_first = self._first_t
        launch = self._launch_t
        keep = launch is not None and launch <= t + 1 and (old_first is None or launch > old_first)
        self._past.append(self.snapshot())
        self._reset_startup()
        self._restarts += 1
        if not keep:
            self._launch_t = None
            self._launch_arrival = None
            self._launch_epoch = None
            self._launch_off = None

    def _classify(self, ev: LogEvent) -> str | None:
        """Level for the log pane; tracebacks and warnings printed raw get one too."""
        level = ev.level
        if level == "INFO" or level == "DEBUG":
            return level
        if level is None and ev.kind in ("raw", "blank"):
            key = str(ev.pid) if ev.pid else "main"
            msg = ev.message.strip()
            if TRACEBACK_RE.match(msg):
                self._tb_open[key] = True
                level = "ERROR"
            elif self._tb_open.get(key):
                if EXC_LINE_RE.match(msg):
                    self._tb_open[key] = False
                    self._closed_raw_traceback = True
                level = "ERROR"
            elif EXC_LINE_RE.match(msg) or C10D_ERR_RE.match(msg):
                level = "ERROR"
            elif C10D_WARN_RE.match(msg) or PYWARN_RE.search(msg):
                level = "WARNING"
        # a kind is a logged warning or error, or the exception line that ends a traceback printed raw
        # (not each line of the traceback)
        kind = ev.level is not None or (level is not None and EXC_LINE_RE.match(ev.message.strip()) is not None)
        if level in ("WARNING",):
            self._warnings += 1
            if kind:
                self._note_kind(ev, "WARNING")
        elif level in ("ERROR", "CRITICAL"):
            self._errors += 1
            if kind:
                self._note_kind(ev, "ERROR")
        return level

    def _note_kind(self, ev: LogEvent, level: str) -> None:
        """Count a warning or an error by its kind: the message with its numbers, paths and ids
        blanked (one kind for "... 3 s" and "... 5 s"), bounded to :data:`MAX_KINDS` kinds."""
        raw = ev.message
        if raw[:1].isspace() or raw.startswith("Traceback (most recent call last)"):
            return  # a traceback's own lines (logged line by line by logger.exception): its last line counts
        msg = raw.strip()
        if not msg:
            return
        key = level + ":" + _KIND_RE.sub("#", msg)[:96]
        t = self._anchor[0] if self._anchor is not None else None
        rec = self._kinds.get(key)
        if rec is None:
            if len(self._kinds) >= MAX_KINDS:
                return
            self._kinds[key] = [1, level, msg[:160], t, t]
        else:
            rec[0] += 1
            rec[4] = t

    @property
    def problem_kinds(self) -> list[tuple[str, int, str, float | None, float | None]]:
        """``(level, count, an example message, first, last)`` of each kind of warning and error
        read, errors first, then warnings, each most frequent first (times on the log's clock, None
        when no line was stamped yet)."""
        rows = [(r[1], r[0], r[2], r[3], r[4]) for r in self._kinds.values()]
        rows.sort(key=lambda r: (r[0] != "ERROR", -r[1]))
        return rows

    @property
    def past_starts(self) -> tuple[StartupSnapshot, ...]:
        """The starts of earlier runs of the server in this log, oldest first (at most
        :data:`PAST_STARTS`): each as its snapshot was when the next start's banner came."""
        return tuple(self._past)

    def _remember(self, ev: LogEvent, t: float, level: str | None, arrival: float) -> None:
        bar = None
        if ev.kind == "progress":
            bar = ev.message.split(":", 1)[0].strip()
            if self._ring and self._ring[-1].progress == bar:
                self._ring.pop()
        self._ring.append(LogLine(arrival, t, level, ev.text, ev.proc, bar))

    def _fact(self, name: str, value: object, *, keep_max: bool = False) -> None:
        if keep_max and isinstance(value, (int, float)):
            old = self._facts.get(name)
            if isinstance(old, (int, float)) and old >= value:
                return
        self._facts[name] = value

    # ------------------------------------------------------------------ phase machinery

    def _begin(self, t: float, arrival: float) -> None:
        if self._state != "idle":
            return
        self._state = "starting"
        rec = self._phases[Phase.PROCESS_START]
        start = t
        if self._launch_t is not None and self._launch_t <= t:
            start = self._launch_t
        rec.start, rec.start_arrival = start, arrival
        self._current = Phase.PROCESS_START

    def _enter(self, phase: Phase, t: float, arrival: float) -> None:
        rec = self._phases[phase]
        if rec.start is not None:
            return
        if self._state == "idle":
            # Attached after the banner: the start began at the first line we saw, if recent.
            first = self._first_t
            self._begin(first if first is not None and t - first < 120.0 else t, arrival)
        idx = _INDEX[phase]
        if self._current is not None and _INDEX[self._current] > idx:
            # A phase we had not seen shows up after a later one: keep it, don't go back.
            rec.start, rec.start_arrival = t, arrival
            return
        if phase is Phase.KV_CACHE and self._phases[Phase.MEMORY_PROFILING].start is None:
            # Every version profiles before sizing the KV cache; V0 0.6 and V1 0.8 just don't say so.
            self._enter(Phase.MEMORY_PROFILING, t, arrival)
        prev: _Rec | None = None
        for p in _ORDER[:idx]:
            r = self._phases[p]
            if r.start is None:
                continue
            if r.end is None:
                self._close(p, t, arrival)
            prev = r
        start, start_arrival = t, arrival
        if prev is not None and prev.end is not None and prev.end < t:
            start = prev.end
            start_arrival = prev.end_arrival if prev.end_arrival is not None else arrival
        rec.start, rec.start_arrival = start, start_arrival
        self._current = phase

    def _close(self, phase: Phase, t: float, arrival: float) -> None:
        rec = self._phases[phase]
        if rec.start is None or rec.end is not None:
            return
        rec.end = max(rec.rank_end.values()) if rec.rank_end else t
        rec.end = max(rec.end, rec.start)
        rec.end_arrival = arrival
        self._after_end(phase, arrival)

    def _end(self, phase: Phase, t: float, arrival: float) -> None:
        """An explicit end line for a phase that one process logs."""
        self._enter(phase, t, arrival)
        self._close(phase, t, arrival)

    def _rank_done(self, phase: Phase, ev: LogEvent, t: float, arrival: float) -> None:
        """A per-rank end line ("Model loading took", "Graph capturing finished", ...)."""
        self._enter(phase, t, arrival)
        rec = self._phases[phase]
        key = str(ev.pid) if ev.pid else (ev.proc or "main")  # SGLang's records name the rank, no pid
        self._rank_names[key] = ev.proc or "main"
        rec.rank_end[key] = max(rec.rank_end.get(key, t), t)
        if rec.end is not None:
            rec.end = max(rec.end, t)
        elif len(rec.rank_end) >= (self._world or 1):
            rec.end = max(rec.rank_end.values())
            rec.end_arrival = arrival
            self._after_end(phase, arrival)

    def _after_end(self, phase: Phase, arrival: float) -> None:
        """Phases that always follow another without a line of their own start right away."""
        if self._current is not phase:
            return
        end = self._phases[phase].end
        assert end is not None
        nxt: Phase | None = None
        if phase is Phase.CUDA_GRAPHS:
            nxt = Phase.WARMUP
        elif phase is Phase.WARMUP:
            nxt = Phase.API_SERVER
        elif phase is Phase.KV_CACHE and self._facts.get("enforce_eager") is True:
            nxt = Phase.WARMUP
        if nxt is not None and self._phases[nxt].start is None:
            self._enter(nxt, end, arrival)

    def _progress(self, phase: Phase, label: str, n: int, tot: int, t: float, arrival: float,
                  elapsed_s: float | None = None) -> bool:
        rec = self._phases[phase]
        if rec.start is None:
            self._enter(phase, t, arrival)
        rec.progress[label] = (n, tot)
        key = f"{phase.value}:{label}"
        before = self._progress_seen.get(key)
        changed = before != n
        self._progress_seen[key] = n
        if changed:
            # How long a step takes, to know when progress has stopped: the time between two
            # frames that moved (frames read in one poll share an arrival) and tqdm's own
            # elapsed time over the steps done.
            steps = [elapsed_s / n] if elapsed_s is not None and n > 0 else []
            last = self._step_last.get(phase)
            if last is not None and before is not None and n > before:
                steps.append((arrival - last) / (n - before))
            if steps:
                self._step_max[phase] = max(self._step_max.get(phase, 0.0), *steps)
            self._step_last[phase] = arrival
        return changed

    def _ready(self, t: float, arrival: float, source: str) -> None:
        if self._state == "idle":
            # Nothing of the start was seen (attached late): ready, with no timeline.
            self._state = "ready"
            self._ready_t, self._ready_source = t, source
            return
        for p in _ORDER[:-1]:
            rec = self._phases[p]
            if rec.start is not None and rec.end is None:
                rec.end, rec.end_arrival = max(t, rec.start), arrival
        rec = self._phases[Phase.READY]
        rec.start = rec.end = t
        rec.start_arrival = rec.end_arrival = arrival
        self._current = Phase.READY
        self._state = "ready"
        self._ready_t = t
        self._ready_source = source

    def _fail(self, failure: Failure, prio: int) -> None:
        if self._state == "failed":
            if prio > self._failure_prio:
                self._failure, self._failure_prio = failure, prio
            return
        if self._candidate is not None and self._candidate[1] > prio and self._recent(self._candidate[0], failure.at):
            cand = self._candidate[0]
            failure = Failure(cand.kind, cand.line, failure.phase, failure.at, failure.arrival, cand.detail,
                              engine=cand.engine)
            prio = self._candidate[1]
        for p in _ORDER[:-1]:
            rec = self._phases[p]
            if rec.start is not None and rec.end is None:
                rec.end = max(failure.at if failure.at is not None else rec.start, rec.start)
                rec.end_arrival = failure.arrival
        self._state = "failed"
        self._failure, self._failure_prio = failure, prio

    # ------------------------------------------------------------------ the big dispatch

    def _handle(self, ev: LogEvent, t: float, arrival: float, level: str | None) -> bool:
        """Update state from one line; return False when the line is not a sign of progress."""
        msg = ev.message
        if ev.kind == "blank":
            return True
        launch = LAUNCH_RES.get(ev.engine or "")
        if launch is not None and launch.search(msg) and self._progressed():
            self._restart(t)  # the engine's launch line after a start that got anywhere: a new start
            self._first_t = t
        if ev.engine is not None and "engine" not in self._facts:
            self._facts["engine"] = ev.engine

        if "version" in msg:
            for i, rx in enumerate(BANNER_RES):
                m = rx.search(msg)
                if m:
                    self._on_banner(m, t, arrival, logo=i == len(BANNER_RES) - 1)
                    return True
        if self._expect_logo_model:
            self._expect_logo_model = False
            m = LOGO_MODEL_RE.search(msg)
            if m:
                self._fact("model", m.group("model"))
                return True

        if "shared memory broadcast" in msg and SHM_WAIT_RE.search(msg):
            self._facts["shm_broadcast_waits"] = int(self._facts.get("shm_broadcast_waits", 0)) + 1
            return False

        if self._state == "stopped":
            return True
        if "hut" in msg and SHUTDOWN_RE.search(msg) and self._state in ("starting", "ready"):
            self._state = "stopped"
            return True

        if level not in ("DEBUG", "INFO", "WARNING") and ev.kind not in ("uvicorn", "progress"):
            self._check_error(ev, msg, t, arrival, level)
        if self._state == "failed":
            return True

        if " on " in msg:
            m = SERVER_URL_RE.search(msg)
            if m:
                self._fact("url", m.group("url") or m.group("u2"))

        if self._state == "ready":
            return True
        if self._serving_stats(ev) or (
            ev.kind == "uvicorn" and "HTTP/" in msg and ACCESS_RE.search(msg)
            and self._facts.get("engine") not in _OWN_WARMUP_TRAFFIC
        ):
            self._ready(t, arrival, "inferred")
            return True

        if ev.kind == "progress":
            return self._on_progress(msg, t, arrival)
        self._on_phase_line(ev, msg, t, arrival)
        return True

    def _serving_stats(self, ev: LogEvent) -> bool:
        """A stats line of the line's engine (:data:`~vtop.core.loghistory.STATS_LINES`: vLLM's ``Avg prompt
        throughput: ...``, SGLang's ``Decode batch`` / ``Prefill batch``) says the server serves: its start is
        done. An engine that sends itself requests before it is ready logs its warmup's batch lines during the
        start (SGLang: a ``Prefill batch`` of the warmup request, 1 s before "The server is fired up and ready
        to roll!"): there a stats line is a ready only when nothing of the start was seen (attached late)."""
        if parse_stats(ev.message, ev.engine, ev.proc) is None:
            return False
        return self._state == "idle" or self._facts.get("engine") not in _OWN_WARMUP_TRAFFIC

    def _progressed(self) -> bool:
        """Whether the current start got past its first line (a launch line now is a new start's)."""
        return self._state in ("ready", "failed", "stopped") or any(
            self._phases[p].start is not None for p in _ORDER[1:]
        )

    def _on_banner(self, m: re.Match[str], t: float, arrival: float, *, logo: bool) -> None:
        if self._progressed():
            self._restart(t)
            self._first_t = t
        self._fact("version", m.group("ver").rstrip(","))
        model = m.groupdict().get("model")
        if model:
            self._fact("model", model)
        else:
            self._expect_logo_model = logo
        self._begin(t, arrival)

    def _on_progress(self, msg: str, t: float, arrival: float) -> bool:
        e = TQDM_ELAPSED_RE.search(msg)
        elapsed = (int(e.group("h") or 0) * 3600 + int(e.group("m")) * 60 + int(e.group("s"))) if e else None
        m = SHARDS_RE.search(msg)
        if m:
            return self._progress(Phase.WEIGHTS, "shards", int(m.group("n")), int(m.group("tot")), t, arrival,
                                  elapsed)
        m = CAPTURE_BAR_RE.search(msg)
        if m:
            label = m.group("mode") or "graphs"
            prof = self._phases[Phase.MEMORY_PROFILING]
            phase = Phase.CUDA_GRAPHS
            if self._current is Phase.MEMORY_PROFILING and prof.end is None:
                # 0.21+ may capture graphs to measure their memory while profiling.
                phase = Phase.MEMORY_PROFILING
            return self._progress(phase, label, int(m.group("n")), int(m.group("tot")), t, arrival, elapsed)
        m = SGL_CAPTURE_BAR_RE.search(msg) if self._facts.get("engine") == _SGL else None
        if m:
            # SGLang's decode "batches" and (0.5.17) its prefill graphs by "num tokens": their own words
            return self._progress(Phase.CUDA_GRAPHS, m.group("what"), int(m.group("n")), int(m.group("tot")), t,
                                  arrival, elapsed)
        return True

    def _on_phase_line(self, ev: LogEvent, msg: str, t: float, arrival: float) -> None:
        """Apply the first row of :data:`_PHASE_LINES` that matches ``msg``."""
        engine = self._facts.get("engine")
        for phase, rows in _PHASE_LINES:
            pending = False
            for row in rows:
                if row.engine != "*" and row.engine != engine:
                    continue
                m = row.rx.search(msg)
                if m is None:
                    continue
                for name, groups, conv, how in row.facts:
                    raw = next((v for v in (m.group(g) for g in groups) if v), None)
                    if raw is None:
                        continue
                    if how == "default":
                        self._facts.setdefault(name, conv(raw))
                    elif how == "min":
                        old = self._facts.get(name)
                        self._facts[name] = conv(raw) if old is None else min(old, conv(raw))
                    else:
                        self._fact(name, conv(raw), keep_max=how == "max")
                if row.extra is not None:
                    row.extra(self, msg)
                if row.then == "enter":
                    self._enter(phase, t, arrival)
                elif row.then == "end":
                    self._end(phase, t, arrival)
                elif row.then == "rank_done":
                    self._rank_done(phase, ev, t, arrival)
                elif row.then == "ready":
                    self._ready(t, arrival, "log")
                if not row.more:
                    return
                pending = True
            if pending:
                self._enter(phase, t, arrival)
                return

    def _check_error(self, ev: LogEvent, msg: str, t: float, arrival: float, level: str | None) -> None:
        text = msg.strip()
        kind: str | None = None
        match: re.Match[str] | None = None
        prio = 0
        for k, rx, p in ERROR_PATTERNS:
            match = rx.search(text)
            if match:
                kind, prio = k, p
                break
        uncaught = False
        if kind is None:
            match = EXC_LINE_RE.match(text)
            if not match or match.group("exc") in ("SystemExit", "KeyboardInterrupt"):
                return
            kind, prio = "exception", 2
            # A raw exception line that closes a raw traceback is uncaught: the process dies.
            uncaught = self._closed_raw_traceback
        # what the telling line says (sizes, a module, an exit code): the words and the fix are the
        # startup rules' (vtop.core.rules.startup.failure_words)
        detail = tuple((k, v) for k, v in match.groupdict().items() if v is not None) if match else ()
        failure = Failure(kind, ev.text, self._current, t, arrival, detail, engine=self._facts.get("engine"))
        if self._state == "failed":
            self._fail(failure, prio)
            return
        if self._state in ("ready", "idle"):
            # Serving (or attached without seeing a start): request errors and tracebacks do
            # not end it, only an engine or worker death; an error before it may be its cause.
            if kind in DEATH_KINDS or (self._state == "idle" and kind == "engine_init_failed"):
                self._fail(failure, prio)
            else:
                self._note_candidate(failure, prio)
            return
        if prio != 2 or uncaught:
            self._fail(failure, prio)
        else:
            self._note_candidate(failure, prio)

    def _note_candidate(self, failure: Failure, prio: int) -> None:
        old = self._candidate
        if old is None or prio >= old[1] or not self._recent(old[0], failure.at):
            self._candidate = (failure, prio)

    @staticmethod
    def _recent(cause: Failure, at: float | None) -> bool:
        """A cause counts for a death marker only when logged shortly before it."""
        return cause.at is None or at is None or at - cause.at <= CAUSE_WINDOW_S


def summarize(snapshot: StartupSnapshot) -> Mapping[str, object]:
    """A plain dict of the snapshot for logs, JSON output and debugging."""
    return {
        "state": snapshot.state,
        "phases": [
            {
                "phase": v.phase.value,
                "duration_s": v.duration_s,
                "progress": {p.label: f"{p.n}/{p.total}" for p in v.progress},
                "slowest_rank": v.slowest_rank.name if v.slowest_rank and len(v.ranks) > 1 else None,
            }
            for v in snapshot.phases
        ],
        "total_s": snapshot.total_s,
        "failure": snapshot.failure.kind if snapshot.failure else None,
        "died_after_ready_s": snapshot.died_after_ready_s,
    }
