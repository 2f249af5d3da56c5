"""A local HTTP server that answers the fleet's queries as a real Prometheus did.

The answers were recorded from Debian's prometheus 2.42 scraping replayed vLLM, hand-made SGLang and DCGM
exporters (``python -m tools.record_fleet_fixture``); a query is matched by its PromQL text
(the same functions build it), whatever its time parameters. An instant query made of some of
a recorded query's tagged parts (``or``-joined, as :func:`vtop.sources.fleet.ts_query` or
``gpu_query(parts=...)`` build them) is answered with those parts' recorded series. A query it has no answer for
gets Prometheus' own error shape (``bad_data``). ``mode`` turns it into a failing
Prometheus: ``"down"`` (HTTP 503 with Prometheus' error JSON), ``"hang"`` (accepts and never
answers), ``"html"`` (a proxy's login page); ``token`` requires ``Authorization: Bearer``.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from vtop.clock import FakeClock

FIXTURE = Path(__file__).parent.parent / "fixtures" / "prometheus" / "fleet-4.json"


def _parts(rec: dict[str, Any]) -> dict[str, list[Any]]:
    """Each part of the recorded instant answers -> its series: a part's series carry its
    ``vtop_m`` tag, or the ``__name__`` of a metric the part aggregates by name."""
    from vtop.sources import fleet as q

    ans = rec["answers"]

    def pick(name: str, keep: Any) -> list[Any]:
        return [s for s in ans[name]["answer"]["data"]["result"] if keep(s["metric"])]

    def tag(*tags: str) -> Any:
        return lambda m: m.get(q.TAG) in tags

    def named(table: dict[str, str], *whats: str) -> Any:
        return lambda m: table.get(m.get("__name__", "")) in whats

    out: dict[str, list[Any]] = {q.ts_query(): pick("vllm", tag("ts"))}
    gauges, rest = q.vllm_queries()
    out[gauges] = pick("vllm", named(q.NAMES, "running", "waiting", "gen", "prompt", "preempt", "kv"))
    assert any(q.NAMES.get(s["metric"].get("__name__", "")) == "kv" for s in out[gauges]), "no KV in the recording"
    out[rest] = pick("vllm", lambda m: named(q.NAMES, "fin")(m) or tag("engines", "ts")(m))
    out[q.vllm_queries(ts=False)[1]] = pick("vllm", lambda m: named(q.NAMES, "fin")(m) or tag("engines")(m))
    for p in ("ttft_p50", "ttft_p99"):
        out[q.rates_query(parts=(p,))] = pick("rates", tag(p))
    gpu_part = {"n": tag("n"), "xid": tag("xid"), "util_sm": named(q.GPU_NAMES, "util", "sm"),
                "mem_power": named(q.GPU_NAMES, "used", "free", "power")}
    for p in q.GPU_PARTS:
        out[q.gpu_query(parts=(p,))] = pick("gpu", gpu_part[p])
    return out


def compose(parts: dict[str, list[Any]], query: str) -> list[Any] | None:
    """The series of ``query`` when it is known parts joined by `` or ``; else None."""
    out: list[Any] = []
    rest = query
    while rest:
        for text in sorted(parts, key=len, reverse=True):
            if rest.startswith(text) and (len(rest) == len(text) or rest[len(text):].startswith(" or ")):
                out.extend(parts[text])
                rest = rest[len(text) + 4:]
                break
        else:
            return None
    return out


def load(path: Path = FIXTURE) -> dict[str, Any]:
    return json.loads(path.read_text())


def clock_at(rec: dict[str, Any]) -> FakeClock:
    """A clock whose wall time is when the answers were recorded."""
    return FakeClock(start=1000.0, wall_offset=float(rec["recorded_at"]) - 1000.0)


class PromReplay:
    def __init__(self, rec: dict[str, Any] | None = None, *, mode: str = "ok", token: str | None = None,
                 hold: set[str] | None = None) -> None:
        self.rec = rec or load()
        self.mode = mode
        self.token = token
        #: queries whose answer waits until :attr:`release` is set (a slow part Prometheus is still on)
        self.hold = hold or set()
        self.release = threading.Event()
        self.requests: list[tuple[str, str]] = []
        #: each request's ``time`` parameter, in the order of :attr:`requests` (None for none): a
        #: request a client sent and then dropped may still reach a handler thread after the client
        #: moved on, so a test that counts one round's requests picks them by the time it asked at
        self.times: list[str | None] = []
        self.auth_seen: list[str | None] = []
        owner = self
        by: dict[tuple[str, str], Any] = {(a["endpoint"], a["query"]): a["answer"]
                                          for a in self.rec["answers"].values()}
        parts = _parts(self.rec)

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: object) -> None:
                pass

            def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                u = urlsplit(self.path)
                ep = u.path.rsplit("/", 1)[-1]
                query = parse_qs(u.query).get("query", [""])[0]
                owner.times.append(parse_qs(u.query).get("time", [None])[0])
                owner.requests.append((ep, query))
                owner.auth_seen.append(self.headers.get("Authorization"))
                if owner.token is not None and self.headers.get("Authorization") != f"Bearer {owner.token}":
                    self._send(401, b"Unauthorized\n", "text/plain")
                    return
                if owner.mode == "hang":
                    time.sleep(30)
                    return
                if owner.mode == "down":
                    self._send(503, json.dumps({"status": "error", "errorType": "unavailable",
                                                "error": "TSDB not ready"}).encode())
                    return
                if query in owner.hold:
                    owner.release.wait(30)
                if owner.mode == "html":
                    self._send(200, b"<html><body>Sign in</body></html>", "text/html")
                    return
                ans = by.get((ep, query))
                if ans is None and ep == "query":
                    got = compose(parts, query)
                    if got is not None:
                        ans = {"status": "success", "data": {"resultType": "vector", "result": got}}
                if ans is None:
                    self._send(400, json.dumps({"status": "error", "errorType": "bad_data",
                                                "error": f"no recorded answer for {query[:60]!r}"}).encode())
                    return
                self._send(200, json.dumps(ans).encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._t = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> PromReplay:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
