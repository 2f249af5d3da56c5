"""``vtop watch``: the monitor headless until stopped, one line per change of an incident.

The same pipeline as every face (:class:`~vtop.monitor.live.LiveFeed` polling NVML, the servers, the
log into a :class:`~vtop.monitor.Monitor`, the rules and their hysteresis), with no screen: each
start, severity change and clear of an incident is printed on stdout as one line
(``2026-12-05T00:12:03Z START [CRITICAL] Engine stall on :8000: ...``) and handed to the alert
delivery (:mod:`vtop.actions.alerts_out`: ``--on-alert CMD``, ``--webhook URL``), which sends it off
the tick, in threads with deadlines. A delivery that fails is said once on stderr (and once more when
it works again); what vtop could not read (a source that fails) is said on stderr as it comes.

Runs until SIGINT or SIGTERM (a systemd unit: ``docs/watch.md``); then the messages still waiting
get a few seconds to go, and it exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from vtop.actions.alerts_out import AlertEvent, Delivery, IncidentChanges, delivery_for
from vtop.config import Config
from vtop.model.redact import redact_url
from vtop.monitor.live import LiveFeed
from vtop.monitor.monitor import Monitor, make_log_watch, make_recorder

#: seconds the messages still waiting get to go when vtop watch stops
DRAIN_S = 5.0


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class Watch:
    """One run of ``vtop watch`` (tests drive :meth:`run` with their own ``stop`` and read the counts)."""

    def __init__(self, cfg: Config, *, out: Any = None, err: Any = None, gpu_source: Any = "auto",
                 delivery: Delivery | None | str = "auto") -> None:
        self.cfg = cfg
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.gpu_source = gpu_source
        self.delivery: Delivery | None = delivery_for(cfg) if isinstance(delivery, str) else delivery
        self.changes = self.delivery.changes if self.delivery is not None else IncidentChanges(
            min_severity=cfg.alert_min_severity)
        self.monitor: Monitor | None = None
        self.ticks = 0
        #: seconds each tick took (collect, the rules, the delivery's hand-off, the printing): the last 10,000
        self.tick_s: deque[float] = deque(maxlen=10_000)
        self.events: list[AlertEvent] = []
        self.on_tick: list[Callable[[Watch], None]] = []
        self._notes_said = 0

    def say(self, line: str) -> None:
        self.err.write(f"vtop watch: {line}\n")
        self.err.flush()

    def _targets_text(self) -> str:
        if self.delivery is None:
            return "alerts on stdout only (no --on-alert, no --webhook)"
        return "alerts to " + ", ".join(self.delivery.labels)

    async def run(self, stop: asyncio.Event | None = None) -> int:
        cfg = self.cfg
        recorder = make_recorder(cfg, mode="watch")
        monitor = self.monitor = Monitor(cfg, recorder=recorder)
        monitor.log_watch = make_log_watch(cfg, clock=monitor.clock)
        if monitor.log_watch is not None:
            monitor.log_watch.recorder = recorder
        gpu_source = self.gpu_source
        if isinstance(gpu_source, str):
            from vtop.sources.nvml import make_gpu_source

            gpu_source = make_gpu_source(cfg)
        feed = LiveFeed(monitor, gpu_source=gpu_source)
        loop = asyncio.get_running_loop()
        stop = stop or asyncio.Event()
        handled = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
                handled.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread (tests)
                pass
        where = ", ".join(redact_url(u) for u in cfg.urls) or "the vLLM servers on this box"
        self.say(f"watching {where} every {cfg.interval:g} s; {self._targets_text()}; "
                 f"incidents of {cfg.alert_min_severity} and worse; Ctrl+C stops")
        feed.start()
        try:
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), cfg.interval)
                except asyncio.TimeoutError:
                    pass
                self.tick(feed, monitor)
        finally:
            for sig in handled:  # a caller's loop (tests) gets its signals back
                loop.remove_signal_handler(sig)
            await feed.aclose()
            if recorder is not None:
                recorder.close()
            if self.delivery is not None:
                left = await asyncio.to_thread(self.delivery.close, DRAIN_S)
                self._say_notices()
                if left:
                    self.say(f"stopped with {left} alert message(s) not sent")
        return 0

    def tick(self, feed: LiveFeed, monitor: Monitor) -> None:
        """One round: take what the sources brought, run the rules, hand the changes on, print them."""
        t0 = time.perf_counter()
        feed.collect()
        monitor.tick()
        if self.delivery is not None:
            evs = self.delivery.observe_monitor(monitor)
        else:
            clock = monitor.clock
            evs = self.changes.observe(monitor.alerts, clock.monotonic(), clock.time(),
                                       monitor.diagnoser.thresholds.alert_clear_hold_s)
        for ev in evs:
            self.out.write(f"{_iso(ev.at)} {ev.headline()}\n")
        if evs:
            self.out.flush()
            self.events += evs
        self._say_notices()
        notes = monitor.notes
        if len(notes) > self._notes_said:
            for n in dict.fromkeys(notes[self._notes_said:]):
                self.say(n)
            self._notes_said = len(notes)
        self.tick_s.append(time.perf_counter() - t0)
        self.ticks += 1
        for cb in self.on_tick:
            cb(self)

    def _say_notices(self) -> None:
        if self.delivery is not None:
            for line in self.delivery.take_notices():
                self.say(line)


def parser() -> argparse.ArgumentParser:
    from vtop.config import add_api_key_flag, add_delivery_flags
    from vtop.exitcodes import EXIT_USAGE
    from vtop.exitcodes import UsageParser as Parser

    S = argparse.SUPPRESS

    p = Parser(prog="vtop watch",
               description=("Run vtop headless until stopped (NVML, the servers, the log, the rules) and print one "
                            "line per start, severity change and clear of an incident; with --on-alert and "
                            "--webhook, deliver each one too. A systemd unit: docs/watch.md."))
    p.add_argument("urls", nargs="*", metavar="URL", default=S,
                   help="vLLM server(s); default: the ones running on this box")
    p.add_argument("--interval", default=S, metavar="SECONDS", help="seconds between polls (default 1)")
    p.add_argument("--log", default=S, metavar="PATH", help="the vLLM log (default: found from the process)")
    p.add_argument("--no-gpu", dest="no_gpu", action="store_true", default=S, help="do not use NVML")
    add_api_key_flag(p, EXIT_USAGE)
    add_delivery_flags(p)
    p.add_argument("--stall-threshold", dest="stall_threshold", default=S, metavar="DURATION",
                   help="flag a start that prints nothing and makes no progress this long (default 10m)")
    p.add_argument("--runaway-threshold", dest="runaway_threshold", default=S, metavar="DURATION",
                   help="flag a runaway decode after this long with nothing finishing (default 2m)")
    p.add_argument("--record", default=S, metavar="FILE", help="also record everything read to FILE")
    p.add_argument("--config", dest="config_file", default=None, metavar="FILE",
                   help="config file to read instead of the default")
    return p


def main(argv: Sequence[str]) -> int:
    """``vtop watch ...``: bad input ends with one line and exit status 3."""
    from vtop.config import ConfigError, build
    from vtop.exitcodes import EXIT_USAGE

    p = parser()
    ns = vars(p.parse_args(list(argv)))
    config_file = ns.pop("config_file", None)
    if "urls" in ns:
        ns["urls"] = tuple(ns["urls"])
    try:
        cfg = build(ns, config_file=config_file)
        face = Watch(cfg)
    except (ValueError, ConfigError) as e:
        p.exit(EXIT_USAGE, f"vtop watch: error: {e}\n")
    if cfg.log == "-":
        p.exit(EXIT_USAGE, "vtop watch: error: watch reads the log from a file; pass --log PATH\n")
    from vtop.sources.recording.record import RecordingBusy

    try:
        return asyncio.run(face.run())
    except RecordingBusy as e:
        p.exit(EXIT_USAGE, f"vtop watch: error: {e}\n")
    except OSError as e:
        p.exit(EXIT_USAGE, f"vtop watch: error: {e.strerror or e}\n")
    except KeyboardInterrupt:
        return 130
