"""A local HTTP server that answers like a vLLM server from real recorded payloads.

Serves ``/metrics`` from a list of real exposition texts (the next one on each
scrape, so counters move as they did), ``/health``, ``/v1/models`` and
``/version``. ``hang=True`` makes ``/metrics`` accept and never answer.
For tests and benchmarks of vtop's own code paths; the real-tier tests use a real vLLM.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class MetricsServer:
    def __init__(self, payloads: Sequence[str], *, model: str = "/tmp/tiny", max_model_len: int = 32768,
                 version: str = "0.26.0", hang: bool = False) -> None:
        self.payloads = list(payloads)
        self.i = 0
        self.hang = hang
        self.scrapes = 0
        owner = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn serves vLLM

            def log_message(self, *a: object) -> None:
                pass

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                if self.path.startswith("/metrics"):
                    if owner.hang:
                        time.sleep(3600)
                        return
                    body = owner.payloads[min(owner.i, len(owner.payloads) - 1)]
                    owner.i = (owner.i + 1) % len(owner.payloads)
                    owner.scrapes += 1
                    self._send(200, body.encode(), "text/plain; version=0.0.4")
                elif self.path.startswith("/health"):
                    self._send(200, b"", "text/plain")
                elif self.path.startswith("/v1/models"):
                    body = {"object": "list", "data": [{"id": model, "object": "model", "root": model,
                                                        "max_model_len": max_model_len}]}
                    self._send(200, json.dumps(body).encode(), "application/json")
                elif self.path.startswith("/version"):
                    self._send(200, json.dumps({"version": version}).encode(), "application/json")
                else:
                    self._send(404, b"not found", "text/plain")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._t = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> MetricsServer:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def h200_payloads(start: int = 0, count: int = 60) -> list[str]:
    """Real /metrics texts of vLLM 0.26.0 on the H200, one a second, from ``start`` (the burst is near 100-130)."""
    import lzma
    from pathlib import Path

    path = Path(__file__).parent.parent / "fixtures" / "vllm" / "h200-0.26.0-metrics-timeline.jsonl.xz"
    out: list[str] = []
    with lzma.open(path, "rt") as f:
        for line in f:
            r = json.loads(line)
            if "text" in r:
                out.append(r["text"])
    return out[start:start + count]
