"""The vLLM log's clock, measured against vtop's own. Pure: no I/O.

vLLM stamps its lines ``MM-DD HH:MM:SS`` in the local time of the box (or container) it runs in,
with no zone. vtop's clock is its own: **a line vtop saw arrive is news, whatever its stamp
says**; the stamps only say how far apart lines were, and, for the lines read at once when vtop
attached (the backlog), how old they are. For that the offset between the stamps and vtop's
wall clock is estimated:

* every line that arrived after the attach (seen as it came) bounds it tightly: it was written
  less than a poll before vtop read it, so ``stamp - read_wall`` is the offset within a second or
  two. The largest of those of the last ``WINDOW_S`` is taken (a clock that drifts is followed);
* before any such line, the backlog alone: its last stamped line against the file's modification
  time (when it was last written, on vtop's clock), else against when it was read (a loose
  bound: a backlog whose last line is old);
* a bound within ``-SLACK_S .. +SNAP_S`` (``SNAP_LIVE_S`` for lines seen arriving) of a time-zone offset (a whole quarter-hour between
  UTC-12 and UTC+14: a container in UTC beside a host in UTC+8 is 8 h off) is taken as that
  offset; else, for a backlog, the smallest of this box's own offset and UTC not below the
  bound, else the bound itself: an old backlog can only look more recent than it was (every
  age and silence shorter: the side of no alarm); for lines seen arriving, the measured bound
  itself (a skewed or drifting clock).

:meth:`LogClock.offset` is the one answer: the phase tracker (the launch time of a process on
the log's clock), the log's history (its stats lines on the monitor's clock) and the backlog's
age (:meth:`LogClock.backlog_lag`, "the log's last line is 75 h old") all read it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

__all__ = ["OLD_LOG_S", "LogClock", "local_offset", "zone_offset_near"]

#: lines of one second share a stamp, and vLLM's stats interval jitters: slack below a bound
SLACK_S = 2.0
#: how far above a bound a time-zone offset may be and still be taken for it (a backlog's last
#: stamped line can precede the file's last write by a few unstamped lines)
SNAP_S = 60.0
#: the same for a bound measured from lines seen arriving: within a poll (and the stamp's second) of the truth
SNAP_LIVE_S = 5.0
#: how long a measured bound of a line seen arriving counts (a clock that drifts)
WINDOW_S = 600.0
#: plausible time-zone offsets: UTC-12 to UTC+14, by quarter-hours
ZONE_STEP_S = 900.0
ZONE_MIN_S = -12 * 3600.0
ZONE_MAX_S = 14 * 3600.0
#: a backlog whose last line is older than this is an old file, not a silent start
OLD_LOG_S = 3600.0
#: below this a backlog's lag is the time it took to read it, not an age
LAG_MIN_S = 5.0


def local_offset(wall: float) -> float:
    """This box's UTC offset at ``wall`` (vLLM stamps its lines in local time)."""
    try:
        return float(time.localtime(wall).tm_gmtoff)
    except (OverflowError, ValueError, OSError):
        return 0.0


def zone_offset_near(bound: float, above: float = SNAP_S) -> float | None:
    """The time-zone offset (a quarter-hour, UTC-12 to UTC+14) in ``[bound - SLACK_S, bound +
    above]``, the lowest one; None when there is none."""
    k = -(-(bound - SLACK_S) // ZONE_STEP_S)  # ceil
    g = k * ZONE_STEP_S
    if g <= bound + above and ZONE_MIN_S <= g <= ZONE_MAX_S:
        return float(g)
    return None


class LogClock:
    """Fed the stamp of every stamped line with when it was read (:meth:`feed`) and the file's
    modification time at each poll (:meth:`note_written`); :meth:`offset` answers."""

    def __init__(self, local: Callable[[float], float] | None = None) -> None:
        self._local = local if local is not None else local_offset
        self.reset()

    def reset(self) -> None:
        self._attach: float | None = None  # arrival of the first lines read (the backlog)
        self._backlog_bound: float | None = None  # max(stamp - read wall) of the backlog's lines
        self._backlog_last: float | None = None  # the backlog's last stamp
        self._written: float | None = None  # the file's modification time while only the backlog was read
        self._live: deque[tuple[float, float]] = deque()  # (arrival, stamp - read wall) of lines seen arriving
        self._live_max: float | None = None

    def is_live(self, arrival: float | None) -> bool:
        """Whether a line read at ``arrival`` came after the backlog (vtop saw it arrive)."""
        if arrival is None:
            return False  # the attach-time tail read
        if self._attach is None:
            self._attach = arrival
        return arrival > self._attach

    @property
    def live_seen(self) -> bool:
        return bool(self._live)

    def feed(self, stamp_t: float, wall: float, arrival: float | None) -> None:
        """A stamped line (its stamp as seconds, read as UTC) read at wall-clock ``wall``."""
        b = stamp_t - wall
        if self.is_live(arrival):
            assert arrival is not None
            live = self._live
            live.append((arrival, b))
            while live and live[0][0] < arrival - WINDOW_S:
                live.popleft()
            if len(live) > 4096:
                live.popleft()
            self._live_max = None
            return
        if self._backlog_bound is None or b > self._backlog_bound:
            self._backlog_bound = b
        if self._backlog_last is None or stamp_t >= self._backlog_last:
            self._backlog_last = stamp_t

    def note_written(self, mtime: float | None) -> None:
        """The log file's modification time (vtop's wall clock) at a poll; only the backlog's is kept."""
        if mtime is not None and not self._live:
            self._written = mtime

    def bound(self) -> tuple[float, str] | None:
        """(the offset is at least this, from what): "live", "mtime" or "read"."""
        if self._live:
            if self._live_max is None:
                self._live_max = max(b for _, b in self._live)
            return self._live_max, "live"
        if self._backlog_last is not None and self._written is not None:
            b = self._backlog_last - self._written
            # the modification time is at or after the last line was written: a lower bound, tighter
            # than the read's unless the file is from a clock ahead of vtop's (then the read's)
            if self._backlog_bound is None or b >= self._backlog_bound - SLACK_S:
                return max(b, self._backlog_bound if self._backlog_bound is not None else b), "mtime"
        if self._backlog_bound is not None:
            return self._backlog_bound, "read"
        return None

    def offset(self, wall: float) -> float | None:
        """The log's clock minus vtop's wall clock (see the module's docstring); None before any
        stamped line."""
        got = self.bound()
        if got is None:
            return None
        b, kind = got
        zone = zone_offset_near(b, SNAP_LIVE_S if kind == "live" else SNAP_S)
        if zone is not None:
            return zone
        if kind == "live":
            return b
        cands = sorted({float(self._local(wall)), 0.0})
        ok = [c for c in cands if c >= b - SLACK_S]
        return ok[0] if ok else b
