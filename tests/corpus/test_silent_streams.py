"""Answers gone silent on the real trace h100-engine-stall-streams-nolog (an H100, vLLM 0.26.0, no log:
its EngineCore SIGSTOPped while 3 streaming chat requests were answering). The engine-stall rule dates
the stall by the connections' silence; the requests line must name a request at least that old (its
answer silent), never a younger one "running" by /metrics, and no runaway may come of a silent answer.
On main before silent answers were in flight (the doctor the lead ran on the H100 said it, doctor-30s.txt
in the trace): "3 answers in flight on its connections got no byte for 45s" beside "oldest: a request
running at least 14s, by /metrics"."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.corpus.score import TRACES
from tests.corpus.test_faces_agree import _check_instant
from tests.corpus.window import _offset
from vtop.config import Config
from vtop.faces.headless import format_text, report, request_words
from vtop.monitor.player import open_recording
from vtop.sources.recording.trace import truth_of

TRACE = TRACES / "h100-engine-stall-streams-nolog"
#: every trace of the corpus whose connections hold answers gone silent with no older answer streaming
SILENT = [TRACE, TRACES / "engine-stall-streaming-nolog"]


def test_the_doctor_names_the_oldest_request_at_least_as_old_as_the_silence_and_no_runaway() -> None:
    """doctor --window 15 started 30 s after the SIGSTOP, as the lead ran it on the H100 (no --log)."""
    truth = truth_of(TRACE)
    cfg = Config()
    full = open_recording(str(TRACE), config=cfg)
    at = float(truth["began"]) + 30.0 - _offset(full)
    player = open_recording(str(TRACE), config=cfg, attach_at=at, with_log=False)
    player.feed_until(at + 15.0 + 1.0)
    m = player.monitor
    m.tick()
    now = m.clock.monotonic()
    stall = next(a for a in m.alerts if a.rule == "engine_stall")
    assert stall.since is not None
    silence_s = now - stall.since
    assert silence_s >= 40.0 and "dated by the connections" in "\n".join(stall.evidence)
    assert not [a for a in m.alerts if a.rule == "runaway"], [a.title for a in m.alerts]
    rep = report(m, at, window_asked_s=15.0)
    (row,) = [s for s in rep.to_json()["servers"] if s["url"] == truth["server"]["url"]]
    o = row["oldest_request"]
    assert o is not None and o["evidence"] == ["connection"], o
    assert o["age_min_s"] >= silence_s, (o, silence_s)
    assert o["answer_silent_s"] is not None and abs(o["answer_silent_s"] - silence_s) <= 1.0, (o, silence_s)
    text = format_text(rep, doctor=True)
    assert f"oldest: {request_words(o)}" in text and ", its answer silent for " in text and "by /metrics" not in text
    # the stall's line counts the three streams and nothing else: vtop's own /metrics read, caught
    # between its request and its answer, is no request waiting for an answer
    line = next(e for e in stall.evidence if "got no byte" in e)
    assert line.startswith("3 answers in flight") and "no byte of an answer yet" not in line, line


@pytest.mark.parametrize("trace", SILENT, ids=[p.name for p in SILENT])
def test_every_face_names_the_silent_oldest_through_the_stall_and_no_runaway_comes(trace: Path) -> None:
    """The whole trace played: every second no runaway; while the stall is on, the oldest request is
    at least as old as the stall, its answer silent; every 5 s, every face names that one oldest."""
    truth = truth_of(trace)
    player = open_recording(str(trace), config=Config(), with_log=truth.get("log_for_vtop", True) is not False)
    t = player.start
    silent_seen = agreed = 0
    while t < player.end:
        t += 1.0
        player.feed_until(t)
        m = player.monitor
        assert not [a for a in m.alerts if a.rule == "runaway"], (t - player.start, [a.title for a in m.alerts])
        now = m.clock.monotonic()
        for a in m.alerts:
            if a.rule != "engine_stall" or a.since is None or a.target is None:
                continue
            answer = m.in_flight.get(a.target)
            o = answer.oldest if answer is not None else None
            if o is None or o.answer_silent_s is None:
                continue
            silent_seen += 1
            assert o.age_min_s is not None and o.age_min_s >= now - a.since - 1.0, (t - player.start, o, a.since)
        if int(t - player.start) % 5 == 0:
            for url in list(m.in_flight):
                agreed += _check_instant(m, url, player.start)
    assert silent_seen >= 10 and agreed >= 10, (silent_seen, agreed)
