"""``engine_stall``: a frozen engine behind a live API server.

Evidence: ``running > 0`` while the generation/prompt token counters and the finished-request
count stay flat for ``engine_stall_s``, and ``/metrics`` still answers (a frozen engine keeps
``/health`` at 200 and freezes the gauges). Before vtop's first sample, the log says since when
(:meth:`vtop.core.loghistory.LogHistoryView.stalled_since`): the stats lines with zero throughput
and requests running, the silence after them (vLLM drops a second idle interval to DEBUG), the
shm-broadcast 60 s wait; so ``doctor --window 15`` names a stall that began before it. The line
before the zero ones often still counts a sliver of tokens (the outputs made before the stop,
handed over after it): that interval is the one the engine stopped in, and its share of the
rate before it says about when (:meth:`~vtop.core.loghistory.LogHistoryView.stopped_within`;
the title then says "about"); without it the evidence would come up to a stats interval late. GPU-Util near 0 during the silence says the engine
launches no work (a Python-side hang or a stopped process); GPU-Util high with idle SMs says a
collective (NCCL) waits for a peer. Corpus traces: tests/corpus/traces/engine-stall-enginecore,
engine-stall-worker-only; quiet on every normal-* trace.

Without a log (vLLM's stdout on a pipe), the connections keep the time (issue 49): the kernel's
``last_sent`` of each connection to the port (vtop/core/requests/conns.py, :class:`~vtop.core.requests.conns.Silence`):
when every answer in flight has been silent (no byte sent for 8 s or more: vLLM closes a kept-alive
connection 5 s after its answer, so a silent open one is an answer not ended), as many as run, and
none streams, no token came since the youngest silence. The evidence says which source dated it.
The engine's processes' CPU seconds over the silence say whether it runs at all (a SIGSTOPped
EngineCore adds none). A stall that holds but not yet for ``engine_stall_s`` is a
:class:`~vtop.core.rules.alert.Pending` finding: a short doctor window says it and exits 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vtop.core.engines import flags_of
from vtop.core.rules.alert import Alert, Pending, Thresholds
from vtop.core.rules.context import Evidence, Memory, per_server
from vtop.core.rules.stillness import STOPPED, stopped_since, tree_cpu
from vtop.core.rules.util import LIVE, dur, engine_of, num, short_url, xid_short
from vtop.core.stats import fmean

if TYPE_CHECKING:
    from vtop.core.rules.state import ServerState
    from vtop.core.server import ServerView


class EngineStall:
    """The engine-stall rule (see the module's docstring)."""

    ids = ("engine_stall",)

    def check(self, ctx: Evidence, mem: Memory) -> list[Alert]:
        return per_server(ctx, mem, engine_stall)


@dataclass(frozen=True)
class StallFinding:
    """An engine that stopped: since when (``about`` when the log's stats lines only bound it), what
    it holds, whether the API server still answers, the GPUs' means over the silence, XIDs near it."""

    url: str
    since: float
    now: float
    about: bool
    running: float | None
    waiting: float | None
    gen: float | None
    prompt: float | None
    #: the line of the source that says since when, the log's or the connections' (None: /metrics said it)
    log_line: str | None
    health: int | None
    latency_s: float | None
    #: per GPU: (its line, mean GPU-Util, mean SM activity) over the silence
    gpus: tuple[tuple[str, float | None, float | None], ...]
    xid_lines: tuple[str, ...]
    xid_title: str
    #: what dated ``since``: "/metrics", "the vLLM log", "the connections"
    dated_by: str = "/metrics"
    #: the engine's processes over the silence (CPU seconds)
    proc_lines: tuple[str, ...] = ()
    #: the engine serving it (:data:`vtop.core.engines.ENGINES`; None: not known, vLLM's words)
    engine: str | None = None
    #: nothing running by /metrics, named from the engine processes stopped (state T; their gauges froze with
    #: them): which, in words ("VLLM::EngineCore (pid 1685)"); None: named from /metrics
    idle_stopped: str | None = None


def engine_stall(ctx: Evidence, mem: Memory, url: str, v: ServerView, st: ServerState) -> Alert | None:
    f = stall_finding(ctx, mem, url, v, st)
    return stall_alert(f, mem.th) if f is not None else None


@dataclass(frozen=True)
class _Dated:
    """Since when nothing moved, and what dated it (the source reaching furthest back)."""

    since: float
    #: "/metrics" (vtop's own samples), "the vLLM log", "the connections"
    source: str
    #: the line that says so (None: vtop's samples)
    line: str | None = None
    about: bool = False


def _stall_since(ctx: Evidence, url: str, st: ServerState) -> _Dated | None:
    """Since when nothing moved while requests ran: vtop's samples, or, when nothing moved from
    vtop's first sample on, the source that reaches further back: the log's stats lines, or the
    connections' silence (every answer in flight silent, dated by the youngest silence)."""
    if st.last_progress_t is None or st.busy_since is None:
        return None
    since = max(st.last_progress_t, st.busy_since)
    best = _Dated(since, "/metrics")
    if st.first_t is None or since > st.first_t:
        return best
    # Nothing moved and requests ran from vtop's first sample on: what kept time before it?
    hist = ctx.history_of(url)
    if hist is not None:
        from_log = hist.stalled_since(ctx.now, st.first_t)
        if from_log is not None and from_log[0] < best.since:
            best = _Dated(from_log[0], f"the {flags_of(engine_of(ctx, url))['name']} log", from_log[1], from_log[2])
    got = _conns_silent(ctx, url, st)
    if got is not None and got.since < best.since:
        best = got
    return best


def _conns_silent(ctx: Evidence, url: str, st: ServerState) -> _Dated | None:
    """The connections' word: every answer in flight on the server's port silent (the kernel's
    ``last_sent``), as many as run (with the answers not yet begun), none streaming: no token
    since the youngest silence (vtop/core/requests/conns.py :meth:`~vtop.core.requests.conns.ConnTracker.silence`)."""
    tr = ctx.conns.get(url)
    s = st.last
    if tr is None or s is None or not s.running:
        return None
    sil = tr.silence(ctx.now)
    if sil is None or sil.streams + sil.pending < s.running:
        return None
    n = sil.streams
    more = f" ({sil.pending} more with no byte of an answer yet)" if sil.pending else ""
    line = (f"{n} answer{'s' if n != 1 else ''} in flight on its connections got no byte for {dur(ctx.now - sil.since)}"
            f"{more}: the youngest silence, by the kernel's last-sent time of each connection")
    return _Dated(sil.since, "the connections", line)


def stall_finding(ctx: Evidence, mem: Memory, url: str, v: ServerView, st: ServerState) -> StallFinding | None:
    s = st.last
    if s is None or v.state not in LIVE:
        return None
    if v.sleep_level:  # put to sleep (POST /sleep): it makes no tokens on purpose, not a stall
        return None
    if not s.running or s.running <= 0:
        return _stopped_while_idle(ctx, mem, url, v, st)
    got = _stall_since(ctx, url, st)
    if got is None:
        return None
    stopped = _engine_stopped(ctx, mem, url, st, got.since)
    if ctx.now - got.since < mem.th.engine_stall_s and stopped is None:
        # Pending needs a sample that saw nothing move: the newest scrape showing progress says only that
        # no scrape came since (a slow box, the window's end), not that the engine stopped. `vtop --once
        # --window 2` on a loaded box read a burst's second scrape, ended 1 s later, and said "[PENDING]
        # engine_stall" (tests/unit/test_headless.py, three times in CI runs).
        if ctx.now - got.since >= 1.0 and not (got.source == "/metrics" and s.t <= got.since):
            mem.pending.append(Pending(
                "engine_stall", url, got.since, mem.th.engine_stall_s,
                f"running {num(s.running)}, waiting {num(s.waiting)}, no new token and no request finished",
                "an engine stall",
                (f"dated by {got.source}" + (f": {got.line}" if got.line else ""),
                 *_process_lines(ctx, mem, url, st, got.since)), st.first_t))
        return None
    since, now = got.since, ctx.now
    gpus: list[tuple[str, float | None, float | None]] = []
    for idx in mem.gpus_of(ctx, url):
        gl = _shared_gpu_line(ctx, mem, url, idx, since, now)
        if gl and _shared_with(ctx, url, idx):
            gpus.append((gl, None, None))  # another server's work counts in its GPU-Util: no reading of it
        elif gl:
            pts = mem.gpus[idx].between(since, now)
            utils = [p.util for p in pts if p.util is not None]
            sms = [p.sm for p in pts if p.sm is not None]
            gpus.append((gl, fmean(utils) if utils else None, fmean(sms) if sms else None))
    return StallFinding(
        url, since, now, got.about, s.running, s.waiting, s.gen, s.prompt,
        got.line, v.health, v.latency_s, tuple(gpus),
        tuple(mem.xid_lines(ctx, url, since - 60.0, now)), xid_short(mem.xids_near(ctx, url, since - 60.0, now)),
        got.source, tuple(_process_lines(ctx, mem, url, st, since)), engine_of(ctx, url),
    )


def _stopped_while_idle(ctx: Evidence, mem: Memory, url: str, v: ServerView, st: ServerState) -> StallFinding | None:
    """No request running by ``/metrics``, and an engine process (the EngineCore or a worker) stopped (state
    T) at every process scan over ``stopped_min_span_s`` (two scans at least: one scan may catch a py-spy
    dump's stop of a few milliseconds). vLLM's gauges are the EngineCore's scheduler stats, sent with its
    outputs: a stopped engine sends none, so ``/metrics`` keeps its last word (0 running) while the requests
    sent to it wait unseen. The real run of two servers on one H100 (tests/fixtures/h100-two-servers: the
    EngineCore of :8001 SIGSTOPped 75 s with 4 requests sent to it) read 0 running, 0 waiting throughout, and
    vtop named nothing. One scan of it is a :class:`~vtop.core.rules.alert.Pending` finding (the live feed
    scans again within seconds while one is pending)."""
    engine = _engine_pids(ctx, url)
    if not engine or not st.cpu_samples:
        return None
    t = stopped_since(st, lambda s: engine, any_of=True)
    if t is None:
        return None
    seen = st.cpu_samples[-1].t - t  # between the first scan that saw it stopped and the newest one
    if seen < mem.th.stopped_min_span_s:
        mem.pending.append(Pending(
            "engine_stall", url, t, mem.th.stopped_min_span_s,
            "an engine process stopped (state T) while /metrics answers with nothing running",
            "an engine stall", tuple(_process_lines(ctx, mem, url, st, t)), st.cpu_samples[0].t))
        return None
    s = st.last
    assert s is not None
    last = st.cpu_samples[-1]
    who = ", ".join(f"{last.names.get(p, 'process')} (pid {p})" for p in sorted(engine)
                    if last.states.get(p) in STOPPED)
    gpus: tuple[tuple[str, float | None, float | None], ...] = tuple(
        (gl, None, None) for gl in (_shared_gpu_line(ctx, mem, url, idx, t, ctx.now) for idx in mem.gpus_of(ctx, url))
        if gl)
    return StallFinding(
        url, t, ctx.now, False, s.running, s.waiting, s.gen, s.prompt, None, v.health, v.latency_s, gpus,
        tuple(mem.xid_lines(ctx, url, t - 60.0, ctx.now)), xid_short(mem.xids_near(ctx, url, t - 60.0, ctx.now)),
        "the process table", tuple(_process_lines(ctx, mem, url, st, t)), engine_of(ctx, url), who,
    )


def _shared_with(ctx: Evidence, url: str, idx: int) -> list[str]:
    """The other watched servers with a process on GPU ``idx`` now."""
    return sorted(u for u in ctx.gpu_owner.get(idx, []) if u != url)


def _shared_gpu_line(ctx: Evidence, mem: Memory, url: str, idx: int, a: float, b: float) -> str | None:
    """The GPU's line over the silence; where other servers share the GPU, whose work its GPU-Util counts
    and, from NVML's per-process samples where the driver gives them, this engine's own share of the SMs
    (two servers on one GPU: the GPU-Util of a frozen engine's GPU is the other server's)."""
    gl = mem.gpu_line(idx, a, b)
    others = _shared_with(ctx, url, idx)
    if gl is None or not others:
        return gl
    gl += f", shared with {', '.join(short_url(u) for u in others)} (its work counts in it)"
    proc = ctx.process_of(url)
    last = ctx.gpus.tracks[idx].last if ctx.gpus is not None and idx in ctx.gpus.tracks else None
    mine = set(proc.gpu_pids) if proc is not None else set()
    own = [gp.sm_util for gp in (last.procs or ()) if int(gp.pid) in mine and gp.sm_util is not None] if last else []
    if own:
        gl += f"; this engine's own share of the SMs {sum(own):.0f} % (NVML per-process samples, last poll)"
    return gl


def _engine_pids(ctx: Evidence, url: str) -> set[int]:
    """The server's engine processes: its EngineCore and workers (none: no process known)."""
    proc = ctx.process_of(url)
    return set(proc.engine_pids()) | set(proc.worker_pids()) if proc is not None else set()


def _engine_stopped(ctx: Evidence, mem: Memory, url: str, st: ServerState, since: float) -> float | None:
    """Since when an engine process (the EngineCore or a worker) has been stopped (state T) at every
    process scan for ``stopped_min_span_s``, or every engine process has used no CPU time for
    ``startup_still_min_span_s``, of the stall: an engine that does not run makes no token, so the
    stall needs no longer to be sure."""
    engine = _engine_pids(ctx, url)
    if not engine:
        return None
    span = mem.th.startup_still_min_span_s
    t = stopped_since(st, lambda s: engine, any_of=True)
    if t is not None and ctx.now - max(t, since) >= mem.th.stopped_min_span_s:
        return t
    # ... or every engine process still (no CPU time) over that span of the stall: a working engine
    # runs a step after step, a collective waiting for a peer spins; one that sleeps is blocked
    use = tree_cpu(st, since)
    if use is None or use.span_s < span or not st.cpu_samples or ctx.now - st.cpu_samples[-1].t > 30.0:
        return None
    mine = [p for p in use.used if p in engine]
    if mine and all(use.used[p] <= max(0.02, mem.th.startup_still_cpu_frac * use.span_s) for p in mine):
        return st.cpu_samples[-1].t - use.span_s
    return None


def _process_lines(ctx: Evidence, mem: Memory, url: str, st: ServerState, since: float) -> list[str]:
    """The engine's processes over the silence (what vtop watched of it): CPU seconds from the
    process scans; a stopped or blocked engine adds none."""
    proc = ctx.process_of(url)
    engine = _engine_pids(ctx, url)
    out = []
    states = proc.state_by_pid() if proc is not None else {}
    stopped = [p for p in engine if states.get(p) in STOPPED]
    if stopped:
        names = {c.pid: (c.title or c.role) for c in proc.children} if proc is not None else {}
        who = ", ".join(f"{names.get(p, 'process')} (pid {p})" for p in sorted(stopped))
        out.append(f"{who}: stopped (state T in the process table: a SIGSTOP, or a debugger)")
    use = tree_cpu(st, since)
    if use is None or use.span_s < 2.0:
        return out
    idle = [p for p in use.used if p in engine and use.used[p] <= max(0.02, 0.01 * use.span_s)]
    watched = "" if use.span_s >= ctx.now - since - 2.0 else " (all vtop watched)"
    if idle:
        who = ", ".join(f"{use.names.get(p, 'process')} (pid {p}) {use.used[p]:.2f} s" for p in idle)
        return [*out, f"CPU time in {dur(use.span_s)}{watched}: {who}: the engine does not run (stopped, or blocked)"]
    if engine:
        busy = ", ".join(f"{use.names.get(p, 'process')} (pid {p}) {use.used[p]:.1f} s" for p in use.used if p in engine)
        return [*out, f"CPU time in {dur(use.span_s)}{watched}: {busy}: the engine's processes run (a loop or a wait)"]
    return out


def _stall_fix(engine: str | None) -> tuple[str, ...]:
    """The stall's fixes in the engine's words (:data:`vtop.core.engines.ENGINE_FLAGS`)."""
    fl = flags_of(engine)
    return (
        f"Press d for a py-spy dump of {fl['engine_proc']} ({fl['tp_procs']} for TP>1): it shows where the engine "
        "waits.",
        *((f"Look in the log for '{fl['stall_log']}' (a worker is stuck).",) if fl["stall_log"] else ()),
        "If it does not move again, restart the server: /health stays 200 while the engine is frozen, so a health "
        "check alone will not restart it.",
    )


def stall_alert(f: StallFinding, th: Thresholds) -> Alert:
    """The words of an engine stall."""
    if f.idle_stopped is not None:
        return _idle_stall_alert(f, th)
    about = "about " if f.about else ""
    span = dur(f.now - f.since)
    ev = [
        f"running {num(f.running)}, waiting {num(f.waiting)} for {about}{span} with no new token and no "
        "request finished",
        f"generation tokens stuck at {num(f.gen)}, prompt tokens at {num(f.prompt)}",
    ]
    if f.log_line is not None:
        ev.append(f.log_line)
    if f.dated_by != "/metrics":
        ev.append(f"dated by {f.dated_by} (it began before vtop's first sample, which already showed nothing moving)")
    ev.extend(f.proc_lines)
    if f.health is not None or f.latency_s is not None:
        ev.append(f"the server still answers ({_answers(f)}): the API server is alive, the engine is not moving")
    for gl, mu, ms in f.gpus:
        if mu is not None and mu < 5:
            gl += ": the engine launches no GPU work (a Python-side hang, a deadlock, or a stopped process)"
        elif mu is not None and mu >= th.sm_idle_util and ms is not None and ms < th.sm_idle_active:
            gl += ": busy with idle SMs, the signature of a collective (NCCL) waiting for a peer"
        ev.append(gl)
    ev.extend(f.xid_lines)
    fix: tuple[str, ...] = _stall_fix(f.engine)
    title = f"Engine stalled on {short_url(f.url)}: {num(f.running)} running, no token for {about}{span}"
    if f.xid_lines:
        fix = ("An XID on its GPU came with the stall: the GPU faulted (see the XID above); check "
               "`nvidia-smi -q` and the kernel log (dmesg | grep -i xid), reset or replace the GPU.", *fix)
        title += f"; {f.xid_title}"
    return Alert("engine_stall", "critical", title, tuple(ev), fix, f.url, f.since)


def _answers(f: StallFinding) -> str:
    """What the server answered: ``/health 200, /metrics in 11 ms``; a /health with no status to quote (an engine whose
    /health waits on its stopped scheduler, 20 s) is left out, not said as "?"."""
    bits = [f"/health {f.health}"] if f.health is not None else []
    if f.latency_s is not None:
        bits.append(f"/metrics in {f.latency_s * 1000:.0f} ms")
    return ", ".join(bits)


def _idle_stall_alert(f: StallFinding, th: Thresholds) -> Alert:
    """The words of an engine stopped while ``/metrics`` says nothing runs (:func:`_stopped_while_idle`)."""
    span = dur(f.now - f.since)
    ev = [*f.proc_lines,
          f"/metrics says running {num(f.running)}, waiting {num(f.waiting)}, generation tokens {num(f.gen)}: "
          f"{flags_of(f.engine)['name']}'s gauges come from the engine's scheduler stats, so they froze when it "
          "stopped; requests sent to it now wait, unseen by /metrics"]
    if f.health is not None or f.latency_s is not None:
        ev.append(f"the server still answers ({_answers(f)}): the API server is alive, the engine is not running")
    ev.extend(gl for gl, _mu, _ms in f.gpus)
    ev.extend(f.xid_lines)
    title = (f"Engine stalled on {short_url(f.url)}: {f.idle_stopped} stopped (state T) for {span}, "
             "/metrics frozen at 0 running")
    fix = ("A stopped process waits for a SIGCONT: find who sent the SIGSTOP (a debugger, a job-control Ctrl-Z, "
           "a watchdog) and `kill -CONT` the pid above, or restart the server.", *_stall_fix(f.engine))
    return Alert("engine_stall", "critical", title, tuple(ev), fix, f.url, f.since)
