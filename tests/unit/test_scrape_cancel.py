"""A scrape cancelled in the loop iteration where its answer arrives ends, cancelled.

On Python 3.11 ``asyncio.wait_for`` returned the answer and dropped the cancellation
when both came in one iteration (CPython gh-86296). The scrape task of an app being
closed then polled on for ever, and the event loop's close (``_cancel_all_tasks``)
waited for it: a fast-tier test hung in teardown until pytest-timeout killed it.

Each test holds the answer on an Event and, in one synchronous step, lets it go and
cancels the caller: that is the race, made exact. No clock decides anything; GUARD_S
only stops a hang. A poll cancelled half-way also leaves no coroutine it never started."""

from __future__ import annotations

import asyncio
import gc
import warnings
from typing import Any

import pytest

from vtop.clock import SystemClock
from vtop.config import Config
from vtop.monitor.live import LiveFeed
from vtop.monitor.monitor import Monitor
from vtop.sources.http11 import HttpPool, within
from vtop.sources.vllm import VllmScraper

GUARD_S = 30.0  # hang guard only


class HeldClient:
    """Stands for the HttpPool: the first GET waits on ``answer``; every GET after
    ``cancelled_at`` was noted sets ``asked_after``, so a scrape that goes on after
    its cancellation is seen at its next request, with no clock."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.answer = asyncio.Event()
        self.asked_after = asyncio.Event()
        self.cancelled = False
        self.calls = 0

    async def get(self, url: str, **kw: Any) -> tuple[int, bytes]:
        self.calls += 1
        if self.cancelled:
            self.asked_after.set()
        if self.calls == 1:
            self.asked.set()
            await self.answer.wait()
        return 200, b"vllm:num_requests_running 0\n"

    async def aclose(self) -> None:
        pass


async def ended_or_went_on(task: asyncio.Task[Any], client: HeldClient) -> None:
    """Wait until the task ends or makes a request after its cancellation."""
    went_on = asyncio.ensure_future(client.asked_after.wait())
    try:
        await asyncio.wait({task, went_on}, timeout=GUARD_S, return_when=asyncio.FIRST_COMPLETED)
    finally:
        went_on.cancel()
    assert not client.asked_after.is_set(), "the scrape went on polling after it was cancelled"
    assert task.done(), f"hang guard: the task did not end within {GUARD_S:.0f} s"


async def test_a_poll_cancelled_as_its_answer_arrives_is_cancelled() -> None:
    client = HeldClient()
    s = VllmScraper("http://127.0.0.1:9", client=client, clock=SystemClock())  # type: ignore[arg-type]
    task = asyncio.ensure_future(s.poll())
    await asyncio.wait_for(client.asked.wait(), GUARD_S)
    client.answer.set()  # the answer is in ...
    task.cancel()  # ... and the caller is cancelled in the same iteration
    client.cancelled = True
    await ended_or_went_on(task, client)
    assert task.cancelled(), f"the poll returned {task.result()!r} instead of ending cancelled"


async def test_stopping_the_feed_ends_a_scrape_whose_answer_arrives_at_that_moment() -> None:
    # What the app does at exit (on_unmount -> LiveFeed.stop): the scrape task must end.
    url = "http://127.0.0.1:9"
    client = HeldClient()
    feed = LiveFeed(Monitor(Config(urls=(url,), no_gpu=True), find_logs=False), gpu_source=None, discover=None)
    feed._client = client  # type: ignore[assignment]
    feed.start()
    task = feed.tasks[url]
    try:
        await asyncio.wait_for(client.asked.wait(), GUARD_S)
        client.answer.set()
        feed.stop()
        client.cancelled = True
        await ended_or_went_on(task, client)
        assert task.cancelled()
    finally:
        # On the old code the task lives on, and the event loop's close waited for it
        # for ever (the hang seen in CI): cancel it until a cancel lands, so this test
        # fails instead of hanging.
        for _ in range(1000):
            if task.done():
                break
            task.cancel()
            await asyncio.sleep(0)
        await feed.aclose()


async def test_a_connect_cancelled_as_it_completes_is_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    # The connect has its own deadline inside the request: a cancel dropped there let the
    # request (and the scrape) go on just the same.
    opened = asyncio.Event()
    go = asyncio.Event()
    writes: list[bytes] = []

    class Writer:
        def write(self, data: bytes) -> None:
            writes.append(data)

        def close(self) -> None:
            pass

    async def open_connection(*a: Any, **k: Any) -> tuple[asyncio.StreamReader, Any]:
        opened.set()
        await go.wait()
        r = asyncio.StreamReader()
        r.feed_data(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        r.feed_eof()
        return r, Writer()

    monkeypatch.setattr(asyncio, "open_connection", open_connection)
    pool = HttpPool()
    task = asyncio.ensure_future(pool.get("http://127.0.0.1:9/metrics", limit=1000, connect_timeout=GUARD_S))
    await asyncio.wait_for(opened.wait(), GUARD_S)
    go.set()
    task.cancel()
    await asyncio.wait({task}, timeout=GUARD_S)
    assert task.done(), "hang guard"
    assert task.cancelled(), f"the request returned {task.result()!r} instead of ending cancelled"
    assert not writes  # nothing was sent on a connection the caller no longer wanted


async def test_within_cuts_at_its_deadline_and_passes_results_and_errors() -> None:
    never = asyncio.Event()
    with pytest.raises((asyncio.TimeoutError, TimeoutError)):  # one class from 3.11 on
        await within(never.wait(), 0.01)

    async def value() -> int:
        return 7

    async def boom() -> None:
        raise ValueError("x")

    assert await within(value(), GUARD_S) == 7
    with pytest.raises(ValueError):
        await within(boom(), GUARD_S)


async def test_a_poll_cancelled_in_its_first_info_request_leaves_no_coroutine_unawaited() -> None:
    # /health, /v1/models and /version are asked one after another; the ones not reached
    # when the poll is cancelled must not exist as coroutines ("... was never awaited").
    held = asyncio.Event()
    never = asyncio.Event()

    class HealthHeld(HeldClient):
        async def get(self, url: str, **kw: Any) -> tuple[int, bytes]:
            if url.endswith("/health"):
                held.set()
                await never.wait()
            return 200, b"vllm:num_requests_running 0\n"

    s = VllmScraper("http://127.0.0.1:9", client=HealthHeld(), clock=SystemClock())  # type: ignore[arg-type]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        task = asyncio.ensure_future(s.poll())
        await asyncio.wait_for(held.wait(), GUARD_S)
        task.cancel()
        await asyncio.wait({task}, timeout=GUARD_S)
        assert task.cancelled()
        del task
        gc.collect()
    unawaited = [str(w.message) for w in seen if "never awaited" in str(w.message)]
    assert not unawaited
