"""Simulated GPUs' processes have made-up pids (4000 + index): the live feed must not look them up in
this box's process table, where pid 4003 may be any program (a snapshot test broke whenever another
run's vLLM worker happened to hold one of those pids)."""

from __future__ import annotations

import asyncio

from vtop.clock import FakeClock
from vtop.config import Config
from vtop.monitor.live import LiveFeed
from vtop.monitor.monitor import Monitor
from vtop.sources.fake_nvml import FakeGpu, FakeNvml
from vtop.sources.nvml import NvmlSource


class Spy:
    def __init__(self) -> None:
        self.asked: list[int] = []

    def names_for(self, pids, mono):  # type: ignore[no-untyped-def]
        self.asked.extend(pids)
        return {pid: "someone-elses-program" for pid in self.asked}


def _feed(src: NvmlSource) -> tuple[LiveFeed, Spy]:
    clock = FakeClock()
    feed = LiveFeed(Monitor(Config(), clock=clock), gpu_source=src)
    spy = Spy()
    feed._names = spy  # the test's seam: what the feed would ask the process table
    return feed, spy


def test_simulated_gpus_pids_are_not_looked_up() -> None:
    src = NvmlSource(FakeNvml([FakeGpu(), FakeGpu()]))
    feed, spy = _feed(src)
    poll = asyncio.run(feed.poll_gpu_once())
    assert poll is not None and src.simulated
    assert [p.pid for g in poll.gpus for p in (g.procs or ())] == [4000, 4001]
    assert spy.asked == []
    assert feed.monitor.gpu_history is not None


def test_real_bindings_pids_are_looked_up() -> None:
    class RealLike(FakeNvml):
        SIMULATED = False

    feed, spy = _feed(NvmlSource(RealLike([FakeGpu()])))
    asyncio.run(feed.poll_gpu_once())
    assert spy.asked == [4000]
