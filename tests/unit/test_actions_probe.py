"""The test request against a local SSE server on 127.0.0.1 that answers in vLLM's shapes
(copied from shared/fixtures/vllm-0.32.0-cpu/requests.txt).

Nothing here times a request: TTFT and totals are read on a clock the fake server moves
(StepClock), and a server that hangs or stalls waits on an Event set only after the
request has returned. GUARD_S is a hang guard only and never decides a healthy run."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from vtop.actions import probe
from vtop.actions.probe import TEMPLATE_MARGIN, fetch_models, send_test_request
from vtop.sources.http11 import HttpPool

KEY = "sk-test-Zq81aPvLw0cE3tYh"
CID = "chatcmpl-b7f0a1f2daf26bc2"
GUARD_S = 30.0  # hang guard only: a healthy run, however loaded the box, never gets near it


class StepClock:
    """The probe's ``time.monotonic``, moved by the fake server instead of by the wall clock."""

    def __init__(self) -> None:
        self.now = 0.0
        self.reads = 0

    def monotonic(self) -> float:
        self.reads += 1
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class _ProbeTime:
    """Stands in for the ``time`` module inside vtop.actions.probe: monotonic from a StepClock."""

    def __init__(self, clock: StepClock) -> None:
        self._clock = clock

    def monotonic(self) -> float:
        return self._clock.monotonic()

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def chat_chunks(tokens: list[str], finish: str = "length", usage: bool = True) -> list[str]:
    head = {"id": CID, "object": "chat.completion.chunk", "created": 1796031001, "model": "/tmp/tinyllama"}
    out = [json.dumps({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None}],
                       "prompt_token_ids": None, "prompt_text": None})]
    for i, t in enumerate(tokens):
        last = i == len(tokens) - 1
        out.append(json.dumps({**head, "choices": [{"index": 0, "delta": {"content": t}, "logprobs": None,
                                                    "finish_reason": finish if last else None, "token_ids": None}]}))
    if usage:
        out.append(json.dumps({**head, "choices": [], "usage": {"prompt_tokens": 13, "total_tokens": 13 + len(tokens),
                                                                "completion_tokens": len(tokens)},
                               "system_fingerprint": "vllm-0.32.0-15dc3b78"}))
    return [f"data: {c}\n\n" for c in out] + ["data: [DONE]\n\n"]


def completion_chunks(tokens: list[str]) -> list[str]:
    head = {"id": "cmpl-9ecc6ea303ba2402", "object": "text_completion", "created": 1796031001,
            "model": "/tmp/tinyllama"}
    out = []
    for i, t in enumerate(tokens):
        out.append(json.dumps({**head, "choices": [{"index": 0, "text": t, "logprobs": None,
                                                    "finish_reason": "length" if i == len(tokens) - 1 else None}]}))
    return [f"data: {c}\n\n" for c in out] + ["data: [DONE]\n\n"]


@dataclass
class Reply:
    status: int = 200
    chunks: list[str] = field(default_factory=list)
    body: bytes = b""
    first_delay: float = 0.0
    delay: float = 0.0
    hang: bool = False
    content_type: str = "text/event-stream"
    #: move this clock by the delays instead of sleeping them; after the first token the
    #: server waits until the probe has read the clock for it (its start, then its TTFT)
    clock: StepClock | None = None
    #: after this many chunks, hold the stream until FakeVllm.release is set
    stall_after: int | None = None


@dataclass
class FakeVllm:
    url: str
    requests: list[dict[str, Any]]
    reply: Reply
    held: asyncio.Event = field(default_factory=asyncio.Event)  # a hang or a stall has begun
    release: asyncio.Event = field(default_factory=asyncio.Event)  # set after the request returned


async def _handle(srv: FakeVllm, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        n = int(headers.get("content-length", "0"))
        body = await reader.readexactly(n) if n else b""
        srv.requests.append({"method": method, "path": path, "headers": headers,
                             "json": json.loads(body) if body else None})
        rep = srv.reply
        if path == "/v1/models":
            data = json.dumps({"object": "list", "data": [
                {"id": "/tmp/tinyllama", "object": "model", "owned_by": "vllm", "root": "/tmp/tinyllama",
                 "parent": None, "max_model_len": 2048},
                {"id": "lora1", "object": "model", "parent": "/tmp/tinyllama", "max_model_len": 2048}]}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n" % len(data) + data)
            await writer.drain()
            return
        if rep.hang:
            srv.held.set()
            await srv.release.wait()
            return
        reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 500: "Internal Server Error"}[rep.status]
        if rep.status != 200 or rep.body:
            writer.write(f"HTTP/1.1 {rep.status} {reason}\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(rep.body)}\r\nConnection: close\r\n\r\n".encode() + rep.body)
            await writer.drain()
            return
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Type: {rep.content_type}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        for i, c in enumerate(rep.chunks):
            if rep.stall_after is not None and i == rep.stall_after:
                srv.held.set()
                await srv.release.wait()
            wait = rep.first_delay if i == 1 else rep.delay
            if wait and rep.clock is not None:
                rep.clock.advance(wait)
            elif wait:
                await asyncio.sleep(wait)
            writer.write(c.encode())
            await writer.drain()
            if i == 1 and rep.clock is not None:
                clock = rep.clock
                end = asyncio.get_running_loop().time() + GUARD_S  # hang guard only
                while clock.reads < 2 and asyncio.get_running_loop().time() < end:
                    await asyncio.sleep(0.001)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


@pytest.fixture
async def fake() -> AsyncIterator[FakeVllm]:
    srv = FakeVllm("", [], Reply())
    server = await asyncio.start_server(lambda r, w: _handle(srv, r, w), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    srv.url = f"http://127.0.0.1:{port}"
    async with server:
        yield srv
        srv.release.set()
        server.close()


@pytest.fixture
async def client() -> AsyncIterator[HttpPool]:
    pool = HttpPool()
    yield pool
    await pool.aclose()


async def test_streamed_chat_measures_ttft_tokens_and_finish(fake: FakeVllm, client: HttpPool,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # Proves TTFT is taken at the first token (not at the head or the role chunk) and the
    # total at the end, on a clock the server moves: 0.01 s before each chunk, 0.15 s more
    # before the first token; exact values, whatever the box's load.
    toks = ["\ufffdMem", " 1626", " 8182", " 5262", " 4716", " 606", " 7894", " 5904"]
    clock = StepClock()
    monkeypatch.setattr(probe, "time", _ProbeTime(clock))
    chunks = chat_chunks(toks)
    fake.reply = Reply(chunks=chunks, first_delay=0.15, delay=0.01, clock=clock)
    r = await send_test_request(fake.url, model="/tmp/tinyllama", endpoint="chat", prompt="stream please",
                                max_tokens=8, max_model_len=2048, api_key=KEY, client=client)
    assert r.ok and r.kind == "ok" and r.status == 200, r.message
    assert r.finish_reason == "length"
    assert r.output_tokens == 8 and r.tokens_from_usage and r.prompt_tokens == 13
    ttft, total = 0.01 + 0.15, 0.01 + 0.15 + 0.01 * (len(chunks) - 2)
    assert r.ttft_s == pytest.approx(ttft)
    assert r.total_s == pytest.approx(total)
    assert r.tokens_per_s == pytest.approx(8 / total)
    assert r.decode_tokens_per_s == pytest.approx(7 / (total - ttft)) and r.decode_tokens_per_s > r.tokens_per_s
    assert r.text == "".join(toks)
    (req,) = fake.requests
    assert req["path"] == "/v1/chat/completions"
    body = req["json"]
    assert body["max_tokens"] == 8 and body["temperature"] == 0 and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "user", "content": "stream please"}]
    assert req["headers"]["authorization"] == f"Bearer {KEY}"
    # the key never comes back
    assert KEY not in repr(r) and KEY not in r.message


async def test_completions_without_usage_counts_chunks(fake: FakeVllm, client: HttpPool) -> None:
    fake.reply = Reply(chunks=completion_chunks([" 2907", " 390", " 390"]))
    r = await send_test_request(fake.url + "/v1", model="m", endpoint="completions", prompt="Hello",
                                max_tokens=3, max_model_len=None, api_key=None, client=client)
    assert r.ok and r.output_tokens == 3 and not r.tokens_from_usage and r.finish_reason == "length"
    (req,) = fake.requests
    assert req["path"] == "/v1/completions" and req["json"]["prompt"] == "Hello"
    assert "authorization" not in req["headers"]


@pytest.mark.parametrize("bad", [None, 0, -5, True, 3.5, "16"])
async def test_no_request_without_positive_max_tokens(fake: FakeVllm, client: HttpPool, bad: Any) -> None:
    r = await send_test_request(fake.url, model="m", endpoint="chat", prompt="hi", max_tokens=bad,
                                max_model_len=2048, api_key=KEY, client=client)
    assert not r.ok and r.kind == "invalid" and not r.sent
    assert "max_tokens" in r.message and "max_model_len" in r.message
    await asyncio.sleep(0.05)
    assert fake.requests == []


async def test_max_tokens_bounded_by_max_model_len(fake: FakeVllm, client: HttpPool) -> None:
    fake.reply = Reply(chunks=chat_chunks(["a", "b"]))
    r = await send_test_request(fake.url, model="m", endpoint="chat", prompt="Hello", max_tokens=100_000,
                                max_model_len=2048, api_key=None, client=client)
    sent = fake.requests[0]["json"]["max_tokens"]
    assert sent == 2048 - len(b"Hello") - TEMPLATE_MARGIN and sent < 2048
    assert r.max_tokens == sent and r.max_tokens_capped and "max_model_len=2048" in r.message


async def test_prompt_too_long_for_context_is_not_sent(fake: FakeVllm, client: HttpPool) -> None:
    r = await send_test_request(fake.url, model="m", endpoint="chat", prompt="x" * 100, max_tokens=4,
                                max_model_len=64, api_key=None, client=client)
    assert r.kind == "invalid" and fake.requests == []


async def test_http_400_message_from_vllm_error_body(fake: FakeVllm, client: HttpPool) -> None:
    err = {"error": {"message": "max_tokens=5000 cannot be greater than max_model_len=2048. Please request fewer "
                                "output tokens. (parameter=max_tokens, value=5000)", "type": "BadRequestError",
                     "param": "max_tokens", "code": 400}}
    fake.reply = Reply(status=400, body=json.dumps(err).encode())
    r = await send_test_request(fake.url, model="m", endpoint="completions", prompt="too long", max_tokens=16,
                                max_model_len=None, api_key=KEY, client=client)
    assert not r.ok and r.kind == "http" and r.status == 400
    assert "HTTP 400" in r.message and "cannot be greater than max_model_len" in r.message


async def test_http_500_and_401_with_key_echo_scrubbed(fake: FakeVllm, client: HttpPool) -> None:
    fake.reply = Reply(status=500, body=b"Internal Server Error")
    r = await send_test_request(fake.url, model="m", endpoint="chat", prompt="p", max_tokens=4,
                                max_model_len=None, api_key=KEY, client=client)
    assert r.kind == "http" and r.status == 500 and "HTTP 500" in r.message
    fake.reply = Reply(status=401, body=json.dumps({"error": f"bad key Bearer {KEY}"}).encode())
    r = await send_test_request(fake.url, model="m", endpoint="chat", prompt="p", max_tokens=4,
                                max_model_len=None, api_key=KEY, client=client)
    assert r.status == 401 and "API key" in r.message
    assert KEY not in repr(r)


async def test_hanging_server_times_out(fake: FakeVllm, client: HttpPool) -> None:
    # Proves: timeout_s ends a request the server never answers (it is still holding it
    # when the result comes back), and the result says so.
    fake.reply = Reply(hang=True)
    r = await asyncio.wait_for(send_test_request(fake.url, model="m", endpoint="chat", prompt="p", max_tokens=4,
                                                 max_model_len=None, api_key=None, client=client, timeout_s=0.4),
                               GUARD_S)
    assert fake.held.is_set() and not fake.release.is_set()
    assert not r.ok and r.kind == "timeout" and "timed out after 0.4 s" in r.message
    assert r.total_s is not None


async def test_stalled_stream_times_out_with_partial_text(fake: FakeVllm, client: HttpPool) -> None:
    # Proves: a stream that stops after its first token (held until the result is back)
    # is ended by timeout_s, as a timeout of a request that was sent.
    fake.reply = Reply(chunks=chat_chunks(["a", "b", "c"]), stall_after=2)
    r = await asyncio.wait_for(send_test_request(fake.url, model="m", endpoint="chat", prompt="p", max_tokens=4,
                                                 max_model_len=None, api_key=None, client=client, timeout_s=0.4),
                               GUARD_S)
    assert fake.held.is_set() and not fake.release.is_set()
    assert r.kind == "timeout" and r.sent


@pytest.mark.parametrize("chunks, needle", [
    (["data: {not json\n\n"], "bad JSON"),
    (["<html>oops</html>\n"], "not an SSE line"),
    (["data: [DONE]\n\n"], "no data chunks"),
    ([], "no data chunks"),
    (['data: {"error": {"message": "engine dead", "code": 500}}\n\n'], "engine dead"),
])
async def test_garbage_stream(fake: FakeVllm, client: HttpPool, chunks: list[str], needle: str) -> None:
    fake.reply = Reply(chunks=chunks)
    r = await send_test_request(fake.url, model="m", endpoint="chat", prompt="p", max_tokens=4,
                                max_model_len=None, api_key=KEY, client=client)
    assert not r.ok and r.kind == "bad_response" and needle in r.message, r.message


async def test_stream_without_finish_reason_is_not_ok(fake: FakeVllm, client: HttpPool) -> None:
    fake.reply = Reply(chunks=chat_chunks(["a"], finish="")[:2])  # role chunk + one token, then EOF
    r = await send_test_request(fake.url, model="m", endpoint="chat", prompt="p", max_tokens=4,
                                max_model_len=None, api_key=None, client=client)
    assert not r.ok and r.sent and "without a finish_reason" in r.message and r.text == "a"


async def test_connection_refused(client: HttpPool) -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    r = await send_test_request(f"http://127.0.0.1:{port}", model="m", endpoint="chat", prompt="p", max_tokens=4,
                                max_model_len=None, api_key=KEY, client=client)
    assert r.kind == "connect" and "Cannot connect" in r.message and not r.ok


async def test_fetch_models(fake: FakeVllm, client: HttpPool) -> None:
    ids, mml = await fetch_models(fake.url, client, KEY)
    assert ids == ["/tmp/tinyllama", "lora1"] and mml == 2048
    res = await fetch_models(fake.url, client, KEY)
    assert res.ok and fake.requests[-1]["headers"]["authorization"] == f"Bearer {KEY}"


async def test_fetch_models_down(client: HttpPool) -> None:
    res = await fetch_models("http://127.0.0.1:9", client, KEY, timeout_s=2)
    ids, mml = res
    assert not res.ok and ids == [] and mml is None and "cannot connect" in res.message
