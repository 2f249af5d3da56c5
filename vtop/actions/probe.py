"""The test-request key: one small, bounded, streamed request to see the server answer.

Why it works this way:

* **Never without max_tokens.** A chat request that omits ``max_tokens`` may
  generate up to ``max_model_len - prompt`` tokens (2030 tokens, 4.7 s on the
  tiny CPU model; minutes of a busy GPU on a 128k model). A monitoring tool
  must not be the thing that loads the server, so :func:`send_test_request`
  refuses to send anything without a positive ``max_tokens``, and caps it at
  ``max_model_len`` minus a margin for the prompt (vLLM answers 400 to
  ``max_tokens > max_model_len``).
* **Streamed** with ``stream_options.include_usage`` so time to first token
  is measured and the token count still comes from the server's ``usage``;
  ``temperature: 0`` so two probes are comparable.
* **The API key** goes only into the ``Authorization`` header; it is
  scrubbed from every string of the result (an error body or exception text
  could echo it).
* **Never raises**: refused, connection refused, timeout, HTTP errors and
  garbage all become a :class:`ProbeResult` with a distinct ``kind``.
* **vtop's own HTTP pool** (:class:`vtop.sources.http11.HttpPool`, the scrapes' pool):
  the request is streamed on a new connection of it and bounded by ``timeout_s`` as a
  whole (connect, head and every chunk).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal, TypedDict

from vtop.sources.http11 import HttpError, HttpPool, within

__all__ = ["ModelsResult", "ProbeResult", "fetch_models", "max_tokens_cap", "send_test_request"]

Endpoint = Literal["chat", "completions"]

#: Tokens kept free for the chat template around the prompt.
TEMPLATE_MARGIN = 64
TEXT_CAP = 2000

_WHY_MAX_TOKENS = (
    "a test request needs a positive max_tokens: without one a chat request may generate up to "
    "max_model_len tokens and load the server it is meant to check"
)


def max_tokens_cap(max_model_len: int | None, prompt: str) -> int | None:
    """The most output tokens a probe may ask for: ``max_model_len`` minus an upper bound of
    the prompt's tokens (its UTF-8 bytes; a token is at least one byte for byte-level BPE)
    and the chat template. None when the context length is unknown."""
    if not max_model_len or max_model_len <= 0:
        return None
    return max_model_len - len(prompt.encode()) - TEMPLATE_MARGIN


@dataclass(frozen=True)
class ProbeResult:
    """One test request. ``kind``: ok | invalid (not sent) | connect | timeout | http | bad_response.

    ``ttft_s``: send to the first chunk with output text. ``tokens_per_s``:
    output tokens over the whole request; ``decode_tokens_per_s``: tokens
    after the first over the time after it (the decode speed).
    """

    ok: bool
    message: str
    kind: str
    sent: bool = False
    status: int | None = None
    endpoint: str = "chat"
    model: str | None = None
    max_tokens: int | None = None
    max_tokens_capped: bool = False
    ttft_s: float | None = None
    total_s: float | None = None
    tokens_per_s: float | None = None
    decode_tokens_per_s: float | None = None
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    tokens_from_usage: bool = False
    finish_reason: str | None = None
    text: str = ""
    text_truncated: bool = False
    chunks: int = 0
    error: str | None = None


class _Common(TypedDict, total=False):
    """The :class:`ProbeResult` fields that every outcome of one request shares."""

    endpoint: str
    model: str | None
    max_tokens: int | None
    max_tokens_capped: bool


def _scrub(s: str | None, secret: str | None) -> str | None:
    if s is None or not secret:
        return s
    return s.replace(secret, "***")


def _scrubbed(r: ProbeResult, secret: str | None) -> ProbeResult:
    if not secret:
        return r
    return replace(r, message=_scrub(r.message, secret) or "", text=_scrub(r.text, secret) or "",
                   error=_scrub(r.error, secret))


def _base(url: str) -> str:
    u = url.rstrip("/")
    return u[:-3] if u.endswith("/v1") else u


def _headers(api_key: str | None) -> dict[str, str]:
    h = {"Accept": "text/event-stream, application/json"}
    if api_key:
        h["Authorization"] = f"Bearer {api_key}"
    return h


def _http_error(status: int, body: bytes) -> str:
    """vLLM's ``{"error": {"message": ...}}`` (or FastAPI's ``{"detail": ...}``), else the body's start."""
    text = body.decode(errors="replace").strip()
    msg = text[:300]
    try:
        js = json.loads(text)
        if isinstance(js, dict):
            err = js.get("error", js.get("detail", js.get("message")))
            if isinstance(err, dict):
                err = err.get("message", err)
            if err is not None:
                msg = str(err)[:300]
    except ValueError:
        pass
    hint = {401: " (wrong or missing API key)", 404: " (wrong model name or endpoint)",
            503: " (server not ready or engine dead)"}.get(status, "")
    return f"HTTP {status}{hint}: {msg}" if msg else f"HTTP {status}{hint}"


def _chunk_text(ch: dict[str, Any]) -> str | None:
    delta = ch.get("delta")
    if isinstance(delta, dict):
        c = delta.get("content")
        if c is None:
            c = delta.get("reasoning_content", delta.get("reasoning"))
        return c if isinstance(c, str) else None
    t = ch.get("text")
    return t if isinstance(t, str) else None


async def send_test_request(
    url: str,
    *,
    model: str,
    endpoint: Endpoint = "chat",
    prompt: str = "Say hello.",
    max_tokens: int | None,
    max_model_len: int | None = None,
    api_key: str | None = None,
    client: HttpPool,
    timeout_s: float = 120,
) -> ProbeResult:
    """Send one streamed test request and measure it; never raises.

    Refuses (``kind="invalid"``, nothing sent) without a positive
    ``max_tokens``; bounds it by ``max_model_len`` (see :func:`max_tokens_cap`).
    """
    base: _Common = {"endpoint": endpoint, "model": model}
    req = _request(endpoint, model, prompt, max_tokens, max_model_len, base)
    if isinstance(req, ProbeResult):
        return req
    body, path, cap_note = req

    st: dict[str, Any] = {"status": None, "ttft": None, "finish": None, "usage": None, "parts": [], "chars": 0,
                          "chunks": 0, "truncated": False}
    t0 = time.monotonic()

    async def run() -> ProbeResult:
        hdrs = [*_headers(api_key).items(), ("Content-Type", "application/json"), ("Accept-Encoding", "identity")]
        async with client.stream("POST", _base(url) + path, headers=hdrs, body=json.dumps(body).encode(),
                                 connect_timeout=min(timeout_s, 10.0)) as r:
            status = r.status or 0
            st["status"] = status
            if status != 200:
                raw = await r.read(4096)
                err = _http_error(status, raw)
                return ProbeResult(False, f"Test request failed: {err}", "http", sent=True,
                                   status=status, error=err, **base)
            saw_done = False
            async for line in r.lines():
                line = line.strip()
                if not line or line.startswith(":"):
                    continue
                if not line.startswith("data:"):
                    if line.startswith(("event:", "id:", "retry:")):
                        continue
                    raise _Garbage(f"not an SSE line: {line[:80]!r}")
                data = line[5:].strip()
                if data == "[DONE]":
                    saw_done = True
                    break
                try:
                    chunk = json.loads(data)
                except ValueError:
                    raise _Garbage(f"bad JSON in an SSE chunk: {data[:80]!r}") from None
                if not isinstance(chunk, dict):
                    raise _Garbage(f"unexpected SSE chunk: {data[:80]!r}")
                if "error" in chunk:  # vLLM streams errors as a data chunk
                    e = chunk["error"]
                    raise _Garbage(f"server error in the stream: {(e.get('message') if isinstance(e, dict) else e)}")
                st["chunks"] += 1
                if isinstance(chunk.get("usage"), dict):
                    st["usage"] = chunk["usage"]
                for ch in chunk.get("choices") or []:
                    if not isinstance(ch, dict):
                        continue
                    text = _chunk_text(ch)
                    if text:
                        if st["ttft"] is None:
                            st["ttft"] = time.monotonic() - t0
                        st["counted"] = st.get("counted", 0) + 1
                        if st["chars"] < TEXT_CAP:
                            st["parts"].append(text[: TEXT_CAP - st["chars"]])
                            st["truncated"] |= st["chars"] + len(text) > TEXT_CAP
                            st["chars"] += len(text)
                        else:
                            st["truncated"] = True
                    if ch.get("finish_reason"):
                        st["finish"] = ch["finish_reason"]
            total = time.monotonic() - t0
            if st["chunks"] == 0:
                raise _Garbage("the stream held no data chunks" + ("" if saw_done else " (no [DONE])"))
            return _answered(st, total, cap_note, base)

    def partial(kind: str, msg: str, err: str) -> ProbeResult:
        return ProbeResult(False, msg, kind, sent=True, status=st["status"], total_s=time.monotonic() - t0,
                           ttft_s=st["ttft"], text="".join(st["parts"]), chunks=st["chunks"],
                           finish_reason=st["finish"], error=err, **base)

    try:
        res = await asyncio.wait_for(run(), timeout_s)
    except asyncio.TimeoutError:
        got = " (it had started answering)" if st["chunks"] else ""
        res = partial("timeout", f"Test request timed out after {timeout_s:g} s{got}", "timeout")
    except HttpError as e:
        if e.kind in ("refused", "dns") or (e.kind == "timeout" and st["status"] is None):
            kind = "timeout" if e.kind == "timeout" else "connect"
            res = ProbeResult(False, f"Cannot connect to {_base(url)}: {_short(e)} (server starting, or down)",
                              kind, error=_short(e), **base)
        else:
            res = partial("bad_response", f"Test request failed: {_short(e)}", _short(e))
    except _Garbage as e:
        res = partial("bad_response", f"Test request got a bad response: {e}", str(e))
    except (OSError, UnicodeError) as e:
        res = partial("bad_response", f"Test request failed: {type(e).__name__}: {_short(e)}", _short(e))
    except Exception as e:  # noqa: BLE001 - never raise to the UI
        res = partial("bad_response", f"Test request failed: {type(e).__name__}: {_short(e)}", _short(e))
    return _scrubbed(res, api_key)


def _request(endpoint: Endpoint, model: str, prompt: str, max_tokens: int | None, max_model_len: int | None,
             base: _Common) -> ProbeResult | tuple[dict[str, Any], str, str]:
    """The request's body, path and the note on a lowered ``max_tokens``; or why it is not sent
    (``kind="invalid"``). Fills ``base``'s ``max_tokens`` and ``max_tokens_capped``."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0:
        return ProbeResult(False, f"Not sent: max_tokens={max_tokens!r}; {_WHY_MAX_TOKENS}.", "invalid", **base)
    if endpoint not in ("chat", "completions"):
        return ProbeResult(False, f"Not sent: unknown endpoint {endpoint!r} (chat or completions)", "invalid", **base)
    if not model:
        return ProbeResult(False, "Not sent: no model name (read it from /v1/models first)", "invalid", **base)
    capped = False
    cap = max_tokens_cap(max_model_len, prompt)
    if cap is not None:
        if cap < 1:
            return ProbeResult(False, f"Not sent: the prompt leaves no room for output within max_model_len="
                                      f"{max_model_len}", "invalid", **base)
        if max_tokens > cap:
            max_tokens, capped = cap, True
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                            "stream_options": {"include_usage": True}}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = prompt
        path = "/v1/completions"
    cap_note = (f" (max_tokens lowered to {max_tokens} to fit max_model_len={max_model_len}; "
                "an unbounded chat request can run to max_model_len)") if capped else ""
    base["max_tokens"] = max_tokens
    base["max_tokens_capped"] = capped
    return body, path, cap_note


def _answered(st: dict[str, Any], total: float, cap_note: str, base: _Common) -> ProbeResult:
    """The result of a stream that ended (``st``: what it brought): the tokens (the server's ``usage``,
    else the chunks counted), TTFT, the rates, and whether it finished."""
    usage = st["usage"] or {}
    completion_tokens = usage.get("completion_tokens")
    from_usage = isinstance(completion_tokens, int)
    out_tokens: int = completion_tokens if isinstance(completion_tokens, int) else st.get("counted", 0)
    ttft = st["ttft"]
    tps = out_tokens / total if total > 0 else None
    dtps = ((out_tokens - 1) / (total - ttft)) if ttft is not None and out_tokens > 1 and total > ttft else None
    finish = st["finish"]
    ok = finish is not None
    note = "" if ok else " (stream ended without a finish_reason)"
    parts = [f"{out_tokens} tokens in {total:.2f} s"]
    if ttft is not None:
        parts.append(f"TTFT {ttft:.3f} s")
    if tps is not None:
        parts.append(f"{tps:.1f} tok/s")
    parts.append(f"finish_reason={finish}")
    msg = ("OK: " if ok else "Incomplete: ") + ", ".join(parts) + note + cap_note
    return ProbeResult(
        ok, msg, "ok" if ok else "bad_response", sent=True, status=200, ttft_s=ttft, total_s=total,
        tokens_per_s=tps, decode_tokens_per_s=dtps, output_tokens=out_tokens,
        prompt_tokens=usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else None,
        tokens_from_usage=from_usage, finish_reason=finish, text="".join(st["parts"]),
        text_truncated=st["truncated"], chunks=st["chunks"], error=None if ok else "no finish_reason", **base,
    )


class _Garbage(Exception):
    pass


def _short(e: BaseException) -> str:
    s = str(e).strip() or type(e).__name__
    return s.splitlines()[0][:200]


@dataclass(frozen=True)
class ModelsResult:
    """``/v1/models``: ids and the first base model's ``max_model_len``.

    Unpacks as ``ids, max_model_len = await fetch_models(...)``; ``ok`` and
    ``message`` tell why the list is empty.
    """

    ok: bool
    message: str
    ids: tuple[str, ...] = ()
    max_model_len: int | None = None
    status: int | None = None

    def __iter__(self) -> Iterator[Any]:
        yield list(self.ids)
        yield self.max_model_len


#: the most of a /v1/models answer read (a server with many LoRA adapters lists each)
MODELS_LIMIT = 4 * 1024 * 1024


async def fetch_models(url: str, client: HttpPool, api_key: str | None = None,
                       timeout_s: float = 10) -> ModelsResult:
    """``GET /v1/models``; never raises."""
    try:
        status, content = await within(
            client.get(_base(url) + "/v1/models", headers=[*_headers(api_key).items(), ("Accept-Encoding", "identity")],
                       limit=MODELS_LIMIT, connect_timeout=timeout_s), timeout_s)
    except (asyncio.TimeoutError, TimeoutError):
        return ModelsResult(False, f"/v1/models: no answer within {timeout_s:g} s")
    except HttpError as e:
        if e.kind == "timeout":
            return ModelsResult(False, f"/v1/models: no answer within {timeout_s:g} s")
        if e.kind in ("refused", "dns"):
            return ModelsResult(False, _scrub(f"/v1/models: cannot connect ({_short(e)})", api_key) or "")
        return ModelsResult(False, _scrub(f"/v1/models: {_short(e)}", api_key) or "", status=e.status)
    except Exception as e:  # noqa: BLE001
        return ModelsResult(False, _scrub(f"/v1/models: {type(e).__name__}: {_short(e)}", api_key) or "")
    if status != 200:
        return ModelsResult(False, _scrub(f"/v1/models: {_http_error(status, content[:4096])}", api_key) or "",
                            status=status)
    try:
        data = json.loads(content)["data"]
        ids = tuple(str(m["id"]) for m in data if isinstance(m, dict) and "id" in m)
    except (ValueError, KeyError, TypeError):
        return ModelsResult(False, "/v1/models: not an OpenAI model list", status=status)
    mml: int | None = None
    for m in data:
        if isinstance(m, dict) and not m.get("parent") and isinstance(m.get("max_model_len"), int):
            mml = m["max_model_len"]
            break
    if not ids:
        return ModelsResult(False, "/v1/models: the server lists no models", status=200)
    return ModelsResult(True, f"{len(ids)} model(s): {', '.join(ids[:3])}", ids, mml, 200)
