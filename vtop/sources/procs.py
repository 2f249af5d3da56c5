"""Names for the PIDs that NVML reports, via psutil.

NVML gives host PIDs. In a container without ``--pid=host`` they do not
resolve; that is said plainly ("pid not visible") rather than raised.
Names are cached per (pid, create time), so a poll costs one dict lookup per
process after the first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

GONE = "gone"
HIDDEN = "pid not visible"


def short_name(proc: psutil.Process) -> str:
    """vLLM sets process titles like ``VLLM::EngineCore``; prefer them to ``python3``."""
    import psutil  # here: only the GPU poll thread needs it, not the first frame

    try:
        cmd = proc.cmdline()
    except (psutil.AccessDenied, psutil.ZombieProcess):
        cmd = []
    if cmd:
        first = cmd[0]
        if first.startswith("VLLM::") or first.startswith("ray::"):
            return first.split()[0]
        if len(cmd) > 1 and cmd[1].endswith("vllm") and len(cmd) > 2 and cmd[2] == "serve":
            return "vllm serve"
        if "vllm.entrypoints" in " ".join(cmd[1:3]):
            return "vllm api_server"
    return proc.name()


class ProcNames:
    def __init__(self) -> None:
        self._cache: dict[int, tuple[float, str]] = {}

    def name(self, pid: int) -> str:
        import psutil

        try:
            p = psutil.Process(pid)
            ct = p.create_time()
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
        self._cache[pid] = (ct, n)
        if len(self._cache) > 4096:
            self._cache.clear()
        return n

    def names(self, pids: list[int]) -> dict[int, str]:
        return {pid: self.name(pid) for pid in pids}


_CONTAINER: bool | None = None


def _in_container() -> bool:
    """PIDs NVML reports but psutil cannot see are usually a container without --pid=host."""
    global _CONTAINER
    if _CONTAINER is None:
        import os

        _CONTAINER = os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv")
    return _CONTAINER
