"""The one answer of a server's requests in flight (vtop.core.requests.requests_in_flight): what the
request log may and may not say, vLLM's running + waiting as the count, the bounds of each request."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from vtop.core.requests import LogRequests, requests_in_flight
from vtop.core.requests.conns import ConnTracker
from vtop.core.requests.metrics_bound import MaxTokensLedger, OldestInFlight
from vtop.core.requests.occupancy import OccupancyBound
from vtop.model.requests import CONNECTION, LOG

URL = "http://127.0.0.1:8000"


@dataclass
class Mem:
    """What the diagnoser remembers of a server, at one sample."""

    last: Any
    samples: list[Any] = field(default_factory=list)
    first_t: float | None = None
    busy_since: float | None = None
    oldest: OldestInFlight = field(default_factory=OldestInFlight)
    max_tokens_ledger: MaxTokensLedger = field(default_factory=MaxTokensLedger)
    occupancy: OccupancyBound = field(default_factory=OccupancyBound)

    def at(self, t: float) -> Any:
        return None


def mem(running: float, waiting: float, t: float = 100.0) -> Mem:
    return Mem(SimpleNamespace(t=t, running=running, waiting=waiting, gen=1000.0, prompt=10.0))


def entry(rid: str, since: float, max_tokens: int = 64, no_client: bool = False) -> Any:
    return SimpleNamespace(request_id=rid, since=since, endpoint="chat", max_tokens=max_tokens, temperature=None,
                           n=None, no_client_max_tokens=no_client, added=True)


def test_without_end_lines_the_log_says_received_not_in_flight() -> None:
    """V1 logs no end line by default: 30 open entries at running 2 are not 30 in flight. The count is
    vLLM's own; the entries are "received" (those of the last 10 s counted), none listed as in flight
    (nothing proves one is)."""
    log = LogRequests([entry(f"cmpl-{i}", 100.0 - 60 + 2 * i) for i in range(30)], True, False)
    a = requests_in_flight(100.0, URL, mem(2, 0), log=log)
    assert a.count == 2 and a.requests == () and a.oldest is None
    assert a.received_recent == 5  # came 10, 8, 6, 4 and 2 s ago
    assert a.logged_open == 30 and all(r.age_min_s is None and r.age_max_s is not None for r in a.logged)


def test_with_end_lines_the_log_s_entries_are_in_flight_with_both_bounds() -> None:
    log = LogRequests([entry("chatcmpl-a", 40.0, 65000, no_client=True), entry("chatcmpl-b", 90.0)], True, True)
    a = requests_in_flight(100.0, URL, mem(2, 0), log=log)
    assert [r.request_id for r in a.requests] == ["chatcmpl-a", "chatcmpl-b"]
    o = a.oldest
    assert o is not None and o.request_id == "chatcmpl-a" and o.age_min_s == o.age_max_s == 60.0
    assert o.evidence == (LOG,) and o.client_set_max_tokens is False and o.no_client_max_tokens
    assert a.received_recent is None  # the log's count is exact: no "received" to say


def test_never_more_in_flight_than_running_plus_waiting() -> None:
    log = LogRequests([entry(f"chatcmpl-{i}", 50.0 + i) for i in range(5)], True, True)
    a = requests_in_flight(100.0, URL, mem(1, 1), log=log)
    assert a.count == 2 and len(a.requests) == 2 and a.oldest is not None and a.oldest.request_id == "chatcmpl-0"


def test_a_connection_with_no_answer_yet_while_requests_wait_is_not_known_running() -> None:
    """Queued or decoding, the connection does not say: listed from when it came at most, not the oldest."""
    ct = ConnTracker()
    conn = SimpleNamespace(local="127.0.0.1:8000", remote="127.0.0.1:50312", last_sent_s=30.0, last_recv_s=30.0,
                           bytes_acked=0, bytes_received=120, port=8000)
    ct.feed(99.0, [conn])
    ct.feed(100.0, [SimpleNamespace(**{**vars(conn), "last_sent_s": 31.0, "last_recv_s": 31.0})])
    waiting = requests_in_flight(100.0, URL, mem(1, 1), conns=ct)
    (r,) = waiting.requests
    assert r.evidence == (CONNECTION,) and r.answer_pending and r.age_min_s is None and r.age_max_s == 31.0
    assert waiting.oldest is None
    idle = requests_in_flight(100.0, URL, mem(1, 0), conns=ct)
    assert idle.oldest is not None and idle.oldest.age_min_s == 31.0 and idle.oldest.client == "127.0.0.1:50312"


def test_a_connection_is_named_by_the_logged_request_that_came_with_it() -> None:
    """The request log and the connection see the same arrival: the oldest is the connection's (its
    lower bound, its client) with the logged request's id and max_tokens (a capped one: its client set it)."""
    ct = ConnTracker()
    c1 = SimpleNamespace(local="127.0.0.1:8000", remote="127.0.0.1:50400", last_sent_s=0.1, last_recv_s=49.0,
                         bytes_acked=1000, bytes_received=300, port=8000)
    ct.feed(99.0, [c1])
    ct.feed(100.0, [SimpleNamespace(**{**vars(c1), "last_sent_s": 0.1, "last_recv_s": 50.0, "bytes_acked": 9000})])
    log = LogRequests([entry("chatcmpl-early", 20.0), entry("chatcmpl-long", 50.5, 6000)], True, False)
    a = requests_in_flight(100.0, URL, mem(1, 0), log=log, conns=ct)
    o = a.oldest
    assert o is not None and o.evidence == (CONNECTION, LOG) and o.client == "127.0.0.1:50400"
    assert o.request_id == "chatcmpl-long" and o.max_tokens == 6000 and o.client_set_max_tokens is True
    # the log's line came 49.5 s ago, half a second after the kernel saw the request: "at most" is never under
    # "at least" (one request, one age range)
    assert o.age_min_s == 50.0 and o.age_max_s == 50.0


def _conn_with(sent_since_first: int) -> ConnTracker:
    """One streaming connection whose request came 110 s before t=100 (as the real runaway's)."""
    ct = ConnTracker()
    c = SimpleNamespace(local="127.0.0.1:8000", remote="127.0.0.1:50870", last_sent_s=0.1, last_recv_s=109.0,
                        bytes_acked=5000, bytes_received=400, port=8000)
    ct.feed(99.0, [c])
    ct.feed(100.0, [SimpleNamespace(**{**vars(c), "last_recv_s": 110.0, "bytes_acked": 5000 + sent_since_first})])
    return ct


def test_a_connection_is_not_named_after_a_short_request_that_came_a_moment_before_it() -> None:
    """Seen in a clean-clone run of the real tier (issue 38): a 32-token completion logged 0.9 s before a
    runaway chat, the completion's stamp 0.26 s from the connection's arrival, the runaway's 0.60 s. The
    closer was named, so the runaway's own connection (4.9 MB sent) was "a long request whose client set
    max_tokens". Its answer rules the completion out; with little sent yet the two are not told apart,
    and the connection is not named after either."""
    log = LogRequests([entry("cmpl-short", -10.26, 32), entry("chatcmpl-runaway", -9.4, 65516, no_client=True)],
                      True, False)
    a = requests_in_flight(100.0, URL, mem(1, 0), log=log, conns=_conn_with(4_979_288))
    o = a.oldest
    assert o is not None and o.evidence == (CONNECTION, LOG) and o.client == "127.0.0.1:50870"
    assert o.request_id == "chatcmpl-runaway" and o.no_client_max_tokens and o.max_tokens == 65516
    early = requests_in_flight(100.0, URL, mem(1, 0), log=log, conns=_conn_with(1_000)).oldest
    assert early is not None and early.evidence == (CONNECTION,) and early.request_id is None
    assert early.client == "127.0.0.1:50870" and early.client_set_max_tokens is None
    # the short one alone, with an answer it could have sent: named after it
    alone = LogRequests([entry("cmpl-short", -10.26, 32)], True, False)
    small = requests_in_flight(100.0, URL, mem(1, 0), log=alone, conns=_conn_with(3_000)).oldest
    assert small is not None and small.request_id == "cmpl-short"
    # ... and an answer it could not have sent: not named after it
    big = requests_in_flight(100.0, URL, mem(1, 0), log=alone, conns=_conn_with(4_979_288)).oldest
    assert big is not None and big.request_id is None


def test_a_connection_among_several_capped_requests_is_one_of_them_capped() -> None:
    """Concurrent streams whose clients all set max_tokens, logged within a second of the connection's
    arrival: which one it is cannot be told, but every one was capped (a long request, not a runaway); the
    bound is the largest max_tokens, and no id is named."""
    log = LogRequests([entry("chatcmpl-a", -10.3, 6000), entry("chatcmpl-b", -9.7, 4000)], True, False)
    o = requests_in_flight(100.0, URL, mem(2, 0), log=log, conns=_conn_with(20_000)).oldest
    assert o is not None and o.evidence == (CONNECTION, LOG) and o.request_id is None
    assert o.client == "127.0.0.1:50870" and o.client_set_max_tokens is True and o.max_tokens == 6000
    assert o.detail is not None and "one of 2 requests logged" in o.detail
