"""PollLoop threads name themselves to the kernel, so ``top -H`` says which source costs what."""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from vtop.ui.polling import PollLoop, name_this_thread

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="kernel thread names: Linux")


def _comm(tid: int) -> str:
    return Path(f"/proc/self/task/{tid}/comm").read_text().strip()


async def test_a_poll_thread_is_named_after_its_source() -> None:
    seen: dict[str, Any] = {}
    done = asyncio.Event()

    def poll() -> int:
        seen["tid"] = threading.get_native_id()
        seen["comm"] = _comm(seen["tid"])  # read while the thread is alive
        return 1

    loop = PollLoop(None, "gpu", 10.0, poll, lambda r, e: done.set())  # type: ignore[arg-type]
    loop.start()
    try:
        await asyncio.wait_for(done.wait(), 5)
    finally:
        loop.stop()
    assert seen["comm"] == "vtop-gpu"
    assert seen["tid"] != threading.get_native_id()  # not the test's own thread


def test_long_names_are_cut_to_the_kernels_15_bytes_and_nothing_raises() -> None:
    out: dict[str, str] = {}

    def run() -> None:
        name_this_thread("vtop-a-very-long-source-name")
        out["comm"] = _comm(threading.get_native_id())
        name_this_thread("\udcff odd")  # not ASCII: replaced, no exception

    t = threading.Thread(target=run)
    t.start()
    t.join(5)
    assert out["comm"] == "vtop-a-very-lon"
