"""What every rule is given: :class:`Ctx`, everything one tick sees (typed), and :class:`Memory`,
what the diagnoser remembers between ticks; and :class:`Rule`, what a rule is.

``core`` must not import ``sources`` at run time: GPU samples, server processes and in-flight
requests are read by attribute (``Any`` below marks those).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from vtop.core.rules.alert import Alert, Thresholds
from vtop.core.rules.state import GpuState, ServerState
from vtop.core.rules.util import gib, short_url
from vtop.model.gpu import xid_text

if TYPE_CHECKING:
    from vtop.core.gpu_history import GpuHistory
    from vtop.core.loghistory import LogHistoryView
    from vtop.core.phases import Quiet, StallInfo, StartupSnapshot
    from vtop.core.requests.conns import ConnTracker
    from vtop.core.server import ServerView
    from vtop.model.requests import ServerRequests

__all__ = ["Ctx", "Memory", "Rule", "per_gpu", "per_server"]


@dataclass
class Memory:
    """What the diagnoser keeps between ticks that more than one rule reads."""

    servers: dict[str, ServerState] = field(default_factory=dict)
    gpus: dict[int, GpuState] = field(default_factory=dict)
    #: the monotonic time of the last GPU poll taken in
    gpu_mono: float | None = None


@dataclass
class Ctx:
    """Everything one tick sees, passed to the rules."""

    now: float
    th: Thresholds
    mem: Memory
    servers: Mapping[str, ServerView]
    gpus: GpuHistory | None
    startup: StartupSnapshot | None
    stall: StallInfo | None
    #: server URL -> in-flight requests read from its log (``request_id``, ``age_s``, ``age_is_upper_bound``,
    #: ``max_tokens``, ``no_client_max_tokens``)
    requests: Mapping[str, Sequence[Any]]
    #: server URL -> whether its log has request lines at all
    logging: Mapping[str, bool]
    #: the server the log (``startup``, ``stall``, ``log_lines``) belongs to
    log_target: str | None
    #: the startup tracker's recent lines (``text``, ``arrival``, ``t``)
    log_lines: Sequence[Any] | None = None
    #: a start in progress: how long its log has been silent, what its progress says
    quiet: Quiet | None = None
    #: gpu index -> the server URLs with a GPU process on it
    gpu_owner: dict[int, list[str]] = field(default_factory=dict)
    #: pid -> (server URL, role)
    pid_owner: dict[int, tuple[str, str]] = field(default_factory=dict)
    #: the log's stats lines of the last minutes, of the server at ``log_target``
    #: (:class:`vtop.core.loghistory.LogHistoryView`): what came before vtop looked
    history: LogHistoryView | None = None
    #: ``(since, max_tokens)`` of every request the log at ``log_target`` logged since the server's
    #: startup (None: its request lines do not reach back to one)
    logged_since_start: Sequence[tuple[float, int]] | None = None
    #: per URL of a server on this box, its connections as the kernel counts them
    #: (:class:`vtop.core.requests.conns.ConnTracker`): which answer has streamed longest
    conns: Mapping[str, ConnTracker] = field(default_factory=dict)
    #: per server URL, its requests in flight (:func:`vtop.core.requests.requests_in_flight`): the one
    #: answer the runaway rule and every face read
    in_flight: Mapping[str, ServerRequests] = field(default_factory=dict)

    def history_of(self, url: str) -> LogHistoryView | None:
        """The log's history, when the log is ``url``'s."""
        return self.history if self.history is not None and url == self.log_target else None

    # ------------------------------------------------------------------ reading GPUs and processes

    def gpus_of(self, url: str | None) -> list[int]:
        """The GPUs a server's processes were seen on (now or before)."""
        if url is None:
            return []
        st = self.mem.servers.get(url)
        got = {i for i, owners in self.gpu_owner.items() if url in owners}
        if st is not None:
            got |= st.gpu_idx
        return sorted(got)

    def starting_on(self, idx: int) -> bool:
        """A start is in progress that may use GPU ``idx`` (100 % GPU is normal then)."""
        owners = self.gpu_owner.get(idx, [])
        for url, v in self.servers.items():
            if v.state == "starting" and (url in owners or not owners):
                return True
        snap = self.startup
        if snap is not None and snap.state == "starting":
            tgt = self.log_target
            if tgt is None or not owners or tgt in owners or idx in self.gpus_of(tgt):
                return True
        return False

    def proc_names(self, procs: Iterable[Any] | None) -> list[str]:
        out = []
        for gp in sorted(procs or (), key=lambda p: -(p.used_bytes or 0)):
            out.append(self.name_pid(int(gp.pid), gib(gp.used_bytes)))
        return out

    def name_pid(self, pid: int, extra: str | None = None) -> str:
        """``EngineCore of :8000 (pid 1048, 70.0 GiB)``, or ``pid 4242 (20.0 GiB)`` for a stranger."""
        owner = self.pid_owner.get(pid)
        if owner is None:
            for url, st in self.mem.servers.items():
                if pid in st.gpu_pids:
                    owner = (url, "vLLM process")
                    break
        if owner is None:
            return f"pid {pid}" + (f" ({extra})" if extra else "")
        return f"{owner[1]} of {short_url(owner[0])} (pid {pid}{', ' + extra if extra else ''})"

    def gpu_line(self, idx: int, a: float, b: float) -> str | None:
        """``gpu0: GPU-Util 12 %, SM activity 3 %`` averaged over ``(a, b]``."""
        gs = self.mem.gpus.get(idx)
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

    def xids_near(self, url: str | None, a: float, b: float) -> list[Any]:
        """The XID events (monotonic ``a`` to ``b``) on the GPUs of ``url`` (on any GPU when vtop
        does not know which GPUs it uses, and those NVML could not place)."""
        xs = getattr(self.gpus, "xids", None)
        if not xs:
            return []
        mine = set(self.gpus_of(url))
        return [x for x in xs if a <= x.mono <= b and (not mine or x.gpu is None or x.gpu in mine)]

    def xid_lines(self, url: str | None, a: float, b: float) -> list[str]:
        """Evidence lines naming each XID near the event, with what its number means."""
        out = []
        for x in self.xids_near(url, a, b):
            try:
                at = time.strftime("%H:%M:%S", time.localtime(x.t))
            except (OverflowError, ValueError, OSError):
                at = "?"
            where = f"gpu{x.gpu}" if x.gpu is not None else "a GPU"
            out.append(f"{where}: {xid_text(x.xid)} at {at} (NVML XID event)")
        return out

    def other_procs_lines(self, url: str | None, at: float) -> list[str]:
        """Evidence lines naming the processes that are not this server's on its GPUs (at time ``at``)."""
        st = self.mem.servers.get(url) if url else None
        mine = set(st.gpu_pids) if st is not None else set()
        idxs = self.gpus_of(url) or sorted(self.mem.gpus)
        out = []
        for idx in idxs:
            gs = self.mem.gpus.get(idx)
            p = gs.at(at) if gs is not None else None
            if p is None or p.procs is None:
                continue
            others = [q for q in p.procs if int(q.pid) not in mine and q.used_bytes]
            if others:
                used = float(sum(q.used_bytes for q in others))
                out.append(
                    f"gpu{idx}: other processes hold {gib(used)} of {gib(p.mem_total)}: "
                    + ", ".join(self.proc_names(others))
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

    def check(self, ctx: Ctx) -> list[Alert]: ...


def per_server(ctx: Ctx, fn: Callable[[Ctx, str, ServerView, ServerState], Alert | None]) -> list[Alert]:
    """``fn`` on every server of the tick (with what the diagnoser remembers of it); the alerts it raised."""
    out = []
    for url, v in ctx.servers.items():
        a = fn(ctx, url, v, ctx.mem.servers[url])
        if a is not None:
            out.append(a)
    return out


def per_gpu(ctx: Ctx, fn: Callable[[Ctx, int], Alert | None]) -> list[Alert]:
    """``fn`` on every GPU the diagnoser has points of, in index order; the alerts it raised."""
    out = []
    for idx in sorted(ctx.mem.gpus):
        a = fn(ctx, idx)
        if a is not None:
            out.append(a)
    return out
