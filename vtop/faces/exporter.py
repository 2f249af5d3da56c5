"""``vtop export``: what only vtop knows, as Prometheus metrics.

vLLM's ``/metrics`` cannot say which startup phase a server is in, how old its
oldest request is, or that vtop has named a runaway; DCGM cannot either. This
face runs the one :class:`~vtop.monitor.Monitor` headless, fed by
:class:`~vtop.monitor.live.LiveFeed` (NVML, the servers, the log, the rules: the
same pipeline as the screen and ``--once``), and serves vtop's own signals in the
Prometheus text format with ``prometheus_client`` (public API: a custom collector
yielding metric families, served by its WSGI app).

The families are built from the monitor's state *at scrape time*, on the event
loop's thread (the monitor is not thread-safe; the HTTP server's thread asks the
loop and waits). Missing data is an absent sample, never a 0: a GPU field the
driver does not give, a server with no request in flight, a start with no progress
bar. GPU readings older than three poll intervals (a hung NVML call) are left out
rather than repeated; ``vtop_gpu_readings_age_seconds`` says how old they are.

Names (documented in the README; the fleet view reads them):

* ``vtop_startup_phase{server,phase}``: 1 for the phase the start is in, 0 for the
  others (phase: ``process_start`` ... ``ready``, or ``failed``);
  ``vtop_startup_phase_seconds{server}`` how long it has been in it (while starting);
  ``vtop_startup_progress_ratio{server}`` its progress bar (CUDA graphs 23/51:
  0.451); ``vtop_startup_duration_seconds{server}`` launch to ready, once ready.
* ``vtop_oldest_request_age_seconds{server,source}``: how long the oldest request in flight has run
  at least (a lower bound), the one request every face names (:mod:`vtop.core.requests`);
  ``source`` says what proves it: ``log`` (the request log, with vLLM's ``max_tokens`` histogram
  or its end lines), ``connection`` (its answer streaming or not begun, the kernel's counters) or
  ``metrics_bound`` (``/metrics`` alone); ``vtop_request_allowance_tokens{server}`` the
  ``max_tokens`` vLLM gave that request, where known (vLLM fills in ``max_model_len`` minus the
  prompt when the client sent none).
* ``vtop_alert{subject,rule,severity}``: 1 while the alert is on, 0 once it cleared
  (kept at 0 so a rule sees the change, not a vanished series);
  ``vtop_alert_info{subject,rule,severity,title}`` 1 while on, with the title as it
  was when the alert came (its numbers then: the title's live numbers would make a new
  series every second). ``subject``: the server URL, ``gpuN``, or ``box``.
* ``vtop_server_state{server,state}`` (1 for the current state), ``vtop_server_polls_total``;
  ``vtop_server_info{server,engine}`` 1, ``engine`` the engine serving it (``vllm``, ``sglang``: by the
  command line discovery found, else the families its /metrics serves; the same answer as ``--once --json``'s
  ``engine``), absent while not known.
* ``vtop_gpu_*{gpu,uuid}``: the NVML fields vtop reads, in base units (ratios 0-1, bytes,
  watts, celsius, hertz); ``vtop_gpu_throttle{gpu,uuid,reason}``; ``vtop_gpu_lost``.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from vtop import __version__
from vtop.config import Config
from vtop.core.phases.types import Phase
from vtop.core.server import STATES
from vtop.model.gpu import THROTTLE_BITS
from vtop.model.redact import scrub_secrets
from vtop.monitor.live import LiveFeed
from vtop.monitor.monitor import Monitor, make_log_watch, make_recorder

#: ``vtop_startup_phase``'s ``phase`` values, in the order vLLM goes through them
PHASES = tuple(p.value for p in Phase) + ("failed",)
#: ``vtop_alert``'s subject when an alert is about no server or GPU (a start not tied to a server)
BOX = "box"


class ExportState:
    """What the exporter keeps between scrapes: the alerts seen (so a cleared one reads 0)
    and each active alert's title as it first came."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, str, str]] = set()
        self.titles: dict[tuple[str, str, str], str] = {}


def _gauge(name: str, doc: str, labels: Sequence[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def families(monitor: Monitor, state: ExportState | None = None) -> list[Metric]:
    """vtop's signals, from what ``monitor`` knows now (its clock's now)."""
    state = state if state is not None else ExportState()
    now = monitor.clock.monotonic()
    out: list[Metric] = []
    build = InfoMetricFamily("vtop_build", "vtop's version", labels=["version"])
    build.add_metric([__version__], {})
    out.append(build)
    out += _startup(monitor, now)
    out += _requests(monitor, now)
    out += _alerts(monitor, state)
    out += _servers(monitor)
    out += _gpus(monitor)
    return out


def _startup(monitor: Monitor, now: float) -> list[Metric]:
    phase = _gauge("vtop_startup_phase", "1 for the startup phase the server is in (from its log), 0 for the others",
                   ["server", "phase"])
    secs = _gauge("vtop_startup_phase_seconds", "Seconds the start has been in its current phase", ["server"])
    ratio = _gauge("vtop_startup_progress_ratio",
                   "The current phase's progress bar (weight shards, CUDA graphs N/M), 0-1", ["server"])
    total = _gauge("vtop_startup_duration_seconds", "Seconds from launch (or the first log line) to ready",
                   ["server"])
    lv = monitor.log_view
    if lv is not None:
        snap = lv.snapshot
        server = monitor.log_target or ""
        current: str | None = None
        if snap.state == "ready":
            current = Phase.READY.value
        elif snap.state == "failed":
            current = "failed"
        elif snap.state == "starting":
            current = (snap.current or Phase.PROCESS_START).value
        if current is not None:
            for p in PHASES:
                phase.add_metric([server, p], 1.0 if p == current else 0.0)
        if snap.state == "starting":
            if lv.current_elapsed_s is not None:
                secs.add_metric([server], lv.current_elapsed_s + max(0.0, now - lv.mono))
            pv = snap.phase(snap.current) if snap.current is not None else None
            if pv is not None and pv.progress and pv.progress[-1].total:
                ratio.add_metric([server], pv.progress[-1].fraction)
        if snap.state == "ready" and snap.total_s is not None:
            total.add_metric([server], max(0.0, snap.total_s))
    return [phase, secs, ratio, total]


def _requests(monitor: Monitor, now: float) -> list[Metric]:
    age = _gauge("vtop_oldest_request_age_seconds",
                 "Seconds the oldest request in flight has been in flight at least (a lower bound; the request "
                 "every vtop face names; its answer may have gone silent: a frozen engine); source: what proves it (log: the request log with vLLM's max_tokens histogram, "
                 "connection: its connection's counters, metrics_bound: /metrics alone)", ["server", "source"])
    allow = _gauge("vtop_request_allowance_tokens",
                   "max_tokens vLLM gave that oldest request, where known (max_model_len minus the prompt when the "
                   "client sent none)", ["server"])
    for url, answer in monitor.in_flight.items():
        ws = monitor.servers.get(url)
        v = ws.last_view if ws is not None else None
        o = answer.oldest
        if v is None or v.state not in ("up", "restarted", "stale") or o is None or o.age_min_s is None:
            continue
        age.add_metric([url, o.evidence[0]], o.age_min_s)
        if o.max_tokens is not None:
            allow.add_metric([url], float(o.max_tokens))
    return [age, allow]


def _alerts(monitor: Monitor, state: ExportState) -> list[Metric]:
    on = _gauge("vtop_alert", "1 while vtop's alert is on, 0 once it cleared", ["subject", "rule", "severity"])
    info = InfoMetricFamily("vtop_alert", "The title of an alert that is on (as it was when the alert came)",
                            labels=["subject", "rule", "severity", "title"])
    active: dict[tuple[str, str, str], str] = {}
    for a in monitor.alerts:
        key = (a.target or BOX, a.rule, a.severity)
        active.setdefault(key, a.title)
    for key, title in active.items():
        state.seen.add(key)
        state.titles.setdefault(key, scrub_secrets(title))
    for key in [k for k in state.titles if k not in active]:
        del state.titles[key]
    for key in sorted(state.seen):
        on.add_metric(list(key), 1.0 if key in active else 0.0)
        if key in active:
            info.add_metric(list(key), {"title": state.titles[key]})
    return [on, info]


def _servers(monitor: Monitor) -> list[Metric]:
    st = _gauge("vtop_server_state", "1 for the state vtop sees the server in, 0 for the others", ["server", "state"])
    polls = CounterMetricFamily("vtop_server_polls", "Polls of the server's /metrics since vtop started", labels=["server"])
    info = InfoMetricFamily("vtop_server", "The engine serving the server (vllm, sglang)", labels=["server", "engine"])
    for url, ws in monitor.servers.items():
        v = ws.last_view
        if v is None:
            continue
        for s in STATES:
            st.add_metric([url, s], 1.0 if s == v.state else 0.0)
        polls.add_metric([url], float(ws.polls))
        engine = v.engine
        if engine is not None:
            info.add_metric([url, engine], {})
    return [st, polls, info]


#: (name, help, GpuSample field, scale): the NVML readings, in base units
GPU_FIELDS: tuple[tuple[str, str, str, float], ...] = (
    ("vtop_gpu_utilization_ratio", "Share of time a kernel was running (NVML utilization.gpu), 0-1", "util_gpu", 0.01),
    ("vtop_gpu_memory_utilization_ratio", "Share of time the memory controller was busy, 0-1", "util_mem", 0.01),
    ("vtop_gpu_sm_active_ratio", "SM activity over the poll (NVML GPM, Hopper and later), 0-1", "sm_active", 0.01),
    ("vtop_gpu_sm_occupancy_ratio", "SM occupancy over the poll (NVML GPM), 0-1", "sm_occupancy", 0.01),
    ("vtop_gpu_dram_bandwidth_ratio", "DRAM bandwidth utilisation over the poll (NVML GPM), 0-1", "dram_bw", 0.01),
    ("vtop_gpu_memory_used_bytes", "GPU memory in use", "mem_used", 1.0),
    ("vtop_gpu_memory_total_bytes", "GPU memory in all", "mem_total", 1.0),
    ("vtop_gpu_power_watts", "Power draw", "power_w", 1.0),
    ("vtop_gpu_power_limit_watts", "Power limit", "power_limit_w", 1.0),
    ("vtop_gpu_temperature_celsius", "GPU temperature", "temp_c", 1.0),
    ("vtop_gpu_sm_clock_hertz", "SM clock", "sm_clock_mhz", 1e6),
    ("vtop_gpu_memory_clock_hertz", "Memory clock", "mem_clock_mhz", 1e6),
)


def _gpus(monitor: Monitor) -> list[Metric]:
    """The NVML fields; none when the readings are stale (Monitor.gpu_stale_for: a hung NVML call),
    and their age either way."""
    labels = ["gpu", "uuid"]
    fams = {f: _gauge(name, doc, labels) for name, doc, f, _ in GPU_FIELDS}
    info = InfoMetricFamily("vtop_gpu", "The GPU's name", labels=["gpu", "uuid", "name"])
    lost = _gauge("vtop_gpu_lost", "1 when the GPU stopped answering (fell off the bus, driver error)", labels)
    thr = _gauge("vtop_gpu_throttle", "1 for each clock-throttle reason NVML reports, 0 for the others",
                 labels + ["reason"])
    procs = _gauge("vtop_gpu_process_memory_used_bytes", "GPU memory of each compute process on the GPU",
                   labels + ["pid"])
    poll = monitor.gpu_history.last_poll
    age = monitor.gpu_readings_age()
    if age is not None:
        fams["_age"] = _gauge("vtop_gpu_readings_age_seconds", "Seconds since NVML last answered; over "
                              "vtop_gpu_readings_stale_after_seconds the GPU fields are left out (a hung NVML call)", [])
        fams["_age"].add_metric([], age)
        fams["_stale_after"] = _gauge("vtop_gpu_readings_stale_after_seconds", "GPU readings older than this are "
                                      "stale: three poll intervals, at least 3 s", [])
        fams["_stale_after"].add_metric([], monitor.gpu_stale_after_s())
    if poll is not None and poll.gpus and monitor.gpu_stale_for() is None:
        for g in poll.gpus:
            key = [str(g.index), g.uuid or ""]
            info.add_metric(key, {"name": g.name})
            lost.add_metric(key, 1.0 if g.lost else 0.0)
            if g.lost:
                continue
            for _, _, f, scale in GPU_FIELDS:
                val = getattr(g, f)
                if val is not None:
                    fams[f].add_metric(key, float(val) * scale)
            if g.throttle is not None:
                for _, reason in THROTTLE_BITS:
                    thr.add_metric(key + [reason], 1.0 if reason in g.throttle else 0.0)
            for p in g.procs or ():
                if p.used_bytes is not None:
                    procs.add_metric(key + [str(p.pid)], float(p.used_bytes))
    return [info, lost, *fams.values(), thr, procs]


class MonitorCollector(Collector):
    """A ``prometheus_client`` collector over one monitor. With ``loop``, :meth:`collect`
    (called in the HTTP server's thread) builds the families on that event loop's thread,
    where the monitor lives, and waits for them; without, it builds them where it is called."""

    def __init__(self, monitor: Monitor, loop: asyncio.AbstractEventLoop | None = None,
                 timeout_s: float = 10.0) -> None:
        self.monitor = monitor
        self.loop = loop
        self.timeout_s = timeout_s
        self.state = ExportState()
        self.scrapes = 0

    def _build(self) -> list[Metric]:
        self.scrapes += 1
        return families(self.monitor, self.state)

    def collect(self) -> Iterable[Metric]:
        if self.loop is None:
            return self._build()

        async def build() -> list[Metric]:
            return self._build()

        return asyncio.run_coroutine_threadsafe(build(), self.loop).result(self.timeout_s)


# --- serving ------------------------------------------------------------------------


def parse_listen(spec: str) -> tuple[str, int]:
    """``127.0.0.1:9400``, ``[::1]:9400``, ``:9400`` (loopback) -> (host, port); ValueError with a plain message."""
    host, sep, port = spec.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen: expected HOST:PORT (e.g. 127.0.0.1:9400), got {spec!r}")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


class HttpServer:
    """The WSGI app (``prometheus_client.make_wsgi_app``) on a stdlib threading WSGI server, in a
    daemon thread; no request log on stderr."""

    def __init__(self, host: str, port: int, app: Callable[..., Any]) -> None:
        from socketserver import ThreadingMixIn
        from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

        family = socket.AF_INET6 if ":" in host else socket.AF_INET

        class Server(ThreadingMixIn, WSGIServer):
            daemon_threads = True
            address_family = family

        class Quiet(WSGIRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
                pass

        self.httpd = make_server(host, port, app, server_class=Server, handler_class=Quiet)
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="vtop-export-http", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


async def serve(cfg: Config, host: str, port: int, *, out: Any = None, gpu_source: Any = "auto",
                stop: asyncio.Event | None = None, on_ready: Callable[[HttpServer, Monitor], None] | None = None) -> int:
    """Run the monitor live and serve its signals until ``stop`` is set (SIGINT/SIGTERM set it)."""
    import signal

    from prometheus_client import make_wsgi_app

    out = out or sys.stdout
    recorder = make_recorder(cfg, mode="export")
    monitor = Monitor(cfg, recorder=recorder)
    monitor.log_watch = make_log_watch(cfg, clock=monitor.clock)
    if monitor.log_watch is not None:
        monitor.log_watch.recorder = recorder
    if isinstance(gpu_source, str):
        from vtop.sources.nvml import make_gpu_source

        gpu_source = make_gpu_source(cfg)
    feed = LiveFeed(monitor, gpu_source=gpu_source)
    loop = asyncio.get_running_loop()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MonitorCollector(monitor, loop))
    http = HttpServer(host, port, make_wsgi_app(registry))
    shown = f"[{host}]" if ":" in host else host
    out.write(f"vtop export: serving http://{shown}:{http.port}/metrics (every {cfg.interval:g} s; Ctrl+C stops)\n")
    out.flush()
    stop = stop or asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread (tests)
            pass
    if on_ready is not None:
        on_ready(http, monitor)
    feed.start()
    try:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), cfg.interval)
            except asyncio.TimeoutError:
                pass
            feed.collect()
            monitor.tick()
    finally:
        http.close()
        await feed.aclose()
        if recorder is not None:
            recorder.close()
    return 0


def parser() -> argparse.ArgumentParser:
    from vtop.config import add_api_key_flag
    from vtop.exitcodes import EXIT_USAGE
    from vtop.exitcodes import UsageParser as Parser

    S = argparse.SUPPRESS

    p = Parser(prog="vtop export",
               description=("Run vtop headless (NVML, the servers, the log, the rules) and serve what only vtop "
                            "knows as Prometheus metrics: startup phases, the oldest request's age, vtop's alerts, "
                            "the GPU fields (names in the README)."))
    p.add_argument("urls", nargs="*", metavar="URL", default=S,
                   help="vLLM server(s); default: the ones running on this box")
    p.add_argument("--listen", default="127.0.0.1:9400", metavar="HOST:PORT",
                   help="where to serve /metrics (default 127.0.0.1:9400; port 0 picks a free one)")
    p.add_argument("--interval", default=S, metavar="SECONDS", help="seconds between polls (default 1)")
    p.add_argument("--log", default=S, metavar="PATH", help="the vLLM log (default: found from the process)")
    p.add_argument("--no-gpu", dest="no_gpu", action="store_true", default=S, help="do not use NVML")
    p.add_argument("--simulate-gpus", dest="simulate_gpus", type=int, default=S, metavar="N",
                   help="N simulated GPUs instead of NVML (demos and benchmarks)")
    add_api_key_flag(p, EXIT_USAGE)
    p.add_argument("--stall-threshold", dest="stall_threshold", default=S, metavar="DURATION",
                   help="flag a start that prints nothing and makes no progress this long (default 10m)")
    p.add_argument("--runaway-threshold", dest="runaway_threshold", default=S, metavar="DURATION",
                   help="flag a runaway decode after this long with nothing finishing (default 2m)")
    p.add_argument("--record", default=S, metavar="FILE", help="also record everything read to FILE")
    p.add_argument("--config", dest="config_file", default=None, metavar="FILE",
                   help="config file to read instead of the default")
    return p


def main(argv: Sequence[str]) -> int:
    """``vtop export ...``: bad input ends with one line and exit status 3."""
    from vtop.config import ConfigError, build
    from vtop.exitcodes import EXIT_USAGE

    p = parser()
    ns = vars(p.parse_args(list(argv)))
    listen = ns.pop("listen")
    config_file = ns.pop("config_file", None)
    if "urls" in ns:
        ns["urls"] = tuple(ns["urls"])
    try:
        host, port = parse_listen(listen)
        cfg = build(ns, config_file=config_file)
    except (ValueError, ConfigError) as e:
        p.exit(EXIT_USAGE, f"vtop export: error: {e}\n")
    if cfg.log == "-":
        p.exit(EXIT_USAGE, "vtop export: error: export reads the log from a file; pass --log PATH\n")
    from vtop.sources.recording.record import RecordingBusy

    try:
        return asyncio.run(serve(cfg, host, port))
    except RecordingBusy as e:
        p.exit(EXIT_USAGE, f"vtop export: error: {e}\n")
    except OSError as e:  # the port is taken, the address is not this box's, the record file
        p.exit(EXIT_USAGE, f"vtop export: error: cannot serve on {listen}: {e.strerror or e}\n")
    except KeyboardInterrupt:
        return 130
