"""The vLLM log as one source: a tailer plus the phase tracker, polled from a thread.

The tracker is fed in the polling thread (a big catch-up after attach can be
thousands of lines), and the UI only ever receives a frozen :class:`LogView`.
Events that come from elsewhere (``/health`` answered 200, the launch time
of the process) are handed in through thread-safe methods and applied at the
next poll.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, replace
from typing import Any

from vtop.clock import Clock, SystemClock
from vtop.core.logclock import OLD_LOG_S
from vtop.core.loghistory import SHM_WAIT, STATS_NEEDLES, LogHistory, LogHistoryView
from vtop.core.phases.tracker import DEFAULT_STALL_S, PhaseTracker
from vtop.core.phases.types import LogLine, Phase, Quiet, StallInfo, StartupSnapshot
from vtop.core.requests.log import FinishedRequest, InFlight, RequestTracker
from vtop.sources.logtail import LogSource, TailState, open_log

RECENT_LINES = 400
#: the kinds of warning and error a view carries (the most frequent)
MAX_KINDS_SHOWN = 8
#: what the attach-time tail read keeps: every engine's stats lines (:data:`vtop.core.loghistory.STATS_LINES`)
#: and vLLM's shm-broadcast waits
BACKFILL_NEEDLES = (*(n.encode() for n in STATS_NEEDLES), SHM_WAIT.encode())


@dataclass(frozen=True)
class LogView:
    """What the startup panel and the log pane show, at one poll."""

    mono: float
    tail: TailState
    snapshot: StartupSnapshot
    stall: StallInfo | None
    current_elapsed_s: float | None
    recent: tuple[LogLine, ...]
    lines_total: int
    """Lines read since vtop started (tells the log pane whether to repaint)."""
    warnings: int
    errors: int
    inflight: tuple[InFlight, ...] = ()
    """Requests in flight from the request log, oldest first."""
    recent_finished: tuple[FinishedRequest, ...] = ()
    request_logging: bool = False
    """A request line was seen: vLLM runs with request logging (--enable-log-requests from 0.10)."""
    finishes_logged: bool = False
    """The log says when requests end (V0, or --enable-log-outputs): ages are exact, not "at most"."""
    quiet: Quiet | None = None
    """A start in progress: how long the log has been silent and what its progress says, whatever the
    stall threshold (the diagnoser judges a stall by evidence from it; ``stall`` is the ceiling)."""
    history: LogHistoryView | None = None
    """The log's stats lines of the last minutes on the monitor's clock (:mod:`vtop.core.loghistory`):
    what the rules know of the time before vtop looked (``doctor --window 15``, an attach)."""
    binary_lines: int = 0
    """Lines read that are not text (NUL bytes, or mostly bytes that are not UTF-8)."""
    source_label: str | None = None
    """What keeps the log when vtop found it by itself ("docker json-file of vllm-0", "journal of unit
    vllm.service"); None for a plain file or a pipe."""
    logged_since_start: tuple[tuple[float, int], ...] | None = None
    """``(since, max_tokens)`` of every request logged since the server's startup, aborted and
    refused ones left out; None when the request lines do not reach back to a startup
    (:meth:`vtop.core.requests.RequestTracker.logged_since_start`)."""
    old_s: float | None = None
    """How old the log's last line was when vtop read it, when that is an hour or more and no line came
    since: an old file (``--log`` of a past run), not a start that stalled (no stall is judged from it)."""
    past_starts: tuple[StartupSnapshot, ...] = ()
    """The earlier starts of the server in this log, oldest first (a restart inside the log)."""
    problem_kinds: tuple[tuple[str, int, str, float | None, float | None], ...] = ()
    """The warnings and errors read, by kind (:attr:`vtop.core.phases.tracker.PhaseTracker.problem_kinds`)."""
    attached: float | None = None
    """When vtop first read the log (monotonic): what came before is the backlog, what the log says of
    the time before vtop looked."""

    @property
    def problem(self) -> str | None:
        """What is wrong with the log as a source, in one line (None: nothing): it is missing, a
        directory, unreadable, not text, or its input ended. Shown where the startup panel is and
        in the notes of ``--once``/``doctor``/JSON."""
        return log_problem(self.tail, self.lines_total, self.binary_lines, self.old_s)

    @property
    def state(self) -> str:
        return self.snapshot.state


def is_binary_line(line: str) -> bool:
    """A line of a file that is not text: a NUL, or a quarter or more of it bytes that were not UTF-8."""
    return "\x00" in line or (len(line) >= 8 and line.count("\ufffd") * 4 >= len(line))


def log_problem(tail: TailState, lines_total: int, binary_lines: int, old_s: float | None = None) -> str | None:
    """See :attr:`LogView.problem`."""
    src = tail.source
    if tail.status == "error":
        return f"vLLM log: {tail.message or 'cannot be read'}"
    if tail.status == "waiting":
        return f"vLLM log: {src} does not exist (yet); waiting for it to appear"
    if tail.status == "ended":
        return f"vLLM log: input ended ({'standard input' if src == '-' else src} was closed by its writer)"
    if tail.nul_bytes and not lines_total:
        of = f" of {_size(tail.size)}" if tail.size else ""
        return (f"vLLM log: {src} holds NUL bytes and no text ({_size(tail.nul_bytes)} read{of}: a sparse or "
                "preallocated file, or one truncated under its writer as logrotate's copytruncate leaves it); "
                "waiting for text; pass the server's stdout/stderr file")
    if binary_lines >= 3 and binary_lines * 2 >= lines_total:
        return (f"vLLM log: {src} does not look like a text log ({binary_lines} of {lines_total} lines read are "
                "binary); pass the server's stdout/stderr file")
    if old_s is not None:
        return (f"vLLM log: the log's last line is {age_words(old_s)} old ({src} was last written then, nothing "
                "since): an old file? Its silence is not taken for a stalled start")
    return None


def _size(n: int) -> str:
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{n} bytes"


def age_words(s: float) -> str:
    """``75 h``, ``2 h 05 min``: an old log's age."""
    m = int(round(s / 60.0))
    h, m = divmod(m, 60)
    if h >= 10 or m == 0:
        return f"{h} h"
    return f"{h} h {m:02d} min"


class LogWatch:
    def __init__(
        self,
        source: LogSource,
        *,
        clock: Clock | None = None,
        stall_threshold_s: float = DEFAULT_STALL_S,
        tracker: PhaseTracker | None = None,
    ) -> None:
        self.source = source
        self.clock = clock or SystemClock()
        self.stall_threshold_s = stall_threshold_s
        self.tracker = tracker or PhaseTracker()
        self.requests = RequestTracker()
        self.history = LogHistory()
        self._backfilled = False
        self._events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._lines_total = 0
        self._binary_lines = 0
        self._lock = threading.Lock()
        #: a :class:`~vtop.sources.recording.record.Recorder` (or anything with ``log``/``logmark``)
        self.recorder: Any = None
        self._ready_recorded = False
        self._restarts_seen = 0
        self._max_len_sent: int | None = None
        self._last_arrival = float("-inf")
        self._attached: float | None = None

    @classmethod
    def open(cls, spec: str, **kw: Any) -> LogWatch:
        return cls(open_log(spec), **kw)

    @classmethod
    def for_server(cls, server: Any, *, clock: Clock, recorder: Any = None, **kw: Any) -> tuple[LogWatch | None, str]:
        """The log a running server writes (its stdout, found in /proc), with its launch
        time handed to the tracker; or None and why not (a pipe, a terminal...). A server in a
        container, a pod or a systemd unit writes to a pipe its runtime reads: then the file the
        runtime keeps (docker's json-file, kubelet's CRI log) or the journal is followed."""
        from vtop.sources.logtail import LogTailer, find_log_for_pid

        loc = find_log_for_pid(server.pid)
        src: Any = None
        where = f"{loc.path} (stdout of pid {server.pid})"
        if loc.path is not None:
            src = LogTailer(loc.path)
        else:
            src, said = _runtime_log(server)
            if src is None:
                return None, said or loc.message
            where = said or where
        watch = cls(src, clock=clock, **kw)
        # the recorder first: the launch mark is recorded (a replay without it began the start at the log's
        # first line: the real two-server run on an H100 replayed "ready in 1 min 03 s" for a start of 85 s)
        watch.recorder = recorder
        watch.mark_launch_of(server)
        return watch, where

    def mark_launch_of(self, server: Any) -> None:
        """Tell the tracker when ``server`` (a ServerProcess) was launched."""
        now = self.clock.monotonic()
        self.mark_process_start(server.create_time, now - max(0.0, self.clock.time() - server.create_time))

    # Thread-safe inputs -----------------------------------------------------
    def mark_ready(self, mono: float, source: str = "health") -> None:
        self._events.put(("ready", (mono, source)))
        # The app says "ready" at every good /health; a recording needs the first one
        # after each launch (a replay re-sends it, the tracker ignores repeats anyway).
        if self.recorder is not None and not self._ready_recorded:
            self._ready_recorded = True
            self.recorder.logmark("ready", t=self.clock.time(), mono=mono, source=source)

    def mark_process_start(self, epoch: float, mono: float | None = None) -> None:
        self._events.put(("launch", (epoch, mono)))
        self._ready_recorded = False
        if self.recorder is not None:
            self.recorder.logmark("launch", t=self.clock.time(), mono=mono if mono is not None else self.clock.monotonic(),
                                  epoch=epoch)

    def note_running(self, running: float | None, mono: float, waiting: float | None = None) -> None:
        """From ``/metrics``: running fell to 0 means every logged request ended."""
        self._events.put(("running", (running, mono, waiting)))

    def set_max_model_len(self, n: int | None) -> None:
        self._events.put(("max_len", n))

    def reset_requests(self) -> None:
        """The server restarted: nothing it had in flight is still running."""
        self._events.put(("reset_requests", None))

    def note_server(self, view: Any, mono: float) -> None:
        """What the server this log belongs to says at one poll (a
        :class:`~vtop.core.server.ServerView`): a restart clears the requests in
        flight, ``max_model_len`` tells which requests came without ``max_tokens``,
        and the running gauge falling to 0 ends every logged request. Thread-safe."""
        if view.restarts != self._restarts_seen:
            self._restarts_seen = view.restarts
            self.reset_requests()
        if view.max_model_len and view.max_model_len != self._max_len_sent:
            self._max_len_sent = view.max_model_len
            self.set_max_model_len(view.max_model_len)
        m = view.metrics
        if view.is_live and m is not None and view.last_error is None:
            self.note_running(m.running, mono, m.waiting)

    def reset(self) -> None:
        """Forget everything read (a replay seeking back); the source stays."""
        with self._lock:
            self.tracker = PhaseTracker()
            self.requests = RequestTracker()
            self.history = LogHistory()
            self._lines_total = 0
            self._binary_lines = 0
            self._restarts_seen = 0
            self._max_len_sent = None
            self._attached = None
            while True:
                try:
                    self._events.get_nowait()
                except queue.Empty:
                    break

    # Polled from one thread ---------------------------------------------------
    def poll(self) -> LogView:
        with self._lock:
            now = self.clock.monotonic()
            wall = self.clock.time()
            if self._attached is None:
                self._attached = now
            timed = getattr(self.source, "poll_timed", None)
            arrivals: list[tuple[float, float]] | None = None
            if timed is not None:
                pairs = timed()
                lines = [line for line, _ in pairs]
                arrivals = self._arrivals([t for _, t in pairs], now, wall)
            else:
                lines = self.source.poll()
            if not self._backfilled and self.source.state.status == "following":
                self._backfill(wall)
            # Lines first, then outside events: a /health 200 seen during a catch-up
            # must not mark "ready" before the log's own lines say where the start is.
            if lines:
                feed, req, hist = self.tracker.feed, self.requests.feed, self.history.feed
                if arrivals is None:
                    for line in lines:
                        ev = feed(line, now)
                        req(line, now, event=ev)
                        hist(ev, wall, now)
                else:
                    for line, (w, m) in zip(lines, arrivals):
                        ev = feed(line, m)
                        req(line, m, event=ev)
                        hist(ev, w, m)
                self._lines_total += len(lines)
                self._binary_lines += sum(1 for line in lines if is_binary_line(line))
                if self.recorder is not None:
                    # at the read, as a plain file's lines (a recording's events keep their order)
                    self.recorder.log(self.clock.time(), now, lines)
            while True:
                try:
                    kind, arg = self._events.get_nowait()
                except queue.Empty:
                    break
                if kind == "ready":
                    self.tracker.mark_ready(arg[0], arg[1])
                elif kind == "launch":
                    self.tracker.mark_process_start(arg[0], arrival=arg[1], utc_offset_s=self.history.offset(wall))
                elif kind == "running":
                    self.requests.note_running(arg[0], arg[1], waiting=arg[2])
                elif kind == "max_len":
                    self.requests.set_max_model_len(arg)
                elif kind == "reset_requests":
                    self.requests.reset()
            # A log read as a backlog (an attach, doctor) arrived all at once: its silence
            # began when its last line was written, not when vtop read it. Its clock is
            # measured (vtop.core.logclock); the launch of its process goes on that clock.
            lag = self.history.backlog_lag(now, wall, getattr(self.source.state, "mtime", None))
            off = self.history.offset(wall)
            if off is not None:
                self.tracker.set_clock_offset(off)
            snap = self.tracker.snapshot()
            # An old file (its last line written an hour or more before vtop read it, nothing since):
            # said to be old, its silence not judged as a start that stalled.
            old = lag if lag >= OLD_LOG_S else None
            return LogView(
                mono=now,
                tail=self.source.state,
                snapshot=snap,
                stall=None if old is not None else self.tracker.stalled(now + lag, self.stall_threshold_s),
                current_elapsed_s=self.tracker.elapsed(now) if snap.state == "starting" else None,
                recent=tuple(self.tracker.recent(limit=RECENT_LINES)),
                lines_total=self._lines_total,
                warnings=self.tracker.warning_count,
                errors=self.tracker.error_count,
                inflight=tuple(self.requests.inflight(now)),
                recent_finished=tuple(self.requests.recent_finished()[:50]),
                request_logging=self.requests.logging_seen,
                finishes_logged=self.requests.finishes_logged,
                quiet=None if old is not None else self.tracker.quiet(now + lag),
                history=replace(self.history.snapshot(now, wall), backlog_lag_s=lag,
                                backlog_lag_from=self.history.lag_from if lag else None),
                binary_lines=self._binary_lines,
                logged_since_start=self.requests.logged_since_start(),
                old_s=old,
                source_label=getattr(self.source, "label", None),
                past_starts=self.tracker.past_starts,
                problem_kinds=tuple(self.tracker.problem_kinds[:MAX_KINDS_SHOWN]),
                attached=self._attached,
            )

    def _arrivals(self, stamps: list[float | None], now: float, wall: float) -> list[tuple[float, float]]:
        """``(wall, monotonic)`` arrival of each line whose writer stamped when it read it (a container
        runtime, journald): that moment, on vtop's clocks, never later than now and never before the
        line ahead of it (stdout and stderr are stamped apart); now for a line with no stamp."""
        out: list[tuple[float, float]] = []
        last = self._last_arrival
        for t in stamps:
            m = now if t is None else now - max(0.0, wall - t)
            m = max(m, last)
            last = m
            out.append((wall - (now - m), m))
        self._last_arrival = last
        return out

    def _backfill(self, wall: float) -> None:
        """Once the file is open: the stats lines at its end, ahead of the forward read
        (which starts at the last startup, possibly 64 MiB back), into the history; the
        forward read's copies of them are dropped there as repeats."""
        self._backfilled = True
        tail = getattr(self.source, "tail_lines", None)
        if tail is None:
            return
        from vtop.core.phases.patterns import parse_line

        # with the stats lines before the last startup (a restart in place): the charts drawn back and the
        # timeline tell the earlier run apart by the start's time (vtop.core.backfill, vtop.core.timeline)
        for line in tail(BACKFILL_NEEDLES, before_start=True):
            self.history.feed(parse_line(line), wall)

    def close(self) -> None:
        self.source.close()


def _runtime_log(server: Any) -> tuple[Any, str | None]:
    """The source of the log the runtime around ``server`` keeps, and what it is ("docker json-file
    of vllm-0 (PATH)"); ``(None, why)`` when it keeps none vtop reads; ``(None, None)`` when
    ``server`` runs in no container, pod or unit."""
    from vtop.sources import discovery
    from vtop.sources.containers import container_log

    enr = discovery.enricher()
    info = enr.runtime_info(getattr(server, "container_id", None)) if enr is not None else None
    found = container_log(server, info)
    if found is None:
        return None, None
    if found.kind is None:
        return None, f"{found.message}"
    if found.kind == "journal":
        from vtop.sources.journal import JournalTailer

        assert found.match is not None
        src: Any = JournalTailer(found.match, since=server.create_time - 1.0, label=found.label)
        return src, f"{found.label} (journalctl {found.match})"
    from vtop.sources.logformats import CriDecoder, DockerJsonDecoder
    from vtop.sources.logtail import LogTailer

    assert found.path is not None
    dec = DockerJsonDecoder() if found.kind == "docker-json" else CriDecoder()
    return LogTailer(found.path, decoder=dec, label=found.label), f"{found.label} ({found.path})"


__all__ = ["LogView", "LogWatch", "Phase"]
