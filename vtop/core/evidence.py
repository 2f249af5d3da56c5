"""What the rules are given each tick: :class:`Evidence`, everything vtop holds at one moment,
typed. The monitor builds one per round (``Monitor.evidence``) from what it holds: the servers'
views (their histories and latest poll, the process discovery found), the GPU history (with its
XID events), the followed log (:class:`LogEvidence`: the phase snapshot, its stall and silence,
its recent lines, the requests it shows in flight, its stats lines of the last minutes) and the
kernel's counters of each local server's connections. Plain and frozen: a rule reads it, never
writes it; what the diagnoser remembers between ticks is its own
(:class:`vtop.core.rules.context.Memory`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from vtop.model.procs import ServerProcess

if TYPE_CHECKING:
    # Names for the annotations only: the log's modules (its request parser and its some hundred
    # patterns, the stats history, the memory budget, the start history) load where a log is read,
    # not with the rules (a ``vtop --once`` without a log never needs them: issue 43).
    from vtop.core.download import DownloadProgress
    from vtop.core.gpu_history import GpuHistory
    from vtop.core.loghistory import LogHistoryView
    from vtop.core.membudget import MemoryBudget
    from vtop.core.phases.types import LogLine, Quiet, StallInfo, StartupSnapshot
    from vtop.core.requests.conns import ConnTracker
    from vtop.core.requests.log import InFlight
    from vtop.core.server import ServerView
    from vtop.core.start_history import StartUsual
    from vtop.model.gpu import XidEvent

__all__ = ["Evidence", "LogEvidence", "role_of"]


@dataclass(frozen=True)
class LogEvidence:
    """The followed vLLM log at one moment (one log: it belongs to one server, ``target``)."""

    #: the URL of the server whose process writes the log (None: not known, e.g. no server watched)
    target: str | None
    #: the startup tracker's snapshot of the current start
    snapshot: StartupSnapshot | None = None
    #: the start silent past the ceiling (``--stall-threshold``)
    stall: StallInfo | None = None
    #: a start in progress: how long the log has been silent, what its progress says
    quiet: Quiet | None = None
    #: the tracker's recent lines, oldest first
    lines: Sequence[LogLine] = ()
    #: the requests the log shows in flight, oldest first
    inflight: Sequence[InFlight] = ()
    #: the log has request lines at all (vLLM runs with request logging); None: not known
    request_logging: bool | None = None
    #: the log says when requests end (V0, or --enable-log-outputs): its open entries are in flight
    finishes_logged: bool = False
    #: the log's stats lines of the last minutes, on the monitor's clock: what came before vtop looked
    history: LogHistoryView | None = None
    #: ``(since, max_tokens)`` of every request logged since the server's startup (None: the request
    #: lines do not reach back to one)
    logged_since_start: Sequence[tuple[float, int]] | None = None
    #: what this start's phases usually take on this box (:mod:`vtop.core.start_history`); None: no
    #: earlier start of it kept
    usual: StartUsual | None = None


@dataclass(frozen=True)
class Evidence:
    """Everything one tick sees. ``now`` is the monotonic time of the tick (the clock of the views
    and the GPU polls). Pass every server on every tick: one missing from ``servers`` is forgotten."""

    now: float
    servers: Mapping[str, ServerView] = field(default_factory=dict)
    gpus: GpuHistory | None = None
    log: LogEvidence | None = None
    #: per URL of a server on this box, its connections as the kernel counts them
    conns: Mapping[str, ConnTracker] = field(default_factory=dict)
    #: the Hub download of the start at ``log_target`` (:mod:`vtop.core.download`), while one is watched
    download: DownloadProgress | None = None
    #: the wall clock of the tick (what a process's ``create_time`` is on); None: not known
    wall: float | None = None
    #: GPU-holding pid -> its name as the GPU poll read it (``python3 · bob``; empty: not known)
    proc_names: Mapping[int, str] = field(default_factory=dict)

    # ------------------------------------------------------------------ the log

    @property
    def log_target(self) -> str | None:
        """The server the log belongs to (the only server when the log does not say)."""
        if self.log is not None and self.log.target is not None:
            return self.log.target
        return next(iter(self.servers)) if len(self.servers) == 1 else None

    @property
    def startup(self) -> StartupSnapshot | None:
        return self.log.snapshot if self.log is not None else None

    @property
    def stall(self) -> StallInfo | None:
        return self.log.stall if self.log is not None else None

    @property
    def quiet(self) -> Quiet | None:
        return self.log.quiet if self.log is not None else None

    @property
    def usual(self) -> StartUsual | None:
        return self.log.usual if self.log is not None else None

    @property
    def log_lines(self) -> Sequence[LogLine]:
        return self.log.lines if self.log is not None else ()

    @property
    def history(self) -> LogHistoryView | None:
        return self.log.history if self.log is not None else None

    @property
    def logged_since_start(self) -> Sequence[tuple[float, int]] | None:
        return self.log.logged_since_start if self.log is not None else None

    def history_of(self, url: str) -> LogHistoryView | None:
        """The log's stats lines, when the log is ``url``'s."""
        return self.history if url == self.log_target else None

    def requests_of(self, url: str) -> Sequence[InFlight]:
        """The requests ``url``'s log shows in flight (empty: none, or no log of it)."""
        return self.log.inflight if self.log is not None and url == self.log_target else ()

    def request_logging_of(self, url: str) -> bool | None:
        """Whether ``url``'s log has request lines (None: no log of it, or not known)."""
        return self.log.request_logging if self.log is not None and url == self.log_target else None

    # ------------------------------------------------------------------ processes and GPUs

    def process_of(self, url: str | None) -> ServerProcess | None:
        """The vLLM process discovery found for ``url`` (None: none, or not known)."""
        v = self.servers.get(url) if url is not None else None
        p = v.process if v is not None else None
        return p if isinstance(p, ServerProcess) else None

    @cached_property
    def pid_owner(self) -> dict[int, tuple[str, str]]:
        """GPU-holding pid -> (server URL, its role: ``EngineCore``, ``Worker_TP0``, ``vLLM``)."""
        out: dict[int, tuple[str, str]] = {}
        for url in self.servers:
            proc = self.process_of(url)
            if proc is not None:
                for pid in proc.gpu_pids:
                    out[int(pid)] = (url, role_of(proc, int(pid)))
        return out

    @cached_property
    def gpu_owner(self) -> dict[int, list[str]]:
        """GPU index -> the server URLs with a process on it now (by the GPUs' last samples)."""
        out: dict[int, list[str]] = {}
        if self.gpus is None:
            return out
        owners = self.pid_owner
        for idx, tr in self.gpus.tracks.items():
            last = tr.last
            if last is None or last.lost:
                continue
            for gp in last.procs or ():
                owner = owners.get(int(gp.pid))
                if owner is not None and owner[0] not in out.setdefault(idx, []):
                    out[idx].append(owner[0])
        return out

    @cached_property
    def memory_budget(self) -> list[MemoryBudget]:
        """The followed start's GPU memory budget, per GPU (:func:`vtop.core.membudget.memory_budget`), computed
        once for this tick: what the startup-failure rule's fix quotes and the monitor's faces show."""
        from vtop.core.membudget import memory_budget

        return memory_budget(self)

    @property
    def xids(self) -> Sequence[XidEvent]:
        return tuple(self.gpus.xids) if self.gpus is not None else ()


def role_of(proc: ServerProcess, pid: int) -> str:
    """What pid ``pid`` of a server's tree is, in a word (``EngineCore``, ``Worker_TP0``; ``vLLM``)."""
    for c in proc.children:
        if c.pid == pid:
            title = (c.title or "").replace("VLLM::", "").strip()
            return title.split()[0] if title else c.role
    return "vLLM"
