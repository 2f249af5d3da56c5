"""KV pressure that has just gone quiet is named by a short ``doctor`` window (issue 38 item 10b).

A ``doctor --window 15`` whose window falls between two bursts of KV pressure saw /metrics with
the cache no longer full and nothing waiting, and said "no alerts", although the log's stats lines
(``GPU KV cache usage: 100.0%``, ``Waiting: 12 reqs``) and the preemption counter held the bursts.
Here each KV-saturation trace of the corpus is judged by doctor started 5 s after its incident
ended (the window is the quiet after a burst): the KV rule reads the bursts from the log's stats
lines before its first sample and the preemption counter, and names them (a warning: it is not
full now). On main before this change all three windows exited 0 with no alert.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.corpus.score import TRACES
from tests.corpus.window import doctor_at

KV_TRACES = sorted(p for p in TRACES.iterdir() if p.name.startswith("kv-saturation-")) if TRACES.is_dir() else []


@pytest.mark.skipif(not KV_TRACES, reason="no corpus traces")
@pytest.mark.parametrize("path", KV_TRACES, ids=lambda p: p.name)
def test_doctor_between_bursts_names_the_kv_pressure_the_log_holds(path: Path) -> None:
    truth = json.loads((path / "truth.json").read_text())
    code, alerts = doctor_at(path, float(truth["ended"]) + 5.0)
    kv = [a for a in alerts if a.rule == "kv_saturation"]
    assert kv, (code, alerts)
    a = kv[0]
    assert a.severity == "warning" and code == 1
    assert "in bursts" in a.title and "preemptions since the server started" in a.title
    assert any(e.startswith("the log's stats lines: KV cache at") for e in a.evidence)


BURSTS = TRACES / "kv-saturation-bursts"


@pytest.mark.skipif(not (BURSTS / "truth.json").is_file(), reason="no kv-saturation-bursts trace")
@pytest.mark.parametrize("gap", [0, 1])
def test_doctor_in_the_quiet_between_two_real_bursts_names_those_before_it(gap: int) -> None:
    """kv-saturation-bursts, recorded on the real vLLM: three bursts of 60 s at 90-100 % KV with 3-12
    waiting, 45 s of an idle cache between them. ``doctor --window 15`` started 5 s after a burst ended
    sees KV at 0 % and nothing waiting the whole window; it names the bursts the log held before it,
    as many as there were, and the preemptions so far."""
    events = [json.loads(x) for x in (BURSTS / "events.jsonl").read_text().splitlines() if x.strip()]
    ends = [e for e in events if e["what"] == "burst_end"]
    code, alerts = doctor_at(BURSTS, float(ends[gap]["t"]) + 5.0)
    kv = [a for a in alerts if a.rule == "kv_saturation"]
    assert kv and code == 1, (code, alerts)
    a = kv[0]
    assert a.severity == "warning"
    n = gap + 1
    assert f"{n} burst{'s' if n > 1 else ''} in the last" in a.title, a.title
    assert f"{int(ends[gap]['preemptions'])} preemptions since the server started" in a.title, a.title
    assert any("between bursts" in e for e in a.evidence), a.evidence
