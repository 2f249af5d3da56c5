"""Regenerate the screenshots in screenshots/ that come from recordings (deterministic).

    python -m tests.make_screenshots

Screenshots of live runs (the real H200, the real vLLM CPU server) are made
by the scripts and tests that ran them and are not regenerated here.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests import h200_replay as rp
from vtop.config import Config
from vtop.ui.app import VtopApp

OUT = Path(__file__).resolve().parent.parent / "screenshots"


async def h200(until_t: float, name: str, size: tuple[int, int] = (120, 36)) -> None:
    clock = rp.make_clock()
    app = VtopApp(Config(history=180), gpu_source=None, autopoll=False, hostname="h200 (replay)")
    app.servers.clock = clock
    async with app.run_test(size=size) as pilot:
        await rp.feed(app, clock, until_t=until_t)
        await pilot.pause()
        app.save_screenshot(str(OUT / name))
    print("wrote", OUT / name)


async def main() -> None:
    await h200(108.5, "h200-replay-burst.svg")
    await h200(185, "h200-replay-runaway.svg")
    await h200(108.5, "h200-replay-burst-80x24.svg", size=(80, 24))


if __name__ == "__main__":
    asyncio.run(main())
