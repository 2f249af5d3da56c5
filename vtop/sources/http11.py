"""The HTTP GET behind every scrape: asyncio streams, with h11 doing HTTP/1.1.

vtop's one HTTP client: the scrapes (:meth:`HttpPool.get`) and the ``t`` key's test request
(:meth:`HttpPool.stream`: a streamed POST read as it comes) go through the same pool.

Why not httpx (it was the test request's client until then; for that one key it brought
httpcore, anyio, certifi, idna and sniffio: 201 more modules, 117-134 ms of imports the
first time ``t`` was pressed, measured with ``-X importtime`` on the busy 2-core dev VM):

* **Cost.** A scrape runs once a second per server, forever, on a box that is
  busy serving a model. Measured on the 2-core dev VM against a local server
  (``bench/http_cost.py``): httpx's ``AsyncClient.get`` spends 1.2 ms of CPU on
  a ``/health`` and 3.4-3.8 ms on a 50 KB ``/metrics``; the same requests
  through this module cost 0.3 ms and 1.3 ms. httpx's layers (request and URL
  models, cookies, auth and redirect loops, the connection pool's locks, anyio
  under it all) add ~2 ms a request that a fixed ``GET`` needs none of; with two
  servers that alone was half of vtop's 1 % CPU budget.
* **The protocol is still a library's.** h11 (the HTTP/1.1 state machine httpx
  itself runs on, through httpcore) writes the request and parses the status
  line, headers, ``Content-Length`` and chunked bodies; this module only moves
  bytes and keeps one idle connection per server.

What it does and does not do:

* keep-alive: a connection goes back to the idle list only when h11 says both
  sides finished cleanly; a reused connection that the server had closed
  (uvicorn closes idle ones after 5 s) is retried once on a new one, as
  httpcore does.
* bounded: ``Content-Length`` over the limit is refused before reading, a body
  without one is counted as it comes, and a server that compresses anyway
  (we ask for ``identity``) is inflated with a bound.
* every failure is an :class:`HttpError` with a kind (``refused``, ``dns``,
  ``timeout``, ``reset``, ``too large``, ``garbage``, ``other``); the caller
  bounds the whole request with a deadline (``asyncio.wait_for``), and a
  cancelled request closes its connection.
* no proxies (``HTTP_PROXY`` is ignored: the servers watched are local or
  reached directly, as with ``trust_env=False`` before), no redirects, no
  cookies. ``https://`` works with the system's default certificate checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import ssl
import sys
import zlib
from collections.abc import AsyncIterator, Awaitable, Iterable
from typing import Any, TypeVar
from urllib.parse import urlsplit

__all__ = ["HttpError", "HttpPool", "Streamed", "host_port", "split_url", "within"]

_T = TypeVar("_T")

_READ = 65536


class HttpError(Exception):
    """A request failed. ``kind`` is one of the scraper's error kinds;
    ``got`` counts the body bytes received; ``status`` is set once a status
    line came back."""

    def __init__(self, kind: str, message: str, got: int = 0, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.got = got
        self.status = status


class _Stale(Exception):
    """A reused connection was closed by the server before any answer."""


def split_url(url: str) -> tuple[str, str, int, str]:
    """``(scheme, host, port, target)``; raises ValueError for what we cannot fetch."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ValueError(f"not an http(s) URL: {url!r}")
    host = parts.hostname
    if not host:
        raise ValueError(f"no host in {url!r}")
    port = parts.port or (443 if scheme == "https" else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return scheme, host, port, target


if sys.version_info >= (3, 11):

    async def within(aw: Awaitable[_T], seconds: float) -> _T:
        """``await aw``, cut after ``seconds`` (:class:`TimeoutError`); a cancellation of
        the caller always propagates.

        Not ``asyncio.wait_for``: up to Python 3.11 it runs ``aw`` in a task of its own
        and, when the caller is cancelled in the loop iteration where that task finishes,
        returns the result and drops the cancellation (CPython gh-86296; 3.12 rebuilt
        wait_for on ``asyncio.timeout``). Seen here: the app's exit (LiveFeed.stop) and
        then the event loop's close (``_cancel_all_tasks``) cancelled a scrape task just
        as an answer came; it polled on (a closed port, every 5 s: the back-off) and the
        close waited for it for ever (a UI test hung in teardown on a loaded CI box;
        tests/unit/test_scrape_cancel.py makes the race exact). ``asyncio.timeout``
        awaits ``aw`` in the caller's own task, with no task in between (also one task
        less per request), and tells its own cancel from another one by counting them.
        """
        async with asyncio.timeout(seconds):
            return await aw

else:  # Python 3.10 has no asyncio.timeout; its wait_for keeps the race above

    async def within(aw: Awaitable[_T], seconds: float) -> _T:
        """``asyncio.wait_for`` (see the 3.11+ definition for why not there)."""
        return await asyncio.wait_for(aw, seconds)


class _Conn:
    __slots__ = ("reader", "writer", "proto")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        import h11  # imported with the first connection: 20 ms the first frame need not wait for

        self.reader = reader
        self.writer = writer
        self.proto = h11.Connection(h11.CLIENT)

    def close(self) -> None:
        try:
            self.writer.close()
        except Exception:  # noqa: BLE001 - closing a broken socket
            pass


class HttpPool:
    """GET over kept-alive HTTP/1.1 connections, at most ``max_idle`` idle per server.

    One instance serves every scraper of an app (one event loop). Requests to
    the same server may run at once: each takes its own connection.
    """

    def __init__(self, *, max_idle: int = 2, ssl_context: ssl.SSLContext | None = None) -> None:
        self.max_idle = max_idle
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}
        self._ssl: ssl.SSLContext | None = ssl_context
        """``https://``: the system's default checks, unless a context (a private CA) is given."""
        self.connects = 0
        """TCP connections opened so far (tests and the benchmark read it)."""

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for c in conns:
                c.close()
        self._idle.clear()

    async def get(
        self,
        url: str,
        *,
        headers: Iterable[tuple[str, str]] = (),
        limit: int,
        connect_timeout: float = 1.0,
    ) -> tuple[int, bytes]:
        """``(status, body)``. Raises :class:`HttpError`; cancellation propagates."""
        try:
            scheme, host, port, target = split_url(url)
        except ValueError as exc:
            raise HttpError("other", str(exc)) from exc
        origin = (scheme, host, port)
        hdrs = [("Host", host if port in (80, 443) else f"{host}:{port}"), *headers]
        idle = self._idle.get(origin)
        conn = idle.pop() if idle else None
        if conn is not None:
            try:
                return await self._exchange(origin, conn, target, hdrs, limit)
            except _Stale:
                pass  # the server closed it while idle: once more on a new connection
        conn = await self._connect(scheme, host, port, connect_timeout)
        try:
            return await self._exchange(origin, conn, target, hdrs, limit)
        except _Stale as exc:
            raise HttpError("reset", f"{host_port(host, port)} closed the connection without answering") from exc

    async def _connect(self, scheme: str, host: str, port: int, timeout: float) -> _Conn:
        ctx = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            ctx = self._ssl
        try:
            reader, writer = await within(
                asyncio.open_connection(host, port, ssl=ctx, server_hostname=host if ctx else None, limit=_READ),
                timeout)
        except (asyncio.TimeoutError, TimeoutError) as exc:
            raise HttpError("timeout", f"no connection to {host_port(host, port)} within {timeout:.1f} s") from exc
        except socket.gaierror as exc:
            raise HttpError("dns", f"cannot resolve {host!r} (DNS)") from exc
        except ssl.SSLError as exc:
            raise HttpError("other", f"TLS with {host_port(host, port)} failed: {exc.reason or exc}") from exc
        except OSError as exc:
            if _refused(exc):
                raise HttpError("refused", f"nothing listens on {host_port(host, port)} (connection refused)") from exc
            raise HttpError("other", f"cannot connect to {host_port(host, port)}: {exc.strerror or exc}") from exc
        self.connects += 1
        return _Conn(reader, writer)

    async def _exchange(
        self, origin: tuple[str, str, int], conn: _Conn, target: str, headers: list[tuple[str, str]], limit: int,
    ) -> tuple[int, bytes]:
        """One request on ``conn``; gives the connection back or closes it."""
        import h11

        keep = False
        try:
            status, body = await self._request(conn, target, headers, limit, origin)
            p = conn.proto
            if p.our_state is h11.DONE and p.their_state is h11.DONE:
                p.start_next_cycle()
                keep = True
            return status, body
        finally:
            if keep:
                idle = self._idle.setdefault(origin, [])
                if len(idle) < self.max_idle:
                    idle.append(conn)
                else:
                    conn.close()
            else:
                conn.close()

    async def _request(
        self, conn: _Conn, target: str, headers: list[tuple[str, str]], limit: int, origin: tuple[str, str, int],
    ) -> tuple[int, bytes]:
        import h11

        p = conn.proto
        hp = host_port(origin[1], origin[2])
        try:
            conn.writer.write(p.send(h11.Request(method="GET", target=target, headers=headers))
                              + p.send(h11.EndOfMessage()))
        except (ConnectionError, RuntimeError) as exc:
            raise _Stale() from exc
        status: int | None = None
        got = 0
        dec = None
        enc = ""
        buf = bytearray()
        answered = False
        try:
            while True:
                try:
                    ev = p.next_event()
                except h11.RemoteProtocolError as exc:
                    if status is None:
                        raise HttpError("other", f"{hp} did not answer in HTTP ({exc})") from exc
                    raise HttpError("reset", f"{hp} dropped the connection before the answer was complete",
                                    got, status) from exc
                if ev is h11.NEED_DATA:
                    try:
                        data = await conn.reader.read(_READ)
                    except (ConnectionError, OSError) as exc:
                        if not answered:
                            raise _Stale() from exc
                        raise HttpError("reset", f"{hp} dropped the connection before the answer was complete",
                                        got, status) from exc
                    if not data and not answered:
                        raise _Stale()
                    answered = True
                    p.receive_data(data)  # b"" is the end of the stream
                    continue
                if isinstance(ev, h11.InformationalResponse):
                    continue
                if isinstance(ev, h11.Response):
                    status = ev.status_code
                    for k, v in ev.headers:
                        if k == b"content-length" and v.isdigit() and int(v) > limit:
                            raise HttpError("too large",
                                            f"announced {_mib(int(v))}; not reading more than {_mib(limit)}",
                                            int(v), status)
                        if k == b"content-encoding":
                            enc = v.decode("latin-1").strip().lower()
                    if enc in ("gzip", "x-gzip", "deflate"):
                        dec = zlib.decompressobj(47 if enc != "deflate" else 15)
                    continue
                if isinstance(ev, h11.Data):
                    chunk = bytes(ev.data)
                    got += len(chunk)
                    if dec is not None:
                        try:
                            chunk = dec.decompress(chunk, limit - len(buf) + 1)
                        except zlib.error as exc:
                            raise HttpError("garbage", f"broken {enc} body", got, status) from exc
                        if dec.unconsumed_tail:
                            chunk += b"x"  # more than the limit is waiting
                    if len(buf) + len(chunk) > limit:
                        raise HttpError("too large", f"sent more than {_mib(limit)}; stopped reading", got, status)
                    buf += chunk
                    continue
                if isinstance(ev, h11.EndOfMessage):
                    assert status is not None
                    return status, bytes(buf)
                # ConnectionClosed before the end, or PAUSED (never for a client GET)
                raise HttpError("reset", f"{hp} dropped the connection before the answer was complete", got, status)
        except BaseException:
            # Nothing read may outlive a failed request. The exception keeps this frame alive,
            # and under asyncio.wait_for (the scraper's deadline) it sits in a reference cycle
            # (wait_for's frame -> its task -> the exception -> the traceback -> wait_for's
            # frame) that only the garbage collector frees: with the body still bound here,
            # every scrape refused as too large kept its 16 MiB until then (vtop at 0.25 s
            # against a close-delimited 64 MiB /metrics: 1.26 GB RSS within 30 s).
            buf = bytearray()
            chunk = data = b""
            raise


    @contextlib.asynccontextmanager
    async def stream(
        self,
        method: str,
        url: str,
        *,
        headers: Iterable[tuple[str, str]] = (),
        body: bytes = b"",
        connect_timeout: float = 5.0,
    ) -> AsyncIterator[Streamed]:
        """One request on a new connection whose answer is read as it comes::

            async with pool.stream("POST", url, headers=..., body=...) as r:
                r.status; async for line in r.lines(): ...

        Yields once the status line and headers are in. Raises :class:`HttpError`
        (``refused``, ``dns``, ``timeout`` (connecting), ``reset``, ``other``); the caller
        bounds the whole exchange with its deadline (a cancelled one closes the
        connection). A new connection, never an idle one: a POST is not retried, and a
        reused connection the server closed while idle would fail it. Kept for the
        scrapes afterwards only when the answer was read to its end. No
        ``Content-Encoding`` is undone here (``identity`` is asked for)."""
        import h11

        try:
            scheme, host, port, target = split_url(url)
        except ValueError as exc:
            raise HttpError("other", str(exc)) from exc
        origin = (scheme, host, port)
        hp = host_port(host, port)
        hdrs = [("Host", host if port in (80, 443) else f"{host}:{port}"), *headers]
        if body or method.upper() in ("POST", "PUT", "PATCH"):
            hdrs.append(("Content-Length", str(len(body))))
        conn = await self._connect(scheme, host, port, connect_timeout)
        keep = False
        try:
            p = conn.proto
            try:
                out = p.send(h11.Request(method=method, target=target, headers=hdrs))
                if body:
                    out += p.send(h11.Data(data=body))
                conn.writer.write(out + p.send(h11.EndOfMessage()))
            except (ConnectionError, RuntimeError) as exc:
                raise HttpError("reset", f"{hp} closed the connection before the request was sent") from exc
            r = Streamed(conn, hp)
            while True:
                ev = await r._event()
                if isinstance(ev, h11.InformationalResponse):
                    continue
                if isinstance(ev, h11.Response):
                    r.status = ev.status_code
                    r.headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in ev.headers]
                    break
                raise HttpError("reset", f"{hp} closed the connection without answering")
            yield r
            if r.done and p.our_state is h11.DONE and p.their_state is h11.DONE:
                p.start_next_cycle()
                keep = True
        finally:
            idle = self._idle.setdefault(origin, []) if keep else None
            if idle is not None and len(idle) < self.max_idle:
                idle.append(conn)
            else:
                conn.close()


class Streamed:
    """The answer of :meth:`HttpPool.stream`: ``status``, ``headers`` (lower-case names),
    and its body as it comes: :meth:`chunks`, :meth:`lines` or :meth:`read`."""

    def __init__(self, conn: _Conn, hp: str) -> None:
        self._conn = conn
        self._hp = hp
        self.status: int | None = None
        self.headers: list[tuple[str, str]] = []
        self.got = 0
        """body bytes received so far"""
        self.done = False
        """the body was read to its end"""

    async def _event(self) -> Any:
        import h11

        p = self._conn.proto
        while True:
            try:
                ev = p.next_event()
            except h11.RemoteProtocolError as exc:
                if self.status is None:
                    raise HttpError("other", f"{self._hp} did not answer in HTTP ({exc})") from exc
                raise HttpError("reset", f"{self._hp} dropped the connection before the answer was complete",
                                self.got, self.status) from exc
            if ev is not h11.NEED_DATA:
                return ev
            try:
                data = await self._conn.reader.read(_READ)
            except (ConnectionError, OSError) as exc:
                raise HttpError("reset", f"{self._hp} dropped the connection"
                                + (" before the answer was complete" if self.status is not None else
                                   " without answering"), self.got, self.status) from exc
            p.receive_data(data)  # b"" is the end of the stream

    async def next_chunk(self) -> bytes | None:
        """The next piece of the body; None at its end. Raises :class:`HttpError`."""
        import h11

        if self.done:
            return None
        while True:
            ev = await self._event()
            if isinstance(ev, h11.Data):
                self.got += len(ev.data)
                return bytes(ev.data)
            if isinstance(ev, h11.EndOfMessage):
                self.done = True
                return None
            raise HttpError("reset", f"{self._hp} dropped the connection before the answer was complete",
                            self.got, self.status)

    async def chunks(self) -> AsyncIterator[bytes]:
        while (chunk := await self.next_chunk()) is not None:
            yield chunk

    async def read(self, limit: int) -> bytes:
        """The body, or its first ``limit`` bytes (the rest is not read)."""
        buf = bytearray()
        while len(buf) < limit and (chunk := await self.next_chunk()) is not None:
            buf += chunk
        return bytes(buf[:limit])

    async def lines(self) -> AsyncIterator[str]:
        """The body's lines (LF or CRLF), decoded as UTF-8 (bad bytes replaced), without
        their ends; a last line without an end comes too."""
        buf = b""
        while (chunk := await self.next_chunk()) is not None:
            buf += chunk
            *whole, buf = buf.split(b"\n")
            for ln in whole:
                yield ln.rstrip(b"\r").decode("utf-8", "replace")
        if buf:
            yield buf.rstrip(b"\r").decode("utf-8", "replace")


def _refused(exc: OSError) -> bool:
    if isinstance(exc, ConnectionRefusedError) or exc.errno == errno.ECONNREFUSED:
        return True
    # "localhost" tries ::1 then 127.0.0.1; when all fail asyncio raises one
    # OSError("Multiple exceptions: ...") without an errno.
    return "refused" in str(exc).lower() or "[errno 111]" in str(exc).lower()


def host_port(host: str, port: int) -> str:
    """``host:port`` as a person writes it (``[::1]:8000`` for IPv6)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.0f} MiB" if n >= 1024 * 1024 else f"{n} bytes"
