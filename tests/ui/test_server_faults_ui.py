"""The app keeps answering keys while a server is slow, errors, or talks garbage.

No test here times anything. A hung server holds its answer on an Event until the
test has seen the key's effect, so what is checked is "the key was handled while the
scrape was still hung", not "the key was handled in under N s" (latency is bench/'s).
Waits are for events; GUARD_S only stops a hang and never decides a healthy run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from vtop.config import Config
from vtop.ui.app import VtopApp
from vtop.ui.widgets.gpu_panel import GpuPanel

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

GUARD_S = 30.0  # hang guard only: a healthy run, however loaded the box, never gets near it


async def respond(w: asyncio.StreamWriter, status: int, body: bytes, ctype: str = "text/plain") -> None:
    w.write(f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode() + body)
    await w.drain()
    w.close()


async def until(pilot, cond: Callable[[], object], what: str) -> None:  # type: ignore[no-untyped-def]
    """Wait for ``cond()`` (an event, not a duration); fail only past the hang guard."""
    loop = asyncio.get_running_loop()
    end = loop.time() + GUARD_S
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"hang guard: {what} did not happen within {GUARD_S:.0f} s")
        await pilot.pause(0.05)


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, dict[str, Handler]]]:
    routes: dict[str, Handler] = {}

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            line = await r.readline()
            while (await r.readline()).strip():
                pass
            path = line.split()[1].decode() if line.split() else "/"
            h = routes.get(path.split("?")[0])
            if h is None:
                await respond(w, 404, b"not found")
            else:
                await h(r, w)
        except (ConnectionError, asyncio.CancelledError):
            pass

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    async with srv:
        yield f"http://127.0.0.1:{port}", routes
        srv.close()


class Hang:
    """A /metrics handler that holds every request until ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.asked = asyncio.Event()  # a request reached the server and is being held
        self.held: list[asyncio.StreamReader] = []

    async def __call__(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.held.append(r)
        self.asked.set()
        await self.release.wait()
        await respond(w, 200, b"")


@pytest.mark.parametrize("fault", ["slow", "http500", "html", "garbage"])
async def test_keys_answer_while_the_server_misbehaves(server, fault: str) -> None:  # type: ignore[no-untyped-def]
    # Proves: with a scrape held by the server ("slow") or after bad answers, a key still
    # takes effect, and the card then says what is wrong in one line (no traceback).
    url, routes = server
    hang = Hang()
    bodies = {
        "http500": (500, b"Internal Server Error", "text/plain"),
        "html": (200, b"<!DOCTYPE html><html><body>login</body></html>", "text/html"),
        "garbage": (200, bytes(range(256)) * 20, "text/plain"),
    }
    answered = asyncio.Event()  # at least one bad answer went out

    async def fixed(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await respond(w, *bodies[fault])
        answered.set()

    routes["/metrics"] = hang if fault == "slow" else fixed
    app = VtopApp(Config(urls=(url,), no_gpu=True, interval=0.5), hostname="t")
    async with app.run_test(size=(100, 30)) as pilot:
        try:
            # the fault has happened: a scrape is held right now, or a bad answer was read
            await until(pilot, (hang.asked if fault == "slow" else answered).is_set, "a /metrics request")
            await pilot.press("c")
            await until(pilot, lambda: app.query_one(GpuPanel).compact, "the c key's effect")
            if fault == "slow":
                assert not hang.release.is_set()  # the key's effect came with the scrape still held
            entry = app.monitor.servers[url]
            await until(pilot, lambda: entry.last_view is not None, "a view of the server")
            v = entry.last_view
            assert v is not None
            want = {"slow": "stale", "http500": "stale", "html": "not vllm", "garbage": "not vllm"}[fault]
            if fault == "slow":
                # the held scrape is given up at the scraper's deadline, and said so
                await until(pilot, lambda: entry.last_view.last_error is not None, "the scrape giving up")
                v = entry.last_view
                assert v.state in ("stale", "starting", "down") and v.last_error == "timeout"
            else:
                assert v.state == want, (v.state, v.message)
            text = app.cards[entry.url].render().plain
            assert text and "Traceback" not in text
            assert v.message and "\n" not in v.message
        finally:
            hang.release.set()  # before the app is closed: it may be waiting on the held scrape


async def test_a_key_is_handled_while_a_scrape_is_still_hung(server, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    # Proves: the key is handled while the hung scrape is still waiting on the server. Its
    # deadline is stretched far past the hang guard, so a key queued behind the scrape
    # could only be handled after the guard fails the test; the client's side of the held
    # connection is checked to be still open when the key's effect is seen.
    from vtop.sources import vllm

    monkeypatch.setattr(vllm, "DEFAULT_TIMEOUT", vllm.Timeout(connect=1.0, read=20 * GUARD_S))
    url, routes = server
    hang = Hang()
    routes["/metrics"] = hang
    app = VtopApp(Config(urls=(url,), no_gpu=True, interval=0.5), hostname="t")
    async with app.run_test(size=(100, 30)) as pilot:
        try:
            await until(pilot, hang.asked.is_set, "a /metrics request")
            await pilot.press("c")
            await until(pilot, lambda: app.query_one(GpuPanel).compact, "the c key's effect")
            assert not hang.release.is_set() and hang.held
            assert not hang.held[0].at_eof()  # the scraper is still waiting for this answer
        finally:
            hang.release.set()  # before the app is closed: it may be waiting on the held scrape
