"""What the process view (``P``) shows of each process beyond NVML: user, CPU %, host memory,
command line. psutil, as :mod:`vtop.sources.procs`; a process that is gone or denied reads
``None`` fields (a gap), never zeros."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import psutil

T = TypeVar("T")


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    user: str | None
    cpu_pct: float | None
    """Since the previous :meth:`ProcTable.read` of this pid (None at the first)."""
    rss_bytes: int | None
    command: str | None


class ProcTable:
    """Keeps a ``psutil.Process`` per pid so CPU % is measured between two reads."""

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}

    def read(self, pids: set[int]) -> dict[int, ProcInfo]:
        out: dict[int, ProcInfo] = {}
        for pid in list(self._procs):
            if pid not in pids:
                del self._procs[pid]
        for pid in pids:
            p = self._procs.get(pid)
            first = p is None
            try:
                if p is None:
                    p = self._procs[pid] = psutil.Process(pid)
                with p.oneshot():
                    cpu = p.cpu_percent(None)
                    user = _safe(p.username)
                    mem = _safe(p.memory_info)
                    cmd = _safe(p.cmdline)
                out[pid] = ProcInfo(pid, user, None if first else cpu, getattr(mem, "rss", None),
                                    " ".join(cmd) if cmd else None)
            except (psutil.Error, OSError):
                self._procs.pop(pid, None)
                out[pid] = ProcInfo(pid, None, None, None, None)
        return out


def _safe(fn: Callable[[], T]) -> T | None:
    try:
        return fn()
    except (psutil.AccessDenied, OSError):
        return None
