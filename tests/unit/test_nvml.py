"""The NVML adapter against a fake ``pynvml`` that raises the real binding's errors."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from vtop.clock import FakeClock
from vtop.model.gpu import ABSENT, ERROR, OK, decode_throttle
from vtop.sources.fake_nvml import FakeGpu, FakeNvml
from vtop.sources.nvml import NvmlSource


def src(gpus: list[FakeGpu], clock: FakeClock | None = None, **kw: object) -> tuple[NvmlSource, FakeNvml]:
    clock = clock or FakeClock()
    fake = FakeNvml(gpus, clock=clock.monotonic, **kw)  # type: ignore[arg-type]
    return NvmlSource(fake, clock=clock), fake


def test_reads_every_field_of_every_gpu() -> None:
    s, _ = src([FakeGpu(), FakeGpu(name="NVIDIA A100-SXM4-80GB", mem_total=80 * 2**30)])
    p = s.poll()
    assert p.status == OK and len(p.gpus) == 2
    g0, g1 = p.gpus
    assert g0.name == "NVIDIA H200" and g1.name.startswith("NVIDIA A100")
    for g in p.gpus:
        assert g.util_gpu is not None and 0 <= g.util_gpu <= 100
        assert g.mem_used is not None and 0 < g.mem_used < g.mem_total  # type: ignore[operator]
        assert g.power_w is not None and g.power_limit_w == 700.0
        assert g.temp_c is not None and g.sm_clock_mhz is not None and g.mem_clock_mhz == 3201
        assert g.throttle == ()
        assert g.procs and g.procs[0].used_bytes == 70 * 2**30
    assert p.driver and p.driver.startswith("580")


def test_not_supported_gives_none_for_that_field_only_and_is_not_asked_again() -> None:
    gpu = FakeGpu(overrides={"temperature": pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED),
                             "power": pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)})
    s, fake = src([gpu])
    p = s.poll()
    g = p.gpus[0]
    assert g.temp_c is None and g.power_w is None
    assert g.util_gpu is not None and g.mem_used is not None
    s.poll()  # the second tick allocates the second GPM sample; from the third on, a tick is steady
    calls = fake.calls
    s.poll()
    per_poll = fake.calls - calls
    # Ask again with the fields supported: the adapter must not retry unsupported ones.
    gpu.overrides.clear()
    calls = fake.calls
    p3 = s.poll()
    assert p3.gpus[0].temp_c is None
    assert fake.calls - calls == per_poll


def test_gpu_lost_is_marked_while_others_go_on() -> None:
    clock = FakeClock()
    a, b = FakeGpu(), FakeGpu()
    s, _ = src([a, b], clock)
    s.poll()
    b.lost = True
    p = s.poll()
    assert p.status == OK
    assert p.message == "GPU 1 lost"
    assert not p.gpus[0].lost and p.gpus[0].util_gpu is not None
    assert p.gpus[1].lost and p.gpus[1].util_gpu is None and p.gpus[1].mem_used is None
    assert p.gpus[1].name == "NVIDIA H200"  # the name it had is kept
    # Back after the re-look delay.
    b.lost = False
    clock.advance(11)
    p = s.poll()
    assert not p.gpus[1].lost and p.gpus[1].util_gpu is not None


def test_every_gpu_lost_is_an_error() -> None:
    a = FakeGpu()
    s, _ = src([a])
    s.poll()
    a.lost = True
    p = s.poll()
    assert p.status == ERROR and p.message == "every GPU is lost"


@pytest.mark.parametrize(
    "err, words",
    [
        (pynvml.NVMLError_LibraryNotFound(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND), "libnvidia-ml.so.1 not found"),
        (pynvml.NVMLError_DriverNotLoaded(pynvml.NVML_ERROR_DRIVER_NOT_LOADED), "driver not loaded"),
        (pynvml.NVMLError_NoPermission(pynvml.NVML_ERROR_NO_PERMISSION), "no permission"),
        (pynvml.NVMLError_Unknown(pynvml.NVML_ERROR_UNKNOWN), "NVML init failed"),
    ],
)
def test_nvml_missing_gives_one_clear_line_and_retries_slowly(err: Exception, words: str) -> None:
    clock = FakeClock()
    s, fake = src([FakeGpu()], clock, init_error=err)
    p = s.poll()
    assert p.status == ABSENT and words in (p.message or "")
    assert "\n" not in (p.message or "")
    s.poll()
    assert fake.calls == 1  # no retry within the back-off
    fake.init_error = None
    clock.advance(31)
    p = s.poll()
    assert p.status == OK and len(p.gpus) == 1


def test_real_pynvml_without_a_driver_is_absent_not_a_crash() -> None:
    # This machine has no NVIDIA driver; the real binding must be reported, not raised.
    p = NvmlSource().poll()
    if p.status == OK:  # pragma: no cover - only on a GPU box
        pytest.skip("a real GPU is present")
    assert p.status == ABSENT and p.message


def test_function_not_found_is_noted_once() -> None:
    gpu = FakeGpu(overrides={"throttle": pynvml.NVMLError_FunctionNotFound(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)})
    s, _ = src([gpu])
    p1 = s.poll()
    p2 = s.poll()
    assert p1.gpus[0].throttle is None
    assert any("throttle" in n for n in p1.notes)
    assert not p2.notes


def test_gpm_first_tick_none_then_values_and_no_leak() -> None:
    clock = FakeClock()
    s, fake = src([FakeGpu(overrides={"gpm": {2: 95.48, 3: 14.11, 10: 15.85}})], clock)

    def tick() -> Any:
        clock.advance(1.0)
        return s.poll()

    p1 = s.poll()
    assert p1.gpus[0].sm_active is None  # no previous sample yet
    for _ in range(5):
        p = tick()
    g = p.gpus[0]
    assert g.sm_active == pytest.approx(95.48)
    assert g.sm_occupancy == pytest.approx(14.11)
    assert g.dram_bw == pytest.approx(15.85)
    assert fake.gpm_live == 2  # last sample and the buffer for the next: allocated once, used in turn
    assert s.SLOW_EVERY_S == 4.0
    per_tick = []
    for _ in range(8):
        calls = fake.calls
        g = tick().gpus[0]
        per_tick.append(fake.calls - calls)
        assert g.sm_active == pytest.approx(95.48)  # a tick without a GPM sample shows the last reading
    # Every tick utilization, memory, power and one XID event-set wait (nothing queued: one call);
    # every fourth tick (SLOW_EVERY_S: 4 s) also temperature, two clocks, throttle reasons,
    # processes, one GPM sample and one metrics get: no alloc, no free (the one process's utilization
    # samples only every LONE_PROC_UTIL_S: read at the first poll, not within these 14 s)
    assert sorted(per_tick) == [4] * 6 + [11, 11]
    first = per_tick.index(11)
    assert per_tick[first + 4] == 11 if first < 4 else per_tick[first - 4] == 11
    for _ in range(50):
        p = tick()
    assert fake.gpm_live == 2 and p.gpus[0].sm_active == pytest.approx(95.48)
    s.close()
    assert fake.gpm_live == 0


def test_gpm_reading_follows_the_load_within_gpm_every_s() -> None:
    """Each reading is the average since the sample before, taken SLOW_EVERY_S earlier:
    a change of load shows within four ticks at 1 Hz, and a tick that comes a little
    early (jitter) still takes its sample."""
    clock = FakeClock()
    gpu = FakeGpu(overrides={"gpm": {2: 10.0, 3: 1.0, 10: 2.0}})
    s, fake = src([gpu], clock)
    s.poll()  # t=0: the first sample
    seen = []
    for i in range(12):
        clock.advance(0.9 if i % 2 else 1.05)  # ticks 0.9-1.05 s apart: the 4th comes at 3.9 s
        if i == 5:
            gpu.overrides["gpm"] = {2: 80.0, 3: 1.0, 10: 2.0}
        seen.append(s.poll().gpus[0].sm_active)
    # samples at ticks 3 (3.9 s, early but within EARLY_S), 7 and 11
    assert seen[:3] == [None] * 3
    assert seen[3:7] == [pytest.approx(10.0)] * 4  # the load changed at tick 5: shown from the next sample
    assert seen[7:] == [pytest.approx(80.0)] * 5


def test_slow_fields_are_read_every_fourth_second_and_shown_between() -> None:
    """Temperature, clocks, throttle reasons and processes are read every SLOW_EVERY_S;
    the tick between shows the last reading, utilization and memory are new every tick,
    and a GPU that comes back is read afresh (nothing of before it was lost)."""
    from types import SimpleNamespace

    clock = FakeClock()
    gpu = FakeGpu(overrides={"temperature": 40, "procs": [SimpleNamespace(pid=7, usedGpuMemory=2**30)]})
    s, _ = src([gpu], clock)
    g0 = s.poll().gpus[0]
    assert g0.temp_c == 40 and [p.pid for p in g0.procs or ()] == [7]
    gpu.overrides.update(temperature=71, procs=[], utilization=SimpleNamespace(gpu=88, memory=5))
    for _ in range(3):
        clock.advance(1.0)
        g1 = s.poll().gpus[0]
        assert g1.util_gpu == 88 and g1.temp_c == 40 and [p.pid for p in g1.procs or ()] == [7]
    clock.advance(0.8)  # a tick a little early (3.8 s after the last read) still reads them
    g2 = s.poll().gpus[0]
    assert g2.temp_c == 71 and g2.procs == ()
    gpu.lost = True
    assert s.poll().gpus[0].lost
    gpu.lost = False
    gpu.overrides.update(temperature=55)
    clock.advance(60)
    assert s.poll().gpus[0].temp_c == 55


def test_a_lost_gpu_frees_its_gpm_samples_and_starts_over_when_back() -> None:
    clock = FakeClock()
    gpu = FakeGpu(overrides={"gpm": {2: 50.0, 3: 10.0, 10: 20.0}})
    s, fake = src([gpu], clock)
    for _ in range(3):
        s.poll()
        clock.advance(s.SLOW_EVERY_S)
    assert fake.gpm_live == 2
    gpu.lost = True
    assert s.poll().gpus[0].lost
    assert fake.gpm_live == 0
    gpu.lost = False
    clock.advance(60)
    p = s.poll()
    assert not p.gpus[0].lost and p.gpus[0].sm_active is None  # a fresh first sample
    clock.advance(s.SLOW_EVERY_S)
    assert s.poll().gpus[0].sm_active == pytest.approx(50.0)


def test_gpm_nan_is_none_and_unsupported_gpu_has_no_gpm() -> None:
    clock = FakeClock()
    s, _ = src([FakeGpu(overrides={"gpm": {2: float("nan"), 3: 1.0, 10: 2.0}}), FakeGpu(gpm=False)], clock)
    s.poll()
    clock.advance(s.SLOW_EVERY_S)
    p = s.poll()
    assert p.gpus[0].sm_active is None and p.gpus[0].sm_occupancy == 1.0
    assert p.gpus[1].sm_active is None and p.gpus[1].dram_bw is None


def test_process_memory_not_available_is_none() -> None:
    gpu = FakeGpu(overrides={"procs": [SimpleNamespace(pid=7, usedGpuMemory=None),
                                        SimpleNamespace(pid=8, usedGpuMemory=2**64 - 1)]})
    s, _ = src([gpu])
    g = s.poll().gpus[0]
    assert [(p.pid, p.used_bytes) for p in g.procs or ()] == [(7, None), (8, None)]


def test_transient_error_empties_one_field_for_one_tick() -> None:
    gpu = FakeGpu(overrides={"utilization": pynvml.NVMLError_Unknown(pynvml.NVML_ERROR_UNKNOWN)})
    s, _ = src([gpu])
    assert s.poll().gpus[0].util_gpu is None
    gpu.overrides.clear()
    assert s.poll().gpus[0].util_gpu is not None


def test_hung_call_blocks_only_the_polling_thread() -> None:
    release = threading.Event()

    def hang() -> object:
        release.wait(5)
        return SimpleNamespace(gpu=1, memory=2)

    s, _ = src([FakeGpu(overrides={"utilization": hang})])
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(s.poll()))
    t.start()
    t.join(0.2)
    assert t.is_alive() and not out  # the poll is stuck in "NVML"
    release.set()
    t.join(5)
    assert out and out[0].gpus[0].util_gpu == 1.0  # type: ignore[attr-defined]


def test_throttle_bits_decode() -> None:
    assert decode_throttle(0) == ()
    assert decode_throttle(None) is None
    assert decode_throttle(0x4 | 0x40) == ("sw-power-cap", "hw-thermal")


def test_simulated_gpus_spin_what_each_call_cost_on_the_h200() -> None:
    """The benchmarks' GPUs: each call spins (thread CPU time) the real call's measured cost."""
    import time

    from vtop.sources.fake_nvml import H200_CALL_S, simulated

    s = NvmlSource(simulated(1))
    s.SLOW_EVERY_S = 0.0  # every call on every tick here (vtop makes some every fourth second)
    s.LONE_PROC_UTIL_S = 0.0  # and the lone process's SM share (every 30 s)
    for _ in range(3):
        s.poll()  # init, static fields, both GPM samples allocated
    t0 = time.thread_time()
    s.poll()
    spent = time.thread_time() - t0
    assert spent >= sum(H200_CALL_S.values())  # a tick makes each listed call once
    # the H200's calls, and the per-process utilization measured on an H100 (1.6 ms: the dearest by far)
    assert sum(v for k, v in H200_CALL_S.items() if k != "proc_util") == pytest.approx(386e-6, rel=0.01)
    assert H200_CALL_S["proc_util"] == pytest.approx(1.6e-3)


def test_a_simulated_call_spins_to_its_price_and_not_a_hashing_step_more(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The spin ends in small steps: whole 4 KB hashing steps (~10 us on the dev VM)
    overshot each price by ~5 us on average (+45 % on an 11 us power read), so the
    benchmark charged simulated GPUs more than real ones cost. On a clock that a
    2 KB step moves 5 us and a small one 0.3 us: big steps while more than 6 us are
    left (they let go of the GIL), then small ones, ending under one small step late."""
    from vtop.sources import fake_nvml

    clock = [0.0]
    steps: list[int] = []

    def sha256(data: bytes) -> None:
        steps.append(len(data))
        clock[0] += 5e-6 if len(data) >= 2048 else 0.3e-6

    monkeypatch.setattr(fake_nvml.time, "thread_time", lambda: clock[0])
    monkeypatch.setattr(fake_nvml.hashlib, "sha256", sha256)
    for price in (11.1e-6, 49.7e-6, 72.8e-6, 182.2e-6):
        clock[0], steps[:] = 0.0, []
        fake_nvml._spin_until(price)
        assert price <= clock[0] < price + 0.3e-6 + 1e-12
        big = [n for n in steps if n >= 2048]
        assert len(big) >= (price - 6e-6) / 5e-6 - 1  # most of it with the GIL let go
        assert all(n >= 2048 for n in steps[: len(big)])  # small steps only at the end


def test_simulated_calls_let_other_threads_run_as_real_ones_do() -> None:
    """A real NVML call (ctypes) releases the GIL; the fake's spin must too, or a simulated
    8-GPU poll would stall the UI thread for a whole switch interval per call.

    Proves it without timing anything: with forced GIL switches pushed out of reach
    (a 1000 s switch interval), another thread that is ready to run gets the GIL only if
    a poll lets go of it. A spin that holds the GIL keeps it from that thread until the
    hang guard ends the loop, and the test fails."""
    import sys
    import threading
    import time

    from vtop.sources.fake_nvml import simulated

    s = NvmlSource(simulated(8))
    s.poll()
    go, ran = threading.Event(), threading.Event()

    def other() -> None:
        go.wait()  # woken while this thread holds the GIL: it runs once the GIL is let go
        ran.set()

    th = threading.Thread(target=other, daemon=True)
    th.start()
    old = sys.getswitchinterval()
    polls = 0
    try:
        sys.setswitchinterval(1000.0)
        go.set()
        guard = time.monotonic() + 30  # hang guard only: a healthy run ends within a poll or two
        while not ran.is_set() and time.monotonic() < guard:
            s.poll()
            polls += 1
        ran_during_polls = ran.is_set()
    finally:
        sys.setswitchinterval(old)
        go.set()
        th.join(30)
    assert ran_during_polls and polls >= 1, f"the other thread never ran during {polls} polls"


def test_simulated_gpus_are_built_at_the_first_poll_not_before_the_first_frame() -> None:
    """--simulate-gpus takes the real path's shape: the fake (and the pynvml it imports)
    is made in the poll thread's first poll, so the benchmark's first frame waits for
    neither, as with real GPUs."""
    import json
    import subprocess
    import sys

    child = """
import json, sys
from vtop.config import Config
from vtop.sources.nvml import make_gpu_source
src = make_gpu_source(Config(simulate_gpus=3))
before = sorted(m for m in ("pynvml", "vtop.sources.fake_nvml") if m in sys.modules)
p = src.poll()
print(json.dumps({"before": before, "gpus": len(p.gpus), "status": p.status,
                  "after": "vtop.sources.fake_nvml" in sys.modules}))
"""
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r == {"before": [], "gpus": 3, "status": OK, "after": True}, out.stderr


def test_simulate_gpus_costs_nothing_unless_the_benchmark_prices_it(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``--simulate-gpus`` for a demo: calls cost no spin. The benchmark opts in to the H200's
    prices with VTOP_SIMULATED_NVML_COST=h200 (bench/harness.py sets it)."""
    from vtop.config import Config
    from vtop.sources.fake_nvml import H200_CALL_S
    from vtop.sources.nvml import make_gpu_source

    monkeypatch.delenv("VTOP_SIMULATED_NVML_COST", raising=False)
    src = make_gpu_source(Config(simulate_gpus=2))
    assert src.poll().gpus and src.binding.call_cost_s == 0.0  # type: ignore[union-attr]
    monkeypatch.setenv("VTOP_SIMULATED_NVML_COST", "h200")
    src = make_gpu_source(Config(simulate_gpus=2))
    assert src.poll().gpus and src.binding.call_cost_s == H200_CALL_S  # type: ignore[union-attr]


def test_one_round_source_takes_no_gpm_sample_no_xid_set_and_no_pcie_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """``vtop --once`` without a window polls once: a GPM sample (SM activity needs two, 4 s
    apart), an XID event set (it reports from its registration on) and the PCIe thread (read at
    once, waited for at close) would only delay its exit. The live source keeps all three."""
    from vtop.config import Config
    from vtop.sources import nvml as nvml_mod

    def pcie_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "vtop-nvml-pcie"]

    for one_round in (True, False):
        fake = FakeNvml([FakeGpu(), FakeGpu()])
        monkeypatch.setattr(nvml_mod, "_load_pynvml", lambda fake=fake: fake)  # the real-GPU path, faked
        src = nvml_mod.make_gpu_source(Config(), one_round=one_round)
        p = src.poll()
        assert len(p.gpus) == 2 and p.status == OK
        if one_round:
            assert fake.gpm_live == 0 and fake.event_sets == 0 and fake.registered == set() and not pcie_threads()
        else:
            assert fake.gpm_live > 0 and fake.event_sets == 1 and fake.registered == {0, 1} and pcie_threads()
        assert src.close() and not pcie_threads()


# ------------------------------------------------------------------ GPU faults (#29)


def test_xid_events_are_drained_at_each_poll_with_the_timeout_and_mapped_to_their_gpu() -> None:
    s, fake = src([FakeGpu(), FakeGpu()])
    p = s.poll()
    assert p.xids == () and fake.registered == {0, 1} and fake.event_sets == 1
    assert fake.waits == [0]  # vtop's default: a wait that times out at once, never blocking the tick
    fake.inject_xid(1, 79)
    fake.inject_xid(0, 13)
    p = s.poll()
    assert [(x.gpu, x.xid) for x in p.xids] == [(1, 79), (0, 13)]
    assert all(x.mono == p.mono and x.t == p.t for x in p.xids)
    assert fake.waits[1:] == [0, 0, 0]  # two events, then the timeout that ends the drain
    assert s.poll().xids == ()  # drained once
    assert s.close() and fake.event_sets == 0


def test_xid_wait_timeout_is_passed_and_an_unregistrable_gpu_is_a_note_not_an_error() -> None:
    clock = FakeClock()
    fake = FakeNvml([FakeGpu(overrides={"register_events": pynvml.NVMLError_NotSupported(
        pynvml.NVML_ERROR_NOT_SUPPORTED)}), FakeGpu()], clock=clock.monotonic)
    s = NvmlSource(fake, clock=clock, xid_wait_ms=5)
    p = s.poll()
    assert p.status == OK and fake.registered == {1}
    assert any("GPU 0: XID events not available" in n for n in p.notes)
    fake.inject_xid(0, 48)  # never delivered: GPU 0 is not registered
    fake.inject_xid(1, 48)
    p = s.poll()
    assert [(x.gpu, x.xid) for x in p.xids] == [(1, 48)] and fake.waits[-2:] == [5, 0]


def test_poll_round_trips_xids_and_fault_fields_through_json() -> None:
    from vtop.model.gpu import GpuPoll

    s, fake = src([FakeGpu(overrides={"ecc_corrected": 3, "ecc_uncorrected": 1, "remapped_rows": (2, 1, 1, 0)})])
    fake.inject_xid(0, 94)
    p = s.poll()
    g = p.gpus[0]
    assert (g.ecc_corrected, g.ecc_uncorrected, g.rows_remapped_corr, g.rows_remapped) == (3, 1, 2, 1)
    assert g.remap_pending is True and g.remap_failed is False and g.retired_pages is None
    back = GpuPoll.from_json(p.to_json())
    assert back.xids == p.xids and back.gpus[0].rows_remapped == 1
    bare = FakeGpu(overrides={k: pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED) for k in (
        "ecc_corrected", "ecc_uncorrected", "remapped_rows", "retired_pages")})
    s2, _ = src([bare])
    g2 = s2.poll().gpus[0]
    assert (g2.ecc_corrected, g2.rows_remapped, g2.retired_pages) == (None, None, None)
    assert "ecc_corrected" not in g2.to_json()  # absent, not zero, and recordings stay as they were


def test_pcie_is_read_by_its_own_thread_not_the_poll() -> None:
    s, fake = src([FakeGpu()])
    assert s.poll().gpus[0].pcie_tx_kbs is None  # no thread asked for: never read on the tick
    s.read_pcie()
    g = s.poll().gpus[0]
    assert (g.pcie_tx_kbs, g.pcie_rx_kbs) == (1200.0, 3400.0)
    clock = FakeClock()
    fake2 = FakeNvml([FakeGpu()], clock=clock.monotonic)
    s2 = NvmlSource(fake2, clock=clock, pcie_every_s=3600)
    s2.poll()
    th = s2._pcie_thread
    assert th is not None and th.daemon
    for _ in range(200):
        if s2.poll().gpus[0].pcie_rx_kbs is not None:
            break
        threading.Event().wait(0.01)
    assert s2.poll().gpus[0].pcie_rx_kbs == 3400.0
    if sys.platform.startswith("linux"):  # its kernel name, for top -H and the benchmarks' per-thread CPU
        assert th.native_id is not None
        assert Path(f"/proc/self/task/{th.native_id}/comm").read_text().strip() == "vtop-pcie"
    assert s2.close() and not th.is_alive()


def test_a_lone_process_share_is_read_every_30_s_and_two_processes_share_every_slow_tick() -> None:
    """nvmlDeviceGetProcessUtilization costs 1.6 ms of CPU (H100, under load): read at each slow tick only
    while two or more processes share the GPU (whose share it is), else when the lone process is new or its
    reading is LONE_PROC_UTIL_S old; between, the last reading stands (never a gap, never a made-up one)."""
    clock = FakeClock()
    gpu = FakeGpu()
    s, fake = src([gpu], clock)
    reads: list[float] = []
    ask = fake.nvmlDeviceGetProcessUtilization

    def counted(h: Any, seen: int) -> Any:
        reads.append(clock.monotonic())
        return ask(h, seen)

    fake.nvmlDeviceGetProcessUtilization = counted  # type: ignore[method-assign]
    t0 = clock.monotonic()
    first = s.poll().gpus[0].procs[0].sm_util  # type: ignore[index]
    assert reads == [t0] and first is not None
    shown = []
    for _ in range(40):
        clock.advance(1.0)
        g = s.poll().gpus[0]
        shown.append((clock.monotonic() - t0, g.procs[0].sm_util))  # type: ignore[index]
    assert [r - t0 for r in reads] == [0.0, 32.0]  # the first slow tick 30 s on (every 4 s: 0, 4, ... 32)
    assert all(v == first for t, v in shown if t < 32)  # the last reading stands
    # a second process comes: read at the next slow tick, and at every slow tick while both are there
    gpu.overrides["procs"] = [SimpleNamespace(pid=4000, usedGpuMemory=2**30), SimpleNamespace(pid=5000,
                                                                                          usedGpuMemory=2**30)]
    gpu.overrides["proc_util"] = {4000: 30.0, 5000: 60.0}
    n = len(reads)
    for _ in range(12):
        clock.advance(1.0)
        p = s.poll()
    assert len(reads) - n == 3  # 12 s: three slow ticks, three reads
    assert {q.pid: q.sm_util for q in p.gpus[0].procs} == {4000: 30.0, 5000: 60.0}  # type: ignore[union-attr]
    # back to one process, another one: new, so read at once (its first slow tick)
    gpu.overrides["procs"] = [SimpleNamespace(pid=6000, usedGpuMemory=2**30)]
    gpu.overrides["proc_util"] = {6000: 80.0}
    n = len(reads)
    for _ in range(4):
        clock.advance(1.0)
        p = s.poll()
    assert len(reads) - n == 1 and p.gpus[0].procs[0].sm_util == 80.0  # type: ignore[index]
