"""The diagnoser: feeds what the rules share (:class:`~vtop.core.rules.context.Memory`) once per
tick, runs every rule family on a typed :class:`~vtop.core.rules.context.Ctx`, keeps the first
``since`` of a condition that goes on, and sorts the alerts, critical first. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from vtop.core.requests import LogRequests, requests_in_flight
from vtop.core.rules.alert import RANK, Alert, Thresholds
from vtop.core.rules.api import ApiUnresponsive
from vtop.core.rules.context import Ctx, Memory, Rule
from vtop.core.rules.death import EngineDied
from vtop.core.rules.flags import RiskyFlags
from vtop.core.rules.gpu import SmIdle
from vtop.core.rules.kv import KvSaturation
from vtop.core.rules.oom import Oom, OomRisk
from vtop.core.rules.runaway import Runaway
from vtop.core.rules.spec import SpecLow
from vtop.core.rules.stall import EngineStall
from vtop.core.rules.startup import StartupFailure, StartupStall
from vtop.core.rules.state import GpuPoint, GpuState, ServerState, sample_of
from vtop.core.rules.util import LIVE, is_proc, role_of

if TYPE_CHECKING:
    from vtop.core.gpu_history import GpuHistory
    from vtop.core.loghistory import LogHistoryView
    from vtop.core.phases import Quiet, StallInfo, StartupSnapshot
    from vtop.core.requests.conns import ConnTracker
    from vtop.core.server import ServerView
    from vtop.model.requests import ServerRequests

__all__ = ["Diagnoser", "default_rules", "diagnose_once"]


def default_rules() -> tuple[Rule, ...]:
    """One of each family, in the order they run (the order of alerts is decided by the sort)."""
    return (Runaway(), EngineStall(), KvSaturation(), RiskyFlags(), SmIdle(), OomRisk(), StartupStall(),
            StartupFailure(), EngineDied(), Oom(), ApiUnresponsive(), SpecLow())


class Diagnoser:
    """Stateful across ticks (it remembers when running last was 0, when a request last
    finished, when the counters last moved, GPU streaks and memory samples), fed once per tick.

    Not thread-safe: feed it from one thread (the UI tick is fine: a tick is a few
    comparisons per server and per GPU; the rare alert text is built only when a rule fires).
    """

    def __init__(self, thresholds: Thresholds = Thresholds()) -> None:
        self.thresholds = thresholds
        self._mem = Memory()
        #: the rule families, in the order they run (a fresh set per diagnoser: some keep state)
        self.rules: tuple[Rule, ...] = default_rules()
        self._since: dict[tuple[str, str | None], float] = {}
        self.alerts: list[Alert] = []
        #: per server URL, its requests in flight as of the last tick (the one answer every face reads)
        self.in_flight: dict[str, ServerRequests] = {}

    # ------------------------------------------------------------------ feeding

    def update_from(self, now: float, *, servers: Mapping[str, ServerView] | None, gpus: GpuHistory | None,
                    log: Any = None, log_target: str | None = None,
                    conns: Mapping[str, ConnTracker] | None = None) -> list[Alert]:
        """:meth:`update` from what the dashboard and ``vtop doctor`` hold: the servers'
        views, the GPU history and a log view (``snapshot``, ``stall``, ``inflight``,
        ``request_logging``, ``recent``; see :class:`vtop.monitor.logwatch.LogView`)
        of the server at ``log_target``; ``conns`` each local server's connections."""
        if log is None:
            return self.update(now, servers=servers, gpus=gpus, conns=conns)
        return self.update(
            now, servers=servers, gpus=gpus, startup=log.snapshot, startup_stall=log.stall,
            requests={log_target: log.inflight} if log_target else None,
            request_logging={log_target: log.request_logging} if log_target else None,
            finishes_logged={log_target: bool(getattr(log, "finishes_logged", False))} if log_target else None,
            log_lines=log.recent, log_target=log_target, log_history=getattr(log, "history", None),
            startup_quiet=getattr(log, "quiet", None),
            logged_since_start=getattr(log, "logged_since_start", None), conns=conns,
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
        startup_quiet: Quiet | None = None,
        log_history: LogHistoryView | None = None,
        logged_since_start: Sequence[tuple[float, int]] | None = None,
        conns: Mapping[str, ConnTracker] | None = None,
        finishes_logged: Mapping[str, bool] | None = None,
    ) -> list[Alert]:
        """Take this tick's state and return the alerts, critical first.

        ``now`` is the monotonic time of the tick (the clock the views and GPU
        polls use). ``requests`` maps a server URL to its in-flight requests
        (objects with ``request_id``, ``age_s``, ``age_is_upper_bound``,
        ``max_tokens``, ``no_client_max_tokens``); ``request_logging`` says per
        URL whether the log has request lines at all. ``log_lines`` are the
        startup tracker's recent lines (objects with ``text`` and ``arrival``),
        scanned once each for CUDA OOMs. ``log_target`` is the URL of the server
        the log and ``startup`` belong to (default: the only server, if one);
        ``log_history`` its log's stats lines of the last minutes
        (:mod:`vtop.core.loghistory`), which the runaway, stall and KV rules judge
        with what ``/metrics`` showed (``vtop doctor``'s short window, an attach).
        ``startup_stall`` is the tracker's stall past the ceiling (``--stall-threshold``);
        ``startup_quiet`` what it says of a start's silence and progress at any moment
        (the startup-stall rule judges a stall by evidence from it).
        ``logged_since_start``: ``(since, max_tokens)`` of every request the log at
        ``log_target`` logged since the server's startup (None: not known).
        ``conns``: per URL of a server on this box, its connections as the kernel counts them
        (:class:`vtop.core.requests.conns.ConnTracker`; the runaway rule's evidence of one request's age).
        ``finishes_logged``: per URL, whether its log has end lines (its open entries are in flight).
        Pass every server on every tick: one missing from ``servers`` is forgotten.
        """
        servers = servers or {}
        th = self.thresholds
        if log_target is None and len(servers) == 1:
            log_target = next(iter(servers))
        ctx = Ctx(now, th, self._mem, servers, gpus, startup, startup_stall, requests or {}, request_logging or {},
                  log_target, log_lines, startup_quiet)
        ctx.history = log_history
        ctx.conns = conns or {}
        ctx.logged_since_start = logged_since_start
        mem = self._mem

        for url in [u for u in mem.servers if u not in servers]:
            del mem.servers[url]
        for url, v in servers.items():
            st = mem.servers.get(url)
            if st is None:
                st = mem.servers[url] = ServerState()
            m = v.metrics
            t = v.last_ok_mono
            if m is not None and t is not None and (st.last is None or t > st.last.t):
                st.add(sample_of(t, m), th.kv_saturation_pct, th.history_s)
            if v.state in LIVE and st.first_up_t is None:
                st.first_up_t = now
            proc = v.process
            if is_proc(proc):
                st.note_cpu(now, proc, th.history_s)
                for pid in getattr(proc, "gpu_pids", ()) or ():
                    st.gpu_pids.add(int(pid))
                    ctx.pid_owner[int(pid)] = (url, role_of(proc, int(pid)))
        self._feed_gpus(ctx)
        ctx.in_flight = self.in_flight = {
            url: requests_in_flight(
                now, url, mem.servers[url], conns=ctx.conns.get(url),
                log=LogRequests(ctx.requests[url], bool(ctx.logging.get(url)), bool((finishes_logged or {}).get(url)))
                if url in ctx.requests else None,
                history=ctx.history_of(url), logged_since_start=logged_since_start if url == log_target else None,
                short_history_s=min(th.runaway_age_s, th.runaway_s))
            for url in servers}

        alerts: list[Alert] = []
        for rule in self.rules:
            alerts.extend(rule.check(ctx))

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
        out.sort(key=lambda a: (RANK.get(a.severity, 9), a.since if a.since is not None else now, a.rule, a.target or ""))
        self.alerts = out
        return out

    # ------------------------------------------------------------------ GPUs

    def oldest_in_flight_s(self, url: str) -> float | None:
        """Seconds the oldest request in flight on ``url`` has run at least, known from
        ``/metrics`` alone (:class:`vtop.core.requests.metrics_bound.OldestInFlight`, the runaway rule's
        evidence); None when nothing is known (no request in flight, no latency histogram
        yet). For faces that report it (``vtop export``)."""
        st = self._mem.servers.get(url)
        last = st.last if st is not None else None
        if st is None or last is None or not last.running or st.oldest.since is None:
            return None
        return st.oldest.lower_bound_s

    def _feed_gpus(self, ctx: Ctx) -> None:
        g = ctx.gpus
        if g is None:
            return
        mem = self._mem
        poll = getattr(g, "last_poll", None)
        mono = getattr(poll, "mono", None)
        new = mono is not None and (mem.gpu_mono is None or mono > mem.gpu_mono)
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
                    st = mem.servers.get(owner[0])
                    if st is not None:
                        st.gpu_idx.add(idx)
            if not new:
                continue
            gs = mem.gpus.get(idx)
            if gs is None:
                gs = mem.gpus[idx] = GpuState()
            mt = getattr(last, "mem_total", None)
            mu = getattr(last, "mem_used", None)
            gs.add(
                GpuPoint(
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
            mem.gpu_mono = mono


def diagnose_once(now: float, *, thresholds: Thresholds = Thresholds(), **inputs: Any) -> list[Alert]:
    """One look with no memory (the inputs of :meth:`Diagnoser.update`): only what needs no
    duration fires (failures, stalls the tracker already timed, risky flags, OOM lines)."""
    return Diagnoser(thresholds).update(now, **inputs)
