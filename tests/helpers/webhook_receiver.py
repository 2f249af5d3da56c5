"""A local webhook receiver for the alert delivery's tests (a tiny ``http.server``).

``mode``: ``ok`` answers 200 and keeps each POST (``posts``: path, headers, the JSON body);
``500`` answers 500 (with the request's path echoed in the body, as a careless server might: the
delivery must scrub it); ``hang`` reads the request and never answers (until :meth:`close`).
``got`` is set on every request that arrives; ``hangs`` counts the requests held.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.posts: list[dict[str, Any]] = []
        self.requests = 0
        self.hangs = 0
        self.got = threading.Event()
        self.first_at: float | None = None
        self._release = threading.Event()
        owner = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n)
                owner.requests += 1
                if owner.first_at is None:
                    owner.first_at = time.monotonic()
                owner.got.set()
                if owner.mode == "hang":
                    owner.hangs += 1
                    owner._release.wait()
                    return
                if owner.mode == "500":
                    body = f"internal error at {self.path}".encode()
                    self.send_response(500)
                else:
                    try:
                        data = json.loads(raw)
                    except ValueError:
                        data = None
                    owner.posts.append({"path": self.path, "headers": dict(self.headers.items()), "json": data})
                    body = b"ok"
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._t = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._t.start()

    def events(self, rule: str | None = None) -> list[tuple[str, str]]:
        """``(event, rule)`` of each vtop JSON message received, in order."""
        out = []
        for p in self.posts:
            j = p["json"] or {}
            if "event" in j and (rule is None or j.get("rule") == rule):
                out.append((j["event"], j["rule"]))
        return out

    def close(self) -> None:
        self._release.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
