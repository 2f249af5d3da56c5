"""In-flight requests, read from the engine's request log (vLLM's here; SGLang's lines through
:data:`REQUEST_LOGS`, parsed in :mod:`vtop.core.requests.sglang_log`). Pure logic: no I/O, no Textual.

:func:`parse_request_line` turns one log line into :class:`RequestEvent` values
(none for the other lines), and :class:`RequestTracker`, fed every log line
with its ``arrival`` time (the monotonic clock the line was read on), keeps the
requests in flight, the recently finished ones, and says how far its ages can
be trusted. :func:`redact_prompts` hides the prompt a request line carries.

What the log gives, by version (the recorded logs in ``tests/fixtures/logs/requests/`` and the
vLLM sources):

* **≤0.9** logs requests by default; 0.10+ only with ``--enable-log-requests``.
  ``Received request X: prompt: '…', params: SamplingParams(…), …`` carries the
  prompt as a Python ``repr`` up to 0.11; 0.15+ logs only ``params`` at INFO.
  ``Added request X.`` follows when the engine takes it.
* **Finish lines.** V0 logs ``Finished request X.`` (with the in-process engine,
  ``--disable-frontend-multiprocessing``; the default multiprocess V0 engine
  does not). V1 logs nothing when a request ends normally, unless
  ``--enable-log-outputs``: then ``Generated response X: output: …,
  finish_reason: R`` (``(streaming delta)`` lines are not an end, ``(streaming
  complete)`` is). Only chat (and responses) log outputs: **``/v1/completions``
  never logs a Generated response**, so whether an age is exact is decided per
  endpoint, from the finish lines actually seen.
* **Aborts**: ``Aborted request X.`` (V0), ``Aborted request(s) a,b.`` (V1,
  joined with a bare comma; ``", "`` is accepted too).
* **Ids**: ``chatcmpl-…`` (chat), ``cmpl-…-<i>`` (completion, one per prompt),
  ``embd-…`` (embedding). n>1 children are ``<k>_<parent>`` in V1 (Added lines
  only). Since vLLM made engine ids unique, ``Added request`` shows the
  *internal* id, the API id plus ``-`` and 8 random hex characters
  (``chatcmpl-8c48a2e3458d224b-1f2e3d4c``), while Received, Generated and
  Aborted lines use the API id: both resolve to one request here.
* A chat request that omits ``max_tokens`` is logged with the value the server
  filled in, ``max_model_len - prompt_len``: close to ``max_model_len``, the mark
  of a client that set no limit (:attr:`InFlight.no_client_max_tokens`).

Times: ``since``/``ended`` are on the ``arrival`` clock given to
:meth:`RequestTracker.feed`. A log read as a backlog (vtop attaching to a
running server replays the log since its start: every line arrives at once)
would make every request look new, so when a request's own log stamp is
older than the newest stamped line by more than ``backlog_slack_s`` beyond
what the arrival clock says, its start is moved back by the log's own clock
(1 s resolution); a request whose start and end lines came in the same
backlog gets its duration from the stamps. ``RequestEvent.log_t`` is the line's stamp as seconds on the
log clock (the vLLM host's local wall time read as UTC, as
:class:`~vtop.core.phases.PhaseTracker` does; the year is not in the stamp).

Ends the log does not show: ``note_running(0)`` (the ``/metrics`` gauge)
ends every request in flight, with an "at most" duration; a Received request
that no Added line follows within ``unadded_timeout_s`` (once Added lines are
known to be logged) was refused by the server and is dropped as such.

Privacy: the tracker never keeps prompt text, only its length.
"""

from __future__ import annotations

import calendar
import re
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from vtop.core.loghistory import in_flight
from vtop.core.phases.patterns import LogEvent, parse_line
from vtop.core.requests import sglang_log
from vtop.core.requests.events import RequestEvent
from vtop.model.fmt import to_float as _to_float
from vtop.model.fmt import to_int as _to_int
from vtop.model.logtext import BANNER_RES
from vtop.model.redact import PY_STR_RE, PY_STR_REPR, redact_prompts, repr_len

__all__ = [
    "NEVER_ADDED",
    "PY_STR_REPR",
    "REQUEST_LOGS",
    "RUNNING_FELL_TO_ZERO",
    "FinishedRequest",
    "InFlight",
    "RequestEvent",
    "RequestTracker",
    "endpoint_of",
    "parse_request_line",
    "redact_prompts",
]

# Only lines holding one of these go through the message regexes (vLLM's, then every other engine's).
_VLLM_MARKERS = ("Received request ", "Added request ", "Finished request ", "Aborted request", "Generated response ")
_MARKERS = _VLLM_MARKERS + sglang_log.MARKERS

_RECEIVED_RE = re.compile(r"Received request (?P<id>\S+?): (?P<rest>(?:prompt|params): .*)$", re.S)
_ADDED_RE = re.compile(r"Added request (?P<id>\S+?)\.?\s*$")
_FINISHED_RE = re.compile(r"Finished request (?P<id>\S+?)\.?\s*$")
_ABORTED_RE = re.compile(r"Aborted request(?:\(s\))? (?P<ids>\w[^\s,]*?(?:,\s*\w[^\s,]*?)*)\.?\s*$")
_GENERATED_RE = re.compile(
    r"Generated response (?P<id>\S+?)(?: \(streaming (?P<stream>delta|complete)\))?: output: (?P<rest>.*)$", re.S
)
# The finish reason ends the line; the output before it may quote "finish_reason: x" itself.
_FINISH_REASON_RE = re.compile(r"finish_reason: (?P<reason>[\w.-]+)\s*$")

_PARAMS_OBJ_RE = re.compile(r"\b(?P<cls>SamplingParams|BeamSearchParams|PoolingParams)\(")
_MAX_TOKENS_RE = re.compile(r"[(,]\s*max_tokens=(\d{1,12}|None)\b")
_TEMPERATURE_RE = re.compile(r"[(,]\s*temperature=([-+]?(?:\d{1,12}(?:\.\d{0,20})?(?:[eE][-+]?\d{1,4})?|inf|nan))")
_N_RE = re.compile(r"[(,]\s*n=(\d{1,9})\b")
_TOKEN_IDS_RE = re.compile(r"\bprompt_token_ids: \[(?P<ids>[^\]]*)\]")
_REDACTED_RE = re.compile(r"<redacted (\d{1,12}) chars>")  # what redact_prompts leaves

_CHILD_RE = re.compile(r"\d{1,6}_(?=\S)")
_INTERNAL_SUFFIX_RE = re.compile(r"(?P<base>\S+)-[0-9a-f]{8}")
_ENDPOINT_PREFIXES = (
    ("chatcmpl-", "chat"),
    ("cmpl-", "completion"),
    ("embd-", "embedding"),
    ("resp_", "responses"),
    ("resp-", "responses"),
)

#: Reason given to requests that ``note_running(0)`` ends.
RUNNING_FELL_TO_ZERO = "done (running fell to 0)"
#: Reason given to a Received request no Added line followed (the server refused it).
NEVER_ADDED = "never added (rejected?)"
#: requests logged since startup kept for :meth:`RequestTracker.logged_since_start`
MAX_ARRIVALS = 200_000


# --------------------------------------------------------------------------- events


def endpoint_of(request_id: str, params_cls: str | None = None) -> str | None:
    """``"chat"``, ``"completion"``, ``"embedding"``, ``"responses"`` or None, from the id prefix.

    A child id (``0_cmpl-…``) counts as its parent. Without a known prefix, a
    ``PoolingParams`` request counts as an embedding.
    """
    rid = request_id
    m = _CHILD_RE.match(rid)
    if m:
        rid = rid[m.end() :]
    for prefix, name in _ENDPOINT_PREFIXES:
        if rid.startswith(prefix):
            return name
    if params_cls == "PoolingParams":
        return "embedding"
    return None


def _stamp_seconds(stamp: tuple[int, int, int, int, int] | None, year: int) -> float | None:
    if stamp is None:
        return None
    mon, day, hh, mi, ss = stamp
    try:
        return float(calendar.timegm((year, mon, day, hh, mi, ss, 0, 0, 0)))
    except (ValueError, OverflowError):
        return None


def _received(rid: str, rest: str, log_t: float | None) -> RequestEvent:
    prompt_chars: int | None = None
    params_text = rest
    if rest.startswith("prompt: "):
        m = PY_STR_RE.match(rest, 8)
        if m:
            prompt_chars = repr_len(m.group())
            params_text = rest[m.end() :]
        elif rest.startswith("None", 8):
            params_text = rest[12:]
        elif (r := _REDACTED_RE.match(rest, 8)) is not None:  # a line redact_prompts went through
            prompt_chars = int(r.group(1))
            params_text = rest[r.end() :]
        else:  # the line was cut inside the prompt: nothing after it can be read
            return RequestEvent("received", rid, log_t, endpoint_of(rid), None, None, None, None, None)
    masked = PY_STR_RE.sub("''", params_text)  # a stop string may read "max_tokens=1"
    obj = _PARAMS_OBJ_RE.search(masked)
    start = obj.start() if obj else 0
    cls = obj.group("cls") if obj else None
    mt = _MAX_TOKENS_RE.search(masked, start)
    te = _TEMPERATURE_RE.search(masked, start)
    nn = _N_RE.search(masked, start) if cls in (None, "SamplingParams") else None
    prompt_tokens = None
    ids = _TOKEN_IDS_RE.search(masked, start)
    if ids:
        body = ids.group("ids").strip()
        prompt_tokens = body.count(",") + 1 if body else 0
    return RequestEvent(
        "received",
        rid,
        log_t,
        endpoint_of(rid, cls),
        _to_int(mt.group(1)) if mt else None,
        _to_float(te.group(1)) if te else None,
        _to_int(nn.group(1)) if nn else None,
        None,
        prompt_chars,
        prompt_tokens,
    )


def _vllm_events(message: str, log_t: float | None) -> list[RequestEvent]:
    """The events of one vLLM record's message part (prefix already removed)."""
    head = message[:20]
    if head.startswith("Received request "):
        m = _RECEIVED_RE.match(message)
        return [_received(m.group("id"), m.group("rest"), log_t)] if m else []
    if head.startswith("Added request "):
        m = _ADDED_RE.match(message)
        if m:
            rid = m.group("id")
            return [RequestEvent("added", rid, log_t, endpoint_of(rid), None, None, None, None, None)]
        return []
    if head.startswith("Finished request "):
        m = _FINISHED_RE.match(message)
        if m:
            rid = m.group("id")
            return [RequestEvent("finished", rid, log_t, endpoint_of(rid), None, None, None, None, None)]
        return []
    if head.startswith("Aborted request"):
        m = _ABORTED_RE.match(message)
        if not m:
            return []
        ids = [i for i in re.split(r"[,\s]+", m.group("ids")) if i]
        return [RequestEvent("aborted", i, log_t, endpoint_of(i), None, None, None, "abort", None) for i in ids]
    if head.startswith("Generated response "):
        m = _GENERATED_RE.match(message)
        if not m:
            return []
        rid = m.group("id")
        fr = _FINISH_REASON_RE.search(m.group("rest"))
        reason = fr.group("reason") if fr else None
        kind = "delta" if m.group("stream") == "delta" else "finished"
        return [
            RequestEvent(
                kind, rid, log_t, endpoint_of(rid), None, None, None, None if reason == "None" else reason, None,
                None, True,
            )
        ]
    return []


#: Each engine's request log, by the engine of the line's record format (:attr:`LogEvent.engine
#: <vtop.core.phases.patterns.LogEvent.engine>`; None: vLLM's): its parser (a record's message and stamp to
#: events), and whether its end lines prove every end is logged (then an open entry is in flight and its age
#: exact): vLLM V0's ``Finished request`` comes with ``Aborted request`` lines (V1's ``Generated response`` is
#: per endpoint: :attr:`RequestEvent.output_logged`); SGLang's ``Finish`` lines do not (a client's disconnect
#: ends a request with no line, :mod:`vtop.core.requests.sglang_log`).
REQUEST_LOGS: dict[str | None, tuple[Callable[[str, float | None], list[RequestEvent]], bool]] = {
    None: (_vllm_events, True),
    "sglang": (sglang_log.events_from, sglang_log.ENDS_EXACT),
}


def _events_from(engine: str | None, message: str, log_t: float | None) -> list[RequestEvent]:
    got = REQUEST_LOGS.get(engine)
    return got[0](message, log_t) if got is not None else []


def _has_marker(line: str) -> bool:
    return any(mk in line for mk in _MARKERS)


def parse_request_line(line: str, *, year: int | None = None) -> list[RequestEvent]:
    """The request events of one log line (any vLLM version, SGLang's): ``[]`` for every other line.

    An abort line can name several requests. ``year`` dates the stamp (default:
    this year). Never raises.
    """
    if not _has_marker(line):
        return []
    ev = parse_line(line)
    if ev.kind != "record":
        return []
    y = year if year is not None else time.localtime().tm_year
    return _events_from(ev.engine, ev.message, _stamp_seconds(ev.stamp, y))


# --------------------------------------------------------------------------- redaction


# --------------------------------------------------------------------------- tracker


@dataclass(frozen=True, slots=True)
class InFlight:
    """One request in flight, as of :meth:`RequestTracker.inflight`."""

    request_id: str
    endpoint: str | None
    since: float
    age_s: float
    #: True when nothing in this log would say it ended (V1 without
    #: ``--enable-log-outputs``, or ``/v1/completions``): the age is "at most".
    age_is_upper_bound: bool
    max_tokens: int | None
    temperature: float | None
    n: int | None
    #: max_tokens within ``near_fraction`` of max_model_len (or prompt + max_tokens
    #: reaching it): the server filled the limit in, the client set none.
    no_client_max_tokens: bool
    #: An ``Added request`` line was seen (False: received, not yet taken by the engine).
    added: bool = True
    prompt_chars: int | None = None
    prompt_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """A request that left the in-flight set, newest first in :meth:`RequestTracker.recent_finished`."""

    request_id: str
    endpoint: str | None
    since: float
    ended: float
    duration_s: float
    #: The end was inferred (running fell to 0, or no Added line came), so the request ended at or before ``ended``.
    duration_is_upper_bound: bool
    #: ``stop``/``length``/``streaming_complete``… from a Generated response,
    #: ``finished`` (V0), ``aborted``, ``done (running fell to 0)``, ``never added (rejected?)``.
    reason: str
    max_tokens: int | None
    temperature: float | None
    n: int | None
    no_client_max_tokens: bool
    #: tokens it generated, where its end line says (SGLang's ``completion_tokens``)
    completion_tokens: int | None = None


@dataclass(slots=True)
class _Entry:
    key: str
    endpoint: str | None
    arrival: float  # arrival clock of its first line
    log_t: float | None
    since: float  # arrival, or earlier when the line came in a backlog
    max_tokens: int | None = None
    temperature: float | None = None
    n: int | None = None
    prompt_chars: int | None = None
    prompt_tokens: int | None = None
    added: bool = False
    alias: str | None = None  # the internal id (API id + "-xxxxxxxx") its Added line used
    omitted: bool = False  # its sampling parameters set no cap (RequestEvent.max_tokens_omitted)
    samples_done: int = 0  # samples of an n > 1 request that ended (RequestEvent.child_of)


class RequestTracker:
    """Requests in flight and recently finished, from the log lines of one server.

    Feed every log line (request lines or not: stamped lines keep the log clock
    current) with :meth:`feed`, the ``/metrics`` running gauge with
    :meth:`note_running`, and call :meth:`reset` when the server restarts.
    Memory is bounded: at most ``max_inflight`` requests (the oldest are dropped
    and counted in :attr:`dropped`) and ``keep_finished`` finished ones.
    """

    def __init__(
        self,
        *,
        max_model_len: int | None = None,
        near_fraction: float = 0.05,
        keep_finished: int = 200,
        max_inflight: int = 10000,
        year: int | None = None,
        backlog_slack_s: float = 2.0,
        running_zero_grace_s: float = 2.0,
        unadded_timeout_s: float = 60.0,
    ) -> None:
        self._max_model_len = max_model_len if max_model_len and max_model_len > 0 else None
        self._near = near_fraction
        self._max_inflight = max(1, max_inflight)
        self._year = year if year is not None else time.localtime().tm_year
        self._last_month: int | None = None
        self._slack = backlog_slack_s
        self._grace = running_zero_grace_s
        self._unadded_timeout = unadded_timeout_s
        self._inflight: OrderedDict[str, _Entry] = OrderedDict()
        self._alias: dict[str, str] = {}
        self._finished: deque[FinishedRequest] = deque(maxlen=max(0, keep_finished))
        self._anchor: tuple[float, float] | None = None  # (log_t, arrival) of the last stamped line
        self._logging_seen = False
        self._v0_finish_seen = False  # "Finished request": every endpoint's end is logged
        self._output_endpoints: set[str | None] = set()  # endpoints whose Generated responses were seen
        self._added_seen = False
        self._dropped = 0
        self._last_running: float | None = None
        self._last_waiting: float | None = None
        self._stats_busy: dict[str, int] = {}
        #: every request logged (received, with its max_tokens) since the server's startup banner,
        #: aborted and refused ones left out; None: the log's request lines do not reach back
        #: to a startup (see :meth:`logged_since_start`)
        self._arrived: dict[str, _Entry] | None = None
        self._arrived_view: tuple[tuple[float, int], ...] | None = None
        self._arrived_anchor: tuple[float, float] | None = None

    # ------------------------------------------------------------------ input

    def feed(self, line: str, arrival: float, *, event: LogEvent | None = None) -> list[RequestEvent]:
        """Take one log line read at monotonic ``arrival``; returns its request events.

        ``event`` is the line already parsed by :func:`~vtop.core.phases.parse_line`
        (the phase tracker parses every line too), to parse it once.
        """
        marked = _has_marker(line)
        ev = event if event is not None else parse_line(line)
        log_t = self._log_time(ev, arrival)
        if "version" in ev.message and any(rx.search(ev.message) for rx in BANNER_RES):
            # a startup: every request of this server is logged from here on
            self._arrived = {}
            self._arrived_view = None
        if ev.kind == "record" and self._inflight:
            self._stats_line(ev, arrival)
        if not marked or ev.kind != "record":
            return []
        events = _events_from(ev.engine, ev.message, log_t)
        for e in events:
            self._apply(e, arrival)
        return events

    def set_max_model_len(self, n: int | None) -> None:
        self._max_model_len = n if n and n > 0 else None

    def _stats_line(self, ev: LogEvent, arrival: float) -> None:
        """The engine's periodic stats line (:data:`~vtop.core.loghistory.STATS_LINES`, by the line's engine):
        vLLM's (every 10 s while busy) says ``Running: 0 reqs, Waiting: 0 reqs`` when nothing is in flight:
        every request logged a few seconds before it has ended. This is what clears the backlog of a log read
        from its start (``vtop doctor``, an attach mid-run), where no /metrics gauge was seen at those times.
        With several engines (data-parallel series), all must say 0. SGLang's Decode and Prefill batch lines
        are read the same way and never say 0 (:func:`~vtop.core.loghistory.in_flight`): a Prefill batch with
        ``#running-req: 0`` has its new requests in flight."""
        got = in_flight(ev.message, ev.engine, ev.proc)
        if got is None:
            return
        series, busy = got
        self._stats_busy[series] = busy
        if any(self._stats_busy.values()):
            return
        for key in [k for k, e in self._inflight.items() if self._since(e) <= arrival - self._grace]:
            self._retire(key, RUNNING_FELL_TO_ZERO, arrival, upper_bound=True)

    def note_running(self, running: float | None, arrival: float, *, waiting: float | None = None) -> None:
        """``vllm:num_requests_running`` (and, when known, ``…_waiting``) scraped at ``arrival``.

        Running 0 with nothing waiting means every request has ended: those in
        flight (since longer than ``running_zero_grace_s``, the gauge lags a
        step) move to the finished list with reason ``done (running fell to 0)``.
        """
        self._last_running = running
        self._last_waiting = waiting
        if running is None or running != running or running > 0.5:
            return
        if waiting is not None and waiting == waiting and waiting > 0.5:
            return
        for key in [k for k, e in self._inflight.items() if self._since(e) <= arrival - self._grace]:
            self._retire(key, RUNNING_FELL_TO_ZERO, arrival, upper_bound=True)

    def reset(self) -> None:
        """The server restarted: forget the requests in flight (finished ones are kept)."""
        self._inflight.clear()
        self._alias.clear()
        self._anchor = None
        self._last_month = None
        self._last_running = None
        self._last_waiting = None
        self._stats_busy.clear()
        # the requests logged are no longer known to start at this server's startup (its
        # banner may come later: then they do again)
        self._arrived = None
        self._arrived_view = None

    # ------------------------------------------------------------------ output

    def logged_since_start(self) -> tuple[tuple[float, int], ...] | None:
        """``(since, max_tokens)`` of every request logged since the server's startup banner
        (aborted and refused ones left out), oldest first; None when the log's request lines
        do not reach back to a startup (a log picked up mid-run, a restart seen only by
        ``/metrics``), or when more than ``MAX_ARRIVALS`` were logged."""
        if self._arrived is None:
            return None
        if self._arrived_view is None or self._arrived_anchor != self._anchor:
            self._arrived_anchor = self._anchor  # a newer stamp may move a backlog's times
            self._arrived_view = tuple(sorted((self._since(e), e.max_tokens) for e in self._arrived.values()
                                              if e.max_tokens is not None))
        return self._arrived_view

    def inflight(self, now: float) -> list[InFlight]:
        """Requests in flight as of monotonic ``now``, oldest first."""
        self._expire(now)
        rows = []
        for e in self._inflight.values():
            since = self._since(e)
            rows.append(
                InFlight(
                    e.key,
                    e.endpoint,
                    since,
                    max(0.0, now - since),
                    not self._exact(e),
                    e.max_tokens,
                    e.temperature,
                    e.n,
                    self._no_client(e),
                    e.added,
                    e.prompt_chars,
                    e.prompt_tokens,
                )
            )
        rows.sort(key=lambda r: r.since)
        return rows

    def recent_finished(self) -> list[FinishedRequest]:
        """The last ``keep_finished`` requests that ended, newest first."""
        return list(reversed(self._finished))

    @property
    def logging_seen(self) -> bool:
        """A request line was seen: request logging is on."""
        return self._logging_seen

    @property
    def finishes_logged(self) -> bool:
        """A ``Finished request`` or ``Generated response`` line was seen (ends are logged, ages exact)."""
        return self._v0_finish_seen or bool(self._output_endpoints)

    @property
    def dropped(self) -> int:
        """In-flight requests dropped, oldest first, to stay within ``max_inflight``."""
        return self._dropped

    @property
    def possibly_finished(self) -> int:
        """How many of the "at most" requests in flight must have ended, by the last running/waiting gauges.

        V1 children count one each in the gauges, so a request counts ``n``.
        0 when the gauges are unknown.
        """
        if self._last_running is None or self._last_running != self._last_running:
            return 0
        busy = self._last_running + (self._last_waiting or 0.0)
        total = sum(max(1, e.n or 1) for e in self._inflight.values())
        unsure = sum(max(1, e.n or 1) for e in self._inflight.values() if not self._exact(e))
        return int(max(0.0, min(float(unsure), total - busy)))

    # ------------------------------------------------------------------ internals

    def _log_time(self, ev: LogEvent, arrival: float) -> float | None:
        if ev.stamp is None:
            return None
        mon = ev.stamp[0]
        if self._last_month is not None and mon < self._last_month - 6:
            self._year += 1  # December -> January
        self._last_month = mon
        t = _stamp_seconds(ev.stamp, self._year)
        if t is not None:
            self._anchor = (t, arrival)
        return t

    def _since(self, e: _Entry) -> float:
        """When ``e`` arrived; moved back by the log clock when its line came in a backlog."""
        if e.log_t is not None and self._anchor is not None:
            t, a = self._anchor
            derived = a - (t - e.log_t)
            if derived < e.arrival - self._slack and derived < e.since:
                e.since = derived
        return e.since

    def _exact(self, e: _Entry) -> bool:
        return self._v0_finish_seen or e.endpoint in self._output_endpoints

    def _no_client(self, e: _Entry) -> bool:
        if e.omitted:
            return True  # the log says so (SGLang's max_new_tokens None), whatever max_model_len is
        mml = self._max_model_len
        if mml is None or e.max_tokens is None:
            return False
        if e.prompt_tokens is not None and e.max_tokens + e.prompt_tokens >= mml:
            return True
        return e.max_tokens >= mml * (1.0 - self._near)

    def _resolve(self, rid: str, *, loose: bool = True) -> str | None:
        """The in-flight key a logged id belongs to (child ids and internal ids too when ``loose``)."""
        inf = self._inflight
        if rid in inf:
            return rid
        if rid in self._alias:
            return self._alias[rid]
        if not loose:
            return None
        m = _CHILD_RE.match(rid)
        if m:
            base = rid[m.end() :]
            if base in inf:
                return base
            if base in self._alias:
                return self._alias[base]
            rid = base
        s = _INTERNAL_SUFFIX_RE.fullmatch(rid)
        if s and s.group("base") in inf:
            key = s.group("base")
            e = inf[key]
            if e.alias is None:
                e.alias = rid
                self._alias[rid] = key
            return key
        return None

    def _new_entry(self, rid: str, ev: RequestEvent, arrival: float) -> _Entry:
        e = _Entry(rid, ev.endpoint, arrival, ev.log_t, arrival)
        self._inflight[rid] = e
        while len(self._inflight) > self._max_inflight:
            _, old = self._inflight.popitem(last=False)
            if old.alias is not None:
                self._alias.pop(old.alias, None)
            self._dropped += 1
            self._arrived = self._arrived_view = None  # its end can no longer be told
        return e

    def _apply(self, ev: RequestEvent, arrival: float) -> None:
        self._logging_seen = True
        kind = ev.kind
        if kind == "received":
            key = self._resolve(ev.request_id, loose=False)
            e = self._inflight[key] if key is not None else self._new_entry(ev.request_id, ev, arrival)
            e.max_tokens = ev.max_tokens if ev.max_tokens is not None else e.max_tokens
            e.temperature = ev.temperature if ev.temperature is not None else e.temperature
            e.n = ev.n if ev.n is not None else e.n
            e.prompt_chars = ev.prompt_chars if ev.prompt_chars is not None else e.prompt_chars
            e.prompt_tokens = ev.prompt_tokens if ev.prompt_tokens is not None else e.prompt_tokens
            e.omitted = e.omitted or ev.max_tokens_omitted
            if ev.endpoint is not None:
                e.endpoint = ev.endpoint
            if self._arrived is not None:
                if len(self._arrived) >= MAX_ARRIVALS:
                    self._arrived = None  # too many to keep: no claim from them
                else:
                    self._arrived[e.key] = e
                self._arrived_view = None
        elif kind == "added":
            self._added_seen = True
            key = self._resolve(ev.request_id)
            if key is None:
                rid = ev.request_id
                m = _CHILD_RE.match(rid)
                base = rid[m.end() :] if m else rid
                s = _INTERNAL_SUFFIX_RE.fullmatch(base)
                e = self._new_entry(s.group("base") if s else base, ev, arrival)
                if s:
                    e.alias = base
                    self._alias[base] = e.key
            else:
                e = self._inflight[key]
            e.added = True
        elif kind == "finished":
            if ev.output_logged:
                self._output_endpoints.add(ev.endpoint)
            elif REQUEST_LOGS.get(ev.engine, (None, False))[1]:
                self._v0_finish_seen = True
            key = self._resolve(ev.child_of) if ev.child_of is not None else None
            if key is not None:
                e = self._inflight[key]
                if ev.completion_tokens != 0:  # 0: SGLang's prefill-only copy of an n > 1 prompt, no sample
                    e.samples_done += 1
                if e.samples_done < max(1, e.n or 1):
                    return  # more samples to come
            else:
                key = self._resolve(ev.request_id)
            if key is not None:
                self._retire(key, ev.finish_reason or "finished", arrival, upper_bound=False, end_log_t=ev.log_t,
                             tokens=ev.completion_tokens)
        elif kind == "aborted":
            key = self._resolve(ev.child_of) if ev.child_of is not None else None
            key = key if key is not None else self._resolve(ev.request_id)
            if key is not None:
                self._retire(key, "aborted", arrival, upper_bound=False, end_log_t=ev.log_t,
                             tokens=ev.completion_tokens)

    def _retire(
        self, key: str, reason: str, ended: float, *, upper_bound: bool, end_log_t: float | None = None,
        tokens: int | None = None,
    ) -> None:
        e = self._inflight.pop(key, None)
        if e is None:
            return
        if self._arrived is not None and reason in ("aborted", NEVER_ADDED):
            # ended without a finish in vLLM's histograms
            self._arrived.pop(key, None)
            self._arrived_view = None
        if e.alias is not None:
            self._alias.pop(e.alias, None)
        since = self._since(e)
        ended = max(ended, since)
        if end_log_t is not None and e.log_t is not None and (end_log_t - e.log_t) - (ended - since) >= 1.0:
            # Both lines came in one backlog (closer on the arrival clock than the stamps say):
            # the stamps' 1 s resolution beats an arrival-clock duration of ~0.
            since = ended - (end_log_t - e.log_t)
        self._finished.append(
            FinishedRequest(
                e.key,
                e.endpoint,
                since,
                ended,
                ended - since,
                upper_bound,
                reason,
                e.max_tokens,
                e.temperature,
                e.n,
                self._no_client(e),
                tokens,
            )
        )

    def _expire(self, now: float) -> None:
        """Received requests that no Added line followed in time (where Added lines are logged) were refused."""
        if not self._added_seen:
            return
        stale = [k for k, e in self._inflight.items() if not e.added and now - e.arrival > self._unadded_timeout]
        for k in stale:
            self._retire(k, NEVER_ADDED, now, upper_bound=True)
