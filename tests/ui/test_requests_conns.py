"""``r`` on a runaway among short requests with request logging off (vLLM's default): the request log has
nothing to show, the kernel's connections do. Replayed from the real H200 recording that holds them
(tests/corpus/traces/h200-runaway-short-traffic-2): the request in flight longest is the runaway's, from the
client address the alert names, and it goes from the table once the request ended."""

from __future__ import annotations

import json
from pathlib import Path

from textual.widgets import DataTable

from vtop.config import Config
from vtop.ui.replay import replay_app
from vtop.ui.screens import RequestsScreen

TRACE = Path(__file__).resolve().parents[1] / "corpus" / "traces" / "h200-runaway-short-traffic-2"


def _events() -> dict[str, float]:
    out: dict[str, float] = {}
    for line in (TRACE / "events.jsonl").read_text().splitlines():
        d = json.loads(line)
        out.setdefault(d["what"], float(d["t"]))
    return out


def _rows(t: DataTable) -> list[list[str]]:
    return [[str(c) for c in t.get_row_at(i)] for i in range(t.row_count)]


async def test_the_requests_view_shows_the_runaway_s_connection_without_a_request_log() -> None:
    ev = _events()
    app = replay_app(str(TRACE), config=Config(), name="trace")
    async with app.run_test(size=(120, 40)) as pilot:
        d = app.replay
        d.paused = True
        await pilot.pause()
        d.seek(ev["runaway_begin"] + 55 - d.clock.offset)
        await pilot.pause()
        alert = next(a for a in app.alerts if a.rule == "runaway")
        await pilot.press("r")
        await pilot.pause()
        scr = app.screen
        assert isinstance(scr, RequestsScreen)
        rows = _rows(scr.query_one("#req-table", DataTable))
        assert rows and rows[0][2] in alert.title, (rows, alert.title)  # the runaway's client, first (oldest)
        assert rows[0][0] == ":8000" and rows[0][3] in ("at least 55s", "at least 54s", "at least 56s"), rows[0]
        assert rows[0][6] == "its connection" and rows[0][7] == "oldest", rows[0]
        # the alert names the same request with the same lower bound
        assert rows[0][3].removeprefix("at least ") in alert.title, (rows[0], alert.title)
        # the request log is off: its table says so, the connections do not need it
        assert "--enable-log-requests" in str(scr.query_one("#req-note").render())
        await pilot.press("escape")
        d.seek(ev["runaway_end"] + 5 - d.clock.offset)
        await pilot.pause()
        await pilot.press("r")
        await pilot.pause()
        rows = _rows(app.screen.query_one("#req-table", DataTable))
        assert all(alert.title.find(r[2]) < 0 for r in rows), rows  # the runaway's answer is over
