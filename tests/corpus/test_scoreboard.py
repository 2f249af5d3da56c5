"""The scoreboard in the fast tier: no trace of the corpus may do worse than its baseline.

``tests/corpus/baseline.json`` holds, per trace, what vtop made of it when the baseline
was written (``python -m tests.corpus.score --write-baseline``): named in time, how many
false alarms, cleared. A change that names a trace later, raises a false alarm a trace
did not have, or leaves an alert up after an incident ended fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.corpus.score import BASELINE, score_trace, traces

TRACES = traces()
BASE = json.loads(BASELINE.read_text()) if BASELINE.exists() else {}


def test_the_corpus_is_there() -> None:
    assert TRACES, "tests/corpus/traces holds no trace"
    assert set(BASE) >= {p.name for p in TRACES}, "a trace without a baseline: python -m tests.corpus.score --write-baseline"


@pytest.mark.parametrize("trace", TRACES, ids=[p.name for p in TRACES])
def test_a_trace_does_no_worse_than_its_baseline(trace: Path) -> None:
    s = score_trace(trace)
    base = BASE.get(trace.name)
    if base is None:
        pytest.fail(f"{trace.name} has no baseline")
    if base["in_time"]:
        assert s.in_time, f"{trace.name}: no longer named in time ({s.alert_after_s} s, budget {s.budget_s} s)"
    assert len(s.false_alarms) <= base["false_alarms"], f"{trace.name}: new false alarms {s.false_alarms}"
    if base["cleared"]:
        assert s.cleared, f"{trace.name}: an alert stays up after the incident ended"
