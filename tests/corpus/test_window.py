"""`vtop doctor --window 15` started 15 s before each incident's should-alert-by time names
it, with exit status 1 or 2, and started anywhere in a normal trace exits 0 (issue 24 item 7).

Played from the corpus (:mod:`tests.corpus.window`): the log up to the start as a backlog,
then only the 15 s window of ``/metrics`` and the log. Before the log's history was read
(``vtop/core/loghistory.py``), the runaways, engine stalls and KV saturations of the corpus
all exited 0 here: 15 s of ``/metrics`` cannot show a request 45 s old, 20 s of flat counters
or 30 s of a full KV cache. The startup stalls exited 0 until the CPU of a silent phase was judged
over what doctor watched (10 s at least, not 45 s) and a backlog ending in a progress frame was
dated by the file's modification time (h200-startup-stall-graph-capture).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.corpus.score import TRACES
from tests.corpus.window import WINDOW_S, doctor_at, run_trace
from vtop.sources.recording.trace import is_trace, truth_of

ALL = sorted(p for p in TRACES.iterdir() if is_trace(p)) if TRACES.is_dir() else []
INCIDENTS = [p for p in ALL if truth_of(p)["class"] in
             ("runaway", "engine_stall", "kv_saturation", "engine_death", "startup_failure", "startup_stall")
             and truth_of(p).get("window_nameable", True)]
#: incidents a 15 s window cannot name, each with why in its truth.json ("window_why")
UNNAMEABLE = [p for p in ALL if not truth_of(p).get("window_nameable", True)]
QUIET = [p for p in ALL if truth_of(p)["class"] == "normal"]
SHUTDOWN = [p for p in ALL if truth_of(p)["class"] == "clean_shutdown"]


@pytest.mark.parametrize("trace", INCIDENTS, ids=lambda p: p.name)
def test_doctor_window_15_names_an_incident_that_began_before_it(trace: Path) -> None:
    [r] = run_trace(trace)
    assert r.named, f"{trace.name}: doctor at +{r.at_s:.0f}s named {r.rules}, expected {r.expect}"
    assert r.exit_code in (1, 2), f"{trace.name}: exit {r.exit_code} with {r.rules}"


@pytest.mark.parametrize("trace", UNNAMEABLE, ids=lambda p: p.name)
def test_an_incident_a_window_cannot_prove_is_not_misnamed(trace: Path) -> None:
    """No evidence in the window: doctor must not invent one (no other warning), and the truth says why."""
    assert len(str(truth_of(trace).get("window_why", ""))) > 40
    [r] = run_trace(trace)
    assert not [x for x in r.rules if x.split(":")[0] in ("warning", "critical") and x.split(":", 1)[1] not in r.expect]


@pytest.mark.parametrize("trace", QUIET, ids=lambda p: p.name)
def test_doctor_window_15_on_a_normal_load_exits_0(trace: Path) -> None:
    results = run_trace(trace, step_s=20.0)
    # from 60 s in, every 20 s while a whole window fits: the shortest normal trace
    # (h200-normal-burst-queue, 130 s) gives 3
    assert len(results) >= 3
    bad = [(round(r.at_s), r.exit_code, r.rules) for r in results if r.exit_code != 0]
    assert not bad, f"{trace.name}: {bad}"


@pytest.mark.parametrize("trace", SHUTDOWN, ids=lambda p: p.name)
def test_doctor_window_15_around_a_clean_shutdown(trace: Path) -> None:
    """Before the SIGTERM: exit 0. After it the port refuses: a watched server down is critical
    (exit 2) by the convention, but no alert of warning or worse is raised for it."""
    truth = truth_of(trace)
    stop = float(truth["began"])
    for back in (60.0, 45.0, 30.0, 20.0):
        code, alerts = doctor_at(trace, stop - back - WINDOW_S)
        assert code == 0, (back, [a.rule for a in alerts])
    code, alerts = doctor_at(trace, stop + 1.0)
    assert code == 2 and not [a for a in alerts if a.severity in ("warning", "critical")]


def test_doctor_window_15_names_a_startup_stall_with_the_flag_the_screen_takes() -> None:
    """startup-stall-compile: the workers froze in torch.compile, the log went silent. With
    ``--stall-threshold 60s`` (the screen names it 62 s in), doctor started 75 s in must see
    that the silence began before it: the backlog read at attach arrived all at once, and
    the silence is counted from its last line's stamp, not from when vtop read it."""
    from vtop.config import Config

    trace = TRACES / "startup-stall-compile"
    truth = truth_of(trace)
    code, alerts = doctor_at(trace, float(truth["should_alert_by"]) - WINDOW_S, config=Config(stall_threshold=60.0))
    stall = [a for a in alerts if a.rule == "startup_stall"]
    assert stall and code == 1, [(a.severity, a.rule) for a in alerts]
    assert "no new log line for 1m" in stall[0].title


STALLS = [p for p in ALL if truth_of(p)["class"] == "engine_stall"]


@pytest.mark.parametrize("trace", STALLS, ids=lambda p: p.name)
def test_doctor_reporting_before_should_alert_by_names_an_engine_stall(trace: Path) -> None:
    """The live doctor's report lands 1-3 s before should_alert_by (it starts 2 s early to allow
    for its own start-up). The zero-throughput stats line proves a stall only from the line
    before it, which still counted the sliver of tokens made before the stop, up to 10 s after
    it: at should_alert_by - 2 s that was 18.5 s (< 20 s), and all four were missed live. The
    collapsed interval dates the stop (loghistory's ``stopped_within``)."""
    sab = float(truth_of(trace)["should_alert_by"])
    code, alerts = doctor_at(trace, sab - WINDOW_S - 2.0, window_s=WINDOW_S - 1.0)  # fed up to sab - 2 s
    stall = [a for a in alerts if a.rule == "engine_stall"]
    assert stall and code == 2, [(a.severity, a.rule) for a in alerts]
    truth = truth_of(trace)
    # no log for vtop, or SGLang's (a stopped scheduler logs nothing, and its stats lines are no 10 s clock):
    # the connections date the stop
    if truth.get("log_for_vtop") is False or (truth.get("server") or {}).get("engine") == "sglang":
        assert any("dated by the connections" in e for e in stall[0].evidence), stall[0].evidence
        return
    assert "no token for about" in stall[0].title and any("stopped about" in e for e in stall[0].evidence)
