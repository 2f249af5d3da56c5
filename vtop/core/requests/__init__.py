"""A server's requests in flight, and how old each is: the one answer every face and the runaway rule read.

Three things can tell a request's age, one module each:

* :mod:`vtop.core.requests.log`: the request log (``Received request X``; where vLLM logs no end
  line, an open entry may have ended long ago: its age is only "came at most N s ago");
* :mod:`vtop.core.requests.metrics_bound`: ``/metrics`` alone (the running gauge against the
  finishes' latencies, and the ``max_tokens`` histogram that proves a logged request has not ended);
* :mod:`vtop.core.requests.conns`: the kernel's counters of the server's connections (an answer
  still streaming, or not begun, on a connection whose request came N s ago).

:func:`requests_in_flight` puts them together, once per tick per server (the diagnoser calls it), as
a :class:`~vtop.model.requests.ServerRequests`: the requests known in flight, each with its age as a
lower and an upper bound and the evidence behind it, and the oldest of them. A request is in flight
only where something proves it: where the log has no end lines, its open entries are counted as
received, not as in flight, and the count is vLLM's own running + waiting.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from vtop.core.requests.metrics_bound import LOG_LAG_S, MaxTokensLedger, OldestInFlight, oldest_logged
from vtop.core.requests.occupancy import OccupancyBound
from vtop.model.fmt import dur
from vtop.model.requests import CONNECTION, LOG, METRICS_BOUND, InFlightRequest, ServerRequests

if TYPE_CHECKING:
    from vtop.core.loghistory import LogHistoryView
    from vtop.core.requests.conns import ConnTracker
    from vtop.core.requests.log import InFlight

__all__ = ["RECENT_S", "LogRequests", "LogSide", "ServerMemory", "requests_in_flight"]

#: the window of "N received in the last 10 s" (said where the log has no end lines)
RECENT_S = 10.0


class LogSide(Protocol):
    """What the followed log says of its server's requests (a :class:`vtop.monitor.logwatch.LogView`)."""

    @property
    def inflight(self) -> Sequence[InFlight]: ...
    @property
    def request_logging(self) -> bool: ...
    @property
    def finishes_logged(self) -> bool: ...


@dataclass(frozen=True)
class LogRequests:
    """A :class:`LogSide` made of its parts."""

    inflight: Sequence[InFlight] = ()
    request_logging: bool = False
    finishes_logged: bool = False


class _Sample(Protocol):
    @property
    def t(self) -> float: ...
    @property
    def running(self) -> float | None: ...
    @property
    def waiting(self) -> float | None: ...
    @property
    def gen(self) -> float | None: ...
    @property
    def prompt(self) -> float | None: ...


class ServerMemory(Protocol):
    """What the diagnoser remembers of a server's ``/metrics`` (a :class:`vtop.core.rules.state.ServerState`)."""

    @property
    def last(self) -> Any: ...
    @property
    def samples(self) -> Sequence[Any]: ...
    @property
    def first_t(self) -> float | None: ...
    @property
    def busy_since(self) -> float | None: ...
    @property
    def oldest(self) -> OldestInFlight: ...
    @property
    def max_tokens_ledger(self) -> MaxTokensLedger: ...
    @property
    def occupancy(self) -> OccupancyBound: ...
    def at(self, t: float) -> Any: ...


def requests_in_flight(now: float, url: str, mem: ServerMemory | None, *, log: LogSide | None = None,
                       conns: ConnTracker | None = None, history: LogHistoryView | None = None,
                       logged_since_start: Sequence[tuple[float, int]] | None = None,
                       short_history_s: float = 45.0, engine: str | None = None) -> ServerRequests:
    """The requests in flight on ``url`` at monotonic ``now``, oldest first, and the oldest of them.

    ``mem``: what ``/metrics`` showed (None: nothing yet); ``log``: the followed log when it is this
    server's; ``conns``: its connections (a server on this box); ``history``: the log's stats lines
    (this server's), which stand in while what ``/metrics`` showed is shorter than ``short_history_s``
    (``doctor --window 15``, an attach); ``logged_since_start``: every request the log logged since
    the server's startup (lets a late attach prove a request older than vtop); ``engine``: the server's
    engine, carried on the answer (a face names its request-log flag)."""
    s = mem.last if mem is not None else None
    running = s.running if s is not None else None
    waiting = s.waiting if s is not None else None
    logged = _logged(now, url, log)
    found: list[InFlightRequest] = []
    proven = _proven_log(url, mem, log, logged_since_start) if mem is not None else None
    if log is not None and log.finishes_logged:
        found += logged  # every end is logged: an open entry is in flight
    elif proven is not None:
        found.append(proven)
    found += _connections(now, url, conns, waiting)
    bound = _metrics_bound(url, mem) if mem is not None else None
    if bound is not None:
        found.append(bound)
    found.sort(key=_age_key, reverse=True)
    if mem is not None and (not found or _age_key(found[0])[0] < short_history_s):
        # what /metrics showed is too short to tell: the log's stats lines stand in
        hist = _history_bound(now, url, mem, history, logged, short_history_s)
        if hist is not None and _age_key(hist) > (_age_key(found[0]) if found else (-1.0, -1.0)):
            found.insert(0, hist)
            bound = bound or hist
    if bound is not None and found and found[0] is not bound:
        found.remove(bound)  # "some request has run N s": the older one named above stands for it
    oldest = _named(found[0], logged, proven) if found and found[0].age_min_s is not None else None
    if oldest is not None and oldest is not found[0]:
        found[0] = oldest
    busy = None if running is None else running + (waiting or 0.0)
    count = _count(busy, log, logged)
    found, oldest = _cap(found, oldest, busy)
    recent = None
    if log is not None and log.request_logging and not log.finishes_logged:
        recent = sum(1 for r in logged if r.age_max_s is not None and r.age_max_s <= RECENT_S)
    return ServerRequests(
        server=url, at=now, requests=tuple(found), oldest=oldest if oldest is not None else None,
        count=count, running=running, waiting=waiting,
        request_logging=None if log is None else log.request_logging,
        finishes_logged=bool(log is not None and log.finishes_logged), received_recent=recent,
        logged_open=len(logged), logged=tuple(logged), engine=engine)


def _cap(found: list[InFlightRequest], oldest: InFlightRequest | None,
         busy: float | None) -> tuple[list[InFlightRequest], InFlightRequest | None]:
    """Never more in flight than vLLM runs and queues: the weakest claims (last, by age) go."""
    if busy is None or len(found) <= busy:
        return found, oldest
    found = found[: max(0, int(busy))] if busy >= 1 else []
    return found, oldest if oldest in found else None


def _age_key(r: InFlightRequest) -> tuple[float, float]:
    return (r.age_min_s if r.age_min_s is not None else -1.0, r.age_max_s if r.age_max_s is not None else -1.0)


def _count(busy: float | None, log: LogSide | None, logged: list[InFlightRequest]) -> int | None:
    if busy is not None:
        return int(busy)
    if log is not None and log.finishes_logged:
        return len(logged)
    return None


def _logged(now: float, url: str, log: LogSide | None) -> list[InFlightRequest]:
    """The log's open entries (no end line, no abort), oldest first: in flight where the log has end
    lines (both bounds its age), else only "came at most N s ago"."""
    if log is None:
        return []
    exact = log.finishes_logged
    out = []
    for r in log.inflight:
        age = max(0.0, now - r.since)
        detail = (f"the request log: {r.request_id} came {dur(age)} ago and has no end line (this log has them): "
                  f"in flight {dur(age)}" if exact else
                  f"the request log: {r.request_id} came {dur(age)} ago; this log has no end lines, so it may "
                  "have ended since")
        out.append(InFlightRequest(
            url, (LOG,), age if exact else None, age, r.since if exact else None, request_id=r.request_id, endpoint=r.endpoint,
            max_tokens=r.max_tokens, client_set_max_tokens=_client_set(r), added=r.added,
            temperature=r.temperature, n=r.n, detail=detail))
    return out


def _client_set(r: Any) -> bool | None:
    if r.no_client_max_tokens:
        return False
    return True if r.max_tokens is not None else None


def _proven_log(url: str, mem: ServerMemory, log: LogSide | None,
                logged_since_start: Sequence[tuple[float, int]] | None) -> InFlightRequest | None:
    """The logged request known to be in flight longest: the request log with the ``max_tokens``
    histogram (:func:`vtop.core.requests.metrics_bound.oldest_logged`), or None."""
    s = mem.last
    reqs = log.inflight if log is not None else ()
    if not reqs or s is None:
        return None
    # where the log has Added lines, one that has none yet was not taken by the engine (refused?)
    added_logged = any(r.added for r in reqs)
    rows = [(float(r.since), float(r.max_tokens), r) for r in reqs
            if r.max_tokens is not None and (r.added or not added_logged)]
    busy = None if s.running is None else s.running + (s.waiting or 0.0)
    got = oldest_logged(rows, mem.max_tokens_ledger, mem.oldest.pending_starts(), s.t, busy,
                        pending_but_length=mem.oldest.pending_starts(but_length=True),
                        generated_since=_generated_since(mem), logged_since_start=logged_since_start)
    if got is None:
        return None
    age, since, r = got
    mt = "?" if r.max_tokens is None else f"{r.max_tokens:,}"
    detail = (f"the request log: {r.request_id} came {dur(s.t - since)} ago with max_tokens {mt} and has no end or "
              f"abort line; vLLM's request_params_max_tokens histogram counts every finish by its max_tokens, and "
              f"none of those since can be it: it has run at least {dur(age)}")
    return InFlightRequest(url, (LOG,), age, max(age, s.t - since), since, request_id=r.request_id, endpoint=r.endpoint,
                           max_tokens=r.max_tokens, client_set_max_tokens=_client_set(r), added=r.added,
                           temperature=r.temperature, n=r.n, detail=detail)


def _generated_since(mem: ServerMemory) -> Callable[[float], float | None]:
    s = mem.last

    def generated_since(t: float) -> float | None:
        a = mem.at(t)  # the sample at or before t (or the oldest: then fewer are counted out)
        if a is None or a.gen is None or s is None or s.gen is None or a.t > t:
            return None
        return float(s.gen - a.gen)

    return generated_since


def _connections(now: float, url: str, conns: ConnTracker | None, waiting: float | None) -> list[InFlightRequest]:
    """One request a connection: its answer streaming (it has run since it came), or not begun (in the
    engine only while nothing waits: else it may be queued, and it counts as in flight from when it
    came, at most)."""
    if conns is None:
        return []
    out = []
    for c in conns.in_flight(now):
        age = max(0.0, now - c.since)
        sure = not c.pending or waiting == 0
        out.append(InFlightRequest(url, (CONNECTION,), age if sure else None, age, c.since if sure else None,
                                   client=c.remote, answer_pending=c.pending, answer_bytes=c.bytes_sent,
                                   detail=_conn_detail(c, age, sure)))
    return out


def _conn_detail(c: Any, age: float, sure: bool) -> str:
    head = f"the kernel's TCP counters: the request that came {dur(age)} ago on the connection from {c.remote}"
    if not c.pending:
        sent = f", {c.bytes_sent:,} bytes sent in the last {dur(c.seen_s)}" if c.bytes_sent else ""
        return (f"{head} is still streaming its answer{sent}; a connection carries one request at a time, so that "
                f"request has run {dur(age)}")
    if sure:
        return (f"{head} has had no byte of its answer yet (a completion without \"stream\": true is sent whole "
                f"when it ends), and no request waits: it is in the engine; a connection carries one request at a "
                f"time, so that request has been in flight {dur(age)}")
    return f"{head} has had no byte of its answer yet, and requests wait: it may be queued, not running"


def _metrics_bound(url: str, mem: ServerMemory) -> InFlightRequest | None:
    """Some request has run this long, from ``/metrics`` alone."""
    s = mem.last
    if s is None or not s.running or s.running < 1:
        return None
    o = mem.oldest
    got: tuple[float, float, str] | None = None
    if o.since is not None:
        age = o.lower_bound_s
        run = "?" if o.running_then is None else f"{o.running_then:,.0f}"
        got = (age, o.since, f"the oldest in-flight request has run at least {dur(age)}: {run} running {dur(age)} ago and "
                    "running has never dropped below what is left of them, while requests that finished since (their "
                    "end-to-end latency says when they began) cannot all be those")
    occ = mem.occupancy
    if occ.age_s is not None and occ.since is not None and (got is None or occ.age_s > got[0]):
        top = "?" if occ.top_s is None else dur(occ.top_s)
        what = ("the tokens made since (vLLM's generation counter) are more than all the requests that finished "
                "since made (their generated-tokens histogram)" if occ.by == "tokens" else
                "the time requests spent running since is more than all the requests that finished since took "
                "(their end-to-end latencies)")
        got = (occ.age_s, occ.since, f"the oldest in-flight request has run at least {dur(occ.age_s)}: every "
                                     f"request that finished took at most {top}, and {what}: one in flight "
                                     f"now was in flight {dur(occ.age_s)} ago")
    if got is None:
        return None
    return InFlightRequest(url, (METRICS_BOUND,), got[0], None, got[1], detail=got[2])


def _history_bound(now: float, url: str, mem: ServerMemory, history: LogHistoryView | None,
                   logged: list[InFlightRequest], short_history_s: float) -> InFlightRequest | None:
    """What /metrics saw is too short to tell (doctor's window, an attach), and does not contradict
    it: requests ran at every sample, and one running from the first third of it on has not finished
    by the end-to-end latencies of those that did. The log's history says since when."""
    first_t, busy_since, since = mem.first_t, mem.busy_since, mem.oldest.since
    if history is None or first_t is None or busy_since is None or since is None:
        return None
    if busy_since > first_t or now - first_t >= short_history_s:
        return None
    if since - first_t > max(2.0, (now - first_t) / 3):
        return None
    first = mem.samples[0] if mem.samples else None
    s = mem.last
    prompt_flat = first is not None and first.prompt is not None and s is not None and s.prompt == first.prompt
    flagged = next((r for r in logged if r.no_client_max_tokens), None)
    named = None
    if flagged is not None:
        named = (flagged.request_id or "?", flagged.age_max_s, True, flagged.max_tokens, True)
    got = history.oldest_running(now, first_t, prompt_flat, named)
    if got is None:
        return None
    return InFlightRequest(url, (LOG,), now - got[0], None, got[0], detail=got[2])


def _named(top: InFlightRequest, logged: list[InFlightRequest], proven: InFlightRequest | None) -> InFlightRequest:
    """The oldest, with the request the log says it is: for a connection, the logged request that came
    when its request did (within ``LOG_LAG_S``); where ``/metrics`` alone proved it, the proven logged
    request, else one the client sent without ``max_tokens``, else the log's youngest request that came
    before it was known running (an older one may have ended unseen)."""
    if not logged or top.age_min_s is None or top.evidence[0] == LOG:
        return top
    pick = _same_arrival(top, logged) if top.evidence == (CONNECTION,) else _before(top, logged, proven)
    if pick is None:
        return top
    # the log's line may be read up to LOG_LAG_S after the request came: its "at most" never under the "at least"
    age_max = None if pick.age_max_s is None else max(pick.age_max_s, top.age_min_s)
    return InFlightRequest(top.server, (top.evidence[0], LOG), top.age_min_s, age_max, top.since,
                           request_id=pick.request_id, client=top.client, endpoint=pick.endpoint,
                           max_tokens=pick.max_tokens, client_set_max_tokens=pick.client_set_max_tokens,
                           answer_pending=top.answer_pending, answer_bytes=top.answer_bytes, added=pick.added,
                           temperature=pick.temperature, n=pick.n,
                           detail=_joined(top.detail, pick.detail if pick.request_id is None else None))


def _joined(*parts: str | None) -> str | None:
    got = [p for p in parts if p]
    return "; ".join(got) if got else None


#: the most bytes one token of an answer can take on the wire, and what an answer carries besides its
#: tokens: a streamed chat chunk is ~200-400 bytes a token (``data: {"id": ..., "model": ..., "choices":
#: [{"delta": {"content": ...}}]}``), ~1.5 KB with 20 top logprobs; 8 KiB is far above any of them. A
#: connection that sent more than this allows for a request's ``max_tokens`` (times its ``n``) is not
#: that request
ANSWER_BYTES_PER_TOKEN_MAX = 8192
ANSWER_BYTES_OVERHEAD = 65536


def _could_have_sent(r: InFlightRequest, sent: int | None) -> bool:
    """False when ``sent`` bytes of one answer are more than ``r`` may answer (its ``max_tokens``)."""
    if sent is None or r.max_tokens is None:
        return True
    return sent <= ANSWER_BYTES_OVERHEAD + ANSWER_BYTES_PER_TOKEN_MAX * r.max_tokens * max(1, r.n or 1)


def _same_arrival(top: InFlightRequest, logged: list[InFlightRequest]) -> InFlightRequest | None:
    """The logged request that came when the connection's request did (within ``LOG_LAG_S``) and that its
    answer does not rule out. A log line's stamp and the kernel's arrival differ by the log's lag (0.1-0.6 s
    seen), so where several fit, the closer is a guess: a wrong guess named a runaway's connection after a
    32-token completion that came 0.9 s before it (its 4.9 MB answer so far could not be 32 tokens). Several
    that fit are told as one of them: no id, what they all say (every client set max_tokens, or none did),
    the largest ``max_tokens`` as the bound; where they disagree, nothing (the connection says what it
    knows, and it is named once its answer rules out all but one)."""
    if top.age_max_s is None:
        return None
    close = [r for r in logged if r.age_max_s is not None and abs(r.age_max_s - top.age_max_s) <= LOG_LAG_S
             and _could_have_sent(r, top.answer_bytes)]
    if len(close) <= 1:
        return close[0] if close else None
    client_set = {r.client_set_max_tokens for r in close}
    if len(client_set) != 1 or None in client_set:
        return None
    caps = [r.max_tokens for r in close]
    endpoints = {r.endpoint for r in close}
    return InFlightRequest(top.server, (LOG,), None, max(r.age_max_s or 0.0 for r in close),
                           endpoint=endpoints.pop() if len(endpoints) == 1 else None,
                           max_tokens=None if None in caps else max(c for c in caps if c is not None),
                           client_set_max_tokens=client_set.pop(), added=all(r.added for r in close),
                           detail=f"one of {len(close)} requests logged within {LOG_LAG_S:.0f} s of its arrival")


def _before(top: InFlightRequest, logged: list[InFlightRequest],
            proven: InFlightRequest | None) -> InFlightRequest | None:
    t0 = top.age_min_s or 0.0  # it came at least this long ago
    if proven is not None and proven.age_max_s is not None and proven.age_max_s + LOG_LAG_S >= t0:
        return proven
    fits = [r for r in logged if r.age_max_s is not None and r.age_max_s + LOG_LAG_S >= t0]
    flagged = [r for r in fits if r.no_client_max_tokens]
    if flagged:
        return max(flagged, key=lambda r: r.age_max_s or 0.0)
    return min(fits, key=lambda r: r.age_max_s or 0.0) if fits else None
