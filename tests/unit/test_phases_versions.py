"""PhaseTracker across vLLM versions, on logs written from docs/vllm-reference.md §2 (not recorded).

Each log in tests/fixtures/logs/written/ imitates one version's line formats:
V0 0.6 (``file.py:N]``, no tags), V1 0.8 with TP=2 (ANSI ``VllmWorker rank=N`` tags,
no capture bar), 0.11 (ANSI tags everywhere, a bar frame glued to the next record),
0.20 with TP=4 (``Worker`` then ``Worker_TPn`` tags, shm-broadcast waits, a slow rank)
and 0.33 (the multi-line logo banner, untagged tqdm and uvicorn lines).
"""

from __future__ import annotations

import calendar
from pathlib import Path
from typing import Any

import pytest

from vtop.core.phases import Phase, PhaseTracker, parse_line
from vtop.sources.logtail import LineSplitter

WRITTEN = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "written"
P = Phase


def lines_of(name: str) -> list[str]:
    sp = LineSplitter()
    return sp.feed((WRITTEN / name).read_bytes()) + sp.flush()


def replay(name: str) -> PhaseTracker:
    tr = PhaseTracker(year=2026)
    for line in lines_of(name):
        tr.feed(line, 0.0)
    return tr


CASES: dict[str, dict[str, Any]] = {
    "vllm-0.6.3-v0-1gpu.log": dict(
        version="0.6.3.post1",
        durations={
            P.PROCESS_START: 6,
            P.ENGINE_INIT: 1,
            P.WEIGHTS: 8,
            P.MEMORY_PROFILING: 4,
            P.KV_CACHE: 0,
            P.CUDA_GRAPHS: 16,
            P.WARMUP: 0,
            P.API_SERVER: 1,
            P.READY: 0,
        },
        total=36,
        progress={P.WEIGHTS: [("shards", 4, 4)], P.CUDA_GRAPHS: [("graphs", 35, 35)]},
        facts=dict(
            model_memory_gib=14.9888,
            gpu_blocks=27937,
            cpu_blocks=2048,
            max_concurrency=54.56,
            max_concurrency_len=8192,
            graph_capture_s=14.0,
            init_engine_s=20.11,
            url="http://0.0.0.0:8000",
        ),
        world=1,
    ),
    "vllm-0.8.5-v1-tp2.log": dict(
        version="0.8.5.post1",
        durations={
            P.PROCESS_START: 15,
            P.ENGINE_INIT: 8,
            P.WEIGHTS: 67,
            P.TORCH_COMPILE: 88,
            P.MEMORY_PROFILING: 3,
            P.KV_CACHE: 0,
            P.CUDA_GRAPHS: 25,
            P.WARMUP: 0,
            P.API_SERVER: 2,
            P.READY: 0,
        },
        total=208,
        progress={P.WEIGHTS: [("shards", 30, 30)], P.CUDA_GRAPHS: []},  # V1 0.7-0.8 print no capture bar
        facts=dict(
            model_memory_gib=65.72,
            model_load_s=66.8,
            compile_s=68.42,
            compile_cached=False,
            kv_cache_tokens=71_968,
            max_concurrency=2.2,
            graph_memory_gib=1.25,
            init_engine_s=131.16,
        ),
        world=2,
        slowest={
            P.WEIGHTS: ("VllmWorker rank=1", 67),
            P.TORCH_COMPILE: ("VllmWorker rank=1", 88),
            P.CUDA_GRAPHS: ("VllmWorker rank=1", 25),
        },
    ),
    "vllm-0.11.0-ansi-1gpu.log": dict(
        version="0.11.0",
        durations={
            P.PROCESS_START: 18,
            P.ENGINE_INIT: 3,
            P.WEIGHTS: 6,
            P.TORCH_COMPILE: 17,
            P.MEMORY_PROFILING: 2,
            P.KV_CACHE: 0,
            P.CUDA_GRAPHS: 7,
            P.WARMUP: 0,
            P.API_SERVER: 1,
            P.READY: 0,
        },
        total=54,
        progress={P.WEIGHTS: [("shards", 5, 5)], P.CUDA_GRAPHS: [("PIECEWISE", 67, 67), ("FULL", 35, 35)]},
        facts=dict(
            model_memory_gib=15.27,
            compile_s=12.89,
            compile_cached=True,
            kv_cache_gib=52.11,
            kv_cache_tokens=425_424,
            max_concurrency=10.39,
            max_concurrency_len=40_960,
            gpu_blocks=26589,
            graph_memory_gib=0.95,
            max_model_len=40_960,
            url="http://0.0.0.0:8000",
        ),
        world=1,
    ),
    "vllm-0.20.2-tp4-shm.log": dict(
        version="0.20.2",
        durations={
            P.PROCESS_START: 21,
            P.ENGINE_INIT: 13,
            P.WEIGHTS: 86,
            P.TORCH_COMPILE: 145,
            P.MEMORY_PROFILING: 6,
            P.KV_CACHE: 1,
            P.CUDA_GRAPHS: 13,
            P.WARMUP: 14,
            P.API_SERVER: 1,
            P.READY: 0,
        },
        total=285,
        progress={P.WEIGHTS: [("shards", 37, 37)], P.CUDA_GRAPHS: [("PIECEWISE", 67, 67), ("FULL", 35, 35)]},
        facts=dict(
            model="Qwen/Qwen2.5-72B-Instruct",
            model_memory_gib=33.9,
            weights_load_s=83.95,
            compile_s=118.03,
            profile_run_s=1.21,
            kv_cache_gib=84.11,
            kv_cache_tokens=1_377_184,
            max_concurrency=42.03,
            graph_capture_s=13.0,
            graph_memory_gib=1.82,
            init_engine_s=262.96,
            init_compilation_s=118.03,
            shm_broadcast_waits=2,
        ),
        world=4,
        slowest={
            P.WEIGHTS: ("Worker_TP2", 86),
            P.TORCH_COMPILE: ("Worker_TP2", 145),
            P.CUDA_GRAPHS: ("Worker_TP2", 13),
        },
    ),
    "vllm-0.33.0-logo.log": dict(
        version="0.33.0",
        durations={
            P.PROCESS_START: 22,
            P.ENGINE_INIT: 2,
            P.WEIGHTS: 9,
            P.TORCH_COMPILE: 7,
            P.MEMORY_PROFILING: 5,
            P.KV_CACHE: 0,
            P.CUDA_GRAPHS: 6,
            P.WARMUP: 14,
            P.API_SERVER: 1,
            P.READY: 0,
        },
        total=66,
        progress={P.WEIGHTS: [("shards", 3, 3)], P.CUDA_GRAPHS: [("PIECEWISE", 51, 51), ("FULL", 35, 35)]},
        facts=dict(
            model="openai/gpt-oss-20b",
            model_memory_gib=13.72,
            compile_s=6.33,
            compile_cached=True,
            graph_memory_estimate_gib=0.62,
            kv_cache_gib=112.43,
            kv_cache_tokens=2_455_536,
            max_concurrency=37.29,
            max_concurrency_len=131_072,
            graph_memory_gib=0.6,
            url="http://0.0.0.0:10000",
        ),
        world=1,
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_written_log_phases(name: str) -> None:
    case = CASES[name]
    snap = replay(name).snapshot()
    assert snap.state == "ready"
    assert snap.failure is None
    assert snap.facts.version == case["version"]
    durations = {v.phase: v.duration_s for v in snap.phases}
    assert durations == case["durations"]
    assert snap.sequence == tuple(case["durations"])
    assert snap.total_s == case["total"]
    assert snap.world_size == case["world"]
    for phase, bars in case["progress"].items():
        view = snap.phase(phase)
        assert view is not None
        assert [(p.label, p.n, p.total) for p in view.progress] == bars
    for key, value in case["facts"].items():
        assert getattr(snap.facts, key) == value, key
    for phase, (rank, secs) in case.get("slowest", {}).items():
        view = snap.phase(phase)
        assert view is not None and len(view.ranks) == case["world"]
        slow = view.slowest_rank
        assert slow is not None and (slow.name, slow.duration_s) == (rank, secs)


def test_every_written_log_says_it_was_written() -> None:
    logs = sorted(WRITTEN.glob("*.log"))
    assert len(logs) == 5
    for path in logs:
        assert path.read_text(encoding="utf-8").startswith("# Written from docs/vllm-reference.md")
    assert "not recorded" in (WRITTEN / "README.md").read_text()


def test_011_ansi_is_stripped_and_the_glued_record_is_its_own_line() -> None:
    lines = lines_of("vllm-0.11.0-ansi-1gpu.log")
    assert not any("\x1b" in ln for ln in lines)
    i = next(i for i, ln in enumerate(lines) if "Graph capturing finished" in ln)
    assert lines[i].startswith("(EngineCore_DP0 pid=88) INFO 10-21 09:11:33")
    assert lines[i - 1].startswith("Capturing CUDA graphs (decode, FULL): 100%") and lines[i - 1].endswith("it/s]")
    ev = parse_line(lines[i])
    assert (ev.proc, ev.pid, ev.level) == ("EngineCore_DP0", 88, "INFO")


def test_020_tp4_ranks_keep_their_identity_across_tag_renames() -> None:
    """``(Worker pid=301)`` becomes ``(Worker_TP0 pid=301)`` once parallel groups exist: one rank."""
    snap = replay("vllm-0.20.2-tp4-shm.log").snapshot()
    weights = snap.phase(P.WEIGHTS)
    assert weights is not None
    assert sorted(r.name for r in weights.ranks) == ["Worker_TP0", "Worker_TP1", "Worker_TP2", "Worker_TP3"]
    assert sorted(r.key for r in weights.ranks) == ["301", "302", "303", "304"]
    # Rank 0 started compiling while TP2 still loaded: the phases overlap, which is what happened.
    compile_ = snap.phase(P.TORCH_COMPILE)
    assert compile_ is not None and compile_.start is not None and weights.end is not None
    assert compile_.start < weights.end


def test_020_shm_broadcast_waits_do_not_count_as_activity() -> None:
    """The 60 s shm-broadcast line is a hang symptom: silence is measured across it."""
    tr = PhaseTracker(year=2026)
    base = calendar.timegm((2026, 6, 9, 19, 24, 20))
    now = 0.0
    for line in lines_of("vllm-0.20.2-tp4-shm.log"):
        ev = parse_line(line)
        if ev.stamp is not None:
            mon, day, hh, mi, ss = ev.stamp
            now = calendar.timegm((2026, mon, day, hh, mi, ss)) - base
        tr.feed(line, now)
        if "No available shared memory broadcast block" in line and tr.snapshot().facts.shm_broadcast_waits == 1:
            # Last real line: "Dynamo bytecode transform time" at 19:26:31; the shm line came at 19:27:05.
            st = tr.stalled(now=now + 10.0, threshold_s=40.0)
            assert st is not None and st.phase is P.TORCH_COMPILE
            assert st.silent_s == pytest.approx(44.0)
            assert "Dynamo bytecode transform" in st.last_line
            assert "--enforce-eager" in st.hint
            assert tr.stalled(now=now + 10.0, threshold_s=60.0) is None
    assert tr.state == "ready"


def test_033_logo_banner_gives_version_and_model_and_a_restart_resets() -> None:
    lines = lines_of("vllm-0.33.0-logo.log")
    tr = PhaseTracker(year=2026)
    for line in lines:
        tr.feed(line, 0.0)
    assert tr.snapshot().facts.model == "openai/gpt-oss-20b"
    # The same server started again (e.g. after a crash): the logo resets the timeline.
    cut = next(i for i, ln in enumerate(lines) if "Dynamo bytecode transform" in ln)
    for line in lines[: cut + 1]:
        tr.feed(line, 1.0)
    snap = tr.snapshot()
    assert snap.restarts == 1
    assert snap.state == "starting"
    assert snap.current is P.TORCH_COMPILE
    assert snap.facts.kv_cache_tokens is None  # facts of the old start are gone


def test_033_untagged_uvicorn_ready_line() -> None:
    lines = lines_of("vllm-0.33.0-logo.log")
    assert lines[-1] == "INFO:     Application startup complete."
    tr = PhaseTracker(year=2026)
    for line in lines[:-1]:
        tr.feed(line, 0.0)
    assert tr.state == "starting" and tr.current is P.API_SERVER
    tr.feed(lines[-1], 0.0)
    assert tr.state == "ready"


def test_enforce_eager_goes_from_kv_cache_to_warmup() -> None:
    tr = PhaseTracker(year=2026)
    for line in [
        "(APIServer pid=1) INFO 05-01 10:00:00 [u.py:1] vLLM server version 0.20.2, serving model m",
        "(EngineCore pid=2) INFO 05-01 10:00:10 [core.py:1] Initializing a V1 LLM engine (v0.20.2) with config: model='m', tensor_parallel_size=1, pipeline_parallel_size=1, enforce_eager=True",
        "(EngineCore pid=2) INFO 05-01 10:00:11 [r.py:1] Starting to load model m...",
        "(EngineCore pid=2) INFO 05-01 10:00:15 [r.py:1] Model loading took 1.00 GiB memory and 4.0 seconds",
        "(EngineCore pid=2) INFO 05-01 10:00:17 [w.py:1] Available KV cache memory: 60.00 GiB",
        "(EngineCore pid=2) INFO 05-01 10:00:17 [k.py:1] GPU KV cache size: 100,000 tokens",
        "(EngineCore pid=2) INFO 05-01 10:00:17 [k.py:1] Maximum concurrency for 8,192 tokens per request: 12.21x",
    ]:
        tr.feed(line, 0.0)
    assert tr.current is P.WARMUP
    assert tr.snapshot().sequence == (
        P.PROCESS_START,
        P.ENGINE_INIT,
        P.WEIGHTS,
        P.MEMORY_PROFILING,
        P.KV_CACHE,
        P.WARMUP,
    )
