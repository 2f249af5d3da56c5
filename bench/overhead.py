"""vtop's own cost on the box it watches: CPU seconds per minute and peak RSS.

    python bench/overhead.py                 # 8 simulated GPUs at 1 Hz, 60 s
    python bench/overhead.py --gpus 1 --duration 30

vtop runs in a real terminal (tmux, 120x40) exactly as a user starts it, with
``--simulate-gpus N``: GPUs answered by a fake NVML whose calls cost CPU like
the real ones (spun inside vtop's process: each call the CPU time it took on
the H200 box, ~0.39 ms a GPU a tick; bench/nvml_calibrate.py). After a warm-up, the CPU
time (user+sys) of the vtop process over the window is read from /proc, and
the peak RSS from VmHWM. ``bench/run.py`` runs the whole set of scenarios.

Targets (from the overhead issue): at most 1 % of one core (0.6 CPU-seconds
a minute) and 80 MB RSS with 8 GPUs at 1 Hz.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Tmux, cpu_seconds, vm_kb, vtop_cmd

ROOT = Path(__file__).resolve().parent.parent


def measure(gpus: int, duration: float, warmup: float, interval: float) -> dict[str, float]:
    tmux = Tmux()
    try:
        pid, _ = tmux.new("vtop", vtop_cmd() + ["--simulate-gpus", str(gpus), "--interval", str(interval)])
        time.sleep(warmup)
        u0, s0 = cpu_seconds(pid)
        w0 = time.monotonic()
        time.sleep(duration)
        u1, s1 = cpu_seconds(pid)
        wall = time.monotonic() - w0
        screen = tmux.capture("vtop")
        hwm_kb = vm_kb(pid, "VmHWM")
        rss_kb = vm_kb(pid, "VmRSS")
    finally:
        tmux.close()
    if f"{gpus} × NVIDIA H200" not in screen:
        sys.exit(f"bench: vtop did not show {gpus} GPUs; screen was:\n{screen}")
    cpu = (u1 - u0) + (s1 - s0)
    return {
        "cpu_s_per_min": cpu * 60.0 / wall,
        "cpu_pct_one_core": 100.0 * cpu / wall,
        "user_s": u1 - u0,
        "sys_s": s1 - s0,
        "peak_rss_mb": hwm_kb / 1024,
        "rss_mb": rss_kb / 1024,
        "wall_s": wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--interval", type=float, default=1.0)
    a = ap.parse_args()
    r = measure(a.gpus, a.duration, a.warmup, a.interval)
    print(f"vtop overhead: {a.gpus} simulated GPUs at {1 / a.interval:g} Hz, 120x40 tmux, {r['wall_s']:.0f} s measured")
    print(f"{'metric':<28}{'value':>10}  target")
    print(f"{'CPU s per minute':<28}{r['cpu_s_per_min']:>10.3f}  <= 0.600")
    print(f"{'CPU % of one core':<28}{r['cpu_pct_one_core']:>10.2f}  <= 1.00")
    print(f"{'  user / sys s':<28}{r['user_s']:>5.2f} / {r['sys_s']:.2f}")
    print(f"{'peak RSS MB (VmHWM)':<28}{r['peak_rss_mb']:>10.1f}  <= 80")
    ok = r["cpu_pct_one_core"] <= 1.0 and r["peak_rss_mb"] <= 80
    print("PASS" if ok else "OVER TARGET")


if __name__ == "__main__":
    main()
