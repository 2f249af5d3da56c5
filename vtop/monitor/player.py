"""A recording played into a :class:`~vtop.monitor.Monitor`, on the recorded clock.

The recording holds what the sources returned (GPU polls, server polls with
parsed metrics, the process table, log lines, the ``ready``/``launch`` marks),
not what a screen showed. :class:`Player` hands those to the monitor's
``apply_*`` in order, with a :class:`ReplayClock` that reads the *recorded*
time, and closes a round (:meth:`Monitor.tick`) after each round of server
polls (after each GPU poll when no server was recorded). So the screen
(``vtop replay``/``demo``), the headless ``vtop replay --doctor`` and the tests
all get the same alerts at the same recorded times, whatever the speed or the
step they play at; and a newer vtop replaying an old file shows what its newer
rules make of it.

Controls (pause, speed, seek) live here too; the screen only calls them from
its keys and :meth:`Player.on_timer` from a timer. Seeking back rebuilds
every tracker from the start of the file (an hour of 8 GPUs and 2 servers
takes well under a second), because rates and histories depend on what came
before.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vtop.config import Config
from vtop.monitor.monitor import Monitor
from vtop.sources.logtail import TailState
from vtop.sources.recording.record import RecordEvent

SPEEDS = (1, 2, 5, 10, 30, 60)
#: a chapter starts this long before what it is named after (the queue filling, an alert)
CHAPTER_LEAD_S = 5.0


def _incident(alerts: Any) -> bool:
    return any(a.get("severity") in ("warning", "critical") for a in alerts or ())


def find_chapters(events: list[RecordEvent]) -> list[tuple[str, float]]:
    """The recording's chapters, (name, recorded monotonic seconds), from what it holds:
    ``start`` (its first event); ``burst`` (the first server poll with requests waiting);
    ``runaway``/``incident`` (the first warning or critical alert vtop recorded live, named
    after its rule); ``end`` (the last moment that alert was on, before the recording went
    on to a shutdown). Chapters the recording has nothing for are left out."""
    if not events:
        return []
    out = [("start", events[0].at)]
    for e in events:
        if e.kind == "server":
            m = getattr(e.data, "metrics", None)
            if m is not None and (m.waiting or 0) > 0:
                out.append(("burst", max(events[0].at, e.at - CHAPTER_LEAD_S)))
                break
    on: float | None = None
    for e in events:
        if e.kind != "alerts" or not isinstance(e.data, dict):
            continue
        alerts = e.data.get("alerts") or []
        if on is None and _incident(alerts):
            on = e.at
            rule = next(a.get("rule") for a in alerts if a.get("severity") in ("warning", "critical"))
            out.append((str(rule) if rule == "runaway" else "incident", e.at))
        elif on is not None and not _incident(alerts):
            out.append(("end", max(on, e.at - 1.0)))
            break
    out.sort(key=lambda c: c[1])
    return out
#: seconds of real time between steps of a playing replay
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
    """A log source the player pushes recorded lines into."""

    name: str
    pending: list[str] = field(default_factory=list)
    _state: TailState | None = None
    #: when the lines fed last were written (recorded wall clock): the file's modification time
    written: float | None = None

    def poll(self) -> list[str]:
        out, self.pending = self.pending, []
        return out

    @property
    def state(self) -> TailState:
        return self._state or TailState("following", self.name, "replaying the recorded log", mtime=self.written)

    def close(self) -> None:
        pass


def attached_at(events: list[RecordEvent], at: float) -> list[RecordEvent]:
    """The events as vtop started at recorded monotonic time ``at`` sees them: nothing
    of ``/metrics``, NVML or the alerts before ``at``; the log written before it read at
    once at ``at`` (a backlog, as the tailer reads a log it attaches to); the last
    process scan before it, taken at ``at``; then everything from ``at`` on.
    (``vtop doctor`` started in the middle of an incident.)"""
    before = [e for e in events if e.at < at]
    after = [e for e in events if e.at >= at]
    if not before:
        return after
    ref = next((e for e in reversed(before) if e.kind in ("gpu", "server", "log", "procs") and e.t), None)
    t_at = ref.t + (at - ref.mono) if ref is not None else 0.0
    head: list[RecordEvent] = []
    procs = next((e for e in reversed(before) if e.kind == "procs"), None)
    if procs is not None:
        head.append(RecordEvent("procs", t_at, at, procs.data))
    logs = [e for e in before if e.kind == "log"]
    lines = [ln for e in logs for ln in e.data]
    if lines:
        # extra: when its last line was written (a file's modification time), read at t_at
        head.append(RecordEvent("log", t_at, at, lines, extra=logs[-1].t))
    return head + after


class Player:
    def __init__(self, events: list[RecordEvent], header: dict[str, Any], *, config: Config,
                 name: str = "recording", speed: float = 1.0, attach_at: float | None = None) -> None:
        if attach_at is not None:
            events = attached_at(events, attach_at)
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
        self.urls = tuple(dict.fromkeys(e.data.url for e in events if e.kind == "server"))
        self.has_gpu = any(e.kind == "gpu" for e in events)
        self.has_log = any(e.kind == "log" for e in events)
        self.interval = float(header.get("interval") or config.interval or 1.0)
        self.config = config
        self.log = FedLog(name) if self.has_log else None
        self.raw = bool(header.get("raw"))
        """A raw trace (:mod:`vtop.sources.recording.trace`): no recorded launch/ready marks, so the
        monitor works them out from the process table and the health answers, as live."""
        self._lost_launch = self._find_lost_launch(events)
        self.monitor = self._new_monitor()
        self.on_paused: Callable[[bool], None] | None = None
        """Told when the player pauses or resumes (the screen stops its timer)."""
        self.on_moved: Callable[[], None] | None = None
        """Told after each control moved the position or changed the speed (the screen paints)."""
        self._paused = False
        self.ended = False
        self._i = 0
        #: recorded time of the last connections read applied (they are taken at the live cadence)
        self._conns_at: float | None = None
        self._last_wall: float | None = None
        self.chapters = find_chapters(events)
        """(name, recorded monotonic seconds) in order: :func:`find_chapters`."""
        self.pause_on_alert = False
        """Pause (once per alert) where a warning or critical alert first shows while playing (the demo)."""
        self.stop_at: float | None = None
        """Pause here once while playing (the demo: the end of its incident, before the shutdown)."""
        self.note = ""
        """Why the player paused by itself (the status line says it)."""
        self._alerts_seen: set[str] = set()

    def _find_lost_launch(self, events: list[RecordEvent]) -> tuple[int, float, float] | None:
        """A launch mark the recording lost: ``(index of the process scan, epoch, monotonic)``. Before the fix
        of issue 39, vtop that found a server's log itself marked its launch before its recorder was attached,
        so its recordings hold the log and no launch mark: replayed, the start began at the log's first line
        (the real two-server run on an H100, tests/fixtures/h100-two-servers: "ready in 1 min 03 s" for a start
        of 85 s, the first line 22 s after the launch). The live monitor marked it at the first process scan
        with a server behind a watched URL, from that process's start time: the same here. None where the
        recording has a launch mark, no log, or is a raw trace (the monitor works it out live)."""
        if self.raw or not self.has_log or any(e.kind == "logmark" and e.data.get("what") == "launch" for e in events):
            return None
        from vtop.sources.urls import url_matches

        for i, e in enumerate(events):
            if e.kind != "procs":
                continue
            mine = [sp for sp in e.data if any(url_matches(u, sp) for u in self.urls)]
            if mine:
                ct = mine[0].create_time
                return (i, float(ct), e.mono - max(0.0, e.t - ct)) if ct and e.t else None
        return None

    def _new_monitor(self) -> Monitor:
        from vtop.monitor.logwatch import LogWatch

        lw = (LogWatch(self.log, clock=self.clock, stall_threshold_s=self.config.stall_threshold)
              if self.log is not None else None)
        # box_history=False: the recording's starts are not this box's (this box's file neither read nor written);
        # its own earlier starts are the later ones' history, in memory, as a vtop that watched them live kept them
        m = Monitor(self.config, clock=self.clock, log_watch=lw, live=self.raw, find_logs=False, box_history=False)
        for url in self.urls:
            m.add_server(url, from_cli=True)
        return m

    @property
    def paused(self) -> bool:
        return self._paused

    @paused.setter
    def paused(self, value: bool) -> None:
        self._paused = value
        self._last_wall = None
        if self.on_paused is not None:
            self.on_paused(value)

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

    # ------------------------------------------------------------- feeding
    def feed_until(self, target: float) -> int:
        """Apply every event recorded up to ``target`` (recorded monotonic seconds)."""
        m = self.monitor
        lw = m.log_watch
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
                m.apply_gpu(e.data, e.extra or {})
                if not self.urls:
                    m.tick()
            elif e.kind == "server":
                m.apply_server(e.data.url, e.data)
                if e.data.url == self.urls[-1]:
                    m.tick()  # once per round of polls: the rules keep state from one round to the next
            elif e.kind == "procs":
                m.apply_procs(list(e.data))
                lost = self._lost_launch
                if lost is not None and lost[0] == self._i - 1 and lw is not None:
                    lw.mark_process_start(lost[1], lost[2])
                    self._poll_log()
            elif e.kind == "conns":
                # at the live cadence: the first read at once, then as the monitor asks (every 10 s,
                # every 2 s while a long answer streams; a trace holds one a second, vtop's own
                # recordings are at that cadence already)
                if self._conns_at is None or e.at - self._conns_at >= m.conns_read_every() - 0.5:
                    self._conns_at = e.at
                    m.apply_conns(e.data)
            elif e.kind == "log" and lw is not None and self.log is not None:
                self.log.pending.extend(e.data)
                self.log.written = e.extra if isinstance(e.extra, float) else e.t
                log_fed = True
                self._poll_log()
            elif e.kind == "logmark" and lw is not None:
                d = e.data
                if d.get("what") == "ready":
                    lw.mark_ready(float(d.get("mono", e.mono)), str(d.get("source", "health")))
                elif d.get("what") == "launch" and d.get("epoch") is not None:
                    lw.mark_process_start(float(d["epoch"]), float(d.get("mono", e.mono)))
                self._poll_log()
        self.clock.mono = max(self.clock.mono, min(target, self.end))
        if not log_fed and lw is not None and n:
            self._poll_log()
        return n

    def _poll_log(self) -> None:
        lw = self.monitor.log_watch
        assert lw is not None
        self.monitor.apply_log(lw.poll())

    def _reset(self) -> None:
        """Back to the start of the recording: every tracker empty."""
        self._i = 0
        self._conns_at = None
        self.ended = False
        self.clock.mono = self.start
        if self.log is not None:
            self.log.pending.clear()
        self.monitor.reset()

    def play_to_end(self) -> Monitor:
        """Everything, at once (the headless replay, the tests)."""
        self.feed_until(self.end)
        self.ended = True
        return self.monitor

    # ------------------------------------------------------------ controls
    def advance(self, seconds: float) -> None:
        """Play ``seconds`` of recorded time (forward only)."""
        target = min(self.end, self.pos + max(0.0, seconds))
        stop = self.stop_at
        if stop is not None and self.pos < stop <= target:
            target = stop
        self.feed_until(target)
        if self._i >= len(self.events) and self.pos >= self.end:
            self.ended = True
            self.paused = True
        elif stop is not None and self.pos >= stop:
            self.stop_at = None  # once: space plays on
            self.note = "the incident's end (space: play on to the shutdown)"
            self.paused = True
        self._check_alerts()
        self._moved()

    def _check_alerts(self, pause: bool = True) -> None:
        """A warning or critical alert showing for the first time: pause there (once)."""
        new = [a for a in self.monitor.alerts
               if a.severity in ("warning", "critical") and a.rule not in self._alerts_seen]
        if not new:
            return
        self._alerts_seen.update(a.rule for a in new)
        if pause:
            # Played up to it: the alert first shows here. The recorded alert that named the
            # chapter was raised by the vtop that recorded; today's rules may raise it sooner.
            for i, (name, at) in enumerate(self.chapters):
                if name in (new[0].rule, "incident") and at > self.pos:
                    prev = self.chapters[i - 1][1] if i else self.start
                    self.chapters[i] = (name, max(prev, self.pos - CHAPTER_LEAD_S))
        if pause and self.pause_on_alert and not self.paused:
            self.note = f"{new[0].severity} alert: {new[0].rule} (space: play on)"
            self.paused = True

    # ------------------------------------------------------------ chapters
    def chapter_index(self) -> int:
        """The chapter the position is in (-1 before the first)."""
        i = -1
        for k, (_name, at) in enumerate(self.chapters):
            if at <= self.pos + 1e-6:
                i = k
        return i

    def goto_chapter(self, index: int) -> None:
        """Seek to a chapter, paused there (a chapter is for looking)."""
        if not self.chapters:
            return
        index = max(0, min(len(self.chapters) - 1, index))
        self.seek(self.chapters[index][1])
        self._check_alerts(pause=False)  # what a jump lands on does not pause a later play
        self.note = ""
        if not self.paused:
            self.paused = True
        self._moved()

    def next_chapter(self, step: int) -> None:
        i = self.chapter_index()
        if step < 0 and i >= 0 and self.pos - self.chapters[i][1] > 2.0:
            step = 0  # back to the start of this one first, as a music player does
        self.goto_chapter(i + step)

    def seek(self, target: float) -> None:
        """Go to ``target`` (recorded monotonic seconds), back or forward."""
        target = min(self.end, max(self.start, target))
        if target < self.pos:
            self._reset()
            self._alerts_seen.clear()
        self.feed_until(target)
        self._check_alerts(pause=False)  # an alert seeked past does not stop a later play
        self.ended = self._i >= len(self.events)
        if self.ended:
            self.paused = True
        self._moved()

    def step(self) -> None:
        self.paused = True
        self.advance(self.interval)

    def toggle_pause(self) -> None:
        self.note = ""
        if self.ended:
            self.seek(self.start)
            self._alerts_seen.clear()
            self.paused = False
        else:
            self.paused = not self.paused
        self._moved()

    def faster(self, up: bool) -> None:
        i = min(range(len(SPEEDS)), key=lambda k: abs(SPEEDS[k] - self.speed))
        i = min(len(SPEEDS) - 1, i + 1) if up else max(0, i - 1)
        self.speed = float(SPEEDS[i])
        self._moved()

    def _moved(self) -> None:
        if self.on_moved is not None:
            self.on_moved()

    def on_timer(self) -> bool:
        """Called every ``TICK_S`` of real time; True when it played something."""
        now = time.monotonic()
        last, self._last_wall = self._last_wall, now
        if self.paused or self.ended:
            return False
        dt = TICK_S if last is None else min(1.0, now - last)
        self.advance(dt * self.speed)
        return True

    def status_text(self, stamp: bool = True, note: bool = True) -> str:
        """The replay's part of the status line; without its wall-clock ``stamp``, then without the pause's
        ``note``, on a narrow screen."""
        t = self.clock.time()
        try:
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
        except (OverflowError, ValueError, OSError):
            when = "?"
        state = "END" if self.ended else ("PAUSED" if self.paused else f"▶ {self.speed:g}x")
        if note and self.note and self.paused and not self.ended:
            state += f": {self.note}"
        i = self.chapter_index()
        chapter = f" │ {self.chapters[i][0]} {i + 1}/{len(self.chapters)}" if i >= 0 and len(self.chapters) > 1 else ""
        # what the user acts on first (the state, the chapter); the clock last, where a narrow screen cuts
        return (f"REPLAY {self.name} │ {state}{chapter} │ {_mmss(self.elapsed)}/{_mmss(self.duration)}"
                + (f" │ {when}" if stamp else ""))


def _mmss(s: float) -> str:
    s = max(0, int(s))
    return f"{s // 60}:{s % 60:02d}"


def open_recording(path: str, *, config: Config, speed: float = 1.0, name: str | None = None,
                   attach_at: float | None = None, with_log: bool | None = None) -> Player:
    """A player for ``path``; raises ``ValueError``/``OSError`` with a plain message.
    ``attach_at`` (recorded monotonic seconds): play it as vtop started then would see it
    (:func:`attached_at`). ``with_log=False``: a trace played without its log (as vtop without
    one would have seen it); None: as the trace's truth says."""
    import dataclasses
    import os

    from vtop.sources.recording.record import load
    from vtop.sources.recording.trace import is_trace, load_trace

    header, events = load_trace(path, with_log=with_log) if is_trace(path) else load(path)
    if header.get("schema") not in (None, "vtop-record") and not events:
        raise ValueError(f"{path}: not a vtop recording")
    if not events:
        raise ValueError("the recording holds no samples")
    interval = float(header.get("interval") or 1.0)
    history = float(header.get("history") or config.history)
    urls = tuple(dict.fromkeys(e.data.url for e in events if e.kind == "server"))
    cfg = dataclasses.replace(config, urls=urls, record=None, interval=interval,
                              history=max(history, 10 * interval))
    return Player(events, header, config=cfg, name=name or os.path.basename(os.path.normpath(path)), speed=speed,
                  attach_at=attach_at)
