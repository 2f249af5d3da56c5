"""The scrape's HTTP/1.1 client against real sockets on 127.0.0.1: keep-alive,
a server that closes idle connections, chunked and compressed bodies, answers
that are not HTTP, and refusal on a name that resolves to two addresses.
(The scraper's fault tests in ``test_vllm_source.py`` go through it too.)"""

from __future__ import annotations

import asyncio
import gc
import gzip
import socket
import tracemalloc
from collections.abc import AsyncIterator

import pytest

from vtop.sources.http11 import HttpError, HttpPool, split_url

BODY = b"vllm:num_requests_running 3.0\n" * 2000  # 60 KB, several reads


class KeepAliveServer:
    """Answers every request on a connection until told otherwise; counts
    connections and requests. ``mode`` picks the answer."""

    def __init__(self) -> None:
        self.mode = "length"
        self.connections = 0
        self.requests: list[str] = []
        self.close_after_each = False
        self.writers: list[asyncio.StreamWriter] = []
        self.partial_sent = asyncio.Event()
        self.release = asyncio.Event()
        self.port = 0
        self._srv: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        self._srv = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self._srv.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _conn(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(w)
        try:
            while True:
                line = await r.readline()
                if not line:
                    return
                while (await r.readline()) not in (b"\r\n", b""):
                    pass
                self.requests.append(line.decode().split()[1])
                if self.mode == "length":
                    w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)
                elif self.mode == "chunked":
                    w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    for i in range(0, len(BODY), 7000):
                        part = BODY[i:i + 7000]
                        w.write(b"%x\r\n" % len(part) + part + b"\r\n")
                        await w.drain()
                    w.write(b"0\r\n\r\n")
                elif self.mode == "gzip":
                    z = gzip.compress(BODY)
                    w.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(z) + z)
                elif self.mode == "bomb":
                    z = gzip.compress(b"\0" * (64 * 1024 * 1024))  # 64 MiB in ~64 KB
                    w.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(z) + z)
                elif self.mode == "partial":
                    w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY[:1000])
                    await w.drain()
                    self.partial_sent.set()
                    await self.release.wait()
                    w.write(BODY[1000:])
                elif self.mode == "ssh":
                    w.write(b"SSH-2.0-OpenSSH_9.6\r\n")
                    await w.drain()
                    w.close()
                    return
                await w.drain()
                if self.close_after_each:
                    w.close()
                    return
        except (ConnectionError, asyncio.CancelledError):
            pass

    async def stop(self) -> None:
        assert self._srv is not None
        self._srv.close()
        for w in self.writers:
            w.close()


@pytest.fixture
async def srv() -> AsyncIterator[KeepAliveServer]:
    s = KeepAliveServer()
    await s.start()
    yield s
    await s.stop()


@pytest.fixture
async def pool() -> AsyncIterator[HttpPool]:
    p = HttpPool()
    yield p
    await p.aclose()


async def test_keep_alive_reuses_one_connection(srv: KeepAliveServer, pool: HttpPool) -> None:
    for path in ("/metrics", "/health", "/metrics", "/v1/models?x=1"):
        status, body = await pool.get(srv.url + path, limit=1 << 20)
        assert status == 200 and body == BODY
    assert srv.connections == 1 and pool.connects == 1
    assert srv.requests == ["/metrics", "/health", "/metrics", "/v1/models?x=1"]


async def test_server_closing_idle_connection_is_retried_once(srv: KeepAliveServer, pool: HttpPool) -> None:
    await pool.get(srv.url + "/metrics", limit=1 << 20)
    for w in srv.writers:  # uvicorn closes idle keep-alive connections after 5 s
        w.close()
    for w in srv.writers:  # closed on the server's side (an event, not "after 50 ms")
        await asyncio.wait_for(w.wait_closed(), 30)
    status, body = await pool.get(srv.url + "/metrics", limit=1 << 20)
    assert status == 200 and body == BODY
    assert srv.connections == 2


async def test_connection_close_answers_are_not_reused(srv: KeepAliveServer, pool: HttpPool) -> None:
    srv.close_after_each = True
    for _ in range(3):
        assert (await pool.get(srv.url + "/metrics", limit=1 << 20))[1] == BODY
    assert srv.connections == 3


async def test_chunked_body(srv: KeepAliveServer, pool: HttpPool) -> None:
    srv.mode = "chunked"
    assert await pool.get(srv.url + "/metrics", limit=1 << 20) == (200, BODY)
    assert await pool.get(srv.url + "/metrics", limit=1 << 20) == (200, BODY)
    assert srv.connections == 1


async def test_chunked_body_over_the_limit(srv: KeepAliveServer, pool: HttpPool) -> None:
    srv.mode = "chunked"
    with pytest.raises(HttpError) as e:
        await pool.get(srv.url + "/metrics", limit=10_000)
    assert e.value.kind == "too large" and e.value.status == 200


async def test_a_close_delimited_body_over_the_limit_is_cut_and_not_kept(pool: HttpPool) -> None:
    # Proves (#25 item 5): a body without Content-Length, ended by the server closing, is
    # cut at the limit ("too large") as a Content-Length one is refused, and the error keeps
    # none of it. The caller holds the error (for its message), and under asyncio.wait_for
    # it lived on in a reference cycle: the bytes read were bound in the reader's frame,
    # which the error's traceback keeps.
    total = 32 * 1024 * 1024
    piece = b"vllm:num_requests_running 3.0\n" * 32768  # ~1 MiB, made before the count starts
    written: list[int] = []

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        n = 0
        try:
            while (await r.readline()) not in (b"\r\n", b""):
                pass
            w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n")
            while n < total:
                w.write(piece)
                await w.drain()
                n += len(piece)
        except ConnectionError:
            pass
        finally:
            written.append(n)
            w.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}/metrics"
    limit = 4 * 1024 * 1024
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        with pytest.raises(HttpError) as e:
            await asyncio.wait_for(pool.get(url, limit=limit), 30)
        for _ in range(500):  # the server's handler sees the hang-up (its buffers go with it)
            if written:
                break
            await asyncio.sleep(0.01)
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
        gc.enable()
        srv.close()
    assert e.value.kind == "too large" and e.value.status == 200
    assert "sent more than 4 MiB; stopped reading" in e.value.message
    assert limit < e.value.got <= limit + 256 * 1024  # read up to the limit, then stopped
    assert written and written[0] < total  # the server could not send it all: never read to the end
    assert held < 1024 * 1024, f"{held / 2**20:.1f} MiB held by the error"


async def test_gzip_is_inflated_and_a_bomb_is_bounded(srv: KeepAliveServer, pool: HttpPool) -> None:
    srv.mode = "gzip"
    assert await pool.get(srv.url + "/metrics", limit=1 << 20) == (200, BODY)
    srv.mode = "bomb"
    with pytest.raises(HttpError) as e:
        await pool.get(srv.url + "/metrics", limit=1 << 20)
    assert e.value.kind == "too large"


async def test_not_http(srv: KeepAliveServer, pool: HttpPool) -> None:
    srv.mode = "ssh"
    with pytest.raises(HttpError) as e:
        await pool.get(srv.url + "/metrics", limit=1 << 20)
    assert e.value.kind == "other" and "did not answer in HTTP" in e.value.message


async def test_refused_on_localhost_with_two_addresses(pool: HttpPool) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(HttpError) as e:
        await pool.get(f"http://localhost:{port}/metrics", limit=1000)
    assert e.value.kind == "refused", e.value.message
    assert f"localhost:{port}" in e.value.message


async def test_cancelled_request_does_not_leave_a_half_read_connection(srv: KeepAliveServer, pool: HttpPool) -> None:
    import h11

    srv.mode = "partial"
    conns: list = []  # type: ignore[type-arg]
    connect = pool._connect

    async def spy(*a, **k):  # type: ignore[no-untyped-def]
        conns.append(await connect(*a, **k))
        return conns[-1]

    pool._connect = spy  # type: ignore[method-assign]
    task = asyncio.ensure_future(pool.get(srv.url + "/metrics", limit=1 << 20))
    await asyncio.wait_for(srv.partial_sent.wait(), 30)
    # the client has read the answer's head and now waits for the rest of the body (an
    # event seen in its parser's state, not "after 50 ms"); 30 s is a hang guard only
    loop = asyncio.get_running_loop()
    end = loop.time() + 30
    while not (conns and conns[0].proto.their_state is h11.SEND_BODY):
        assert loop.time() < end, "hang guard: the client never read the answer's head"
        await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    srv.release.set()
    srv.mode = "length"
    assert await pool.get(srv.url + "/metrics", limit=1 << 20) == (200, BODY)
    assert srv.connections == 2  # the half-read connection was closed, not reused


def test_split_url() -> None:
    assert split_url("http://h:8000") == ("http", "h", 8000, "/")
    assert split_url("https://h/metrics?a=1") == ("https", "h", 443, "/metrics?a=1")
    assert split_url("http://[::1]:9/x") == ("http", "::1", 9, "/x")
    with pytest.raises(ValueError):
        split_url("ftp://h/")
    with pytest.raises(ValueError):
        split_url("http:///nohost")


async def test_https_with_an_untrusted_certificate_says_so(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import shutil
    import ssl
    import subprocess

    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed")
    key, crt = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(crt),
                    "-days", "1", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True, timeout=60)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(crt), str(key))

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            await r.readline()
        except (ConnectionError, ssl.SSLError):
            pass
        w.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    port = srv.sockets[0].getsockname()[1]
    pool = HttpPool()
    try:
        with pytest.raises(HttpError) as e:
            await asyncio.wait_for(pool.get(f"https://127.0.0.1:{port}/metrics", limit=1000), 10)
        assert e.value.kind == "other" and "TLS" in e.value.message and f"127.0.0.1:{port}" in e.value.message
    finally:
        srv.close()
        await pool.aclose()


class StreamServer:
    """Reads a request with its ``Content-Length`` body, answers a chunked SSE stream whose
    chunks cut lines (and a UTF-8 character) in two, and keeps the connection for more."""

    SSE = 'data: {"text": "h\u00e9llo"}\r\n\r\ndata: {"text": "w\u00f6rld"}\r\n\r\ndata: [DONE]\r\n\r\n'.encode()

    def __init__(self) -> None:
        self.connections = 0
        self.got: list[tuple[str, dict[str, str], bytes]] = []
        self._srv: asyncio.base_events.Server | None = None
        self.url = ""

    async def start(self) -> None:
        self._srv = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._srv.sockets[0].getsockname()[1]}"

    async def _conn(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                hdrs = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                body = await r.readexactly(int(hdrs.get("content-length", "0")))
                self.got.append((lines[0], hdrs, body))
                w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
                cut = self.SSE.index("\u00e9".encode()) + 1  # inside the two bytes of the é
                for part in (self.SSE[:5], self.SSE[5:cut], self.SSE[cut:]):
                    w.write(b"%x\r\n" % len(part) + part + b"\r\n")
                    await w.drain()
                w.write(b"0\r\n\r\n")
                await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()

    async def stop(self) -> None:
        assert self._srv is not None
        self._srv.close()


@pytest.fixture
async def sse() -> AsyncIterator[StreamServer]:
    s = StreamServer()
    await s.start()
    yield s
    await s.stop()


async def test_stream_posts_the_body_and_reads_lines_across_chunks(sse: StreamServer, pool: HttpPool) -> None:
    # The test request's path: a POST with a JSON body, its answer read line by line as it
    # comes, lines and a UTF-8 character cut by the chunks; read to its end, the connection
    # serves the next request.
    body = b'{"model": "m", "max_tokens": 4}'
    async with pool.stream("POST", sse.url + "/v1/completions", headers=[("Content-Type", "application/json")],
                           body=body) as r:
        assert r.status == 200 and ("content-type", "text/event-stream") in r.headers
        lines = [ln async for ln in r.lines()]
    assert lines == ['data: {"text": "h\u00e9llo"}', "", 'data: {"text": "w\u00f6rld"}', "", "data: [DONE]", ""]
    (start, hdrs, got), = sse.got
    assert start == "POST /v1/completions HTTP/1.1" and got == body
    assert hdrs["content-length"] == str(len(body)) and hdrs["content-type"] == "application/json"
    # (a stream always opens its own connection; a scrape takes the idle one it left)
    assert await pool.get(sse.url + "/metrics", limit=1 << 20) == (200, StreamServer.SSE)
    assert sse.connections == 1 and pool.connects == 1


async def test_stream_left_before_its_end_closes_its_connection(sse: StreamServer, pool: HttpPool) -> None:
    async with pool.stream("POST", sse.url + "/v1/completions", body=b"{}") as r:
        async for _line in r.lines():
            break  # the caller stops reading (a deadline, a [DONE] before the end)
    async with pool.stream("POST", sse.url + "/v1/completions", body=b"{}") as r:
        assert (await r.read(8)) == StreamServer.SSE[:8]
    assert sse.connections == 2 and pool.connects == 2


async def test_stream_refused(pool: HttpPool) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(HttpError) as ei:
        async with pool.stream("POST", f"http://127.0.0.1:{port}/v1/completions", body=b"{}"):
            pass
    assert ei.value.kind == "refused"
