"""A thread's kernel name, so that ``top -H``, ``ps -L`` and ``/proc/PID/task/TID/comm`` say which of
vtop's threads costs what (Python's own thread names stay inside Python). A leaf: every layer may use it."""

from __future__ import annotations

import sys


def name_this_thread(name: str) -> None:
    """Give the calling thread a kernel name (Linux: 15 bytes, seen by ``top -H``,
    ``ps -L`` and ``/proc/PID/task/TID/comm``). Best effort: never raises."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, name.encode("ascii", "replace")[:15], 0, 0, 0)  # 15 = PR_SET_NAME
    except Exception:  # noqa: BLE001 - a name is a nicety
        pass
