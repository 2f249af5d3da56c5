"""Build what the diagnoser is fed (ServerViews, a GpuHistory, the startup tracker) from the
real recordings, and realistic synthetic traces where no recording has the fault.

Real: the H200 run of vLLM 0.26.0 (``tests/helpers/h200_replay.py``: startup, 200 requests at
concurrency 64, a burst of 1500 capped at 1024 running with 708 waiting, then a chat request
without ``max_tokens`` that ran 71 s to the 32,768-token limit), its log, the CPU 0.32.0
``/metrics`` payloads and ``ps`` capture, the failed H200 start, and vtop's own NVML recording
of a matmul loop and a tiny-kernel loop.

Synthetic traces start from a real payload and change only the numbers that the fault moves
(KV usage, preemptions, counters), with GPU samples shaped like the H200's.
"""

from __future__ import annotations

import calendar
import dataclasses
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from tests.conftest import FIXTURES
from tests.helpers import h200_replay as R
from vtop.clock import FakeClock
from vtop.core.evidence import Evidence, LogEvidence
from vtop.core.gpu_history import GpuHistory
from vtop.core.loghistory import LogHistoryView
from vtop.core.phases import PhaseTracker
from vtop.core.phases.types import LogLine, Quiet, StallInfo, StartupSnapshot
from vtop.core.requests.conns import ConnTracker
from vtop.core.requests.log import InFlight as RealInFlight
from vtop.core.rules import Alert, Diagnoser, Thresholds
from vtop.core.server import ServerTracker, ServerView
from vtop.core.start_history import StartUsual
from vtop.model.gpu import GpuPoll, GpuProcess, GpuSample
from vtop.sources.discovery import ProcRecord, ServerProcess, discover_servers
from vtop.sources.metrics_text import VllmMetrics, parse_vllm_metrics
from vtop.sources.recording.record import gpu_polls
from vtop.sources.vllm import ModelsInfo, ServerPoll, poll_from_body, poll_from_error

URL = R.URL
H200_TOTAL = 150754820096  # bytes, as NVML reports the H200 (header of the recordings)
GIB = 2**30
ENGINE_PID = 1048  # the H200 run's EngineCore (NVML's process list)
API_PID = 982
RUNAWAY_ID = "chatcmpl-a12b5f1ef68b9554"  # the runaway's id, from the recording's last chunk
RUNAWAY_FIRST_CHUNK_T = 1796032574.7641  # events.jsonl: runaway_first_chunk
RUNAWAY_MAX_TOKENS = 32768 - 140  # max_model_len - the 140 prompt tokens it had

LOGS = FIXTURES / "logs"
VLLM = FIXTURES / "vllm"


# --------------------------------------------------------------------------- processes


def h200_process(argv_extra: Sequence[str] = (), *, create_time: float = R.LAUNCH_T) -> ServerProcess:
    """The H200 run's server as discovery saw it (events.jsonl: launch command, EngineCore child)."""
    launch = next(
        json.loads(x) for x in (LOGS / "vllm-0.26.0-h200-startup.events.jsonl").read_text().splitlines()
        if '"vllm_launch"' in x
    )
    cmd = ["/opt/torch/.venv/bin/python3", *launch["cmd"], *argv_extra]
    recs = [
        ProcRecord(API_PID, 974, "vllm", tuple(cmd), create_time),
        ProcRecord(1047, API_PID, "python3", ("/opt/torch/.venv/bin/python3", "-B", "-c",
                                                "from multiprocessing.resource_tracker import main;main(45)"), create_time + 27),
        ProcRecord(ENGINE_PID, API_PID, "VLLM::EngineCor", ("VLLM::EngineCore" + " " * 120,), create_time + 27),
    ]
    (s,) = discover_servers(recs)
    return s


def cpu_process() -> ServerProcess:
    """The CPU 0.32.0 server from the real ``ps`` capture."""
    text = (FIXTURES / "procs" / "vllm-0.32.0-cpu-ps.txt").read_text()
    recs = []
    for line in text.splitlines():
        if not line.strip():
            if recs:
                break
            continue
        m = re.match(r"\s*(\d+)\s+(\d+)\s+(\S+)\s+(.*)$", line)
        if m:
            pid, ppid, comm, args = m.groups()
            recs.append(ProcRecord(int(pid), int(ppid), comm, tuple(args.split()), 1_796_030_000.0))
    (s,) = discover_servers(recs)
    return s


# --------------------------------------------------------------------------- metrics


@cache
def fixture_metrics(name: str) -> VllmMetrics:
    return parse_vllm_metrics((VLLM / name).read_bytes())


def poll(url: str, m: VllmMetrics, *, mono: float, wall_offset: float = R.LAUNCH_T - R.BASE,
         max_model_len: int | None = None, version: str = "0.26.0") -> ServerPoll:
    extra: dict[str, Any] = {"health": 200, "health_polled": True}
    if max_model_len is not None:
        extra.update(models=ModelsInfo(ids=("/tmp/tiny",), max_model_len=max_model_len, root="/tmp/tiny"),
                     version=version, info_polled=True)
    return poll_from_body(url, b"# replayed", t=mono + wall_offset, mono=mono, latency_s=0.012, metrics=m, **extra)


def grow(m: VllmMetrics, **kw: Any) -> VllmMetrics:
    """A copy of a real payload with some numbers moved (counters, gauges, finish reasons)."""
    return dataclasses.replace(m, **kw)


# --------------------------------------------------------------------------- GPU samples


def h200_sample(util: float | None, sm: float | None, mem_gib: float, procs: Iterable[tuple[int, float]] = (),
                index: int = 0) -> GpuSample:
    return GpuSample(
        index=index, name="NVIDIA H200", uuid=f"GPU-739f9fdb-80c6-58f1-6ba1-94770d44{index:04d}",
        util_gpu=util, util_mem=None, mem_used=int(mem_gib * GIB), mem_total=H200_TOTAL, power_w=120.0,
        power_limit_w=700.0, temp_c=40.0, sm_clock_mhz=1980.0, mem_clock_mhz=3201.0,
        procs=tuple(GpuProcess(pid, int(g * GIB)) for pid, g in procs), sm_active=sm,
    )


def gpu_poll(mono: float, *samples: GpuSample) -> GpuPoll:
    return GpuPoll(t=mono + R.LAUNCH_T - R.BASE, mono=mono, status="ok", gpus=tuple(samples))


# --------------------------------------------------------------------------- logs


def log_lines(path_or_text: Any) -> list[str]:
    text = path_or_text.read_text() if hasattr(path_or_text, "read_text") else str(path_or_text)
    return [ln for ln in text.splitlines()]


_STAMP = re.compile(r" (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")


def stamped(lines: Iterable[str], year: int = 2026) -> list[tuple[float, str]]:
    """(mono arrival, line): each line arrives at its own UTC stamp on the replay clock
    (the H200 host logged in UTC: launch 09:54:08, first line 09:54:35); unstamped lines
    (tqdm frames, tracebacks) arrive with the last stamped one."""
    out: list[tuple[float, str]] = []
    last = None
    for ln in lines:
        m = _STAMP.search(ln)
        if m:
            mo, d, hh, mi, ss = map(int, m.groups())
            last = R.mono_of(calendar.timegm((year, mo, d, hh, mi, ss)))
        out.append((last if last is not None else R.mono_of(R.LAUNCH_T), ln))
    return out


@cache
def h200_log() -> tuple[tuple[float, str], ...]:
    return tuple(stamped(log_lines(LOGS / "vllm-0.26.0-h200-startup.log")))


def tracker_through(lines: Iterable[tuple[float, str]]) -> PhaseTracker:
    tr = PhaseTracker(year=2026)
    for arr, ln in lines:
        tr.feed(ln, arr)
    return tr


# --------------------------------------------------------------------------- the H200 replay


@cache
def h200_items() -> tuple[tuple[float, str, Any], ...]:
    """(launch-relative t, "gpu"|"server", GpuPoll on the replay clock | ServerPoll), in time order."""
    out: list[tuple[float, str, Any]] = []
    for t, kind, item in R.timeline():
        if kind == "gpu":
            out.append((t - R.LAUNCH_T, kind, dataclasses.replace(item, mono=R.mono_of(t))))
        else:
            out.append((t - R.LAUNCH_T, kind, R.server_poll(item)))
    return tuple(out)


@dataclass(frozen=True)
class Tick:
    rel: float  # seconds since launch
    now: float
    alerts: tuple[Alert, ...]
    view: ServerView

    def rule(self, name: str) -> Alert | None:
        return next((a for a in self.alerts if a.rule == name), None)

    @property
    def loud(self) -> tuple[Alert, ...]:
        return tuple(a for a in self.alerts if a.severity != "info")


def runaway_requests(now: float) -> list[Any]:
    """The in-flight runaway as the request tracker would report it (no client max_tokens)."""
    start = R.mono_of(RUNAWAY_FIRST_CHUNK_T)
    if not start <= now <= R.mono_of(1796032645.73):
        return []
    return [InFlight(RUNAWAY_ID, now - start, True, RUNAWAY_MAX_TOKENS, True, since=start)]


def InFlight(request_id: str, age_s: float, age_is_upper_bound: bool, max_tokens: int | None,  # noqa: N802
             no_client_max_tokens: bool, *, since: float) -> RealInFlight:
    """A request in flight as the request tracker reports it (its log line came at ``since``)."""
    return RealInFlight(request_id, "/v1/chat/completions", since, age_s, age_is_upper_bound, max_tokens, None, None,
                        no_client_max_tokens)


def evidence(now: float, *, servers: Mapping[str, ServerView] | None = None, gpus: GpuHistory | None = None,
             startup: StartupSnapshot | None = None, startup_stall: StallInfo | None = None,
             startup_quiet: Quiet | None = None, log_lines: Sequence[LogLine] | None = None,
             requests: Mapping[str, Sequence[RealInFlight]] | None = None,
             request_logging: Mapping[str, bool] | None = None, log_target: str | None = None,
             log_history: LogHistoryView | None = None,
             logged_since_start: Sequence[tuple[float, int]] | None = None,
             conns: Mapping[str, ConnTracker] | None = None, wall: float | None = None,
             usual: StartUsual | None = None, proc_names: Mapping[int, str] | None = None) -> Evidence:
    """The :class:`Evidence` of one tick from its parts by name (a test's shorthand: the monitor
    builds it from its own state, ``Monitor.evidence``). The log's parts belong to ``log_target``."""
    log = None
    parts = (startup, startup_stall, startup_quiet, log_lines, requests, request_logging, log_history,
             logged_since_start, usual)
    if log_target is not None or any(p is not None for p in parts):
        tgt = log_target
        if tgt is None and servers and len(servers) == 1:
            tgt = next(iter(servers))
        log = LogEvidence(
            target=tgt, snapshot=startup, stall=startup_stall, quiet=startup_quiet, lines=tuple(log_lines or ()),
            inflight=tuple((requests or {}).get(tgt, ())) if tgt is not None else (),
            request_logging=(request_logging or {}).get(tgt) if tgt is not None else None,
            history=log_history, logged_since_start=logged_since_start, usual=usual,
        )
    return Evidence(now, servers or {}, gpus, log, conns or {}, wall=wall, proc_names=proc_names or {})


class Session:
    """One server (and the GPUs) fed by hand on a fake clock, as the app's tick would feed them."""

    def __init__(
        self,
        thresholds: Thresholds = Thresholds(),
        *,
        url: str = URL,
        process: Any = "unknown",
        start: float = R.BASE - 5,
        wall_offset: float = R.LAUNCH_T - R.BASE,
        log: bool = False,
        stall_s: float = 600.0,
    ) -> None:
        self.url = url
        self.clock = FakeClock(start=start, wall_offset=wall_offset)
        self.wall_offset = wall_offset
        self.server_tracker = ServerTracker(url, clock=self.clock)
        self.hist = GpuHistory(window_s=300.0)
        self.diag = Diagnoser(thresholds)
        self.log = PhaseTracker(year=2026) if log else None
        self.stall_s = stall_s
        self.process = process

    @property
    def now(self) -> float:
        return self.clock.monotonic()

    def to(self, mono: float) -> None:
        if mono > self.clock.monotonic():
            self.clock.advance(mono - self.clock.monotonic())

    def gpu(self, p: GpuPoll) -> None:
        self.to(p.mono)
        self.hist.add(p)

    def server(self, p: ServerPoll, process: Any = ...) -> None:
        self.to(p.mono)
        self.server_tracker.feed(p, process=self.process if process is ... else process)

    def metrics(self, m: VllmMetrics, *, mono: float, max_model_len: int | None = None, version: str = "0.26.0") -> None:
        self.server(poll(self.url, m, mono=mono, wall_offset=self.wall_offset, max_model_len=max_model_len,
                         version=version))

    def refused(self, mono: float) -> None:
        self.server(poll_from_error(self.url, "refused", t=mono + self.wall_offset, mono=mono))

    def lines(self, lines: Iterable[tuple[float, str]]) -> None:
        assert self.log is not None
        for arr, ln in lines:
            self.log.feed(ln, arr)

    def tick(self, **kw: Any) -> list[Alert]:
        now = self.now
        if self.log is not None:
            kw.setdefault("startup", self.log.snapshot())
            kw.setdefault("startup_stall", self.log.stalled(now, self.stall_s))
            kw.setdefault("startup_quiet", self.log.quiet(now))
            kw.setdefault("log_lines", self.log.recent(limit=200))
        kw.setdefault("log_target", self.url)
        kw.setdefault("wall", self.clock.time())
        return self.diag.update(evidence(now, servers={self.url: self.server_tracker.view()}, gpus=self.hist, **kw))


def replay_h200(
    thresholds: Thresholds = Thresholds(),
    *,
    process: ServerProcess | None | str = "h200",
    with_log: bool = True,
    requests: Callable[[float], list[Any]] | None = None,
    request_logging: bool | None = False,
    until: float = 1e9,
    session: Session | None = None,
) -> list[Tick]:
    """Feed the whole H200 recording (GPU at 5 Hz, /metrics at 1 Hz, the log at its stamps) and
    run the diagnoser after every scrape, as the app's tick would. Pass ``session`` to keep
    feeding it afterwards."""
    if session is not None:
        proc: Any = session.process
    else:
        proc = h200_process() if process == "h200" else (process if process is not None else "unknown")
    ses = session or Session(thresholds, process=proc, log=with_log)
    log = list(h200_log()) if ses.log is not None else []
    li = 0
    ticks: list[Tick] = []
    for rel, kind, item in h200_items():
        if rel > until:
            break
        if kind == "gpu":
            ses.gpu(item)
            continue
        # The process exists from launch until it exits (events.jsonl: vllm_exited at +203.4 s).
        alive = rel < 203.4
        ses.server(item, process=proc if alive or isinstance(proc, str) else None)
        now = ses.now
        while li < len(log) and log[li][0] <= now:
            ses.log.feed(log[li][1], log[li][0])  # type: ignore[union-attr]
            li += 1
        alerts = ses.tick(
            requests={URL: requests(now)} if requests is not None else None,
            request_logging={URL: request_logging} if request_logging is not None else None,
        )
        ticks.append(Tick(rel, now, tuple(alerts), ses.server_tracker.view()))
    return ticks


def at(ticks: Sequence[Tick], rel: float) -> Tick:
    """The last tick at or before ``rel`` seconds after launch."""
    best = ticks[0]
    for t in ticks:
        if t.rel <= rel + 1e-6:
            best = t
        else:
            break
    return best


# --------------------------------------------------------------------------- vtop's own H200 GPU recording


@cache
def matmul_tiny_polls() -> tuple[GpuPoll, ...]:
    """vtop's 1 Hz NVML recording of the H200: idle, bf16 matmul (util 99 %, SM 95 %),
    tiny kernels (util ~19.5 %, SM ~0.09 %), idle."""
    return tuple(gpu_polls(FIXTURES / "nvml" / "h200-vtop-session-matmul-tiny.jsonl"))


@cache
def live_run_records() -> tuple[dict[str, Any], ...]:
    """The second real H200 run (vtop watching live): its /metrics once a second; its
    runaway was cancelled by the client after 40 s (an abort: running drops, no 'length')."""
    import lzma

    with lzma.open(FIXTURES / "h200-vtop-live" / "metrics-timeline.jsonl.xz", "rt") as f:
        return tuple(json.loads(x) for x in f if x.strip())


def replay_live_run(thresholds: Thresholds = Thresholds()) -> list[tuple[float, tuple[Alert, ...], ServerView]]:
    recs = live_run_records()
    t0 = 1796040827.4136  # its vllm_launch
    clock = FakeClock(start=R.BASE - 5, wall_offset=t0 - R.BASE)
    st = ServerTracker(URL, clock=clock)
    diag = Diagnoser(thresholds)
    out = []
    for r in recs:
        t = float(r["t"])
        mono = R.BASE + (t - t0)
        if mono > clock.monotonic():
            clock.advance(mono - clock.monotonic())
        if "text" in r:
            p = poll_from_body(URL, r["text"], t=t, mono=mono, latency_s=r.get("dt"), health=200, health_polled=True)
        else:
            p = poll_from_error(URL, "refused", t=t, mono=mono)
        st.feed(p, process="unknown")
        v = st.view()
        out.append((t - t0, tuple(diag.update(evidence(clock.monotonic(), servers={URL: v}))), v))
    return out


__all__ = [
    "GIB", "H200_TOTAL", "InFlight", "Session", "evidence", "Tick", "URL", "at", "cpu_process", "fixture_metrics", "gpu_poll", "grow",
    "h200_items", "h200_log", "h200_process", "h200_sample", "log_lines", "matmul_tiny_polls", "poll",
    "replay_h200", "replay_live_run", "runaway_requests", "stamped", "tracker_through",
]


def h200_log_until(text: str) -> list[tuple[float, str]]:
    """The H200 start's log up to and including the first line containing ``text``."""
    out = []
    for arr, ln in h200_log():
        out.append((arr, ln))
        if text in ln:
            return out
    raise AssertionError(f"{text!r} not in the H200 log")


def stamp_of(mono: float) -> str:
    """``11-30 09:56:40``: a log stamp for a moment on the replay clock (the host logged UTC)."""
    import time as _t

    return _t.strftime("%m-%d %H:%M:%S", _t.gmtime(mono - R.BASE + R.LAUNCH_T))


def engine_oom_lines(mono: float, torch_msg: str, *, at_start: bool) -> list[tuple[float, str]]:
    """A CUDA OOM in the EngineCore as vLLM 0.26 logs it (logger.exception lines, then the
    frontend's reaction), arriving at ``mono``."""
    s = stamp_of(mono)
    e = f"(EngineCore pid={ENGINE_PID}) ERROR {s} [core.py:1330] "
    if at_start:
        body = [
            e + "EngineCore failed to start.",
            e + "Traceback (most recent call last):",
            e + '  File "/tmp/site/vllm/v1/engine/core.py", line 1299, in run_engine_core',
            e + "    engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)",
            e + '  File "/tmp/site/vllm/v1/worker/gpu_worker.py", line 512, in determine_available_memory',
            e + "    self.model_runner.profile_run()",
            e + '  File "/tmp/site/torch/nn/modules/module.py", line 1775, in _call_impl',
            e + "    return forward_call(*args, **kwargs)",
            e + torch_msg,
            f"(APIServer pid={API_PID}) RuntimeError: Engine core initialization failed. See root cause above. "
            "Failed core proc(s): {}",
        ]
    else:
        a = f"(APIServer pid={API_PID}) ERROR {s} [async_llm.py:547] "
        e = f"(EngineCore pid={ENGINE_PID}) ERROR {s} [core.py:1010] "
        body = [
            e + "EngineCore encountered a fatal error.",
            e + "Traceback (most recent call last):",
            e + '  File "/tmp/site/vllm/v1/engine/core.py", line 1001, in run_engine_core',
            e + "    engine_core.run_busy_loop()",
            e + '  File "/tmp/site/vllm/v1/worker/gpu/model_runner.py", line 902, in execute_model',
            e + "    hidden_states = self.model(input_ids, positions)",
            e + torch_msg,
            a + "AsyncLLM output_handler failed.",
            a + "Traceback (most recent call last):",
            a + "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
            "for the root cause.",
        ]
    return [(mono, ln) for ln in body]


def torch_oom(tried: str = "2.00 GiB", free: str = "1.06 GiB", others: Sequence[tuple[int, str]] = (),
              this: str = "138.64 GiB", allocated: str = "135.10 GiB", reserved_free: str = "1.91 GiB") -> str:
    """torch's CUDA OOM message, word for word (c10/cuda/CUDACachingAllocator.cpp)."""
    procs = "".join(f"Process {pid} has {amt} memory in use. " for pid, amt in others)
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried}. GPU 0 has a total capacity of "
        f"139.72 GiB of which {free} is free. {procs}Including non-PyTorch memory, this process has {this} memory in "
        f"use. Of the allocated memory {allocated} is allocated by PyTorch, and {reserved_free} is reserved by PyTorch "
        "but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
        "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )
