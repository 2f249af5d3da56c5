"""Headless vtop: ``vtop --once`` / ``--json`` and ``vtop doctor``, no Textual.

The same sources and the same pure core as the dashboard (NVML, process
discovery, the ``/metrics`` scraper, the log tail with its phase and request
trackers, the diagnosis rules), run for a short window and turned into one
:class:`Report`, printed as plain text for an incident channel or as JSON for
scripts (schema: ``vtop/schema/report-v1.schema.json``, ``"schema":
"vtop.report/1"``).

Exit status: 0 when nothing is wrong, 1 when a watched server is down (or its
engine dead) or an alert is critical, 2 for bad input. So
``vtop --once || page-someone`` works.

Threads and timeouts: NVML, the process table and the log are read in
threads (``asyncio.to_thread``); HTTP is async with the scraper's timeouts;
each step of the loop waits for all of them, so polls never overlap.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from vtop import __version__
from vtop.clock import Clock, SystemClock
from vtop.config import Config, ConfigError, build, parse_duration
from vtop.core.gpu_history import GpuHistory
from vtop.core.server import UNKNOWN, ServerTracker, ServerView
from vtop.sources.discovery import ServerProcess, discover_servers
from vtop.sources.gpu import GpuPoll
from vtop.sources.urls import FALLBACK_URL, LOCAL_HOSTS, normalize_url, url_hostport, url_matches

SCHEMA = "vtop.report/1"
MAX_REQUESTS = 50
EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2


@dataclass
class Report:
    """What one headless run saw; :meth:`to_json` follows the v1 schema."""

    t: float
    window_s: float
    host: str
    gpu_status: str
    gpu_message: str | None
    gpus: list[dict[str, Any]]
    servers: list[dict[str, Any]]
    startup: dict[str, Any] | None
    requests: list[dict[str, Any]]
    alerts: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    requests_in_flight: int | None = None

    @property
    def exit_code(self) -> int:
        if any(a.get("severity") == "critical" for a in self.alerts):
            return EXIT_PROBLEM
        if any(s.get("state") in ("down", "engine dead") for s in self.servers):
            return EXIT_PROBLEM
        return EXIT_OK

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "vtop": __version__,
            "t": round(self.t, 3),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.t)),
            "host": self.host,
            "window_s": round(self.window_s, 3),
            "gpu": {"status": self.gpu_status, "message": self.gpu_message, "gpus": self.gpus},
            "servers": self.servers,
            "startup": self.startup,
            "requests": self.requests,
            "requests_in_flight": self.requests_in_flight,
            "alerts": self.alerts,
            "notes": self.notes,
            "exit_code": self.exit_code,
        }


def _r(x: float | None, nd: int = 1) -> float | None:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None
    return round(float(x), nd)


def _mean(vals: list[float]) -> float | None:
    return sum(vals) / len(vals) if vals else None


def gpu_rows(hist: GpuHistory, since: float, names: dict[int, str]) -> list[dict[str, Any]]:
    out = []
    for idx in sorted(hist.tracks):
        tr = hist.tracks[idx]
        g = tr.last
        if g is None:
            continue

        def window(key: str) -> float | None:
            return _r(_mean([v for t, v in tr.series[key] if t >= since and v is not None]))

        out.append({
            "index": idx,
            "name": g.name,
            "lost": g.lost,
            "util_pct": _r(g.util_gpu),
            "util_mean_pct": window("util"),
            "sm_active_pct": _r(g.sm_active),
            "sm_active_mean_pct": window("sm"),
            "mem_used_bytes": g.mem_used,
            "mem_total_bytes": g.mem_total,
            "mem_pct": _r(g.mem_pct),
            "power_w": _r(g.power_w),
            "power_limit_w": _r(g.power_limit_w),
            "temp_c": _r(g.temp_c),
            "throttle": list(g.throttle) if g.throttle is not None else None,
            "processes": [{"pid": p.pid, "used_bytes": p.used_bytes, "name": names.get(p.pid)}
                          for p in (g.procs or ())],
        })
    return out


def server_row(v: ServerView, process: Any) -> dict[str, Any]:
    m = v.metrics if v.is_live or v.state == "stale" else None
    row: dict[str, Any] = {
        "url": v.url,
        "state": v.state,
        "message": v.message,
        "model": v.model_id,
        "version": v.version,
        "max_model_len": v.max_model_len,
        "running": _r(m.running, 0) if m else None,
        "waiting": _r(m.waiting, 0) if m else None,
        "kv_cache_pct": _r(100.0 * m.kv_cache_usage) if m and m.kv_cache_usage is not None else None,
        "gen_tokens_per_s": _r(v.gen_tps),
        "prompt_tokens_per_s": _r(v.prompt_tps),
        "preemptions_per_s": _r(v.preemptions_ps, 2),
        "ttft_p50_s": _r(v.ttft.p50, 3),
        "ttft_p95_s": _r(v.ttft.p95, 3),
        "itl_p50_s": _r(v.itl.p50, 4),
        "finished_in_window": dict(v.finished) if v.finished is not None else None,
        "rate_window_s": v.window_s,
        "pid": getattr(process, "pid", None) if process not in (None, UNKNOWN) else None,
        "restarts": v.restarts,
    }
    return row


class Collector:
    """Polls every source once per interval for a window, feeding the shared core."""

    def __init__(self, config: Config, *, gpu_source: Any = "auto", clock: Clock | None = None,
                 discover: Callable[[], list[ServerProcess]] | None = discover_servers,
                 log_watch: Any = "auto") -> None:
        from vtop.core.diagnose import Diagnoser, Thresholds

        self.config = config
        self.clock = clock or SystemClock()
        self.discover = discover
        if isinstance(gpu_source, str):
            from vtop.sources.nvml import make_gpu_source

            gpu_source = make_gpu_source(config)
        self.gpu_source = gpu_source
        self.gpu_history = GpuHistory(max(config.history, 60.0))
        self.proc_names: dict[int, str] = {}
        self.processes: list[ServerProcess] = []
        self.trackers: dict[str, ServerTracker] = {}
        self.scrapers: dict[str, Any] = {}
        self.proc_of: dict[str, Any] = {}
        self.log_watch = None if log_watch == "auto" else log_watch
        self._log_auto = log_watch == "auto"
        self.log_view: Any = None
        self.diagnoser = Diagnoser(Thresholds(runaway_s=config.runaway_threshold))
        self.alerts: list[Any] = []
        self._alerts_key: Any = None
        self.notes: list[str] = []
        self.recorder: Any = None
        self._client: Any = None
        self._names: Any = None

    # -- set-up --
    async def _setup(self) -> None:
        from vtop.sources.http11 import HttpPool
        from vtop.sources.vllm import VllmScraper

        if self.discover is not None:
            try:
                self.processes = await asyncio.to_thread(self.discover)
            except Exception as e:  # the process table may be denied: go on with the URLs
                self.notes.append(f"process discovery failed: {type(e).__name__}: {e}")
        if self.recorder is not None:
            self.recorder.processes(self.clock.time(), self.clock.monotonic(), self.processes)
        urls = [normalize_url(u) for u in self.config.urls]
        if not urls:
            urls = [sp.url for sp in self.processes] or [FALLBACK_URL]
        self._client = HttpPool()
        import os

        api_key = self.config.api_key or os.environ.get("VLLM_API_KEY") or None
        for url in dict.fromkeys(urls):
            proc = next((sp for sp in self.processes if url_matches(url, sp)), None)
            host, _ = url_hostport(url)
            self.proc_of[url] = proc if (proc is not None or host in LOCAL_HOSTS) and self.discover else UNKNOWN
            key = api_key or (proc.api_key if proc is not None else None)
            self.scrapers[url] = VllmScraper(url, client=self._client, api_key=key, clock=self.clock)
            self.trackers[url] = ServerTracker(url, window_s=60.0, history_s=max(self.config.history, 600.0),
                                               clock=self.clock, interval_s=self.config.interval)
        if self._log_auto:
            self._open_log()

    def _open_log(self) -> None:
        from vtop.sources.logtail import LogTailer
        from vtop.sources.logwatch import LogWatch

        cfg = self.config
        sp = next((p for p in self.proc_of.values() if isinstance(p, ServerProcess)), None)
        kw: dict[str, Any] = {"clock": self.clock, "stall_threshold_s": cfg.stall_threshold}
        if cfg.log and cfg.log != "-":
            self.log_watch = LogWatch(LogTailer(cfg.log), **kw)
            if sp is not None:
                self.log_watch.mark_launch_of(sp)
        elif sp is not None:
            self.log_watch, where = LogWatch.for_server(sp, **kw)
            if self.log_watch is None:
                self.notes.append(f"vLLM log: {where}")
        if self.log_watch is not None:
            self.log_watch.recorder = self.recorder

    # -- one step --
    def _gpu_blocking(self) -> tuple[GpuPoll, dict[int, str]]:
        from vtop.sources.procs import ProcNames

        poll = self.gpu_source.poll()
        if self._names is None:
            self._names = ProcNames()
        names = self._names.names_for((p.pid for g in poll.gpus for p in (g.procs or ())), poll.mono)
        if self.recorder is not None:
            self.recorder.gpu(poll, names)
        return poll, names

    async def step(self) -> None:
        jobs: list[Any] = []
        if self.gpu_source is not None:
            jobs.append(asyncio.to_thread(self._gpu_blocking))
        else:
            jobs.append(asyncio.sleep(0, result=None))
        if self.log_watch is not None:
            jobs.append(asyncio.to_thread(self.log_watch.poll))
        else:
            jobs.append(asyncio.sleep(0, result=None))
        jobs.extend(s.poll() for s in self.scrapers.values())
        results = await asyncio.gather(*jobs, return_exceptions=True)
        gpu_res, log_res, polls = results[0], results[1], results[2:]
        if isinstance(gpu_res, tuple):
            poll, self.proc_names = gpu_res
            self.gpu_history.add(poll)
        elif isinstance(gpu_res, BaseException):
            self.notes.append(f"GPU poll failed: {type(gpu_res).__name__}: {gpu_res}")
        if log_res is not None and not isinstance(log_res, BaseException):
            self.log_view = log_res
        for url, poll in zip(self.scrapers, polls):
            if isinstance(poll, BaseException):
                continue
            if self.recorder is not None:
                self.recorder.server(poll, fed=self.clock.monotonic())
            tr = self.trackers[url]
            tr.feed(poll, process=self.proc_of.get(url, UNKNOWN))
            v = tr.view()
            if self.log_watch is not None and v.health == 200 and v.state in ("up", "restarted"):
                self.log_watch.mark_ready(self.clock.monotonic())
            if self.log_watch is not None and url == next(iter(self.trackers)):
                self.log_watch.note_server(v, self.clock.monotonic())
        self._diagnose()

    def views(self) -> dict[str, ServerView]:
        return {url: tr.view() for url, tr in self.trackers.items()}

    def _diagnose(self) -> None:
        gpus = self.gpu_history if self.gpu_history.tracks else None
        first = next(iter(self.trackers), None)
        self.alerts = self.diagnoser.update_from(self.clock.monotonic(), servers=self.views(), gpus=gpus,
                                                 log=self.log_view, log_target=first)
        key = tuple((a.rule, a.severity, a.target) for a in self.alerts)
        if self.recorder is not None and key != self._alerts_key:  # as the dashboard: when they change
            self._alerts_key = key
            self.recorder.alerts(self.clock.time(), self.clock.monotonic(), [a.to_json() for a in self.alerts])

    async def run(self, window_s: float) -> Report:
        started = self.clock.monotonic()
        try:
            await self._setup()
            while True:
                t0 = self.clock.monotonic()
                await self.step()
                if t0 - started + self.config.interval > window_s:
                    break
                await asyncio.sleep(max(0.0, self.config.interval - (self.clock.monotonic() - t0)))
        finally:
            if self._client is not None:
                await self._client.aclose()
            if self.gpu_source is not None:
                try:
                    self.gpu_source.close()
                except Exception:
                    pass
            if self.log_watch is not None:
                self.log_watch.close()
        return self.report(started)

    def report(self, started: float) -> Report:
        from vtop.core.phases import summarize

        poll = self.gpu_history.last_poll
        lv = self.log_view
        startup = None
        if lv is not None:
            startup = dict(summarize(lv.snapshot))
            startup["stalled"] = None if lv.stall is None else lv.stall.label
            startup["log"] = lv.tail.source
        reqs = []
        inflight = list(getattr(lv, "inflight", None) or ())
        # The runaway first (a request the client sent without max_tokens), then the
        # oldest; a burst of 1,500 must not make a 260 KB report.
        inflight.sort(key=lambda r: (not r.no_client_max_tokens, r.since))
        for r in inflight[:MAX_REQUESTS]:
            reqs.append({"id": r.request_id, "endpoint": r.endpoint, "age_s": _r(r.age_s),
                         "age_is_upper_bound": r.age_is_upper_bound, "max_tokens": r.max_tokens,
                         "no_client_max_tokens": r.no_client_max_tokens})
        return Report(
            t=self.clock.time(),
            window_s=self.clock.monotonic() - started,
            host=socket.gethostname(),
            gpu_status=poll.status if poll else ("off" if self.gpu_source is None else "none"),
            gpu_message=poll.message if poll else None,
            gpus=gpu_rows(self.gpu_history, started, self.proc_names),
            servers=[server_row(v, self.proc_of.get(url)) for url, v in self.views().items()],
            startup=_jsonable(startup),
            requests=reqs,
            requests_in_flight=len(inflight) if lv is not None and lv.request_logging else None,
            alerts=[a.to_json() for a in self.alerts],
            notes=list(dict.fromkeys(self.notes)),
        )


def _jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, default=str)) if x is not None else None


# --- text ------------------------------------------------------------------------


def _gib(b: Any) -> str:
    return "?" if b is None else f"{b / 2**30:.1f}"


def _v(x: Any, unit: str = "") -> str:
    if x is None:
        return "-"
    if isinstance(x, (int, float)) and abs(x) >= 100:
        return f"{x:,.0f}{unit}"
    return f"{x:g}{unit}"


def format_text(rep: Report, *, doctor: bool = False) -> str:
    """Plain text, at most 80 columns wide except for long messages, no colour."""
    d = rep.to_json()
    lines = [f"vtop {__version__} on {rep.host} at {d['time']} ({rep.window_s:.0f} s window)"]
    if rep.gpus:
        for g in rep.gpus:
            if g["lost"]:
                lines.append(f"GPU {g['index']} {g['name']}: LOST (fell off the bus or driver error)")
                continue
            sm = f" SM {_v(g['sm_active_pct'], '%')}" if g["sm_active_pct"] is not None else ""
            lines.append(f"GPU {g['index']} {g['name']}: util {_v(g['util_pct'], '%')}{sm} "
                         f"mem {_gib(g['mem_used_bytes'])}/{_gib(g['mem_total_bytes'])} GiB "
                         f"{_v(g['power_w'], ' W')} {_v(g['temp_c'], ' C')}")
    else:
        lines.append(f"GPU: {rep.gpu_message or rep.gpu_status}")
    for s in rep.servers:
        head = f"vLLM {s['url']}: {s['state'].upper()}"
        if s["model"]:
            head += f" {s['model']}"
        if s["version"]:
            head += f" v{s['version']}"
        lines.append(head)
        if s["running"] is not None:
            lines.append(f"  running {_v(s['running'])} waiting {_v(s['waiting'])} KV {_v(s['kv_cache_pct'], '%')} "
                         f"gen {_v(s['gen_tokens_per_s'])} tok/s prompt {_v(s['prompt_tokens_per_s'])} tok/s")
        if s["state"] != "up":
            lines.append(f"  {s['message']}")
    st = rep.startup
    if st and st.get("state") == "starting":
        lines.append(f"startup: {st.get('current') or 'starting'} ({st.get('log')})"
                     + (f" STALLED: {st['stalled']}" if st.get("stalled") else ""))
    if rep.requests_in_flight:
        lines.append(f"requests in flight (request log): {rep.requests_in_flight}")
    for r in rep.requests[:5]:
        age = ("<=" if r["age_is_upper_bound"] else "") + f"{r['age_s']:.0f}s"
        flag = " (no max_tokens from client)" if r["no_client_max_tokens"] else ""
        lines.append(f"  request {r['id']} {r['endpoint'] or ''} age {age} max_tokens {r['max_tokens']}{flag}")
    if rep.alerts:
        lines.append("")
        for a in rep.alerts:
            lines.append(f"[{a['severity'].upper()}] {a['title']}")
            for e in a.get("evidence") or ():
                lines.append(f"    - {e}")
            for fx in a.get("fix") or ():
                lines.append(f"    fix: {fx}")
    else:
        lines.append("no alerts" if doctor else "alerts: none")
    for n in rep.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines) + "\n"


# --- entry points ------------------------------------------------------------------


def run_once(cfg: Config, *, window_s: float, as_json: bool, doctor: bool = False, out: Any = None) -> int:
    out = out or sys.stdout
    col = Collector(cfg)
    if cfg.record:
        from vtop.sources.record import Recorder

        col.recorder = Recorder(cfg.record, max_bytes=cfg.record_max_mb * 2**20, redact_prompts=cfg.redact_prompts,
                                meta={"interval": cfg.interval, "history": cfg.history,
                                      "mode": "doctor" if doctor else "once"})
    try:
        rep = asyncio.run(col.run(window_s))
    except KeyboardInterrupt:
        return 130
    finally:
        if col.recorder is not None:
            col.recorder.close()
    if as_json:
        out.write(json.dumps(rep.to_json(), indent=2) + "\n")
    else:
        out.write(format_text(rep, doctor=doctor))
    return rep.exit_code


def doctor_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(
        prog="vtop doctor",
        description=("Watch for a short window, then say what is wrong and what to do. "
                     "Exit 1 when an alert is critical or a server is down."),
    )
    p.add_argument("urls", nargs="*", metavar="URL", help="vLLM server(s); default: the ones running on this box")
    p.add_argument("--window", default="15s", help="how long to watch (default 15s)")
    p.add_argument("--json", action="store_true", help="print the report as JSON (schema vtop.report/1)")
    p.add_argument("--log", default=None, metavar="PATH", help="the vLLM log (default: found from the process)")
    p.add_argument("--interval", default="1s", help="seconds between polls (default 1)")
    p.add_argument("--no-gpu", action="store_true", help="do not use NVML")
    p.add_argument("--runaway-threshold", default=None, metavar="DURATION",
                   help="flag a runaway decode after this long with nothing finishing (default 2m)")
    p.add_argument("--record", default=None, metavar="FILE", help="also record the window to FILE")
    ns = p.parse_args(argv)
    try:
        window = parse_duration(ns.window, "window")
        flags: dict[str, Any] = {"interval": ns.interval, "no_gpu": ns.no_gpu}
        if ns.urls:
            flags["urls"] = tuple(ns.urls)
        if ns.log:
            flags["log"] = ns.log
        if ns.runaway_threshold:
            flags["runaway_threshold"] = ns.runaway_threshold
        if ns.record:
            flags["record"] = ns.record
        cfg = build(flags)
    except ConfigError as e:
        p.exit(EXIT_USAGE, f"vtop doctor: error: {e}\n")
    if window <= 0:
        p.exit(EXIT_USAGE, "vtop doctor: error: --window must be positive\n")
    return run_once(cfg, window_s=window, as_json=ns.json, doctor=True)
