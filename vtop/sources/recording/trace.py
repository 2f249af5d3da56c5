"""A raw incident trace (``tests/corpus/FORMAT.md``) read as a recording's events.

A trace is what the box said, second by second, recorded without vtop: the vLLM
log byte for byte with its size each second, every ``/metrics`` and ``/health``
answer, ``/version`` and ``/v1/models``, the process tree. This module turns it
into the :class:`~vtop.sources.recording.record.RecordEvent` stream a ``vtop --record`` file
gives (``server``, ``procs``, ``log``), parsed by the very code the live sources
use (:func:`~vtop.sources.vllm.poll_from_body`, the log's
:class:`~vtop.sources.logtail.LineSplitter`, the process scan), so any vtop can be
scored on a trace recorded before it existed. A trace recorded on a GPU box (the H200
ones) also has ``gpu.jsonl.gz``, NVML once a second, read into ``gpu`` events (a
:class:`~vtop.model.gpu.GpuPoll` each) as the NVML source would have given them, so
the GPU cards, the memory history and the GPU rules see them. A trace with
``conns.jsonl.gz`` (the kernel's counters of the server's connections, recorded by
:func:`vtop.sources.sockets.read_conns`) gives ``conns`` events, as a live read would. ``/metrics`` is read as a live vtop would have read it: the scraper's schedule
(:class:`~vtop.sources.vllm.ScrapePlan`) says which scrape each second's poll was (full,
restricted with the histograms, restricted without them), the recorded full body is cut
down to it as the server would have answered (:func:`~vtop.sources.vllm.restrict_exposition`),
and the histograms of the polls between two reads of them are the last ones carried over
with their age, so the rules see the live cadence, not one histogram a second. There are no ``logmark`` events:
a trace says when the health answered and when the process began, and the
monitor works out "launched" and "ready" from those as it does live.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vtop.model.gpu import OK, GpuPoll, GpuProcess, GpuSample
from vtop.model.server import ModelsInfo, ServerPoll
from vtop.sources.recording.record import RecordEvent, read

if TYPE_CHECKING:
    from vtop.sources.vllm import ScrapePlan

TRUTH = "truth.json"


def is_trace(path: str | os.PathLike[str]) -> bool:
    p = Path(path)
    return p.is_dir() and (p / TRUTH).is_file() and (p / "metrics.jsonl.gz").is_file()


def _rows(path: Path) -> Iterator[dict[str, Any]]:
    """The rows of one of the trace's JSONL files (none when it is absent; a damaged line is skipped)."""
    return read(path) if path.exists() else iter(())


def truth_of(path: str | os.PathLike[str]) -> dict[str, Any]:
    data = json.loads((Path(path) / TRUTH).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: {TRUTH} is not an object")
    return data


def _models(info: dict[str, Any] | None) -> ModelsInfo | None:
    if not isinstance(info, dict):
        return None
    raw = info.get("data")
    data: list[Any] = raw if isinstance(raw, list) else []
    ids = tuple(str(d.get("id")) for d in data if isinstance(d, dict) and d.get("id"))
    first = data[0] if data and isinstance(data[0], dict) else {}
    mml = first.get("max_model_len")
    return ModelsInfo(ids=ids, max_model_len=int(mml) if isinstance(mml, (int, float)) else None,
                      root=str(first["root"]) if first.get("root") else None)


def _num(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if f != f else f


def _int(v: Any) -> int | None:
    f = _num(v)
    return None if f is None else int(f)


def _gpu_sample(g: dict[str, Any], i: int, name: str) -> GpuSample:
    sm = _num(g.get("sm_active"))
    procs: tuple[GpuProcess, ...] | None = None
    raw = g.get("procs")
    if isinstance(raw, list):
        procs = tuple(GpuProcess(int(p[0]), _int(p[1]), _num(p[2]) if len(p) > 2 else None) for p in raw
                      if isinstance(p, (list, tuple)) and len(p) >= 2 and _int(p[0]) is not None)
    thr = g.get("throttle")
    idx = _int(g.get("index"))
    return GpuSample(
        index=i if idx is None else idx,
        name=name,
        util_gpu=_num(g.get("util")),
        mem_used=_int(g.get("mem_used")),
        mem_total=_int(g.get("mem_total")),
        power_w=_num(g.get("power_w")),
        power_limit_w=_num(g.get("power_limit_w")),
        sm_active=None if sm is None else 100.0 * sm,  # recorded as a fraction; vtop keeps percent
        procs=procs,
        throttle=tuple(str(r) for r in thr) if isinstance(thr, list) else None,
    )


def gpu_events(path: str | os.PathLike[str], gpu_name: str = "GPU") -> list[RecordEvent]:
    """``gpu.jsonl.gz`` of a trace as ``gpu`` events: a :class:`GpuPoll` and its processes' names each.

    A process's name is the row's ``names`` entry, else its title in ``procs.jsonl.gz``; a damaged row
    is skipped. An empty list when the file is absent (no NVML on the recording box).
    """
    from vtop.sources.procs import title_of

    p = Path(path)
    known: dict[int, str] = {}
    for r in _rows(p / "procs.jsonl.gz"):
        for pr in r.get("procs") or ():
            if isinstance(pr, dict) and isinstance(pr.get("pid"), int):
                cmd = pr.get("cmdline")
                known[pr["pid"]] = title_of(cmd if isinstance(cmd, list) else []) or str(pr.get("name") or "?")
    out: list[RecordEvent] = []
    for r in _rows(p / "gpu.jsonl.gz"):
        try:
            t, mono = float(r["t"]), float(r["mono"])
            gpus = tuple(_gpu_sample(g, i, gpu_name) for i, g in enumerate(r["gpus"]) if isinstance(g, dict))
        except (KeyError, TypeError, ValueError, IndexError):
            continue
        rn = r.get("names")
        row_names: dict[str, Any] = rn if isinstance(rn, dict) else {}
        names: dict[int, str] = {}
        for g in gpus:
            for gp in g.procs or ():
                n = row_names.get(str(gp.pid)) or known.get(gp.pid)
                if n:
                    names[gp.pid] = str(n)
        out.append(RecordEvent("gpu", t, mono, GpuPoll(t=t, mono=mono, status=OK, gpus=gpus), names))
    return out


def load_trace(path: str | os.PathLike[str], *, with_log: bool | None = None) -> tuple[dict[str, Any], list[RecordEvent]]:
    """The header (the interval, the truth) and the events of a trace, in time order. The log's
    lines are left out when ``with_log`` is False, or, when it is None, when the truth says vtop had
    no log (``"log_for_vtop": false``: vLLM's stdout on a pipe; the trace keeps it for the reader)."""
    from vtop.sources.discovery import discover_servers
    from vtop.sources.logtail import LineSplitter
    from vtop.sources.vllm import HEALTH_EVERY_S, ScrapePlan, poll_from_error

    p = Path(path)
    truth = truth_of(p)
    url = str((truth.get("server") or {}).get("url") or "http://127.0.0.1:8000").rstrip("/")
    events: list[RecordEvent] = []

    health = [(float(r["mono"]), r) for r in _rows(p / "health.jsonl.gz") if "mono" in r]
    health.sort(key=lambda x: x[0])
    info = sorted((r for r in _rows(p / "info.jsonl.gz") if "mono" in r), key=lambda r: float(r["mono"]))

    def latest(rows: list[Any], mono: float, key: Any = None) -> Any:
        out = None
        for r in rows:
            m = r[0] if isinstance(r, tuple) else float(r["mono"])
            if m > mono:
                break
            out = r
        return out

    # The scraper's own schedule (vtop.sources.vllm.ScrapePlan): a trace holds a full /metrics
    # every second, a live vtop reads the histograms every HIST_EVERY_S and carries them over
    # in between (histograms_age_s), so each row is cut down to what that poll asked for.
    plan = ScrapePlan()
    connected = False
    # /health as the live scraper asks it (VllmScraper._extras): on a new connection, at every poll while its last
    # answer was not 200, else every HEALTH_EVERY_S; a trace holds one a second, and feeding each made a 503 that
    # lasted 4 s (an idle engine's death) a sure catch that a live vtop makes 4 times in 5
    health_at: float | None = None
    health_bad = False
    for r in _rows(p / "metrics.jsonl.gz"):
        try:
            t, mono = float(r["t"]), float(r["mono"])
        except (KeyError, TypeError, ValueError):
            continue
        h = latest(health, mono)
        status, text = r.get("status"), r.get("text")
        due = (not connected or health_bad or health_at is None or mono - health_at >= HEALTH_EVERY_S
               or status is None or text is None)
        hrow = h[1] if h is not None and due else None
        if hrow is not None:
            health_at, health_bad = mono, hrow.get("status") != 200
        extra = _extra(hrow, latest(info, mono))
        poll: ServerPoll
        if status is None or text is None:
            connected = False
            poll = poll_from_error(url, str(r.get("error") or "refused"), t=t, mono=mono, **extra)
        else:
            if not connected:
                plan.reconnect()
                connected = True
            poll = _scraped(plan, url, r, int(status), str(text), t, mono, extra)
        events.append(RecordEvent("server", t, mono, poll))

    for r in _rows(p / "procs.jsonl.gz"):
        try:
            t, mono = float(r["t"]), float(r["mono"])
        except (KeyError, TypeError, ValueError):
            continue
        events.append(RecordEvent("procs", t, mono, discover_servers(r.get("procs") or [])))

    from vtop.sources.sockets import conn_read_from_json

    # one row a second (the player takes them at the live cadence: vtop.monitor.player)
    for r in _rows(p / "conns.jsonl.gz"):
        try:
            read = conn_read_from_json(r)
        except (KeyError, TypeError, ValueError):
            continue
        events.append(RecordEvent("conns", read.t, read.mono, read))

    log = p / "log.bin.gz"
    if with_log is None:
        with_log = truth.get("log_for_vtop") is not False
    if with_log and log.exists():
        with gzip.open(log, "rb") as f:
            data = f.read()
        split = LineSplitter()
        done = 0
        for r in _rows(p / "log-index.jsonl.gz"):
            try:
                t, mono, size = float(r["t"]), float(r["mono"]), int(r["size"])
            except (KeyError, TypeError, ValueError):
                continue
            if size < done:  # the file was truncated: start over
                done = 0
                split.reset()
            lines = split.feed(data[done:size]) if size > done else []
            done = max(done, size)
            if lines:
                # "mtime" (a derived trace: an old file given with --log): the file's modification time
                mt = _num(r.get("mtime"))
                events.append(RecordEvent("log", t, mono, lines, extra=mt))

    gpu_name = str((truth.get("server") or {}).get("gpu") or "GPU")
    events.extend(gpu_events(p, gpu_name))

    events.sort(key=lambda e: e.at)
    header = {"schema": "vtop-trace", "interval": 1.0, "history": 600.0, "truth": truth, "raw": True}
    return header, events


def _extra(hrow: dict[str, Any] | None, info: dict[str, Any] | None) -> dict[str, Any]:
    """What a poll at that time knew besides ``/metrics``: ``/health``'s answer, the version and the
    models (``/version``, ``/v1/models``)."""
    extra: dict[str, Any] = {}
    if hrow is not None:
        extra["health"] = hrow.get("status")
        extra["health_polled"] = True
        if hrow.get("status") is None:
            extra["health_error"] = str(hrow.get("error") or "other")
    if info is not None:
        if info.get("version"):
            extra["version"] = str(info["version"])
        models = _models(info.get("models"))
        if models is not None:
            extra["models"] = models
    return extra


def _scraped(plan: ScrapePlan, url: str, r: dict[str, Any], status: int, text: str, t: float, mono: float,
             extra: dict[str, Any]) -> ServerPoll:
    """One answered scrape, cut down to what the scraper's schedule (``plan``) asked for at ``mono``."""
    from vtop.sources.metrics_text import parse_vllm_metrics
    from vtop.sources.vllm import FAST_METRICS_PATH, METRICS_PATH, PATH_NAMES, poll_from_body, restrict_exposition

    body, metrics = text, None
    path = plan.path(mono)
    names = PATH_NAMES[path]
    if path != METRICS_PATH:
        part = restrict_exposition(body, frozenset(names or ())) if status == 200 else ""
        got = plan.took_restricted(parse_vllm_metrics(part) if status == 200 else None, mono,
                                   fast=path == FAST_METRICS_PATH)
        if got is not None:
            body, metrics = part, got
    if metrics is None and status == 200:
        metrics = parse_vllm_metrics(body)
        plan.took_full(metrics, mono)
    return poll_from_body(url, body, t=t, mono=mono, latency_s=r.get("dt"), status=status,
                          metrics=metrics, **extra)
