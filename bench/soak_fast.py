"""The soak on a fake clock: 30 minutes of vtop's monitor in a minute or two (for iterating).

    .venv/bin/python bench/soak_fast.py                  # 30 simulated minutes, 8 GPUs + 4 servers, 0.25 s
    .venv/bin/python bench/soak_fast.py --minutes 20 --trace   # + tracemalloc's growth by line

bench/soak.py is the proof (vtop as a user runs it, in tmux, 30 real minutes).
This is its time-compressed twin for finding what grows: in one process, the
same :class:`~vtop.monitor.Monitor` the screen drives, fed by the real
sources on a :class:`~vtop.clock.FakeClock` that moves ``--interval`` per
round, as fast as the box goes: the simulated NVML (8 H200s, calls free) and
one :class:`~vtop.sources.vllm.VllmScraper` per replayed H200 server
(bench/harness.py's, in threads here, picking the timeline's second from the
fake clock), then ``Monitor.tick`` (the rules). Every simulated second the
charts are resampled as the screen's would be (``Series.buckets``, 60 cells).
What it leaves out: Textual (the widgets, the compositor), the process scans,
the log. At every simulated minute, after ``gc.collect()``: VmRSS, the
interpreter's allocated blocks, and with ``--trace`` tracemalloc's total.

The verdict is the soak's: the largest RSS after minute 5 against the RSS at
minute 5, within 10 %. Results in bench/results/soak-fast-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from harness import MetricsTimeline, make_server  # noqa: E402

from vtop.clock import FakeClock  # noqa: E402
from vtop.config import Config  # noqa: E402
from vtop.monitor import Monitor  # noqa: E402
from vtop.sources.fake_nvml import simulated  # noqa: E402
from vtop.sources.http11 import HttpPool  # noqa: E402
from vtop.sources.nvml import NvmlSource  # noqa: E402
from vtop.sources.urls import normalize_url  # noqa: E402
from vtop.sources.vllm import VllmScraper  # noqa: E402


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    clock = FakeClock(start=10_000.0)
    timeline = MetricsTimeline()
    if args.fake == "static":  # the fault matrix's fake: one real 0.32.0 text, whole, counters frozen
        from tests.helpers.badserver import BadServer

        statics = [BadServer("ok") for _ in range(args.servers)]
        servers: list[Any] = []
        urls = [normalize_url(s.url) for s in statics]
    else:
        servers = [make_server(timeline, offset_s=i * 37, now=clock.monotonic) for i in range(args.servers)]
        for srv in servers:
            threading.Thread(target=srv.serve_forever, daemon=True).start()
        urls = [normalize_url(f"http://127.0.0.1:{s.server_address[1]}") for s in servers]
    config = Config(urls=tuple(urls), interval=args.interval, simulate_gpus=args.gpus)
    mon = Monitor(config, clock=clock, find_logs=False)
    mon.add_cli_urls()
    gpu = NvmlSource(simulated(args.gpus, call_cost_s=0.0), clock=clock)
    pool = HttpPool()
    scrapers = [VllmScraper(u, client=pool, clock=clock) for u in urls]
    if args.trace:
        tracemalloc.start(1)
    per_min = round(60 / args.interval)
    per_s = max(1, round(1 / args.interval))
    rounds = round(args.minutes * per_min)
    samples: list[dict[str, Any]] = []
    base_snap = None
    t0 = time.monotonic()
    for r in range(1, rounds + 1):
        clock.advance(args.interval)
        mon.apply_gpu(gpu.poll())
        polls = await asyncio.gather(*(s.poll() for s in scrapers))
        for u, p in zip(urls, polls):
            mon.apply_server(u, p)
        mon.tick()
        if r % per_s == 0:  # the charts, as the screen resamples them
            now = clock.monotonic()
            for tr in mon.gpu_history.tracks.values():
                for ser in tr.series.values():
                    ser.buckets(now, 60, config.history, max_gap=2 * args.interval)
            for ws in mon.servers.values():
                for ser in ws.tracker._series.values():
                    ser.buckets(now, 60, config.history, max_gap=2 * args.interval)
        if r % per_min == 0:
            gc.collect()
            m = r // per_min
            row: dict[str, Any] = {"min": m, "rss_mb": round(rss_mb(), 2),
                                 "blocks_k": round(sys.getallocatedblocks() / 1000, 1),
                                 "wall_s": round(time.monotonic() - t0, 1)}
            if args.trace:
                row["traced_mb"] = round(tracemalloc.get_traced_memory()[0] / 1e6, 2)
                if m == args.settle_min:
                    base_snap = tracemalloc.take_snapshot()
            samples.append(row)
            print(f"{m:4d} min  RSS {row['rss_mb']:7.1f} MB  blocks {row['blocks_k']:8.1f}k"
                  + (f"  traced {row['traced_mb']:6.2f} MB" if args.trace else "")
                  + f"  ({row['wall_s']:.0f} s)  alerts: {len(mon.alerts)}", flush=True)
    top: list[str] = []
    if args.trace and base_snap is not None:
        for st in tracemalloc.take_snapshot().compare_to(base_snap, "lineno")[:25]:
            top.append(f"{st.size_diff / 1e3:+9.1f} kB {st.count_diff:+7d}  {st.traceback[0]}")
        print(f"growth by line after minute {args.settle_min}:\n" + "\n".join(top))
    await pool.aclose()
    for srv in servers:
        srv.shutdown()
    base = next((x for x in samples if x["min"] == args.settle_min), None)
    after = [x for x in samples if x["min"] >= args.settle_min]
    verdict: dict[str, Any] = {"judged": False}
    if base is not None and after:
        peak = max(after, key=lambda x: x["rss_mb"])
        growth = peak["rss_mb"] / base["rss_mb"] - 1
        verdict = {"judged": True, "rss_at_settle_mb": base["rss_mb"], "max_rss_after_mb": peak["rss_mb"],
                   "growth_pct": round(100 * growth, 1), "pass": growth <= 0.10}
        print(f"verdict: RSS at minute {args.settle_min} {base['rss_mb']:.1f} MB, largest after "
              f"{peak['rss_mb']:.1f} MB: {100 * growth:+.1f} % -> {'PASS' if verdict['pass'] else 'MISS'}")
    return {"gpus": args.gpus, "servers": args.servers, "interval": args.interval, "minutes": args.minutes,
            "samples": samples, "verdict": verdict, "trace_top": top}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=int, default=30)
    ap.add_argument("--interval", type=float, default=0.25)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--settle-min", type=int, default=5)
    ap.add_argument("--fake", choices=("replay", "static"), default="replay",
                    help="the servers: the replayed H200 timeline, or the fault matrix's static 0.32.0 text")
    ap.add_argument("--trace", action="store_true", help="tracemalloc's total and the lines that grew after settling")
    ap.add_argument("--out", help="JSON file (default bench/results/soak-fast-<time>.json)")
    args = ap.parse_args()
    result = asyncio.run(run(args))
    out = Path(args.out) if args.out else HERE / "results" / f"soak-fast-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"results: {out}")
    return 0 if result["verdict"].get("pass", True) else 1


if __name__ == "__main__":
    raise SystemExit(main())
