"""The logic of a late look (issue #45): the charts drawn back from the log's stats lines
(vtop.core.backfill) and the log's timeline (vtop.core.timeline), on made-up points and starts.
The corpus and the real server prove them whole (tests/corpus/test_late_look.py,
tests/real/test_real_late_look.py)."""

from __future__ import annotations

import calendar

from vtop.core.backfill import Backfill, backfill_from
from vtop.core.loghistory import LogHistoryView, StatsPoint
from vtop.core.phases.tracker import PhaseTracker
from vtop.core.timeline import build_timeline


def pt(mono: float, running: int, gen: float = 100.0, kv: float | None = 5.0) -> StatsPoint:
    return StatsPoint(mono, 10.0, gen, running, 0, kv, None)


def test_log_cells_end_where_the_live_samples_begin_and_carry_a_line_one_interval() -> None:
    bf = Backfill(until=1000.0, points=(pt(950.0, 3), pt(960.0, 4), pt(970.0, 5)))
    # 60 cells of 5 s, ending at 1010: cell i covers (710 + 5i, 715 + 5i]
    vals, marks = bf.cells("running", 1010.0, 60, 300.0)
    assert not marks
    got = {i: v for i, v in enumerate(vals) if v is not None}
    # a cell holds the line in it, or the line before it for up to one interval (+2 s slack)
    assert got[47] == 3.0 and got[49] == 4.0 and got[51] == 5.0
    assert max(got) <= 56 and 710 + 5 * (max(got) + 1) <= 1000.0  # never past the first live sample
    assert min(got) == 47  # nothing before the first line
    assert bf.peak("running", 0.0) == 5.0 and bf.peak("running", 965.0) == 5.0 and bf.peak("running", 975.0) is None


def test_a_restart_is_a_mark_and_no_cell_mixes_two_runs() -> None:
    first = tuple(pt(800.0 + 10 * i, 4, gen=500.0) for i in range(6))   # 800..850
    second = tuple(pt(880.0 + 10 * i, 1, gen=50.0) for i in range(5))   # 880..920
    bf = Backfill(until=930.0, points=first + second, splits=(855.0,))
    assert [len(r) for r in bf.runs()] == [6, 5]
    vals, marks = bf.cells("gen_tps", 940.0, 60, 300.0)
    (mark,) = marks
    cell_end = 640.0 + 5 * (mark + 1)
    assert cell_end - 5 < 855.0 <= cell_end and vals[mark] is None
    assert {v for v in vals[:mark] if v is not None} == {500.0}
    assert {v for v in vals[mark + 1:] if v is not None} == {50.0}
    # the first run's last line (850) is not carried over the restart into 855..880
    assert all(v is None for v in vals[mark + 1: mark + 5])


def test_backfill_from_keeps_the_lines_before_the_first_poll_and_the_restarts_among_them() -> None:
    h = LogHistoryView(mono=1000.0, stats=(pt(900.0, 1), pt(950.0, 2), pt(990.0, 3), pt(1000.0, 3)),
                       offset_s=-8 * 3600.0, wall=1_800_000_000.0)
    # a start on the log's clock (8 h behind): 920 on the monotonic clock
    start = 1_800_000_000.0 - 8 * 3600.0 - 80.0
    bf = backfill_from(h, 995.0, [start])
    assert bf is not None and [p.mono for p in bf.points] == [900.0, 950.0, 990.0]
    assert bf.splits == (920.0,)
    assert backfill_from(h, 850.0, []) is None  # no line before the first poll
    assert backfill_from(h, None, []) is None


def test_the_tracker_keeps_the_earlier_starts_and_counts_problems_by_kind() -> None:
    tr = PhaseTracker(year=2026)
    lines = [
        "INFO 12-02 01:00:00 [api_server.py:1] vLLM API server version 0.32.0",
        "WARNING 12-02 01:00:01 [x.py:1] Triton is not installed; using 3 threads",
        "WARNING 12-02 01:00:02 [x.py:1] Triton is not installed; using 5 threads",
        "INFO 12-02 01:00:20 [api_server.py:1] Starting vLLM API server 0 on http://127.0.0.1:8000",
        "INFO 12-02 01:00:21 [launcher.py:1] Application startup complete.",
        "ERROR 12-02 01:02:00 [core_client.py:1] Engine core proc EngineCore_DP0 died unexpectedly, shutting down.",
        "INFO 12-02 01:03:00 [api_server.py:1] vLLM API server version 0.32.0",
    ]
    for i, ln in enumerate(lines):
        tr.feed(ln, float(i))
    past = tr.past_starts
    assert len(past) == 1 and past[0].ready_at is not None
    kinds = tr.problem_kinds
    assert kinds[0][0] == "ERROR" and kinds[0][1] == 1
    assert ("WARNING", 2) in [(k[0], k[1]) for k in kinds]  # "3 threads" and "5 threads": one kind
    # the log's clock is this box's (offset 0); vtop read it 200 s after its first line, at monotonic 10
    first = float(calendar.timegm((2026, 12, 2, 1, 0, 0, 0, 0, 0)))
    h = LogHistoryView(mono=12.0, offset_s=0.0, wall=first + 202.0)
    tl = build_timeline(tr.snapshot(), past, h, kinds, warnings=tr.warning_count, errors=tr.error_count,
                        attached=10.0, now=12.0)
    assert tl.starts == 2
    assert [e.kind for e in tl.events] == ["start", "ready", "died", "start", "attach"]
    assert [tl.ago(e.at) for e in tl.events] == ["3m 22s ago", "3m 01s ago", "1m 22s ago", "22s ago", "2s ago"]
    assert tl.events[0].stamp == "12-02 01:00:00"
    text = "\n".join(tl.lines())
    assert "2 starts read" in text and "warnings 2, errors 1" in text and "1x error Engine core proc EngineCore_DP0 died" in text
    assert "engine died 1m 39s after ready: engine_died: Engine core proc" in text
    assert tl.to_json()["problem_kinds"][0]["level"] == "ERROR"


def test_once_the_first_live_sample_leaves_the_window_no_cell_is_the_logs() -> None:
    bf = Backfill(until=1000.0, points=(pt(950.0, 3), pt(990.0, 4)), splits=(960.0,))
    vals, marks = bf.cells("running", 1100.0, 60, 300.0)
    assert any(v is not None for v in vals) and marks
    vals, marks = bf.cells("running", 1290.0, 60, 300.0)
    assert vals[:2] == (4.0, 4.0) and not marks
    vals, marks = bf.cells("running", 1300.0, 60, 300.0)
    assert vals == (None,) * 60 and not marks
