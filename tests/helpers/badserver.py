"""A misbehaving HTTP server for the fault matrix: one class, one ``mode`` per way a server can go wrong.

It answers ``/health``, ``/version`` and ``/v1/models`` as vLLM does, and ``/metrics`` (with a real
vLLM 0.32.0 CPU exposition text) as the mode says:

``ok``        200, the real text                     ``refused``   nothing listens (the port is closed)
``hang``      accepts, never answers (every path)    ``slow``      answers /metrics after 10 s
``trickle``   1 byte a second                        ``html``      a login page, 200
``404``       Not Found                              ``500``       Internal Server Error
``huge``      17 MiB with Content-Length             ``huge-close`` 17 MiB, no length, close-delimited
``garbage``   random bytes as text/plain             ``chunked``   the real text, chunked
``gzip``      the real text, gzip-encoded            ``redirect``  302 to /login
``reset``     the counters go back to 0 after the first scrape (a restart)
``unknown``   a Prometheus text with no vLLM metric names (another exporter)

Raw sockets on a daemon thread per connection: a held connection never blocks the test's teardown.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import socket
import threading
import time
from pathlib import Path

FIXTURE = Path(__file__).parent.parent / "fixtures" / "vllm" / "cpu-0.32.0-metrics-load.txt"
MODES = ("ok", "refused", "hang", "slow", "trickle", "html", "404", "500", "huge", "huge-close", "garbage",
         "chunked", "gzip", "redirect", "reset", "unknown")
HUGE = 17 * 2**20  # over the scraper's 16 MiB cap


def _advance_tokens(text: str, scrape: int) -> str:
    """The text with its generation counter moved on 40 tokens a scrape: a healthy server that is running 8
    makes tokens. Served unchanged, ``running 8`` with counters that never move is an engine stall in the
    making, and ``--once`` over a window of more than a second rightly says so (seen in CI)."""
    def bump(m: re.Match[str]) -> str:
        return f"{m.group(1)} {float(m.group(2)) + 40.0 * scrape}"
    return re.sub(r"^(vllm:generation_tokens_total(?:\{[^}]*\})?) (\S+)$",
                  bump, text, flags=re.M)


def _zero_counters(text: str) -> str:
    return re.sub(r"^(vllm:\S*_total(?:\{[^}]*\})?) \S+$", r"\1 0.0", text, flags=re.M)


class BadServer:
    def __init__(self, mode: str, *, basic_auth: str | None = None) -> None:
        assert mode in MODES, mode
        self.mode = mode
        #: ``user:password``: every request without it as ``Authorization: Basic`` gets a 401 (a proxy in
        #: front of vLLM); ``authorized``/``refused_auth`` count the requests that had it and did not
        self.basic_auth = basic_auth
        self.authorized = 0
        self.refused_auth = 0
        self.text = FIXTURE.read_text()
        self.scrapes = 0
        self.stop = threading.Event()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        if mode == "refused":
            self.sock.close()  # nothing listens on the port now
        else:
            self.sock.listen(16)
            threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> BadServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        try:
            self.sock.close()
        except OSError:
            pass

    # ------------------------------------------------------------------ serving
    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        f = conn.makefile("rb")
        try:
            while not self.stop.is_set():
                line = f.readline()
                if not line:
                    return
                headers = {}
                while (h := f.readline()).strip():
                    name, _, value = h.decode("latin-1").partition(":")
                    headers[name.strip().lower()] = value.strip()
                path = line.split()[1].decode() if len(line.split()) > 1 else "/"
                if self.basic_auth is not None:
                    want = "Basic " + base64.b64encode(self.basic_auth.encode()).decode()
                    if headers.get("authorization") != want:
                        self.refused_auth += 1
                        self._send(conn, 401, b"Unauthorized", headers=('WWW-Authenticate: Basic realm="vllm"',))
                        continue
                    self.authorized += 1
                if not self._answer(conn, path.split("?")[0]):
                    return
        except OSError:
            return
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def _send(self, conn: socket.socket, status: int, body: bytes, ctype: str = "text/plain",
              headers: tuple[str, ...] = ()) -> bool:
        head = [f"HTTP/1.1 {status} X", f"Content-Type: {ctype}", f"Content-Length: {len(body)}", *headers]
        conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        return True

    def _answer(self, conn: socket.socket, path: str) -> bool:
        mode = self.mode
        if mode == "hang":  # a blocked event loop: nothing answers
            self.stop.wait()
            return False
        if path == "/health":
            return self._send(conn, 200, b"")
        if path == "/version":
            return self._send(conn, 200, json.dumps({"version": "0.32.0"}).encode(), "application/json")
        if path == "/v1/models":
            body = {"object": "list", "data": [{"id": "tiny", "object": "model", "max_model_len": 2048}]}
            return self._send(conn, 200, json.dumps(body).encode(), "application/json")
        if path != "/metrics":
            return self._send(conn, 404, b"not found")
        self.scrapes += 1
        text = (self.text if mode in ("reset", "unknown") else _advance_tokens(self.text, self.scrapes)).encode()
        if mode in ("ok", "reset"):
            if mode == "reset" and self.scrapes > 1:
                text = _zero_counters(self.text).encode()
            return self._send(conn, 200, text, "text/plain; version=0.0.4")
        if mode == "slow":
            if self.stop.wait(10.0):
                return False
            return self._send(conn, 200, text)
        if mode == "trickle":
            conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {len(text)}\r\n\r\n".encode())
            for b in text:
                if self.stop.wait(1.0):
                    return False
                conn.sendall(bytes([b]))
            return True
        if mode == "html":
            return self._send(conn, 200, b"<!DOCTYPE html><html><body>Sign in</body></html>", "text/html")
        if mode == "404":
            return self._send(conn, 404, b"Not Found")
        if mode == "500":
            return self._send(conn, 500, b"Internal Server Error")
        if mode == "huge":
            return self._send(conn, 200, b"# x\n" * (HUGE // 4))
        if mode == "huge-close":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n")
            chunk = b"# x\n" * 16384
            for _ in range(HUGE // len(chunk) + 1):
                conn.sendall(chunk)
            return False
        if mode == "garbage":
            # random bytes, but never starting like HTML, JSON or whitespace: a random first byte of '<',
            # '{' or '[' (after any whitespace) made this an "HTML page" about one run in 60 (seen in CI)
            return self._send(conn, 200, b"\x80" + os.urandom(4095))
        if mode == "chunked":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n")
            for i in range(0, len(text), 1000):
                part = text[i:i + 1000]
                conn.sendall(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            conn.sendall(b"0\r\n\r\n")
            return True
        if mode == "gzip":
            return self._send(conn, 200, gzip.compress(text), headers=("Content-Encoding: gzip",))
        if mode == "redirect":
            return self._send(conn, 302, b"", headers=("Location: /login",))
        if mode == "unknown":
            body = b"# TYPE node_load1 gauge\nnode_load1 0.5\n# TYPE up gauge\nup 1\n"
            return self._send(conn, 200, body)
        raise AssertionError(mode)


def wait_until(cond: object, guard_s: float = 60.0) -> None:
    """Wait for ``cond()``; a hang guard only."""
    end = time.monotonic() + guard_s
    while not cond():  # type: ignore[operator]
        if time.monotonic() > end:
            raise AssertionError("hang guard")
        time.sleep(0.02)
