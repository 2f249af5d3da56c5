"""Invariants over the whole corpus, checked at every second of every trace (issue 38 item 1).

Each trace is played through the monitor a second at a time, as the screen plays it, and at every
second:

* **a DOWN or dead server shows no live gauge**, on every face: the ``--once --json``/``doctor``
  report gives it no running, waiting or KV (its ``last_seen`` holds them, with their age); its server
  card draws them greyed with a "last seen N s ago" line; the requests line claims nothing in flight;
  the startup panel of a start that was ready before its engine died still says "ready in", never
  "FAILED" or a "✗ ready";
* **start durations are unchanged by seeks**: a second player jumping forward 30 s at a time, and one
  seeking back from the end, show the same phases with the same durations as the one that stepped.

On main before this change (ddf724c, its 47 traces): the DOWN invariant failed on 8 of 47, every trace
whose server goes down or whose engine dies (the card drew the last gauges as live on all 8; the report
gave an engine-dead server's gauges as current; "requests in flight: 216" after the death; the start
redrawn "FAILED"), the seek invariant on 44 of 47 (a seek back lost the launch: "process start 14 s"
instead of 47 s, or "idle" for a start in progress).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.corpus.score import traces

TRACES = traces()
NOT_LIVE = ("down", "engine dead")
GAUGES = ("running", "waiting", "KV cache")


def _phases(m: Any) -> Any:
    lv = m.log_view
    if lv is None:
        return None
    s = lv.snapshot
    return (s.state, tuple((v.phase.value, None if v.end is None else round(v.end - v.start, 1)) for v in s.phases),
            None if s.total_s is None else round(s.total_s, 1))


def _card_lines(m: Any, ws: Any) -> list[list[tuple[str, str]]]:
    from vtop.ui.widgets.server_panel import ServerCard

    card = ServerCard(ws.url, window_s=m.config.history, max_gap=2.5)
    if hasattr(m, "last_seen"):
        card.seen = m.last_seen(ws.last_view)
    card.view, card.now = ws.last_view, m.clock.monotonic()
    return card.all_lines(100)


def down_problems(m: Any, started: float) -> list[str]:
    """What shows a server that is down or whose engine died as live, on each face."""
    from vtop.faces.headless import report
    from vtop.ui.widgets.alerts_panel import RequestsLine
    from vtop.ui.widgets.startup_panel import StartupPanel

    out: list[str] = []
    down = [ws for ws in m.servers.values() if ws.last_view is not None and ws.last_view.state in NOT_LIVE
            and ws.last_view.metrics is not None]
    if not down:
        return out
    rep = report(m, started).to_json()
    for ws in down:
        v = ws.last_view
        row = next(s for s in rep["servers"] if s["url"] == ws.url)
        live = [k for k in ("running", "waiting", "kv_cache_pct") if row.get(k) is not None]
        if live:
            out.append(f"report: {v.state} server with live {live}")
        if not row.get("last_seen"):
            out.append(f"report: {v.state} server without its last seen gauges")
        lines = _card_lines(m, ws)
        for runs in lines:
            label = runs[0][0].strip() if runs else ""
            if label in GAUGES and runs[1][1] != "dim":
                out.append(f"card: {v.state} server's {label} drawn live ({runs[1][0].strip()})")
        if not any("last seen" in r[0] for runs in lines for r in runs):
            out.append(f"card: {v.state} server without 'last seen'")
        if ws.url == m.log_target and m.log_view is not None:
            down_arg = m.log_target_down() if hasattr(m, "log_target_down") else None
            text = RequestsLine.line(m.log_view, down_arg) if down_arg is not None else RequestsLine.line(m.log_view)
            if re.match(r"requests in flight: \d+", text):
                out.append(f"requests line: {text[:60]}")
            snap = m.log_view.snapshot
            if snap.ready_at is not None and snap.state == "failed":
                panel = StartupPanel(gpu_activity=lambda t: (None, None))
                panel.view = m.log_view
                plain = panel.build().plain
                if "FAILED" in plain or "ready in" not in plain:
                    out.append("startup panel: a start that was ready redrawn as FAILED")
    return out


def play(path: Path) -> tuple[list[str], list[str]]:
    """(DOWN problems, seek problems) of one trace, the first few of each."""
    from vtop.config import Config
    from vtop.monitor.player import open_recording

    step = open_recording(str(path), config=Config())
    jump = open_recording(str(path), config=Config())
    started = step.pos
    downs: list[str] = []
    seeks: list[str] = []
    points: list[tuple[float, Any]] = []
    while not step.ended:
        step.advance(1.0)
        here = _phases(step.monitor)
        points.append((step.pos, here))
        for p in down_problems(step.monitor, started):
            downs.append(f"+{step.pos - started:.0f}s {p}")
        if len(points) % 30 == 0:
            jump.seek(step.pos)
            got = _phases(jump.monitor)
            if got != here:
                seeks.append(f"+{step.pos - started:.0f}s forward: {got} != {here}")
    back = open_recording(str(path), config=Config())
    back.play_to_end()
    for pos, want in points[::45]:
        back.seek(pos)
        got = _phases(back.monitor)
        if got != want:
            seeks.append(f"+{pos - started:.0f}s back: {got} != {want}")
    return downs[:5], seeks[:5]


@pytest.mark.parametrize("trace", TRACES, ids=[p.name for p in TRACES])
def test_a_down_server_shows_no_live_gauge_and_seeks_keep_durations(trace: Path) -> None:
    downs, seeks = play(trace)
    assert downs == [], downs
    assert seeks == [], seeks


def main() -> int:
    """Counts per invariant (run against any checkout: ``PYTHONPATH=CHECKOUT python -m tests.corpus.test_invariants``)."""
    bad_down, bad_seek = [], []
    for p in TRACES:
        d, s = play(p)
        if d:
            bad_down.append(p.name)
            print(p.name, "DOWN:", d[0])
        if s:
            bad_seek.append(p.name)
            print(p.name, "SEEK:", s[0])
    print(f"DOWN invariant fails on {len(bad_down)} of {len(TRACES)} traces; seek invariant on {len(bad_seek)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
