"""What vtop saw live on a real H200 while a real vLLM 0.26.0 started, served a burst and a
runaway (tests/fixtures/h200-vtop-live/, made by tools/device/h200_vllm_session.py), checked
against the same log replayed offline through the tracker."""

from __future__ import annotations

import json

from tests.conftest import FIXTURES
from vtop.core.phases import Phase, PhaseTracker

D = FIXTURES / "h200-vtop-live"
ORDER = [p.value for p in Phase]


def seen() -> dict:  # type: ignore[type-arg]
    return json.loads((D / "vtop-seen.json").read_text())


def test_vtop_followed_every_phase_live_in_order() -> None:
    s = seen()
    phases = [r["phase"] for r in s["seen"] if r["phase"]]
    firsts = list(dict.fromkeys(phases))
    # every phase of a real CUDA start, in order, including the 1-2 s ones
    assert firsts == ORDER
    assert s["server_states"] == ["down", "starting", "up", "starting", "down"]
    t = {r["phase"]: r["s"] for r in reversed(s["seen"]) if r["phase"]}
    assert t["cuda_graphs"] < t["warmup"] < t["api_server"] < t["ready"]
    # the server only answered once the log said the API server was starting
    up = next(r for r in s["seen"] if r["server_state"] == "up")
    assert up["phase"] in ("api_server", "ready")
    # and vtop saw the burst's waiting queue
    assert any(r.get("waiting_n", 0) and r["waiting_n"] > 100 for r in s["seen"])


def test_live_numbers_match_an_offline_replay_of_the_same_log() -> None:
    live = seen()["seen"][-1]["phases"]
    tr = PhaseTracker(year=2026)
    for i, line in enumerate((D / "serve.log").read_text(errors="replace").splitlines()):
        tr.feed(line, float(i) * 0.001)
    snap = tr.snapshot()
    offline = {v.phase.value: v for v in snap.phases}
    for name, dur, progress in live:
        assert offline[name].duration_s == dur or (dur is not None and abs((offline[name].duration_s or 0) - dur) < 1.01)
        assert [[p.label, p.n, p.total] for p in offline[name].progress] == progress
    cg = offline["cuda_graphs"]
    assert [(p.label, p.n, p.total) for p in cg.progress] == [("PIECEWISE", 51, 51), ("FULL", 51, 51)]
    f = snap.facts
    assert f.kv_cache_tokens == 9_103_456 and f.kv_cache_gib == 69.45 and f.max_concurrency == 277.82
    assert f.compile_s == 8.72 and f.compile_cached is False


def test_vtop_recorded_the_gpu_through_the_run() -> None:
    from vtop.sources.recording.record import gpu_polls

    polls = gpu_polls(D / "vtop-record.jsonl")
    assert len(polls) > 150
    mem = [p.gpus[0].mem_used / 2**30 for p in polls if p.gpus and p.gpus[0].mem_used]
    assert min(mem) < 1.0 and 70 < max(mem) < 72  # the KV cache took it to ~71 GiB
    owners = {pr.pid for p in polls for g in p.gpus for pr in (g.procs or ())}
    assert owners  # the EngineCore showed up in NVML's process list
