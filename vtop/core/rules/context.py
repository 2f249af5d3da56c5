"""What every rule is given: the tick's :class:`~vtop.core.evidence.Evidence` (typed, built by the
monitor) and :class:`Memory`, what the diagnoser remembers between ticks (with the thresholds and
the helpers that read both); and :class:`Rule`, what a rule is."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from vtop.core.engines import flags_of
from vtop.core.evidence import Evidence
from vtop.core.rules.alert import Alert, Pending, Thresholds
from vtop.core.rules.hold import AlertHold
from vtop.core.rules.state import GpuState, ServerState
from vtop.core.rules.util import gib, short_url
from vtop.core.server import ServerView
from vtop.core.stats import fmean
from vtop.model.gpu import GpuProcess, XidEvent, xid_text
from vtop.model.requests import ServerRequests

__all__ = ["Evidence", "Memory", "Rule", "per_gpu", "per_server"]


@dataclass
class Memory:
    """What the diagnoser keeps between ticks that more than one rule reads (fed by it before the
    rules run), the thresholds the rules compare against, and the readings that need both."""

    th: Thresholds = field(default_factory=Thresholds)
    servers: dict[str, ServerState] = field(default_factory=dict)
    gpus: dict[int, GpuState] = field(default_factory=dict)
    #: the monotonic time of the last GPU poll taken in
    gpu_mono: float | None = None
    #: the incidents going on (what is shown of each alert; the diagnoser applies it after the rules)
    hold: AlertHold = field(default_factory=lambda: AlertHold(Thresholds().alert_hold_s))
    #: per server URL, its requests in flight this tick (:func:`vtop.core.requests.requests_in_flight`,
    #: made by the diagnoser before the rules run): the one answer the runaway rule and every face read
    in_flight: dict[str, ServerRequests] = field(default_factory=dict)
    #: this tick's conditions that hold but not yet for their threshold (emptied before the rules run)
    pending: list[Pending] = field(default_factory=list)

    def started(self, rule: str, target: str | None, since: float) -> float:
        """When the incident of ``rule`` on ``target`` began, if one is going on (else ``since``):
        what a title's "for Ns" counts from, so that it does not restart when a severity flips."""
        return self.hold.started((rule, target), since)

    # ------------------------------------------------------------------ reading GPUs and processes

    def gpus_of(self, ev: Evidence, url: str | None) -> list[int]:
        """The GPUs a server's processes were seen on (now or before)."""
        if url is None:
            return []
        st = self.servers.get(url)
        got = {i for i, owners in ev.gpu_owner.items() if url in owners}
        if st is not None:
            got |= st.gpu_idx
        return sorted(got)

    def starting_on(self, ev: Evidence, idx: int) -> bool:
        """A start is in progress that may use GPU ``idx`` (100 % GPU is normal then)."""
        owners = ev.gpu_owner.get(idx, [])
        for url, v in ev.servers.items():
            if v.state == "starting" and (url in owners or not owners):
                return True
        snap = ev.startup
        if snap is not None and snap.state == "starting":
            tgt = ev.log_target
            if tgt is None or not owners or tgt in owners or idx in self.gpus_of(ev, tgt):
                return True
        return False

    def proc_names(self, ev: Evidence, procs: Iterable[GpuProcess] | None) -> list[str]:
        out = []
        for gp in sorted(procs or (), key=lambda p: -(p.used_bytes or 0)):
            out.append(self.name_pid(ev, int(gp.pid), gib(gp.used_bytes)))
        return out

    def name_pid(self, ev: Evidence, pid: int, extra: str | None = None) -> str:
        """``EngineCore of :8000 (pid 1048, 70.0 GiB)``, or ``pid 4242 (20.0 GiB)`` for a stranger."""
        owner = ev.pid_owner.get(pid)
        if owner is None:
            for url, st in self.servers.items():
                if pid in st.gpu_pids:
                    owner = (url, f"{flags_of(getattr(st.last_proc, 'engine', None))['name']} process")
                    break
        if owner is None:
            return f"pid {pid}" + (f" ({extra})" if extra else "")
        return f"{owner[1]} of {short_url(owner[0])} (pid {pid}{', ' + extra if extra else ''})"

    def gpu_line(self, idx: int, a: float, b: float) -> str | None:
        """``gpu0: GPU-Util 12 %, SM activity 3 %`` averaged over ``(a, b]``."""
        gs = self.gpus.get(idx)
        if gs is None:
            return None
        pts = gs.between(a, b) or ([gs.points[-1]] if gs.points else [])
        utils = [p.util for p in pts if p.util is not None]
        sms = [p.sm for p in pts if p.sm is not None]
        if not utils:
            return None
        s = f"gpu{idx}: GPU-Util {fmean(utils):.0f} %"
        if sms:
            s += f", SM activity {fmean(sms):.1f} %"
        return s

    def xids_near(self, ev: Evidence, url: str | None, a: float, b: float) -> list[XidEvent]:
        """The XID events (monotonic ``a`` to ``b``) on the GPUs of ``url`` (on any GPU when vtop
        does not know which GPUs it uses, and those NVML could not place)."""
        xs = ev.xids
        if not xs:
            return []
        mine = set(self.gpus_of(ev, url))
        return [x for x in xs if a <= x.mono <= b and (not mine or x.gpu is None or x.gpu in mine)]

    def xid_lines(self, ev: Evidence, url: str | None, a: float, b: float) -> list[str]:
        """Evidence lines naming each XID near the event, with what its number means."""
        out = []
        for x in self.xids_near(ev, url, a, b):
            try:
                at = time.strftime("%H:%M:%S", time.localtime(x.t))
            except (OverflowError, ValueError, OSError):
                at = "?"
            where = f"gpu{x.gpu}" if x.gpu is not None else "a GPU"
            out.append(f"{where}: {xid_text(x.xid)} at {at} (NVML XID event)")
        return out

    def other_procs_lines(self, ev: Evidence, url: str | None, at: float) -> list[str]:
        """Evidence lines naming the processes that are not this server's on its GPUs (at time ``at``)."""
        st = self.servers.get(url) if url else None
        mine = set(st.gpu_pids) if st is not None else set()
        idxs = self.gpus_of(ev, url) or sorted(self.gpus)
        out = []
        for idx in idxs:
            gs = self.gpus.get(idx)
            p = gs.at(at) if gs is not None else None
            if p is None or p.procs is None:
                continue
            others = [q for q in p.procs if int(q.pid) not in mine and q.used_bytes]
            if others:
                used = float(sum(q.used_bytes or 0 for q in others))
                out.append(
                    f"gpu{idx}: other processes hold {gib(used)} of {gib(p.mem_total)}: "
                    + ", ".join(self.proc_names(ev, others))
                )
        return out


class Rule(Protocol):
    """One family of rules: given a tick, the alerts it raises now (``[]`` when all is well).

    A rule may keep state of its own between ticks (the OOM rule remembers the OOM lines it saw);
    what several rules read lives in :class:`Memory`, fed by the diagnoser before the rules run.
    """

    @property
    def ids(self) -> tuple[str, ...]:
        """The :data:`~vtop.core.rules.alert.RULES` ids it may raise."""
        ...

    def check(self, ev: Evidence, mem: Memory) -> list[Alert]: ...


def per_server(ev: Evidence, mem: Memory,
               fn: Callable[[Evidence, Memory, str, ServerView, ServerState], Alert | None]) -> list[Alert]:
    """``fn`` on every server of the tick (with what the diagnoser remembers of it); the alerts it raised."""
    out = []
    for url, v in ev.servers.items():
        a = fn(ev, mem, url, v, mem.servers[url])
        if a is not None:
            out.append(a)
    return out


def per_gpu(ev: Evidence, mem: Memory, fn: Callable[[Evidence, Memory, int], Alert | None]) -> list[Alert]:
    """``fn`` on every GPU the diagnoser has points of, in index order; the alerts it raised."""
    out = []
    for idx in sorted(mem.gpus):
        a = fn(ev, mem, idx)
        if a is not None:
            out.append(a)
    return out
