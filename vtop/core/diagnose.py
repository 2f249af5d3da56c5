"""Diagnosis rules: what is wrong with a vLLM box, why, and the exact fix. Pure: no I/O.

:class:`Diagnoser` is fed once per tick with what vtop already holds (the
server views, the GPU history, the startup tracker's snapshot and stall, the
in-flight requests read from the log) and answers a list of :class:`Alert`,
critical first. It keeps a little state across ticks: when ``running`` last
went from 0 to N, when a request last finished, when the token counters last
moved, how long the KV cache has been full, GPU streaks and memory samples.

Rules (``rule`` ids are stable; see ``shared/docs/vllm-reference.md`` §4, §7):

``runaway``
    Requests running, generation tokens rising, and no request finished for
    ``runaway_s`` while ``waiting`` is zero or growing. The usual cause: a
    chat client that omits ``max_tokens`` (vLLM then allows
    ``max_model_len - prompt`` tokens, §4). A busy GPU is *not* required: one
    decode stream on an H200 reads 10-23 % GPU-Util.
``engine_stall``
    ``running > 0`` while the token and finish counters stay flat for
    ``engine_stall_s`` and ``/metrics`` still answers (§7.19: a frozen engine
    keeps ``/health`` at 200 and freezes the gauges).
``startup_stall`` / ``startup_failure`` / ``engine_died``
    From the startup tracker: a silent start, a failed start (with the
    tracker's fix), an engine that died after it was ready.
``oom_startup`` / ``oom_transient`` / ``oom_steady`` / ``oom_risk``
    A CUDA out-of-memory error (tracker failure or log line), classified by
    when and around what it happened; ``oom_risk`` warns before one when a
    GPU's memory climbs steadily towards full.
``kv_saturation``
    KV cache above ``kv_saturation_pct`` for a while with preemptions rising
    or the queue growing.
``sm_idle``
    GPU-Util high while GPM SM activity stays low (only where the GPU reports
    SM activity; never during a start, where that is expected).
``risky_flags``
    Launch flags that invite trouble: no generation cap with a long context,
    ``--mm-processor-cache-gb 0``, ``--max-num-seqs`` far above the KV cache's
    concurrency, ``--gpu-memory-utilization`` that leaves no room next to the
    other processes on the GPU.

``core`` must not import ``sources`` at run time: GPU samples, server
processes and in-flight requests are read by attribute.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vtop.core.inflight import OldestInFlight
from vtop.core.phases import Phase
from vtop.core.rates import histogram_delta, histogram_quantile
from vtop.model.fmt import dur
from vtop.model.fmt import to_float as _float

if TYPE_CHECKING:
    from vtop.core.gpu_history import GpuHistory
    from vtop.core.phases import Failure, StallInfo, StartupSnapshot
    from vtop.core.server import ServerView

__all__ = [
    "RULES",
    "SEVERITIES",
    "Alert",
    "Diagnoser",
    "Thresholds",
    "diagnose_once",
]

SEVERITIES = ("critical", "warning", "info")
_RANK = {s: i for i, s in enumerate(SEVERITIES)}

RULES = (
    "runaway",
    "engine_stall",
    "startup_stall",
    "startup_failure",
    "engine_died",
    "oom_startup",
    "oom_transient",
    "oom_steady",
    "oom_risk",
    "kv_saturation",
    "sm_idle",
    "risky_flags",
)

_GIB = float(2**30)
_LIVE = ("up", "restarted")


# --------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class Alert:
    """One diagnosis: a name, how bad, the numbers behind it, and what to do."""

    #: stable id, one of :data:`RULES`
    rule: str
    #: "info" | "warning" | "critical"
    severity: str
    #: one line, e.g. "Runaway decode on :8000: 1 request running 2m 05s, 460 tok/s, nothing finished"
    title: str
    #: lines with numbers
    evidence: tuple[str, ...] = ()
    #: what to do, with exact flags
    fix: tuple[str, ...] = ()
    #: server URL, "gpu0", or None (a start not tied to a known server)
    target: str | None = None
    #: monotonic time the condition began
    since: float | None = None

    @property
    def key(self) -> tuple[str, str | None]:
        return (self.rule, self.target)

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "severity": self.severity,
            "title": self.title,
            "evidence": list(self.evidence),
            "fix": list(self.fix),
            "target": self.target,
            "since": self.since,
        }


@dataclass(frozen=True)
class Thresholds:
    """Every number the rules compare against. Seconds unless named ``_pct`` (0-100) or ``_ps`` (per second)."""

    #: runaway: no request finished for this long while requests run and tokens flow
    runaway_s: float = 120.0
    #: runaway: the oldest in-flight request known (from /metrics alone, vtop/core/inflight.py) to have
    #: run this long, while other requests finish around it; raised to ``runaway_age_ordinary_x`` times
    #: what requests ordinarily take on this server (the p95 of those that finished)
    runaway_age_s: float = 45.0
    runaway_age_ordinary_x: float = 3.0
    #: runaway: a resolved max_tokens at or above this share of max_model_len means the client omitted it
    runaway_near_len_frac: float = 0.5
    #: runaway: generation must have grown within this many seconds ("tokens rising")
    rising_s: float = 10.0
    #: engine stall: running > 0 with the token and finish counters flat this long
    engine_stall_s: float = 20.0
    #: KV saturation: usage at or above this percentage ...
    kv_saturation_pct: float = 95.0
    #: ... for at least this long
    kv_saturation_s: float = 15.0
    #: ... or, over the last ``kv_window_s``, at or above it this share of the time with the median within
    #: 5 points of it (usage dips for a scrape as requests finish and are preempted, then climbs back)
    kv_window_s: float = 30.0
    kv_window_frac: float = 0.6
    #: preemptions and queue growth are judged over this window
    preempt_window_s: float = 60.0
    #: preemptions per second that make a KV saturation critical (a preemption storm)
    preempt_storm_ps: float = 1.0
    #: sm_idle: GPU-Util at or above this percentage ...
    sm_idle_util: float = 90.0
    #: ... while GPM SM activity stays below this percentage ...
    sm_idle_active: float = 15.0
    #: ... for this long
    sm_idle_s: float = 120.0
    #: OOM: what happened this long before an OOM counts as its trigger (memory spike, long prompt, full KV)
    transient_window_s: float = 30.0
    #: OOM: GPU memory this many points above the level before the window counts as a spike
    mem_spike_pct: float = 3.0
    #: OOM: a prompt of at least this share of max_model_len counts as long
    long_prompt_frac: float = 0.25
    #: OOM: a server up this long with no other trigger points at allocator fragmentation
    fragmentation_uptime_s: float = 6 * 3600.0
    #: OOM: how long an OOM line seen in the log stays an alert (a failed start stays while it is failed)
    oom_hold_s: float = 600.0
    #: pre-OOM: GPU memory at or above this percentage ...
    oom_risk_pct: float = 95.0
    #: ... having climbed at least this many points ...
    oom_risk_rise_pct: float = 2.0
    #: ... steadily over this window
    oom_risk_window_s: float = 300.0
    #: risky flags: a max_model_len this long without a generation cap is flagged
    long_context_len: int = 16384
    #: risky flags: --max-num-seqs this many times the logged maximum concurrency is flagged
    risky_seqs_ratio: float = 8.0
    #: how much per-server / per-GPU history the diagnoser keeps
    history_s: float = 900.0


# --------------------------------------------------------------------------- helpers


_dur = dur


def _n(x: float | None) -> str:
    return "?" if x is None else f"{x:,.0f}"


def _gib(b: float | None) -> str:
    return "?" if b is None else f"{b / _GIB:.1f} GiB"


def _short(url: str | None) -> str:
    """``:8000`` for a local server, ``host:port`` otherwise."""
    if not url:
        return "vLLM"
    m = re.match(r"^[a-z]+://(\[[^\]]+\]|[^/:]+)(?::(\d+))?", url)
    if not m:
        return url
    host, port = m.group(1), m.group(2) or ""
    if host in ("127.0.0.1", "localhost", "[::1]", "0.0.0.0"):
        return f":{port}" if port else host
    return f"{host}:{port}" if port else host


def _plural(n: float, word: str) -> str:
    return f"{n:,.0f} {word}" + ("" if round(n) == 1 else "s")


def _is_proc(p: Any) -> bool:
    return p is not None and not isinstance(p, str) and hasattr(p, "argv")


def _flag(proc: Any, name: str) -> str | None:
    """Value of ``--name`` on a server's command line (``""`` for a bare flag)."""
    f = getattr(proc, "flag", None)
    if callable(f):
        try:
            return f(name)
        except Exception:  # pragma: no cover - a fake without the parser
            pass
    argv = tuple(getattr(proc, "argv", ()) or ())
    val: str | None = None
    for i, tok in enumerate(argv):
        if tok == name:
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            val = "" if nxt.startswith("--") else nxt
        elif tok.startswith(name + "="):
            val = tok[len(name) + 1:]
    return val


def _version_tuple(v: str | None) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", v or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def _hist_count_at_least(delta: Any, limit: float) -> tuple[float, float | None]:
    """(observations in buckets whose lower edge is >= ``limit``, that edge)."""
    if delta is None or not delta.buckets:
        return 0.0, None
    total = delta.buckets[-1][1]
    prev_le = 0.0
    prev_c = 0.0
    for le, c in delta.buckets:
        if prev_le >= limit:
            return max(0.0, total - prev_c), prev_le
        prev_le, prev_c = le, c
    return 0.0, None


_OOM_RE = re.compile(
    r"OutOfMemoryError: CUDA out of memory\.(?: Tried to allocate (?P<amt>[\d.]+ [KMGT]?i?B|\d+ bytes))?"
    r"|CUDA error: out of memory"
)
_OOM_GPU_RE = re.compile(
    r"GPU (?P<gpu>\d+) has a total capac(?:i)?ty of (?P<total>[\d.]+ [KMGT]?i?B) of which (?P<free>[\d.]+ [KMGT]?i?B|\d+ bytes) is free"
)
_OOM_OTHER_RE = re.compile(r"Process (?P<pid>\d+) has (?P<amt>[\d.]+ [KMGT]?i?B) memory in use")
_OOM_SELF_RE = re.compile(r"this process has (?P<amt>[\d.]+ [KMGT]?i?B) memory in use")
_OOM_FRAG_RE = re.compile(r"and (?P<amt>[\d.]+ [KMGT]?i?B|\d+ bytes) is reserved by PyTorch but unallocated")
_FREE_AT_START_RE = re.compile(
    r"Free memory on device \((?P<free>[\d.]+)/(?P<total>[\d.]+) GiB\) on startup is less than desired GPU memory"
    r" utilization \((?P<util>[\d.]+), (?P<req>[\d.]+) GiB\)"
)
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}


def _bytes(s: str | None) -> float | None:
    if not s:
        return None
    m = re.match(r"([\d.]+) ?(\w+)", s)
    if not m:
        return None
    unit = m.group(2)
    mult = 1 if unit == "bytes" else _UNITS.get(unit)
    return float(m.group(1)) * mult if mult else None


# --------------------------------------------------------------------------- state


@dataclass(slots=True)
class _Sample:
    t: float
    running: float | None
    waiting: float | None
    kv: float | None  # percent
    gen: float | None
    prompt: float | None
    preempt: float | None
    done: float | None
    length: float | None
    max_tokens: Any
    prompt_hist: Any
    #: when the two histograms were read (earlier than ``t`` when carried over)
    hist_t: float
    e2e: Any = None


def _sample_of(t: float, m: Any) -> _Sample:
    succ = getattr(m, "request_success_total", None) or {}
    kv = getattr(m, "kv_cache_usage", None)
    return _Sample(
        t=t,
        running=m.running,
        waiting=m.waiting,
        kv=None if kv is None or not math.isfinite(kv) else 100.0 * kv,
        gen=m.generation_tokens_total,
        prompt=m.prompt_tokens_total,
        preempt=m.preemptions_total,
        done=float(sum(succ.values())) if succ else None,
        length=succ.get("length") if succ else None,
        max_tokens=getattr(m, "request_params_max_tokens", None),
        prompt_hist=getattr(m, "request_prompt_tokens", None),
        hist_t=t - (getattr(m, "histograms_age_s", 0.0) or 0.0),
        e2e=getattr(m, "e2e_request_latency_seconds", None),
    )


def _keep_recent(times: list[float], items: list[Any], t: float, item: Any, keep_s: float) -> None:
    """Append ``item`` at ``t``; drop what is older than ``keep_s``, in batches (cheap per call)."""
    times.append(t)
    items.append(item)
    cut = bisect_right(times, t - keep_s)
    if cut > 64 and cut > len(times) // 4:
        del times[:cut]
        del items[:cut]


def _went_back(old: float | None, new: float | None) -> bool:
    return old is not None and new is not None and new < old


class _ServerState:
    """What the diagnoser remembers about one server between ticks."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.samples: list[_Sample] = []
        self.first_t: float | None = None
        self.last_finish_t: float | None = None
        self.last_progress_t: float | None = None
        #: first sample of the current stretch with running > 0
        self.busy_since: float | None = None
        #: the stretch was seen starting from running == 0 (else vtop came in while busy)
        self.busy_known = False
        #: the last sample with running == 0 before the stretch
        self.idle_before: float | None = None
        self.busy_n0 = 0.0
        self.busy_done0 = 0.0
        self.busy_drops = 0.0
        self.kv_high_since: float | None = None
        self.first_up_t: float | None = None
        self.gpu_idx: set[int] = set()
        self.gpu_pids: set[int] = set()
        #: how old the oldest in-flight request is at least (vtop/core/inflight.py)
        self.oldest = OldestInFlight()

    @property
    def last(self) -> _Sample | None:
        return self.samples[-1] if self.samples else None

    def at(self, t: float) -> _Sample | None:
        """The newest sample at or before ``t`` (else the oldest one)."""
        if not self.samples:
            return None
        i = bisect_right(self.times, t)
        return self.samples[max(0, i - 1)]

    def add(self, s: _Sample, kv_thr: float, keep_s: float) -> None:
        p = self.last
        if p is not None and (_went_back(p.gen, s.gen) or _went_back(p.prompt, s.prompt) or _went_back(p.done, s.done)):
            # A restart: nothing before it is comparable.
            gpu_idx, gpu_pids = self.gpu_idx, self.gpu_pids
            self.__init__()  # type: ignore[misc]
            self.gpu_idx, self.gpu_pids = gpu_idx, gpu_pids
            p = None
        if self.first_t is None:
            self.first_t = s.t
        if p is None:
            self.last_finish_t = self.last_finish_t or s.t
            self.last_progress_t = self.last_progress_t or s.t
        else:
            finished = (s.done is not None and p.done is not None and s.done > p.done) or (
                s.running is not None and p.running is not None and s.running < p.running
            )
            if finished:
                self.last_finish_t = s.t
            moved = any(
                a is not None and b is not None and b > a
                for a, b in ((p.gen, s.gen), (p.prompt, s.prompt), (p.done, s.done))
            )
            if moved:
                self.last_progress_t = s.t
        if s.running is not None:
            if s.running > 0:
                if self.busy_since is None:
                    self.busy_since = s.t
                    self.busy_known = p is not None and p.running == 0
                    self.idle_before = p.t if self.busy_known and p is not None else None
                    self.busy_n0 = s.running
                    self.busy_done0 = s.done or 0.0
                    self.busy_drops = 0.0
                elif p is not None and p.running is not None and s.running < p.running:
                    self.busy_drops += p.running - s.running
            else:
                self.busy_since = None
        self.oldest.add(s.t, s.running, s.e2e, s.hist_t, s.done)
        if s.kv is not None:
            if s.kv >= kv_thr:
                if self.kv_high_since is None:
                    self.kv_high_since = s.t
            else:
                self.kv_high_since = None
        _keep_recent(self.times, self.samples, s.t, s, keep_s)


@dataclass(slots=True)
class _GpuPoint:
    t: float
    util: float | None
    sm: float | None
    mem_pct: float | None
    mem_used: float | None
    mem_total: float | None
    procs: tuple[Any, ...] | None


class _GpuState:
    def __init__(self) -> None:
        self.times: list[float] = []
        self.points: list[_GpuPoint] = []
        self.idle_since: float | None = None
        self.idle_util: list[float] = []
        self.idle_sm: list[float] = []
        self.idle_last_t: float | None = None
        self.risk_since: float | None = None

    def at(self, t: float) -> _GpuPoint | None:
        if not self.points:
            return None
        i = bisect_right(self.times, t)
        return self.points[max(0, i - 1)]

    def between(self, a: float, b: float) -> list[_GpuPoint]:
        i = bisect_right(self.times, a)
        j = bisect_right(self.times, b)
        return self.points[i:j]

    def add(self, p: _GpuPoint, keep_s: float) -> None:
        _keep_recent(self.times, self.points, p.t, p, keep_s)


@dataclass(slots=True)
class _OomEvent:
    key: tuple[str, float]
    line: str
    arrival: float
    phase: Phase | None
    startup: bool
    target: str | None
    from_failure: bool
    alert: Alert | None = None


@dataclass
class _Ctx:
    """Everything one tick sees, passed to the rules."""

    now: float
    servers: Mapping[str, Any]
    gpus: Any
    startup: Any
    stall: Any
    requests: Mapping[str, Sequence[Any]]
    logging: Mapping[str, bool]
    log_target: str | None
    #: gpu index -> the server URLs with a GPU process on it
    gpu_owner: dict[int, list[str]] = field(default_factory=dict)
    #: pid -> (server URL, role)
    pid_owner: dict[int, tuple[str, str]] = field(default_factory=dict)


# --------------------------------------------------------------------------- the diagnoser


class Diagnoser:
    """Stateful across ticks (it remembers when running last was 0, when a request last
    finished, when the counters last moved, GPU streaks and memory samples), fed once per tick.

    Not thread-safe: feed it from one thread (the UI tick is fine: a tick is a few
    comparisons per server and per GPU; the rare alert text is built only when a rule fires).
    """

    def __init__(self, thresholds: Thresholds = Thresholds()) -> None:
        self.thresholds = thresholds
        self._servers: dict[str, _ServerState] = {}
        self._gpus: dict[int, _GpuState] = {}
        self._gpu_mono: float | None = None
        self._oom: dict[tuple[str, float], _OomEvent] = {}
        self._log_seen: float | None = None
        self._since: dict[tuple[str, str | None], float] = {}
        self.alerts: list[Alert] = []

    # ------------------------------------------------------------------ feeding

    def update_from(self, now: float, *, servers: Mapping[str, ServerView] | None, gpus: GpuHistory | None,
                    log: Any = None, log_target: str | None = None) -> list[Alert]:
        """:meth:`update` from what the dashboard and ``vtop doctor`` hold: the servers'
        views, the GPU history and a log view (``snapshot``, ``stall``, ``inflight``,
        ``request_logging``, ``recent``; see :class:`vtop.monitor.logwatch.LogView`)
        of the server at ``log_target``."""
        if log is None:
            return self.update(now, servers=servers, gpus=gpus)
        return self.update(
            now, servers=servers, gpus=gpus, startup=log.snapshot, startup_stall=log.stall,
            requests={log_target: log.inflight} if log_target else None,
            request_logging={log_target: log.request_logging} if log_target else None,
            log_lines=log.recent, log_target=log_target,
        )


    def update(
        self,
        now: float,
        *,
        servers: Mapping[str, ServerView] | None = None,
        gpus: GpuHistory | None = None,
        startup: StartupSnapshot | None = None,
        startup_stall: StallInfo | None = None,
        requests: Mapping[str, Sequence[Any]] | None = None,
        request_logging: Mapping[str, bool] | None = None,
        log_lines: Sequence[Any] | None = None,
        log_target: str | None = None,
    ) -> list[Alert]:
        """Take this tick's state and return the alerts, critical first.

        ``now`` is the monotonic time of the tick (the clock the views and GPU
        polls use). ``requests`` maps a server URL to its in-flight requests
        (objects with ``request_id``, ``age_s``, ``age_is_upper_bound``,
        ``max_tokens``, ``no_client_max_tokens``); ``request_logging`` says per
        URL whether the log has request lines at all. ``log_lines`` are the
        startup tracker's recent lines (objects with ``text`` and ``arrival``),
        scanned once each for CUDA OOMs. ``log_target`` is the URL of the server
        the log and ``startup`` belong to (default: the only server, if one).
        Pass every server on every tick: one missing from ``servers`` is forgotten.
        """
        servers = servers or {}
        th = self.thresholds
        if log_target is None and len(servers) == 1:
            log_target = next(iter(servers))
        ctx = _Ctx(now, servers, gpus, startup, startup_stall, requests or {}, request_logging or {}, log_target)

        for url in [u for u in self._servers if u not in servers]:
            del self._servers[url]
        for url, v in servers.items():
            st = self._servers.get(url)
            if st is None:
                st = self._servers[url] = _ServerState()
            m = v.metrics
            t = v.last_ok_mono
            if m is not None and t is not None and (st.last is None or t > st.last.t):
                st.add(_sample_of(t, m), th.kv_saturation_pct, th.history_s)
            if v.state in _LIVE and st.first_up_t is None:
                st.first_up_t = now
            proc = v.process
            if _is_proc(proc):
                for pid in getattr(proc, "gpu_pids", ()) or ():
                    st.gpu_pids.add(int(pid))
                    ctx.pid_owner[int(pid)] = (url, _role_of(proc, int(pid)))
        self._feed_gpus(ctx)
        self._scan_oom(ctx, log_lines)

        alerts: list[Alert] = []
        for url, v in servers.items():
            st = self._servers[url]
            for rule in (self._runaway, self._engine_stall, self._kv_saturation, self._risky_flags):
                a = rule(ctx, url, v, st)
                if a is not None:
                    alerts.append(a)
        for idx in sorted(self._gpus):
            for grule in (self._sm_idle, self._oom_risk):
                a = grule(ctx, idx)
                if a is not None:
                    alerts.append(a)
        alerts.extend(self._startup_rules(ctx))
        alerts.extend(self._oom_alerts(ctx))

        # Keep the first "since" of a condition that goes on (rules may only know it roughly).
        seen: dict[tuple[str, str | None], float] = {}
        out: list[Alert] = []
        for a in alerts:
            if a.since is not None:
                first = self._since.get(a.key)
                since = a.since if first is None else min(first, a.since)
                seen[a.key] = since
                if since != a.since:
                    a = Alert(a.rule, a.severity, a.title, a.evidence, a.fix, a.target, since)
            out.append(a)
        self._since = seen
        out.sort(key=lambda a: (_RANK.get(a.severity, 9), a.since if a.since is not None else now, a.rule, a.target or ""))
        self.alerts = out
        return out

    # ------------------------------------------------------------------ GPUs

    def _feed_gpus(self, ctx: _Ctx) -> None:
        g = ctx.gpus
        if g is None:
            return
        poll = getattr(g, "last_poll", None)
        mono = getattr(poll, "mono", None)
        new = mono is not None and (self._gpu_mono is None or mono > self._gpu_mono)
        for idx, tr in getattr(g, "tracks", {}).items():
            last = tr.last
            if last is None or getattr(last, "lost", False):
                continue
            procs = getattr(last, "procs", None)
            for gp in procs or ():
                owner = ctx.pid_owner.get(int(gp.pid))
                if owner is not None:
                    ctx.gpu_owner.setdefault(idx, [])
                    if owner[0] not in ctx.gpu_owner[idx]:
                        ctx.gpu_owner[idx].append(owner[0])
                    st = self._servers.get(owner[0])
                    if st is not None:
                        st.gpu_idx.add(idx)
            if not new:
                continue
            gs = self._gpus.get(idx)
            if gs is None:
                gs = self._gpus[idx] = _GpuState()
            mt = getattr(last, "mem_total", None)
            mu = getattr(last, "mem_used", None)
            gs.add(
                _GpuPoint(
                    float(mono),  # type: ignore[arg-type]
                    getattr(last, "util_gpu", None),
                    getattr(last, "sm_active", None),
                    100.0 * mu / mt if mu is not None and mt else None,
                    mu,
                    mt,
                    procs,
                ),
                self.thresholds.history_s,
            )
        if new:
            self._gpu_mono = mono

    def _gpus_of(self, url: str | None, ctx: _Ctx) -> list[int]:
        if url is None:
            return []
        st = self._servers.get(url)
        got = {i for i, owners in ctx.gpu_owner.items() if url in owners}
        if st is not None:
            got |= st.gpu_idx
        return sorted(got)

    def _starting_on(self, idx: int, ctx: _Ctx) -> bool:
        """A start is in progress that may use GPU ``idx`` (100 % GPU is normal then)."""
        owners = ctx.gpu_owner.get(idx, [])
        for url, v in ctx.servers.items():
            if v.state == "starting" and (url in owners or not owners):
                return True
        snap = ctx.startup
        if snap is not None and snap.state == "starting":
            tgt = ctx.log_target
            if tgt is None or not owners or tgt in owners or idx in self._gpus_of(tgt, ctx):
                return True
        return False

    def _proc_names(self, procs: Iterable[Any] | None, ctx: _Ctx) -> list[str]:
        out = []
        for gp in sorted(procs or (), key=lambda p: -(p.used_bytes or 0)):
            out.append(self._name_pid(int(gp.pid), ctx, _gib(gp.used_bytes)))
        return out

    def _name_pid(self, pid: int, ctx: _Ctx, extra: str | None = None) -> str:
        """``EngineCore of :8000 (pid 1048, 70.0 GiB)``, or ``pid 4242 (20.0 GiB)`` for a stranger."""
        owner = ctx.pid_owner.get(pid)
        if owner is None:
            for url, st in self._servers.items():
                if pid in st.gpu_pids:
                    owner = (url, "vLLM process")
                    break
        if owner is None:
            return f"pid {pid}" + (f" ({extra})" if extra else "")
        return f"{owner[1]} of {_short(owner[0])} (pid {pid}{', ' + extra if extra else ''})"

    def _gpu_line(self, idx: int, a: float, b: float) -> str | None:
        """``gpu0: GPU-Util 12 %, SM activity 3 %`` averaged over ``(a, b]``."""
        gs = self._gpus.get(idx)
        if gs is None:
            return None
        pts = gs.between(a, b) or ([gs.points[-1]] if gs.points else [])
        utils = [p.util for p in pts if p.util is not None]
        sms = [p.sm for p in pts if p.sm is not None]
        if not utils:
            return None
        s = f"gpu{idx}: GPU-Util {statistics.fmean(utils):.0f} %"
        if sms:
            s += f", SM activity {statistics.fmean(sms):.1f} %"
        return s

    # ------------------------------------------------------------------ rule 1: runaway decode

    def _runaway(self, ctx: _Ctx, url: str, v: Any, st: _ServerState) -> Alert | None:
        """A request that decodes on and on (a client without max_tokens).

        Evidence, either: nothing finished for ``runaway_s`` while tokens flow
        (:meth:`_runaway_quiet`); or, whatever else comes and goes, the oldest in-flight
        request is known from /metrics to have run ``runaway_age_s`` (or three times what
        requests ordinarily take here) while tokens flow (:meth:`_runaway_by_age`).
        Traces: tests/corpus/traces/runaway-alone-no-request-log, runaway-with-short-traffic,
        runaway-streaming-after-others; quiet on normal-bursts-waiting-queue, normal-idle-3min,
        normal-long-generation-max-tokens."""
        return self._runaway_quiet(ctx, url, v, st) or self._runaway_by_age(ctx, url, v, st)

    def _ordinary_e2e_s(self, st: _ServerState) -> float | None:
        """How long requests ordinarily take on this server, over the history: the p95 of
        the end-to-end latency of those that finished, or, by Little's law, the mean number
        running over the rate they finish at (whichever is longer; None when nothing finished)."""
        s = st.last
        old = next((x for x in st.samples if x.done is not None or x.e2e is not None), None)
        if s is None or old is None or old is s or s.t <= old.t:
            return None
        out: list[float] = []
        if s.e2e is not None and old.e2e is not None:
            d = histogram_delta(old.e2e, s.e2e)
            if d is not None and (d.count or 0) >= 5:
                q = histogram_quantile(0.95, d.buckets)
                if q is not None and math.isfinite(q):
                    out.append(q)
        if s.done is not None and old.done is not None and s.done - old.done >= 5:
            rate = (s.done - old.done) / (s.t - old.t)
            runs = [x.running for x in st.samples if x.t >= old.t and x.running is not None]
            if runs and rate > 0:
                out.append(statistics.fmean(runs) / rate)
        return max(out) if out else None

    def _runaway_by_age(self, ctx: _Ctx, url: str, v: Any, st: _ServerState) -> Alert | None:
        th = self.thresholds
        s = st.last
        if s is None or v.state not in _LIVE or not s.running or s.running < 1:
            return None
        age = st.oldest.lower_bound_s
        ordinary = self._ordinary_e2e_s(st)
        # --runaway-threshold below 45 s lowers this too: a flag works the same on both paths
        limit = max(min(th.runaway_age_s, th.runaway_s), th.runaway_age_ordinary_x * ordinary if ordinary else 0.0)
        if age < limit or st.oldest.since is None:
            return None
        r = st.at(s.t - th.rising_s)
        if r is None or r is s or r.gen is None or s.gen is None or not s.gen > r.gen or r.t >= s.t:
            return None  # no tokens flowing: a stall, not a runaway (the stall rule's)
        rate = (s.gen - r.gen) / (s.t - r.t)
        n = s.running
        w_now = s.waiting or 0.0
        mml = v.max_model_len
        short = _short(url)
        named = self._named_request(ctx.requests.get(url))
        ev = [
            f"the oldest in-flight request has run at least {_dur(age)}: {_n(st.oldest.running_then)} running "
            f"{_dur(age)} ago and running has never dropped below what is left of them, while requests that "
            f"finished since (their end-to-end latency says when they began) cannot all be those",
            f"{_plural(n, 'request')} running now, waiting {_n(w_now)}; decoding {rate:,.0f} tok/s",
        ]
        if ordinary is not None:
            ev.append(f"requests that finished here took {_dur(ordinary)} or less (p95)")
        legit = False
        if named is not None:
            rid, rage, upper, mt, no_client = named
            if no_client:
                ev.insert(0, f"request {rid}: the client sent no max_tokens, vLLM filled in {_n(mt)}; running "
                             f"{'at most ' if upper else ''}{_dur(rage or 0)}")
            elif mt is not None:
                legit = True
                ev.insert(0, f"oldest in-flight request {rid}: max_tokens {_n(mt)} set by the client, running "
                             f"{'at most ' if upper else ''}{_dur(rage or 0)}")
        if mml:
            per_req = rate / n if n else rate
            line = f"max_model_len {_n(mml)}: a chat request without max_tokens may generate up to {_n(mml)} - prompt tokens"
            if per_req > 0:
                line += f"; at {per_req:,.0f} tok/s per request that is up to {_dur(mml / per_req)}"
            ev.append(line)
        if legit:
            title = f"Long request on {short}: running at least {_dur(age)} (its client set max_tokens)"
            return Alert("runaway", "info", title, tuple(ev), (
                "It has a cap: it ends by itself. If it should not take this long, lower max_tokens in the client.",
            ), url, st.oldest.since)
        fix = self._runaway_fixes(mml, ctx.logging.get(url) is False)
        title = (f"Runaway decode on {short}: a request running at least {_dur(age)}, {rate:,.0f} tok/s, "
                 "while other requests finish")
        sev = "critical" if w_now > 0 else "warning"
        return Alert("runaway", sev, title, tuple(ev), tuple(fix), url, st.oldest.since)

    @staticmethod
    def _runaway_fixes(mml: int | None, no_request_log: bool) -> list[str]:
        fix = [
            "Set max_tokens (or max_completion_tokens) in every client request; chat requests without it may run "
            f"to max_model_len{f' ({_n(mml)})' if mml else ''}.",
            "Cap it on the server: restart vLLM with --override-generation-config "
            f"'{{\"max_new_tokens\": {_cap_suggestion(mml)}}}' (there is no --max-tokens serve flag).",
            "To stop it now, cancel the client request: vLLM aborts a request when its client disconnects.",
        ]
        if no_request_log:
            fix.append("Start vLLM with --enable-log-requests to let vtop name the request.")
        return fix

    def _runaway_quiet(self, ctx: _Ctx, url: str, v: Any, st: _ServerState) -> Alert | None:
        th = self.thresholds
        s = st.last
        if s is None or v.state not in _LIVE or not s.running or s.running < 1:
            return None
        if st.last_finish_t is None or st.busy_since is None:
            return None
        # Requests have run without one finishing since then (idle time does not count).
        since = max(st.last_finish_t, st.busy_since)
        now = ctx.now
        named = self._named_request(ctx.requests.get(url))
        if now - since < th.runaway_s:
            # The metrics history is too short (vtop doctor's 15 s window, or vtop just
            # started): the request log can still say how long the request has run.
            # Only a request the client sent without max_tokens counts, and only while
            # nothing finished in what vtop saw.
            if named is None or not named[4] or named[1] is None or named[1] < th.runaway_s:
                return None
            if st.last_finish_t > st.busy_since:
                return None
            since = min(since, now - named[1])
        a = st.at(since)
        r = st.at(s.t - th.rising_s)
        if r is s and len(st.samples) > 1:
            r = st.samples[0]
        if a is None or r is None or s.gen is None or a.gen is None or r.gen is None:
            return None
        if r is s and len(st.samples) > 1:
            r = st.samples[-2]
        if r.gen is None or not s.gen > r.gen or r.t >= s.t:
            return None
        w_now, w_then = s.waiting or 0.0, a.waiting or 0.0
        if not (w_now == 0 or w_now >= w_then):
            return None
        # The decode rate now (the last ``rising_s``), and the tokens made since it began.
        rate = (s.gen - r.gen) / (s.t - r.t)
        base = st.at(st.idle_before) if st.busy_known and st.idle_before is not None and st.idle_before >= st.last_finish_t else a
        made = s.gen - (base.gen if base is not None and base.gen is not None else a.gen)
        n = s.running
        per_req = rate / n if n else rate
        mml = v.max_model_len
        short = _short(url)

        ev: list[str] = []
        # How old the oldest running request is.
        age: float | None = None
        age_txt = ""
        if named is not None:
            rid, rage, upper, mt, no_client = named
            if rage is not None:
                age = rage
            who = f"request {rid}"
            if no_client:
                ev.append(
                    f"{who}: the client sent no max_tokens, vLLM filled in {_n(mt)}; running "
                    f"{'at most ' if upper else ''}{_dur(rage or 0)}"
                )
            else:
                ev.append(f"oldest in-flight {who}: max_tokens {_n(mt)}, running {'at most ' if upper else ''}{_dur(rage or 0)}")
        if st.busy_since is not None:
            finished = max((s.done or 0.0) - st.busy_done0, st.busy_drops)
            if finished < st.busy_n0:
                est = now - st.busy_since
                if st.busy_known:
                    age_txt = (
                        f"oldest running request started about {_dur(est)} ago: running went 0 -> {_n(st.busy_n0)} then "
                        f"and never back to 0, with {_n(finished)} of those finished since"
                    )
                else:
                    age_txt = f"oldest running request: at least {_dur(est)} (running > 0 since vtop started watching)"
                if age is None:
                    age = est
        ev.append(
            f"{_plural(n, 'request')} running, none finished for {_dur(now - since)}; waiting {_n(w_now)}"
        )
        if age_txt:
            ev.append(age_txt)
        ev.append(f"decoding {rate:,.0f} tok/s now; {_n(made)} tokens generated since these requests started")
        if s.kv is not None and a.kv is not None and s.kv > a.kv:
            ev.append(f"KV cache {a.kv:.2f} % -> {s.kv:.2f} % and climbing (the sequences keep growing)")
        if mml:
            line = f"max_model_len {_n(mml)}: a chat request without max_tokens may generate up to {_n(mml)} - prompt tokens"
            if per_req > 0:
                line += f"; at {per_req:,.0f} tok/s per request that is up to {_dur(mml / per_req)}"
            ev.append(line)
        # Histogram of resolved max_tokens over the remembered history: values near
        # max_model_len betray clients that omit it (§4: the metric records the resolved value).
        old = next((x for x in st.samples if x.max_tokens is not None), None)
        if mml and old is not None and s.max_tokens is not None and old is not s:
            d = histogram_delta(old.max_tokens, s.max_tokens)
            cnt, edge = _hist_count_at_least(d, th.runaway_near_len_frac * mml)
            if cnt > 0 and d is not None:
                exact = ""
                if d.count == 1 and d.sum is not None:
                    exact = f" (max_tokens {_n(d.sum)})"
                line = (
                    f"{_plural(cnt, 'request')} finished in the last {_dur(s.hist_t - old.hist_t)} with max_tokens above "
                    f"{_n(edge)}{exact}, near max_model_len {_n(mml)}: clients omitting max_tokens"
                )
                if s.length is not None and old.length is not None and s.length > old.length:
                    line += f"; {_n(s.length - old.length)} finished with reason 'length'"
                ev.append(line)
        for idx in self._gpus_of(url, ctx):
            gl = self._gpu_line(idx, since, now)
            if gl:
                ev.append(gl + " (supporting only: one decode stream keeps a big GPU far from 100 %)")

        fix = self._runaway_fixes(mml, ctx.logging.get(url) is False)
        dur_txt = f"running {_dur(age)}" if age is not None else f"nothing finished for {_dur(now - since)}"
        title = f"Runaway decode on {short}: {_plural(n, 'request')} {dur_txt}, {rate:,.0f} tok/s, nothing finished"
        if age is None:
            title = f"Runaway decode on {short}: {_plural(n, 'request')} running, {rate:,.0f} tok/s, {dur_txt}"
        sev = "critical" if w_now > 0 else "warning"
        return Alert("runaway", sev, title, tuple(ev), tuple(fix), url, since)

    @staticmethod
    def _named_request(reqs: Sequence[Any] | None) -> tuple[str, float | None, bool, Any, bool] | None:
        """(id, age, age is an upper bound, max_tokens, client omitted it) of the request to name."""
        if not reqs:
            return None

        def age(r: Any) -> float:
            a = getattr(r, "age_s", None)
            return float(a) if isinstance(a, (int, float)) else -1.0

        flagged = [r for r in reqs if getattr(r, "no_client_max_tokens", False)]
        pool = flagged or list(reqs)
        r = max(pool, key=age)
        a = getattr(r, "age_s", None)
        return (
            str(getattr(r, "request_id", "?")),
            float(a) if isinstance(a, (int, float)) else None,
            bool(getattr(r, "age_is_upper_bound", False)),
            getattr(r, "max_tokens", None),
            bool(flagged),
        )

    # ------------------------------------------------------------------ rule 2: engine stall

    def _engine_stall(self, ctx: _Ctx, url: str, v: Any, st: _ServerState) -> Alert | None:
        th = self.thresholds
        s = st.last
        if s is None or v.state not in _LIVE or not s.running or s.running <= 0:
            return None
        if st.last_progress_t is None or st.busy_since is None:
            return None
        since = max(st.last_progress_t, st.busy_since)
        now = ctx.now
        if now - since < th.engine_stall_s:
            return None
        short = _short(url)
        ev = [
            f"running {_n(s.running)}, waiting {_n(s.waiting)} for {_dur(now - since)} with no new token and no "
            "request finished",
            f"generation tokens stuck at {_n(s.gen)}, prompt tokens at {_n(s.prompt)}",
        ]
        if v.health is not None or v.latency_s is not None:
            lat = f", /metrics in {v.latency_s * 1000:.0f} ms" if v.latency_s is not None else ""
            ev.append(f"the server still answers (/health {v.health if v.health is not None else '?'}{lat}): "
                      "the API server is alive, the engine is not moving")
        for idx in self._gpus_of(url, ctx):
            gl = self._gpu_line(idx, since, now)
            if gl:
                gs = self._gpus[idx]
                pts = gs.between(since, now)
                utils = [p.util for p in pts if p.util is not None]
                sms = [p.sm for p in pts if p.sm is not None]
                mu = statistics.fmean(utils) if utils else None
                ms = statistics.fmean(sms) if sms else None
                if mu is not None and mu < 5:
                    gl += ": the engine launches no GPU work (a Python-side hang, a deadlock, or a stopped process)"
                elif mu is not None and mu >= th.sm_idle_util and ms is not None and ms < th.sm_idle_active:
                    gl += ": busy with idle SMs, the signature of a collective (NCCL) waiting for a peer"
                ev.append(gl)
        fix = [
            "Press d for a py-spy dump of the EngineCore (the workers for TP>1): it shows where the engine waits.",
            "Look in the log for 'No available shared memory broadcast block found in 60 seconds' (a worker is stuck).",
            "If it does not move again, restart the server: /health stays 200 while the engine is frozen, so a health "
            "check alone will not restart it.",
        ]
        title = f"Engine stalled on {short}: {_n(s.running)} running, no token for {_dur(now - since)}"
        return Alert("engine_stall", "critical", title, tuple(ev), tuple(fix), url, since)

    # ------------------------------------------------------------------ rule 5: KV saturation

    def _kv_high_window(self, st: _ServerState) -> float | None:
        """When KV usage began to sit high, judged over the last ``kv_window_s``: at or above
        ``kv_saturation_pct`` most of the time (``kv_window_frac``), the median within 5 points of
        it. Real trace kv-saturation-preemptions: 96-98 % with a dip to 83-94 % every few
        scrapes, 15 s in a row at most."""
        th = self.thresholds
        s = st.last
        if s is None:
            return None
        pts = [x for x in st.samples[-400:] if x.t >= s.t - th.kv_window_s and x.kv is not None]
        if len(pts) < 5 or s.t - pts[0].t < th.kv_window_s * 0.8:
            return None
        high = [x for x in pts if x.kv is not None and x.kv >= th.kv_saturation_pct]
        if len(high) < th.kv_window_frac * len(pts):
            return None
        if statistics.median(x.kv for x in pts if x.kv is not None) < th.kv_saturation_pct - 5.0:
            return None
        return high[0].t

    def _kv_saturation(self, ctx: _Ctx, url: str, v: Any, st: _ServerState) -> Alert | None:
        """KV cache full with preemptions or a growing queue: usage at or above the threshold
        for ``kv_saturation_s`` in a row, or most of a ``kv_window_s`` window (it dips as
        requests finish). Traces: kv-saturation-many-seqs, kv-saturation-preemptions; quiet on
        normal-bursts-long-queue and normal-bursts-waiting-queue."""
        th = self.thresholds
        s = st.last
        if s is None or v.state not in _LIVE or s.kv is None:
            return None
        now = ctx.now
        since = st.kv_high_since if st.kv_high_since is not None and now - st.kv_high_since >= th.kv_saturation_s else None
        if since is None:
            since = self._kv_high_window(st)
        if since is None:
            return None
        w0 = st.at(max(since, s.t - th.preempt_window_s)) or s
        win = s.t - w0.t
        pre = (s.preempt - w0.preempt) if s.preempt is not None and w0.preempt is not None else 0.0
        pre_ps = pre / win if win > 0 else 0.0
        wait_now, wait_then = s.waiting or 0.0, w0.waiting or 0.0
        growing = wait_now > 0 and wait_now > wait_then
        if not (pre > 0 or growing):
            return None
        short = _short(url)
        ev = [
            f"KV cache at {s.kv:.1f} % (>= {th.kv_saturation_pct:.0f} % most of the time) for {_dur(now - since)}, "
            f"running {_n(s.running)}",
            f"{_plural(pre, 'preemption')} in the last {_dur(win)} ({pre_ps:.2f}/s): preempted requests lose their KV "
            "cache and are recomputed",
            f"waiting {_n(wait_then)} -> {_n(wait_now)}",
        ]
        proc = v.process
        seqs = getattr(proc, "max_num_seqs", None) if _is_proc(proc) else None
        target = max(1, int((s.running or 0) * 0.75)) if s.running else None
        fix = [
            "Lower --max-num-seqs" + (f" (now {seqs})" if seqs else "")
            + (f", e.g. to {target}, " if target else " ")
            + "so the running sequences fit in the KV cache.",
            "Give the KV cache more room: raise --gpu-memory-utilization if the GPU has headroom, --kv-cache-dtype fp8, "
            "or more GPUs with --tensor-parallel-size.",
            "Limit concurrency upstream and set max_tokens in clients so sequences stay short.",
        ]
        sev = "critical" if pre_ps >= th.preempt_storm_ps and growing else "warning"
        what = "preemption storm" if pre > 0 else "queue growing"
        title = f"KV cache full on {short}: {s.kv:.0f} % for {_dur(now - since)}, {what}"
        if pre > 0:
            title += f" ({_n(pre)} in {_dur(win)})"
        return Alert("kv_saturation", sev, title, tuple(ev), tuple(fix), url, since)

    # ------------------------------------------------------------------ rule 6: GPU busy, SMs idle

    def _sm_idle(self, ctx: _Ctx, idx: int) -> Alert | None:
        th = self.thresholds
        gs = self._gpus[idx]
        p = gs.points[-1] if gs.points else None
        if p is None:
            return None
        if self._starting_on(idx, ctx):
            gs.idle_since = None
            return None
        if p.t != gs.idle_last_t:
            gs.idle_last_t = p.t
            busy = p.util is not None and p.util >= th.sm_idle_util
            if busy and p.sm is not None and p.sm < th.sm_idle_active:
                if gs.idle_since is None:
                    gs.idle_since, gs.idle_util, gs.idle_sm = p.t, [], []
                gs.idle_util.append(p.util)  # type: ignore[arg-type]
                gs.idle_sm.append(p.sm)
                if len(gs.idle_util) > 4096:
                    del gs.idle_util[:2048], gs.idle_sm[:2048]
            elif busy and p.sm is None:
                pass  # no GPM reading this time: neither starts nor breaks a streak
            else:
                gs.idle_since = None
        if gs.idle_since is None or ctx.now - gs.idle_since < th.sm_idle_s:
            return None
        since = gs.idle_since
        mu = statistics.fmean(gs.idle_util)
        ms = statistics.fmean(gs.idle_sm)
        ev = [
            f"GPU-Util {mu:.0f} % but SM activity {ms:.1f} % for {_dur(ctx.now - since)} "
            f"(>= {th.sm_idle_util:.0f} % vs < {th.sm_idle_active:.0f} %)",
            "GPU-Util counts the time any kernel runs; GPM SM activity says how many SMs work: the GPU is launch-bound "
            "(many tiny kernels) or waiting inside a kernel",
        ]
        names = self._proc_names(p.procs, ctx)
        if names:
            ev.append("processes: " + ", ".join(names))
        owners = ctx.gpu_owner.get(idx, [])
        eager = False
        for url in owners:
            v = ctx.servers.get(url)
            if v is not None and _is_proc(v.process) and _flag(v.process, "--enforce-eager") is not None:
                eager = True
                ev.append(f"{_short(url)} runs with --enforce-eager: no CUDA graphs, one launch per kernel")
            st = self._servers.get(url)
            if st is not None and st.last is not None and st.last.running:
                r0 = st.at(ctx.now - 30.0)
                if r0 is not None and r0.gen is not None and st.last.gen is not None and st.last.gen <= r0.gen:
                    ev.append(f"{_short(url)} has {_n(st.last.running)} running but no token in 30 s")
        fix = []
        if owners:
            if eager:
                fix.append("Drop --enforce-eager so vLLM captures CUDA graphs (far fewer kernel launches).")
            fix.append("Batch more work per step: more concurrent requests, or a higher --max-num-seqs.")
        fix.append(
            "If tokens/s is flat too, press d for a py-spy dump: a tensor-parallel worker stuck in an NCCL collective "
            "shows 100 % GPU-Util with idle SMs."
        )
        if not owners:
            fix.append("Otherwise check the process on this GPU for a spinning kernel or tiny batch sizes.")
        title = f"gpu{idx} busy but SMs idle: GPU-Util {mu:.0f} %, SM activity {ms:.1f} % for {_dur(ctx.now - since)}"
        return Alert("sm_idle", "warning", title, tuple(ev), tuple(fix), f"gpu{idx}", since)

    # ------------------------------------------------------------------ rule 4b: memory climbing towards full

    def _oom_risk(self, ctx: _Ctx, idx: int) -> Alert | None:
        th = self.thresholds
        gs = self._gpus[idx]
        p = gs.points[-1] if gs.points else None
        if p is None or p.mem_pct is None or p.mem_pct < th.oom_risk_pct or self._starting_on(idx, ctx):
            gs.risk_since = None
            return None
        t0 = p.t - th.oom_risk_window_s
        if not gs.times or gs.times[0] > t0 + 0.1 * th.oom_risk_window_s:
            return None  # not enough history yet
        pts = [q for q in gs.between(t0 - 1e-9, p.t) if q.mem_pct is not None]
        if len(pts) < 4:
            return None
        rise = p.mem_pct - pts[0].mem_pct  # type: ignore[operator]
        steps = [b.mem_pct - a.mem_pct for a, b in zip(pts, pts[1:])]  # type: ignore[operator]
        ups = sum(1 for d in steps if d > 0)
        downs = sum(1 for d in steps if d < 0)
        if rise < th.oom_risk_rise_pct or ups < 3 or downs > ups // 4:
            gs.risk_since = None
            return None
        if gs.risk_since is None:
            gs.risk_since = pts[0].t
        span = p.t - pts[0].t
        slope = rise / span if span > 0 else 0.0
        eta = (100.0 - p.mem_pct) / slope if slope > 0 else None
        ev = [
            f"gpu{idx} memory {p.mem_pct:.1f} % ({_gib(p.mem_used)} of {_gib(p.mem_total)}), up {rise:.1f} points in "
            f"{_dur(span)}" + (f": full in about {_dur(eta)} at this rate" if eta is not None else ""),
        ]
        before = {int(q.pid): q.used_bytes or 0 for q in (pts[0].procs or ())}
        grow = sorted(
            ((int(q.pid), (q.used_bytes or 0) - before.get(int(q.pid), 0)) for q in (p.procs or ())),
            key=lambda x: -x[1],
        )
        if grow and grow[0][1] > 0:
            ev.append(f"growing most: {self._name_pid(grow[0][0], ctx)}, +{_gib(grow[0][1])} in {_dur(span)}")
        fix = [
            "Find what grows (the process above) before it hits an out-of-memory error; for vLLM, set "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and lower --gpu-memory-utilization.",
            "Keep other jobs off a GPU that vLLM serves from: vLLM sized its KV cache for the memory it saw at start.",
        ]
        title = f"gpu{idx} memory climbing towards full: {p.mem_pct:.1f} %, +{rise:.1f} points in {_dur(span)}"
        return Alert("oom_risk", "warning", title, tuple(ev), tuple(fix), f"gpu{idx}", gs.risk_since)

    # ------------------------------------------------------------------ rule 7: risky launch flags

    def _risky_flags(self, ctx: _Ctx, url: str, v: Any, st: _ServerState) -> Alert | None:
        th = self.thresholds
        proc = v.process
        if not _is_proc(proc):
            return None
        items: list[tuple[str, str, str, str]] = []  # severity, headline, evidence, fix
        mml = v.max_model_len or getattr(proc, "max_model_len", None)
        facts = ctx.startup.facts if ctx.startup is not None and ctx.log_target == url else None
        if mml is None and facts is not None:
            mml = facts.max_model_len

        # A long context with no generation cap: one chat client without max_tokens runs to max_model_len.
        ogc = _flag(proc, "--override-generation-config")
        gen_dir = _flag(proc, "--generation-config")
        capped = bool(ogc) and "max_new_tokens" in _json_keys(ogc)
        unknown = gen_dir not in (None, "", "auto", "vllm")
        if mml and mml >= th.long_context_len and not capped and not unknown:
            items.append((
                "info",
                f"no generation cap with max_model_len {_n(mml)}",
                f"max_model_len {_n(mml)} and no --override-generation-config max_new_tokens: a chat request without "
                f"max_tokens may generate up to {_n(mml)} - prompt tokens",
                "Cap generation: --override-generation-config "
                f"'{{\"max_new_tokens\": {_cap_suggestion(mml)}}}' (a hard cap since 0.20, and the default for "
                "requests that omit max_tokens).",
            ))
        mm = _flag(proc, "--mm-processor-cache-gb")
        if mm is not None and _float(mm) == 0.0:
            items.append((
                "info",
                "multimodal processor cache off (--mm-processor-cache-gb 0)",
                "--mm-processor-cache-gb 0 turns the multimodal processor cache off: every image or video is "
                "preprocessed again on the CPU, even when clients resend the same one",
                "Drop --mm-processor-cache-gb 0 (default 4 GiB) or use a small cache such as --mm-processor-cache-gb 1 "
                "if host RAM was the reason (it is held once per API server and per engine core).",
            ))
        seqs = getattr(proc, "max_num_seqs", None)
        if seqs and facts is not None and facts.max_concurrency:
            ratio = seqs / facts.max_concurrency
            if ratio >= th.risky_seqs_ratio:
                per = (facts.kv_cache_tokens / seqs) if facts.kv_cache_tokens else None
                items.append((
                    "info",
                    f"--max-num-seqs {seqs} is {ratio:.0f}x the KV cache's concurrency",
                    f"--max-num-seqs {seqs}, but the KV cache holds {facts.max_concurrency:g} requests of "
                    f"{_n(facts.max_concurrency_len)} tokens"
                    + (f" ({_n(facts.kv_cache_tokens)} tokens: {_n(per)} per sequence when all run)" if per else "")
                    + "; long requests will preempt each other",
                    f"Lower --max-num-seqs towards {max(1, int(facts.max_concurrency * 2))}, or give the KV cache more "
                    "memory (--gpu-memory-utilization, --kv-cache-dtype fp8).",
                ))
        # --gpu-memory-utilization next to the other processes on the same GPU.
        util = _float(_flag(proc, "--gpu-memory-utilization"))
        if util is None:
            util = getattr(proc, "gpu_memory_utilization", None)
        default = util is None
        if util is None:
            ver = _version_tuple(v.version)
            util = 0.92 if ver is not None and ver >= (0, 20) else 0.9
        mine = set(getattr(proc, "gpu_pids", ()) or ()) | st.gpu_pids
        for idx in self._gpus_of(url, ctx):
            gs = self._gpus.get(idx)
            p = gs.points[-1] if gs is not None and gs.points else None
            if p is None or not p.mem_total or p.procs is None:
                continue
            others = [q for q in p.procs if int(q.pid) not in mine and q.used_bytes]
            used = float(sum(q.used_bytes for q in others))
            if used > 0 and used + util * p.mem_total > p.mem_total:
                room = max(0.0, (p.mem_total - used) / p.mem_total - 0.02)
                items.append((
                    "warning",
                    f"--gpu-memory-utilization {util:g} leaves no room on gpu{idx}",
                    f"gpu{idx}: other processes hold {_gib(used)} ({', '.join(self._proc_names(others, ctx))}); "
                    f"--gpu-memory-utilization {util:g}{' (default)' if default else ''} asks for "
                    f"{_gib(util * p.mem_total)} of {_gib(p.mem_total)}: together {_gib(used + util * p.mem_total)}",
                    f"Lower --gpu-memory-utilization to {math.floor(room * 100) / 100:.2f} or less (what is left next "
                    "to the other processes), or move them to another GPU; as it is, a restart of this server or the "
                    "other process's next allocation fails.",
                ))
        if not items:
            return None
        items.sort(key=lambda x: _RANK[x[0]])
        sev = items[0][0]
        head = items[0][1] + (f" (+{len(items) - 1} more)" if len(items) > 1 else "")
        since = st.first_t if st.first_t is not None else ctx.now
        return Alert(
            "risky_flags", sev, f"Risky launch flags on {_short(url)}: {head}",
            tuple(i[2] for i in items), tuple(i[3] for i in items), url, since,
        )

    # ------------------------------------------------------------------ rule 3: startup stall / failure

    def _startup_rules(self, ctx: _Ctx) -> list[Alert]:
        out: list[Alert] = []
        snap = ctx.startup
        tgt = ctx.log_target
        short = _short(tgt)
        stall = ctx.stall
        if stall is not None and (snap is None or snap.state == "starting"):
            since = ctx.now - stall.silent_s
            ev = [f"no new log line and no progress for {_dur(stall.silent_s)} in {stall.label}"]
            if snap is not None and stall.phase is not None:
                pv = snap.phase(stall.phase)
                if pv is not None and pv.progress:
                    ev.append("progress: " + ", ".join(f"{p.label} {p.n}/{p.total}" for p in pv.progress))
            if stall.last_line:
                ev.append(f"last line: {stall.last_line.strip()[:200]}")
            if snap is not None and snap.facts.shm_broadcast_waits:
                ev.append(
                    f"{snap.facts.shm_broadcast_waits} 'No available shared memory broadcast block' message(s): "
                    "a worker is not answering"
                )
            idxs = self._gpus_of(tgt, ctx) or sorted(self._gpus)
            busy_sm: list[float] = []
            for idx in idxs:
                gl = self._gpu_line(idx, since, ctx.now)
                if gl:
                    ev.append(gl + " during the silence")
                    busy_sm += [p.sm for p in self._gpus[idx].between(since, ctx.now) if p.sm is not None]
            working = bool(busy_sm) and statistics.fmean(busy_sm) >= 50.0
            if working:
                ev.append("the SMs are busy: the phase may just be slow (a big model's first torch.compile or profiling)")
            fix = []
            if stall.hint:
                fix.append(stall.hint[0].upper() + stall.hint[1:] + ".")
            fix.append("Press d for a py-spy dump of the EngineCore (the workers for TP>1) to see where it waits.")
            title = f"Startup of {short} stalled in {stall.label}: no new log line for {_dur(stall.silent_s)}"
            out.append(Alert("startup_stall", "info" if working else "warning", title, tuple(ev), tuple(fix), tgt, since))
        if snap is not None and snap.state == "failed" and snap.failure is not None:
            f = snap.failure
            if not _is_oom_failure(f):
                runtime = f.phase is Phase.READY
                where = f" during {f.phase.label}" if f.phase is not None and not runtime else ""
                ev = [f"{f.message}{where}", f"telling line: {f.line.strip()[:300]}"]
                if f.kind in ("kv_no_memory", "max_model_len"):
                    ev += self._other_procs_lines(tgt, ctx, f.arrival)
                if runtime:
                    title = f"vLLM engine on {short} died: {f.message}"
                    out.append(Alert("engine_died", "critical", title, tuple(ev), (f.fix,), tgt, f.arrival))
                else:
                    title = f"vLLM on {short} failed to start{where}: {f.message}"
                    out.append(Alert("startup_failure", "critical", title, tuple(ev), (f.fix,), tgt, f.arrival))
        return out

    def _other_procs_lines(self, url: str | None, ctx: _Ctx, at: float) -> list[str]:
        """Evidence lines naming the processes that are not this server's on its GPUs (at time ``at``)."""
        st = self._servers.get(url) if url else None
        mine = set(st.gpu_pids) if st is not None else set()
        idxs = self._gpus_of(url, ctx) or sorted(self._gpus)
        out = []
        for idx in idxs:
            gs = self._gpus.get(idx)
            p = gs.at(at) if gs is not None else None
            if p is None or p.procs is None:
                continue
            others = [q for q in p.procs if int(q.pid) not in mine and q.used_bytes]
            if others:
                used = float(sum(q.used_bytes for q in others))
                out.append(
                    f"gpu{idx}: other processes hold {_gib(used)} of {_gib(p.mem_total)}: "
                    + ", ".join(self._proc_names(others, ctx))
                )
        return out

    # ------------------------------------------------------------------ rule 4: CUDA OOM

    def _scan_oom(self, ctx: _Ctx, log_lines: Sequence[Any] | None) -> None:
        th = self.thresholds
        snap = ctx.startup
        starting = snap is not None and snap.state == "starting"
        if snap is not None and snap.state == "failed" and snap.failure is not None and _is_oom_failure(snap.failure):
            f = snap.failure
            key = ("failure", f.arrival)
            # The same OOM already seen as a log line (before the engine's death line came) is one event.
            dup = any(not e.from_failure and abs(e.arrival - f.arrival) <= 5.0 for e in self._oom.values())
            if key not in self._oom and not dup:
                self._oom[key] = _OomEvent(
                    key, f.line, f.arrival, f.phase, f.phase is not Phase.READY, ctx.log_target, True
                )
        if log_lines:
            newest = self._log_seen
            fresh: list[Any] = []
            for ln in reversed(log_lines):
                arr = getattr(ln, "arrival", None)
                if arr is None or (self._log_seen is not None and arr <= self._log_seen):
                    break
                fresh.append(ln)
                newest = arr if newest is None else max(newest, arr)
            self._log_seen = newest
            # Lines read at attach carry the attach time as arrival: judge their age by the log's own clock.
            stamps = [t for t in (getattr(ln, "t", None) for ln in fresh) if isinstance(t, (int, float))]
            log_now = max(stamps) if stamps else None
            for ln in reversed(fresh):
                text = getattr(ln, "text", "") or ""
                if "out of memory" not in text or not _OOM_RE.search(text):
                    continue
                lt = getattr(ln, "t", None)
                if log_now is not None and isinstance(lt, (int, float)) and log_now - lt > th.oom_hold_s:
                    continue
                key = ("log", float(ln.arrival))
                # One event per burst: a traceback repeats the line (logger and raw stderr).
                if any(abs(e.arrival - ln.arrival) <= 5.0 for e in self._oom.values()):
                    continue
                self._oom[key] = _OomEvent(
                    key, text, float(ln.arrival), snap.current if snap is not None else None, starting,
                    ctx.log_target, False,
                )
        # Forget old ones (a failed start stays while the tracker still says failed).
        failed_key = (
            ("failure", snap.failure.arrival) if snap is not None and snap.state == "failed" and snap.failure else None
        )
        for k in [k for k, e in self._oom.items() if k != failed_key and ctx.now - e.arrival > th.oom_hold_s]:
            del self._oom[k]
        if failed_key is None:
            for k in [k for k, e in self._oom.items() if e.from_failure]:
                del self._oom[k]

    def _oom_alerts(self, ctx: _Ctx) -> list[Alert]:
        out: dict[tuple[str, str | None], Alert] = {}
        for e in sorted(self._oom.values(), key=lambda e: e.arrival):
            if e.alert is None:
                e.alert = self._classify_oom(e, ctx)
            out[e.alert.key] = e.alert  # the newest of a kind per target
        return list(out.values())

    def _classify_oom(self, e: _OomEvent, ctx: _Ctx) -> Alert:
        th = self.thresholds
        url = e.target
        short = _short(url)
        v = ctx.servers.get(url) if url else None
        st = self._servers.get(url) if url else None
        proc = v.process if v is not None and _is_proc(v.process) else None
        line = e.line.strip()
        m = _OOM_RE.search(line)
        amt = m.group("amt") if m and m.groupdict().get("amt") else None
        ev: list[str] = []
        detail = f"CUDA out of memory{f' (tried to allocate {amt})' if amt else ''}"
        gm = _OOM_GPU_RE.search(line)
        if gm:
            detail += f"; GPU {gm.group('gpu')} had {gm.group('free')} free of {gm.group('total')}"
        fs = _FREE_AT_START_RE.search(line)
        if fs:
            detail = (
                f"only {fs.group('free')} of {fs.group('total')} GiB free at start, but --gpu-memory-utilization "
                f"{fs.group('util')} asks for {fs.group('req')} GiB"
            )
        ev.append(detail)
        ev.append(f"line: {line[:300]}")
        fm = _OOM_FRAG_RE.search(line)
        frag = _bytes(fm.group("amt")) if fm else None
        need = _bytes(amt)
        torch_others = [(int(mm.group("pid")), mm.group("amt")) for mm in _OOM_OTHER_RE.finditer(line)]

        if e.startup:
            phase = e.phase
            where = f" during {phase.label}" if phase is not None else " at startup"
            ev[0] = ev[0] + where
            other_lines = self._other_procs_lines(url, ctx, e.arrival)
            ev += other_lines
            for pid, a in torch_others:
                ev.append(f"torch saw {self._name_pid(pid, ctx)} holding {a} on that GPU")
            util = _float(_flag(proc, "--gpu-memory-utilization")) if proc is not None else None
            mml = (getattr(proc, "max_model_len", None) if proc is not None else None) or (
                ctx.startup.facts.max_model_len if ctx.startup is not None else None
            )
            fix: list[str] = []
            if other_lines or torch_others or fs:
                fix.append(
                    "Another process holds memory on this GPU: stop it or move it, or lower --gpu-memory-utilization"
                    + (f" (now {util:g})" if util else "")
                    + " to what is free next to it."
                )
            if phase is Phase.WEIGHTS:
                fix.append(
                    "The weights do not fit: use a quantized model or spread it with --tensor-parallel-size."
                )
            elif phase is Phase.CUDA_GRAPHS:
                fix.append(
                    "CUDA graph capture ran out: --enforce-eager skips it, or lower --max-num-seqs (fewer graph sizes)."
                )
            fix.append(
                "Lower --max-model-len" + (f" (now {_n(mml)})" if mml else "") + " or --max-num-batched-tokens so "
                "the profiling run and the KV cache need less, or lower --gpu-memory-utilization if the GPU is shared."
            )
            title = f"CUDA out of memory starting {short}{where}" + (f": tried to allocate {amt}" if amt else "")
            return Alert("oom_startup", "critical", title, tuple(ev), tuple(fix), url, e.arrival)

        # Runtime: look at the window before it.
        t1 = e.arrival
        t0 = t1 - th.transient_window_s
        mml = v.max_model_len if v is not None else None
        kv_full = False
        pre = 0.0
        long_prompts = 0.0
        edge = None
        if st is not None and st.samples:
            win = [s for s in st.samples if t0 <= s.t <= t1] or [st.at(t1)]  # type: ignore[list-item]
            kvs = [s.kv for s in win if s is not None and s.kv is not None]
            kv_full = bool(kvs) and max(kvs) >= th.kv_saturation_pct
            a, b = st.at(t1 - max(th.preempt_window_s, th.transient_window_s)), st.at(t1)
            if a is not None and b is not None and a.preempt is not None and b.preempt is not None:
                pre = b.preempt - a.preempt
            a2 = st.at(t0)
            if mml and a2 is not None and b is not None and a2.prompt_hist is not None and b.prompt_hist is not None:
                d = histogram_delta(a2.prompt_hist, b.prompt_hist)
                long_prompts, edge = _hist_count_at_least(d, th.long_prompt_frac * mml)
            if kvs:
                ev.append(f"KV cache peaked at {max(kvs):.1f} % in the {_dur(th.transient_window_s)} before")
        spike = None
        for idx in self._gpus_of(url, ctx) or sorted(self._gpus):
            gs = self._gpus.get(idx)
            if gs is None:
                continue
            before = [p.mem_pct for p in gs.between(t1 - 300.0, t0) if p.mem_pct is not None]
            peak_pts = [p.mem_pct for p in gs.between(t0, t1) if p.mem_pct is not None]
            tr = getattr(ctx.gpus, "tracks", {}).get(idx) if ctx.gpus is not None else None
            if tr is not None:
                cell = tr.series["mem"].buckets(t1, 1, th.transient_window_s)
                if cell and cell[0] is not None:
                    peak_pts.append(cell[0])
            if before and peak_pts:
                base = statistics.median(before)
                peak = max(peak_pts)
                if peak - base >= th.mem_spike_pct:
                    spike = (idx, base, peak)
                    ev.append(f"gpu{idx} memory jumped from {base:.1f} % to {peak:.1f} % in the {_dur(th.transient_window_s)} before")
        if long_prompts > 0:
            ev.append(
                f"{_plural(long_prompts, 'request')} with prompts above {_n(edge)} tokens (max_model_len {_n(mml)}) "
                f"in the {_dur(th.transient_window_s)} before"
            )
        uptime = None
        if proc is not None and v is not None and v.last_ok_t is not None and getattr(proc, "create_time", None):
            uptime = v.last_ok_t - proc.create_time
        elif st is not None and st.first_up_t is not None:
            uptime = t1 - st.first_up_t
        if kv_full and pre > 0:
            ev.append(f"{_plural(pre, 'preemption')} in the minute before: the KV cache was full")
            seqs = getattr(proc, "max_num_seqs", None) if proc is not None else None
            fix = [
                "Lower --max-num-seqs" + (f" (now {seqs})" if seqs else "") + " so fewer sequences compete for memory.",
                "Lower --gpu-memory-utilization a little to leave activations headroom, or add GPUs with "
                "--tensor-parallel-size.",
            ]
            title = f"CUDA out of memory on {short} under KV pressure: KV cache full, {_n(pre)} preemptions"
            return Alert("oom_steady", "critical", title, tuple(ev), tuple(fix), url, e.arrival)
        if spike is not None or long_prompts > 0:
            fix = [
                "Bound a step's work: --enable-chunked-prefill (always on in V1) with a lower --max-num-batched-tokens, "
                "e.g. 2048.",
                "Limit concurrency and prompt length upstream; a lower --max-model-len rejects oversized prompts.",
                "Leave more headroom: lower --gpu-memory-utilization a little.",
            ]
            what = "a memory spike" if spike is not None else "a long prompt"
            title = f"CUDA out of memory on {short} after {what}" + (f": tried to allocate {amt}" if amt else "")
            return Alert("oom_transient", "critical", title, tuple(ev), tuple(fix), url, e.arrival)
        fragmented = frag is not None and need is not None and frag >= need
        if fragmented or (uptime is not None and uptime >= th.fragmentation_uptime_s):
            if frag is not None:
                ev.append(f"{_gib(frag)} reserved by PyTorch but unallocated: the free memory is in pieces")
            if uptime is not None:
                ev.append(f"server up for {_dur(uptime)} with no spike, long prompt or full KV cache before it")
            fix = [
                "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in vLLM's environment to avoid fragmentation.",
                "Restart the server to get contiguous memory back; lower --gpu-memory-utilization a little for headroom.",
            ]
            title = f"CUDA out of memory on {short} from fragmentation" + (
                f" after {_dur(uptime)} up" if uptime is not None else ""
            )
            return Alert("oom_steady", "critical", title, tuple(ev), tuple(fix), url, e.arrival)
        ev.append(f"no memory spike, long prompt or full KV cache seen in the {_dur(th.transient_window_s)} before")
        fix = [
            "Bound a step's work with a lower --max-num-batched-tokens and limit concurrency upstream.",
            "Lower --gpu-memory-utilization a little for activation headroom; set "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
        ]
        title = f"CUDA out of memory on {short} while serving" + (f": tried to allocate {amt}" if amt else "")
        return Alert("oom_transient", "critical", title, tuple(ev), tuple(fix), url, e.arrival)


# --------------------------------------------------------------------------- small pieces


def _is_oom_failure(f: Failure) -> bool:
    return f.kind == "cuda_oom" or (f.kind == "exception" and _FREE_AT_START_RE.search(f.line) is not None)


def _role_of(proc: Any, pid: int) -> str:
    for c in getattr(proc, "children", ()) or ():
        if getattr(c, "pid", None) == pid:
            title = (getattr(c, "title", "") or "").replace("VLLM::", "").strip()
            return title.split()[0] if title else str(getattr(c, "role", "process"))
    return "vLLM"


def _json_keys(s: str | None) -> set[str]:
    if not s:
        return set()
    try:
        obj = json.loads(s)
    except ValueError:
        return set(re.findall(r"[\"']?(\w+)[\"']?\s*:", s))
    return set(obj) if isinstance(obj, dict) else set()


def _cap_suggestion(mml: int | None) -> int:
    """A generation cap to suggest: 4096, or half the context when that is smaller."""
    if not mml:
        return 4096
    return min(4096, max(256, int(mml) // 2))


def diagnose_once(now: float, *, thresholds: Thresholds = Thresholds(), **inputs: Any) -> list[Alert]:
    """One look with no memory (the inputs of :meth:`Diagnoser.update`): only what needs no
    duration fires (failures, stalls the tracker already timed, risky flags, OOM lines)."""
    return Diagnoser(thresholds).update(now, **inputs)
