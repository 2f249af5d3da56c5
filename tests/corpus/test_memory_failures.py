"""Item 6 of issue 24 on a real recording: the CPU backend's KV cache that does not fit in host
memory is named as a memory failure with memory fixes, not "ValueError during memory profiling"."""

from __future__ import annotations

from pathlib import Path

from vtop.config import Config
from vtop.monitor.player import open_recording

TRACES = Path(__file__).resolve().parent / "traces"


def test_cpu_kv_cache_larger_than_host_memory_is_a_memory_failure_with_memory_fixes() -> None:
    # vLLM 0.32 CPU, VLLM_CPU_KVCACHE_SPACE=64: "ValueError: Available memory on node 0 (6.91/8.84 GiB) on kv
    # cache allocation is less than requested memory for kv (64.0 GiB)" in the Worker, then the engine's death.
    m = open_recording(str(TRACES / "startup-failure-kv-too-large"), config=Config()).play_to_end()
    alerts = [a for change in m.alert_log for a in change.alerts if a.rule == "startup_failure"]
    assert alerts, [a.title for change in m.alert_log for a in change.alerts]
    a = alerts[0]
    assert "out of memory for the KV cache" in a.title and "ValueError" not in a.title, a.title
    assert "64.0 GiB asked, 6.91 of 8.84 GiB available on NUMA node 0" in a.title, a.title
    fix = " ".join(a.fix)
    # the CPU backend's own knobs, with a size that fits, and the GPU's
    assert "VLLM_CPU_KVCACHE_SPACE=5" in fix and "--kv-cache-memory-bytes" in fix, fix
    for flag in ("--gpu-memory-utilization", "--max-model-len", "--max-num-seqs"):
        assert flag in fix, (flag, fix)
    # the phase is said once, not "during memory profiling during memory profiling"
    assert all(text.count("during memory profiling") <= 1 for text in (a.title, *a.evidence)), (a.title, a.evidence)


def test_h200_start_beside_a_100gib_process_is_a_memory_failure_with_memory_fixes() -> None:
    # vLLM 0.26.0 on an H200 with a 100 GiB hog on the GPU: "ValueError: Free memory on device cuda:0
    # (38.77/139.8 GiB) on startup is less than desired GPU memory utilization (0.5, 69.9 GiB)".
    m = open_recording(str(TRACES / "h200-startup-failure-cuda-oom"), config=Config()).play_to_end()
    alerts = [a for change in m.alert_log for a in change.alerts if a.rule == "startup_failure"]
    assert alerts, [a.title for change in m.alert_log for a in change.alerts]
    a = alerts[0]
    assert "not enough free GPU memory at start: 38.77 of 139.8 GiB free" in a.title, a.title
    assert "--gpu-memory-utilization 0.5 asks for 69.9 GiB" in a.title and "ValueError" not in a.title, a.title
    fix = " ".join(a.fix)
    assert "--gpu-memory-utilization to 0.26 or less" in fix, fix
    for flag in ("--max-model-len", "--max-num-seqs", "--kv-cache-memory-bytes"):
        assert flag in fix, (flag, fix)
