"""The three real starts of one model recorded on a lent H100 (issue 40): tests/corpus/traces/h100-starts-history-budget.

An NVIDIA H100 80GB HBM3 (an H200 was asked for, none could be started), vLLM 0.26.0, the tiny model /tmp/tiny with
--max-model-len 32768. ``start-0.log`` (--gpu-memory-utilization 0.5; the torch.compile cache was already there from an
earlier start on that machine), ``start-1.log`` (0.5 again), ``start-2.log`` (0.8), each to ready and 5 s more.
``events.jsonl``: ``start_begin`` (``compile_cache_present``), ``ready`` (``healthy_after_s``: from the launch to
``/health`` answering 200) and ``start_kept`` (NVML's memory used then). The trace's NVML samples (``gpu.jsonl.gz``)
and process table (``procs.jsonl.gz``) cover the three starts; its ``log.bin.gz`` is the last start's only (vLLM's log
file was written afresh at each launch and the recorder keeps one file's bytes).

:func:`follow` reads one of the logs as vtop does live: the :class:`~vtop.monitor.monitor.Monitor` behind the screen,
its log watch on the file, this box's start history read from ``$XDG_STATE_HOME/vtop/starts.json`` first and a start
that reached ready kept there, and the NVML reading and process table the trace holds for that moment.
:func:`third_start_app` and :func:`feed_third_start`: the screen of a vtop that followed the third start from its
launch (the log written as the trace's log index says, its polls and readings at their recorded times).
"""

from __future__ import annotations

import gzip
import json
import threading
from functools import cache
from pathlib import Path
from typing import Any

from vtop.clock import FakeClock
from vtop.config import Config
from vtop.model.gpu import GpuPoll
from vtop.monitor.monitor import Monitor, make_log_watch
from vtop.sources.discovery import discover_servers
from vtop.sources.recording.trace import gpu_events, load_trace

TRACE = Path(__file__).resolve().parents[1] / "corpus" / "traces" / "h100-starts-history-budget"
URL = "http://127.0.0.1:8000"
GPU_NAME = "NVIDIA H100 80GB HBM3"
GIB = float(1 << 30)
#: 0.9 s into the third start's warmup, its budget line logged (the trace's log index: the parts line came with the
#: poll at 1796465741.724, the warmup's end with the one at 1796465742.724)
WARMUP_AT = 1796465742.6


@cache
def events() -> tuple[dict[str, Any], ...]:
    return tuple(json.loads(ln) for ln in (TRACE / "events.jsonl").read_text().splitlines() if ln.strip())


def event(what: str, k: int) -> dict[str, Any]:
    """The recipe's ``what`` event of start ``k`` (``ready`` has no k: the k-th of them)."""
    if what == "ready":
        return [e for e in events() if e["what"] == "ready"][k]
    return next(e for e in events() if e["what"] == what and e.get("k") == k)


def start_log(k: int) -> Path:
    return TRACE / f"start-{k}.log"


@cache
def nvml_events() -> tuple[Any, ...]:
    return tuple(gpu_events(TRACE, GPU_NAME))


def nvml_at(t: float) -> tuple[GpuPoll, dict[int, str]]:
    """The trace's NVML reading last taken at or before wall time ``t`` (and its GPU processes' names)."""
    e = [e for e in nvml_events() if e.t <= t][-1]
    return e.data, dict(e.extra or {})


def nvml_idle() -> GpuPoll:
    """NVML's reading with no vLLM on the GPU: between start-0's stop and start-1's launch."""
    return nvml_at(event("start_begin", 1)["t"])[0]


def procs_at(t: float) -> list[Any]:
    """The vLLM server processes of the trace's process table last read at or before ``t`` (discovery's answer)."""
    with gzip.open(TRACE / "procs.jsonl.gz", "rt") as f:
        rows = [json.loads(ln) for ln in f if ln.strip()]
    row = [r for r in rows if r["t"] <= t][-1]
    return discover_servers(row["procs"])


@cache
def server_events() -> tuple[Any, ...]:
    return tuple(e for e in load_trace(TRACE, with_log=False)[1] if e.kind == "server")


def server_poll_at(t: float) -> Any:
    """The trace's last poll of the server (``/metrics``, ``/health``) at or before ``t``."""
    return [e for e in server_events() if e.t <= t][-1].data


def clock_at(t: float) -> FakeClock:
    """A clock that reads the trace's wall time ``t`` and the recorder's monotonic time then (the samples' ``mono``)."""
    first = events()[0]
    off = float(first["t"]) - float(first["mono"])
    return FakeClock(start=t - off, wall_offset=off)


def log_size_at(k: int, t: float) -> int:
    """How many bytes start ``k``'s log held at wall time ``t``, by the trace's log index; 0 before the start's launch.
    vLLM's log was written afresh at each launch; the index's sizes count the files one after another (log.bin.gz
    holds start-0.log, start-1.log and the last file), so the earlier starts' kept logs are taken off."""
    with gzip.open(TRACE / "log-index.jsonl.gz", "rt") as f:
        rows = [json.loads(ln) for ln in f if ln.strip()]
    begin = float(event("start_begin", k)["t"])
    sizes = [int(r["size"]) for r in rows if begin <= r["t"] <= t]
    base = sum(start_log(j).stat().st_size for j in range(k))
    size = max(0, sizes[-1] - base) if sizes else 0
    assert size <= start_log(k).stat().st_size, "the index runs past the log kept"
    return size


def join(name: str) -> None:
    for th in threading.enumerate():
        if th.name == name and th is not threading.current_thread():
            th.join(30.0)


def follow(log: Path, at: float, *, gpu: bool = True) -> Monitor:
    """A live monitor whose clock reads the trace's wall time ``at``, following ``log`` (read whole), after the process
    table, the server's poll and (``gpu``) the NVML reading the trace holds for ``at``: what vtop started then would show. The history
    file is read before the log is applied (the monitor reads it in a thread) and a ready start's save is waited for."""
    clock = clock_at(at)
    cfg = Config(urls=(URL,), log=str(log), no_gpu=not gpu)
    m = Monitor(cfg, clock=clock, log_watch=make_log_watch(cfg, clock=clock), find_logs=False)
    join("vtop-start-history")
    assert m.start_history is not None, "the monitor read no start history"
    m.add_cli_urls()
    m.apply_procs(procs_at(at))
    m.apply_server(URL, server_poll_at(at))
    if gpu:
        poll, names = nvml_at(at)
        m.apply_gpu(poll, names)
    lw = m.log_watch
    assert lw is not None
    total = -1
    while True:
        view = lw.poll()
        m.apply_log(view)
        if view.lines_total == total:
            break
        total = view.lines_total
    join("vtop-start-history-save")
    return m


def keep_first_two() -> None:
    """start-0 and start-1 kept in this box's start history ($XDG_STATE_HOME) by a vtop following their logs."""
    for k in (0, 1):
        follow(start_log(k), event("start_kept", k)["t"])


def third_start_app(log: Path) -> tuple[Any, FakeClock]:
    """The live screen (no polling of its own) following ``log``, empty until :func:`feed_third_start` writes it,
    its clock at the third start's launch."""
    from vtop.ui.app import VtopApp

    log.write_bytes(b"")
    clock = clock_at(float(event("start_begin", 2)["t"]))
    app = VtopApp(Config(urls=(URL,), log=str(log), history=60), gpu_source=None, autopoll=False,
                  hostname="h100 (recorded)", clock=clock, discover=lambda: [])
    return app, clock


async def feed_third_start(app: Any, clock: FakeClock, log: Path, until: float = WARMUP_AT) -> None:
    """Second by second from the third start's launch to ``until``: the NVML readings and server polls the trace
    took, its process table, the log as long as the index says it was; the app reads the log each second."""
    join("vtop-start-history")
    begin = float(event("start_begin", 2)["t"])
    data = start_log(2).read_bytes()
    prev, t = begin - 60.0, begin
    while True:
        clock.advance(max(0.0, t - clock.time()))
        for e in nvml_events():
            if prev < e.t <= t:
                app.apply_gpu(e.data, e.extra or {})
        for e in server_events():
            if max(prev, begin) < e.t <= t:
                app.apply_server(URL, e.data)
        app.apply_procs(procs_at(t))
        log.write_bytes(data[:log_size_at(2, t)])
        await app.poll_log_once()
        if t >= until:
            return
        prev, t = t, min(t + 1.0, until)
