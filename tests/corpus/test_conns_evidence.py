"""Issue 24, the last unnamed trace: a runaway among short requests with request logging off,
seen by ``doctor --window 15``. Nothing in 15 s of ``/metrics`` or in the log's stats lines proves
one request older than the window (``h200-runaway-short-traffic``'s truth says why); the kernel's
counters of the server's connections do (vtop/sources/sockets.py, vtop/core/requests/conns.py).

On the real recordings that hold those counters (``conns.jsonl.gz``: one from the vLLM CPU build,
one from vLLM 0.26.0 on the H200), a window names the runaway and its client; the same trace
without the counters is not named (what the code before them did); and the live play mirrors the
recorded connections as real ones, which this box's kernel then reports.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import time
from pathlib import Path

import pytest

from tests.corpus.score import TRACES
from tests.corpus.window import WINDOW_S, doctor_at
from vtop.sources.recording.trace import is_trace, truth_of
from vtop.sources.sockets import read_conns

WITH_CONNS = sorted(p for p in TRACES.iterdir() if is_trace(p) and (p / "conns.jsonl.gz").exists())
RUNAWAYS = [p for p in WITH_CONNS if truth_of(p)["class"] == "runaway"]


def _runaway_client(trace: Path) -> str:
    """The client address of the runaway's connection, from the recording: the connection whose
    request came at the runaway's start (its ``last_recv_s`` grows with the trace)."""
    began = float(truth_of(trace)["began"])
    best: dict[str, float] = {}
    with gzip.open(trace / "conns.jsonl.gz", "rt") as f:
        for line in f:
            r = json.loads(line)
            for c in r["conns"]:
                if c["last_recv_s"] is not None and abs((r["t"] - c["last_recv_s"]) - began) < 3.0:
                    best[c["remote"]] = max(best.get(c["remote"], 0.0), c["last_recv_s"])
    assert best, f"{trace.name}: no connection's request came when the runaway began"
    return max(best, key=lambda k: best[k])


def test_the_corpus_has_connection_recordings_of_both_kinds() -> None:
    names = {p.name for p in WITH_CONNS}
    assert {"runaway-short-traffic-no-request-log", "h200-runaway-short-traffic-2"} <= names
    assert any(truth_of(p)["class"] == "normal" for p in WITH_CONNS)


@pytest.mark.parametrize("trace", RUNAWAYS, ids=lambda p: p.name)
def test_a_window_names_the_runaway_by_its_connection_and_not_without_it(trace: Path, tmp_path: Path) -> None:
    truth = truth_of(trace)
    # the window ends at the budget, or just before the runaway ended where it ended sooner (SGLang's second
    # runaway reached its context length 59.9 s in, 0.1 s before the budget: after that nothing runs to name)
    end = min(float(truth["should_alert_by"]), float(truth["ended"]) - 1.0)
    at = end - WINDOW_S
    code, alerts = doctor_at(trace, at)
    hit = [a for a in alerts if a.rule == "runaway" and a.severity in ("warning", "critical")]
    assert hit and code in (1, 2), (code, [(a.rule, a.severity, a.title) for a in alerts])
    client = _runaway_client(trace)
    assert f"(client {client})" in hit[0].title, hit[0].title
    assert any("kernel's TCP counters" in e for e in hit[0].evidence), hit[0].evidence
    assert any(client in f for f in hit[0].fix), hit[0].fix
    # the age claimed: from the request's arrival to the window's end (the incident began with it)
    m = re.search(r"(?:running|in flight) at least (?:(\d+)m )?(\d+)s", hit[0].title)
    assert m is not None, hit[0].title
    age = 60 * int(m.group(1) or 0) + int(m.group(2))
    assert WINDOW_S < age <= end - float(truth["began"]) + 2, hit[0].title
    # the same recording without the kernel's counters: the request log is off and short requests come and
    # go, so nothing proves the request's age in 15 s (this is what vtop said before it read them)
    bare = tmp_path / trace.name
    shutil.copytree(trace, bare)
    (bare / "conns.jsonl.gz").unlink()
    code2, alerts2 = doctor_at(bare, at)
    named2 = [a for a in alerts2 if a.rule == "runaway" and a.severity in ("warning", "critical")]
    flags = (truth.get("server") or {}).get("flags") or []
    if {"--enable-log-requests", "--log-requests"} & set(flags):
        # SGLang's runaways ran with --log-requests: without the counters what names them is the request log
        # (this part is about a server whose request log is off); none of its evidence may cite the counters
        assert not any("kernel's TCP counters" in e for a in named2 for e in a.evidence), named2
    else:
        assert code2 == 0 and not named2, [(a.rule, a.title) for a in named2]


def test_the_live_play_mirrors_the_recorded_connections_as_real_ones() -> None:
    from tests.corpus.serve_trace import TraceServer, TraceTimeline

    trace = TRACES / "runaway-short-traffic-no-request-log"
    tl = TraceTimeline(trace)
    began = tl.began
    assert began is not None
    srv = TraceServer(trace, start_at=began - 1.0, conns=True)
    with srv:
        port = srv.port
        seen: list[tuple[float, float, int]] = []  # (mono, last_recv_s, bytes_acked) of the oldest request
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(seen) < 3:
            read = read_conns({port})
            assert read.error is None, read.error
            old = [c for c in read.conns if c.last_recv_s is not None and c.last_recv_s >= 1.0
                   and c.bytes_acked and c.last_sent_s is not None and c.last_sent_s < c.last_recv_s]
            if old:
                c = max(old, key=lambda c: c.last_recv_s or 0.0)
                if not seen or c.bytes_acked > seen[-1][2]:  # type: ignore[operator]
                    seen.append((read.mono, c.last_recv_s or 0.0, c.bytes_acked or 0))
            time.sleep(0.5)
        assert len(seen) >= 3, f"no mirrored answer streaming on the play's port: {seen}"
        # one request, its answer flowing: the request's age grows with the reads, the bytes too
        assert seen[-1][1] > seen[0][1] and seen[-1][2] > seen[0][2]
        assert abs((seen[-1][0] - seen[-1][1]) - (seen[0][0] - seen[0][1])) < 1.5  # the same arrival
        # every mirrored connection is the server's side of the play's port, as on the recorded box
        assert all(c.port == port for c in read_conns({port}).conns)


def test_a_long_answer_whose_client_set_max_tokens_is_shown_not_alarmed() -> None:
    """normal-long-generation-max-tokens-conns: streams with max_tokens 6000 run 14-52 s each on the CPU
    build, request logging on. The connection proves the longest has run past the runaway rule's 45 s;
    the request log says its client capped it: an info "long request", never a warning (doctor started
    every 5 s of the trace)."""
    from tests.corpus.serve_trace import TraceTimeline

    trace = TRACES / "normal-long-generation-max-tokens-conns"
    tl = TraceTimeline(trace)
    began = tl.origin_t  # the launch
    infos = []
    for at in range(60, int(tl.end) - 15, 5):
        code, alerts = doctor_at(trace, began + at)
        assert code == 0, (at, [(a.rule, a.severity, a.title) for a in alerts])
        infos += [a for a in alerts if a.rule == "runaway"]
    assert infos, "the long request was never shown"
    assert all(a.severity == "info" and "client set max_tokens" in a.title for a in infos), [a.title for a in infos]
    assert any("6,000" in e for a in infos for e in a.evidence), infos[0].evidence


def test_a_request_with_no_answer_yet_is_taken_only_while_nothing_waits(tmp_path: Path) -> None:
    """runaway-nonstreaming-short-traffic-no-request-log: a chat request without max_tokens and without
    ``"stream": true`` among short requests, request logging off. Nothing of its answer is sent until it
    ends, so the connection shows its request and no byte since: in a 15 s window that names it, as in
    flight (not as streaming). The same trace with vLLM's waiting gauge at 1 throughout: the request
    could be queued, not decoding, and the connection alone is no longer taken as a runaway (fails
    without that guard). Fails on the tracker before it knew answers not begun (not named at all)."""
    trace = TRACES / "runaway-nonstreaming-short-traffic-no-request-log"
    truth = truth_of(trace)
    # the window ends at the budget, or just before the runaway ended where it ended sooner (SGLang's second
    # runaway reached its context length 59.9 s in, 0.1 s before the budget: after that nothing runs to name)
    end = min(float(truth["should_alert_by"]), float(truth["ended"]) - 1.0)
    at = end - WINDOW_S
    code, alerts = doctor_at(trace, at)
    hit = [a for a in alerts if a.rule == "runaway" and a.severity in ("warning", "critical")]
    assert hit and code in (1, 2), (code, [(a.rule, a.severity, a.title) for a in alerts])
    assert "in flight at least" in hit[0].title, hit[0].title
    assert any("no byte of its answer" in e for e in hit[0].evidence), hit[0].evidence
    assert f"(client {_runaway_client(trace)})" in hit[0].title
    queued = tmp_path / trace.name
    shutil.copytree(trace, queued)
    rows = []
    with gzip.open(trace / "metrics.jsonl.gz", "rt") as f:
        for line in f:
            r = json.loads(line)
            if isinstance(r.get("text"), str):
                r["text"] = re.sub(r"^(vllm:num_requests_waiting\{[^}]*\}) 0\.0$", r"\1 1.0", r["text"], flags=re.M)
            rows.append(json.dumps(r))
    with gzip.open(queued / "metrics.jsonl.gz", "wt") as f:
        f.write("\n".join(rows) + "\n")
    code2, alerts2 = doctor_at(queued, at)
    assert not [a for a in alerts2 if a.rule == "runaway" and a.severity in ("warning", "critical")], \
        [(a.rule, a.severity, a.title) for a in alerts2]


def test_long_answers_not_begun_are_seen_and_stay_under_the_runaway_age() -> None:
    """normal-long-nonstreaming-max-tokens: 16 non-streamed answers of max_tokens 3000, two at a time, 15-31 s
    each on the CPU build, request logging off. The tracker sees each as a request with no answer yet (the
    evidence is there, read from the recording), none as old as the runaway rule's 45 s; the window test
    (tests/corpus/test_window.py) has doctor exit 0 on it."""
    from vtop.core.requests.conns import ConnTracker
    from vtop.core.rules.alert import Thresholds
    from vtop.sources.sockets import conn_read_from_json

    trace = TRACES / "normal-long-nonstreaming-max-tokens"
    tr = ConnTracker()
    oldest: list[float] = []
    clients: set[str] = set()
    with gzip.open(trace / "conns.jsonl.gz", "rt") as f:
        for line in f:
            read = conn_read_from_json(json.loads(line))
            tr.feed(read.mono, read.conns, read.error)
            got = [s for s in tr.in_flight(read.mono) if s.pending]
            clients |= {s.remote for s in got}
            if got:
                oldest.append(got[0].age_s)
    assert len(clients) >= 12, clients  # one connection per long answer (httpx client each)
    assert 14.0 <= max(oldest) < Thresholds().runaway_age_s, max(oldest)
