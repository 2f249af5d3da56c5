"""``vtop replay FILE`` and ``vtop demo``: a recording played on the screen.

The playing itself (the recorded clock, feeding the monitor, pause, speed,
seek) is :class:`vtop.monitor.player.Player`'s; this module only gives the
screen the keys for it: space pause/play, ``.`` one step (an interval) while
paused, ``+``/``-`` speed (1x to 60x), left/right 10 s back/forward,
``[``/``]`` a minute, ``home``/``end``; ``1``-``9`` a chapter (start, burst,
runaway, end: :func:`vtop.monitor.player.find_chapters`), ``n``/``N`` the next
or previous one. ``vtop demo`` also pauses where a warning first shows and stops
at the end of its incident, before the recorded shutdown.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.binding import Binding

if TYPE_CHECKING:
    from vtop.ui.app import VtopApp


def replay_app(path: str, *, config: Any, speed: float = 1.0, name: str | None = None,
               demo: bool = False, attach_at: float | None = None, with_log: bool | None = None) -> VtopApp:
    """The app playing ``path``; raises ``ValueError``/``OSError`` with a plain message.
    ``demo``: pause where a warning or critical alert first shows, and stop at the end
    of the incident (the ``end`` chapter) rather than on the recorded shutdown. ``attach_at``
    (recorded monotonic seconds): as vtop started then would have seen it (the log before it read
    at once, a late look). ``with_log=False``: a trace played without its log (what a vtop that cannot read it sees)."""
    from vtop.monitor.player import _mmss, open_recording
    from vtop.ui.app import VtopApp

    player = open_recording(path, config=config, speed=speed, name=name, attach_at=attach_at, with_log=with_log)
    if demo:
        player.pause_on_alert = True
        player.stop_at = next((at for n, at in player.chapters if n == "end"), None)

    class ReplayApp(VtopApp):
        BINDINGS = [
            Binding("space", "replay_pause", "Pause", priority=True),
            Binding("full_stop", "replay_step", "Step"),
            Binding("plus,equals_sign", "replay_speed(1)", "Faster", key_display="+"),
            Binding("minus", "replay_speed(0)", "Slower", key_display="-"),
            Binding("left", "replay_seek(-10)", "-10s", key_display="←", priority=True),
            Binding("right", "replay_seek(10)", "+10s", key_display="→", priority=True),
            Binding("left_square_bracket", "replay_seek(-60)", "-1m", show=False),
            Binding("right_square_bracket", "replay_seek(60)", "+1m", show=False),
            Binding("home", "replay_seek(-1e9)", "Start", show=False, priority=True),
            Binding("end", "replay_seek(1e9)", "End", show=False, priority=True),
            Binding("n", "replay_chapter(1)", "Next chapter", key_display="n"),
            Binding("N", "replay_chapter(-1)", "Prev chapter", show=False, key_display="N"),
        ]
        BINDINGS += [Binding(str(i), f"replay_goto({i - 1})", f"Chapter {i}", show=False)
                     for i in range(1, min(9, len(player.chapters)) + 1)]

        def action_replay_pause(self) -> None:
            player.toggle_pause()

        def action_replay_step(self) -> None:
            player.step()

        def action_replay_speed(self, up: int) -> None:
            player.faster(bool(up))

        def action_replay_seek(self, seconds: float) -> None:
            player.seek(player.pos + float(seconds))

        def action_replay_chapter(self, step: int) -> None:
            player.next_chapter(int(step))

        def action_replay_goto(self, index: int) -> None:
            player.goto_chapter(int(index))

        def help_notes(self) -> list[str]:
            chapters = "  ".join(f"{i + 1} {name} ({_mmss(at - player.start)})"
                                 for i, (name, at) in enumerate(player.chapters))
            return super().help_notes() + ([f"Chapters (keys 1-{len(player.chapters)}, n/N): {chapters}"]
                                           if player.chapters else [])

    return ReplayApp(player.config, replay=player)
