"""Polling without overlap: one long-lived daemon thread per source (no Textual).

Each source gets a thread that calls its blocking ``poll()``, hands the
result to the UI thread (``call_soon_threadsafe``), waits until the UI has
applied it, then sleeps out the rest of the interval. So at most one poll per
source is ever in flight, results never queue up behind a slow UI, a slow
source slows only itself, and a hung call (an NVML ioctl that never returns)
leaves the UI answering keys while the status bar says how long the source
has been silent.

Why not a Textual ``@work(thread=True)`` per poll, re-armed by a one-shot
timer (the dolphie pattern)? Measured on the 2-core dev box: that machinery
(a Worker, its state-change messages, an executor hand-off and a new Timer
task every tick) cost 0.45 % of a core per source at 1 Hz, more than the
NVML reads and the repaint together, against a whole-app budget of 1 %. It
also runs on the default executor, whose threads Python joins at exit, so a
hung NVML call would hang ``q``; these threads are daemons.

A source whose results are only shown at the app's paint tick (NVML, the log)
can leave its result for the tick to :meth:`PollLoop.collect` (``at_tick``)
rather than wake the UI thread when it comes: that wake-up (a byte through the
event loop's self-pipe, then a loop pass and a callback) was ~10 % of the GPU
thread's py-spy samples on the 2-core dev box with 8 GPUs, for a result that then
waited for the tick anyway (on the GPU box the NVML thread's total did not move
measurably: 2.11-2.12 ms a second either way; the UI thread's pass went too).
The poll thread still waits until its result is applied, so polls still never
overlap and results never queue.

Each thread also names itself to the kernel (``vtop-gpu``, ``vtop-log``...), so
``top -H -p $(pgrep -f vtop)`` or ``/proc/PID/task/*/comm`` say which source costs
what (the benchmark reports CPU by thread this way).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from vtop.threadname import name_this_thread


class PollLoop:
    def __init__(
        self,
        name: str,
        interval: float,
        fn: Callable[[], Any],
        on_result: Callable[[Any, BaseException | None], None],
        *,
        at_tick: bool = False,
        max_polls: int | None = None,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        self.at_tick = at_tick
        #: called on the loop's thread after each result is left for :meth:`collect` (``at_tick``) or applied:
        #: ``vtop --once`` wakes its round on it instead of finding the result at its next 10 ms step
        self.on_ready = on_ready
        self.max_polls = max_polls
        """Stop after this many results were applied (None: poll until stopped). ``vtop --once`` without a
        window wants one answer of each source: a second NVML poll, started while other sources were still
        being waited for, was then waited for by the shutdown (0.5 s of a 0.7 s one-shot on a lent H100)."""
        """Results wait for :meth:`collect` (the app's paint tick) instead of waking the UI
        thread when they come (see the module doc)."""
        self._ready: tuple[Any, BaseException | None, float] | None = None
        self.name = name
        self.interval = interval
        self.fn = fn
        self.on_result = on_result
        self.in_flight_since: float | None = None
        """Monotonic time the current poll started, or None between polls."""
        self.last_duration: float | None = None
        self.last_delay: float | None = None
        """How long the thread last chose to wait before its next poll (tests)."""
        self.polls = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._applied = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Start polling now; call on the UI thread (it needs the running loop)."""
        self._loop = asyncio.get_running_loop()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"vtop-poll-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._applied.set()

    def poke(self) -> None:
        """Poll again now instead of at the end of the interval (thread-safe)."""
        self._wake.set()

    def in_flight_for(self) -> float:
        since = self.in_flight_since
        return 0.0 if since is None else time.monotonic() - since

    def _run(self) -> None:
        loop = self._loop
        assert loop is not None
        name_this_thread(f"vtop-{self.name}")
        while not self._stop.is_set():
            started = time.monotonic()
            self.in_flight_since = started
            result: Any = None
            error: BaseException | None = None
            try:
                result = self.fn()
            except Exception as e:  # shown on screen by on_result, never a traceback
                error = e
            self.in_flight_since = None
            ended = time.monotonic()
            if self._stop.is_set():
                return
            self._applied.clear()
            try:
                if self.at_tick:
                    self._ready = (result, error, ended - started)
                else:
                    loop.call_soon_threadsafe(self._deliver, result, error, ended - started)
                if self.on_ready is not None:
                    loop.call_soon_threadsafe(self.on_ready)
            except RuntimeError:  # the app's loop has closed: we are exiting
                return
            self._applied.wait()
            if self.max_polls is not None and self.polls >= self.max_polls:
                return
            if self.at_tick:
                # Applied at a tick: poll again so as to be done just before the next one,
                # so what it shows is fresh (a margin of twice this poll's time, and 50 ms;
                # a poll that slow starts at once, or it would miss every other tick).
                delay = self.interval - (0.05 + 2 * (ended - started))
            else:
                delay = self.interval - (time.monotonic() - started)
            self.last_delay = max(0.0, delay)
            self._wake.wait(self.last_delay)
            self._wake.clear()

    def collect(self) -> bool:
        """On the UI thread: apply the result waiting for it, if one is (``at_tick`` loops).

        The poll thread leaves at most one result and waits until it is applied, so
        nothing is lost or applied twice."""
        ready, self._ready = self._ready, None
        if ready is None:
            return False
        self._deliver(*ready)
        return True

    def _deliver(self, result: Any, error: BaseException | None, duration: float) -> None:
        """On the UI thread."""
        try:
            self.last_duration = duration
            self.polls += 1
            if not self._stop.is_set():
                self.on_result(result, error)
        except Exception as e:  # a bug in a panel must not kill the poller
            try:
                self.on_result(None, e)
            except Exception:
                pass
        finally:
            self._applied.set()
