"""The log's clock is measured, not trusted (issue 38 item 6, issue 46 item 4).

The corpus's derived traces (``tools/corpus/derive.py``, INDEX.md says from which real recording):
the same recording with the vLLM log's stamps 8 h ahead or behind vtop's clock (a container in UTC
beside a host in UTC+8), and an old log of a start that never finished given with ``--log`` beside a
running server. Each must be named when its real recording is, with no false alarm, and the start's
phases must last what they lasted in the real recording. On main before this change the -8 h ones
raised "Startup stalled in process start: no new log line for 8h 00m" (named at once, before the
stall began, on the stall traces), "process start" lasted 8 h (+8 h) and "ready in" was -8 h.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.corpus.score import TRACES, score_trace
from vtop.sources.recording.trace import truth_of

DERIVED = sorted(p for p in TRACES.iterdir() if (p / "truth.json").is_file() and "derived_from" in truth_of(p))
SHIFTED = [p for p in DERIVED if isinstance(truth_of(p)["derived_from"], str)]


def _phases(path: Path) -> tuple[str, list[tuple[str, float | None]], float | None]:
    from vtop.config import Config
    from vtop.monitor.player import open_recording

    m = open_recording(str(path), config=Config()).play_to_end()
    assert m.log_view is not None
    s = m.log_view.snapshot
    ready = None if s.ready_at is None or s.started is None else round(s.ready_at - s.started, 1)
    return s.state, [(v.phase.value, None if v.end is None else round(v.end - v.start, 1)) for v in s.phases], ready


def test_the_derived_traces_are_there() -> None:
    assert len(SHIFTED) >= 6 and any("plus8h" in p.name for p in SHIFTED) and any("minus8h" in p.name for p in SHIFTED)
    assert len(DERIVED) > len(SHIFTED)  # the old log


@pytest.mark.parametrize("trace", SHIFTED, ids=[p.name for p in SHIFTED])
def test_a_shifted_log_clock_changes_nothing_vtop_says(trace: Path) -> None:
    real = TRACES / truth_of(trace)["derived_from"]
    got, want = score_trace(trace), score_trace(real)
    assert got.false_alarms == [] and got.ok, got
    assert got.alert_after_s == want.alert_after_s and got.first_title == want.first_title
    assert got.phase == want.phase
    assert _phases(trace) == _phases(real)


def test_an_old_log_is_said_to_be_old_not_a_stall() -> None:
    from vtop.config import Config
    from vtop.monitor.player import open_recording

    [old] = [p for p in DERIVED if p not in SHIFTED]
    s = score_trace(old)
    assert s.false_alarms == [] and not s.named
    m = open_recording(str(old), config=Config()).play_to_end()
    lv = m.log_view
    assert lv is not None and lv.snapshot.state == "starting"  # a start that never finished, 75 h ago
    assert lv.stall is None and lv.quiet is None
    assert lv.problem is not None and "the log's last line is 75 h old" in lv.problem
    assert not any(a.rule == "startup_stall" for c in m.alert_log for a in c.alerts)
