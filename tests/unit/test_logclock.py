"""The log's clock, measured (issue 38 item 6): vtop.core.logclock and the backlog's lag it gives."""

from __future__ import annotations

import time

from vtop.core.logclock import LogClock, zone_offset_near
from vtop.core.loghistory import LogHistory
from vtop.core.phases.patterns import parse_line

WALL = 1796205600.0
H = 3600.0


def _line(t: float, msg: str = "Resolved architecture: LlamaForCausalLM") -> str:
    return f"(APIServer pid=7) INFO {time.strftime('%m-%d %H:%M:%S', time.gmtime(t))} [model.py:1] {msg}"


def test_a_zone_offset_is_a_quarter_hour_near_the_bound() -> None:
    assert zone_offset_near(-8 * H - 1.5) == -8 * H  # the stamp's second and the read's delay below it
    assert zone_offset_near(5.5 * H - 0.4) == 5.5 * H  # India
    assert zone_offset_near(-40.0) == 0.0  # a backlog's last line may precede the file's last write
    assert zone_offset_near(-40.0, above=5.0) is None  # measured from lines seen arriving: a skewed clock
    assert zone_offset_near(-75 * H) is None  # not a zone: an old line


def test_lines_seen_arriving_measure_the_offset_and_follow_a_drift() -> None:
    c = LogClock(local=lambda w: 0.0)
    c.feed(WALL - 8 * H - 3, WALL - 2, 100.0)  # the backlog (read at once at attach)
    for i in range(1, 6):  # then lines as they come, stamped 8 h behind
        c.feed(WALL + i - 8 * H - 0.4, WALL + i, 100.0 + i)
    assert c.offset(WALL + 5) == -8 * H
    # a clock 40 s behind (no zone): the measured bound itself, and it follows a drift
    c = LogClock(local=lambda w: 0.0)
    c.feed(WALL - 40, WALL, 100.0)
    for i in range(1, 4):
        c.feed(WALL + i - 40, WALL + i, 100.0 + i)
    assert c.offset(WALL) == -40.0
    for i in range(700, 703):  # more than WINDOW_S later, the clock 52 s behind now
        c.feed(WALL + i - 52, WALL + i, 100.0 + i)
    assert c.offset(WALL + 703) == -52.0


def test_a_backlog_is_dated_by_the_files_modification_time() -> None:
    # a log stamped 8 h behind, written just now: the offset is -8 h, the backlog no older than it is
    h = LogHistory(local_offset=lambda w: 0.0)
    h.feed(parse_line(_line(WALL - 8 * H - 1)), WALL, 500.0)
    assert h.backlog_lag(500.0, WALL, written=WALL - 1) == 0.0
    assert h.offset(WALL) == -8 * H
    # the same without the modification time (a pipe): this box's offset is taken, the lag is 8 h
    h = LogHistory(local_offset=lambda w: 0.0)
    h.feed(parse_line(_line(WALL - 8 * H - 1)), WALL, 500.0)
    assert h.offset(WALL) == -8 * H  # a whole zone near the bound: taken for it
    # an old file: its last line and its modification time 75 h ago: the lag says how old
    h = LogHistory(local_offset=lambda w: 0.0)
    h.feed(parse_line(_line(WALL - 75 * H)), WALL, 500.0)
    lag = h.backlog_lag(500.0, WALL, written=WALL - 75 * H)
    assert h.offset(WALL) == 0.0 and abs(lag - 75 * H) < 2.0 and h.lag_from == "stamp"


def test_a_line_seen_arriving_is_news_whatever_its_stamp() -> None:
    h = LogHistory(local_offset=lambda w: 0.0)
    h.feed(parse_line(_line(WALL - 600)), WALL, 500.0)  # a backlog whose last line is 10 min old
    assert h.backlog_lag(500.0, WALL) > 590.0
    h.feed(parse_line(_line(WALL - 8 * H + 5)), WALL + 5, 505.0)  # then a line comes, stamped 8 h off
    assert h.backlog_lag(505.0, WALL + 5) == 0.0
