"""A played trace's connections, mirrored as real loopback connections to the play's port.

A trace recorded with ``conns.jsonl.gz`` (``tests/corpus/FORMAT.md``) holds, each second, the
kernel's counters of every connection to the server's port: when the request it carries arrived
(``last_recv_s``) and how many bytes of the answer the client acknowledged (``bytes_acked``).
vtop reads those counters from this box's kernel (:mod:`vtop.sources.sockets`), so a live doctor
run against :class:`tests.corpus.serve_trace.TraceServer` needs the same connections to exist
here. :class:`ConnMirror` makes them, in the server's event loop, second by second:

* a recorded connection that appears is a real client connection to the play's port; its first
  bytes (``MIRROR <n> HTTP/1.1`` and a blank line) are its request, which the TraceServer hands
  back here instead of answering (:meth:`ConnMirror.adopt`): the server's side of it is then a
  socket of the play's port, as the recorded one was of the server's;
* a new request on a kept-alive connection (its arrival moved by more than a second) is one
  more blank-line-terminated line from the client;
* the answer: the bytes the recorded client acknowledged since the previous row (capped at
  :data:`MAX_SEND` a row) are written by the server's side, and the client reads them all;
* a connection that is gone from a row is closed from both ends.

What it cannot do: a connection whose request arrived before the play started is opened (and its
request sent) when the play starts, so its age is counted from there (``tests.corpus.live_doctor``
starts a play with connections early enough to hold the incident's request); times are those of the
one-second rows (a request sent between two rows is mirrored at the second row, up to a second late).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: the most a row's answer writes (a streamed runaway on the H200 sent ~45 KB a second)
MAX_SEND = 256 * 1024
#: a request arrival that moved this much is a new request on the connection
NEW_REQUEST_S = 1.0
MIRROR = "MIRROR"


def load_rows(trace: Path, origin_mono: float) -> list[tuple[float, list[dict[str, Any]]]]:
    """``(trace second, connections)`` of each row of ``conns.jsonl.gz`` (empty when absent)."""
    p = trace / "conns.jsonl.gz"
    if not p.exists():
        return []
    out = []
    with gzip.open(p, "rt", encoding="utf-8") as f:
        for line in f:
            try:
                r = json.loads(line)
                out.append((float(r["mono"]) - origin_mono, [c for c in r.get("conns") or () if isinstance(c, dict)]))
            except (ValueError, KeyError, TypeError):
                continue
    out.sort(key=lambda x: x[0])
    return out


@dataclass
class _Mirrored:
    n: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    arrival: float | None
    acked: int | None
    drain: asyncio.Task[None] | None = None
    server: asyncio.StreamWriter | None = None
    owed: int = 0
    got: int = 0
    ready: asyncio.Event = field(default_factory=asyncio.Event)


class ConnMirror:
    def __init__(self, rows: list[tuple[float, list[dict[str, Any]]]], host: str, port: int) -> None:
        self.rows = rows
        self.host, self.port = host, port
        self._i = 0
        self._n = 0
        self._live: dict[tuple[str, str], _Mirrored] = {}
        self._by_n: dict[int, _Mirrored] = {}
        #: connections opened, requests sent, answer bytes written (tests)
        self.opened = self.requests = self.sent = 0

    def adopt(self, token: str, writer: asyncio.StreamWriter) -> bool:
        """The TraceServer got ``MIRROR <token>``: the server's side of a mirrored connection."""
        try:
            m = self._by_n.get(int(token))
        except ValueError:
            return False
        if m is None:
            return False
        m.server = writer
        if m.owed:
            self._write(m, m.owed)
            m.owed = 0
        m.ready.set()
        return True

    async def apply(self, off: float) -> None:
        """Mirror every row recorded up to trace second ``off``."""
        while self._i < len(self.rows) and self.rows[self._i][0] <= off:
            o, conns = self.rows[self._i]
            self._i += 1
            if self._i < len(self.rows) and self.rows[self._i][0] <= off:
                # the play started after this row: only the latest row before it is mirrored
                # (connections gone by then never open)
                continue
            await self._row(o, conns)

    async def _row(self, o: float, conns: list[dict[str, Any]]) -> None:
        seen = set()
        for c in conns:
            key = (str(c.get("local")), str(c.get("remote")))
            seen.add(key)
            recv, acked = c.get("last_recv_s"), c.get("bytes_acked")
            arrival = o - float(recv) if isinstance(recv, (int, float)) else None
            acked = int(acked) if isinstance(acked, (int, float)) else None
            m = self._live.get(key)
            if m is None:
                m = await self._open(arrival, acked)
                if m is not None:
                    self._live[key] = m
                continue
            if arrival is not None and m.arrival is not None and abs(arrival - m.arrival) > NEW_REQUEST_S:
                m.arrival = arrival
                self._request(m)
            if acked is not None and m.acked is not None and acked > m.acked:
                self._send(m, min(MAX_SEND, acked - m.acked))
            elif acked is None and isinstance(c.get("last_sent_s"), (int, float)) and c["last_sent_s"] < 1.0:
                self._send(m, 100)
            m.acked = acked
        for key in [k for k in self._live if k not in seen]:
            self._close(self._live.pop(key))

    async def _open(self, arrival: float | None, acked: int | None) -> _Mirrored | None:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), 2.0)
        except (OSError, asyncio.TimeoutError):
            return None  # the port refuses (the trace's server was down then)
        self._n += 1
        m = _Mirrored(self._n, reader, writer, arrival, acked)
        self._by_n[m.n] = m
        m.drain = asyncio.get_running_loop().create_task(self._drain(m))
        writer.write(f"{MIRROR} {m.n} HTTP/1.1\r\n\r\n".encode())
        self.opened += 1
        self.requests += 1
        return m

    def _request(self, m: _Mirrored) -> None:
        with contextlib.suppress(Exception):
            m.writer.write(b"R\r\n\r\n")
            self.requests += 1

    def _send(self, m: _Mirrored, n: int) -> None:
        if m.server is None:
            m.owed += n
            return
        self._write(m, n)

    def _write(self, m: _Mirrored, n: int) -> None:
        assert m.server is not None
        with contextlib.suppress(Exception):
            m.server.write(b"x" * n)
            self.sent += n

    async def _drain(self, m: _Mirrored) -> None:
        with contextlib.suppress(Exception):
            while True:
                data = await m.reader.read(1 << 16)
                if not data:
                    return
                m.got += len(data)

    def _close(self, m: _Mirrored) -> None:
        self._by_n.pop(m.n, None)
        for w in (m.writer, m.server):
            if w is not None:
                with contextlib.suppress(Exception):
                    w.transport.abort()
        if m.drain is not None:
            m.drain.cancel()

    def stop(self) -> None:
        for m in list(self._live.values()):
            self._close(m)
        self._live.clear()
