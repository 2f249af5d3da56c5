"""Injectable clocks.

Everything that reasons about time (histories, rates, staleness, stall
alarms) reads a :class:`Clock` instead of calling :mod:`time` directly, so
tests can drive it by hand and replays can show the recorded time.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for durations)."""

    def time(self) -> float:
        """Wall-clock Unix seconds (for display and for matching log timestamps)."""


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()


class FakeClock:
    """A clock that moves only when told to; ``time()`` keeps a fixed offset."""

    def __init__(self, start: float = 1000.0, wall_offset: float = 1_790_000_000.0) -> None:
        self._now = start
        self._offset = wall_offset

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        return self._now + self._offset

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self._now += seconds
