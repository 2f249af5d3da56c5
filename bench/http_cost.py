"""CPU a scrape's HTTP costs vtop: httpx's AsyncClient against vtop's HttpPool.

    python bench/http_cost.py [--n 300]

Both fetch the same URLs from a local server replaying the recorded H200
``/metrics`` (bench/harness.py, a child process, so its CPU is not counted)
over one kept-alive connection; the figure is vtop's own user+system CPU
per request (getrusage), which is what a scrape costs the watched box.
This is why :mod:`vtop.sources.http11` exists.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from harness import ServerProcess  # noqa: E402

from vtop.sources.http11 import HttpPool  # noqa: E402


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def per_request_ms(get, url: str, n: int) -> float:  # type: ignore[no-untyped-def]
    for _ in range(5):
        await get(url)
    t0 = cpu()
    for _ in range(n):
        await get(url)
    return (cpu() - t0) / n * 1000


async def main(base: str, n: int) -> list[tuple[str, float, float]]:
    import httpx

    hdr = {"Accept-Encoding": "identity"}
    rows = []
    async with httpx.AsyncClient(trust_env=False) as hc:
        pool = HttpPool()

        async def via_httpx(u: str) -> bytes:
            return (await hc.get(u, headers=hdr)).content

        async def via_pool(u: str) -> bytes:
            return (await pool.get(u, headers=list(hdr.items()), limit=16 << 20))[1]

        for path in ("/health", "/metrics"):
            a = await per_request_ms(via_httpx, base + path, n)
            b = await per_request_ms(via_pool, base + path, n)
            rows.append((path, a, b))
        await pool.aclose()
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=300)
    args = ap.parse_args()
    with ServerProcess(1) as sp:
        rows = asyncio.run(main(sp.urls[0], args.n))
    print(f"CPU per request, {args.n} requests each, one kept-alive connection")
    print(f"{'path':10} {'httpx ms':>9} {'vtop ms':>8} {'ratio':>6}")
    for path, a, b in rows:
        print(f"{path:10} {a:9.2f} {b:8.2f} {b / a:6.2f}")
