"""A Prometheus HTTP API client: ``/api/v1/query`` and ``/api/v1/query_range``.

Built on :mod:`vtop.sources.http11` (asyncio streams + h11), the HTTP client vtop
already runs every second, not on httpx. Why:

* **One client, already in the loop.** The fleet refreshes every 5 s from the same
  event loop that scrapes servers; ``HttpPool`` keeps one kept-alive connection,
  bounds every body, and turns every failure into an :class:`HttpError` with a kind
  and a sentence. That is all a query needs: a ``GET`` with a query string and one
  header (the credentials).
* **Cost.** httpx spends ~2 ms of CPU a request on layers a fixed ``GET`` needs none
  of (measured in ``bench/http_cost.py``); the fleet's CPU budget is 2 % of a core.
* **The API is small and stable.** Prometheus' HTTP API v1 (also served by Thanos,
  Mimir, VictoriaMetrics) answers JSON ``{"status", "data": {"resultType", "result"}}``
  or ``{"status": "error", "errorType", "error"}``; parsing it is ``json.loads`` and a
  loop, no library earns its place.

What it does:

* credentials come from the config file or the environment (``VTOP_PROMETHEUS_TOKEN``
  for a bearer token; ``VTOP_PROMETHEUS_USER`` + ``VTOP_PROMETHEUS_PASSWORD`` for basic
  auth), never from the command line alone (a flag is visible in ``ps`` to every user);
  a URL with ``user:password@`` in it is refused for the same reason.
* TLS certificates are verified (the system's default context; ``prometheus_ca_file``
  adds a CA bundle for a private CA). There is no switch to turn verification off.
* every query has a deadline (``timeout_s``); a slow, failing or refusing Prometheus is
  a :class:`PromError` whose message says what happened in words (``Prometheus at
  host:9090 did not answer within 3.0 s``; its own ``error`` text for a bad query).
* no proxies, no redirects (a 3xx is an error that names the ``Location``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from vtop.sources.http11 import HttpError, HttpPool, within

__all__ = ["PromClient", "PromError", "Series", "Vector", "check_prometheus_url"]

#: answers larger than this are refused (a 1,000-instance fleet's largest answer, the
#: history of every counter, is ~25 MB; see bench/fleet.py)
MAX_BODY = 256 * 1024 * 1024

#: an instant vector: (labels, value) per series; NaN is None
Vector = list[tuple[dict[str, str], float | None]]


@dataclass(frozen=True, slots=True)
class Series:
    """One series of a range answer: its labels and ``(t, value)`` points (NaN is None)."""

    labels: dict[str, str]
    points: list[tuple[float, float | None]]


class PromError(Exception):
    """A query failed; ``message`` is one sentence for a person, ``kind`` one of
    ``refused``, ``dns``, ``timeout``, ``reset``, ``auth``, ``http``, ``query``, ``garbage``,
    ``too large``, ``other``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def check_prometheus_url(url: str) -> str:
    """The base URL, normalised (no trailing ``/``); ValueError with a sentence when unusable."""
    u = url.strip()
    if "://" not in u:
        u = "http://" + u
    parts = urlsplit(u)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"prometheus URL {url!r}: only http:// and https:// are supported")
    if not parts.hostname:
        raise ValueError(f"prometheus URL {url!r}: no host in it")
    if parts.username or parts.password:
        raise ValueError(f"prometheus URL {url!r}: credentials in the URL are visible to every user in `ps`; "
                         "put them in the config file (prometheus_user / prometheus_password or "
                         "prometheus_token) or in VTOP_PROMETHEUS_USER / VTOP_PROMETHEUS_PASSWORD / "
                         "VTOP_PROMETHEUS_TOKEN")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as e:
        raise ValueError(f"prometheus URL {url!r}: {e}") from None
    return u.rstrip("/")


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


class PromClient:
    """Queries one Prometheus-compatible API. One event loop; queries may run at once."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        user: str | None = None,
        password: str | None = None,
        ca_file: str | None = None,
        timeout_s: float = 3.0,
        pool: HttpPool | None = None,
    ) -> None:
        self.base = check_prometheus_url(url)
        parts = urlsplit(self.base)
        self.where = parts.netloc + (parts.path if parts.path not in ("", "/") else "")
        self.timeout_s = timeout_s
        ctx: ssl.SSLContext | None = None
        if ca_file:
            ctx = ssl.create_default_context(cafile=ca_file)
        self.pool = pool or HttpPool(max_idle=4, ssl_context=ctx)
        self._headers: list[tuple[str, str]] = [("Accept", "application/json"), ("Accept-Encoding", "identity")]
        if token:
            self._headers.append(("Authorization", f"Bearer {token}"))
        elif user is not None:
            cred = base64.b64encode(f"{user}:{password or ''}".encode()).decode("ascii")
            self._headers.append(("Authorization", f"Basic {cred}"))
        self.queries = 0
        """Queries sent so far (the benchmark counts them per refresh)."""
        self.bytes = 0

    def __repr__(self) -> str:  # never the credentials
        return f"PromClient({self.base!r})"

    async def aclose(self) -> None:
        await self.pool.aclose()

    async def query(self, promql: str, *, at: float | None = None) -> Vector:
        """An instant query: one ``(labels, value)`` per series (``__name__`` kept when present)."""
        params: dict[str, str] = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = await self._get("query", params)
        rtype = data.get("resultType")
        res = data.get("result")
        if rtype == "scalar" and isinstance(res, list) and len(res) == 2:
            return [({}, _num(res[1]))]
        if rtype != "vector" or not isinstance(res, list):
            raise PromError("garbage", f"Prometheus at {self.where} answered a {rtype!r} to an instant query "
                                       "(expected a vector)")
        out: Vector = []
        add = out.append
        for s in res:  # _num written out: ~10,000 series a refresh at 1,000 vLLM instances
            try:
                labels, raw = s["metric"], s["value"][1]
            except (KeyError, IndexError, TypeError):
                continue
            try:
                v: float | None = float(raw)
            except (TypeError, ValueError):
                v = None
            add((labels, None if v != v else v))  # NaN is None
        return out

    async def query_range(self, promql: str, *, start: float, end: float, step: float,
                          timeout_s: float | None = None) -> list[Series]:
        """A range query: one :class:`Series` per series, points every ``step`` seconds. Its deadline
        is ``timeout_s``, by default ten times an instant query's (at least 30 s): the history of
        a 1,000-instance fleet is read once, at start, and is ~17 MB."""
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{max(step, 0.001):g}"}
        data = await self._get("query_range", params, timeout_s or max(30.0, 10 * self.timeout_s))
        res = data.get("result")
        if data.get("resultType") != "matrix" or not isinstance(res, list):
            raise PromError("garbage", f"Prometheus at {self.where} answered a {data.get('resultType')!r} to a "
                                       "range query (expected a matrix)")
        out: list[Series] = []
        for s in res:
            try:
                out.append(Series(s["metric"], [(float(t), _num(v)) for t, v in s["values"]]))
            except (KeyError, TypeError, ValueError):
                continue
        return out

    async def _get(self, endpoint: str, params: Mapping[str, str], timeout_s: float | None = None) -> dict[str, Any]:
        url = f"{self.base}/api/v1/{endpoint}?{urlencode(params)}"
        self.queries += 1
        deadline = timeout_s or self.timeout_s
        try:
            status, body = await within(self.pool.get(url, headers=self._headers, limit=MAX_BODY,
                                                      connect_timeout=min(deadline, 2.0)), deadline)
        except (asyncio.TimeoutError, TimeoutError):
            raise PromError("timeout", f"Prometheus at {self.where} did not answer within "
                                       f"{deadline:.1f} s") from None
        except HttpError as e:
            raise PromError(e.kind, f"Prometheus at {self.where}: {e.message}") from None
        self.bytes += len(body)
        return self._decode(status, body)

    def _decode(self, status: int, body: bytes) -> dict[str, Any]:
        if status in (401, 403):
            raise PromError("auth", f"Prometheus at {self.where} refused the credentials (HTTP {status}); set "
                                    "prometheus_token, or prometheus_user and prometheus_password, in the config "
                                    "or VTOP_PROMETHEUS_TOKEN / VTOP_PROMETHEUS_USER / VTOP_PROMETHEUS_PASSWORD")
        if 300 <= status < 400:
            raise PromError("http", f"Prometheus at {self.where} redirects (HTTP {status}); give the URL it "
                                    "redirects to")
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            doc = None
        if not isinstance(doc, dict):
            snippet = body[:80].decode("utf-8", "replace").strip().replace("\n", " ")
            raise PromError("garbage" if status == 200 else "http",
                            f"Prometheus at {self.where} answered HTTP {status} that is not the Prometheus API "
                            f"(is the URL the API's base? it began: {snippet!r})")
        if doc.get("status") != "success":
            err = str(doc.get("error") or "no error text")[:300]
            etype = doc.get("errorType") or f"HTTP {status}"
            kind = "query" if etype in ("bad_data", "execution") or status in (400, 422) else "http"
            raise PromError(kind, f"Prometheus at {self.where}: {etype}: {err}")
        data = doc.get("data")
        if not isinstance(data, dict):
            raise PromError("garbage", f"Prometheus at {self.where} answered success without data")
        return data
