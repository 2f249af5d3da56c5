"""What ``vtop export`` costs: 8 simulated GPUs + 2 replayed H200 vLLM servers, scraped at 1 Hz.

    .venv/bin/python bench/export.py            # about 2.5 minutes; --seconds N per phase (default 60)

One ``vtop export`` process (as a user starts it, ``--interval 1``), watching 8 simulated GPUs that spin
the CPU time each NVML call takes on the H200 (``VTOP_SIMULATED_NVML_COST=h200``) and two local servers
replaying the H200's recorded ``/metrics`` timeline (bench/harness.py). After a 15 s warm-up, two
phases of ``--seconds`` each, in one process: (A) nobody scrapes it, (B) this script scrapes
``/metrics`` once a second, as Prometheus would. Printed: the process's CPU (utime+stime from /proc)
as % of one core in each phase, what the scrapes add, the scrape's wall time as the client sees it
(p50/p95), the exposition's size and series count, and peak RSS. Target: (B) at most 1 % of a core.
``bench/results/export-latest.json`` keeps the figures with the machine's description.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import ServerProcess, cpu_seconds, loadavg, machine_info, vm_kb, vtop_cmd

TARGET_PCT = 1.0


def phase(pid: int, seconds: float, scrape_url: str | None) -> dict[str, object]:
    u0, s0 = cpu_seconds(pid)
    t0 = time.monotonic()
    walls: list[float] = []
    size = series = 0
    n = 0
    while time.monotonic() - t0 < seconds:
        n += 1
        if scrape_url is not None:
            a = time.monotonic()
            body = urllib.request.urlopen(scrape_url, timeout=10).read()
            walls.append(time.monotonic() - a)
            size = len(body)
            series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        # the next scrape at the next whole second of the phase (1 Hz, no drift)
        time.sleep(max(0.0, t0 + n - time.monotonic()))
    wall = time.monotonic() - t0
    u1, s1 = cpu_seconds(pid)
    out: dict[str, object] = {"seconds": round(wall, 1), "cpu_pct": round(100 * (u1 + s1 - u0 - s0) / wall, 3),
                              "user_s": round(u1 - u0, 2), "sys_s": round(s1 - s0, 2)}
    if walls:
        walls.sort()
        out |= {"scrapes": len(walls), "scrape_ms_p50": round(1000 * statistics.median(walls), 2),
                "scrape_ms_p95": round(1000 * walls[int(0.95 * (len(walls) - 1))], 2),
                "exposition_bytes": size, "series": series}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="length of each phase (default 60)")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "export-latest.json"))
    args = ap.parse_args()
    env = {**os.environ, "VTOP_SIMULATED_NVML_COST": "h200", "XDG_CONFIG_HOME": "/nonexistent"}
    with ServerProcess(args.servers) as servers:
        proc = subprocess.Popen([*vtop_cmd(), "export", "--listen", "127.0.0.1:0", "--interval", "1",
                                 "--simulate-gpus", str(args.gpus), *servers.urls],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.startswith("vtop export: serving "):
                print(line, proc.stderr.read() if proc.stderr else "", file=sys.stderr)
                return 1
            url = line.split()[3]
            print(f"vtop export (pid {proc.pid}) at {url}: {args.gpus} simulated GPUs (H200 NVML cost), "
                  f"{args.servers} replayed H200 servers; warm-up 15 s, then {args.seconds:g} s unscraped and "
                  f"{args.seconds:g} s scraped at 1 Hz", flush=True)
            time.sleep(15)
            load0 = loadavg()
            a = phase(proc.pid, args.seconds, None)
            b = phase(proc.pid, args.seconds, url)
            load1 = loadavg()
            rss_mb = vm_kb(proc.pid) / 1024
            text = urllib.request.urlopen(url, timeout=10).read().decode()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    assert all(f"vtop_gpu_power_watts{{gpu=\"{i}\"" in text for i in range(args.gpus)), "every GPU exported"
    assert text.count('state="up"} 1.0') == args.servers, "every server up"
    res = {"gpus": args.gpus, "servers": args.servers, "interval_s": 1.0, "unscraped": a, "scraped_1hz": b,
           "scrapes_add_pct": round(float(b["cpu_pct"]) - float(a["cpu_pct"]), 3),  # type: ignore[arg-type]
           "peak_rss_mb": round(rss_mb, 1), "loadavg": [load0, load1], "target_pct": TARGET_PCT,
           "met": float(b["cpu_pct"]) <= TARGET_PCT, "machine": machine_info(),  # type: ignore[arg-type]
           "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print(f"{'phase':<22}{'CPU % of a core':>16}{'scrape p50/p95 ms':>20}{'bytes':>8}{'series':>8}")
    print(f"{'not scraped':<22}{a['cpu_pct']:>16}{'':>20}{'':>8}{'':>8}")
    print(f"{'scraped at 1 Hz':<22}{b['cpu_pct']:>16}{str(b['scrape_ms_p50']) + ' / ' + str(b['scrape_ms_p95']):>20}"
          f"{b['exposition_bytes']:>8}{b['series']:>8}")
    print(f"the scrapes add {res['scrapes_add_pct']} points; peak RSS {res['peak_rss_mb']} MB; load average "
          f"{load0:.2f} -> {load1:.2f}; target <= {TARGET_PCT} % scraped: {'MET' if res['met'] else 'MISSED'}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    return 0 if res["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
