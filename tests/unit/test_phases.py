"""PhaseTracker on the real recorded vLLM logs, plus the parser and the tracker's edge cases."""

from __future__ import annotations

import calendar
import json
from pathlib import Path

import pytest

from vtop.core.phases import (
    DEFAULT_STALL_S,
    Phase,
    PhaseTracker,
    banner_version,
    parse_line,
    split_glued,
    strip_ansi,
)
from vtop.core.rules.startup import failure_words
from vtop.sources.logtail import LineSplitter

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
H200 = LOGS / "vllm-0.26.0-h200-startup.log"
H200_EVENTS = LOGS / "vllm-0.26.0-h200-startup.events.jsonl"
H200_FAIL = LOGS / "vllm-0.26.0-h200-failure.log"
H200_FAIL_EVENTS = LOGS / "vllm-0.26.0-h200-failure.events.jsonl"
CPU = LOGS / "vllm-0.32.0-cpu-startup.log"
CPU_SHUTDOWN = LOGS / "vllm-0.32.0-cpu-shutdown.log"
ALL = list(Phase)


def lines_of(path: Path) -> list[str]:
    sp = LineSplitter()
    return sp.feed(path.read_bytes()) + sp.flush()


def launch_of(events: Path) -> float:
    return next(e["t"] for e in map(json.loads, events.read_text().splitlines()) if e.get("ev") == "vllm_launch")


def replay(path: Path, launch: float | None = None, upto: str | None = None) -> PhaseTracker:
    tr = PhaseTracker(year=2026)
    if launch is not None:
        tr.mark_process_start(launch, utc_offset_s=0)  # the recordings stamp lines in UTC
    for line in lines_of(path):
        if upto is not None and upto in line:
            break
        tr.feed(line, 0.0)
    return tr


def stamp_s(line: str) -> float | None:
    ev = parse_line(line)
    if ev.stamp is None:
        return None
    mon, day, hh, mi, ss = ev.stamp
    return float(calendar.timegm((2026, mon, day, hh, mi, ss)))


# --------------------------------------------------------------------------- real H200 cold start


def test_h200_cold_start_sequence_durations_and_facts() -> None:
    launch = launch_of(H200_EVENTS)
    snap = replay(H200, launch).snapshot()
    assert snap.sequence == tuple(ALL)
    assert snap.ready_source == "log"
    assert snap.total_s is not None and 84.0 <= snap.total_s <= 86.0  # /health said 85.63 s
    durations = {v.phase: v.duration_s for v in snap.phases}
    assert durations == {
        Phase.PROCESS_START: pytest.approx(45.08, abs=0.01),  # includes the 19 s EngineCore spawn
        Phase.ENGINE_INIT: 3.0,
        Phase.WEIGHTS: 1.0,
        Phase.TORCH_COMPILE: 12.0,  # log says 11.24 s; stamps are whole seconds
        Phase.MEMORY_PROFILING: 3.0,
        Phase.KV_CACHE: 0.0,
        Phase.CUDA_GRAPHS: 1.0,
        Phase.WARMUP: 18.0,  # the silent gap after capture
        Phase.API_SERVER: 1.0,
        Phase.READY: 0.0,
    }
    graphs = snap.phase(Phase.CUDA_GRAPHS)
    assert graphs is not None
    assert [(p.label, p.n, p.total) for p in graphs.progress] == [("PIECEWISE", 51, 51), ("FULL", 51, 51)]
    weights = snap.phase(Phase.WEIGHTS)
    assert weights is not None and weights.progress_for("shards") is not None
    assert weights.progress_for("shards").fraction == 1.0  # type: ignore[union-attr]
    f = snap.facts
    assert (f.version, f.model, f.engine_version) == ("0.26.0", "/tmp/tiny", "0.26.0")
    assert f.kv_cache_tokens == 9_103_456
    assert f.max_concurrency == 277.82 and f.max_concurrency_len == 32_768
    assert f.kv_cache_gib == 69.45
    assert (f.model_memory_gib, f.model_load_s, f.weights_load_s) == (0.04, 1.901931, 0.02)
    assert (f.compile_s, f.compile_cached, f.profile_run_s) == (11.24, False, 0.25)
    assert (f.graph_capture_s, f.graph_memory_gib) == (1.0, 0.19)
    assert (f.init_engine_s, f.init_compilation_s) == (33.98, 11.24)
    assert f.url == "http://127.0.0.1:8000" and f.max_model_len == 32_768
    assert (f.tensor_parallel_size, snap.world_size, f.enforce_eager) == (1, 1, False)


def test_h200_phase_offsets_match_the_recipe_readme() -> None:
    """real-vllm/gpu/README.md §4, cold column: seconds after launch of each phase's first line."""
    launch = launch_of(H200_EVENTS)
    snap = replay(H200, launch).snapshot()
    t0 = snap.started
    assert t0 is not None and abs(t0 - launch) < 1e-6

    def at(phase: Phase, end: bool = False) -> float:
        v = snap.phase(phase)
        assert v is not None and v.start is not None and v.end is not None
        return round((v.end if end else v.start) - t0)

    assert at(Phase.ENGINE_INIT) == 45
    assert at(Phase.WEIGHTS) == 48
    assert at(Phase.WEIGHTS, end=True) == 49
    assert at(Phase.TORCH_COMPILE, end=True) == 61
    assert at(Phase.KV_CACHE) == 64
    assert at(Phase.CUDA_GRAPHS, end=True) == 65
    assert at(Phase.WARMUP, end=True) == 83
    assert at(Phase.READY) == 84


def test_h200_log_ends_stopped_after_the_shutdown_but_keeps_the_timeline() -> None:
    tr = replay(H200, launch_of(H200_EVENTS))
    snap = tr.snapshot()
    assert snap.state == "stopped"
    assert snap.failure is None  # the shutdown's force-kill warning is not a failure
    assert snap.ready_at is not None
    assert tr.stalled(now=1e12) is None


def test_h200_ready_before_shutdown_and_idle_is_not_a_stall() -> None:
    tr = replay(H200, launch_of(H200_EVENTS), upto="[shutdown]")
    assert tr.state == "ready"
    assert tr.stalled(now=10**9, threshold_s=1.0) is None


def test_h200_silent_gaps_are_not_stalls_at_the_default_threshold() -> None:
    """Replay live: each line arrives at its own stamp. Three gaps of 18-30 s must not trip 10 min."""
    launch = launch_of(H200_EVENTS)
    default = PhaseTracker(year=2026)
    tight = PhaseTracker(year=2026)
    for tr in (default, tight):
        tr.mark_process_start(launch, utc_offset_s=0, arrival=launch)
    now = launch
    flagged: list[tuple[float, Phase | None, float]] = []
    for line in lines_of(H200):
        s = stamp_s(line)
        if s is not None and s > now:
            # Just before this line arrives, after the silence.
            before = s - 0.01
            assert default.stalled(before) is None
            st = tight.stalled(before, threshold_s=15.0)
            if st is not None and (not flagged or flagged[-1][1] != st.phase or st.silent_s < flagged[-1][2]):
                flagged.append((before, st.phase, st.silent_s))
            now = s
        default.feed(line, now)
        tight.feed(line, now)
        if "Application startup complete." in line:
            break
    # A 15 s threshold would have flagged exactly the three real gaps.
    assert [(p, round(s)) for _, p, s in flagged] == [
        (Phase.PROCESS_START, 26),  # launch -> banner (imports)
        (Phase.PROCESS_START, 19),  # banner -> EngineCore (spawn + imports)
        (Phase.WARMUP, 18),  # graph capture -> "init engine took"
    ]
    assert default.state == "ready"
    assert default.stalled(now + 3600) is None


def test_h200_log_pane_ring_keeps_levels() -> None:
    tr = replay(H200, launch_of(H200_EVENTS))
    warnings = tr.recent(min_level="WARNING")
    texts = [ln.text for ln in warnings]
    assert any("Found ulimit of 20000" in t for t in texts)
    assert any(t.startswith("[W1130 09:54:55") for t in texts)  # c10d warning, no prefix
    assert any("UserWarning: resource_tracker" in t for t in texts)
    assert all(ln.at_least("WARNING") for ln in warnings)
    # 51-frame tqdm bars collapse to their last frame in the pane.
    frames = [ln.text for ln in tr.recent() if ln.progress]
    assert sum("PIECEWISE" in t for t in frames) == 1
    assert any("51/51" in t and "FULL" in t for t in frames)
    assert tr.recent(limit=3)[-1].text == tr.recent()[-1].text


# --------------------------------------------------------------------------- real failure, CPU, restart


def test_h200_failure_ends_failed_on_the_flashinfer_line() -> None:
    launch = launch_of(H200_FAIL_EVENTS)
    tr = replay(H200_FAIL, launch)
    snap = tr.snapshot()
    assert snap.state == "failed"
    assert snap.sequence == (Phase.PROCESS_START, Phase.ENGINE_INIT, Phase.WEIGHTS)
    fail = snap.failure
    assert fail is not None
    assert fail.kind == "module_not_found"
    assert fail.line == (
        "(EngineCore pid=815) ERROR 11-30 09:53:37 [core.py:1330] ModuleNotFoundError: No module named 'flashinfer'"
    )
    fix = failure_words(fail).fix  # the words are the startup rules'
    assert "VLLM_USE_FLASHINFER_SAMPLER=0" in fix and "flashinfer-python" in fix
    assert fail.phase is Phase.WEIGHTS  # died right after the weights, in the sampler's import
    # README §4: "the EngineCore at +80 s, the weights at +84 s".
    engine = snap.phase(Phase.ENGINE_INIT)
    assert engine is not None and engine.start is not None and snap.started is not None
    assert round(engine.start - snap.started) == 80
    assert all(v.done for v in snap.phases)
    assert tr.stalled(now=1e12) is None
    assert tr.error_count > 40  # both tracebacks are counted as errors for the pane


def test_cpu_032_start_without_cuda_graphs() -> None:
    header = CPU.read_text().splitlines()[1]  # "# launched 11-30 09:34:52.138, /health 200 at ..."
    assert header.startswith("# launched 11-30 09:34:52.138")
    launch = calendar.timegm((2026, 11, 30, 9, 34, 52)) + 0.138
    snap = replay(CPU, launch).snapshot()
    assert snap.state == "ready"
    assert snap.sequence == (
        Phase.PROCESS_START,
        Phase.ENGINE_INIT,
        Phase.WEIGHTS,
        Phase.TORCH_COMPILE,
        Phase.MEMORY_PROFILING,
        Phase.KV_CACHE,
        Phase.WARMUP,
        Phase.API_SERVER,
        Phase.READY,
    )
    assert snap.total_s == pytest.approx(49.862, abs=0.01)  # /health 200 came at +52.4 s
    d = {v.phase: v.duration_s for v in snap.phases}
    assert d[Phase.TORCH_COMPILE] == 18.0 and d[Phase.WARMUP] == 3.0
    f = snap.facts
    assert (f.kv_cache_tokens, f.max_concurrency, f.max_concurrency_len) == (524_288, 256.0, 2048)
    assert (f.version, f.init_engine_s, f.kv_cache_gib) == ("0.32.0", 21.04, 1.0)
    assert f.url == "http://127.0.0.1:8011"
    weights = snap.phase(Phase.WEIGHTS)
    assert weights is not None and [r.name for r in weights.ranks] == ["Worker"]


def test_cpu_shutdown_excerpt_is_inferred_ready_then_stopped() -> None:
    snap = replay(CPU_SHUTDOWN).snapshot()
    assert snap.state == "stopped"
    assert snap.ready_source == "inferred"
    assert snap.phases == ()
    assert snap.failure is None


def test_failure_then_restart_resets_the_timeline() -> None:
    tr = PhaseTracker(year=2026)
    for line in lines_of(H200_FAIL):
        tr.feed(line, 0.0)
    assert tr.state == "failed"
    for line in lines_of(H200):
        tr.feed(line, 1.0)
        if "Application startup complete." in line:
            break
    snap = tr.snapshot()
    assert snap.restarts == 1
    assert snap.state == "ready" and snap.failure is None
    assert snap.sequence == tuple(ALL)
    assert snap.facts.kv_cache_tokens == 9_103_456
    assert any("flashinfer" in ln.text for ln in tr.recent(min_level="ERROR"))  # the pane keeps history


def test_health_200_marks_ready() -> None:
    tr = replay(H200, upto="Application startup complete.")
    assert tr.state == "starting" and tr.current is Phase.API_SERVER
    tr.mark_ready(5.0)
    snap = tr.snapshot()
    assert snap.state == "ready" and snap.ready_source == "health"
    assert snap.current is Phase.READY
    tr.feed("(APIServer pid=982) INFO:     Application startup complete.", 6.0)
    assert tr.snapshot().ready_source == "health"


# --------------------------------------------------------------------------- the line parser


@pytest.mark.parametrize(
    ("line", "kind", "level", "proc", "pid", "src", "msg"),
    [
        (
            "INFO 11-07 17:49:14 api_server.py:530] vLLM API server version 0.6.3.post1",
            "record",
            "INFO",
            None,
            None,
            "api_server.py",
            "vLLM API server version 0.6.3.post1",
        ),
        (
            "WARNING 09-03 16:28:08 [__init__.py:241] Automatically detected platform cuda.",
            "record",
            "WARNING",
            None,
            None,
            "__init__.py",
            "Automatically detected platform cuda.",
        ),
        (
            "\x1b[1;36m(VllmWorker rank=1 pid=2002)\x1b[0;0m INFO 04-10 03:41:33 [loader.py:458] Loading weights took 1 seconds",
            "record",
            "INFO",
            "VllmWorker rank=1",
            2002,
            "loader.py",
            "Loading weights took 1 seconds",
        ),
        (
            "^[[0;36m(APIServer pid=31)^[[0;0m DEBUG 10-21 09:11:34 [v1/engine/core.py:12] x",
            "record",
            "DEBUG",
            "APIServer",
            31,
            "v1/engine/core.py",
            "x",
        ),
        (
            "(Worker_PP1_TP0 pid=7) ERROR 01-02 03:04:05.123 [gpu_worker.py:1] boom",
            "record",
            "ERROR",
            "Worker_PP1_TP0",
            7,
            "gpu_worker.py",
            "boom",
        ),
        (
            "(APIServer pid=982) INFO 11-30 09:54:35 [api_utils.py:345] ",
            "record",
            "INFO",
            "APIServer",
            982,
            "api_utils.py",
            "",
        ),
        (
            "(APIServer pid=982) INFO:     Application startup complete.",
            "uvicorn",
            "INFO",
            "APIServer",
            982,
            None,
            "Application startup complete.",
        ),
        (
            "INFO:     Started server process [6539]",
            "uvicorn",
            "INFO",
            None,
            None,
            None,
            "Started server process [6539]",
        ),
        ("(EngineCore pid=1048) ", "blank", None, "EngineCore", 1048, None, ""),
        (
            "(EngineCore pid=815)     from flashinfer import (",
            "raw",
            None,
            "EngineCore",
            815,
            None,
            "    from flashinfer import (",
        ),
        (
            "2026-04-10T08:52:19.57Z stdout F (APIServer pid=1) INFO 04-10 08:52:19 [a.py:1] hello",
            "record",
            "INFO",
            "APIServer",
            1,
            "a.py",
            "hello",
        ),
        (
            "vllm-1  | INFO:     Application startup complete.",
            "uvicorn",
            "INFO",
            None,
            None,
            None,
            "Application startup complete.",
        ),
        (
            "myhost: INFO 04-10 08:52:19 [a.py:1] with a VLLM_LOGGING_PREFIX",
            "record",
            "INFO",
            None,
            None,
            "a.py",
            "with a VLLM_LOGGING_PREFIX",
        ),
        (
            "Capturing CUDA graphs (PIECEWISE):  14%|█▎        | 7/51 [00:00<00:00, 68.16it/s]",
            "progress",
            None,
            None,
            None,
            None,
            "Capturing CUDA graphs (PIECEWISE):  14%|█▎        | 7/51 [00:00<00:00, 68.16it/s]",
        ),
        ("Traceback (most recent call last):", "raw", None, None, None, None, "Traceback (most recent call last):"),
    ],
)
def test_parse_line_formats(
    line: str, kind: str, level: str | None, proc: str | None, pid: int | None, src: str | None, msg: str
) -> None:
    ev = parse_line(line)
    assert (ev.kind, ev.level, ev.proc, ev.pid, ev.source, ev.message) == (kind, level, proc, pid, src, msg)
    assert "\x1b" not in ev.text


def test_parse_line_stamp_and_never_raises_on_junk() -> None:
    assert parse_line("INFO 11-07 17:49:14 a.py:1] x").stamp == (11, 7, 17, 49, 14)
    for junk in ["", "\x00\xff", "(x pid=) INFO", "INFO 99-99 99:99:99 [a.py:1] x", "]" * 1000, "\x1b[" * 10]:
        parse_line(junk)
    tr = PhaseTracker(year=2026)
    tr.feed("INFO 99-99 99:99:99 [a.py:1] Loading weights took 1 seconds", 0.0)  # bad date: arrival time


def test_text_helpers() -> None:
    assert strip_ansi("\x1b[1;36m(APIServer pid=31)\x1b[0;0m x") == "(APIServer pid=31) x"
    assert strip_ansi("^[[0;36m(A pid=1)^[[0;0m y") == "(A pid=1) y"
    glued = "Capturing CUDA graphs:  96%|███| 65/67 [00:15<00:00,  4.58it/s](Worker_TP2_EP2 pid=2709392) INFO 09-29 10:00:00 [a.py:1] next"
    assert split_glued(glued) == [
        "Capturing CUDA graphs:  96%|███| 65/67 [00:15<00:00,  4.58it/s]",
        "(Worker_TP2_EP2 pid=2709392) INFO 09-29 10:00:00 [a.py:1] next",
    ]
    quoted = "INFO 09-29 10:00:00 [a.py:1] the user wrote INFO 09-29 10:00:00 in a prompt"
    assert split_glued(quoted) == [quoted]
    assert banner_version(" ▄▄ ▄█ █     █     █ ▀▄▀ █\x1b[0m  version \x1b[1m0.19.0\x1b[0m") == "0.19.0"
    assert banner_version("Using FlashAttention version 3") is None
    assert banner_version("x vLLM server version 0.20.2, serving model m") == "0.20.2"


# --------------------------------------------------------------------------- errors


def _starting(*lines: str) -> PhaseTracker:
    tr = PhaseTracker(year=2026)
    tr.feed("(APIServer pid=1) INFO 05-01 10:00:00 [api_server.py:1] vLLM API server version 0.11.0", 0.0)
    tr.feed(
        "(EngineCore_DP0 pid=2) INFO 05-01 10:00:05 [core.py:1] Initializing a V1 LLM engine (v0.11.0) with config: model='m', tensor_parallel_size=2, pipeline_parallel_size=1, enforce_eager=False",
        1.0,
    )
    for i, line in enumerate(lines):
        tr.feed(line, 2.0 + i)
    return tr


@pytest.mark.parametrize(
    ("line", "kind", "in_fix"),
    [
        (
            "(Worker_TP0 pid=3) ERROR 05-01 10:01:00 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity of 79.19 GiB",
            "cuda_oom",
            "--enforce-eager",
        ),
        (
            "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.",
            "kv_no_memory",
            "--gpu-memory-utilization",
        ),
        (
            "(EngineCore_DP0 pid=2) ERROR 05-01 10:01:00 [core.py:1] ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is needed, which is larger than the available KV cache memory (9.05 GiB). Based on the available memory, the estimated maximum model length is 74128. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
            "max_model_len",
            "--max-model-len 74128",
        ),
        (
            "(EngineCore_DP0 pid=2) ERROR 05-01 10:01:00 [multiproc_executor.py:1] Worker proc VllmWorker-1 died unexpectedly (exit code: -9), shutting down executor.",
            "worker_died",
            "OOM killer",
        ),
        (
            "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
            "engine_init_failed",
            "root cause",
        ),
        (
            "(EngineCore_DP0 pid=2) ModuleNotFoundError: No module named 'foo_kernels.ops'",
            "module_not_found",
            "pip install foo_kernels",
        ),
    ],
)
def test_error_signatures_end_the_start(line: str, kind: str, in_fix: str) -> None:
    tr = _starting(line)
    snap = tr.snapshot()
    assert snap.state == "failed"
    assert snap.failure is not None and snap.failure.kind == kind
    assert in_fix in failure_words(snap.failure).fix
    assert snap.failure.line == strip_ansi(line)
    assert tr.stalled(now=1e9) is None


def test_specific_cause_seen_before_the_generic_marker_is_kept() -> None:
    tr = _starting(
        "(Worker_TP1 pid=4) ERROR 05-01 10:01:00 [worker.py:1] WorkerProc hit an exception.",
        "(Worker_TP1 pid=4) ERROR 05-01 10:01:00 [worker.py:1] KeyError: 'model.layers.0.weight'",
        "(EngineCore_DP0 pid=2) ERROR 05-01 10:01:01 [core.py:1] EngineCore failed to start.",
        "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above.",
    )
    fail = tr.snapshot().failure
    assert fail is not None and fail.kind == "exception"
    assert fail.line.endswith("KeyError: 'model.layers.0.weight'")


def test_warnings_and_request_errors_are_not_failures() -> None:
    tr = _starting(
        "(APIServer pid=1) WARNING 05-01 10:00:06 [x.py:1] Failed to import: ModuleNotFoundError: No module named 'x'",
        "(APIServer pid=1) WARNING 05-01 10:00:06 [x.py:1] torch.OutOfMemoryError: CUDA out of memory. retrying",
    )
    assert tr.state == "starting"
    tr.feed("(APIServer pid=1) INFO:     Application startup complete.", 10.0)
    tr.feed("(APIServer pid=1) ERROR 05-01 10:05:00 [serving.py:1] Error in chat completion", 11.0)
    tr.feed("(APIServer pid=1) Traceback (most recent call last):", 11.0)
    tr.feed('(APIServer pid=1)   File "x.py", line 1, in f', 11.0)
    tr.feed("(APIServer pid=1) ValueError: bad request", 11.0)
    assert tr.state == "ready"


def test_engine_death_after_ready_fails_but_not_after_a_shutdown() -> None:
    tr = _starting("(APIServer pid=1) INFO:     Application startup complete.")
    tr.feed(
        "(APIServer pid=1) ERROR 05-01 10:09:00 [utils.py:1] Engine core process EngineCore_DP0 died unexpectedly.",
        20.0,
    )
    snap = tr.snapshot()
    assert snap.state == "failed" and snap.failure is not None and snap.failure.kind == "engine_died"
    assert snap.failure.phase is Phase.READY

    tr2 = _starting("(APIServer pid=1) INFO:     Application startup complete.")
    tr2.feed("(APIServer pid=1) INFO 05-01 10:09:00 [launcher.py:1] [shutdown] API server: shutdown triggered", 20.0)
    tr2.feed(
        "(APIServer pid=1) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.",
        21.0,
    )
    assert tr2.state == "stopped" and tr2.snapshot().failure is None


def test_uncaught_traceback_during_startup_fails() -> None:
    tr = _starting(
        "(APIServer pid=1) Traceback (most recent call last):",
        '(APIServer pid=1)   File "/x/serve.py", line 1, in cmd',
        "(APIServer pid=1) ValueError: max_num_batched_tokens (2048) is smaller than max_model_len (8192).",
    )
    fail = tr.snapshot().failure
    assert fail is not None and fail.kind == "exception" and "ValueError" in failure_words(fail).message


# --------------------------------------------------------------------------- stall, time, ring


def test_stall_reports_phase_and_hint_and_progress_counts_as_activity() -> None:
    tr = _starting("(Worker_TP0 pid=3) INFO 05-01 10:00:10 [r.py:1] Starting to load model m...")
    assert tr.stalled(now=2.0 + 30, threshold_s=60) is None
    st = tr.stalled(now=2.0 + 61, threshold_s=60)
    assert st is not None and st.phase is Phase.WEIGHTS and st.label == "loading weights"
    assert "Starting to load model" in st.last_line and "disk" in st.hint
    frame = "(Worker_TP0 pid=3) Loading safetensors checkpoint shards:  50% Completed | 2/4 [00:30<00:30, 15.0s/it]"
    tr.feed(frame, 62.0)
    assert tr.stalled(now=100.0, threshold_s=60) is None
    tr.feed(frame, 130.0)  # the same frame again is not progress
    assert tr.stalled(now=123.0, threshold_s=60) is not None
    assert tr.stalled(now=123.0) is None  # default 10 min


def test_launch_before_first_line_counts_silence_and_survives_the_banner() -> None:
    tr = PhaseTracker(year=2026)
    launch = calendar.timegm((2026, 5, 1, 9, 59, 30))
    tr.mark_process_start(launch, utc_offset_s=0, arrival=100.0)
    assert tr.state == "starting"
    st = tr.stalled(now=100.0 + DEFAULT_STALL_S + 1)
    assert st is not None and st.phase is Phase.PROCESS_START
    tr.feed("(APIServer pid=1) INFO 05-01 10:00:00 [api_server.py:1] vLLM API server version 0.11.0", 130.0)
    snap = tr.snapshot()
    assert snap.restarts == 0 and snap.started == launch


def test_utc_offset_maps_epoch_to_local_log_stamps() -> None:
    tr = PhaseTracker(year=2026)
    epoch = calendar.timegm((2026, 5, 1, 8, 0, 0))  # 10:00 local at UTC+2
    tr.mark_process_start(epoch, utc_offset_s=7200)
    tr.feed("INFO 05-01 10:00:30 api_server.py:1] vLLM API server version 0.6.3", 0.0)
    tr.feed("INFO:     Application startup complete.", 0.0)
    assert tr.snapshot().total_s == 30.0


def test_new_year_rollover_and_lines_before_any_stamp() -> None:
    tr = PhaseTracker(year=2025)
    tr.feed("Triton is installed, but doesn't include CPU backend.", 50.0)  # before any stamp
    tr.feed("INFO 12-31 23:59:50 api_server.py:1] vLLM API server version 0.6.3", 50.0)
    tr.feed("INFO 01-01 00:00:20 llm_engine.py:1] Initializing an LLM engine (v0.6.3) with config: model='m'", 80.0)
    tr.feed("INFO:     Application startup complete.", 81.0)
    snap = tr.snapshot()
    assert snap.total_s == pytest.approx(31.0)  # 10 s + 20 s + 1 s of arrival after the last stamp
    engine = snap.phase(Phase.ENGINE_INIT)
    assert engine is not None and engine.start == calendar.timegm((2026, 1, 1, 0, 0, 20))


def test_unstamped_lines_extrapolate_from_the_last_stamp() -> None:
    tr = PhaseTracker(year=2026)
    tr.feed("(EngineCore pid=2) INFO 05-01 10:00:00 [kv_cache_utils.py:1] GPU KV cache size: 1,000 tokens", 10.0)
    tr.feed("Capturing CUDA graphs (FULL):  50%|█████     | 5/10 [00:01<00:01, 4.1it/s]", 12.5)
    graphs = tr.snapshot().phase(Phase.CUDA_GRAPHS)
    assert graphs is not None and graphs.start is not None
    assert graphs.progress_for("FULL") is not None
    # KV sizing is still open, so capture starts when its first frame arrives: 2.5 s after the stamp.
    assert graphs.start - calendar.timegm((2026, 5, 1, 10, 0, 0)) == pytest.approx(2.5)


def test_ring_is_bounded_and_filters() -> None:
    tr = PhaseTracker(year=2026, ring_size=10)
    for i in range(30):
        tr.feed(f"INFO 05-01 10:00:{i:02d} [a.py:1] line {i}", float(i))
    tr.feed("WARNING 05-01 10:00:40 [a.py:1] careful", 40.0)
    tr.feed("ERROR 05-01 10:00:41 [a.py:1] broken", 41.0)
    lines = tr.recent()
    assert len(lines) == 10 and lines[-1].text.endswith("broken")
    assert [ln.level for ln in tr.recent(min_level="WARNING")] == ["WARNING", "ERROR"]
    assert [ln.text[-6:] for ln in tr.recent(min_level="ERROR")] == ["broken"]
    assert tr.warning_count == 1 and tr.error_count == 1


def test_uvicorn_shutdown_alone_stops_and_a_stop_is_not_a_stall() -> None:
    tr = PhaseTracker(year=2026)
    tr.feed("INFO 11-07 17:49:14 api_server.py:528] vLLM API server version 0.6.3.post1", 0.0)
    tr.feed("INFO:     Shutting down", 1.0)
    assert tr.state == "stopped"
    assert tr.stalled(now=1e9, threshold_s=1.0) is None


def test_runtime_oom_is_named_as_the_cause_of_the_engine_death() -> None:
    tr = _starting("(APIServer pid=1) INFO:     Application startup complete.")
    tr.feed("(APIServer pid=1) ERROR 05-01 10:05:00 [serving.py:1] ValueError: bad request from a client", 10.0)
    tr.feed(
        "(EngineCore_DP0 pid=2) ERROR 05-01 10:09:00 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        20.0,
    )
    assert tr.state == "ready"
    tr.feed(
        "(APIServer pid=1) ERROR 05-01 10:09:01 [core_client.py:1] Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.",
        21.0,
    )
    fail = tr.snapshot().failure
    assert tr.state == "failed" and fail is not None
    assert fail.kind == "cuda_oom" and "Tried to allocate 2.00 GiB" in fail.line


def test_attached_late_a_request_traceback_is_not_a_failure_but_a_death_is() -> None:
    tr = PhaseTracker(year=2026)
    tr.feed("(APIServer pid=1) Traceback (most recent call last):", 0.0)
    tr.feed('(APIServer pid=1)   File "x.py", line 1, in f', 0.0)
    tr.feed("(APIServer pid=1) RuntimeError: client went away", 0.0)
    assert tr.state == "idle" and tr.stalled(now=1e9, threshold_s=1) is None
    tr.feed(
        "(APIServer pid=1) ERROR 05-01 10:09:01 [utils.py:1] Engine core process EngineCore died unexpectedly.", 1.0
    )
    assert tr.state == "failed"


def test_elapsed_of_the_running_and_of_a_finished_phase() -> None:
    tr = PhaseTracker(year=2026)
    tr.feed("(EngineCore pid=2) INFO 05-01 10:00:00 [r.py:1] Starting to load model m...", 100.0)
    assert tr.elapsed(now=107.5) == pytest.approx(7.5)
    tr.feed("(EngineCore pid=2) INFO 05-01 10:00:09 [r.py:1] Model loading took 1.0 GiB memory and 9.0 seconds", 109.0)
    assert tr.elapsed(now=500.0, phase=Phase.WEIGHTS) == 9.0
    assert tr.elapsed(now=500.0, phase=Phase.CUDA_GRAPHS) is None


def test_a_ready_queued_before_an_engine_death_does_not_undo_it() -> None:
    """Real recording (vLLM 0.32 CPU, EngineCore killed with -9 under load): live, every
    healthy poll queues a "ready" for the log's tracker, and the one from the second before
    the death was applied after the death lines, turning "failed" back into "ready": the
    screen showed no alert (4 kills in 4). Played here as live plays it (ready from the
    /health answers, not from the recording's own marks)."""
    from tests.conftest import FIXTURES
    from vtop.config import Config
    from vtop.monitor.player import Player
    from vtop.sources.recording.record import load

    header, events = load(FIXTURES / "cpu-incidents" / "engine-death-enginecore-load.jsonl.gz")
    events = [e for e in events if e.kind != "logmark"]
    player = Player(events, {**header, "raw": True}, config=Config(interval=0.5))
    m = player.play_to_end()
    assert m.log_view is not None and m.log_view.snapshot.state == "failed"
    died = [c for c in m.alert_log if any(a.rule == "engine_died" and a.severity == "critical" for a in c.alerts)]
    assert died, [c.key() for c in m.alert_log]
    kill = next(e for e in load(FIXTURES / "cpu-incidents" / "engine-death-enginecore-load.jsonl.gz")[1]
                if e.kind == "mark" and "kill" in str(e.data.get("label")))
    assert 0 <= died[0].mono - kill.mono <= 5.0  # named within 5 s of the kill
    assert any(a.rule == "engine_died" for a in m.alert_log[-1].alerts)  # and still up at the end


def _final_alerts(path) -> list:  # type: ignore[no-untyped-def]
    from vtop.config import Config
    from vtop.monitor.player import open_recording

    return open_recording(str(path), config=Config()).play_to_end().alerts


def test_a_max_model_len_past_the_models_positions_is_named_with_its_fix() -> None:
    """Real vLLM 0.32 CPU start with --max-model-len 4096 on a 2048-position model (corpus
    trace): pydantic's ValidationError was shown as such; the line under it says what is wrong."""
    from tests.corpus.score import TRACES

    (a,) = [x for x in _final_alerts(TRACES / "startup-failure-bad-max-model-len") if x.rule == "startup_failure"]
    assert "--max-model-len 4096 is longer than the model allows (2048 positions)" in a.title, a.title
    assert "--max-model-len 2048" in a.fix[0] and "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in a.fix[0]


def test_a_worker_killed_by_signal_9_is_named_as_the_oom_killer_with_how_to_confirm() -> None:
    """Real vLLM 0.32 CPU, its Worker killed with -9 under load (as the OOM killer does): the
    engine's RuntimeError that follows outranked it ("died: RuntimeError", a startup fix)."""
    from tests.conftest import FIXTURES

    (a,) = [x for x in _final_alerts(FIXTURES / "cpu-incidents" / "engine-death-worker-load.jsonl.gz")
            if x.rule == "engine_died"]
    assert a.severity == "critical" and "killed (signal 9)" in a.title and "OOM killer" in a.title, a.title
    fix = " ".join(a.fix)
    assert "dmesg" in fix and "journalctl -k" in fix and "--max-num-seqs" in fix and "--kv-cache-memory-bytes" in fix
