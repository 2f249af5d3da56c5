"""A late look sees the past (issue #45), on the recorded real incidents.

vtop started minutes into an incident (:func:`vtop.monitor.player.attached_at`: the log written
before read at once, as the tailer reads a log it attaches to; ``/metrics`` only from then on):
the server card's charts hold the minutes before from the log's stats lines, with the lines' own
values, placed where the lines were written (by the trace's log index, not by vtop's log clock:
one trace's stamps are 8 h behind), and the live samples take over without a jump in scale. A
restart inside the backlog splits the charts. ``doctor`` prints the timeline, ``--json`` carries it.

The expected values come from the trace's files read here (the stats lines of ``log.bin.gz`` and
when ``log-index.jsonl.gz`` says each was written), independent of vtop's parsing and clocks.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from vtop.config import Config
from vtop.core.spark import spark
from vtop.monitor.player import open_recording
from vtop.ui.replay import replay_app
from vtop.ui.widgets.server_panel import RESTART_MARK

TRACES = Path(__file__).parent / "traces"
SCHEMA = json.loads((Path(__file__).parents[2] / "vtop" / "schema" / "report-v2.schema.json").read_text())
STATS = re.compile(rb"Avg prompt throughput: ([\d.]+) tokens/s, Avg generation throughput: ([\d.]+) tokens/s, "
                   rb"Running: (\d+) reqs, Waiting: (\d+) reqs, .*?KV cache usage: ([\d.]+)%")


def events(trace: str) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in (TRACES / trace / "events.jsonl").read_text().splitlines() if ln.strip()]


def logged_stats(trace: str) -> list[dict[str, float]]:
    """Every stats line of the trace's log with when it was written (recorded monotonic: the first
    log-index row whose size covers the line's end)."""
    data = gzip.decompress((TRACES / trace / "log.bin.gz").read_bytes())
    index = [json.loads(ln) for ln in gzip.decompress((TRACES / trace / "log-index.jsonl.gz").read_bytes()).splitlines()]
    out = []
    for m in STATS.finditer(data):
        end = data.index(b"\n", m.end()) if b"\n" in data[m.end():] else len(data)
        row = next(r for r in index if r["size"] >= end)
        out.append({"mono": row["mono"], "prompt_tps": float(m.group(1)), "gen_tps": float(m.group(2)),
                    "running": float(m.group(3)), "waiting": float(m.group(4)), "kv_pct": float(m.group(5))})
    return out


def card_runs(app: Any) -> tuple[Any, list[list[tuple[str, str]]]]:
    card = next(iter(app.cards.values()))
    return card, card.lines(card.content_width())


def chart_cells(row: list[tuple[str, str]], width: int) -> list[tuple[str, str]]:
    """(glyph, style) of each cell of a chart row: the runs after the label, value and space."""
    cells = [(ch, st) for text, st in row[3:] for ch in text]
    return cells[:width]


#: a stats line stands for the cells up to the next (backfill.MAX_GAP_S), its stamp's second and the
#: index's one-second rows around it
PLACE_SLACK_S = 14.0


async def test_attached_three_minutes_into_a_runaway_with_its_log_8h_behind_the_charts_hold_the_past() -> None:
    trace = "runaway-with-short-traffic-clock-minus8h"
    ev = events(trace)
    load = next(e for e in ev if e["what"] == "load_begin")["mono"]
    attach = load + 180.0  # three minutes into the load (the runaway began 15 s after it)
    lines = [s for s in logged_stats(trace) if s["mono"] < attach]
    assert len(lines) >= 15, "the trace's log should hold the minutes before the attach"
    app = replay_app(str(TRACES / trace), config=Config(), attach_at=attach)
    async with app.run_test(size=(120, 40)) as pilot:
        d = app.replay
        d.paused = True
        await pilot.pause()
        d.seek(attach + 2.0)
        await pilot.pause()
        card, rows = card_runs(app)
        bf = card.backfill
        assert bf is not None, "no backfill from the log at a late attach"
        from vtop.ui.widgets.gpu_panel import spark_width

        width = spark_width(card.content_width())
        now, win = card.now, card.window_s
        cell = win / width
        first_charts: dict[str, tuple[float, list[tuple[str, str]]]] = {}
        for r, name in enumerate(("running", "waiting", "kv_pct", "gen_tps")):
            vals, marks = bf.cells(name, now, width, win)
            assert not marks
            logged = [i for i, v in enumerate(vals) if v is not None]
            # the minutes before the attach are on the chart: from the first stats line to the attach
            assert len(logged) * cell >= (attach - lines[0]["mono"]) - 3 * cell, (name, len(logged), cell)
            k = -(-now // cell)  # the grid index of the last cell (history.Series.buckets)
            start = (k - width) * cell
            for i in logged:
                a, b = start + i * cell, start + (i + 1) * cell
                near = {s[name] for s in lines if a - PLACE_SLACK_S <= s["mono"] <= b + 2.0}
                assert vals[i] in near, (name, i, vals[i], sorted(near))
            hi, _ = card._scale(name)
            cells = chart_cells(rows[r], width)
            # drawn as the log's: its own shade, the glyph of the log's value on the chart's one scale
            for i in logged:
                assert cells[i] == (spark((vals[i],), 0.0, hi), "log"), (name, i, cells[i])
            # and from the first live sample on, the live ones
            live_from = next(i for i in range(width) if start + (i + 1) * cell >= bf.until)
            assert all(st != "log" for _, st in cells[live_from:])
            first_charts[name] = (hi, cells)
        assert any(st == "log" and "from the log" in text for row in rows for text, st in row)
        # the GPU cards say NVML has no such past (a CPU trace has no GPU rows: the note waits for one)
        assert "NVML keeps no history" in app.w_gpu.late_note or not app.gpu_history.tracks
        # the timeline places the start on vtop's clock, whatever the log's stamps say (8 h behind)
        tl = app.monitor.timeline()
        assert tl is not None
        ready = next(e for e in tl.events if e.kind == "ready")
        recorded_ready = next(e for e in ev if e["what"] == "ready")["mono"]
        assert ready.at is not None and abs(ready.at - recorded_ready) < 3.0
        # the timeline key is offered (footer and help)
        assert "timeline" in {b.action for _, b, _, _ in app.screen.active_bindings.values()}

        # live samples take over, the scale does not jump: 12 s later the same scale, the log's
        # cells still drawn as they were (shifted by the cells that passed)
        d.seek(attach + 14.0)
        await pilot.pause()
        card, rows = card_runs(app)
        for r, name in enumerate(("running", "waiting", "kv_pct", "gen_tps")):
            hi0, cells0 = first_charts[name]
            hi1, _ = card._scale(name)
            assert hi1 == hi0, (name, hi0, hi1)
            cells1 = chart_cells(rows[r], width)
            shift = round((card.now - now) / cell)
            old = [c for c in cells0 if c[1] == "log"]
            new = [c for c in cells1 if c[1] == "log"]
            assert new == old[: len(new)] or new == old[-len(new):] or cells1[: width - shift] == cells0[shift:]
            assert len(new) >= len(old) - shift - 1


def test_a_restart_inside_the_backlog_splits_the_charts() -> None:
    trace = "restart-counter-reset"
    ev = events(trace)
    launches = [e["mono"] for e in ev if e["what"] == "launch"]
    ready2 = [e["mono"] for e in ev if e["what"] == "ready"][1]
    attach = ready2 + 15.0
    player = open_recording(str(TRACES / trace), config=Config(), attach_at=attach)
    player.feed_until(attach + 3.0)
    m = player.monitor
    url = next(iter(m.servers))
    bf = m.backfill(url)
    assert bf is not None and len(bf.splits) == 1
    # the split is where the server was launched again (the log's start line: a second or two after)
    assert launches[1] - 1.0 <= bf.splits[0] <= launches[1] + 5.0
    now, width, win = m.clock.monotonic(), 60, 300.0
    cell = win / width
    lines = logged_stats(trace)
    for name in ("running", "gen_tps"):
        vals, marks = bf.cells(name, now, width, win)
        assert len(marks) == 1
        (mark,) = marks
        k = -(-now // cell)
        start = (k - width) * cell
        assert start + mark * cell < bf.splits[0] <= start + (mark + 1) * cell
        before = [i for i, v in enumerate(vals) if v is not None and i < mark]
        after = [i for i, v in enumerate(vals) if v is not None and i > mark]
        assert before and after, "both runs drawn, apart"
        for i in before:  # the first run's values only left of the mark, the second's only right of it
            b = start + (i + 1) * cell
            assert b <= launches[1], (name, i)
            assert vals[i] in {s[name] for s in lines if s["mono"] < launches[1]}
        for i in after:
            a = start + i * cell
            assert a >= launches[1]
            assert vals[i] in {s[name] for s in lines if s["mono"] > launches[1]}
        # no cell carries the first run's last line over the restart
        assert all(vals[i] is None for i in range(max(before) + 1, mark))


async def test_the_card_draws_the_restart_as_a_mark_between_the_two_runs() -> None:
    trace = "restart-counter-reset"
    ready2 = [e["mono"] for e in events(trace) if e["what"] == "ready"][1]
    app = replay_app(str(TRACES / trace), config=Config(), attach_at=ready2 + 35.0)
    async with app.run_test(size=(120, 40)) as pilot:
        d = app.replay
        d.paused = True
        await pilot.pause()
        d.seek(ready2 + 37.0)
        await pilot.pause()
        card, rows = card_runs(app)
        from vtop.ui.widgets.gpu_panel import spark_width

        width = spark_width(card.content_width())
        for r in range(4):
            cells = chart_cells(rows[r], width)
            marks = [i for i, c in enumerate(cells) if c == (RESTART_MARK, "warn")]
            assert len(marks) == 1, cells
            styles = [st for _, st in cells]
            assert "log" in styles[: marks[0]] and "log" in styles[marks[0] + 1:]
        assert any("the server restarted" in text for row in rows for text, _ in row)
        # h: the log's timeline, full screen; the footer and the help list the key
        from vtop.ui.screens import HelpScreen, TimelineScreen
        from vtop.ui.widgets.keys_bar import KeysBar

        assert any(k == "h" for k, _d, _n, _e in app.query_one(KeysBar).keys())
        await pilot.press("h")
        await pilot.pause()
        assert isinstance(app.screen, TimelineScreen)
        shown = str(app.screen.query_one("#timeline-all").render())
        assert "2 starts read" in shown and "shut down (a clean shutdown)" in shown
        await pilot.press("escape")
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        assert any(k == "h" and "before vtop" in what for k, what, _on in app.screen.keys)


def test_doctor_on_a_late_attach_prints_the_timeline_and_json_carries_it() -> None:
    from vtop.faces.headless import format_text, report

    trace = "restart-counter-reset"
    ev = events(trace)
    ready2 = [e["mono"] for e in ev if e["what"] == "ready"][1]
    attach = ready2 + 15.0
    player = open_recording(str(TRACES / trace), config=Config(), attach_at=attach)
    player.feed_until(attach + 15.0)
    m = player.monitor
    m.tick()
    rep = report(m, attach, window_asked_s=15.0)
    text = format_text(rep, doctor=True)
    assert "what the log says happened" in text and "2 starts read" in text
    assert "-- vtop started reading the log --" in text and "shut down (a clean shutdown)" in text
    assert text.count("ready after") == 2
    last = [s for s in logged_stats(trace) if s["mono"] <= attach + 15.0][-1]
    assert f"running {last['running']:.0f}, waiting {last['waiting']:.0f}, KV {last['kv_pct']:.1f}%" in text
    assert f"generation {last['gen_tps']:g} tok/s" in text
    d = rep.to_json()
    jsonschema.validate(d, SCHEMA)
    tl = d["log_timeline"]
    kinds = [e["kind"] for e in tl["events"]]
    assert kinds == ["start", "ready", "stopped", "start", "ready", "attach"]
    assert tl["starts"] == 2 and tl["last_stats"]["generation_tps"] == last["gen_tps"]
    # the events are placed on vtop's clock: the second start came when the recorder launched it
    launch2 = [e["mono"] for e in ev if e["what"] == "launch"][1]
    start2 = [e for e in tl["events"] if e["kind"] == "start"][1]
    assert abs((m.clock.monotonic() - start2["ago_s"]) - launch2) < 5.0


@pytest.mark.parametrize("trace", ["normal-steady-mixed", "normal-steady-mixed-clock-minus8h"])
def test_a_log_clock_hours_off_still_places_the_backfill(trace: str) -> None:
    ev = events(trace)
    load = next(e for e in ev if e["what"] == "load_begin")["mono"]
    attach = load + 120.0
    player = open_recording(str(TRACES / trace), config=Config(), attach_at=attach)
    player.feed_until(attach + 2.0)
    m = player.monitor
    bf = m.backfill(next(iter(m.servers)))
    assert bf is not None
    lines = logged_stats(trace)
    # every line written before the attach is drawn back (the index has one row a second), at the
    # time it was written, with its values
    assert len([s for s in lines if s["mono"] < attach - 1.0]) <= len(bf.points) <= \
        len([s for s in lines if s["mono"] < attach + 1.0])
    for p in bf.points:
        s = min(lines, key=lambda s: abs(s["mono"] - p.mono))
        assert abs(p.mono - s["mono"]) <= 1.5 and p.gen_tps == s["gen_tps"] and p.running == s["running"]
