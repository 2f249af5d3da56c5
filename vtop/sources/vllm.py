"""Poll one vLLM server over HTTP: ``/metrics`` every time, the rest less often.

Why it is built this way:

* **``poll()`` never raises.** Every failure becomes a :class:`ServerPoll`
  with an error kind (``refused``, ``timeout``, ``http 500``, ``not vllm``,
  ``garbage``, ``too large``, ``reset``, ``dns``, ``other``) and one plain
  sentence. A dashboard that shows "connection refused" beats one that
  dies; only cancellation (the caller stopping the worker) propagates.
* **Refused is not dead.** vLLM binds its port but does not listen during
  the whole startup (minutes), so ``refused`` only says "nothing answers";
  :mod:`vtop.core.server` decides between ``starting`` and ``down`` with the
  process table.
* **Bounded in time and memory.** A connect timeout (1 s) and a deadline
  for the whole request (connect + read, 3 s: a server trickling bytes must
  not hold a 1 s poll for ever). The body is read as it comes and reading
  stops at ``max_body_bytes`` (16 MiB; a real payload is ~50 KB), and
  ``Accept-Encoding: identity`` is sent so a small gzip body cannot inflate
  into a huge one. The requests themselves go through
  :mod:`vtop.sources.http11` (h11 on asyncio streams, kept-alive), which
  costs a quarter of httpx's CPU per request (measured there).
* **Only the metrics it reads, when the server can say so.** vLLM serves
  ``/metrics`` with prometheus_client, which restricts its answer to the
  sample names given as ``?name[]=...``: 14 KB instead of 50 KB on the H200,
  parsed in 60 % of the time, and less work for the API server that
  renders it every second. Not every server can (vLLM's multi-process
  registry, ``--api-server-count`` > 1, answers nothing to it; a proxy may
  refuse the query), so a full scrape comes first and every minute, and a
  restricted answer is used only while it fills everything the last full
  one filled; when it does not, the full one is fetched in the same poll
  and restricted scrapes stop for ten minutes.
* **Histograms every few seconds.** The latency and request-size histograms
  are ~85 % of those samples, and what vtop shows of them is windowed (p50/p95/
  p99 over a minute, requests that finished with a huge ``max_tokens``): so
  they are asked for every ``HIST_EVERY_S`` (5 s), and the polls between ask
  for the other samples only (3 KB instead of 14 KB; parse 0.6 -> 0.2 ms in
  the app, 2-core VM) and carry the last histograms over, saying how old they
  are (``VllmMetrics.histograms_age_s``); the tracker files them at the time
  they were read, so no window counts one twice.
* **Parsing stays off the event loop when it could hurt.** A real 50 KB
  payload parses in under 1 ms warm (``vtop.sources.metrics_text``), so it is
  parsed inline; bodies over ``thread_parse_bytes`` (256 KiB) go through
  ``asyncio.to_thread``.
* **``/health``, ``/v1/models``, ``/version`` are polled less often**
  (health every ``health_every_s``, 5 s; models/version every
  ``info_every_s``, 60 s: they only change with a restart, which breaks the
  connection and refreshes them anyway, or with a LoRA adapter loaded),
  and all of them right after a (re)connect, when the model or version may
  have changed. While ``/health`` is not 200 it is polled every time so
  recovery shows at once.
* **The API key goes to ``/v1/*`` only** (vLLM's ``/metrics``, ``/health``,
  ``/version`` need none) and is scrubbed from every string this module
  produces, including error pages a proxy might echo headers into; no
  response body from ``/v1/*`` is ever copied into a message.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields, replace
from typing import Any
from urllib.parse import urlencode

from vtop.clock import Clock
from vtop.model.server import ERROR_KINDS, ModelsInfo, ServerPoll
from vtop.sources.http11 import HttpError, HttpPool, host_port, split_url, within
from vtop.sources.metrics_text import (
    HIST_ATTRS,
    HISTOGRAM_FAMILIES,
    SLOW_SAMPLE_NAMES,
    WANTED_SAMPLE_NAMES,
    EngineMetrics,
    VllmMetrics,
    parse_vllm_metrics,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "ERROR_KINDS",
    "ModelsInfo",
    "ServerPoll",
    "VllmScraper",
    "classify_body",
    "poll_from_body",
    "poll_from_error",
]

@dataclass(frozen=True, slots=True)
class Timeout:
    """Seconds to connect, and to read the answer once connected; a whole
    request gets ``connect + read`` (the scraper's deadline)."""

    connect: float = 1.0
    read: float = 2.0


DEFAULT_TIMEOUT = Timeout()
#: seconds between full scrapes while restricted ones are used
FULL_EVERY_S = 60.0
#: seconds before restricted scrapes are tried again after one fell short
RESTRICTED_RETRY_S = 600.0
#: seconds between reads of the histograms while restricted scrapes are used
HIST_EVERY_S = 5.0
MAX_BODY_BYTES = 16 * 1024 * 1024
THREAD_PARSE_BYTES = 256 * 1024
_INFO_BODY_BYTES = 1024 * 1024  # /v1/models with many LoRA adapters is still far below

#: ``/metrics`` restricted to the samples vtop reads (prometheus_client's ``name[]``).
#: With the slash: vLLM answers ``/metrics`` itself with prometheus-fastapi-instrumentator's
#: handler, which ignores the query; ``/metrics/`` goes to the prometheus_client app that
#: vLLM mounts beside it, on the same registry, which honours it (checked on the real
#: server, tests/real/test_real_server_smoke.py).
METRICS_PATH = "/metrics"
#: the sample names each restricted path asks for
RESTRICTED_NAMES: tuple[str, ...] = WANTED_SAMPLE_NAMES
FAST_NAMES: tuple[str, ...] = tuple(n for n in WANTED_SAMPLE_NAMES if n not in SLOW_SAMPLE_NAMES)
RESTRICTED_METRICS_PATH = "/metrics/?" + urlencode([("name[]", n) for n in RESTRICTED_NAMES])
#: The same without the histograms and the static cache_config_info (the polls between two
#: histogram reads).
FAST_METRICS_PATH = "/metrics/?" + urlencode([("name[]", n) for n in FAST_NAMES])
#: what each path asks for (None: everything)
PATH_NAMES: dict[str, tuple[str, ...] | None] = {
    METRICS_PATH: None, RESTRICTED_METRICS_PATH: RESTRICTED_NAMES, FAST_METRICS_PATH: FAST_NAMES,
}

#: every reading an engine row can hold (a field added there is compared too)
_ENGINE_FIELDS = tuple(f.name for f in fields(EngineMetrics) if f.name not in ("engine", "model_name"))
_PLAIN_FIELDS = tuple(f for f in _ENGINE_FIELDS if f not in HIST_ATTRS)


def coverage(m: VllmMetrics, *, histograms: bool = True) -> frozenset[str]:
    """What a payload filled, engine by engine (``engine 0: running``...): a restricted
    answer is good when it fills all that the last full one did. ``histograms=False``:
    the fields a poll without histograms must fill."""
    out = set()
    for e in m.engines:
        for f in _ENGINE_FIELDS if histograms else _PLAIN_FIELDS:
            v = getattr(e, f)
            if v is not None and v != {}:
                out.add(f"{e.engine}: {f}")
    if m.kv_cache_metric:
        out.add(m.kv_cache_metric)
    if m.inter_token_metric and histograms:
        out.add(m.inter_token_metric)
    return frozenset(out)


def with_histograms(m: VllmMetrics, src: VllmMetrics, age_s: float) -> VllmMetrics:
    """``m`` (read without histograms) with ``src``'s histograms, engine by engine,
    read ``age_s`` seconds earlier; ``src``'s problems with a histogram come along
    (so a broken one does not blink in and out)."""
    rows = {e.engine: e for e in src.engines}
    engines = tuple(
        replace(e, **{a: getattr(rows[e.engine], a) for a in HIST_ATTRS}) if e.engine in rows else e
        for e in m.engines
    )
    problems = m.problems + tuple(
        p for p in src.problems if p not in m.problems and any(f in p for f in HISTOGRAM_FAMILIES))
    return replace(
        m, engines=engines, inter_token_metric=src.inter_token_metric, histograms_age_s=age_s,
        cache_config=src.cache_config if m.cache_config is None else m.cache_config,
        problems=problems, **{a: getattr(src, a) for a in HIST_ATTRS},
    )


def restrict_exposition(text: str, names: frozenset[str] | set[str] | tuple[str, ...]) -> str:
    """A full exposition ``text`` as a server answers ``?name[]=...`` for ``names``
    (prometheus_client's restricted registry: a sample is kept by its own name, so a
    histogram's ``_bucket`` apart from its ``_sum``; each family that keeps a sample keeps its
    HELP/TYPE lines). What a replay of a recorded full scrape gives for a restricted one."""
    keep = names if isinstance(names, (set, frozenset)) else frozenset(names)
    out: list[str] = []
    family: str | None = None
    header: list[str] = []
    shown = False
    for line in text.splitlines(keepends=True):
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                if parts[2] != family:
                    family, header, shown = parts[2], [], False
                header.append(line)
            continue
        end = len(line)
        for ch in ("{", " ", "\t"):
            i = line.find(ch)
            if 0 <= i < end:
                end = i
        if line[:end] in keep:
            if not shown:
                out.extend(header)
                shown = True
            out.append(line)
    return "".join(out)


#: seconds between ``/health`` polls while it answers 200 (every poll while it does not, and on a new connection)
HEALTH_EVERY_S = 5.0


class ScrapePlan:
    """Which ``/metrics`` a poll asks for, and what a restricted answer is worth: the
    scraper's schedule without the I/O, so that a replayed trace (:mod:`vtop.sources.recording.trace`,
    full scrapes recorded once a second) gives the rules what a live vtop would have read,
    histograms only at the live cadence, carried over in between with their age.

    A full scrape first (on every new connection) and every ``full_every_s``; between them
    restricted ones (``name[]``): with the histograms every ``hist_every_s``, without them
    otherwise (the last histograms carried over, :func:`with_histograms`). A restricted
    answer is used only while it fills what the last full one did; else the full one is
    fetched in the same poll and restricted scrapes stop for ``retry_s``.
    """

    def __init__(self, *, full_every_s: float = FULL_EVERY_S, hist_every_s: float = HIST_EVERY_S,
                 retry_s: float = RESTRICTED_RETRY_S) -> None:
        self.full_every_s = full_every_s
        self.hist_every_s = hist_every_s
        self.retry_s = retry_s
        #: what the last full /metrics filled (with and without its histograms), and when it
        #: came (restricted scrapes are checked against it); None until one came on this connection
        self.full_cov: frozenset[str] | None = None
        self.fast_cov: frozenset[str] | None = None
        self.full_at = 0.0
        #: restricted answers: None untried, True good, False not (until retry_at)
        self.restricted_ok: bool | None = None
        self.retry_at = 0.0
        #: polls answered from a restricted scrape (tests, bench)
        self.restricted_polls = 0
        #: the last metrics read with their histograms (carried over by the polls that read none), and when
        self.hist: VllmMetrics | None = None
        self.hist_at = 0.0

    def reconnect(self) -> None:
        """A new connection (maybe another process now): a full scrape first."""
        self.full_cov = None
        self.hist = None

    def path(self, mono: float) -> str:
        """The ``/metrics`` path to ask for at ``mono``."""
        if self.restricted_ok is False and mono >= self.retry_at:
            self.restricted_ok = None
        if not self.full_cov or self.restricted_ok is False or mono - self.full_at >= self.full_every_s:
            return METRICS_PATH
        if self.hist is None or mono - self.hist_at >= self.hist_every_s:
            return RESTRICTED_METRICS_PATH
        return FAST_METRICS_PATH

    def took_full(self, m: VllmMetrics, mono: float) -> None:
        """A full scrape answered ``m`` (parsed) at ``mono``."""
        if m.is_vllm and m.engines:
            self.full_cov = coverage(m)
            self.fast_cov = coverage(m, histograms=False)
            self.full_at = mono
            self.hist, self.hist_at = m, mono

    def took_restricted(self, m: VllmMetrics | None, mono: float, *, fast: bool) -> VllmMetrics | None:
        """What a restricted answer (``m`` parsed, None when it was not a 200) gives the poll:
        itself, or without histograms (``fast``) itself with the last ones carried over; None
        when it falls short (the full ``/metrics`` must be fetched now: :meth:`took_full`)."""
        if m is not None:
            full_cov, hist, cov = self.full_cov, self.hist, coverage(m)
            # An empty answer never passes: coverage() of a full scrape that filled nothing is empty.
            if full_cov and cov >= full_cov:  # histograms and all (or a server that ignores name[])
                self.restricted_ok = True
                self.restricted_polls += 1
                self.hist, self.hist_at = m, mono
                return m
            # fast_cov has no histogram entry, so cov covers it exactly when the rest is all there
            if fast and full_cov and hist is not None and self.fast_cov is not None and cov >= self.fast_cov:
                self.restricted_ok = True
                self.restricted_polls += 1
                return with_histograms(m, hist, mono - self.hist_at)
        self.restricted_ok = False
        self.retry_at = mono + self.retry_s
        return None


_SAMPLE_RE = re.compile(rb"^[A-Za-z_:][A-Za-z0-9_:]*(\{[^\n]*\})?[ \t]+[-+0-9.eEnaNIf]+", re.M)


def classify_body(body: bytes, metrics: VllmMetrics) -> tuple[str | None, str]:
    """``(error kind or None, message)`` for a 200 answer on ``/metrics``."""
    n = len(body)
    if metrics.is_vllm:
        return None, f"ok: {n} bytes of vLLM metrics"
    head = body[:4096].lstrip()
    low = head[:200].lower()
    if not head:
        return "not vllm", "/metrics answered an empty page: not a vLLM server"
    if low.startswith((b"<!doctype", b"<html", b"<?xml", b"<")):
        return "not vllm", "/metrics answered an HTML page, not Prometheus metrics (a proxy or another web app?)"
    if low.startswith((b"{", b"[")):
        return "not vllm", "/metrics answered JSON, not Prometheus metrics: not a vLLM server"
    try:
        body[:65536].decode("utf-8")
        text_ok = True
    except UnicodeDecodeError as exc:
        text_ok = exc.start > 65500  # cut in the middle of a character
    if text_ok and (_SAMPLE_RE.search(body[:65536]) or b"# TYPE " in body[:65536]):
        return "not vllm", (
            "/metrics has Prometheus metrics but none from vLLM "
            "(another exporter on this port, or vLLM run with --disable-log-stats)"
        )
    return "garbage", f"/metrics answered {n} bytes that are not Prometheus text"


def poll_from_body(
    url: str,
    body: bytes | str,
    *,
    t: float,
    mono: float,
    latency_s: float | None = None,
    status: int = 200,
    metrics: VllmMetrics | None = None,
    **extra: Any,
) -> ServerPoll:
    """A :class:`ServerPoll` for a ``/metrics`` answer (used by the scraper
    and by replays of recorded timelines). ``extra`` sets the other fields
    (health, models, version...)."""
    raw = body.encode("utf-8", "replace") if isinstance(body, str) else body
    if status != 200:
        return ServerPoll(
            t=t, mono=mono, url=url, ok=False, error=f"http {status}",
            message=f"/metrics answered HTTP {status}{_reason(status)}", latency_s=latency_s,
            body_bytes=len(raw), status=status, **extra,
        )
    m = metrics if metrics is not None else parse_vllm_metrics(raw)
    kind, msg = classify_body(raw, m)
    return ServerPoll(
        t=t, mono=mono, url=url, ok=kind is None, error=kind, message=msg, latency_s=latency_s,
        body_bytes=len(raw), metrics=m, status=status, **extra,
    )


def poll_from_error(
    url: str, kind: str, *, t: float, mono: float, message: str | None = None, latency_s: float | None = None,
    body_bytes: int = 0, **extra: Any,
) -> ServerPoll:
    """A failed :class:`ServerPoll` (also for replays: a recorded
    ``ConnectError`` on loopback is ``refused``)."""
    return ServerPoll(
        t=t, mono=mono, url=url, ok=False, error=kind, message=message or _default_message(kind, url),
        latency_s=latency_s, body_bytes=body_bytes, **extra,
    )


def _reason(status: int) -> str:
    try:
        from http import HTTPStatus

        return f" ({HTTPStatus(status).phrase})"
    except ValueError:
        return ""


def _basic_auth(userinfo: str) -> str:
    """``Authorization: Basic`` for ``user:password`` (:func:`vtop.model.redact.basic_auth`), imported here: the
    redaction module's some twenty patterns are for a URL given with credentials, not every scrape."""
    from vtop.model.redact import basic_auth

    return basic_auth(userinfo)


def _hostport(url: str) -> str:
    try:
        _, host, port, _ = split_url(url)
    except ValueError:
        return url
    return host_port(host, port)


def _default_message(kind: str, url: str) -> str:
    hp = _hostport(url)
    return {
        "refused": f"nothing listens on {hp} (connection refused): vLLM is starting or not running",
        "timeout": f"no answer from {url} in time",
        "reset": f"{hp} dropped the connection before the answer was complete",
        "dns": f"cannot resolve the host of {url}",
        "too large": f"{url}/metrics sent more than {MAX_BODY_BYTES // (1024 * 1024)} MiB; stopped reading",
        "garbage": f"{url}/metrics answered something that is not Prometheus text",
        "not vllm": f"{url}/metrics answers but is not a vLLM server",
    }.get(kind, f"cannot reach {url}")


# --- the scraper ------------------------------------------------------------------


# A failed request: HttpError's kind, the scraper's own sentence, the body bytes
# received (``got``) and the status when one came back.
_Fail = HttpError


class VllmScraper:
    """Polls one server. Give it one long-lived :class:`HttpPool` (shared
    by all scrapers) and call :meth:`poll` about once a second from an async
    worker; one poll at a time per scraper."""

    def __init__(
        self,
        url: str,
        *,
        client: HttpPool,
        api_key: str | None = None,
        userinfo: str | None = None,
        clock: Clock,
        timeout: Timeout | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        thread_parse_bytes: int = THREAD_PARSE_BYTES,
        health_every_s: float = HEALTH_EVERY_S,
        info_every_s: float = 60.0,
        deadline_s: float | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self._client = client
        self.api_key: str | None = api_key or None
        """The key sent to the `/v1` endpoints (never to `/metrics` or `/health`); settable."""
        self._basic = _basic_auth(userinfo) if userinfo else None
        """``Authorization: Basic`` for every request when the URL was given with ``user:password@``
        (a proxy in front of vLLM); ``url`` holds the password masked (vtop.config)."""
        self._clock = clock
        self.timeout = timeout or DEFAULT_TIMEOUT
        self.max_body_bytes = max_body_bytes
        self.thread_parse_bytes = thread_parse_bytes
        self.health_every_s = health_every_s
        self.info_every_s = info_every_s
        t = self.timeout
        #: whole-request budget
        self.deadline_s = deadline_s if deadline_s is not None else (t.connect or 1.0) + (t.read or 2.0)
        self._connected = False
        self._last_health: float | None = None
        self._last_info: float | None = None
        self._health_bad = False
        #: which /metrics to ask for, and what the answers are worth (shared with trace replays)
        self.plan = ScrapePlan()

    # The schedule's knobs and counters, as the scraper's own (tests, bench).
    @property
    def FULL_EVERY_S(self) -> float:  # noqa: N802 - kept from when it was a class constant
        return self.plan.full_every_s

    @FULL_EVERY_S.setter
    def FULL_EVERY_S(self, v: float) -> None:  # noqa: N802
        self.plan.full_every_s = v

    @property
    def HIST_EVERY_S(self) -> float:  # noqa: N802
        return self.plan.hist_every_s

    @HIST_EVERY_S.setter
    def HIST_EVERY_S(self, v: float) -> None:  # noqa: N802
        self.plan.hist_every_s = v

    @property
    def restricted_ok(self) -> bool | None:
        return self.plan.restricted_ok

    @property
    def restricted_polls(self) -> int:
        return self.plan.restricted_polls

    def __repr__(self) -> str:
        return f"VllmScraper(url={self.url!r}, api_key={'***' if self.api_key else None})"

    # -- helpers --

    def _scrub(self, text: str) -> str:
        """Remove the API key (and any bearer token) from text we produce."""
        if self.api_key and self.api_key in text:
            text = text.replace(self.api_key, "***")
        return re.sub(r"(?i)(bearer\s+)\S+", r"\1***", text)

    async def _get(self, path: str, limit: int, *, auth: bool = False) -> tuple[int, bytes]:
        """GET with a deadline and a bounded body. Raises :class:`_Fail`."""
        headers = [("Accept-Encoding", "identity")]
        if auth and self.api_key:
            headers.append(("Authorization", f"Bearer {self.api_key}"))
        elif self._basic is not None:
            headers.append(("Authorization", self._basic))
        fetch = self._client.get(self.url + path, headers=headers, limit=limit,
                                 connect_timeout=self.timeout.connect)
        try:
            # within(), not asyncio.wait_for: on Python 3.11 a cancel that came as the
            # answer did was dropped and the scrape task polled on (see http11.within)
            return await within(fetch, self.deadline_s)
        except asyncio.CancelledError:
            raise
        except (asyncio.TimeoutError, TimeoutError) as exc:
            raise _Fail("timeout",
                        f"{path}: no complete answer from {self.url} within {self.deadline_s:.1f} s") from exc
        except HttpError as e:
            raise _Fail(e.kind, self._message(e, path), e.got, e.status) from e

    def _message(self, e: HttpError, path: str) -> str:
        """The sentence for a failed request, in the scraper's words (scrubbed)."""
        hp = _hostport(self.url)
        if e.kind == "refused":
            return f"nothing listens on {hp} (connection refused): vLLM is starting or not running"
        if e.kind == "timeout":
            return f"no connect from {self.url} within {self.timeout.connect:.1f} s"
        if e.kind == "reset":
            if e.got:
                return f"{hp} dropped the connection in the middle of {path} ({e.got} bytes received)"
            return f"{hp} dropped the connection before the answer was complete"
        if e.kind in ("too large", "garbage"):
            return f"{path}: {e.message}" if e.kind == "garbage" else f"{path} {e.message}"
        return self._scrub(e.message)

    # -- the poll --

    async def poll(self) -> ServerPoll:
        """One poll. Never raises (except cancellation)."""
        t = self._clock.time()
        mono = self._clock.monotonic()
        try:
            return await self._poll(t, mono)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a bug here must not kill the panel
            self._connected = False
            return poll_from_error(
                self.url, "other", t=t, mono=mono,
                message=self._scrub(f"internal error while polling: {_short(exc)}"),
            )

    async def _poll(self, t: float, mono: float) -> ServerPoll:
        start = self._clock.monotonic()
        if not self._connected:
            self.plan.reconnect()  # maybe another process now: a full scrape first
        path = self.plan.path(mono)
        metrics: VllmMetrics | None = None
        try:
            status, body = await self._get(path, self.max_body_bytes)
            if path != METRICS_PATH:
                status, body, metrics = await self._check_restricted(
                    status, body, mono, fast=path == FAST_METRICS_PATH)
        except _Fail as f:
            latency = self._clock.monotonic() - start
            was = self._connected
            self._connected = f.status is not None
            extra: dict[str, Any] = {}
            if f.status is not None:
                extra = await self._extras(mono, reconnect=not was)
            return poll_from_error(
                self.url, f.kind, t=t, mono=mono, message=self._scrub(f.message), latency_s=latency,
                body_bytes=f.got, status=f.status, **extra,
            )
        latency = self._clock.monotonic() - start
        reconnect = not self._connected
        self._connected = True
        if status == 200 and metrics is None:
            metrics = await self._parse(body)
            self.plan.took_full(metrics, mono)
        extra = await self._extras(mono, reconnect=reconnect)
        p = poll_from_body(self.url, body, t=t, mono=mono, latency_s=latency, status=status, metrics=metrics, **extra)
        return p

    async def _parse(self, body: bytes) -> VllmMetrics:
        if len(body) > self.thread_parse_bytes:
            return await asyncio.to_thread(parse_vllm_metrics, body)
        return parse_vllm_metrics(body)

    async def _check_restricted(
        self, status: int, body: bytes, mono: float, *, fast: bool = False,
    ) -> tuple[int, bytes, VllmMetrics | None]:
        """A restricted answer that fills what the last full one did is used, parsed
        (``fast``: what it did less the histograms, which then come from the last read
        of them); else restricted scrapes stop for a while and the full /metrics is
        fetched now (parsed by the caller), so the poll has no gap."""
        m = await self._parse(body) if status == 200 else None
        got = self.plan.took_restricted(m, mono, fast=fast)
        if got is not None:
            return status, body, got
        status, body = await self._get(METRICS_PATH, self.max_body_bytes)
        return status, body, None

    async def _extras(self, mono: float, *, reconnect: bool) -> dict[str, Any]:
        """/health, /v1/models, /version when due; their results as
        ServerPoll fields. Never raises."""
        want_health = (
            reconnect or self._health_bad or self._last_health is None
            or mono - self._last_health >= self.health_every_s
        )
        want_info = reconnect or self._last_info is None or mono - self._last_info >= self.info_every_s
        out: dict[str, Any] = {}
        notes: list[str] = []
        # The requests, not yet started: coroutines made up front were never awaited when
        # the poll was cancelled in the first one (a RuntimeWarning at every such exit).
        jobs: list[Callable[[], Awaitable[Any]]] = []
        if want_health:
            jobs.append(self._health)
        if want_info:
            jobs.append(self._models)
            jobs.append(self._version)
        if not jobs:
            return out
        # One after another, on the /metrics keep-alive connection: asking all three at
        # once opened two new TCP connections per server every few seconds, and their
        # set-up was a visible share of vtop's own CPU (bench/run.py, py-spy).
        results: list[Any] = []
        for job in jobs:
            try:
                results.append(await job())
            except Exception as e:  # noqa: BLE001 - classified below, like gather's
                results.append(e)
        i = 0
        if want_health:
            self._last_health = mono
            r = results[i]
            i += 1
            out["health_polled"] = True
            if isinstance(r, _Fail):
                out["health_error"] = r.kind
                notes.append(self._scrub(f"/health: {r.message}"))
                self._health_bad = True
            elif isinstance(r, int):
                out["health"] = r
                self._health_bad = r != 200
                if r != 200:
                    notes.append(f"/health answered HTTP {r}{_reason(r)}")
            else:
                out["health_error"] = "other"
                self._health_bad = True
        if want_info:
            self._last_info = mono
            out["info_polled"] = True
            rm, rv = results[i], results[i + 1]
            if isinstance(rm, ModelsInfo):
                out["models"] = rm
            elif isinstance(rm, _Fail):
                hint = " (set VLLM_API_KEY or --api-key)" if rm.kind in ("http 401", "http 403") else ""
                notes.append(self._scrub(f"/v1/models: {rm.message}{hint}"))
            elif isinstance(rm, BaseException):
                notes.append(self._scrub(f"/v1/models: {_short(rm)}"))
            if isinstance(rv, str):
                out["version"] = rv
            elif isinstance(rv, _Fail):
                notes.append(self._scrub(f"/version: {rv.message}"))
            elif isinstance(rv, BaseException):
                notes.append(self._scrub(f"/version: {_short(rv)}"))
        if notes:
            out["notes"] = tuple(notes)
        return out

    async def _health(self) -> int:
        status, _ = await self._get("/health", 65536)
        return status

    async def _json(self, path: str, *, auth: bool) -> Any:
        status, body = await self._get(path, _INFO_BODY_BYTES, auth=auth)
        if status != 200:
            # Never quote the body: a proxy may echo our headers into it.
            raise _Fail(f"http {status}", f"HTTP {status}{_reason(status)}", len(body), status)
        try:
            return json.loads(body)
        except ValueError as exc:
            raise _Fail("garbage", f"not JSON ({len(body)} bytes)", len(body), status) from exc

    async def _models(self) -> ModelsInfo:
        doc = await self._json("/v1/models", auth=True)
        data = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(data, list):
            raise _Fail("garbage", "no model list in the answer")
        ids: list[str] = []
        max_len: int | None = None
        root: str | None = None
        for i, item in enumerate(x for x in data if isinstance(x, dict)):
            mid = item.get("id")
            if isinstance(mid, str):
                ids.append(self._scrub(mid))
            if i == 0:
                ml = item.get("max_model_len")
                if isinstance(ml, (int, float)) and not isinstance(ml, bool) and math.isfinite(ml) and ml > 0:
                    max_len = int(ml)
                r = item.get("root")
                root = self._scrub(r) if isinstance(r, str) else None
        return ModelsInfo(tuple(ids), max_len, root)

    async def _version(self) -> str:
        try:
            doc = await self._json("/version", auth=False)
        except _Fail as e:
            if e.status != 404:
                raise
            # SGLang serves no /version: its /server_info (0.5.x; read in 0.5.17's http_server.py) carries
            # "version" beside its whole config (a few KB; with --api-key it asks for the key)
            doc = await self._json("/server_info", auth=True)
        v = doc.get("version") if isinstance(doc, dict) else None
        if not isinstance(v, str):
            raise _Fail("garbage", "no version in the answer")
        return self._scrub(v[:64])


def _short(exc: BaseException, n: int = 160) -> str:
    s = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return s if len(s) <= n else s[: n - 1] + "…"
