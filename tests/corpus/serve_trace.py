"""Play one corpus trace LIVE, in real time, as the server it was recorded from.

    python -m tests.corpus.serve_trace TRACE_DIR [--from S | --before-alert S] [--port P] [--log PATH]

A trace (``tests/corpus/FORMAT.md``) says what the box answered second by second. This
serves it again on ``127.0.0.1`` (a free port unless ``--port``), so that the real
``vtop``/``vtop doctor`` can be pointed at it with ``URL --log LOGFILE`` while the incident
unfolds at its own pace:

* ``/metrics``, ``/health``, ``/version``, ``/v1/models`` answer what the trace recorded at
  that second (the latest row at or before it): the status and the body. As on vLLM,
  ``/metrics`` ignores a query and ``/metrics/?name[]=...`` (prometheus_client's app, which
  vLLM mounts beside it) keeps only the samples named, with their families' HELP/TYPE lines:
  vtop's restricted scrapes read histograms every few polls, as they do from the real server.
* A second whose ``/metrics`` row says ``refused`` is a port that refuses: the listening
  socket is closed (the port stays bound but not listening, so a connect gets a reset,
  ECONNREFUSED) and open keep-alive connections are dropped. An endpoint whose own row says
  ``refused``/an error while the port is open drops that connection without an answer; a
  ``timeout`` holds the request :data:`HOLD_S` seconds (past vtop's 3 s deadline) and drops it.
* The log: a file (``--log``, default a new temporary one) that grows with exactly the
  recorded bytes, as ``log-index.jsonl.gz`` says, second by second. Its modification time is
  when its last byte was written in the recording (moved to now, as the stamps are): the
  backlog written at once at the start keeps the age of its last write.

Time: trace second 0 is the recorder's first ``launch`` event. ``--from S`` starts the play
S seconds after it; ``--before-alert S`` starts it S seconds before the truth's
``should_alert_by``. What the log held before that point is written at once (as on a box
where the server has been running), then the play goes on in real time and stops at the
trace's end (its ``end`` event, else its last row): the port is closed, the log left as is.

What this CANNOT replay, so a run against it differs from the recorded box:

* the process table, unless ``procs=True`` (``--procs``): then stand-in processes mirror the
  recorded tree, its titles and whether each process's CPU time moved
  (:mod:`tests.corpus.standin`; not its pids, start times, memory or GPUs). Without it there
  is no vLLM process behind the port: vtop's process scan finds none for this URL (no pid, no
  CPU time of the tree). Either way it may see other vLLM servers really running on this box;
* the connections to the server's port, unless ``conns=True`` and the trace has
  ``conns.jsonl.gz``: then real loopback connections mirror them (:mod:`tests.corpus.connmirror`:
  each request's arrival and the answer's bytes, a second at a time);
* the GPU (the corpus is from CPU servers; NVML answers whatever this box has);
* time below one second: every file has one row a second, so an answer changes on the
  row's second, and the recorded scrape latency (``dt``) is not reproduced;
* the ``/metrics`` families the corpus dropped (``"dropped"``) stay missing;
* other endpoints (``/v1/completions``, ``/load``, ...) answer 404.

Module API (for tests)::

    srv = TraceServer("tests/corpus/traces/runaway-with-short-traffic", start_at=60.0)
    srv.start()              # srv.url, srv.log_path, srv.offset(), srv.end_offset
    ...
    srv.wait_end(timeout)    # True once the trace's end was played
    srv.stop()

``clock`` (a zero-argument function of seconds, default ``time.monotonic``) can be injected:
the offset is ``start_at + clock() - clock_at_start``; :meth:`TraceServer.settle` applies the
current offset (port state, log) at once instead of waiting for the next tick.
:class:`TraceTimeline` is the pure part: what is answered, and the log's size, at a trace second.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

HOST = "127.0.0.1"
#: how long a recorded ``timeout`` holds the request (vtop gives up after connect 1 s + read 2 s)
HOLD_S = 5.0
#: seconds between two applications of the play's state (port open/closed, log size)
TICK_S = 0.1
MAX_HEAD_BYTES = 64 * 1024
PROM_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a (gzipped or plain) JSONL file; none when it is absent; damaged lines skipped
    (vtop's own recording reader, as vtop/sources/recording/trace.py reads a trace)."""
    from vtop.sources.recording.record import read

    return list(read(path)) if path.exists() else []


@dataclass(frozen=True)
class Answer:
    """What one request gets: ``kind`` is ``ok`` (``status`` and ``body``), ``refused``/``reset``
    (the connection dropped at once) or ``timeout`` (held, then dropped)."""

    kind: str
    status: int | None = None
    body: bytes = b""
    content_type: str = "application/json"


NOT_FOUND = Answer("ok", 404, b'{"detail":"Not Found"}')


class _Series:
    """Rows keyed by their trace second; :meth:`at` is the latest at or before a second."""

    def __init__(self, rows: list[tuple[float, dict[str, Any]]]) -> None:
        rows = sorted(rows, key=lambda r: r[0])
        self.offs = [o for o, _ in rows]
        self.rows = [r for _, r in rows]

    def at(self, off: float) -> dict[str, Any] | None:
        i = bisect_right(self.offs, off)
        return self.rows[i - 1] if i else None

    def first(self) -> dict[str, Any] | None:
        return self.rows[0] if self.rows else None

    def __len__(self) -> int:
        return len(self.rows)


class TraceTimeline:
    """A trace as a function of the trace second (seconds after its first ``launch``)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        p = Path(path)
        self.path = p
        self.truth: dict[str, Any] = json.loads((p / "truth.json").read_text())
        self.name = str(self.truth.get("name") or p.name)
        events = _rows(p / "events.jsonl")
        metrics = _rows(p / "metrics.jsonl.gz")
        launch = next((e for e in events if e.get("what") == "launch" and "mono" in e), None)
        if launch is not None:
            self.origin_mono, self.origin_t = float(launch["mono"]), float(launch["t"])
        elif metrics:  # no events: the first scrape is second 0
            self.origin_mono, self.origin_t = float(metrics[0]["mono"]), float(metrics[0]["t"])
        else:
            raise ValueError(f"{p}: neither a launch event nor a /metrics row to start from")

        def series(rows: list[dict[str, Any]]) -> _Series:
            out = []
            for r in rows:
                try:
                    out.append((float(r["mono"]) - self.origin_mono, r))
                except (KeyError, TypeError, ValueError):
                    continue
            return _Series(out)

        self.metrics = series(metrics)
        self.health = series(_rows(p / "health.jsonl.gz"))
        self.info = series(_rows(p / "info.jsonl.gz"))
        self.log_index = series(_rows(p / "log-index.jsonl.gz"))
        self.events = [(float(e["mono"]) - self.origin_mono, e) for e in events if "mono" in e]
        log = p / "log.bin.gz"
        self.log_bytes = gzip.decompress(log.read_bytes()) if log.exists() else b""
        end = next((o for o, e in self.events if e.get("what") == "end"), None)
        if end is None:
            ends = [s.offs[-1] for s in (self.metrics, self.health, self.log_index) if s.offs]
            end = max(ends) if ends else 0.0
        self.end = float(end)

    # -- the truth's times as trace seconds --

    def offset_of(self, wall: float | None) -> float | None:
        """A wall time of the recording box (the truth's ``began``, ...) as a trace second."""
        return None if wall is None else float(wall) - self.origin_t

    @property
    def should_alert_by(self) -> float | None:
        return self.offset_of(self.truth.get("should_alert_by"))

    @property
    def began(self) -> float | None:
        return self.offset_of(self.truth.get("began"))

    @property
    def ended(self) -> float | None:
        return self.offset_of(self.truth.get("ended"))

    # -- what is served --

    def port_open(self, off: float) -> bool:
        """The port listens at this second unless its ``/metrics`` row says it refused (or none came yet)."""
        r = self.metrics.at(off)
        return r is not None and not (r.get("status") is None and r.get("error") == "refused")

    def log_written_at(self, size: int) -> float | None:
        """The trace second by which the log had reached ``size`` bytes (the first index row at
        or past it: its bytes were written in the second before, so this is at or after the
        write), or None when no row has."""
        for o, r in zip(self.log_index.offs, self.log_index.rows):
            try:
                if int(r["size"]) >= size:
                    return o
            except (KeyError, TypeError, ValueError):
                continue
        return None

    def log_size(self, off: float) -> int:
        r = self.log_index.at(off)
        try:
            return min(int(r["size"]), len(self.log_bytes)) if r is not None else 0
        except (KeyError, TypeError, ValueError):
            return 0

    @staticmethod
    def _failed(r: dict[str, Any] | None) -> Answer | None:
        if r is None:
            return Answer("refused")
        if r.get("status") is None:
            err = str(r.get("error") or "refused")
            return Answer("timeout" if err == "timeout" else ("refused" if err == "refused" else "reset"))
        return None

    def answer(self, path: str, off: float, shift_s: float = 0.0) -> Answer:
        """The answer to ``GET path`` at trace second ``off`` (time stamps moved by ``shift_s``)."""
        if not self.port_open(off):
            return Answer("refused")
        route = path.split("?", 1)[0].rstrip("/") or "/"
        if route == "/metrics":
            r = self.metrics.at(off)
            bad = self._failed(r)
            if bad is not None or r is None:
                return bad or Answer("refused")
            text = str(r.get("text") or "")
            target, _, query = path.partition("?")
            names = parse_qs(query).get("name[]")
            if target.endswith("/metrics/") and names and int(r["status"]) == 200:
                text = restrict(text, set(names))
            if shift_s:
                text = _START_TIME.sub(lambda m: f"{m.group(1)}{float(m.group(2)) + shift_s!r}", text)
            return Answer("ok", int(r["status"]), text.encode(), PROM_TYPE)
        if route == "/health":
            r = self.health.at(off)
            bad = self._failed(r)
            if bad is not None or r is None:
                return bad or Answer("refused")
            return Answer("ok", int(r["status"]), b"")
        if route in ("/version", "/v1/models"):
            r = self.info.at(off) or self.info.first()
            if r is None:
                return NOT_FOUND
            if route == "/version":
                if not r.get("version"):
                    return NOT_FOUND
                return Answer("ok", 200, json.dumps({"version": r["version"]}).encode())
            if not isinstance(r.get("models"), dict):
                return NOT_FOUND
            return Answer("ok", 200, json.dumps(r["models"]).encode())
        return NOT_FOUND


def restrict(text: str, names: set[str]) -> str:
    """The exposition ``text`` with only the samples named, as vLLM's prometheus_client app answers
    ``?name[]=``: vtop's own :func:`vtop.sources.vllm.restrict_exposition` (the trace replay's too)."""
    from vtop.sources.vllm import restrict_exposition

    return restrict_exposition(text, names)


#: vLLM's log stamp after the level: "INFO 12-02 02:13:58 [" (the recording box's local time)
_STAMP = re.compile(rb"(?m)((?:^|\r)(?:\([^)\n]*\) )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) )(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?= \[)")
_START_TIME = re.compile(r"(?m)^(process_start_time_seconds(?:\{[^}]*\})? )(\S+)")


def shift_stamps(data: bytes, shift_s: float) -> bytes:
    """``data`` with every vLLM log stamp moved by ``shift_s`` seconds (same length: the stamps keep
    their format; the year is the one now, as the stamp carries none)."""
    if not shift_s:
        return data
    import datetime as _dt

    year = _dt.datetime.now().year

    def move(m: re.Match[bytes]) -> bytes:
        mon, day, hh, mi, ss = (int(m.group(i)) for i in range(2, 7))
        try:
            t = _dt.datetime(year, mon, day, hh, mi, ss) + _dt.timedelta(seconds=shift_s)
        except ValueError:
            return m.group(0)
        return m.group(1) + t.strftime("%m-%d %H:%M:%S").encode()

    return _STAMP.sub(move, data)
_REASONS = {200: "OK", 404: "Not Found", 500: "Internal Server Error", 503: "Service Unavailable"}


class TraceServer:
    """The trace served live; see the module doc. Not restartable: one play per instance."""

    def __init__(
        self,
        trace: str | os.PathLike[str] | TraceTimeline,
        *,
        start_at: float = 0.0,
        log_path: str | os.PathLike[str] | None = None,
        port: int = 0,
        clock: Callable[[], float] = time.monotonic,
        hold_s: float = HOLD_S,
        tick_s: float = TICK_S,
        shift_time: bool = True,
        wall: Callable[[], float] = time.time,
        procs: bool = False,
        conns: bool = False,
        log_for_vtop: bool | None = None,
    ) -> None:
        self.timeline = trace if isinstance(trace, TraceTimeline) else TraceTimeline(trace)
        #: the server's log reachable by vtop: the stand-in API server's stdout is the log file (as
        #: vLLM's is); False: a pipe no one reads (vLLM's stdout under a supervisor, issue 49). None:
        #: as the trace's truth says (``log_for_vtop``, true when absent)
        self.log_for_vtop = (self.timeline.truth.get("log_for_vtop") is not False) if log_for_vtop is None \
            else log_for_vtop
        #: mirror the recorded connections to the server's port (:mod:`tests.corpus.connmirror`), when asked
        self.conns = conns
        self._conn_mirror: Any = None
        #: stand-in processes for the recorded process tree (:mod:`tests.corpus.standin`), when asked
        self.procs = procs
        self._mirror: Any = None
        self.shift_time = shift_time
        self.wall = wall
        #: seconds added to every time stamp served (0 until start(), or with shift_time=False)
        self.shift_s = 0.0
        self._log_data = self.timeline.log_bytes
        self.start_at = max(0.0, float(start_at))
        self.clock = clock
        self.hold_s = hold_s
        self.tick_s = tick_s
        self._tmpdir: str | None = None
        if log_path is None:
            self._tmpdir = tempfile.mkdtemp(prefix=f"trace-{self.timeline.name}-")
            log_path = Path(self._tmpdir) / "vllm.log"
        self.log_path = Path(log_path)
        # the port: reserved by a bound socket that listens only while the trace's port did
        self._reserve: socket.socket | None = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._reserve.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._reserve.bind((HOST, port))
        self.port: int = int(self._reserve.getsockname()[1])
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._t0: float | None = None
        self._written = 0
        self._log_f: Any = None
        self._ended = threading.Event()
        self._stopping = False
        self._apply_lock: asyncio.Lock | None = None
        #: requests answered, by route (tests, the CLI's summary)
        self.served: dict[str, int] = {}

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def end_offset(self) -> float:
        return self.timeline.end

    def offset(self) -> float:
        """The trace second being played now."""
        if self._t0 is None:
            return self.start_at
        return self.start_at + (self.clock() - self._t0)

    # -- lifecycle --

    def start(self) -> TraceServer:
        if self._thread is not None:
            raise RuntimeError("already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_f = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self._t0 = self.clock()
        # A live incident's log and /metrics carry the time of now; a trace recorded hours ago
        # carries its own. Played as it was, vtop's log history (which maps the log's
        # "MM-DD HH:MM:SS" stamps onto its clock) took the stats lines for hours old and judged
        # nothing by them. So the play is moved to now: every stamp and process_start_time_seconds
        # by the same whole seconds (byte lengths unchanged: log-index.jsonl's sizes still hold).
        if self.shift_time:
            self.shift_s = float(round(self.wall() - (self.timeline.origin_t + self.start_at)))
        # moved once, whole (a second's write may end inside a line)
        self._log_data = shift_stamps(self.timeline.log_bytes, self.shift_s)
        if self.procs:
            from tests.corpus.standin import ProcMirror

            url = str((self.timeline.truth.get("server") or {}).get("url") or "")
            port = url.rsplit(":", 1)[-1] if url.count(":") >= 2 else None
            mirror = ProcMirror(self.timeline.path, self.timeline.origin_mono, port, self.port,
                                self.log_path if self.log_for_vtop else None)
            self._mirror = mirror if mirror.available else None
            if self._mirror is None:
                mirror.stop()
        if self.conns:
            from tests.corpus.connmirror import ConnMirror, load_rows

            rows = load_rows(self.timeline.path, self.timeline.origin_mono)
            self._conn_mirror = ConnMirror(rows, HOST, self.port) if rows else None
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True,
                                        name=f"serve-trace-{self.timeline.name}")
        self._thread.start()
        ready.wait(30)
        self.settle()
        return self

    def _run(self, ready: threading.Event) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(ready.set)
        ticker = self._loop.create_task(self._tick_forever())
        try:
            self._loop.run_forever()
        finally:
            ticker.cancel()
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(asyncio.gather(ticker, return_exceptions=True))
            self._loop.close()

    def settle(self, timeout: float = 10.0) -> None:
        """Apply the current offset now (port open or closed, the log's bytes) and return when done."""
        if self._loop is None or self._stopping:
            return
        fut = asyncio.run_coroutine_threadsafe(self._apply(), self._loop)
        fut.result(timeout)

    def wait_end(self, timeout: float | None = None) -> bool:
        """Wait until the trace's end has been played (True) or ``timeout`` passed (False)."""
        return self._ended.wait(timeout)

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    def stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        loop = self._loop
        if loop is not None and self._thread is not None:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._close_port(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(10)
        if self._reserve is not None:
            self._reserve.close()
            self._reserve = None
        if self._mirror is not None:
            self._mirror.stop()
        if self._log_f is not None:
            self._log_f.close()
            self._log_f = None
        self._ended.set()

    def cleanup(self) -> None:
        """Stop, and remove the temporary log folder if this server made one."""
        self.stop()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def __enter__(self) -> TraceServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    # -- the play --

    async def _tick_forever(self) -> None:
        while True:
            await self._apply()
            if self._ended.is_set():
                return
            await asyncio.sleep(self.tick_s)

    async def _apply(self) -> None:
        if self._apply_lock is None:
            self._apply_lock = asyncio.Lock()
        async with self._apply_lock:  # the ticker and settle() must not open the port twice
            await self._apply_now()

    async def _apply_now(self) -> None:
        if self._ended.is_set():
            return
        off = self.offset()
        tl = self.timeline
        self._write_log(tl.log_size(min(off, tl.end)))
        if self._mirror is not None:
            if off >= tl.end:
                self._mirror.stop()  # the end of the trace: the server is gone
                self._mirror = None
            else:
                self._mirror.apply(off)
        if off >= tl.end:
            await self._close_port()
            self._ended.set()
            return
        want = tl.port_open(off)
        if want and self._server is None:
            await self._open_port()
        elif not want and self._server is not None:
            await self._close_port()
        if self._conn_mirror is not None and self._server is not None:
            await self._conn_mirror.apply(off)

    def _write_log(self, size: int) -> None:
        f = self._log_f
        if f is None or size == self._written:
            return
        data = self._log_data
        if size < self._written:  # the recorded file was truncated: so is this one
            f.seek(0)
            f.truncate()
            self._written = 0
        f.write(data[self._written:size])
        f.flush()
        self._written = size
        # The file's modification time is when its last byte was written, as on the box: for the
        # backlog written at once at the start of a play, the recorded second it was reached (a
        # tailer attaching to a silent log sees how long it has been silent, as on a real file).
        o = self.timeline.log_written_at(size)
        if o is not None and self._t0 is not None:
            with contextlib.suppress(OSError):
                t = self.wall() - max(0.0, self.offset() - o)
                os.utime(self.log_path, (t, t))

    async def _open_port(self) -> None:
        if self._reserve is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((HOST, self.port))
        else:
            sock, self._reserve = self._reserve, None
        self._server = await asyncio.start_server(self._handle, sock=sock, backlog=64)

    async def _close_port(self) -> None:
        srv, self._server = self._server, None
        if srv is not None:
            srv.close()
            # keep the port ours, bound but not listening: a connect is refused
            with contextlib.suppress(OSError):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((HOST, self.port))
                self._reserve = s
        if self._conn_mirror is not None:
            self._conn_mirror.stop()  # the server's connections die with it
        for w in list(self._conns):
            w.transport.abort()
        self._conns.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                if len(head) > MAX_HEAD_BYTES:
                    return
                lines = head.decode("latin-1").split("\r\n")
                parts = lines[0].split(" ")
                if len(parts) < 2:
                    return
                method, path = parts[0], parts[1]
                if method == "MIRROR":
                    # a mirrored connection (tests.corpus.connmirror): its requests get no answer
                    # here; the mirror writes the recorded answer's bytes
                    if self._conn_mirror is None or not self._conn_mirror.adopt(path, writer):
                        return
                    while await reader.readuntil(b"\r\n\r\n"):
                        pass
                    return
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                n = int(headers.get("content-length") or 0)
                if n:
                    await reader.readexactly(min(n, MAX_HEAD_BYTES))
                ans = self.timeline.answer(path, self.offset(), self.shift_s) if method in ("GET", "HEAD") else NOT_FOUND
                route = path.split("?", 1)[0].rstrip("/") or "/"
                self.served[route] = self.served.get(route, 0) + 1
                if ans.kind == "timeout":
                    await asyncio.sleep(self.hold_s)
                    writer.transport.abort()
                    return
                if ans.kind != "ok":
                    writer.transport.abort()
                    return
                status = int(ans.status or 200)
                body = b"" if method == "HEAD" else ans.body
                close = headers.get("connection", "").lower() == "close"
                out = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\n"
                       f"content-type: {ans.content_type}\r\ncontent-length: {len(ans.body)}\r\n"
                       f"connection: {'close' if close else 'keep-alive'}\r\n\r\n").encode() + body
                writer.write(out)
                await writer.drain()
                if close:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._conns.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()


def start_offset(tl: TraceTimeline, *, start_from: float | None = None, before_alert: float | None = None) -> float:
    """The trace second a play begins at: ``--from`` or ``should_alert_by - --before-alert`` (0 at least)."""
    if before_alert is not None:
        sab = tl.should_alert_by
        if sab is None:
            raise ValueError(f"{tl.name}: the truth has no should_alert_by")
        return max(0.0, sab - before_alert)
    return max(0.0, float(start_from or 0.0))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.corpus.serve_trace", description=__doc__.split("\n\n")[0])
    p.add_argument("trace", help="a trace folder (tests/corpus/traces/NAME) or a trace's name")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--from", dest="start_from", type=float, default=None, metavar="S",
                   help="start S seconds after the trace's launch (default 0)")
    g.add_argument("--before-alert", type=float, default=None, metavar="S",
                   help="start S seconds before the truth's should_alert_by")
    p.add_argument("--port", type=int, default=0, help="port to serve on (default: a free one)")
    p.add_argument("--log", default=None, metavar="PATH", help="the log file to grow (default: a temporary one)")
    p.add_argument("--procs", action="store_true",
                   help="start stand-in processes mirroring the recorded process tree (tests/corpus/standin.py)")
    ns = p.parse_args(argv)
    path = Path(ns.trace)
    if not path.is_dir():
        path = Path(__file__).resolve().parent / "traces" / ns.trace
    if not (path / "truth.json").is_file():
        p.exit(2, f"serve_trace: no trace at {ns.trace}\n")
    try:
        tl = TraceTimeline(path)
        at = start_offset(tl, start_from=ns.start_from, before_alert=ns.before_alert)
    except ValueError as e:
        p.exit(2, f"serve_trace: {e}\n")
    srv = TraceServer(tl, start_at=at, log_path=ns.log, port=ns.port, procs=ns.procs)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    srv.start()
    sab = tl.should_alert_by
    print(f"{tl.name} ({tl.truth.get('class')}): {srv.url}  --log {srv.log_path}", flush=True)
    print(f"playing +{at:.1f} s .. +{tl.end:.1f} s of the trace"
          + (f"; should_alert_by at +{sab:.1f} s" if sab is not None else ""), flush=True)
    try:
        while not srv.wait_end(1.0):
            pass
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    finally:
        srv.stop()
    print(f"ended at +{srv.offset():.1f} s; served {srv.served}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
