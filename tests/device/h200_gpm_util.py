"""Does GPM's engine busy time read like ``utilization.gpu``? On the real GPU, one run.

    python3 tests/device/h200_gpm_util.py [--out gpm-util.json]

vtop shows "util" from GPM (``GRAPHICS_UTIL``, the share of the last interval any
kernel ran) once GPM has a baseline, and no longer calls
``nvmlDeviceGetUtilizationRates`` (an eighth of a poll's CPU on the H200). This
checks on the real GPU that the two read alike: every second for about 45 s it
records vtop's ``NvmlSource`` reading of GPU 0 and, right after, NVML's own
``utilization.gpu``, through four phases: idle, a bf16 matmul loop, the same
loop busy about half of each second, idle again. It prints one line a second and
a summary per phase (means and the mean absolute difference), and writes JSON.

Needs torch for the load (the device image has it); vtop from PYTHONPATH.
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from vtop.sources.nvml import NvmlSource  # noqa: E402

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpm-util.json")
    a = ap.parse_args()
    import pynvml as N

    src = NvmlSource()
    src.poll()
    N.nvmlInit()
    handle = N.nvmlDeviceGetHandleByIndex(0)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # torch from the image
    load = subprocess.Popen([sys.executable, "-c", LOAD, ",".join(f"{k}:{s}" for k, s in PHASES)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert load.stdout is not None
    phase = "setup"
    rows: list[dict[str, object]] = []
    os.set_blocking(load.stdout.fileno(), False)
    buf = ""
    t_end = time.monotonic() + 120
    next_t = time.monotonic()
    while load.poll() is None and time.monotonic() < t_end:
        next_t += 1.0
        time.sleep(max(0.0, next_t - time.monotonic()))
        try:
            buf += load.stdout.read() or ""
        except (BlockingIOError, TypeError):
            pass
        for line in buf.splitlines():
            if line.startswith("load: ") and line.split()[1] in ("idle", "busy", "half"):
                phase = line.split()[1]
            print(line, flush=True)
        buf = ""
        g = src.poll().gpus[0]
        u = N.nvmlDeviceGetUtilizationRates(handle)
        row = {"t": round(time.time(), 2), "phase": phase, "vtop_util": g.util_gpu, "nvml_util_gpu": float(u.gpu),
               "sm_active": g.sm_active, "util_mem_nvml": float(u.memory), "dram_bw": g.dram_bw}
        rows.append(row)
        print(f"{phase:6} vtop util {g.util_gpu}  nvml utilization.gpu {u.gpu:3d}  SM {g.sm_active}", flush=True)
    load.wait(30)
    summary = {}
    for ph in ("idle", "busy", "half"):
        rs = [r for r in rows if r["phase"] == ph and r["vtop_util"] is not None][1:]  # skip the switch second
        if not rs:
            continue
        v = [float(r["vtop_util"]) for r in rs]  # type: ignore[arg-type]
        n = [float(r["nvml_util_gpu"]) for r in rs]  # type: ignore[arg-type]
        summary[ph] = {"seconds": len(rs), "vtop_mean": round(statistics.mean(v), 1),
                       "nvml_mean": round(statistics.mean(n), 1),
                       "mean_abs_diff": round(statistics.mean(abs(x - y) for x, y in zip(v, n)), 1)}
    out = {"gpu": src.poll().gpus[0].name, "summary": summary, "rows": rows}
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(summary, indent=1))
    src.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
