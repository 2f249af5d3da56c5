"""The monitor's CPU a second as a stall ages (issue #46: the soak's 12-18 % of a core).

    .venv/bin/python bench/stall_cost.py                 # minutes 1, 5, 10, 15, 20, 30 of a stall
    .venv/bin/python bench/stall_cost.py --profile 15    # and cProfile's top at minute 15

Four servers answering the fault matrix's fake (tests/helpers/badserver.py: one real vLLM 0.32.0
text, ``running 8``, counters that never move: a wedged engine, as a fake written for the fault
matrix is) and 8 simulated GPUs, at ``--interval 0.25``, fed to the one :class:`~vtop.monitor.Monitor`
on a fake clock (one real scrape, replayed with its time moved: no HTTP, no Textual). Printed: the CPU
time (``time.process_time``) the monitor took per simulated second, at each minute asked for. A
figure that grows with the minute is work that grows with the stall's age: before the fix, the
candidates for the oldest request (4,096 a server, filtered every sample) and the runaway rule's pass
over 15 minutes of samples took it from 5.5 ms at minute 1 to 38.8 ms at minute 20 (dev VM).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import pstats
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.helpers.badserver import BadServer  # noqa: E402
from vtop.clock import FakeClock, SystemClock  # noqa: E402
from vtop.config import Config  # noqa: E402
from vtop.monitor import Monitor  # noqa: E402
from vtop.sources.fake_nvml import simulated  # noqa: E402
from vtop.sources.http11 import HttpPool  # noqa: E402
from vtop.sources.nvml import NvmlSource  # noqa: E402
from vtop.sources.vllm import VllmScraper  # noqa: E402


async def _a_poll(url: str) -> object:
    pool = HttpPool()
    try:
        sc = VllmScraper(url, client=pool, clock=SystemClock())
        polls = [await sc.poll() for _ in range(3)]
    finally:
        await pool.aclose()
    return polls[-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", default="1,5,10,15,20,30")
    ap.add_argument("--interval", type=float, default=0.25)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--profile", type=int, metavar="MINUTE", help="cProfile the minute after this one")
    args = ap.parse_args()
    with BadServer("ok") as srv:
        base = asyncio.run(_a_poll(srv.url))
    clock = FakeClock(start=10_000.0)
    urls = [f"http://127.0.0.1:{9000 + i}" for i in range(args.servers)]
    mon = Monitor(Config(urls=tuple(urls), interval=args.interval, simulate_gpus=args.gpus), clock=clock,
                  find_logs=False)
    mon.add_cli_urls()
    gpu = NvmlSource(simulated(args.gpus, call_cost_s=0.0), clock=clock)
    per_min = round(60 / args.interval)

    def run(rounds: int) -> None:
        for _ in range(rounds):
            clock.advance(args.interval)
            mon.apply_gpu(gpu.poll())
            for u in urls:
                mon.apply_server(u, dataclasses.replace(base, url=u, t=clock.time(), mono=clock.monotonic()))
            mon.tick()

    done = 0
    for m in sorted(int(x) for x in args.minutes.split(",")):
        run(max(0, (m - 1) * per_min - done))
        done = max(done, (m - 1) * per_min)
        t0 = time.process_time()
        run(per_min)
        done += per_min
        ms = (time.process_time() - t0) * 1000 / 60
        print(f"minute {m:3d}: {ms:5.1f} ms of CPU per second; alerts: "
              f"{', '.join(sorted({a.rule for a in mon.alerts})) or 'none'}", flush=True)
        if args.profile == m:
            pr = cProfile.Profile()
            pr.enable()
            run(per_min)
            done += per_min
            pr.disable()
            pstats.Stats(pr).sort_stats("cumulative").print_stats(20)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
