"""A start that vtop cannot see the process of (a server in a container, another user's):
the log says it is starting, so its card says STARTING, never DOWN. Played on the real H200
recording of a cold start (vLLM 0.26.0), with the process table taken out of it."""

from __future__ import annotations

from vtop.config import Config
from vtop.faces.demo import demo_path
from vtop.monitor.player import Player
from vtop.sources.recording.record import load


def test_a_start_without_a_visible_process_is_starting_from_the_log() -> None:
    header, events = load(demo_path())
    events = [e for e in events if e.kind != "procs"]  # vtop sees no vLLM process
    player = Player(events, header, config=Config())
    m = player.monitor
    seen: list[tuple[str, str, str]] = []  # (the log's state, the card's state, its message) at each poll

    def on_view(ws, view) -> None:  # type: ignore[no-untyped-def]
        lv = m.log_view
        if lv is not None:
            seen.append((lv.snapshot.state, view.state, view.message))

    m.on_server_view.append(on_view)
    player.play_to_end()
    during = [(card, msg) for log_state, card, msg in seen if log_state == "starting"]
    assert len(during) >= 20, seen[:5]  # the start took ~90 s, a poll every 2 s
    assert {card for card, _ in during} == {"starting"}, [c for c, _ in during]
    assert all("its log shows the start in" in msg for _, msg in during), during[0]
    assert any("loading weights" in msg for _, msg in during)
    # once ready, the card is up; after the recorded shutdown, down
    assert any(log_state == "ready" and card == "up" for log_state, card, _ in seen)
