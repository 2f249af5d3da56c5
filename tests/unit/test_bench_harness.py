"""The benchmark's replayed vLLM answers a restricted scrape as the real library would."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import pytest
from harness import MetricsTimeline, restrict_lines, restricted, thread_cpu_ns, thread_ms_per_s

from vtop.sources.metrics_text import WANTED_SAMPLE_NAMES, parse_vllm_metrics
from vtop.sources.vllm import coverage


def test_the_replays_line_filter_reads_as_prometheus_client_restricts() -> None:
    """On every payload of the H200 timeline (and one loop on, counters offset), the fast
    line filter the replay serves and prometheus_client's own restricted registry give
    vtop the same readings, from a third of the full payload's bytes or less (a quarter before
    issue #29's families: the queue-time histogram, 2.3 KB of the 0.26 burst payload, cache_config_info
    0.9 KB, engine_sleep_state, prompt_tokens_by_source, http_requests_total: 36 % now)."""
    t = MetricsTimeline()
    took_lib = took_fast = 0.0
    for i in [*range(len(t)), len(t) + 7]:
        text = t.payload(i).decode()
        t0 = time.perf_counter()
        lib = restricted(text, WANTED_SAMPLE_NAMES)
        t1 = time.perf_counter()
        fast = restrict_lines(text, WANTED_SAMPLE_NAMES)
        took_lib += t1 - t0
        took_fast += time.perf_counter() - t1
        a, b, full = parse_vllm_metrics(lib), parse_vllm_metrics(fast), parse_vllm_metrics(text)
        assert not a.problems and not b.problems, (i, a.problems, b.problems)
        assert a == b, i
        assert coverage(b) == coverage(full) and b.running == full.running and b.e2e_request_latency_seconds == \
            full.e2e_request_latency_seconds
        assert len(fast) < len(text) * 0.4
        assert t.payload(i, WANTED_SAMPLE_NAMES) == fast
    assert took_fast < took_lib / 5


def test_cpu_by_thread_names_the_thread_that_burned_it() -> None:
    """bench/run.py reports CPU by kernel thread name (vtop's poll threads name themselves):
    a thread that spins 0.3 s between two readings shows ~300 ms under its own name."""
    import os
    import threading

    if not sys.platform.startswith("linux"):
        pytest.skip("per-thread CPU from /proc: Linux")
    from vtop.threadname import name_this_thread

    go, done = threading.Event(), threading.Event()

    def burn() -> None:
        name_this_thread("bench-burn")
        go.wait(5)
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.3:
            pass
        done.set()
        time.sleep(0.5)  # still alive at the second reading

    t = threading.Thread(target=burn)
    t.start()
    time.sleep(0.05)
    a = thread_cpu_ns(os.getpid())
    go.set()
    done.wait(5)
    b = thread_cpu_ns(os.getpid())
    t.join(5)
    per = thread_ms_per_s(a, b, 1.0)  # "per second" over a 1 s divisor: plain milliseconds
    assert 280 <= per["bench-burn"] <= 450, per
    assert "UI (main)" in per and per["UI (main)"] < 200, per


def test_the_first_frame_floor_app_draws_what_the_bench_waits_for_and_quits_on_q() -> None:
    """bench/textual_floor.py in a real terminal (tmux), driven as the bench drives it."""
    import shutil

    import run as benchrun  # bench/run.py
    from harness import Tmux

    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (.ci/run installs it)")
    tm = Tmux()
    try:
        pid, t0 = tm.new("floor", [sys.executable, str(Path(benchrun.__file__).parent / "textual_floor.py")])
        ff, screen = tm.wait_for("floor", benchrun.footer_shown, timeout=30, since=t0)
        assert ff is not None, screen
        assert "textual floor" in screen
        assert benchrun.quit_vtop(tm, "floor", pid) is not None  # q quits it (None: it had to be killed)
    finally:
        tm.close()
    assert benchrun.fmt_range([0.31, None, 0.29]) == "0.29-0.31, 1 never drawn"


def test_the_first_frame_column_judges_the_median_of_the_starts_and_shows_the_slowest() -> None:
    import run  # bench/run.py

    s = {"first_frame_s": 0.58, "first_frames_s": [0.31, 0.29, None, 0.35, 0.58], "first_frame_median_s": 0.33}
    assert run.fmt_first_frame(s) == "0.33 (0.58) PASS"
    s = {"first_frame_s": 0.52, "first_frames_s": [0.61, 0.52, 0.49], "first_frame_median_s": 0.52}
    assert run.fmt_first_frame(s) == "0.52 (0.61) MISS"
    # an older result file: one start, judged as it was
    assert run.fmt_first_frame({"first_frame_s": 0.41}) == "0.41 PASS"
    assert run.fmt_first_frame({"first_frame_s": None, "first_frames_s": [None]}) == "-"


def test_the_key_trace_splits_a_press_at_its_action_and_the_next_frame() -> None:
    import key_trace  # bench/key_trace.py

    events = [
        ["frame", 0.990, 0.995],          # before the press: not its frame
        ["action", 1.004, 1.0042],
        ["cb task Timer._run_timer", 1.010, 1.018],
        ["frame", 1.018, 1.019],
        ["action", 2.006, 2.0061],        # the next press
        ["frame", 2.020, 2.021],
    ]
    rows = key_trace.split([(1.000, 0.025), (2.000, 0.030), (3.000, None)], events)
    assert len(rows) == 2
    first = rows[0]
    assert round(first["seen_ms"], 3) == 25.0
    assert round(first["send_to_action_ms"], 3) == 4.0
    assert round(first["action_to_frame_ms"], 3) == 15.0  # to the end of the frame written after the action
    assert round(first["frame_to_seen_ms"], 3) == 6.0
    assert [k for k, _, _ in first["during"]] == ["action", "cb task Timer._run_timer", "frame"]
    assert round(rows[1]["action_to_frame_ms"], 3) == 15.0


def test_each_run_says_how_fast_the_box_runs_python() -> None:
    """The same vtop costs 20-25 % more CPU on some GPU boxes than on others: each run
    records the box's time for a fixed Python loop beside its figures."""
    from harness import machine_info, python_speed_ms

    one = python_speed_ms(rounds=3)
    assert 0.5 < one < 5000
    m = machine_info()
    assert isinstance(m["python_speed_ms"], float) and 0.5 < m["python_speed_ms"] < 5000


def test_the_nvml_calibration_compares_memory_versions_in_vtops_place() -> None:
    """bench/nvml_calibrate.py's memory_versions alternates v1 and v2 between utilization and
    power, checks v2's used + reserved against v1's used, and the other calls' timing keeps
    going past a call this binding lacks (recorded, not raised); run here on the fake NVML."""
    from nvml_calibrate import alternatives, memory_versions

    from vtop.sources.fake_nvml import FakeGpu, FakeNvml

    f = FakeNvml([FakeGpu()], call_cost_s={"memory": 30e-6})
    f.nvmlInit()
    h = f.nvmlDeviceGetHandleByIndex(0)
    reserved = 2**29

    class Binding:  # the fake, with the real binding's v2 memory struct (used less the driver's reserve)
        nvmlMemory_v2 = 0x2000028

        def __getattr__(self, name: str) -> object:
            return getattr(f, name)

        def nvmlDeviceGetMemoryInfo(self, handle: object, version: object = None) -> object:
            m = f.nvmlDeviceGetMemoryInfo(handle)
            if version:
                m.used, m.reserved = m.used - reserved, reserved
            return m

    calls = f.calls
    mv = memory_versions(Binding(), h, 6, 0.0)
    assert f.calls - calls == 6 * 3 + 3  # three a tick, and v1 again after each v2
    assert mv["of"] == 3 and mv["v2_used_plus_reserved_is_v1_used"] == 3
    assert mv["us_per_call"]["memory"] >= 30  # its price was spent where it was asked
    alt = alternatives(Binding(), h, 2, 0.0)
    assert "utilization_samples" in alt["errors"] and "memory_v2" in alt["us_per_call"]
