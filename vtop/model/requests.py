"""The requests in flight on a server, as every layer names them: one answer per server per tick.

Made by :func:`vtop.core.requests.requests_in_flight` from the three things that can tell a
request's age (the request log, the kernel's counters of the server's connections, and a bound
proven from ``/metrics`` alone), read by the runaway rule and by every face (the requests line, the
``r`` view, ``--once --json``, ``doctor``, the exporter), so they all name the same oldest request
with the same bounds.

An age is a pair of bounds: ``age_min_s`` (it has been in flight at least this long: what matters
for a runaway) and ``age_max_s`` (it came at most this long ago); either may be None (not known).
Times are on the monotonic clock the answer was made on (``at``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vtop.model.fmt import dur

__all__ = ["CONNECTION", "EVIDENCE_WORDS", "LOG", "METRICS_BOUND", "READ_GIVEN_UP", "InFlightRequest", "ServerRequests",
           "age_words", "dur_text", "silent_words", "state_word"]

#: the request log (``Received request ...``; its end lines, or the max_tokens histogram, say it has not ended)
LOG = "log"
#: the kernel's counters of one connection (its answer still streaming, not begun, or gone silent)
CONNECTION = "connection"
#: ``/metrics`` alone (the running gauge, the finishes' latencies): some request has run this long
METRICS_BOUND = "metrics_bound"

#: the words every read of the connections given up at its deadline ends its error with: such a read says
#: nothing of now (the kernel did not answer in time), so what the read before knew stands until it goes
#: stale; any other error (denied, the server gone) forgets it
READ_GIVEN_UP = "took too long"

#: how each evidence is said
EVIDENCE_WORDS = {LOG: "the request log", CONNECTION: "its connection", METRICS_BOUND: "/metrics"}


@dataclass(frozen=True, slots=True)
class InFlightRequest:
    """One request in flight (or, for ``METRICS_BOUND`` alone, some request: which one is not known)."""

    #: the server's URL
    server: str
    #: what says it is in flight and how old it is, strongest first (``LOG``, ``CONNECTION``, ``METRICS_BOUND``)
    evidence: tuple[str, ...]
    #: seconds it has been in flight at least (None: not known)
    age_min_s: float | None
    #: seconds since it came at most (None: not known)
    age_max_s: float | None
    #: the monotonic time it is known in flight from (its age at least is measured from here; None: not known)
    since: float | None = None
    #: its request id (the log), when known
    request_id: str | None = None
    #: the client's ``addr:port`` (its connection), when known
    client: str | None = None
    #: ``chat``, ``completion``, ... (from the id), when known
    endpoint: str | None = None
    #: the effective ``max_tokens`` (what vLLM filled in when the client sent none), when known
    max_tokens: int | None = None
    #: True: the client set ``max_tokens``; False: it sent none (vLLM filled in ``max_model_len`` -
    #: prompt); None: not known
    client_set_max_tokens: bool | None = None
    #: its answer has not begun (a connection with no byte sent since the request came: queued, or a
    #: non-streamed answer still decoding)
    answer_pending: bool = False
    #: its answer began and has sent nothing for this many seconds while its connection stays open (a
    #: frozen engine, or a client that stopped reading): in flight, not known decoding; None: not silent
    answer_silent_s: float | None = None
    #: bytes of its answer its client acknowledged since vtop first saw its connection (None: not known);
    #: vLLM counts tokens per server, never per request: this is what is known of one answer so far
    answer_bytes: int | None = None
    #: the request log says the engine took it (an ``Added request`` line)
    added: bool = True
    temperature: float | None = None
    n: int | None = None
    #: how it is known, in one sentence (the runaway alert's first evidence line, the ``r`` view's note)
    detail: str | None = None

    @property
    def no_client_max_tokens(self) -> bool:
        """The client sent no ``max_tokens`` (known)."""
        return self.client_set_max_tokens is False

    @property
    def short_name(self) -> str:
        """:attr:`name` with a long request id cut to 24 characters (a line's room)."""
        return self.request_id[:24] if self.request_id else self.name

    @property
    def name(self) -> str:
        """``chatcmpl-9f…``, ``client 127.0.0.1:50312``, or ``a request`` (known only from /metrics)."""
        if self.request_id:
            return self.request_id
        if self.client:
            return f"the request from {self.client}"
        return "a request"

    def to_json(self) -> dict[str, object]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 1)

        return {"server": self.server, "id": self.request_id, "client": self.client, "endpoint": self.endpoint,
                "evidence": list(self.evidence), "age_min_s": r(self.age_min_s), "age_max_s": r(self.age_max_s),
                "max_tokens": self.max_tokens, "client_set_max_tokens": self.client_set_max_tokens,
                "no_client_max_tokens": self.no_client_max_tokens, "answer_pending": self.answer_pending,
                "answer_silent_s": r(self.answer_silent_s), "detail": self.detail}


@dataclass(frozen=True, slots=True)
class ServerRequests:
    """What is known of one server's requests in flight at ``at`` (monotonic)."""

    server: str
    at: float
    #: the requests known in flight, oldest first (by ``age_min_s``)
    requests: tuple[InFlightRequest, ...] = ()
    #: the request known in flight longest (the one every face names), or None; it may be one whose answer
    #: went silent (``answer_silent_s``: in flight, not known decoding)
    oldest: InFlightRequest | None = None
    #: the request known in flight longest whose answer has not gone silent (it streams, has not begun, or
    #: is known from the log or /metrics): what the runaway rule reads (a runaway decodes; a silent answer
    #: is no sign of that). The same object as ``oldest`` when no older answer is silent; else it may be
    #: /metrics' bound that the older silent request stands for in ``requests`` ("some request has run N s")
    answering: InFlightRequest | None = None
    #: how many are in flight: vLLM's running + waiting where known, else the request log's count where
    #: it logs every end; None: not known (a log without finish lines gives ``received_recent`` instead)
    count: int | None = None
    #: vLLM's gauges at the last poll (None: not known)
    running: float | None = None
    waiting: float | None = None
    #: the request log has request lines at all (None: no log of this server is followed)
    request_logging: bool | None = None
    #: the log has end lines (V0 ``Finished request``, V1 ``--enable-log-outputs``): its own count is exact
    finishes_logged: bool = False
    #: requests the log received in the last ``RECENT_S`` (said where the log has no end lines)
    received_recent: int | None = None
    #: the requests the log holds with no end line (not all in flight where it logs no end)
    logged_open: int = 0
    #: the request log's open entries (no end line, no abort), oldest first: in ``requests`` too where the
    #: log has end lines; else each only "came at most N s ago" (it may have ended unseen)
    logged: tuple[InFlightRequest, ...] = field(default_factory=tuple)
    #: the server's engine ("vllm", "sglang": :data:`vtop.core.engines.ENGINES`; None: not known, read as vLLM):
    #: what a face names when it says how to turn the request log on
    engine: str | None = None


def state_word(answer_pending: bool | None, answer_silent_s: float | None = None) -> str:
    """What a request in flight is doing, before its age: ``running`` (its answer streams, or it is known
    running), ``in flight`` (its answer has not begun, or went silent: not known running)."""
    return "in flight" if answer_pending or answer_silent_s is not None else "running"


def silent_words(answer_silent_s: float | None) -> str:
    """``its answer silent for 45s`` (every face says a silent answer so, after the request's age); ``""``
    when it is not silent."""
    return "" if answer_silent_s is None else f"its answer silent for {dur_text(answer_silent_s)}"


def dur_text(seconds: float | None) -> str:
    """``45s``, ``1m 05s``, ``2h 03m``; ``?`` when not known."""
    return "?" if seconds is None else dur(seconds)


def age_words(r: InFlightRequest, *, upper: bool = False) -> str:
    """How long it has been in flight, as a lower bound (``at least 1m 05s``); with ``upper``, the upper
    bound labelled after it (``at least 45s, came at most 2m 05s ago``)."""
    if r.age_min_s is None:
        out = "for an unknown time"
        if r.age_max_s is not None:
            out += f" (came at most {dur_text(r.age_max_s)} ago)"
        return out
    out = f"at least {dur_text(r.age_min_s)}"
    if upper and r.age_max_s is not None and r.age_max_s - r.age_min_s >= 1.0:
        out += f", came at most {dur_text(r.age_max_s)} ago"
    return out
