"""What polling one GPU costs vtop: real NVML against the simulated GPUs of the benchmarks.

    python bench/nvml_calibrate.py [--polls 300]     # on a box with an NVIDIA GPU

The overhead scenarios (bench/run.py) run vtop with ``--simulate-gpus N``: its
fake NVML spins in every call the CPU time that call costs on the H200 box
(``H200_CALL_S`` in vtop/sources/fake_nvml.py, measured by this script). This
measures, in one process, the CPU time (``time.thread_time``) of one
``NvmlSource.poll()`` of GPU 0 through the real binding and of one simulated
GPU (no spin, and the table's costs), and the CPU time of each call vtop makes
a tick, called a tick apart as vtop calls them (``--slow-polls``: 1 s apart).
Process names are left out (both sides look them up the same way).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vtop.sources.fake_nvml import H200_CALL_S, FakeGpu, FakeNvml  # noqa: E402
from vtop.sources.nvml import NvmlSource, gpm_metrics_get  # noqa: E402


def per_poll_ms(src: NvmlSource, polls: int, gap_s: float) -> dict[str, float]:
    src.poll()  # init, handles, the first GPM sample
    src.poll()
    xs = []
    for _ in range(polls):
        t0 = time.thread_time()
        src.poll()
        xs.append(1000 * (time.thread_time() - t0))
        time.sleep(gap_s)
    xs.sort()
    return {"median_ms": statistics.median(xs), "p10_ms": xs[len(xs) // 10], "p90_ms": xs[9 * len(xs) // 10]}


def per_call_us(N: object, handle: object, polls: int, gap_s: float) -> dict[str, float]:
    """Median CPU time of each call vtop makes a tick, called as vtop calls them (a tick apart)."""
    n = N  # the real binding
    calls = {
        "utilization": lambda: n.nvmlDeviceGetUtilizationRates(handle),
        "memory": lambda: n.nvmlDeviceGetMemoryInfo(handle),
        "power": lambda: n.nvmlDeviceGetPowerUsage(handle),
        "temperature": lambda: n.nvmlDeviceGetTemperature(handle, n.NVML_TEMPERATURE_GPU),
        "sm_clock": lambda: n.nvmlDeviceGetClockInfo(handle, n.NVML_CLOCK_SM),
        "mem_clock": lambda: n.nvmlDeviceGetClockInfo(handle, n.NVML_CLOCK_MEM),
        "throttle": lambda: n.nvmlDeviceGetCurrentClocksEventReasons(handle),
        "procs": lambda: n.nvmlDeviceGetComputeRunningProcesses(handle),
    }
    samples = [n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()]
    times: dict[str, list[float]] = {k: [] for k in [*calls, "gpm_sample", "gpm_metrics"]}
    mg = gpm_metrics_get(n)  # what vtop asks
    n.nvmlGpmSampleGet(handle, samples[1])
    for k in range(polls):
        for name, fn in calls.items():
            t0 = time.thread_time()
            fn()
            times[name].append(time.thread_time() - t0)
        cur, prev = samples[k % 2], samples[(k + 1) % 2]
        t0 = time.thread_time()
        n.nvmlGpmSampleGet(handle, cur)
        times["gpm_sample"].append(time.thread_time() - t0)
        mg.sample1, mg.sample2 = prev, cur
        t0 = time.thread_time()
        n.nvmlGpmMetricsGet(mg)
        times["gpm_metrics"].append(time.thread_time() - t0)
        time.sleep(gap_s)
    for smp in samples:
        n.nvmlGpmSampleFree(smp)
    return {k: 1e6 * statistics.median(v) for k, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--polls", type=int, default=300)
    ap.add_argument("--gap", type=float, default=0.02, help="seconds between polls (GPM needs time between samples)")
    ap.add_argument("--slow-polls", type=int, default=0, help="also time each call this many times, 1 s apart")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    out: dict[str, object] = {"python": sys.version.split()[0], "polls": a.polls}
    # Whole polls, every call in each (vtop itself takes a GPM sample every other second).
    NvmlSource.SLOW_EVERY_S = 0.0
    real = NvmlSource()
    first = real.poll()
    if first.status != "ok" or not first.gpus:
        print(f"no real GPU here: {first.message}")
        return 1
    real._devices = real._devices[:1]  # GPU 0 only, whatever the box has
    g = real.poll().gpus[0]
    out["gpu"] = g.name
    out["real_fields"] = {k: getattr(g, k) is not None for k in ("util_gpu", "mem_used", "power_w", "temp_c",
                                                                  "sm_clock_mhz", "throttle", "procs", "sm_active")}
    out["real"] = per_poll_ms(real, a.polls, a.gap)
    out["real_1s_apart"] = per_poll_ms(real, a.slow_polls, 1.0) if a.slow_polls else None
    rows = {}
    calls = 0.0
    for label, cost in (("no_spin", 0.0), ("h200_costs", H200_CALL_S)):
        fake = FakeNvml([FakeGpu()], call_cost_s=cost)
        sim = NvmlSource(fake)
        c0 = fake.calls
        rows[label] = per_poll_ms(sim, a.polls, a.gap)
        calls = (fake.calls - c0) / (a.polls + 2)
    out["simulated_no_spin"] = rows["no_spin"]
    out["simulated_h200_costs"] = rows["h200_costs"]
    out["h200_call_us"] = {k: v * 1e6 for k, v in H200_CALL_S.items()}
    out["fake_calls_per_poll"] = calls
    r, s0, sh = out["real"]["median_ms"], rows["no_spin"]["median_ms"], rows["h200_costs"]["median_ms"]
    print(f"GPU 0: {g.name}; {calls:.0f} NVML calls a poll (simulated)")
    print(f"  real NVML                   {r:6.3f} ms a poll (p10 {out['real']['p10_ms']:.3f}, p90 {out['real']['p90_ms']:.3f})")
    if out["real_1s_apart"]:
        print(f"  real NVML, polls 1 s apart  {out['real_1s_apart']['median_ms']:6.3f} ms a poll")
    print(f"  simulated, no spin          {s0:6.3f} ms")
    print(f"  simulated, H200 call costs  {sh:6.3f} ms  ({sh / r:.2f} x the real GPU)")
    import pynvml

    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    out["real_per_call_us"] = per_call_us(pynvml, h, a.polls, a.gap)
    out["real_per_call_us_1s_apart"] = per_call_us(pynvml, h, a.slow_polls, 1.0) if a.slow_polls else None
    for label, key in (("a tick 20 ms apart", "real_per_call_us"), ("a tick 1 s apart", "real_per_call_us_1s_apart")):
        d = out[key]
        if d:
            print(f"  real, per call, {label}: " + ", ".join(f"{k} {v:.1f}" for k, v in d.items())
                  + f" us (sum {sum(d.values()):.0f} us)")
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
