"""An answer that began and went silent (a frozen engine, or a client that stopped reading): in flight,
as old as its request, in a state of its own (neither streaming nor pending), said so on every face, and
never the runaway rule's premise; a kept-alive connection idle since its answer never counts (injected
clocks; the real trace is tests/corpus/test_silent_streams.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.helpers import diag_fixtures as F
from vtop.core.requests import requests_in_flight
from vtop.core.requests.conns import FLOWING_S, READ_EVERY_S, SILENT_S, ConnTracker
from vtop.faces.headless import request_words
from vtop.model.requests import CONNECTION

URL = "http://127.0.0.1:8000"


def conn(remote: str, sent: float, recv: float, acked: int = 5000, rcvd: int = 400) -> Any:
    return SimpleNamespace(local="127.0.0.1:8000", remote=remote, last_sent_s=sent, last_recv_s=recv,
                           bytes_acked=acked, bytes_received=rcvd)


def mem(running: float, waiting: float = 0.0, t: float = 100.0) -> Any:
    from tests.unit.test_requests_answer import mem as m

    return m(running, waiting, t)


# --------------------------------------------------------------------------- the tracker's states


def test_a_begun_answer_silent_for_silent_s_is_in_flight_as_old_as_its_request_and_not_streaming() -> None:
    tr = ConnTracker()
    tr.feed(1000.0, [conn("a:1", 45.0, 65.0)])  # its request came 65 s ago, its last byte went 45 s ago
    (s,) = tr.in_flight(1000.0)
    assert s.remote == "a:1" and not s.pending
    assert s.since == 1000.0 - 65.0 and s.age_s == 65.0 and s.silent_since == 1000.0 - 45.0
    assert tr.streaming(1000.0) == [] and tr.oldest(1000.0, silent=False) is None
    assert tr.oldest(1000.0) == s
    assert tr.read_every() == READ_EVERY_S  # nothing to follow closely
    # the engine moves again: its answer streams, still as old as its request
    tr.feed(1002.0, [conn("a:1", 0.1, 67.0, acked=9000)])
    (s2,) = tr.in_flight(1002.0)
    assert s2.silent_since is None and not s2.pending and s2.since == 1000.0 - 65.0
    assert tr.streaming(1002.0) == [s2]


def test_a_kept_alive_connection_idle_since_its_answer_never_counts_and_one_open_past_silent_s_does() -> None:
    """uvicorn closes a kept-alive connection 5 s after its answer ended: every read of it while still
    open finds its last byte under SILENT_S ago, and it stops counting FLOWING_S after its answer ended.
    Still open SILENT_S after its last byte, its answer has not ended: in flight, silent."""
    tr = ConnTracker()
    for i in range(4):  # an answer streaming since its request came 30 s ago
        tr.feed(100.0 + i, [conn("a:1", 0.05, 30.0 + i, acked=1000 * (i + 1))])
    assert tr.oldest(103.0) is not None
    ended = 103.0
    for after in (FLOWING_S + 0.1, 5.9, SILENT_S - 0.1):
        tr.feed(ended + after, [conn("a:1", after, 33.0 + after, acked=4000)])
        assert tr.in_flight(ended + after) == [] and tr.silence(ended + after) is None, after
    tr.feed(ended + SILENT_S + 1.0, [conn("a:1", SILENT_S + 1.0, 33.0 + SILENT_S + 1.0, acked=4000)])
    (s,) = tr.in_flight(ended + SILENT_S + 1.0)
    assert s.silent_since == ended and s.since == 70.0 and not s.pending


def test_the_silence_counts_no_scrape_caught_between_its_request_and_its_answer() -> None:
    """vtop's own /metrics read on a kept-alive connection, read 8 ms after its request came and before
    its answer (the real trace h100-engine-stall-streams-nolog reads so at one read in two): no request
    waiting for its answer; the three silent streams are all there is."""
    tr = ConnTracker()
    scrape = conn("127.0.0.1:59708", 0.996, 0.008, acked=1245723, rcvd=3874)
    tr.feed(1000.0, [scrape, *(conn(f"127.0.0.1:5973{i}", 45.6, 65.6, acked=1700361, rcvd=439) for i in range(3))])
    sil = tr.silence(1000.0)
    assert sil is not None and (sil.streams, sil.pending) == (3, 0)
    # a request of SILENT_S or more with no byte of its answer yet (a non-streamed completion) still counts
    tr.feed(1001.0, [scrape, conn("b:2", 30.0, 30.0), *(conn(f"127.0.0.1:5973{i}", 46.6, 66.6) for i in range(3))])
    sil = tr.silence(1001.0)
    assert sil is not None and (sil.streams, sil.pending) == (3, 1)


# --------------------------------------------------------------------------- the one answer


def silent_beside_streaming() -> ConnTracker:
    tr = ConnTracker()
    for i in range(3):
        tr.feed(98.0 + i, [conn("10.0.0.7:5555", 43.0 + i, 63.0 + i, acked=1700),  # silent 45 s at 100
                           conn("10.0.0.8:6666", 0.05, 18.0 + i, acked=1000 * (i + 1))])  # streaming, 20 s
    return tr


def test_the_oldest_in_flight_is_the_silent_one_and_the_runaway_reads_the_oldest_still_answering() -> None:
    a = requests_in_flight(100.0, URL, mem(2), conns=silent_beside_streaming())
    assert [r.client for r in a.requests] == ["10.0.0.7:5555", "10.0.0.8:6666"]
    o = a.oldest
    assert o is a.requests[0] and o.evidence == (CONNECTION,)
    assert o.age_min_s == 65.0 and o.answer_silent_s == 45.0 and not o.answer_pending
    assert a.answering is a.requests[1] and a.answering.answer_silent_s is None and a.answering.age_min_s == 20.0
    assert o.to_json()["answer_silent_s"] == 45.0 and a.answering.to_json()["answer_silent_s"] is None
    assert "has sent no byte of it for 45s" in (o.detail or "")
    # vLLM runs one: the silent one goes first (its engine may have finished it), never the streaming one
    one = requests_in_flight(100.0, URL, mem(1), conns=silent_beside_streaming())
    assert [r.client for r in one.requests] == ["10.0.0.8:6666"] and one.oldest is one.answering is one.requests[0]
    # no silent answer: one oldest, the same object
    tr = ConnTracker()
    for i in range(3):
        tr.feed(98.0 + i, [conn("10.0.0.8:6666", 0.05, 18.0 + i, acked=1000 * (i + 1))])
    plain = requests_in_flight(100.0, URL, mem(1), conns=tr)
    assert plain.oldest is plain.answering is not None


def test_every_face_says_a_silent_answer_in_the_same_words() -> None:
    from vtop.actions.stop import tokens_words
    from vtop.ui.screens import request_rows
    from vtop.ui.widgets.alerts_panel import RequestsLine

    a = requests_in_flight(100.0, URL, mem(2), conns=silent_beside_streaming())
    o = a.oldest
    assert o is not None
    words = "in flight at least 1m 05s, its answer silent for 45s"
    assert words in request_words(o.to_json())
    full = RequestsLine.line(a)
    assert f"oldest the request from 10.0.0.7:5555 {words}" in full and "running" not in full.split("·")[1]
    for width in (100, 78, 60, 40):
        assert "silent" in RequestsLine.line(a, width=width), width
    (row,) = [r for r in request_rows({URL: a}) if r[7].startswith("oldest")]
    assert row[2] == "10.0.0.7:5555" and "its answer silent for 45s" in row[7]
    assert "its answer silent for 45s" in tokens_words(o)


# --------------------------------------------------------------------------- the runaway rule


def decoding(seconds: int, conns_at: Any, *, running: float = 2.0) -> list[list[Any]]:
    """A server decoding 300 tok/s with ``running`` requests and none finishing, scraped every second;
    its connections (``conns_at(i)``) read every 2 s."""
    base = F.fixture_metrics("h200-0.26.0-metrics-runaway.txt")
    ses = F.Session(url=URL)
    tr = ConnTracker()
    out = []
    for i in range(seconds):
        now = F.R.BASE + i
        assert base.generation_tokens_total is not None
        ses.metrics(F.grow(base, running=running, waiting=0.0,
                           generation_tokens_total=base.generation_tokens_total + 300.0 * i),
                    mono=now, max_model_len=32768)
        if i % 2 == 0:
            tr.feed(now, conns_at(i))
        out.append(ses.tick(conns={URL: tr}))
    return out


def test_a_silent_answer_beside_decoding_traffic_is_no_runaway_and_a_real_one_says_the_silent_one_apart() -> None:
    """A silent answer of 5 min beside a stream of 10-30 s, tokens flowing: no runaway (a silent answer is
    no sign of decoding). Beside a stream of 60 s (sent without max_tokens, as far as anything says):
    the runaway names the stream, and says the older, silent one apart in a line of its own."""
    silent = lambda i: conn("10.0.0.7:5555", 240.0 + i, 300.0 + i, acked=1700)  # noqa: E731
    young = decoding(20, lambda i: [silent(i), conn("10.0.0.8:6666", 0.05, 10.0 + i, acked=1000 * (i + 1))])
    assert not any(a.rule == "runaway" for t in young for a in t), [a.title for t in young for a in t]
    old = decoding(20, lambda i: [silent(i), conn("10.0.0.8:6666", 0.05, 60.0 + i, acked=1000 * (i + 1))])
    got = [a for a in old[-1] if a.rule == "runaway"]
    assert got, [a.title for a in old[-1]]
    a = got[0]
    assert "client 10.0.0.8:6666" in a.title and "10.0.0.7" not in a.title
    line = next(x for x in a.evidence if x.startswith("older, set aside:"))
    assert "the request from 10.0.0.7:5555 in flight at least 5m 19s, its answer silent for 4m 19s" in line
    assert any("10.0.0.8:6666" in f for f in a.fix) and not any("10.0.0.7" in f for f in a.fix)


def test_a_batch_of_streams_of_one_age_waits_for_runaway_s_and_a_lone_one_does_not() -> None:
    """The real H100 recording h100-neighbour-gpu-bound: 32 streams sent together (max_tokens 8,192, none done),
    each as old as the others. Nothing finished to say what is ordinary: a batch of long answers looks the same
    as many runaways, so the oldest is named at runaway_s (2 min), not at 45 s. One stream as old beside young
    ones stands apart and is named at 45 s."""
    def batch(age0: float) -> Any:
        return lambda i: [conn(f"10.0.1.{k}:7000", 0.05, age0 + i + 0.1 * k, acked=900 * (i + 1)) for k in range(8)]

    young = decoding(20, batch(50.0), running=8.0)  # 50-70 s old, all eight
    assert not any(a.rule == "runaway" for t in young for a in t), [a.title for t in young for a in t]
    old = decoding(12, batch(112.0), running=8.0)  # past 120 s: named
    assert any(a.rule == "runaway" for a in old[-1]), [a.title for a in old[-1]]
    lone = decoding(20, lambda i: [conn("10.0.0.9:7001", 0.05, 50.0 + i, acked=900 * (i + 1)),
                                   *(conn(f"10.0.2.{k}:7002", 0.05, 2.0 + i % 5, acked=100) for k in range(7))],
                    running=8.0)
    assert any(a.rule == "runaway" and "10.0.0.9:7001" in a.title for a in lone[-1]), [a.title for a in lone[-1]]


@pytest.mark.parametrize("sent", [SILENT_S - 0.5, FLOWING_S + 0.5])
def test_an_answer_that_ended_moments_ago_is_not_silent(sent: float) -> None:
    tr = ConnTracker()
    tr.feed(100.0, [conn("a:1", sent, 60.0)])
    assert tr.in_flight(100.0) == []
    a = requests_in_flight(100.0, URL, mem(1), conns=tr)
    assert a.requests == () and a.oldest is None and a.answering is None
