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
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
    seen_us = [0]

    def proc_util() -> None:
        try:
            got = n.nvmlDeviceGetProcessUtilization(handle, seen_us[0])
        except n.NVMLError:  # no sample since (NotFound), or not supported
            return
        for smp in got:
            seen_us[0] = max(seen_us[0], int(smp.timeStamp))

    calls = {
        "utilization": lambda: n.nvmlDeviceGetUtilizationRates(handle),
        "memory": lambda: n.nvmlDeviceGetMemoryInfo(handle),
        "power": lambda: n.nvmlDeviceGetPowerUsage(handle),
        "temperature": lambda: n.nvmlDeviceGetTemperature(handle, n.NVML_TEMPERATURE_GPU),
        "sm_clock": lambda: n.nvmlDeviceGetClockInfo(handle, n.NVML_CLOCK_SM),
        "mem_clock": lambda: n.nvmlDeviceGetClockInfo(handle, n.NVML_CLOCK_MEM),
        "throttle": lambda: n.nvmlDeviceGetCurrentClocksEventReasons(handle),
        "procs": lambda: n.nvmlDeviceGetComputeRunningProcesses(handle),
        # each process's SM share, asked as vtop asks it (since the newest sample it has seen): read every 4 s
        # while a process is on the GPU; the one call of vtop's slow tick not timed before (session 28)
        "proc_util": proc_util,
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


def alternatives(N: Any, handle: object, polls: int, gap_s: float) -> dict[str, Any]:
    """CPU time of other calls that answer what vtop asks every second, and what they answer.

    Memory through ``nvmlDeviceGetMemoryInfo_v2`` (used + reserved is v1's used), power as a
    field value, utilization as the driver's own samples since the last call: each is worth
    using only if it costs less than the call vtop makes now and says the same thing.

    These run one after another in a tick, so each is timed after the ones before it: the
    first call of a tick costs ~40 us more than later ones, and a call just after a related
    one can be answered from the driver's cache (v2 right after v1: 31-34 us on the H200;
    in vtop's place, after utilization: 97 us, against 79 for v1). :func:`memory_versions`
    is the fair comparison for memory; none of these replaced vtop's calls.
    """
    n = N
    last_ts = [0]

    def util_samples() -> Any:
        kind, samples = n.nvmlDeviceGetSamples(handle, n.NVML_GPU_UTILIZATION_SAMPLES, last_ts[0])
        if samples:
            last_ts[0] = samples[-1].timeStamp
        return samples

    calls: dict[str, Callable[[], Any]] = {
        "memory_v1": lambda: n.nvmlDeviceGetMemoryInfo(handle),
        "memory_v2": lambda: n.nvmlDeviceGetMemoryInfo(handle, version=n.nvmlMemory_v2),
        "power": lambda: n.nvmlDeviceGetPowerUsage(handle),
        "power_field_instant": lambda: n.nvmlDeviceGetFieldValues(handle, [n.NVML_FI_DEV_POWER_INSTANT]),
        "utilization": lambda: n.nvmlDeviceGetUtilizationRates(handle),
        "utilization_samples": util_samples,
    }
    times: dict[str, list[float]] = {k: [] for k in calls}
    errors: dict[str, str] = {}
    last: dict[str, Any] = {}
    for _ in range(polls):
        for name, fn in calls.items():
            if name in errors:
                continue
            t0 = time.thread_time()
            try:
                last[name] = fn()
            except Exception as e:  # noqa: BLE001 - a call this driver lacks is a finding
                errors[name] = f"{type(e).__name__}: {e}"
                continue
            times[name].append(time.thread_time() - t0)
        time.sleep(gap_s)
    out: dict[str, Any] = {"us_per_call": {k: 1e6 * statistics.median(v) for k, v in times.items() if v},
                           "errors": errors}
    vals: dict[str, Any] = {}
    if "memory_v1" in last:
        vals["memory_v1_used_total"] = [int(last["memory_v1"].used), int(last["memory_v1"].total)]
    if "memory_v2" in last:
        m = last["memory_v2"]
        vals["memory_v2_used_reserved_total"] = [int(m.used), int(getattr(m, "reserved", -1)), int(m.total)]
    if "power" in last:
        vals["power_mw"] = int(last["power"])
    if "power_field_instant" in last:
        f = last["power_field_instant"][0]
        vals["power_field"] = {"nvmlReturn": int(f.nvmlReturn), "uint": int(f.value.uiVal)}
    if "utilization" in last:
        vals["utilization_gpu"] = int(last["utilization"].gpu)
    if "utilization_samples" in last:
        vals["utilization_samples_n"] = len(last["utilization_samples"])
        vals["utilization_samples_last"] = [int(s.sampleValue.uiVal) for s in last["utilization_samples"][-5:]]
    out["values"] = vals
    return out


def memory_versions(N: Any, handle: object, rounds: int, gap_s: float) -> dict[str, Any]:
    """Memory v1 against v2 where vtop reads memory: after utilization, before power, a
    tick apart, the version alternating from tick to tick (the first call of a tick costs
    more than the same call later in it, so only the same place compares)."""
    n = N
    times: dict[str, list[float]] = {"utilization": [], "memory": [], "memory_v2": [], "power": []}
    same: list[bool] = []
    for k in range(rounds):
        time.sleep(gap_s)
        key = "memory_v2" if k % 2 else "memory"
        t0 = time.thread_time()
        n.nvmlDeviceGetUtilizationRates(handle)
        t1 = time.thread_time()
        m = n.nvmlDeviceGetMemoryInfo(handle, version=n.nvmlMemory_v2) if k % 2 else n.nvmlDeviceGetMemoryInfo(handle)
        t2 = time.thread_time()
        n.nvmlDeviceGetPowerUsage(handle)
        t3 = time.thread_time()
        times["utilization"].append(t1 - t0)
        times[key].append(t2 - t1)
        times["power"].append(t3 - t2)
        if k % 2:  # v2's used + reserved against v1's used, read just after
            v1 = n.nvmlDeviceGetMemoryInfo(handle)
            same.append(abs(int(m.used) + int(m.reserved) - int(v1.used)) <= 64 * 2**20 and int(m.total) == int(v1.total))
    return {"us_per_call": {k: 1e6 * statistics.median(v) for k, v in times.items()},
            "p90_us": {k: 1e6 * sorted(v)[9 * len(v) // 10] for k, v in times.items()},
            "v2_used_plus_reserved_is_v1_used": sum(same), "of": len(same)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--polls", type=int, default=300)
    ap.add_argument("--gap", type=float, default=0.02, help="seconds between polls (GPM needs time between samples)")
    ap.add_argument("--slow-polls", type=int, default=0, help="also time each call this many times, 1 s apart")
    ap.add_argument("--alternatives", type=int, default=0, metavar="N",
                    help="also time N rounds of other calls for what vtop reads every second (--gap apart)")
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
    if a.alternatives:
        out["alternatives"] = alt = alternatives(pynvml, h, a.alternatives, a.gap)
        print("  other calls, one after another in a tick (see alternatives()), us each: " + ", ".join(f"{k} {v:.1f}" for k, v in alt["us_per_call"].items()))
        if alt["errors"]:
            print(f"  not answered here: {alt['errors']}")
        print(f"  what they said: {alt['values']}")
        out["memory_versions"] = mv = memory_versions(pynvml, h, a.alternatives, a.gap)
        print("  in vtop's order (utilization, memory, power), versions alternating, us each: "
              + ", ".join(f"{k} {v:.1f}" for k, v in mv["us_per_call"].items())
              + f"; v2 used + reserved == v1 used in {mv['v2_used_plus_reserved_is_v1_used']} of {mv['of']}")
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
