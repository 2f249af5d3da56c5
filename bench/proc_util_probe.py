"""What NVML's per-process utilization costs, by API and by how many processes run kernels on the GPU.

    python bench/proc_util_probe.py --out /tmp/pu.json        # on a GPU box with torch (the load)

vtop reads each process's SM share with ``nvmlDeviceGetProcessUtilization`` (1.6 ms of CPU a call on an H100
under one matmul: bench/nvml_calibrate.py, 2026-12-06). This times it, and the newer
``nvmlDeviceGetProcessesUtilizationInfo`` (the v1 struct), each asked as vtop asks (since the newest sample seen),
``--calls`` times ``--gap`` seconds apart, with one bf16 matmul process on GPU 0, then with two (the noisy
neighbour's case, where vtop reads it every 4 s). CPU time per call (``time.thread_time``), median and p90.
Public pynvml calls only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lean import MATMUL


def timed(fn, calls: int, gap: float) -> dict[str, float | int | str]:
    seen = [0]
    xs: list[float] = []
    n_samples: list[int] = []
    err = ""
    for _ in range(calls):
        t0 = time.thread_time()
        try:
            got = fn(seen[0])
        except Exception as e:  # noqa: BLE001 - NotFound (no sample since), NotSupported: said in the result
            got, err = [], type(e).__name__
        xs.append(time.thread_time() - t0)
        n_samples.append(len(got))
        for s in got:
            seen[0] = max(seen[0], int(s.timeStamp))
        time.sleep(gap)
    xs.sort()
    return {"median_us": round(1e6 * statistics.median(xs), 1), "p90_us": round(1e6 * xs[int(0.9 * (len(xs) - 1))], 1),
            "samples_median": statistics.median(n_samples), "last_error": err}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--gap", type=float, default=0.5)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    import pynvml as n

    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    apis = {"GetProcessUtilization": lambda ts: n.nvmlDeviceGetProcessUtilization(h, ts),
            "GetProcessesUtilizationInfo": lambda ts: n.nvmlDeviceGetProcessesUtilizationInfo(h, ts)}
    out: dict[str, object] = {"gpu": str(n.nvmlDeviceGetName(h)), "driver": str(n.nvmlSystemGetDriverVersion()),
                              "calls": a.calls, "gap_s": a.gap}
    loads = []
    try:
        for k in (1, 2):
            loads.append(subprocess.Popen([sys.executable, "-c", MATMUL]))
            time.sleep(12)  # CUDA up, kernels running
            procs = len(n.nvmlDeviceGetComputeRunningProcesses(h))
            row = {name: timed(fn, a.calls, a.gap) for name, fn in apis.items()}
            row["processes_on_gpu"] = procs
            out[f"{k}_load"] = row
            print(k, "load(s):", json.dumps(row), flush=True)
    finally:
        for p in loads:
            p.kill()
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
