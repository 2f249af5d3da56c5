"""The scraper against real HTTP servers on 127.0.0.1, serving recorded vLLM
payloads and faults. Each poll must return (never raise) with the right
error kind and a clear message, cut by its own deadline.

Nothing here times a poll: a server that hangs waits on an Event that is set only
after the poll has returned, so "the deadline cut it" is checked, not "it took < N s";
the scraper's own clock (latency, histogram ages, re-scrape periods) is a FakeClock the
test moves. GUARD_S is a hang guard only and never decides a healthy run."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import socket
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from vtop.clock import Clock, FakeClock, SystemClock
from vtop.sources.http11 import HttpPool
from vtop.sources.vllm import ServerPoll, Timeout, VllmScraper

FIX = Path(__file__).parent.parent / "fixtures" / "vllm"
SHARED = Path(__file__).parent.parent / "fixtures"
PAYLOAD = (FIX / "cpu-0.32.0-metrics-load-waiting.txt").read_bytes()
MODELS = json.dumps(
    {"object": "list", "data": [{"id": "/tmp/tinyllama", "object": "model", "root": "/tmp/tinyllama",
                                 "parent": None, "max_model_len": 2048}]}
).encode()
SECRET = "sk-test-SECRET-7f3a9"

Handler = Callable[[str, dict[str, str], asyncio.StreamWriter], Awaitable[None]]


def head(status: int, body_len: int | None, ctype: str = "text/plain; version=0.0.4") -> bytes:
    lines = [f"HTTP/1.1 {status} X", f"Content-Type: {ctype}", "Connection: close"]
    if body_len is not None:
        lines.append(f"Content-Length: {body_len}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def send(w: asyncio.StreamWriter, status: int, body: bytes, ctype: str = "text/plain") -> None:
    w.write(head(status, len(body), ctype) + body)
    await w.drain()


class Server:
    """A tiny HTTP/1.1 server; ``routes`` maps a path to a handler."""

    def __init__(self) -> None:
        self.routes: dict[str, Handler] = {}
        self.seen: list[tuple[str, dict[str, str]]] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.port = 0
        self._srv: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        self._srv = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self._srv.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _conn(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)  # type: ignore[arg-type]
        try:
            line = (await r.readline()).decode()
            headers: dict[str, str] = {}
            while True:
                h = (await r.readline()).decode()
                if h in ("\r\n", "\n", ""):
                    break
                k, _, v = h.partition(":")
                headers[k.strip().lower()] = v.strip()
            path = line.split()[1] if len(line.split()) > 1 else "/"
            self.seen.append((path, headers))
            handler = self.routes.get(path.split("?", 1)[0].rstrip("/") or "/")
            if handler is None:
                await send(w, 404, b"not found")
            else:
                await handler(path, headers, w)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.tasks.discard(task)  # type: ignore[arg-type]
            try:
                w.close()
            except Exception:
                pass

    async def stop(self) -> None:
        assert self._srv is not None
        self._srv.close()
        for t in list(self.tasks):
            t.cancel()
        await asyncio.sleep(0)


def vllm_routes(s: Server, *, metrics: bytes = PAYLOAD, health: int = 200) -> None:
    async def m(p: str, h: dict[str, str], w: asyncio.StreamWriter) -> None:
        await send(w, 200, metrics)

    async def he(p: str, h: dict[str, str], w: asyncio.StreamWriter) -> None:
        await send(w, health, b"")

    async def mo(p: str, h: dict[str, str], w: asyncio.StreamWriter) -> None:
        await send(w, 200, MODELS, "application/json")

    async def ve(p: str, h: dict[str, str], w: asyncio.StreamWriter) -> None:
        await send(w, 200, b'{"version": "0.32.0"}', "application/json")

    s.routes.update({"/metrics": m, "/health": he, "/v1/models": mo, "/version": ve})


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    s = Server()
    await s.start()
    yield s
    await s.stop()


@pytest.fixture
async def client() -> AsyncIterator[HttpPool]:
    c = HttpPool()
    yield c
    await c.aclose()


GUARD_S = 30.0  # hang guard only: a healthy run, however loaded the box, never gets near it
# No deadline decides a test on a healthy run, however loaded the box: the fault answers come
# at once, and the tests of the deadline set a short one and hold their server past it.
ROOMY = Timeout(connect=GUARD_S / 2, read=GUARD_S / 2)


def scraper(url: str, client: HttpPool, clock: Clock | None = None, **kw: object) -> VllmScraper:
    kw.setdefault("timeout", ROOMY)
    return VllmScraper(url, client=client, clock=clock or SystemClock(), **kw)  # type: ignore[arg-type]


async def guarded(poll: Awaitable[ServerPoll]) -> ServerPoll:
    """A poll, with a hang guard: a poll that its deadline does not cut fails here."""
    try:
        return await asyncio.wait_for(poll, GUARD_S)
    except asyncio.TimeoutError:
        raise AssertionError(f"hang guard: the poll did not return within {GUARD_S:.0f} s") from None


class Hold:
    """What a hanging server waits on: ``entered`` once a request is held, ``release`` to let go."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()


def all_text(p: ServerPoll) -> str:
    parts = [repr(p), str(p)]
    for f in dataclasses.fields(p):
        parts.append(repr(getattr(p, f.name)))
    return "\n".join(parts)


# --- the good path --------------------------------------------------------------------


async def test_real_payload_and_info(server: Server, client: HttpPool) -> None:
    vllm_routes(server)
    clock = FakeClock()
    answer = server.routes["/metrics"]

    async def metrics_after_250_ms(p: str, h: dict[str, str], w: asyncio.StreamWriter) -> None:
        clock.advance(0.25)  # the server "takes" 250 ms on the scraper's clock
        await answer(p, h, w)

    server.routes["/metrics"] = metrics_after_250_ms
    sc = scraper(server.url, client, clock, timeout=None)
    p = await sc.poll()
    assert p.ok and p.error is None, p.message
    assert p.metrics is not None and p.metrics.running == 2 and p.metrics.waiting == 6
    assert p.body_bytes == len(PAYLOAD) and p.status == 200
    assert p.latency_s == pytest.approx(0.25)  # latency is the /metrics request's, on the scraper's clock
    # first poll = a (re)connect: health, models and version come too
    assert p.health == 200 and p.health_polled and p.info_polled
    assert p.models is not None and p.models.model_id == "/tmp/tinyllama" and p.models.max_model_len == 2048
    assert p.version == "0.32.0"
    # next poll right away: only /metrics
    n = len(server.seen)
    p2 = await sc.poll()
    assert p2.ok and not p2.info_polled and not p2.health_polled and p2.models is None
    assert [x[0].split("?")[0].rstrip("/") for x in server.seen[n:]] == ["/metrics"]
    # no compression asked for (bounded memory), and no key sent anywhere without one
    assert server.seen[0][1].get("accept-encoding") == "identity"
    assert all("authorization" not in h for _, h in server.seen)


async def test_big_body_is_parsed_in_a_thread(server: Server, client: HttpPool,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    vllm_routes(server)
    called: list[object] = []
    real = asyncio.to_thread

    async def spy(fn, *a, **k):  # type: ignore[no-untyped-def]
        called.append(fn)
        return await real(fn, *a, **k)

    monkeypatch.setattr(asyncio, "to_thread", spy)
    p = await scraper(server.url, client, timeout=None, thread_parse_bytes=1024).poll()
    assert p.ok and called
    called.clear()
    p = await scraper(server.url, client, timeout=None).poll()
    assert p.ok and not called  # 14 KB: inline


# --- faults ------------------------------------------------------------------------------


async def test_slow_server_times_out_in_budget(server: Server, client: HttpPool) -> None:
    # Proves: the deadline ends a poll that the server never answers (it holds the request
    # until after the poll has returned), and the message names that deadline.
    hold = Hold()

    async def slow(p: str, h: dict[str, str], w: asyncio.StreamWriter) -> None:
        hold.entered.set()
        await hold.release.wait()
        await send(w, 200, PAYLOAD)

    server.routes["/metrics"] = slow
    sc = scraper(server.url, client, deadline_s=1.0)
    try:
        p = await guarded(sc.poll())
        assert hold.entered.is_set() and not hold.release.is_set()  # it returned with the answer held
    finally:
        hold.release.set()
    assert not p.ok and p.error == "timeout"
    assert "no answer" in p.message or "no complete answer" in p.message
    assert f"within {sc.deadline_s:.1f} s" in p.message


async def test_trickling_body_hits_the_deadline(server: Server, client: HttpPool) -> None:
    # Proves: a body that keeps coming (10 bytes every 0.1 s, never ending until the poll
    # has returned) is cut by the whole-request deadline, not waited out.
    hold = Hold()
    sent = [0]

    async def trickle(p: str, h: dict[str, str], w: asyncio.StreamWriter) -> None:
        w.write(head(200, 100000))
        while not hold.release.is_set():
            w.write(b"#" * 10)
            await w.drain()
            sent[0] += 1
            hold.entered.set()
            await asyncio.sleep(0.1)  # pacing only: each chunk well inside the read timeout

    server.routes["/metrics"] = trickle
    sc = scraper(server.url, client, deadline_s=1.0)
    try:
        p = await guarded(sc.poll())
        assert hold.entered.is_set() and not hold.release.is_set()  # still trickling when it returned
    finally:
        hold.release.set()
    assert p.error == "timeout" and "within 1.0 s" in p.message


async def test_http_500(server: Server, client: HttpPool) -> None:
    async def err(p: str, h: dict[str, str], w: asyncio.StreamWriter) -> None:
        await send(w, 500, b"Internal Server Error")

    vllm_routes(server, health=503)
    server.routes["/metrics"] = err
    p = await scraper(server.url, client).poll()
    assert not p.ok and p.error == "http 500" and p.status == 500
    assert "HTTP 500" in p.message and "Internal Server Error" in p.message
    assert p.health == 503  # the port answers HTTP, so /health was asked too


async def test_html_page_is_not_vllm(server: Server, client: HttpPool) -> None:
    async def html(p: str, h: dict[str, str], w: asyncio.StreamWriter) -> None:
        await send(w, 200, b"<!DOCTYPE html><html><body>Grafana</body></html>", "text/html")

    server.routes["/metrics"] = html
    p = await scraper(server.url, client).poll()
    assert not p.ok and p.error == "not vllm" and "HTML" in p.message


async def test_other_exporter_is_not_vllm(server: Server, client: HttpPool) -> None:
    body = b"# HELP node_load1 1m load.\n# TYPE node_load1 gauge\nnode_load1 0.42\n"
    vllm_routes(server, metrics=body)
    p = await scraper(server.url, client).poll()
    assert p.error == "not vllm" and "--disable-log-stats" in p.message
    assert p.metrics is not None and not p.metrics.is_vllm


async def test_garbage(server: Server, client: HttpPool) -> None:
    vllm_routes(server, metrics=bytes(range(256)) * 40)
    p = await scraper(server.url, client).poll()
    assert not p.ok and p.error == "garbage" and "not Prometheus text" in p.message


async def test_50mb_body_is_cut_with_bounded_memory(server: Server, client: HttpPool) -> None:
    chunk = b"x" * (1024 * 1024)

    async def huge(p: str, h: dict[str, str], w: asyncio.StreamWriter) -> None:
        w.write(head(200, None))  # no Content-Length: the reader must count
        for _ in range(50):
            w.write(chunk)
            await w.drain()

    server.routes["/metrics"] = huge
    gc.collect()
    tracemalloc.start()
    try:
        p = await scraper(server.url, client).poll()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not p.ok and p.error == "too large" and "16 MiB" in p.message
    assert 16 * 1024 * 1024 <= p.body_bytes < 20 * 1024 * 1024
    assert peak < 40 * 1024 * 1024, peak


async def test_refused_bodies_are_let_go_after_each_poll(server: Server, client: HttpPool) -> None:
    # Proves (#25 item 5): a close-delimited /metrics over the limit is refused at the limit
    # ("too large"), never read to its end, and what was read goes with the poll. vtop at
    # --interval 0.25 against a 64 MiB close-delimited body went to 1.26 GB RSS in 30 s:
    # every refused scrape kept its 16 MiB in a reference cycle (asyncio.wait_for's frame,
    # its task, the error, the error's traceback, the reader's frame and its buffer) until
    # a full collection. With the collector off, three polls must leave ~nothing behind.
    chunk = b"x" * (1024 * 1024)
    total = 64 * len(chunk)
    sent: list[int] = []

    async def huge(p: str, h: dict[str, str], w: asyncio.StreamWriter) -> None:
        n = 0
        try:
            w.write(head(200, None))  # no Content-Length: the body ends when the server closes
            while n < total:
                w.write(chunk)
                await w.drain()
                n += len(chunk)
        finally:
            sent.append(n)

    server.routes["/metrics"] = huge
    s = scraper(server.url, client)
    polls = []
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(3):
            polls.append(await guarded(s.poll()))
        for _ in range(500):  # the server's handlers see the hang-up
            if len(sent) == 3:
                break
            await asyncio.sleep(0.01)
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
        gc.enable()
    for p in polls:
        assert not p.ok and p.error == "too large" and "16 MiB" in p.message, p.message
        assert 16 * 1024 * 1024 <= p.body_bytes < 17 * 1024 * 1024
    assert len(sent) == 3 and max(sent) < total, sent  # never read to the end
    assert held < 4 * 1024 * 1024, f"{held / 2**20:.1f} MiB still held after 3 refused polls"


async def test_announced_huge_body_is_not_read(server: Server, client: HttpPool) -> None:
    # Proves: a 50 MiB Content-Length is refused from the header, while the server still
    # holds the rest of the body (reading on would end in a timeout, not "too large").
    hold = Hold()

    async def announced(p: str, h: dict[str, str], w: asyncio.StreamWriter) -> None:
        w.write(head(200, 50 * 1024 * 1024) + b"x" * 1000)
        await w.drain()
        hold.entered.set()
        await hold.release.wait()

    server.routes["/metrics"] = announced
    try:
        p = await guarded(scraper(server.url, client).poll())
        assert hold.entered.is_set() and not hold.release.is_set()
    finally:
        hold.release.set()
    assert p.error == "too large", p.message


async def test_connection_reset_mid_body(server: Server, client: HttpPool) -> None:
    async def cut(p: str, h: dict[str, str], w: asyncio.StreamWriter) -> None:
        w.write(head(200, len(PAYLOAD)) + PAYLOAD[:5000])
        await w.drain()
        sock = w.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
        w.transport.abort()

    server.routes["/metrics"] = cut
    p = await scraper(server.url, client).poll()
    assert not p.ok and p.error == "reset", p.message
    assert "dropped the connection" in p.message


async def test_closed_mid_body_without_rst(server: Server, client: HttpPool) -> None:
    async def cut(p: str, h: dict[str, str], w: asyncio.StreamWriter) -> None:
        w.write(head(200, len(PAYLOAD)) + PAYLOAD[:5000])
        await w.drain()

    server.routes["/metrics"] = cut
    p = await scraper(server.url, client).poll()
    assert p.error == "reset" and "5000 bytes received" in p.message


async def test_connection_refused(client: HttpPool) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    p = await scraper(f"http://127.0.0.1:{port}", client).poll()
    assert not p.ok and p.error == "refused"
    assert "connection refused" in p.message and f"127.0.0.1:{port}" in p.message
    assert p.status is None and not p.health_polled  # nothing else is tried on a closed port


async def test_dns_failure(client: HttpPool) -> None:
    p = await scraper("http://no-such-host.invalid:8000", client).poll()
    assert not p.ok and p.error in ("dns", "timeout", "other")
    assert p.message


async def test_engine_dead_health(server: Server, client: HttpPool) -> None:
    vllm_routes(server, health=503)
    sc = scraper(server.url, client, timeout=None)
    p = await sc.poll()
    assert p.ok and p.health == 503 and any("503" in n for n in p.notes)
    # while /health is bad it is asked every poll, to see recovery at once
    p2 = await sc.poll()
    assert p2.health_polled and p2.health == 503


async def test_reconnect_refreshes_info(server: Server, client: HttpPool) -> None:
    vllm_routes(server)
    sc = scraper(server.url, client, timeout=None)
    assert (await sc.poll()).info_polled
    assert not (await sc.poll()).info_polled
    saved = server.routes.pop("/metrics")

    async def err(p: str, h: dict[str, str], w: asyncio.StreamWriter) -> None:
        w.transport.abort()

    server.routes["/metrics"] = err
    assert (await sc.poll()).error == "reset"
    server.routes["/metrics"] = saved
    p = await sc.poll()
    assert p.ok and p.info_polled and p.version == "0.32.0"


# --- the API key ----------------------------------------------------------------------------


async def test_api_key_only_to_v1_and_never_in_output(server: Server, client: HttpPool) -> None:
    async def echo(p: str, h: dict[str, str], w: asyncio.StreamWriter) -> None:
        body = ("<html>Unauthorized. You sent: " + json.dumps(h) + "</html>").encode()
        await send(w, 401, body, "text/html")

    vllm_routes(server)
    server.routes["/v1/models"] = echo
    sc = scraper(server.url, client, api_key=SECRET, timeout=None)
    assert SECRET not in repr(sc) and SECRET not in str(sc)
    p = await sc.poll()
    assert p.ok and p.models is None
    assert any("401" in n and "VLLM_API_KEY" in n for n in p.notes)
    sent = {path: h.get("authorization") for path, h in server.seen}
    assert sent["/v1/models"] == f"Bearer {SECRET}"
    assert sent["/metrics"] is None and sent["/health"] is None and sent["/version"] is None
    assert SECRET not in all_text(p)


async def test_api_key_not_in_errors_when_everything_echoes(server: Server, client: HttpPool) -> None:
    async def echo(p: str, h: dict[str, str], w: asyncio.StreamWriter) -> None:
        await send(w, 500, ("error, headers were " + json.dumps(h)).encode())

    async def echo_models(p: str, h: dict[str, str], w: asyncio.StreamWriter) -> None:
        # a hostile "success": the key inside the model id and root
        auth = h.get("authorization", "")
        doc = {"data": [{"id": f"m {auth}", "root": auth, "max_model_len": 10}]}
        await send(w, 200, json.dumps(doc).encode(), "application/json")

    for path in ("/metrics", "/health", "/version"):
        server.routes[path] = echo
    server.routes["/v1/models"] = echo_models
    p = await scraper(server.url, client, api_key=SECRET, timeout=None).poll()
    assert p.error == "http 500"
    assert p.models is not None and p.models.max_model_len == 10
    assert SECRET not in all_text(p)


async def test_api_key_not_in_connection_errors(client: HttpPool) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    sc = scraper(f"http://127.0.0.1:{port}", client, api_key=SECRET)
    p = await sc.poll()
    assert p.error == "refused" and SECRET not in all_text(p) and SECRET not in repr(sc)


async def test_poll_never_raises_on_internal_errors(server: Server, client: HttpPool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    vllm_routes(server)
    import vtop.sources.vllm as mod

    def boom(*a: object, **k: object) -> None:
        raise RuntimeError(f"parser bug with {SECRET}")

    monkeypatch.setattr(mod, "parse_vllm_metrics", boom)
    p = await scraper(server.url, client, api_key=SECRET).poll()
    assert not p.ok and p.error == "other" and "internal error" in p.message
    assert SECRET not in all_text(p)


# --- restricted scrapes (prometheus_client's name[]) -----------------------------------


def restricting_routes(s: Server, *, restricted: Callable[[str], tuple[int, bytes]] | None = None) -> None:
    """vLLM-like routes whose /metrics answers ``?name[]=`` as prometheus_client does
    (bench/harness.py's ``restricted``: the library's own registry), or as ``restricted`` says."""
    import sys
    from urllib.parse import parse_qs, urlsplit

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from harness import restricted as library_restricted

    vllm_routes(s)

    async def m(p: str, h: dict[str, str], w: asyncio.StreamWriter) -> None:
        names = tuple(parse_qs(urlsplit(p).query).get("name[]", ()))
        if not names:
            await send(w, 200, PAYLOAD)
        elif restricted is not None:
            await send(w, *restricted(p))
        else:
            await send(w, 200, library_restricted(PAYLOAD.decode(), names))

    s.routes["/metrics"] = m


def paths(server: Server, since: int = 0) -> list[str]:
    return ["restricted" if "name%5B%5D=" in x[0] else x[0] for x in server.seen[since:] if x[0].startswith("/metrics")]


async def test_restricted_scrapes_after_a_full_one_read_the_same(server: Server, client: HttpPool) -> None:
    """The first scrape is full; the next ones ask only for the samples vtop reads and get
    the same readings from a quarter of the bytes; a full one comes again after FULL_EVERY_S."""
    from vtop.sources.vllm import RESTRICTED_METRICS_PATH, coverage

    restricting_routes(server)
    clock = FakeClock()
    sc = scraper(server.url, client, clock, timeout=None)
    full = await sc.poll()
    assert full.ok and paths(server) == ["/metrics"] and full.body_bytes == len(PAYLOAD)
    p = await sc.poll()
    assert p.ok and paths(server) == ["/metrics", "restricted"], p.message
    assert sc.restricted_ok is True and sc.restricted_polls == 1
    assert RESTRICTED_METRICS_PATH.startswith("/metrics/?name%5B%5D=") and "name%5B%5D=vllm%3A" in RESTRICTED_METRICS_PATH
    assert p.body_bytes < full.body_bytes / 2
    a, b = full.metrics, p.metrics
    assert a is not None and b is not None and coverage(a) == coverage(b) and coverage(a)
    for f in ("running", "waiting", "kv_cache_usage", "generation_tokens_total", "request_success_total",
              "time_to_first_token_seconds", "e2e_request_latency_seconds", "request_params_max_tokens"):
        assert getattr(a, f) == getattr(b, f), f
    clock.advance(sc.FULL_EVERY_S - 1.0)
    await sc.poll()
    assert paths(server)[-1] == "restricted"  # not yet
    clock.advance(1.0)  # FULL_EVERY_S after the full one, on the scraper's clock
    await sc.poll()
    await sc.poll()
    assert paths(server)[-2:] == ["/metrics", "restricted"]


@pytest.mark.parametrize("answer", ["empty", "http 400", "partial", "partial histograms"])
async def test_a_restricted_answer_that_falls_short_is_replaced_in_the_same_poll(
    server: Server, client: HttpPool, answer: str,
) -> None:
    """vLLM's multi-process registry answers nothing to name[], a proxy may refuse the query,
    a server may leave a metric out (of a poll without histograms, or of one with them): the
    full /metrics comes in the same poll (no gap, same readings), and restricted scrapes stop
    for RESTRICTED_RETRY_S."""
    lines = PAYLOAD.decode().splitlines(keepends=True)
    gone = "time_to_first_token" if answer == "partial histograms" else "kv_cache_usage_perc"
    partial = "".join(x for x in lines if gone not in x).encode()
    reply = {"empty": (200, b""), "http 400": (400, b"bad query"), "partial": (200, partial),
             "partial histograms": (200, partial)}[answer]
    restricting_routes(server, restricted=lambda p: reply)
    sc = scraper(server.url, client, timeout=None)
    if answer == "partial histograms":
        sc.HIST_EVERY_S = 0.0  # every restricted poll asks for the histograms too
    first = await sc.poll()
    p = await sc.poll()
    assert p.ok and p.status == 200, p.message
    assert paths(server) == ["/metrics", "restricted", "/metrics"]
    assert p.metrics is not None and first.metrics is not None
    assert p.metrics.time_to_first_token_seconds == first.metrics.time_to_first_token_seconds is not None
    assert p.metrics.kv_cache_usage == first.metrics.kv_cache_usage is not None
    assert p.metrics.histograms_age_s == 0.0
    assert p.body_bytes == len(PAYLOAD) and sc.restricted_ok is False and sc.restricted_polls == 0
    for _ in range(3):
        assert (await sc.poll()).ok
    assert paths(server)[3:] == ["/metrics"] * 3  # not asked again for a while
    sc.plan.retry_at = 0.0  # the while is over: tried again (and, still short, replaced again)
    await sc.poll()
    assert paths(server)[6:] == ["restricted", "/metrics"]


async def test_histograms_are_read_every_HIST_EVERY_S_and_carried_over_between(
    server: Server, client: HttpPool,
) -> None:
    """Between two reads of the histograms a poll asks for the other samples only (a
    fraction of the bytes) and carries the last histograms over with their age; the next
    read comes HIST_EVERY_S after the last."""
    from vtop.sources.metrics_text import HISTOGRAM_SAMPLE_NAMES
    from vtop.sources.vllm import FAST_METRICS_PATH, RESTRICTED_METRICS_PATH

    restricting_routes(server)
    clock = FakeClock()
    sc = scraper(server.url, client, clock, timeout=None)
    full = await sc.poll()
    clock.advance(1.5)
    fast = await sc.poll()
    sent = [x[0] for x in server.seen if x[0].startswith("/metrics")]
    assert sent == ["/metrics", FAST_METRICS_PATH]
    assert "time_to_first_token" not in FAST_METRICS_PATH and "num_requests_running" in FAST_METRICS_PATH
    assert all(n.replace(":", "%3A") in RESTRICTED_METRICS_PATH for n in HISTOGRAM_SAMPLE_NAMES)
    a, b = full.metrics, fast.metrics
    assert a is not None and b is not None and fast.ok
    assert fast.body_bytes < full.body_bytes / 5, (fast.body_bytes, full.body_bytes)
    assert b.running == a.running and b.generation_tokens_total == a.generation_tokens_total
    for f in ("time_to_first_token_seconds", "inter_token_latency_seconds", "request_params_max_tokens"):
        assert getattr(b, f) == getattr(a, f) is not None, f
        assert [getattr(e, f) for e in b.engines] == [getattr(e, f) for e in a.engines]
    assert b.inter_token_metric == a.inter_token_metric is not None
    assert a.histograms_age_s == 0.0 and b.histograms_age_s == pytest.approx(1.5)  # on the scraper's clock
    clock.advance(sc.HIST_EVERY_S - 1.5)  # HIST_EVERY_S after the last read of them
    again = await sc.poll()
    assert [x[0] for x in server.seen if x[0].startswith("/metrics")][-1] == RESTRICTED_METRICS_PATH
    assert again.metrics is not None and again.metrics.histograms_age_s == 0.0
    assert again.metrics.time_to_first_token_seconds == a.time_to_first_token_seconds
    assert sc.restricted_polls == 2


async def test_a_server_that_ignores_name_is_still_read_in_full(server: Server, client: HttpPool) -> None:
    """A server (or an old prometheus_client) that ignores the query answers everything:
    that fills all a full scrape did, so it is used as it is."""
    vllm_routes(server)
    sc = scraper(server.url, client, timeout=None)
    a = await sc.poll()
    b = await sc.poll()
    assert b.ok and sc.restricted_ok is True and paths(server) == ["/metrics", "restricted"]
    assert a.metrics is not None and b.metrics is not None and a.metrics.running == b.metrics.running == 2


async def test_after_a_lost_connection_the_first_scrape_is_full_again(server: Server, client: HttpPool) -> None:
    """Whatever answers after a dropped connection may be another process (a restart
    with --api-server-count 2 answers nothing to name[]): it is scraped in full first."""
    restricting_routes(server)
    good = server.routes["/metrics"]
    drop = {"on": False}

    async def m(p: str, h: dict[str, str], w: asyncio.StreamWriter) -> None:
        if drop["on"]:
            drop["on"] = False
            w.close()  # no answer at all
            return
        await good(p, h, w)

    server.routes["/metrics"] = m
    sc = scraper(server.url, client, timeout=None)
    await sc.poll()
    await sc.poll()
    assert paths(server) == ["/metrics", "restricted"]
    drop["on"] = True
    bad = await sc.poll()
    assert not bad.ok
    again = await sc.poll()
    assert again.ok and paths(server)[-1] == "/metrics"
    assert (await sc.poll()).ok and paths(server)[-1] == "restricted"
