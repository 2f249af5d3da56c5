"""``vtop replay FILE`` and ``vtop demo``: a recording played through the live UI.

The recording holds what the sources returned (GPU polls, server polls with
parsed metrics, the process table, log lines), not what the screen showed.
The driver hands those to the very code paths the live sources use (the GPU
history, the server trackers, the log watch and phase tracker, the request
tracker, the diagnosis), on a clock that reads the *recorded* time. So a
replay shows the numbers the live screen showed at the same timestamps, and a
newer vtop replaying an old file shows what the newer rules make of it.

Controls: space pause/play, ``.`` one step (an interval) while paused,
``+``/``-`` speed (1x to 60x), left/right 10 s back/forward, ``[``/``]`` a
minute, ``home``/``end``. Seeking back rebuilds every tracker from the start
of the file without painting (an hour of 8 GPUs and 2 servers takes well
under a second), because rates and histories depend on what came before.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vtop.sources.logtail import TailState
from vtop.sources.record import RecordEvent

if TYPE_CHECKING:
    from vtop.ui.app import VtopApp

SPEEDS = (1, 2, 5, 10, 30, 60)
TICK_S = 0.2


class ReplayClock:
    """The recorded clocks at the replay's position."""

    def __init__(self, mono: float, offset: float) -> None:
        self.mono = mono
        self.offset = offset

    def monotonic(self) -> float:
        return self.mono

    def time(self) -> float:
        return self.mono + self.offset


@dataclass
class FedLog:
    """A log source the driver pushes recorded lines into."""

    name: str
    pending: list[str] = field(default_factory=list)
    _state: TailState | None = None

    def poll(self) -> list[str]:
        out, self.pending = self.pending, []
        return out

    @property
    def state(self) -> TailState:
        return self._state or TailState("following", self.name, "replaying the recorded log")

    def close(self) -> None:
        pass


class ReplayDriver:
    def __init__(self, events: list[RecordEvent], header: dict[str, Any], *, name: str = "recording",
                 speed: float = 1.0) -> None:
        if not events:
            raise ValueError("the recording holds no samples")
        self.events = events
        self.header = header
        self.name = name
        self.start = events[0].at
        self.end = events[-1].at
        first_timed = next((e for e in events if e.kind in ("gpu", "server", "log", "procs")), events[0])
        self.clock = ReplayClock(self.start, first_timed.t - first_timed.mono)
        self.speed = speed
        #: the app's Textual timer; stopped while paused, so a paused or finished
        #: replay wakes nothing (no redraw for nothing)
        self.timer: Any = None
        self._paused = False
        self.ended = False
        self._i = 0
        self.app: VtopApp | None = None
        self.urls = tuple(dict.fromkeys(e.data.url for e in events if e.kind == "server"))
        self.has_gpu = any(e.kind == "gpu" for e in events)
        self.has_log = any(e.kind == "log" for e in events)
        self.interval = float(header.get("interval") or 1.0)
        self._last_wall: float | None = None

    @property
    def paused(self) -> bool:
        return self._paused

    @paused.setter
    def paused(self, value: bool) -> None:
        self._paused = value
        self._last_wall = None
        if self.timer is not None:
            self.timer.pause() if value else self.timer.resume()

    # ------------------------------------------------------------ position
    @property
    def pos(self) -> float:
        return self.clock.mono

    @property
    def elapsed(self) -> float:
        return self.pos - self.start

    @property
    def duration(self) -> float:
        return self.end - self.start

    def attach(self, app: VtopApp) -> None:
        self.app = app

    # ------------------------------------------------------------- feeding
    def _feed_until(self, target: float) -> int:
        app = self.app
        assert app is not None
        n = 0
        ev = self.events
        log_fed = False
        while self._i < len(ev) and ev[self._i].at <= target:
            e = ev[self._i]
            self._i += 1
            n += 1
            # the clock follows the event, so trackers see the recorded "now"
            self.clock.mono = max(self.clock.mono, e.at)
            if e.t and e.kind in ("gpu", "server", "log", "procs"):
                self.clock.offset = e.t - e.mono
            if e.kind == "gpu":
                app.proc_names = e.extra or {}
                app.gpu_history.add(e.data)
                app._dirty.add("gpu")
                if not self.urls:
                    app.diagnose(show=False)
            elif e.kind == "server":
                entry = app.servers.entries.get(e.data.url) or app.servers.add(e.data.url, from_cli=True, autopoll=False)
                app.servers.apply_poll(entry, e.data)
                if e.data.url == self.urls[-1]:
                    # once per round of polls: the rules keep state from one poll to the next
                    app.diagnose(show=False)
            elif e.kind == "procs":
                app.servers.apply_discovery(list(e.data), autopoll=False)
            elif e.kind == "log" and app.log_watch is not None:
                app.log_watch.source.pending.extend(e.data)  # type: ignore[attr-defined]
                log_fed = True
                self._poll_log()
            elif e.kind == "logmark" and app.log_watch is not None:
                d = e.data
                if d.get("what") == "ready":
                    app.log_watch.mark_ready(float(d.get("mono", e.mono)), str(d.get("source", "health")))
                elif d.get("what") == "launch" and d.get("epoch") is not None:
                    app.log_watch.mark_process_start(float(d["epoch"]), float(d.get("mono", e.mono)))
                self._poll_log()
        self.clock.mono = max(self.clock.mono, min(target, self.end))
        if not log_fed and app.log_watch is not None and n:
            self._poll_log()
        return n

    def _poll_log(self) -> None:
        app = self.app
        assert app is not None and app.log_watch is not None
        view = app.log_watch.poll()
        app._on_log_result(view, None)

    def _reset(self) -> None:
        """Back to the start of the recording: every tracker empty."""
        app = self.app
        assert app is not None
        self._i = 0
        self.ended = False
        self.clock.mono = self.start
        if app.log_watch is not None:
            app.log_watch.source.pending.clear()  # type: ignore[attr-defined]
        app.reset_state()

    # ------------------------------------------------------------ controls
    def advance(self, seconds: float) -> None:
        """Play ``seconds`` of recorded time (forward only) and paint once."""
        target = min(self.end, self.pos + max(0.0, seconds))
        self._feed_until(target)
        if self._i >= len(self.events) and self.pos >= self.end:
            self.ended = True
            self.paused = True
        self._paint()

    def seek(self, target: float) -> None:
        """Go to ``target`` (recorded monotonic seconds), back or forward."""
        target = min(self.end, max(self.start, target))
        if target < self.pos:
            self._reset()
        self._feed_until(target)
        self.ended = self._i >= len(self.events)
        if self.ended:
            self.paused = True
        self._paint()

    def step(self) -> None:
        self.paused = True
        self.advance(self.interval)

    def toggle_pause(self) -> None:
        if self.ended:
            self.seek(self.start)
            self.paused = False
            return
        self.paused = not self.paused
        self._paint()

    def faster(self, up: bool) -> None:
        i = min(range(len(SPEEDS)), key=lambda k: abs(SPEEDS[k] - self.speed))
        i = min(len(SPEEDS) - 1, i + 1) if up else max(0, i - 1)
        self.speed = float(SPEEDS[i])
        self._paint()

    def on_timer(self) -> None:
        """Called every TICK_S of real time."""
        now = time.monotonic()
        last, self._last_wall = self._last_wall, now
        if self.paused or self.ended:
            return
        dt = TICK_S if last is None else min(1.0, now - last)
        self.advance(dt * self.speed)

    def _paint(self) -> None:
        app = self.app
        if app is None:
            return
        app.servers.tick()
        app.paint()

    def status_text(self) -> str:
        t = self.clock.time()
        try:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
        except (OverflowError, ValueError, OSError):
            stamp = "?"
        state = "END" if self.ended else ("PAUSED" if self.paused else f"▶ {self.speed:g}x")
        return f"REPLAY {self.name} │ {stamp} │ {_mmss(self.elapsed)}/{_mmss(self.duration)} │ {state}"


def _mmss(s: float) -> str:
    s = max(0, int(s))
    return f"{s // 60}:{s % 60:02d}"


def replay_app(path: str, *, config: Any, speed: float = 1.0, name: str | None = None) -> VtopApp:
    """The app playing ``path``; raises ``ValueError``/``OSError`` with a plain message."""
    import dataclasses
    import os

    from textual.binding import Binding

    from vtop.sources.record import load
    from vtop.ui.app import VtopApp

    header, events = load(path)
    if header.get("schema") not in (None, "vtop-record") and not events:
        raise ValueError(f"{path}: not a vtop recording")
    driver = ReplayDriver(events, header, name=name or os.path.basename(path), speed=speed)
    history = float(header.get("history") or config.history)
    cfg = dataclasses.replace(config, urls=driver.urls, record=None, interval=driver.interval,
                              history=max(history, 10 * driver.interval))

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
            driver.toggle_pause()

        def action_replay_step(self) -> None:
            driver.step()

        def action_replay_speed(self, up: int) -> None:
            driver.faster(bool(up))

        def action_replay_seek(self, seconds: float) -> None:
            driver.seek(driver.pos + float(seconds))

    return ReplayApp(cfg, replay=driver)
