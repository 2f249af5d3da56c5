"""``vtop replay FILE`` and ``vtop demo``: a recording played on the screen.

The playing itself (the recorded clock, feeding the monitor, pause, speed,
seek) is :class:`vtop.monitor.player.Player`'s; this module only gives the
screen the keys for it: space pause/play, ``.`` one step (an interval) while
paused, ``+``/``-`` speed (1x to 60x), left/right 10 s back/forward,
``[``/``]`` a minute, ``home``/``end``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.binding import Binding

if TYPE_CHECKING:
    from vtop.ui.app import VtopApp


def replay_app(path: str, *, config: Any, speed: float = 1.0, name: str | None = None) -> VtopApp:
    """The app playing ``path``; raises ``ValueError``/``OSError`` with a plain message."""
    from vtop.monitor.player import open_recording
    from vtop.ui.app import VtopApp

    player = open_recording(path, config=config, speed=speed, name=name)

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
        ]

        def action_replay_pause(self) -> None:
            player.toggle_pause()

        def action_replay_step(self) -> None:
            player.step()

        def action_replay_speed(self, up: int) -> None:
            player.faster(bool(up))

        def action_replay_seek(self, seconds: float) -> None:
            player.seek(player.pos + float(seconds))

    return ReplayApp(player.config, replay=player)
