"""Run on the GPU machine: bench/run.py's scenarios on the box vtop is made for.

    python3 tools/device/h200_bench.py OUTDIR [--window 60] [--warmup 10] [--starts 5]

The dev VM has 2 small cores; a GPU box has many fast ones, and vtop's cost
there is the figure its users live with. Same scenarios as ``bench/run.py``,
each vtop in its own 120x40 terminal (tmux if installed, else a pty: see
``h200_overhead.Term``), ``--interval 1``, servers replaying the recorded H200
``/metrics`` timeline (``bench/harness.py``, child processes):

  (a) idle   ``--no-gpu`` and a port that refuses
  (b) 1+1    the real H200 (real NVML) and one server
  (c) 8+2    ``--simulate-gpus 8`` (vtop's fake NVML, 5 us a call) and two servers
  (d) 1+2    the real H200 and two servers

1. First frame: ``--starts`` sequential starts of (a) and of (c)'s command
   line, each timed from the spawn to the first screen showing the key hints.
2. The four scenarios run at the same time (16 cores: they do not compete),
   CPU (utime+stime, /proc) over ``--window`` seconds after ``--warmup``, and
   the peak RSS (VmHWM).

Writes OUTDIR/h200-bench.json and prints a table. Needs vtop importable
(PYTHONPATH=/tmp/vtop-site:<repo root>).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "bench"))

import h200_overhead as ovh  # noqa: E402
from harness import ServerProcess  # noqa: E402


def first_frame(argv: list[str], env: dict[str, str], use_tmux: bool, timeout: float = 15.0) -> float | None:
    t = ovh.Term("ff", argv, env, use_tmux)
    try:
        end = t.started + timeout
        while time.monotonic() < end:
            if "Quit" in t.screen():
                return time.monotonic() - t.started
            time.sleep(0.01)
        return None
    finally:
        t.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", nargs="?", default="/tmp/h200-bench")
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--no-tmux", action="store_true")
    a = ap.parse_args()
    out = Path(a.outdir)
    out.mkdir(parents=True, exist_ok=True)
    use_tmux = bool(shutil.which("tmux")) and not a.no_tmux
    ovh.TERM = ovh.pick_term()
    py = sys.executable
    vtop = [py, "-m", "vtop", "--interval", "1"]
    env = dict(os.environ, VTOP_SIMULATED_NVML_COST="h200")  # simulated GPUs priced as the H200's calls
    res: dict[str, Any] = {
        "host": socket.gethostname(), "python": platform.python_version(), "nproc": os.cpu_count(),
        "terminal": f"tmux {ovh.COLS}x{ovh.ROWS}" if use_tmux else f"pty {ovh.COLS}x{ovh.ROWS}",
        "window_s": a.window, "warmup_s": a.warmup,
    }
    try:
        res["cpu_model"] = next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                                if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    port, hold = ovh.closed_port()
    closed = f"http://127.0.0.1:{port}"
    with ServerProcess(5) as sp:
        urls = list(sp.urls)
        scen = {
            "a": ("(a) idle: --no-gpu, port closed", vtop + ["--no-gpu", closed]),
            "b": ("(b) real H200 + 1 server", vtop + [urls[0]]),
            "c": ("(c) 8 simulated GPUs + 2 servers", vtop + ["--simulate-gpus", "8", urls[1], urls[2]]),
            "d": ("(d) real H200 + 2 servers", vtop + [urls[3], urls[4]]),
        }
        # 1. first frames (python bytecode is written by the first start: report it apart)
        ff: dict[str, Any] = {}
        for key in ("a", "c"):
            argv = scen[key][1]
            prime = first_frame(argv, env, use_tmux)
            times = [first_frame(argv, env, use_tmux) for _ in range(a.starts)]
            ok = [x for x in times if x is not None]
            ff[key] = {"prime_s": prime, "all_s": times, "median_s": statistics.median(ok) if ok else None}
            print(f"first frame {key}: median {ff[key]['median_s']}, all {times}", flush=True)
        res["first_frame"] = ff
        # 2. CPU and RSS, the four at once
        terms = {k: ovh.Term(f"s{k}", argv, env, use_tmux) for k, (_, argv) in scen.items()}
        try:
            time.sleep(a.warmup)
            c0 = {k: ovh.tree_cpu(t.pid) for k, t in terms.items()}
            t0 = time.monotonic()
            time.sleep(a.window)
            c1 = {k: ovh.tree_cpu(t.pid) for k, t in terms.items()}
            dt = time.monotonic() - t0
            rows = {}
            for k, t in terms.items():
                cpu = None if c0[k] is None or c1[k] is None else c1[k] - c0[k]
                rows[k] = {
                    "label": scen[k][0], "argv": " ".join(scen[k][1][2:]),
                    "cpu_s": cpu, "cpu_pct": None if cpu is None else 100 * cpu / dt,
                    "cpu_s_per_min": None if cpu is None else 60 * cpu / dt,
                    "peak_rss_mb": (ovh.vm(t.pid, "VmHWM") or 0) / 1024,
                    "exit": t.poll_exit(), "screen": t.screen()[-3000:],
                }
            res["window_measured_s"] = dt
            res["scenarios"] = rows
            res["server_stats"] = [sp.stats(i) for i in range(5)]
        finally:
            for t in terms.values():
                t.stop()
    hold.close()
    (out / "h200-bench.json").write_text(json.dumps(res, indent=1))
    print(f"{res.get('cpu_model')}, {res['nproc']} CPUs, Python {res['python']}, {res['terminal']}")
    print(f"{'scenario':36} {'CPU s/min':>9} {'% core':>7} {'peak RSS MB':>11}")
    for r in res["scenarios"].values():
        pct = "n/a" if r["cpu_pct"] is None else f"{r['cpu_pct']:.2f}"
        spm = "n/a" if r["cpu_s_per_min"] is None else f"{r['cpu_s_per_min']:.3f}"
        print(f"{r['label']:36} {spm:>9} {pct:>7} {r['peak_rss_mb']:11.1f}")
    for k, v in ff.items():
        print(f"first frame {scen[k][0]}: median {v['median_s']:.2f} s (first start {v['prime_s']:.2f} s)"
              if v["median_s"] is not None else f"first frame {k}: not seen")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
