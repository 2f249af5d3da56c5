"""Every face names the same oldest request, with the same bounds, at the same instant (issue 37, issue 38
item 2): the requests line under the server cards (the screen), the ``r`` table, ``--once --json``,
``doctor --json`` (and its text), the exporter's ``vtop_oldest_request_age_seconds`` and
``vtop_request_allowance_tokens``, and the runaway alert's title, on every runaway trace of the corpus,
every 10 s from the incident's start to its end.

Before the one answer (vtop.core.requests.requests_in_flight) each face picked its own: ``--once --json``
listed the request log's entries (the runaway third, a request long finished first) while the alert named
the runaway, and the exporter's ``source="log"`` age was an upper bound of an entry that may have ended.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.corpus.score import traces
from tests.corpus.window import _offset
from vtop.config import Config
from vtop.faces.exporter import ExportState, families
from vtop.faces.headless import format_text, report, request_words
from vtop.model.requests import age_words, dur_text
from vtop.monitor.player import open_recording
from vtop.sources.recording.trace import truth_of
from vtop.ui.screens import request_rows
from vtop.ui.widgets.alerts_panel import RequestsLine

RUNAWAYS = [p for p in traces() if truth_of(p).get("class") == "runaway"]


def _exported(fams: list[Any], url: str) -> tuple[list[tuple[str, float]], list[float]]:
    ages = [(s.labels["source"], s.value) for f in fams for s in f.samples
            if s.name == "vtop_oldest_request_age_seconds" and s.labels["server"] == url]
    allow = [s.value for f in fams for s in f.samples
             if s.name == "vtop_request_allowance_tokens" and s.labels["server"] == url]
    return ages, allow


def _check_instant(m: Any, url: str, started: float) -> bool:
    """The faces at this instant; True when there was an oldest request to agree on."""
    answer = m.in_flight.get(url)
    o = answer.oldest if answer is not None else None
    # --once --json and doctor --json: one report, the server's row names the oldest
    rep = report(m, started)
    js = rep.to_json()
    row = next(s for s in js["servers"] if s["url"] == url)
    ages, allow = _exported(families(m, ExportState()), url)
    line = RequestsLine.line(answer)
    rows = [r for r in request_rows(m.in_flight) if r[7].startswith("oldest")]
    if o is None:
        assert row["oldest_request"] is None and ages == [] and rows == [], (row, ages, rows)
        return False
    want = o.to_json()
    got = row["oldest_request"]
    for k in ("id", "client", "evidence", "age_min_s", "age_max_s", "max_tokens", "client_set_max_tokens",
              "no_client_max_tokens"):
        assert got[k] == want[k], (k, got, want)
    # any request the report lists for this server is no older than the oldest (it is first)
    mine = [r for r in js["requests"] if r["server"] == url]
    assert mine and mine[0]["age_min_s"] == want["age_min_s"], mine[:2]
    # doctor's text: the same words, from the same row
    assert request_words(got) in format_text(rep, doctor=True)
    # the exporter: its lower bound, by what proves it; the max_tokens vLLM gave it, where known
    if o.age_min_s is not None:
        assert ages == [(o.evidence[0], o.age_min_s)], (ages, want)
    assert allow == ([] if o.max_tokens is None else [float(o.max_tokens)]), (allow, want)
    # the screen: the requests line and the r table
    assert o.short_name in line and age_words(o) in line, (line, want)
    assert len(rows) == 1 and rows[0][3] == f"at least {dur_text(o.age_min_s)}", (rows, want)
    assert rows[0][1] == (o.request_id or "-") and rows[0][2] == (o.client or "-"), (rows, want)
    # the runaway alert, when on, names that request with that lower bound; where an older answer went
    # silent, the oldest still answering (its own words), and the silent one apart in the screen's words
    a = next((a for a in m.alerts if a.rule == "runaway" and a.target == url), None)
    r = answer.answering if answer is not None else None
    if a is not None and r is not None:
        assert age_words(r) in a.title, (a.title, want)
        if r.client:
            assert r.client in a.title, (a.title, want)
        if r.request_id:
            assert any(r.request_id in e for e in a.evidence) or r.request_id in a.title, (a.evidence, want)
        assert (a.severity == "info") == (r.client_set_max_tokens is True and "Long request" in a.title)
        if r is not o:
            assert o.answer_silent_s is not None, want
            assert any(e.startswith("older, set aside: ") and f"{o.name} in flight {age_words(o)}" in e
                       for e in a.evidence), (a.evidence, want)
    return True


@pytest.mark.parametrize("trace", RUNAWAYS, ids=[p.name for p in RUNAWAYS])
def test_every_face_names_the_same_oldest_request(trace: Path) -> None:
    truth = truth_of(trace)
    player = open_recording(str(trace), config=Config())
    off = _offset(player)
    began = float(truth["began"])
    end = float(truth.get("ended") or (began + 90))
    started = player.start
    agreed = 0
    t = began
    while t <= end:
        player.feed_until(t - off)
        m = player.monitor
        for url in list(m.in_flight):
            agreed += _check_instant(m, url, started)
        t += 10.0
    # the incident's request was named at some point of it, on every face
    assert agreed >= 2, agreed
