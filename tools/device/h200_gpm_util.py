"""Could GPM's engine busy time replace ``utilization.gpu``? On the real GPU, one run.

    python3 tools/device/h200_gpm_util.py [--out gpm-util.json]

``nvmlDeviceGetUtilizationRates`` is an eighth of what a poll of the H200 costs
vtop (50 us of CPU), and GPM, which vtop samples anyway for SM activity, also
offers the engine's busy share over exactly the last interval
(``NVML_GPM_METRIC_GRAPHICS_UTIL``). This measures both on the real GPU every
second for about 45 s, through four phases (idle, a bf16 matmul loop, the same
loop busy about half of each second, idle again): the two readings side by
side, and the CPU time of a metrics-get with and without GRAPHICS_UTIL.

Found on the H200 (2026-12-01, bench/h200/gpm-util-2026-12-01.json): the
readings agree when busy (99.4 vs 99.6 %), GPM says 2 % when idle and 49 vs
41 % at half load; but a metrics-get with GRAPHICS_UTIL costs about 1.8 ms of
CPU instead of 8 us, so vtop keeps the utilization call.

Needs torch for the load and nvidia-ml-py (the device image has both); vtop from this checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vtop.sources.nvml import GPM_METRICS, gpm_metrics_get

LOAD = r"""
import sys, time, torch
plan = [(p.split(":")[0], float(p.split(":")[1])) for p in sys.argv[1].split(",")]
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
print("load: ready", flush=True)
for kind, seconds in plan:
    print(f"load: {kind} {seconds:.0f} s", flush=True)
    t0 = time.time()
    while time.time() - t0 < seconds:
        if kind == "idle":
            time.sleep(0.05)
            continue
        s0 = time.time()
        while time.time() - s0 < (1.0 if kind == "busy" else 0.5):
            for _ in range(5):
                c = a @ b
            torch.cuda.synchronize()
        if kind == "half":
            time.sleep(0.5)
print("load: done", flush=True)
"""

PHASES = [("idle", 8.0), ("busy", 12.0), ("half", 12.0), ("idle", 8.0)]


def _metrics_get(N, metrics, prev, cur):  # type: ignore[no-untyped-def]
    mg = gpm_metrics_get(N, metrics)
    mg.sample1, mg.sample2 = prev, cur
    t0 = time.thread_time()
    N.nvmlGpmMetricsGet(mg)
    us = 1e6 * (time.thread_time() - t0)
    return [mg.metrics[i].value for i in range(len(metrics))], us


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpm-util.json")
    a = ap.parse_args()
    import pynvml as N

    N.nvmlInit()
    handle = N.nvmlDeviceGetHandleByIndex(0)
    samples = [N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()]
    N.nvmlGpmSampleGet(handle, samples[1])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # torch from the image
    load = subprocess.Popen([sys.executable, "-c", LOAD, ",".join(f"{k}:{s}" for k, s in PHASES)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert load.stdout is not None
    os.set_blocking(load.stdout.fileno(), False)
    phase = "setup"
    rows: list[dict[str, object]] = []
    k = 0
    t_end = time.monotonic() + 120
    next_t = time.monotonic()
    while load.poll() is None and time.monotonic() < t_end:
        next_t += 1.0
        time.sleep(max(0.0, next_t - time.monotonic()))
        try:
            out = load.stdout.read() or ""
        except (BlockingIOError, TypeError):
            out = ""
        for line in out.splitlines():
            if line.startswith("load: ") and line.split()[1] in ("idle", "busy", "half"):
                phase = line.split()[1]
            print(line, flush=True)
        cur, prev = samples[k % 2], samples[(k + 1) % 2]
        k += 1
        N.nvmlGpmSampleGet(handle, cur)
        (sm, occ, bw), us3 = _metrics_get(N, GPM_METRICS, prev, cur)
        (busy,), us1 = _metrics_get(N, ("NVML_GPM_METRIC_GRAPHICS_UTIL",), prev, cur)
        t0 = time.thread_time()
        u = N.nvmlDeviceGetUtilizationRates(handle)
        us_util = 1e6 * (time.thread_time() - t0)
        row = {"t": round(time.time(), 2), "phase": phase, "gpm_graphics_util": busy, "nvml_util_gpu": float(u.gpu),
               "gpm_sm_util": sm, "cpu_us_metrics_get_vtops_3": round(us3, 1),
               "cpu_us_metrics_get_graphics_util": round(us1, 1), "cpu_us_utilization_call": round(us_util, 1)}
        rows.append(row)
        print(f"{phase:6} GPM busy {busy:5.1f}  utilization.gpu {u.gpu:3d}  SM {sm:5.1f}  CPU us: metrics-get "
              f"{us3:.0f} (vtop's 3), {us1:.0f} (GRAPHICS_UTIL); utilization call {us_util:.0f}", flush=True)
    load.wait(30)
    for smp in samples:
        N.nvmlGpmSampleFree(smp)
    summary: dict[str, object] = {}
    for ph in ("idle", "busy", "half"):
        rs = [r for r in rows if r["phase"] == ph][1:]  # skip the switch second
        if not rs:
            continue
        v = [float(r["gpm_graphics_util"]) for r in rs]  # type: ignore[arg-type]
        n = [float(r["nvml_util_gpu"]) for r in rs]  # type: ignore[arg-type]
        summary[ph] = {"seconds": len(rs), "gpm_mean": round(statistics.mean(v), 1),
                       "nvml_mean": round(statistics.mean(n), 1),
                       "mean_abs_diff": round(statistics.mean(abs(x - y) for x, y in zip(v, n)), 1)}
    rs = rows[1:]
    for key in ("cpu_us_metrics_get_vtops_3", "cpu_us_metrics_get_graphics_util", "cpu_us_utilization_call"):
        summary[key + "_median"] = statistics.median(float(r[key]) for r in rs) if rs else None  # type: ignore[arg-type]
    Path(a.out).write_text(json.dumps({"gpu": N.nvmlDeviceGetName(handle), "summary": summary, "rows": rows}, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
