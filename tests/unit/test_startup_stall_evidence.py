"""Item 4 of issue 24: a startup stall judged by evidence, per phase, on an injected clock.

A phase that prints progress stalls when its bar stops for several of its own steps (60 s at
least); a silent phase stalls when the log is silent AND the server's processes use no CPU AND
(where known) the GPU idles; a busy silent compile stays quiet; without CPU readings only the
10-minute ceiling applies. The log lines are real: the H200 start (vLLM 0.26.0, graph capture
frames) and the CPU start of tests/corpus/traces/startup-stall-compile up to the moment its
Worker was stopped ("Warming up model for the compilation...").
"""

from __future__ import annotations

import gzip
from dataclasses import replace
from pathlib import Path

from tests.helpers import diag_fixtures as F
from vtop.core.phases import Phase
from vtop.core.rules import Alert, Thresholds
from vtop.sources.discovery import ServerProcess, discover_servers

TRACE = Path(__file__).resolve().parents[1] / "corpus" / "traces" / "startup-stall-compile"
SIGSTOP_LOG_BYTES = 9310  # events.jsonl: log_size_at_sigstop


def _stall(alerts: list[Alert]) -> Alert | None:
    return next((a for a in alerts if a.rule == "startup_stall"), None)


def _cpu_tree(api: float | None, engine: float | None, worker: float | None) -> ServerProcess:
    """The CPU 0.32.0 server of the real ps capture, with CPU seconds as a process scan reads them."""
    s = F.cpu_process()
    cpu = {"engine": engine, "worker": worker}
    kids = tuple(replace(c, cpu=cpu.get(c.role, None if api is None else 0.5)) for c in s.children)
    return replace(s, cpu=api, children=kids)


def _compile_start() -> F.Session:
    """The real CPU start, up to the Worker's "Warming up model for the compilation..." (torch.compile)."""
    raw = gzip.decompress((TRACE / "log.bin.gz").read_bytes())[:SIGSTOP_LOG_BYTES]
    ses = F.Session(url="http://127.0.0.1:8011", process=_cpu_tree(None, None, None), log=True)
    ses.lines((ses.now, ln) for ln in raw.decode().splitlines())
    assert ses.log is not None and ses.log.current is Phase.TORCH_COMPILE
    return ses


def _run(ses: F.Session, seconds: int, cpu: tuple[float, float, float] | None, *, scan_every: int = 5,
         gpu_util: float | None = None) -> dict[int, Alert | None]:
    """Tick once a second for ``seconds``; a process scan every ``scan_every`` s whose CPU seconds grow
    by ``cpu`` (api, engine, worker) a second (None: no CPU reading at all)."""
    t0 = ses.now
    out: dict[int, Alert | None] = {}
    for i in range(1, seconds + 1):
        ses.to(t0 + i)
        if i % scan_every == 0:
            ses.process = (_cpu_tree(None, None, None) if cpu is None
                           else _cpu_tree(10 + cpu[0] * i, 40 + cpu[1] * i, 90 + cpu[2] * i))
        if gpu_util is not None:
            ses.gpu(F.gpu_poll(t0 + i, F.h200_sample(gpu_util, None, 10.0, [])))
        ses.refused(t0 + i)
        out[i] = _stall(ses.tick())
    return out


def _first(alerts: dict[int, Alert | None]) -> int | None:
    return next((i for i, a in sorted(alerts.items()) if a is not None), None)


def test_silent_compile_with_a_still_worker_is_named_within_90s_of_going_still() -> None:
    # The Worker stopped (0 CPU); the EngineCore spins waiting for it; the API server idles.
    ses = _compile_start()
    got = _run(ses, 120, (0.002, 1.0, 0.0))
    first = _first(got)
    assert first is not None and 45 <= first <= 55, first
    a = got[first]
    assert a is not None and a.severity == "warning"
    assert a.title.startswith("Startup of :8011 stalled in torch.compile: no new log line for ")
    ev = "\n".join(a.evidence)
    assert "VLLM::Worker (pid 13284) 0.00 s" in ev and "does not run" in ev, ev
    assert "kill -CONT" in a.fix[0] and any("py-spy" in f for f in a.fix)


def test_silent_compile_with_the_whole_tree_still_is_named() -> None:
    ses = _compile_start()
    first = _first(_run(ses, 120, (0.0, 0.0, 0.0)))
    assert first is not None and 45 <= first <= 55, first


def test_a_log_view_read_before_the_silence_still_counts_the_silence() -> None:
    # A replay reads the log only when it has lines: the view of the log is from the last line, and
    # the silence goes on after it. The rule counts it to now.
    ses = _compile_start()
    assert ses.log is not None
    q0 = ses.log.quiet(ses.now)
    t0 = ses.now
    first = None
    for i in range(1, 80):
        ses.to(t0 + i)
        if i % 5 == 0:
            ses.process = _cpu_tree(10.0, 40 + i, 90.0)
        ses.refused(t0 + i)
        if _stall(ses.tick(startup_quiet=q0)) is not None:
            first = i
            break
    assert first is not None and 45 <= first <= 55, first


def test_busy_silent_compile_stays_quiet() -> None:
    # torch.compile of a big model: minutes without a line, the Worker at a full core.
    ses = _compile_start()
    got = _run(ses, 400, (0.002, 0.05, 1.0))
    assert _first(got) is None


def test_still_cpu_but_busy_gpu_stays_quiet() -> None:
    ses = _compile_start()
    assert _first(_run(ses, 200, (0.0, 0.0, 0.0), gpu_util=100.0)) is None


def test_still_cpu_and_idle_gpu_is_named_with_the_gpu_evidence() -> None:
    ses = _compile_start()
    got = _run(ses, 120, (0.0, 0.0, 0.0), gpu_util=0.0)
    first = _first(got)
    assert first is not None and 45 <= first <= 55, first
    assert "GPU-Util 0 % over the same 45s" in "\n".join(got[first].evidence)  # type: ignore[union-attr]


def test_no_cpu_reading_falls_back_to_the_ten_minute_ceiling() -> None:
    # An old recording: the process table has no CPU seconds. Nothing is invented.
    ses = _compile_start()
    got = _run(ses, 610, None)
    first = _first(got)
    assert first is not None and 600 <= first <= 602, first
    assert "no new log line for 10m" in got[first].title  # type: ignore[union-attr]


def test_progress_that_stops_is_named_after_the_floor_and_well_within_90s() -> None:
    # The real H200 start (tests/fixtures/logs/vllm-0.26.0-h200-startup.log), its graph capture frames up
    # to "16/51" of the first bar, then nothing.
    lines = []
    for arr, ln in F.h200_log():
        lines.append((arr, ln))
        if "| 16/51 [" in ln:
            break
    ses = F.Session(process=F.h200_process(), log=True)
    ses.lines(lines)
    assert ses.log is not None
    q = ses.log.quiet(ses.now)
    assert q is not None and q.phase is Phase.CUDA_GRAPHS and q.progressing and q.step_s is not None
    assert q.step_s < 1.0  # 51 graphs in about a second
    t0 = lines[-1][0]
    seen: dict[int, Alert | None] = {}
    for i in range(1, 100):
        ses.refused(t0 + i)  # no CPU readings: the progress alone decides
        seen[i] = _stall(ses.tick())
    first = _first(seen)
    assert first is not None and 60 <= first <= 62, first
    a = seen[first]
    assert a is not None and "progress stopped" in " ".join(a.evidence) and "CUDA graph capture" in a.title


def test_slow_progress_waits_for_several_of_its_own_steps() -> None:
    # Weight shards 20 s apart (a slow disk): a 70 s gap is not a stall; 4 x 20 s = 80 s is.
    ses = F.Session(Thresholds(), process=F.h200_process(), log=True)
    lines = F.h200_log_until("Loading safetensors checkpoint shards")[:-1]
    ses.lines(lines)
    t0 = lines[-1][0]
    frame = "(EngineCore pid=1048) Loading safetensors checkpoint shards:  {p}% Completed | {n}/4 [{el}<00:40, 20.00s/it]"
    for n in range(3):
        ses.to(t0 + 20 * n)
        ses.lines([(ses.now, frame.format(p=25 * n, n=n, el=f"00:{20 * n:02d}"))])
    t1 = ses.now
    seen: dict[int, Alert | None] = {}
    for i in range(1, 100):
        ses.refused(t1 + i)
        seen[i] = _stall(ses.tick())
    assert _first(seen) in (80, 81), _first(seen)


def test_a_first_weight_shard_read_with_the_cpu_still_is_not_a_stall() -> None:
    # Loading weights waits on I/O (a slow disk, NFS): the processes are still while the first shard
    # (0/4, no step timed yet) is read. Only timed progress or the ceiling may call that a stall.
    raw = gzip.decompress((TRACE / "log.bin.gz").read_bytes()).decode()
    head = raw[: raw.index("Loading safetensors checkpoint shards")]
    ses = F.Session(url="http://127.0.0.1:8011", process=_cpu_tree(None, None, None), log=True)
    ses.lines((ses.now, ln) for ln in head.splitlines())
    ses.lines([(ses.now, "Loading safetensors checkpoint shards:   0% Completed | 0/4 [00:00<?, ?it/s]")])
    assert ses.log is not None and ses.log.current is Phase.WEIGHTS
    assert _first(_run(ses, 300, (0.0, 0.0, 0.0))) is None


def test_process_scans_carry_cpu_seconds_from_a_recording_and_bad_values_are_gaps() -> None:
    recs = [
        {"pid": 10, "ppid": 1, "name": "vllm", "cmdline": ["vllm", "serve", "m"], "create_time": 1.0, "cpu": 12.5},
        {"pid": 11, "ppid": 10, "name": "VLLM::Worker", "cmdline": ["VLLM::Worker"], "create_time": 2.0, "cpu": -1},
        {"pid": 12, "ppid": 10, "name": "VLLM::EngineCor", "cmdline": ["VLLM::EngineCore"], "create_time": 2.0},
    ]
    (s,) = discover_servers(recs)
    assert s.cpu == 12.5 and s.cpu_by_pid() == {10: 12.5}
    assert {c.pid: c.cpu for c in s.children} == {11: None, 12: None}


def test_vtop_recordings_carry_the_cpu_seconds_of_each_process() -> None:
    import json

    from vtop.sources.codec import process_from_json, process_to_json

    sp = _cpu_tree(10.25, 40.5, 90.75)
    back = process_from_json(json.loads(json.dumps(process_to_json(sp))))
    assert back.cpu_by_pid() == sp.cpu_by_pid() and back.cpu_by_pid()[13284] == 90.75
    # a recording made before the field: no reading, not a zero
    d = process_to_json(sp)
    d.pop("cpu")
    for c in d["children"]:
        c.pop("cpu")
    assert process_from_json(d).cpu_by_pid() == {}


def test_attached_during_the_silence_the_cpu_is_judged_over_what_vtop_watched() -> None:
    """doctor --window 15 started 73 s into a stall: the log's silence is already past 45 s, and
    the process table has only the window's scans. The still Worker is named from them (10 s at
    least); before, 45 s of scans were needed, longer than the window (the three silent startup
    stalls of the corpus exited 0 in `tests.corpus.window`)."""
    ses = _compile_start()
    assert _first(_run(ses, 50, None)) is None  # silent 50 s, no process readings yet (not attached)
    got = _run(ses, 40, (0.0, 0.0, 0.0))
    first = _first(got)
    assert first is not None and first <= 16, first  # scans at +5, +10, +15: 10 s of them
    a = got[first]
    assert a is not None and a.severity == "warning"
    ev = "\n".join(a.evidence)
    assert "(all vtop watched)" in ev and "read from the process table" in ev, ev


def test_attached_during_a_busy_silent_compile_stays_quiet() -> None:
    ses = _compile_start()
    _run(ses, 50, None)
    assert _first(_run(ses, 120, (0.002, 0.05, 1.0))) is None
    # and 5 s of still scans is too little to judge
    ses = _compile_start()
    _run(ses, 50, None)
    assert _first(_run(ses, 9, (0.0, 0.0, 0.0), scan_every=5)) is None
