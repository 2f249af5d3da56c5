"""Names for the PIDs that NVML reports, via psutil.

NVML gives host PIDs. In a container without ``--pid=host`` they do not
resolve; that is said plainly ("pid not visible") rather than raised.
Names are cached per (pid, start time). On Linux the start time is read
straight from ``/proc/PID/stat`` (one small read); psutil is asked only for a
process not seen before. Measured on the 2-core dev VM, 8 GPU processes a
poll: 0.5 ms through ``psutil.Process(pid)`` each time, ~0.1 ms this way.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # psutil ships no type information; with types-psutil installed this ignore is unused (hence its second code).
    import psutil  # type: ignore[import-untyped, unused-ignore]

GONE = "gone"
HIDDEN = "pid not visible"
#: vtop runs in a PID namespace of its own (a container without ``--pid=host``): NVML's PIDs are the
#: host's, and the process of that number here, if any, is another one
UNMAPPED = "host pid, not mappable here"


def short_name(proc: psutil.Process) -> str:
    """vLLM sets process titles like ``VLLM::EngineCore``; prefer them to ``python3``."""
    import psutil  # here: only the GPU poll thread needs it, not the first frame

    try:
        cmd = proc.cmdline()
    except (psutil.AccessDenied, psutil.ZombieProcess):
        cmd = []
    return title_of(cmd) or proc.name()


def title_of(cmd: list[str]) -> str | None:
    """The short name a command line gives (``VLLM::EngineCore``, ``vllm serve``...), or None for its
    process name: :func:`short_name` of a live process, and of a recorded process table (a trace)."""
    if cmd:
        first = cmd[0]
        if first.startswith("VLLM::") or first.startswith("ray::"):
            return first.split()[0]
        if len(cmd) > 1 and cmd[1].endswith("vllm") and len(cmd) > 2 and cmd[2] == "serve":
            return "vllm serve"
        if "vllm.entrypoints" in " ".join(cmd[1:3]):
            return "vllm api_server"
    return None


def _user_of(p: psutil.Process) -> str:
    """`` · bob``: the process's user, or nothing when it cannot be read."""
    import psutil

    try:
        return f" · {p.username()}"
    except (psutil.Error, KeyError):  # KeyError: a uid with no name in /etc/passwd
        return ""


_NO_PROC = object()
_HAVE_PROC = os.path.isdir("/proc/self")


def parse_stat(raw: bytes) -> tuple[str, int, int] | None:
    """``(comm, ppid, start ticks)`` from the text of ``/proc/PID/stat``, or None if it
    is not shaped like it. The comm may hold spaces and parentheses, so the fields
    after it are found from the *last* ``)``. Start ticks (field 22) count from boot:
    with the pid they name one process for good."""
    lp, rp = raw.find(b"("), raw.rfind(b")")
    if lp < 0 or rp < 0:
        return None
    rest = raw[rp + 2 :].split(None, 20)
    try:
        return raw[lp + 1 : rp].decode("utf-8", "replace"), int(rest[1]), int(rest[19])
    except (IndexError, ValueError):
        return None


def stat_cpu_s(raw: bytes, ticks: int) -> float | None:
    """User + system CPU seconds of a process (fields 14 and 15 of ``/proc/PID/stat``, in clock
    ``ticks`` a second), or None if the text is not shaped like it."""
    rp = raw.rfind(b")")
    if rp < 0 or ticks <= 0:
        return None
    rest = raw[rp + 2 :].split(None, 14)
    try:
        return (int(rest[11]) + int(rest[12])) / ticks
    except (IndexError, ValueError):
        return None


def stat_state(raw: bytes) -> str | None:
    """The state letter of a process (field 3 of ``/proc/PID/stat``: R running, S sleeping, D waiting on
    I/O, T stopped by a signal, t stopped by a tracer, Z zombie), or None if the text is not shaped like it."""
    rp = raw.rfind(b")")
    if rp < 0:
        return None
    rest = raw[rp + 2 : rp + 4].decode("ascii", "replace").strip()
    return rest[:1] if rest[:1].isalpha() else None


#: ``PF_KTHREAD`` in the flags of ``/proc/PID/stat`` (field 9; include/linux/sched.h): a kernel thread.
PF_KTHREAD = 0x00200000


def stat_is_kernel_thread(raw: bytes) -> bool:
    """A kernel thread (``kworker``, ``ksoftirqd``, the NVIDIA driver's threads...), by the ``PF_KTHREAD``
    flag of ``/proc/PID/stat``: never a server, never a GPU process, never anyone's parent but another
    kernel thread's. The flag, not a parent PID of 2: inside a PID namespace PID 2 is an ordinary
    process (a container's vLLM, whose engine is then its child). False when the text is not shaped
    like it."""
    rp = raw.rfind(b")")
    if rp < 0:
        return False
    rest = raw[rp + 2 :].split(None, 7)
    try:
        return bool(int(rest[6]) & PF_KTHREAD)
    except (IndexError, ValueError):
        return False


def proc_start(pid: int) -> object:
    """The start ticks of ``pid`` (see :func:`parse_stat`). None when that process is
    not there (gone, or not in our PID namespace); ``_NO_PROC`` when there is no
    readable /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None if _HAVE_PROC else _NO_PROC
    except OSError:  # permissions, or /proc unlike Linux's
        return _NO_PROC
    fields = parse_stat(raw)
    return _NO_PROC if fields is None else fields[2]


class ProcNames:
    #: Seconds :meth:`names_for` reuses its answer while the PIDs stay the same: NVML's
    #: process list, where the GPU processes' PIDs come from, is read this often
    #: (``NvmlSource.SLOW_EVERY_S``).
    REUSE_S = 4.0

    def __init__(self, *, foreign_pids: bool | None = None) -> None:
        self._cache: dict[int, tuple[object, str]] = {}
        self._last: tuple[tuple[int, ...], float, dict[int, str]] | None = None
        #: NVML's PIDs are not this /proc's (vtop in a container); None: found out at the first name
        self.foreign_pids = foreign_pids

    def name(self, pid: int) -> str:
        if self.foreign_pids is None:
            from vtop.sources.containers import in_host_pid_ns

            self.foreign_pids = in_host_pid_ns() is False
        if self.foreign_pids:
            return UNMAPPED
        start = proc_start(pid)
        if start is None:
            self._cache.pop(pid, None)
            return HIDDEN if _in_container() else GONE
        if start is not _NO_PROC:
            hit = self._cache.get(pid)
            if hit and hit[0] == start:
                return hit[1]
        import psutil

        try:
            p = psutil.Process(pid)
            ct = start if start is not _NO_PROC else p.create_time()
        except psutil.NoSuchProcess:
            self._cache.pop(pid, None)
            return HIDDEN if not psutil.pid_exists(pid) and _in_container() else GONE
        except psutil.AccessDenied:
            return HIDDEN
        hit = self._cache.get(pid)
        if hit and hit[0] == ct:
            return hit[1]
        try:
            n = short_name(p)
        except psutil.NoSuchProcess:
            return GONE
        except psutil.AccessDenied:
            n = HIDDEN
        if n != HIDDEN and not n.startswith(("VLLM::", "ray::", "vllm ")):
            n += _user_of(p)  # a stranger on the GPU: whose it is
        self._cache[pid] = (ct, n)
        if len(self._cache) > 4096:
            self._cache.clear()
        return n

    def names(self, pids: list[int]) -> dict[int, str]:
        return {pid: self.name(pid) for pid in pids}

    def names_for(self, pids: Iterable[int], now: float) -> dict[int, str]:
        """:meth:`names` of a poll's GPU processes, reused for the same PIDs for ``REUSE_S``
        (``now``: the poll's monotonic time). A lookup reads /proc/PID/stat for each (a
        process that exited or a PID reused is caught there): with a worker per GPU that
        was 8 file reads a second for a list that changes every 4 s at most."""
        key = tuple(sorted(set(pids)))
        last = self._last
        if last is not None and last[0] == key and 0 <= now - last[1] < self.REUSE_S:
            return last[2]
        out = self.names(list(key)) if key else {}
        self._last = (key, now, out)
        return out


_CONTAINER: bool | None = None


def _in_container() -> bool:
    """PIDs NVML reports but psutil cannot see are usually a container without --pid=host."""
    global _CONTAINER
    if _CONTAINER is None:
        _CONTAINER = os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv")
    return _CONTAINER
