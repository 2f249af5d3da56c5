"""Polling without overlap: a one-shot timer chain per source.

A poll runs in a thread worker; when it finishes, its result comes back to
the UI thread as a message and only then is the next poll armed. So at most
one poll per source is ever in flight, a slow source slows only itself, and
a hung call (an NVML ioctl that never returns) leaves the UI answering keys
while the status bar says how long the source has been silent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from textual.app import App
from textual.message import Message
from textual.timer import Timer


@dataclass
class PollDone(Message):
    loop: "PollLoop"
    result: Any
    error: BaseException | None
    started: float
    ended: float


class PollLoop:
    def __init__(
        self,
        app: App[Any],
        name: str,
        interval: float,
        fn: Callable[[], Any],
        on_result: Callable[[Any, BaseException | None], None],
    ) -> None:
        self.app = app
        self.name = name
        self.interval = interval
        self.fn = fn
        self.on_result = on_result
        self.in_flight_since: float | None = None
        self.last_duration: float | None = None
        self.polls = 0
        self._timer: Timer | None = None
        self._stopped = False

    def start(self, delay: float = 0.0) -> None:
        self._stopped = False
        if delay <= 0:
            self._kick()
        else:
            self._timer = self.app.set_timer(delay, self._kick, name=f"poll-{self.name}")

    def stop(self) -> None:
        self._stopped = True
        if self._timer is not None:
            self._timer.stop()
            self._timer = None

    def in_flight_for(self) -> float:
        if self.in_flight_since is None:
            return 0.0
        return time.monotonic() - self.in_flight_since

    def _kick(self) -> None:
        self._timer = None
        if self._stopped or self.in_flight_since is not None:
            return
        self.in_flight_since = time.monotonic()
        self.app.run_worker(self._run, name=f"poll-{self.name}", group=f"poll-{self.name}", thread=True, exit_on_error=False)

    def _run(self) -> None:
        started = self.in_flight_since or time.monotonic()
        result: Any = None
        error: BaseException | None = None
        try:
            result = self.fn()
        except Exception as e:  # reported on screen by on_result, never a traceback
            error = e
        self.app.post_message(PollDone(self, result, error, started, time.monotonic()))

    def done(self, msg: PollDone) -> None:
        """Called on the UI thread by the app's message handler."""
        self.in_flight_since = None
        self.last_duration = msg.ended - msg.started
        self.polls += 1
        try:
            self.on_result(msg.result, msg.error)
        finally:
            if not self._stopped:
                # Textual timers divide by their delay: never arm one at 0.
                delay = max(0.01, self.interval - self.last_duration)
                self._timer = self.app.set_timer(delay, self._kick, name=f"poll-{self.name}")
