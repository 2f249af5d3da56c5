"""The app keeps answering keys while a server is slow, errors, or talks garbage."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from vtop.config import Config
from vtop.ui.app import VtopApp
from vtop.ui.widgets.gpu_panel import GpuPanel

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def respond(w: asyncio.StreamWriter, status: int, body: bytes, ctype: str = "text/plain") -> None:
    w.write(f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode() + body)
    await w.drain()
    w.close()


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


@pytest.mark.parametrize("fault", ["slow", "http500", "html", "garbage"])
async def test_keys_answer_while_the_server_misbehaves(server, fault: str) -> None:  # type: ignore[no-untyped-def]
    url, routes = server

    async def slow(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await asyncio.sleep(5)
        await respond(w, 200, b"")

    bodies = {
        "http500": (500, b"Internal Server Error", "text/plain"),
        "html": (200, b"<!DOCTYPE html><html><body>login</body></html>", "text/html"),
        "garbage": (200, bytes(range(256)) * 20, "text/plain"),
    }

    async def fixed(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await respond(w, *bodies[fault])

    routes["/metrics"] = slow if fault == "slow" else fixed
    app = VtopApp(Config(urls=(url,), no_gpu=True, interval=0.5), hostname="t")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause(1.5)
        t0 = time.monotonic()
        await pilot.press("c")
        assert time.monotonic() - t0 < 0.5  # a key is handled at once
        assert app.query_one(GpuPanel).compact
        entry = app.servers.entries[url]
        deadline = time.monotonic() + 8
        while entry.last_view is None and time.monotonic() < deadline:
            await pilot.pause(0.2)
        v = entry.last_view
        assert v is not None
        want = {"slow": "stale", "http500": "stale", "html": "not vllm", "garbage": "not vllm"}[fault]
        if fault == "slow":
            assert v.state in ("stale", "starting", "down") and v.last_error == "timeout"
        else:
            assert v.state == want, (v.state, v.message)
        text = entry.card.render().plain
        assert text and "Traceback" not in text
        assert v.message and "\n" not in v.message
