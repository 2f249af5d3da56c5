"""tests/corpus/live_doctor.py without playing anything: the plan over the corpus, the busiest
window, and how a doctor report is judged. (The live run itself is real time: the real tier
has one smoke test, tests/real/test_real_live_doctor.py.)"""

from __future__ import annotations

from pathlib import Path

from tests.corpus.live_doctor import (
    LEAD_S,
    SHUTDOWN_MARGIN_S,
    WINDOW_S,
    Run,
    busiest_start,
    judge,
    plan,
    table,
    totals,
    trace_paths,
)
from tests.corpus.serve_trace import TraceTimeline
from tests.helpers.trace_files import write_trace


def test_the_plan_covers_every_trace_of_the_corpus() -> None:
    paths = trace_paths([])
    jobs = plan(paths)
    by_trace: dict[str, list[str]] = {}
    for j in jobs:
        by_trace.setdefault(j.trace, []).append(j.point)
    for p in paths:
        tl = TraceTimeline(p)
        mine = [j for j in jobs if j.trace == tl.name]
        assert all(0 <= j.start <= tl.end - WINDOW_S for j in mine), [(j.point, j.start, tl.end) for j in mine]
        if tl.truth.get("expect_rules"):
            sab, began = tl.should_alert_by, tl.began
            assert sab is not None and began is not None
            if sab - began >= LEAD_S + 1:
                # and a doctor started N s after the incident began, for each N the truth asks
                after = [f"after+{float(s):g}" for s in tl.truth.get("doctor_after_s") or ()]
                assert [j.point for j in mine] == ["alert", *after]
                assert all(j.start == round(began + float(p.split("+")[1]), 1) for j, p in zip(mine[1:], after))
                assert mine[0].start == round(max(0.0, sab - WINDOW_S - LEAD_S), 1)
            else:  # a startup failure: the window holds its first error line
                assert [j.point for j in mine] == ["first-line"]
                assert mine[0].start == round(max(0.0, began - 1), 1)
            if tl.truth.get("window_nameable") is False:
                # excluded with its reason shown (truth.json's window_why), judged on no false alarm
                assert mine[0].expect == "unnameable" and len(mine[0].why or "") > 40
            else:
                assert mine[0].expect == "named"
        else:
            assert len(mine) >= 2, (tl.name, by_trace.get(tl.name))
            assert all(j.expect in ("quiet", "no-incident") for j in mine)
            if tl.truth.get("class") == "clean_shutdown":
                assert "after-shutdown" in by_trace[tl.name] and "shutdown" in by_trace[tl.name]
                # a quiet point ends before the SIGTERM, with the doctor's own start-up to spare
                # (clean-sigterm-idle's "middle" point had overlapped it: exit 2, the port down)
                assert tl.began is not None
                for j in mine:
                    if j.expect == "quiet":
                        assert j.start + WINDOW_S + SHUTDOWN_MARGIN_S <= tl.began + 0.05, (tl.name, j)


def _prom(running: float, waiting: float) -> str:
    return (f'vllm:num_requests_running{{engine="0",model_name="m"}} {running}\n'
            f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}\n'
            f'vllm:num_requests_waiting_by_reason{{engine="0",reason="capacity"}} 99.0\n')


def test_busiest_window_is_the_one_with_most_running_and_waiting(tmp_path: Path) -> None:
    loads = [0, 1, 1, 0, 4, 5, 6, 0, 0, 1] + [0] * 10
    rows = [(float(i), 200, None, _prom(v, 1 if v >= 5 else 0)) for i, v in enumerate(loads)]
    tl = TraceTimeline(write_trace(tmp_path / "t", rows, [(0.0, 0)], b""))
    tl.end = 20.0
    assert busiest_start(tl, 3.0) == 4.0
    idle = TraceTimeline(write_trace(tmp_path / "idle", [(float(i), 200, None, _prom(0, 0)) for i in range(20)],
                                      [(0.0, 0)], b""))
    assert busiest_start(idle, 3.0) is None


def _run(expect: str, exit_code: int, rules: list[str] | None = None) -> Run:
    r = Run("t", "runaway" if expect == "named" else "normal", "alert", 10.0, 27.0,
            rules if rules is not None else (["runaway"] if expect == "named" else []), expect)
    r.exit_code = exit_code
    return r


def _rep(*alerts: tuple[str, str]) -> dict[str, object]:
    return {"alerts": [{"rule": r, "severity": s, "title": f"{r} title"} for r, s in alerts],
            "servers": [{"state": "up", "model": "m", "running": 1, "waiting": 0, "kv_cache_pct": 3.0}]}


def test_an_incident_passes_only_when_named_at_warning_or_worse_with_a_nonzero_exit() -> None:
    ok = judge(_run("named", 1), _rep(("runaway", "warning")))
    assert ok.ok and ok.named and (ok.rule, ok.severity) == ("runaway", "warning") and ok.server["running"] == 1
    assert not judge(_run("named", 0), _rep(("runaway", "critical"))).ok  # exit 0
    info = judge(_run("named", 1), _rep(("runaway", "info")))
    assert info.named and not info.ok
    other = judge(_run("named", 1), _rep(("engine_stall", "critical")))
    assert not other.named and not other.ok and other.others_bad == ["engine_stall:critical"]
    both = judge(_run("named", 2), _rep(("runaway", "info"), ("runaway", "critical")))
    assert both.severity == "critical" and both.ok


def test_a_quiet_point_passes_with_exit_0_and_no_warning() -> None:
    assert judge(_run("quiet", 0), _rep(("risky_flags", "info"))).ok
    assert not judge(_run("quiet", 0), _rep(("kv_saturation", "warning"))).ok
    assert not judge(_run("quiet", 1), _rep()).ok
    assert judge(_run("no-incident", 1), _rep()).ok  # down after a clean shutdown
    assert not judge(_run("no-incident", 1), _rep(("engine_died", "critical"))).ok


def test_the_table_and_totals_count_what_was_judged() -> None:
    runs = [judge(_run("named", 1), _rep(("runaway", "critical"))), judge(_run("named", 0), _rep()),
            judge(_run("quiet", 0), _rep()), judge(_run("quiet", 0), _rep(("kv_saturation", "warning")))]
    t = totals(runs)
    assert (t["incidents"], t["incidents_named"], t["incidents_ok"], t["quiet_runs"], t["quiet_ok"],
            t["false_alarms"]) == (2, 1, 1, 2, 1, 1)
    text = table(runs, 15)
    assert "runaway:critical" in text and "kv_saturation:warning" in text
    assert text.splitlines()[-1].startswith("doctor --window 15 live: incidents named 1/2")


def test_an_incident_no_window_can_prove_is_shown_with_why_and_kept_out_of_the_count() -> None:
    why = "request logging off and short requests every 2-5 s: nothing in 15 s proves an old request"
    quiet = _run("unnameable", 0)
    quiet.why = why
    bad = _run("unnameable", 1)
    bad.why = why
    runs = [judge(quiet, _rep()), judge(bad, _rep(("kv_saturation", "warning"))),
            judge(_run("named", 1), _rep(("runaway", "critical")))]
    assert runs[0].ok and not runs[1].ok  # it passes only when doctor invents nothing else
    t = totals(runs)
    assert (t["incidents"], t["incidents_ok"], t["not_nameable"], t["not_nameable_false_alarms"]) == (1, 1, 2, 1)
    text = table(runs, 15)
    assert f"not nameable from a 15 s window ({why})" in text
    assert "incidents named 1/1" in text.splitlines()[-1]


def test_a_report_after_should_alert_by_is_late() -> None:
    """rep@ was shown but not judged: a doctor exiting after should_alert_by passed."""
    on_time = _run("named", 1)
    on_time.ended_at = 27.5  # should_alert_by 27 (+1 s for the exit after the report)
    late = _run("named", 1)
    late.ended_at = 29.0
    runs = [judge(on_time, _rep(("runaway", "warning"))), judge(late, _rep(("runaway", "warning")))]
    assert runs[0].ok and runs[0].in_time is True
    assert not runs[1].ok and runs[1].in_time is False and runs[1].named
    assert totals(runs)["incidents_late"] == 1 and " late " in table(runs, 15)
