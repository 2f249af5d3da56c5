"""PollLoop threads name themselves to the kernel, so ``top -H`` says which source costs what."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from vtop.monitor.polling import PollLoop
from vtop.threadname import name_this_thread

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

    loop = PollLoop("gpu", 10.0, poll, lambda r, e: done.set())
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


def test_an_at_tick_loop_leaves_one_result_for_the_tick_and_waits_for_it() -> None:
    """The result waits (no wake-up of the UI thread); the thread polls again only once it is
    applied, and then so as to be done before the next tick: nothing is lost, repeated or
    overlapped, and what the tick shows is fresh."""
    starts: list[float] = []
    ends: list[float] = []
    got: list[Any] = []
    polled = threading.Event()

    def poll() -> int:
        starts.append(time.monotonic())
        time.sleep(0.06)  # a poll that takes a while: the next starts early enough for it
        ends.append(time.monotonic())
        polled.set()
        return len(starts)

    interval = 0.6
    loop = PollLoop("gpu", interval, poll, lambda r, e: got.append((r, e)), at_tick=True)
    loop._loop = asyncio.new_event_loop()  # never run: an at-tick loop must not need it
    loop._thread = threading.Thread(target=loop._run, daemon=True)
    loop._thread.start()
    try:
        assert polled.wait(5)
        time.sleep(2 * interval)  # two intervals: it waits for its result to be taken
        assert len(starts) == 1 and got == []
        for n in (1, 2, 3):
            polled.clear()
            assert loop.collect() is True
            assert got[-1] == (n, None) and len(got) == n
            assert loop.collect() is False  # taken once
            assert polled.wait(30)
            # The thread waited before polling again: the interval less twice the poll's
            # own time and 50 ms, so it is done just before the next tick (not at once).
            took = loop.last_duration  # of the poll whose result was just taken
            assert took is not None and took >= 0.06
            assert loop.last_delay == pytest.approx(max(0.0, interval - (0.05 + 2 * took)), abs=1e-9)
        assert loop.polls == 3
    finally:
        loop.stop()
        loop._loop.close()


def test_an_at_tick_loop_whose_poll_is_slow_starts_again_at_once_so_as_not_to_miss_the_next_tick() -> None:
    """A poll that takes 2/3 of the interval (NVML on a slow driver) is started right after its
    result is taken: it still lands before the next tick, so the screen gets one a tick."""
    ends: list[float] = []
    done = threading.Event()

    def poll() -> int:
        time.sleep(0.4)
        ends.append(time.monotonic())
        done.set()
        return len(ends)

    interval = 0.6
    loop = PollLoop("gpu", interval, poll, lambda r, e: None, at_tick=True)
    loop._loop = asyncio.new_event_loop()
    loop._thread = threading.Thread(target=loop._run, daemon=True)
    loop._thread.start()
    try:
        assert done.wait(30)
        for _ in range(2):
            done.clear()
            assert loop.collect() is True
            assert done.wait(30)
            assert loop.last_delay == 0.0  # started again at once: ready for the next tick
    finally:
        loop.stop()
        loop._loop.close()
