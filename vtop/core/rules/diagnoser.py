"""The diagnoser: feeds what the rules share (:class:`~vtop.core.rules.context.Memory`) once per
tick, runs every rule family on the tick's typed :class:`~vtop.core.evidence.Evidence`, keeps the
first ``since`` of a condition that goes on, and sorts the alerts, critical first. Pure: no I/O."""

from __future__ import annotations

from vtop.core.evidence import Evidence
from vtop.core.requests import LogRequests, requests_in_flight
from vtop.core.rules.alert import RANK, Alert, Pending, Thresholds
from vtop.core.rules.api import ApiUnresponsive
from vtop.core.rules.context import Memory, Rule
from vtop.core.rules.death import EngineDied
from vtop.core.rules.flags import RiskyFlags
from vtop.core.rules.gpu import SmIdle
from vtop.core.rules.hold import AlertHold
from vtop.core.rules.kv import KvSaturation
from vtop.core.rules.neighbour import Neighbour
from vtop.core.rules.oom import Oom, OomRisk
from vtop.core.rules.queue import QueueWedge
from vtop.core.rules.runaway import Runaway
from vtop.core.rules.spec import SpecLow
from vtop.core.rules.stall import EngineStall
from vtop.core.rules.startup import StartupFailure, StartupStall
from vtop.core.rules.state import GpuPoint, GpuState, ServerState, sample_of
from vtop.core.rules.util import LIVE, engine_of
from vtop.model.gpu import SLOWDOWN_REASONS
from vtop.model.requests import ServerRequests

__all__ = ["Diagnoser", "default_rules", "diagnose_once"]


def default_rules() -> tuple[Rule, ...]:
    """One of each family, in the order they run (the order of alerts is decided by the sort)."""
    return (Runaway(), EngineStall(), KvSaturation(), RiskyFlags(), SmIdle(), OomRisk(), StartupStall(),
            StartupFailure(), EngineDied(), Oom(), ApiUnresponsive(), SpecLow(), QueueWedge(), Neighbour())


class Diagnoser:
    """Stateful across ticks (it remembers when running last was 0, when a request last
    finished, when the counters last moved, GPU streaks and memory samples), fed once per tick.

    Not thread-safe: feed it from one thread (the UI tick is fine: a tick is a few
    comparisons per server and per GPU; the rare alert text is built only when a rule fires).
    """

    def __init__(self, thresholds: Thresholds = Thresholds()) -> None:
        self._mem = Memory(thresholds, hold=AlertHold(thresholds.alert_hold_s, thresholds.alert_clear_hold_s))
        #: the rule families, in the order they run (a fresh set per diagnoser: some keep state)
        self.rules: tuple[Rule, ...] = default_rules()
        self.alerts: list[Alert] = []
        #: per server URL, its requests in flight as of the last tick (the one answer every face reads)
        self.in_flight: dict[str, ServerRequests] = {}
        #: the conditions that hold but not yet for their threshold, at the last update (none of a
        #: rule and target that has an alert out)
        self.pending: list[Pending] = []

    @property
    def thresholds(self) -> Thresholds:
        """Every number the rules compare against (set it to change them from the next tick on)."""
        return self._mem.th

    @thresholds.setter
    def thresholds(self, th: Thresholds) -> None:
        self._mem.th = th
        self._mem.hold.hold_s, self._mem.hold.clear_hold_s = th.alert_hold_s, th.alert_clear_hold_s

    def update(self, ev: Evidence) -> list[Alert]:
        """Take this tick's evidence (:class:`~vtop.core.evidence.Evidence`, built by the monitor)
        and return the alerts, critical first. Pass every server on every tick: one missing from
        ``ev.servers`` is forgotten."""
        self._feed_servers(ev)
        self._feed_gpus(ev)
        self._mem.in_flight = self.in_flight = self._requests_in_flight(ev)
        alerts: list[Alert] = []
        self._mem.pending = []
        for rule in self.rules:
            alerts.extend(rule.check(ev, self._mem))
        # one incident per alert while it lasts: its start, a severity that falls only after a while
        out = self._mem.hold.apply(alerts, ev.now)
        out.sort(key=lambda a: (RANK.get(a.severity, 9), a.since if a.since is not None else ev.now, a.rule,
                                a.target or ""))
        self.alerts = out
        keys = {a.key for a in out}
        self.pending = [p for p in self._mem.pending if (p.rule, p.target) not in keys]
        return out

    # ------------------------------------------------------------------ feeding

    def _feed_servers(self, ev: Evidence) -> None:
        mem, th = self._mem, self.thresholds
        for url in [u for u in mem.servers if u not in ev.servers]:
            del mem.servers[url]
        for url, v in ev.servers.items():
            st = mem.servers.get(url)
            if st is None:
                st = mem.servers[url] = ServerState()
            m = v.metrics
            t = v.last_ok_mono
            if m is not None and t is not None and (st.last is None or t > st.last.t):
                st.add(sample_of(t, m), th.kv_saturation_pct, th.history_s)
            if v.state in LIVE and st.first_up_t is None:
                st.first_up_t = ev.now
            st.note_start(ev.now, ev.wall, v.state, v.process, v.last_ok_mono, v.last_ok_t, v.health)
            proc = ev.process_of(url)
            if proc is not None:
                st.last_proc = proc
                st.note_cpu(ev.now, proc, th.history_s)
                st.gpu_pids.update(int(pid) for pid in proc.gpu_pids)

    # ------------------------------------------------------------------ GPUs

    def _requests_in_flight(self, ev: Evidence) -> dict[str, ServerRequests]:
        """Every server's requests in flight this tick: the one answer (vtop.core.requests)."""
        th = self._mem.th
        lg = ev.log
        out = {}
        for url in ev.servers:
            mine = lg is not None and url == ev.log_target
            log = LogRequests(lg.inflight, bool(lg.request_logging), lg.finishes_logged) if mine and lg else None
            out[url] = requests_in_flight(ev.now, url, self._mem.servers.get(url), log=log, conns=ev.conns.get(url),
                                          history=ev.history_of(url),
                                          logged_since_start=ev.logged_since_start if mine else None,
                                          short_history_s=min(th.runaway_age_s, th.runaway_s),
                                          engine=engine_of(ev, url))
        return out

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

    def _feed_gpus(self, ev: Evidence) -> None:
        g = ev.gpus
        if g is None:
            return
        mem = self._mem
        for idx, owners in ev.gpu_owner.items():
            for url in owners:
                st = mem.servers.get(url)
                if st is not None:
                    st.gpu_idx.add(idx)
        mono = g.last_poll.mono if g.last_poll is not None else None
        if mono is None or (mem.gpu_mono is not None and mono <= mem.gpu_mono):
            return
        for idx, tr in g.tracks.items():
            last = tr.last
            if last is None or last.lost:
                continue
            gs = mem.gpus.get(idx)
            if gs is None:
                gs = mem.gpus[idx] = GpuState()
            slow = None if last.throttle is None else float(bool(SLOWDOWN_REASONS.intersection(last.throttle)))
            gs.add(GpuPoint(mono, last.util_gpu, last.sm_active, last.mem_pct, last.mem_used, last.mem_total,
                            last.procs, slow), self.thresholds.history_s)
        mem.gpu_mono = mono


def diagnose_once(ev: Evidence, *, thresholds: Thresholds = Thresholds()) -> list[Alert]:
    """One look with no memory: only what needs no duration fires (failures, stalls the tracker
    already timed, risky flags, OOM lines)."""
    return Diagnoser(thresholds).update(ev)
