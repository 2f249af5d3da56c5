"""Headless vtop: ``vtop --once`` / ``--json`` and ``vtop doctor``, no Textual.

The same pipeline as the dashboard: :class:`~vtop.monitor.live.LiveFeed` polls
the sources (NVML, process discovery, the ``/metrics`` scraper, the log tail)
into a :class:`~vtop.monitor.Monitor` (trackers, the diagnosis rules) for a
short window, and what it knows is turned into one
:class:`Report`, printed as plain text for an incident channel or as JSON for
scripts (schema: ``vtop/schema/report-v2.schema.json``, ``"schema":
"vtop.report/2"``).

Exit status, the convention of the monitoring plugins (Nagios, Icinga, Sensu
checks) that on-call tooling already understands: **0** OK; **1** warning (an
alert of warning severity); **2** critical (a critical alert, or a watched server
down or its engine dead); **3** unknown (vtop could not look: bad usage, a bad
config, a recording it cannot read, no source answered in the window, a source that
never answered (a hung NVML call), or a server whose /metrics is not vLLM's). So
``vtop doctor || page-someone`` pages on a warning too, and a check runner maps
the status as it does for its plugins. ``exit_code`` in the JSON is the same.

The log's history: the monitor reads the vLLM log from its last startup (or its
last MiB) before the window begins, and :mod:`vtop.core.loghistory` turns its
stamped stats lines into history the rules judge (running, waiting, KV usage,
throughput every 10 s), so a 15 s window still names a runaway, a stall or a KV
saturation that began minutes before it.

Threads and timeouts: NVML, the process table and the log are read in daemon
threads, HTTP is async with the scraper's deadlines; after the window each
source gets a short deadline for its first answer, and one that gives none is
named in the notes and in ``silent_sources`` (exit 3 without an alert): a hung call
never hangs ``--once`` (NVML's shutdown gives up after 1 s when a poll still holds it).
A server whose scrapes time out (it accepts and does not answer) is waited for until
the ``api_unresponsive`` rule can judge it (6 s of silence), so it is named, not STALE.

``vtop replay FILE --doctor`` plays a recording through the same monitor and
prints when each alert came and went.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from vtop import __version__
from vtop.config import Config
from vtop.core.engines import flags_of
from vtop.core.gpu_history import GpuHistory
from vtop.core.server import UNKNOWN, ServerView
from vtop.exitcodes import EXIT_CRITICAL, EXIT_OK, EXIT_UNKNOWN, EXIT_WARNING
from vtop.model.fmt import dur
from vtop.model.requests import EVIDENCE_WORDS, InFlightRequest, ServerRequests, dur_text, silent_words, state_word
from vtop.monitor.live import LiveFeed
from vtop.monitor.monitor import Monitor, make_log_watch, make_recorder

SCHEMA = "vtop.report/2"
GPU_SOURCE = "NVML (GPU readings)"
MAX_REQUESTS = 50
#: Said by ``--once`` without ``--window`` when a server's rates are None.
ONE_ROUND_NOTE = ("rates (tokens/s, preemptions/s, latency percentiles) need two scrapes: "
                  "vtop --once --window 2s measures them")
__all__ = ["EXIT_CRITICAL", "EXIT_OK", "EXIT_UNKNOWN", "EXIT_WARNING", "Report", "report", "request_words", "requests_text", "run_once"]


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
    requests_received_recent: int | None = None
    """The followed log's requests received in the last 10 s, where it logs no end lines."""
    window_asked_s: float | None = None
    """The window the user asked for (``window_s`` is what it took)."""
    looked: bool = True
    """Some source answered (a server, even to refuse; NVML; the log): else the status is unknown."""
    history_s: float | None = None
    """Seconds of the log's history read before the window (its stats lines), if any."""
    one_round: bool = False
    """``--once`` without ``--window``: one round of readings, no sampling window."""
    silent: list[str] = field(default_factory=list)
    """The sources that gave no answer at all by the deadline (a hung NVML call, a log read that
    never returned): vtop could not look at them, so with no alert the status is unknown (3)."""
    stale: list[str] = field(default_factory=list)
    """The sources that answered, then stopped (NVML hung partway through the window): their last
    readings are shown with their age, never as current, and with no alert the status is unknown (3)."""
    log_timeline: dict[str, Any] | None = None
    """What the vLLM log says happened, before vtop started and since (:mod:`vtop.core.timeline`)."""
    log_timeline_text: list[str] = field(default_factory=list)
    """The same, in a few lines (``doctor`` prints them)."""
    pending: list[dict[str, Any]] = field(default_factory=list)
    """Findings pending at the end of the window: a rule's condition held for the whole window but
    not yet for its threshold (:class:`vtop.core.rules.Pending`); each says the window that would
    decide. Not "no alerts": the status is a warning (1)."""

    @property
    def exit_code(self) -> int:
        """0 OK, 1 warning, 2 critical, 3 unknown (the monitoring-plugin convention)."""
        if any(a.get("severity") == "critical" for a in self.alerts):
            return EXIT_CRITICAL
        if any(s.get("state") in ("down", "engine dead") and s.get("polls", 1) for s in self.servers):
            return EXIT_CRITICAL
        if any(a.get("severity") == "warning" for a in self.alerts):
            return EXIT_WARNING
        if not self.looked or self.silent or self.stale or self.unread:
            return EXIT_UNKNOWN
        if self.pending:  # a finding not yet decided: not "all is well" (below "could not look")
            return EXIT_WARNING
        return EXIT_OK

    @property
    def exit_reason(self) -> str:
        """Why :attr:`exit_code` is what it is, in one line (``exit 2: :8000 is down``): the first cause
        of that status, and how many more there are."""
        code = self.exit_code
        causes: list[str] = []
        if code == EXIT_CRITICAL:
            causes = [f"[CRITICAL] {a.get('title')}" for a in self.alerts if a.get("severity") == "critical"]
            causes += [f"{_server_name(s['url'])} {'is down' if s['state'] == 'down' else 'has a dead engine'}"
                       for s in self.servers if s.get("state") in ("down", "engine dead") and s.get("polls", 1)]
        elif code == EXIT_WARNING:
            causes = [f"[WARNING] {a.get('title')}" for a in self.alerts if a.get("severity") == "warning"]
            causes += [f"[PENDING] {p['rule']}{' on ' + _server_name(p['target']) if p.get('target') else ''} not "
                       f"yet decided (--window {p['decides_with_window_s']} would decide)" for p in self.pending]
        elif code == EXIT_UNKNOWN:
            if not self.looked:
                causes.append("no source answered: vtop could not look")
            causes += [f"{w} stopped answering (its readings are old)" for w in self.stale]
            causes += [f"{w} never answered" for w in self.silent]
            causes += [f"{_server_name(u)} did not give vLLM's numbers" for u in self.unread]
        else:
            up = sum(1 for s in self.servers if s.get("state") == "up")
            causes = [f"no alert; {up} of {len(self.servers)} server(s) up" if self.servers else "no alert"]
        first = causes[0] if causes else "unknown"
        more = f" (and {len(causes) - 1} more)" if len(causes) > 1 else ""
        return f"exit {code}: {first}{more}"

    @property
    def unread(self) -> list[str]:
        """The watched servers vtop could not read vLLM's numbers from: something answers that is
        not vLLM's /metrics (HTML, a 404, a 302, another exporter, over 16 MiB), or it never gave
        data (HTTP 500, timeouts): vtop could not look, so with no alert the status is unknown."""
        return [s["url"] for s in self.servers
                if s.get("state") == "not vllm" or (s.get("state") == "stale" and s.get("running") is None)]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "vtop": __version__,
            "t": round(self.t, 3),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.t)),
            "host": self.host,
            "window_s": round(self.window_s, 3),
            "window_asked_s": _r(self.window_asked_s, 3),
            "one_round": self.one_round,
            "log_history_s": _r(self.history_s, 0),
            "gpu": {"status": self.gpu_status, "message": self.gpu_message, "gpus": self.gpus},
            "servers": self.servers,
            "startup": self.startup,
            "requests": self.requests,
            "requests_in_flight": self.requests_in_flight,
            "requests_received_10s": self.requests_received_recent,
            "alerts": self.alerts,
            "notes": self.notes,
            "silent_sources": list(self.silent),
            "stale_sources": list(self.stale),
            "pending": self.pending,
            "log_timeline": self.log_timeline,
            "exit_code": self.exit_code,
            "exit_reason": self.exit_reason,
        }


def _server_name(url: str) -> str:
    """``:8000`` for a server on this box, ``host:8000`` for another (as the alerts name them)."""
    from vtop.sources.urls import LOCAL_HOSTS, url_hostport

    host, port = url_hostport(url)
    return f":{port}" if host in LOCAL_HOSTS else f"{host}:{port}"


def _r(x: float | None, nd: int = 1) -> float | None:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None
    return round(float(x), nd)


def _mean(vals: list[float]) -> float | None:
    return sum(vals) / len(vals) if vals else None


def gpu_rows(hist: GpuHistory, since: float, names: dict[int, str],
             owner: dict[int, str] | None = None, *, age_s: float | None = None,
             stale: bool = False) -> list[dict[str, Any]]:
    """One row a GPU: its last readings, ``age_s`` old (``stale`` past Monitor.gpu_stale_after_s)."""
    owner = owner or {}
    out = []
    for idx in sorted(hist.tracks):
        tr = hist.tracks[idx]
        g = tr.last
        if g is None:
            continue

        def window(key: str, tr: Any = tr) -> float | None:
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
            "processes": [{"pid": p.pid, "used_bytes": p.used_bytes, "name": names.get(p.pid),
                           "owner": owner.get(p.pid)}
                          for p in (g.procs or ())],
            "age_s": _r(age_s),
            "stale": stale,
        })
    return out


#: A stats line of the vLLM log this recent still says the current throughput: vLLM writes
#: one every 10 s while requests run (``VLLM_LOG_STATS_INTERVAL``), the average of those 10 s,
#: landing 10.0-10.4 s apart; 2 s of slack for the stamps' 1 s resolution. An older one says
#: nothing of now (an idle server logs its zero lines at DEBUG after the first).
LOG_RATES_MAX_AGE_S = 12.0


def log_rates(monitor: Monitor) -> tuple[str, Any, float] | None:
    """(server URL, the log's last stats point, its age) when the followed log's last stats
    line is recent enough to stand for the rates (see :data:`LOG_RATES_MAX_AGE_S`)."""
    lv = monitor.log_view
    hist = getattr(lv, "history", None) if lv is not None else None
    last = hist.last if hist is not None else None
    url = monitor.log_target
    if last is None or url is None:
        return None
    age = max(0.0, monitor.clock.monotonic() - last.mono)
    return (url, last, age) if age <= LOG_RATES_MAX_AGE_S else None


_UNSET: Any = object()


def server_row(v: ServerView, process: Any, log_point: Any = None, log_age_s: float | None = None, *,
               now: float | None = None, seen: Any = _UNSET) -> dict[str, Any]:
    """One server of the report. Rates come from /metrics (two scrapes or more); else from
    ``log_point``, the server's own log's recent stats line (``rates_from`` says which);
    else they are None: they need a window (``--window``)."""
    # A server that is down or whose engine died: its gauges are the last seen (``last_seen``, with
    # their age), never reported as live; late polls (stale) keep theirs, as before.
    if seen is _UNSET:
        seen = v.last_seen(now if now is not None else (v.last_ok_mono or 0.0)) if v.state != "stale" else None
    m = v.metrics if (v.is_live or v.state == "stale") and seen is None else None
    gen, prompt, rates_from = v.gen_tps, v.prompt_tps, None
    if gen is not None or prompt is not None:
        rates_from = "metrics"
    elif log_point is not None and m is not None:
        gen, prompt, rates_from = log_point.gen_tps, log_point.prompt_tps, "log"
    row: dict[str, Any] = {
        "url": v.url,
        "state": v.state,
        "message": v.message,
        "model": v.model_id,
        "engine": v.engine,
        "version": v.version,
        "max_model_len": v.max_model_len,
        "running": _r(m.running, 0) if m else None,
        "waiting": _r(m.waiting, 0) if m else None,
        "kv_cache_pct": _r(100.0 * m.kv_cache_usage) if m and m.kv_cache_usage is not None else None,
        "gen_tokens_per_s": _r(gen),
        "prompt_tokens_per_s": _r(prompt),
        "rates_from": rates_from,
        "rates_age_s": _r(log_age_s) if rates_from == "log" else None,
        "preemptions_per_s": _r(v.preemptions_ps, 2),
        "ttft_p50_s": _r(v.ttft.p50, 3),
        "ttft_p95_s": _r(v.ttft.p95, 3),
        "itl_p50_s": _r(v.itl.p50, 4),
        "finished_in_window": dict(v.finished) if v.finished is not None else None,
        "rate_window_s": v.window_s,
        "rate_span_s": _r(v.rate_span_s) if rates_from == "metrics" else None,
        "pid": getattr(process, "pid", None) if process not in (None, UNKNOWN) else None,
        "placement": getattr(process, "placement", None) if process not in (None, UNKNOWN) else None,
        "container_id": getattr(process, "container_id", None) if process not in (None, UNKNOWN) else None,
        "ns_pid": getattr(process, "ns_pid", None) if process not in (None, UNKNOWN) else None,
        "restarts": v.restarts,
        "last_seen": seen.to_json() | {"text": seen.words()} if seen is not None else None,
    }
    row.update(signal_fields(v, m))
    return row


SLEEP_STATES = {0: "awake", 1: "weights_offloaded", 2: "discard_all"}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def signal_fields(v: ServerView, m: Any) -> dict[str, Any]:
    """Issue #29's signals of one server, each null where the server exports no such family.

    Spec decoding and prefix cache are over the window (``over``: "window"); a single round has
    no window, so they are then the server's totals since it started (``over``: "since start")."""
    out: dict[str, Any] = {"sleep": None, "spec_decode": None, "prefix_cache": None, "kv_offload": None}
    if m is None:
        return out
    lvl = v.sleep_level
    if lvl is not None:
        out["sleep"] = {"level": lvl, "state": SLEEP_STATES.get(lvl, "sleeping"), "sleeping": lvl > 0}
    if m.spec_draft_tokens_total is not None:
        sp = v.spec
        if sp is not None and sp.draft_tokens:
            over, acc, mlen, pos, toks = "window", sp.acceptance, sp.mean_len, list(sp.per_pos), sp.draft_tokens
        else:
            drafts = m.spec_drafts_total
            ks = sorted(m.spec_accepted_per_pos or {}, key=lambda k: (len(k), k))
            over, toks = "since start", m.spec_draft_tokens_total
            acc = _ratio(m.spec_accepted_tokens_total, toks)
            mlen = None if _ratio(m.spec_accepted_tokens_total, drafts) is None \
                else 1.0 + m.spec_accepted_tokens_total / drafts
            pos = [m.spec_accepted_per_pos[k] / drafts for k in ks] if drafts else []
        out["spec_decode"] = {"acceptance": _r(acc, 4), "mean_accepted_len": _r(mlen, 3),
                              "per_position": [round(x, 4) for x in pos], "draft_tokens": _r(toks, 0), "over": over}
    if m.prefix_cache_queries_total is not None:
        if v.prefix_hit_rate is not None:
            out["prefix_cache"] = {"hit_rate": _r(v.prefix_hit_rate, 4), "over": "window"}
        else:
            out["prefix_cache"] = {"hit_rate": _r(_ratio(m.prefix_cache_hits_total, m.prefix_cache_queries_total), 4),
                                   "over": "since start"}
    if m.kv_offload_store_bytes_total is not None or m.kv_offload_load_bytes_total is not None:
        out["kv_offload"] = {"store_bytes_per_s": _r(v.offload_store_bps, 0), "load_bytes_per_s":
                             _r(v.offload_load_bps, 0), "stored_bytes_total": _r(m.kv_offload_store_bytes_total, 0),
                             "loaded_bytes_total": _r(m.kv_offload_load_bytes_total, 0)}
    return out


#: what a sleep level means for the one who waits on the server
SLEEP_TEXT = {1: "level 1: weights offloaded", 2: "level 2: all discarded"}


def signals_text(s: dict[str, Any]) -> list[str]:
    """The --once text lines of :func:`signal_fields` (none where nothing is present)."""
    out = []
    sl = s.get("sleep")
    if sl and sl["sleeping"]:
        # no tokens on purpose (not a stall); a request sent now waits, unanswered, for the wake-up
        out.append(f"  SLEEPING ({SLEEP_TEXT.get(sl['level'], 'sleeping')}): requests wait until POST /wake_up")
    bits = []
    sp = s.get("spec_decode")
    if sp:
        acc = "-" if sp["acceptance"] is None else f"{100 * sp['acceptance']:.1f}%"
        bits.append(f"spec accepted {acc}" + (f" len {sp['mean_accepted_len']:.2f}" if sp["mean_accepted_len"] else "")
                    + (" per pos " + " ".join(f"{p:.2f}" for p in sp["per_position"]) if sp["per_position"] else "")
                    + ("" if sp["over"] == "window" else " (since start)"))
    pc = s.get("prefix_cache")
    if pc and pc["hit_rate"] is not None:  # no prompt token looked up yet: nothing to say
        bits.append(f"prefix hit {100 * pc['hit_rate']:.1f}%" + ("" if pc["over"] == "window" else " (since start)"))
    ko = s.get("kv_offload")
    if ko:
        def mbs(x: float | None) -> str:
            return "-" if x is None else f"{x / 1e6:.1f} MB/s"
        bits.append(f"KV offload store {mbs(ko['store_bytes_per_s'])} load {mbs(ko['load_bytes_per_s'])}")
    if bits:  # one line when it fits the report's 80 columns, else one a family
        line = "  " + " · ".join(bits)
        out += [line] if len(line) <= 80 else ["  " + b for b in bits]
    return out


async def watch(monitor: Monitor, feed: LiveFeed, window_s: float) -> float:
    """Run the live sources into ``monitor`` for ``window_s``, one round an interval;
    returns when it started (monotonic). Then wait, up to a deadline, for each source's
    first answer, so a short window still reports every source; one that has not
    answered by then (a hung NVML call, a server that accepts and never replies) is
    said so in the notes, never waited for."""
    clock = monitor.clock
    interval = monitor.config.interval
    started = clock.monotonic()
    feed.start()
    try:
        while True:
            left = window_s - (clock.monotonic() - started)
            await asyncio.sleep(max(0.0, min(interval, left)))
            feed.collect()
            monitor.tick()
            if clock.monotonic() - started >= window_s:
                break
        # Rates need two scrapes: a window of an interval or more waits for the second
        # (a busy box may have started the first one late).
        polls = 2 if window_s >= interval else 1
        deadline = clock.monotonic() + max(5.0, 3 * interval)
        while _waiting_for(monitor, feed, polls) and clock.monotonic() < deadline:
            await asyncio.sleep(0.05)
            feed.collect()
            monitor.tick()
        await _finish(monitor, feed, deadline, started)
    finally:
        await feed.aclose()
    return started


async def _finish(monitor: Monitor, feed: LiveFeed, deadline: float, started: float) -> None:
    """The end of :func:`watch` and :func:`one_round`. A server that accepts and gives no
    complete answer (a blocked API-server event loop) is waited for until it has been silent
    long enough for the api_unresponsive rule to judge it, so ``--once`` names it rather than
    reporting a STALE card and exit 0; then the rules run once more (a silence has grown with
    no new poll) and every source that never answered is named."""
    clock = monitor.clock
    silent_s = monitor.diagnoser.thresholds.api_silent_s
    deadline = max(deadline, clock.monotonic() + silent_s + 1.0)
    while _judging_silence(monitor, silent_s) and clock.monotonic() < deadline:
        await asyncio.sleep(0.05)
        feed.collect()
        monitor.tick()
    monitor.tick()
    monitor.diagnose()
    feed.silent = []
    for what in _waiting_for(monitor, feed, 1):
        feed.silent.append(what)
        monitor.notes.append(f"{what}: no answer within {clock.monotonic() - started:.0f} s")


#: ``--once`` without ``--window``: how often the one round looks whether every source has answered when
#: none has woken it (``LiveFeed.wake``): its deadline, and the scrapes a slow first log read holds back.
ROUND_STEP_S = 0.01


async def one_round(monitor: Monitor, feed: LiveFeed) -> float:
    """``vtop --once`` without ``--window``: one round of readings, no sampling window.

    Start every source and report as soon as each has answered once (NVML, the process
    scan, the log, one scrape of each server), so what needs no window (the gauges:
    running, waiting, KV usage, GPU utilisation and memory; the state and phase; the
    log's history and the rules it feeds) is out at once. Rates need two scrapes and are
    None (``rates_from`` says where any came from; the log's last stats line gives them when
    it is recent). Every source keeps its deadline, as in :func:`watch`: one that has not
    answered by ``max(5, 3 intervals)`` is named in the notes, never waited for; a server
    that accepts and never answers is waited for until the ``api_unresponsive`` rule can
    judge it. Returns when it started (monotonic)."""
    clock = monitor.clock
    interval = monitor.config.interval
    started = clock.monotonic()
    feed.one_round = True
    # Each source's answer wakes the round (``LiveFeed.wake``), which looked only every ROUND_STEP_S before:
    # on the H100 (session 27's timeline) the round found the last answer 8 ms after it came, and the
    # process scan's answer started the scrapes up to 10 ms late.
    news = asyncio.Event()
    feed.wake = news.set
    feed.start()
    # The rules' modules (about 30 ms of imports) load while the sources' first answers are awaited, not on the
    # critical path at the first diagnosis: on the H100 (session 26's timeline) that diagnosis ran 212-250 ms
    # after the spawn, after NVML's answer. Python's per-module import locks make the diagnosis wait for a
    # half-done import rather than import twice.
    threading.Thread(target=_load_rules, name="vtop-load-rules", daemon=True).start()
    try:
        deadline = started + max(5.0, 3 * interval)
        while True:
            try:
                await asyncio.wait_for(news.wait(), ROUND_STEP_S)
            except asyncio.TimeoutError:  # nothing came: the deadline, and a log read slow to start the scrapes
                pass
            news.clear()
            feed.collect()
            monitor.tick()
            if not _waiting_for(monitor, feed, 1) or clock.monotonic() >= deadline:
                break
        await _finish(monitor, feed, deadline, started)
    finally:
        await feed.aclose()
    return started


def _load_rules() -> None:
    import vtop.core.rules  # noqa: F401  (loaded for the first diagnosis: see one_round)


def _judging_silence(monitor: Monitor, silent_s: float) -> bool:
    """A server's scrapes time out (accepted, no complete answer) and it has not yet been
    silent for ``silent_s``."""
    from vtop.core.rules.api import silent_for

    now = monitor.clock.monotonic()
    for ws in monitor.servers.values():
        v = ws.tracker.view()
        t = silent_for(now, v)
        if t is not None and t < silent_s:
            return True
    return False


def _waiting_for(monitor: Monitor, feed: LiveFeed, server_polls: int = 1) -> list[str]:
    """The sources that have not answered once yet (a server: ``server_polls`` times)."""
    out = []
    if feed.gpu_loop is not None and feed.gpu_loop.polls == 0:
        out.append(GPU_SOURCE)
    if feed.log_loop is not None and feed.log_loop.polls == 0:
        out.append("the vLLM log")
    if feed.disc_loop is not None and not monitor.discovered_once:
        out.append("the process scan")
    out += [url for url, ws in monitor.servers.items() if ws.polls < server_polls]
    return out


def _compat(r: InFlightRequest) -> dict[str, Any]:
    """The fields of a request row before the bounds (report/2): ``age_s`` the lower bound where one is
    known, else the upper one, then ``age_is_upper_bound``."""
    lower = r.age_min_s is not None
    return {"age_s": _r(r.age_min_s if lower else r.age_max_s), "age_is_upper_bound": not lower}


def _requests_row(answer: ServerRequests | None) -> dict[str, Any]:
    """A server's requests in flight in its row: how many (vLLM's running + waiting where known), the
    oldest (the request every face names), and the log's requests received lately (no end lines)."""
    if answer is None:
        return {"requests_in_flight": None, "oldest_request": None, "requests_received_recent": None}
    return {"requests_in_flight": answer.count,
            "oldest_request": answer.oldest.to_json() | _compat(answer.oldest) if answer.oldest else None,
            "requests_received_recent": answer.received_recent}


def report(monitor: Monitor, started: float, *, gpu_off: bool = False, window_asked_s: float | None = None,
           silent: list[str] | None = None) -> Report:
    """What ``monitor`` knows now, as a :class:`Report` (GPU means since ``started``)."""
    clock = monitor.clock
    poll = monitor.gpu_history.last_poll
    lv = monitor.log_view
    startup = None
    if lv is not None:
        from vtop.core.phases.tracker import summarize  # the log's parser: loaded where a log was read

        startup = dict(summarize(lv.snapshot))
        startup["stalled"] = None if lv.stall is None else lv.stall.label
        startup["log"] = lv.tail.source
        # what the log is when a container runtime or journald keeps it ("docker json-file of vllm-0")
        startup["log_kind"] = getattr(monitor.log_watch.source, "label", None) if monitor.log_watch else None
        startup["log_problem"] = lv.problem
        dl = monitor.download_progress()
        startup["download"] = None if dl is None else dl.to_json()
        # this start against its own history on this box, and its GPU memory budget
        startup.update(monitor.startup_extras())
    notes = list(monitor.notes)
    if lv is not None and lv.problem:
        notes.append(lv.problem)
    if monitor.log_message and monitor.log_watch is None:
        notes.append(monitor.log_message)
    notes += monitor.missing_evidence()
    # Every server's requests in flight, oldest first (the one answer: vtop.core.requests); a burst of
    # 1,500 must not make a 260 KB report.
    answers = monitor.in_flight
    reqs = [r.to_json() | _compat(r) for a in answers.values() for r in a.requests][:MAX_REQUESTS]
    mine = monitor.requests_of()
    from_log = log_rates(monitor)
    stale_for = monitor.gpu_stale_for()
    tl = monitor.timeline()
    gpu_status = poll.status if poll else ("off" if gpu_off else "none")
    gpu_message = poll.message if poll else _silent_gpu(silent, clock.monotonic() - started)
    if stale_for is not None:  # NVML answered, then stopped: its last readings are that old, not current
        gpu_status = "stale"
        gpu_message = (f"{GPU_SOURCE}: no answer for the last {stale_for:.0f} s (NVML stopped answering: a hung "
                       f"call, the driver or a GPU may be stuck); the readings below are {stale_for:.0f} s old")
    return Report(
        t=clock.time(),
        window_s=clock.monotonic() - started,
        host=socket.gethostname(),
        gpu_status=gpu_status,
        gpu_message=gpu_message,
        gpus=gpu_rows(monitor.gpu_history, started, monitor.proc_names, monitor.gpu_owner,
                      age_s=monitor.gpu_readings_age(), stale=stale_for is not None),
        servers=[server_row(ws.last_view or ws.tracker.view(), monitor.process_arg(ws),
                            *(from_log[1:] if from_log is not None and from_log[0] == url else ()),
                            now=clock.monotonic(),
                            seen=None if (ws.last_view or ws.tracker.view()).state == "stale"
                            else monitor.last_seen(ws.last_view or ws.tracker.view()))
                 | {"polls": ws.polls} | _requests_row(answers.get(url))
                 for url, ws in monitor.servers.items()],
        startup=_jsonable(startup),
        requests=reqs,
        requests_in_flight=mine.count if mine is not None else None,
        requests_received_recent=mine.received_recent if mine is not None else None,
        alerts=[a.to_json() for a in monitor.alerts],
        notes=list(dict.fromkeys(notes)),
        window_asked_s=window_asked_s,
        looked=_looked(monitor),
        history_s=_history_s(monitor),
        silent=list(silent or ()),
        stale=[GPU_SOURCE] if stale_for is not None else [],
        pending=pending_rows(monitor, started, window_asked_s),
        log_timeline=None if tl is None else tl.to_json(),
        log_timeline_text=[] if tl is None else tl.lines(max_events=DOCTOR_EVENTS),
    )


#: the timeline's events ``doctor`` prints (the latest; ``--json`` carries them all)
DOCTOR_EVENTS = 6

#: a condition that began this close after the window's start held for the whole of it (the first
#: samples come a round or two after the start)
PENDING_SLACK_S = 3.0


def pending_rows(monitor: Monitor, started: float, window_asked_s: float | None) -> list[dict[str, Any]]:
    """The findings pending at the end of the window (see :attr:`Report.pending`): conditions that
    held from the window's start (give or take its first samples) to its end, with the window
    that would decide (``--window N``: the window's length plus what the threshold still needs)."""
    if window_asked_s is None:
        return []  # one round: no window held anything
    now = monitor.clock.monotonic()
    slack = max(PENDING_SLACK_S, 2 * monitor.config.interval)
    out = []
    for p in monitor.diagnoser.pending:
        # held from the window's start, or from vtop's first reading of it (a busy box's first scrape
        # can come seconds into the window)
        first = p.seen_from if p.seen_from is not None else started
        if p.since > max(started + slack, first + 0.5):
            continue
        row = p.to_json(now)
        left = max(0.0, p.threshold_s - p.held_s(now))
        row["since"] = None  # monotonic: meaningless to a reader; held_s says it
        row["decides_with_window_s"] = math.ceil(window_asked_s + left + 2 * monitor.config.interval)
        out.append(row)
    return out


def _silent_gpu(silent: list[str] | None, waited: float) -> str | None:
    """The GPU line when NVML never answered: a hung driver call, said as such."""
    if silent and GPU_SOURCE in silent:
        return f"{GPU_SOURCE}: no answer within {waited:.0f} s (a hung NVML call: the driver or a GPU may be stuck)"
    return None


def _looked(monitor: Monitor) -> bool:
    """Some source answered: a server (a refused port is an answer: down), NVML with
    readings or a definite "no GPU", the log. Else vtop could not look (exit 3)."""
    if any(ws.polls for ws in monitor.servers.values()):
        return True
    poll = monitor.gpu_history.last_poll
    if poll is not None and (poll.gpus or poll.status in ("absent", "off")):
        return True
    lv = monitor.log_view
    return lv is not None and lv.lines_total > 0


def _history_s(monitor: Monitor) -> float | None:
    """How far back the log's stats lines reach before now (None: no history read)."""
    lv = monitor.log_view
    hist = getattr(lv, "history", None) if lv is not None else None
    if hist is None or not hist.stats:
        return None
    return max(0.0, monitor.clock.monotonic() - hist.stats[0].mono)


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


def _secs(s: float) -> str:
    return f"{round(s, 1):g} s" if s < 60 else dur(s)


def window_text(rep: Report) -> str:
    """``15 s window``: the window asked for, and when it took longer, why; the log history read."""
    asked = rep.window_asked_s
    took = rep.window_s
    if asked is None:
        out = f"{_secs(took)} window"
    else:
        out = f"{_secs(asked)} window"
        if took > asked + 1.0:
            out += f", {_secs(took)} with the wait for every source's first answers"
        elif took < asked - 1.0:
            out += f", cut short at {_secs(took)}"
    if rep.history_s:
        out += f", and {dur(rep.history_s)} of the {_log_engine(rep)} log's stats before it"
    return out


def _log_engine(rep: Report) -> str:
    """Whose log the history is, in the engine's own name: the watched servers' engine (SGLang's servers are
    not vLLM's); vLLM's when they differ or none is known."""
    names = {flags_of(s.get("engine"))["name"] for s in rep.servers}
    return names.pop() if len(names) == 1 else "vLLM"


def format_text(rep: Report, *, doctor: bool = False) -> str:
    """Plain text, at most 80 columns wide except for long messages, no colour."""
    d = rep.to_json()
    look = window_text(rep)
    if rep.one_round:
        look = f"one round of readings, {_secs(rep.window_s)}"
        if rep.history_s:
            look += f", and {dur(rep.history_s)} of the {_log_engine(rep)} log's stats before it"
    lines = [f"vtop {__version__} on {rep.host} at {d['time']} ({look})"]
    if rep.gpus:
        if rep.gpu_status == "stale":
            lines.append(f"GPU: STALE: {rep.gpu_message}")
        for g in rep.gpus:
            if g["lost"]:
                lines.append(f"GPU {g['index']} {g['name']}: LOST (fell off the bus or driver error)")
                continue
            sm = f" SM {_v(g['sm_active_pct'], '%')}" if g["sm_active_pct"] is not None else ""
            lines.append(f"GPU {g['index']} {g['name']}: util {_v(g['util_pct'], '%')}{sm} "
                         f"mem {_gib(g['mem_used_bytes'])}/{_gib(g['mem_total_bytes'])} GiB "
                         f"{_v(g['power_w'], ' W')} {_v(g['temp_c'], ' C')}"
                         + (f" (STALE: {g['age_s']:.0f} s old)" if g.get("stale") else ""))
    else:
        lines.append(f"GPU: {rep.gpu_message or rep.gpu_status}")
    for s in rep.servers:
        head = f"{flags_of(s.get('engine'))['name']} {s['url']}: {s['state'].upper()}"
        if s["model"]:
            head += f" {s['model']}"
        if s["version"]:
            head += f" v{s['version']}"
        if s.get("placement"):
            head += f" ({s['placement']})"
        lines.append(head)
        if s["running"] is not None:
            lines.append(f"  running {_v(s['running'])} waiting {_v(s['waiting'])} KV {_v(s['kv_cache_pct'], '%')} "
                         f"gen {_v(s['gen_tokens_per_s'])} tok/s prompt {_v(s['prompt_tokens_per_s'])} tok/s"
                         + (f" ({flags_of(s.get('engine'))['name']} log, {s['rates_age_s']:.0f} s ago)" if s.get("rates_from") == "log" else
                            f" (over {s['rate_span_s']:.0f} s)" if s.get("rate_span_s") else ""))
        lines += signals_text(s)
        if s["state"] != "up":
            lines.append(f"  {s['message']}")
        if s.get("last_seen"):
            lines.append(f"  {s['last_seen']['text']}")
    st = rep.startup
    if st and st.get("state") == "starting":
        lines.append(f"startup: {st.get('current') or 'starting'} ({st.get('log_kind') or st.get('log')})"
                     + (f" STALLED: {st['stalled']}" if st.get("stalled") else ""))
    if doctor and rep.log_timeline_text:
        lines.append(rep.log_timeline_text[0])
        lines += [f"  {ln}" for ln in rep.log_timeline_text[1:]]
    lines += requests_text(rep)
    if rep.alerts:
        lines.append("")
        for a in rep.alerts:
            lines.append(f"[{a['severity'].upper()}] {a['title']}")
            for e in a.get("evidence") or ():
                lines.append(f"    - {e}")
            for fx in a.get("fix") or ():
                lines.append(f"    fix: {fx}")
    for p in rep.pending:
        lines.append("")
        lines.append(pending_text(p, rep.window_asked_s))
        for e in p.get("evidence") or ():
            lines.append(f"    - {e}")
    if not rep.alerts and not rep.pending and rep.exit_code == EXIT_OK:
        # "no alerts" beside exit 2 (a server down) would read as all well
        lines.append("no alerts" if doctor else "alerts: none")
    for n in rep.notes:
        lines.append(f"note: {n}")
    lines.append(rep.exit_reason)
    return "\n".join(lines) + "\n"


def pending_text(p: dict[str, Any], window_s: float | None) -> str:
    """``[PENDING] engine_stall on :8000: running 3, ... for the whole 15 s window (held 16 s); an
    engine stall is named at 20 s: --window 25 would decide``."""
    from vtop.core.rules.util import short_url

    where = f" on {short_url(p['target'])}" if p.get("target") else ""
    win = f"the whole {_secs(window_s)} window" if window_s is not None else "the window"
    return (f"[PENDING] {p['rule']}{where}: {p['condition']} for {win} (held {_secs(p['held_s'])}); "
            f"{p['names']} is named at {_secs(p['threshold_s'])}: --window {p['decides_with_window_s']} would decide")


# --- entry points ------------------------------------------------------------------


def requests_text(rep: Report) -> list[str]:
    """The requests lines of the text report: per server, how many are in flight and the oldest, its age
    as a lower bound (the one answer every face shows)."""
    out = []
    for s in rep.servers:
        o = s.get("oldest_request")
        n = s.get("requests_in_flight")
        recent = s.get("requests_received_recent")
        if not n and o is None and recent is None:
            continue
        line = f"requests on {s['url']}: {'?' if n is None else n} in flight"
        if recent is not None:
            line += f" · {recent} received in the last 10 s (the request log; it logs no end line for every request)"
        out.append(line)
        if o is not None:
            out.append(f"  oldest: {request_words(o)}")
    return out


def request_words(o: dict[str, Any]) -> str:
    """``chatcmpl-9f… running at least 1m 05s (came at most 2m 05s ago), max_tokens 65,516 (no max_tokens
    from client), by the request log`` from a request row (``the request from 10.0.0.7:5555 in flight at
    least 1m 05s, its answer silent for 58s, by its connection`` where its answer went silent)."""
    who = o.get("id") or (f"the request from {o['client']}" if o.get("client") else "a request")
    age = "for an unknown time" if o.get("age_min_s") is None else f"at least {dur_text(o['age_min_s'])}"
    if o.get("age_max_s") is not None and (o.get("age_min_s") is None or o["age_max_s"] - o["age_min_s"] >= 1):
        age += f" (came at most {dur_text(o['age_max_s'])} ago)"
    out = f"{who} {state_word(o.get('answer_pending'), o.get('answer_silent_s'))} {age}"
    if o.get("answer_silent_s") is not None:
        out += ", " + silent_words(o["answer_silent_s"])
    if o.get("max_tokens") is not None:
        out += f", max_tokens {o['max_tokens']:,}"
    if o.get("client_set_max_tokens") is False:
        out += " (no max_tokens from client)"
    elif o.get("client_set_max_tokens") is True:
        out += " (set by its client)"
    return out + ", by " + " and ".join(EVIDENCE_WORDS.get(e, e) for e in o.get("evidence") or ())


def run_once(cfg: Config, *, window_s: float | None, as_json: bool, doctor: bool = False, out: Any = None,
             gpu_source: Any = "auto") -> int:
    """``vtop --once`` / ``vtop doctor``: watch for ``window_s``, or, when it is None
    (``--once`` without ``--window``), one round of readings (:func:`one_round`); then print
    the report. Returns the exit status."""
    out = out or sys.stdout
    recorder = make_recorder(cfg, mode="doctor" if doctor else "once")
    monitor = Monitor(cfg, recorder=recorder)
    try:
        monitor.log_watch = make_log_watch(cfg, clock=monitor.clock)
        if monitor.log_watch is not None:
            monitor.log_watch.recorder = recorder
        if isinstance(gpu_source, str):
            from vtop.sources.nvml import make_gpu_source

            gpu_source = make_gpu_source(cfg, one_round=window_s is None)
        feed = LiveFeed(monitor, gpu_source=gpu_source)
        if window_s is None:
            started = asyncio.run(one_round(monitor, feed))
        else:
            started = asyncio.run(watch(monitor, feed, window_s))
    except KeyboardInterrupt:
        return 130
    finally:
        monitor.finish_writes()  # a start kept in the last round is on disk before the exit (and its note read)
        if recorder is not None:
            recorder.close()
    rep = report(monitor, started, gpu_off=gpu_source is None, window_asked_s=window_s,
                 silent=feed.silent)
    if window_s is None:
        rep.one_round = True
        if any(s["rates_from"] is None and s["running"] is not None for s in rep.servers):
            rep.notes.append(ONE_ROUND_NOTE)
    if as_json:
        out.write(json.dumps(rep.to_json(), indent=2) + "\n")
    else:
        out.write(format_text(rep, doctor=doctor))
    return rep.exit_code


def replay_doctor(path: str, cfg: Config, *, as_json: bool, out: Any = None) -> int:
    """``vtop replay FILE --doctor``: play a recording through the monitor at once and
    print when each alert came and went (recorded time), then the report at its end."""
    from vtop.monitor.player import open_recording

    out = out or sys.stdout
    player = open_recording(path, config=cfg)
    monitor = player.play_to_end()
    rep = report(monitor, player.start)
    timeline = [{"t": round(c.t, 3), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(c.t)),
                 "elapsed_s": round(c.mono - player.start, 3),
                 "alerts": [{"rule": a.rule, "severity": a.severity, "target": a.target, "title": a.title}
                            for a in c.alerts]}
                for c in monitor.alert_log]
    if as_json:
        out.write(json.dumps({"timeline": timeline, "report": rep.to_json()}, indent=2) + "\n")
    else:
        out.write(f"alerts over {player.name} ({player.duration:.0f} s recorded):\n")
        for c in monitor.alert_log:
            what = "; ".join(f"[{a.severity.upper()}] {a.title}" for a in c.alerts) or "cleared"
            out.write(f"  +{c.mono - player.start:7.1f} s  {what}\n")
        if not timeline:
            out.write("  none\n")
        out.write("at the end of the recording:\n" + format_text(rep, doctor=True))
    return rep.exit_code
