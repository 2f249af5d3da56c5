"""`vtop demo` tells its story (issue 26, item 4): chapters from the recording (start, burst,
runaway, end) with keys to jump to them, a pause where the runaway alert first shows, and an
end on the incident rather than on the recorded shutdown with the server DOWN."""

from __future__ import annotations

from tests.helpers.screen_text import screen_lines
from vtop.config import Config
from vtop.faces.demo import demo_path
from vtop.monitor.player import open_recording
from vtop.ui.replay import replay_app


def warnings(player) -> list[str]:  # type: ignore[no-untyped-def]
    return [a.rule for a in player.monitor.alerts if a.severity in ("warning", "critical")]


def test_chapters_come_from_the_recording() -> None:
    p = open_recording(str(demo_path()), config=Config())
    names = [n for n, _ in p.chapters]
    assert names == ["start", "burst", "runaway", "end"]
    at = dict(p.chapters)
    assert at["start"] == p.start < at["burst"] < at["runaway"] < at["end"] < p.end
    p.seek(at["burst"] + 10)  # the queue fills within the chapter's lead
    v = next(iter(p.monitor.views().values()))
    assert (v.total.waiting or 0) > 0  # type: ignore[union-attr]
    p.seek(at["end"])  # the incident is still on at its end, the server still up
    assert "runaway" in warnings(p)
    assert next(iter(p.monitor.views().values())).state == "up"


def test_demo_pauses_where_the_alert_first_shows_and_stops_on_the_incident() -> None:
    p = open_recording(str(demo_path()), config=Config(), speed=10)
    p.pause_on_alert = True
    p.stop_at = dict(p.chapters)["end"]
    first_seen = None
    while not p.paused:
        p.advance(2.0)  # a 0.2 s tick at 10x
        if first_seen is None and warnings(p):
            first_seen = p.pos
    assert warnings(p) == ["runaway"] and p.pos == first_seen  # paused on the step it showed
    assert "runaway" in p.status_text() and "space: play on" in p.status_text()
    assert dict(p.chapters)["runaway"] < p.pos  # the chapter now starts just before it
    p.toggle_pause()
    while not p.paused:
        p.advance(2.0)
    assert not p.ended and p.pos == dict(p.chapters)["end"]
    assert "runaway" in warnings(p) and next(iter(p.monitor.views().values())).state == "up"
    assert "incident's end" in p.status_text()
    p.toggle_pause()  # space plays on to the recorded shutdown
    while not p.paused:
        p.advance(2.0)
    assert p.ended


async def test_chapter_keys_jump_and_say_where() -> None:
    app = replay_app(str(demo_path()), config=Config(), name="demo", demo=True)
    async with app.run_test(size=(120, 40)) as pilot:
        player = app.replay
        assert player is not None
        at = dict(player.chapters)
        await pilot.press("3")
        await pilot.pause()
        assert player.pos == at["runaway"] and player.paused
        assert "runaway 3/4" in screen_lines(app)[0]
        await pilot.press("n")
        await pilot.pause()
        assert player.pos == at["end"] and "end 4/4" in screen_lines(app)[0]
        assert "WARNING Runaway decode" in "\n".join(screen_lines(app))  # the end is on the incident
        await pilot.press("N")  # back to the start of the chapter it is in (already there: the one before)
        await pilot.pause()
        assert player.pos == at["runaway"]
        await pilot.press("1")
        await pilot.pause()
        assert player.pos == at["start"] and "start 1/4" in screen_lines(app)[0]
        await pilot.press("question_mark")
        await pilot.pause()
        assert "Chapters (keys 1-4, n/N): 1 start (0:00)  2 burst" in "\n".join(screen_lines(app))
