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
