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
    app = VtopApp(Config(history=180), gpu_source=None, autopoll=False, hostname="h200 (replay)", clock=clock)
    async with app.run_test(size=size) as pilot:
        await rp.feed(app, clock, until_t=until_t)
        await pilot.pause()
        app.save_screenshot(str(OUT / name))
    print("wrote", OUT / name)


async def demo(offsets: list[tuple[str, float, str, tuple[int, int]]]) -> None:
    """Screens of `vtop demo` (vtop's own recording of vLLM 0.26.0 on the H200) at times
    relative to the recipe's events (tests/fixtures/h200-demo/events.jsonl)."""
    import json

    from vtop.demo import demo_path
    from vtop.ui.replay import replay_app

    ev: dict[str, float] = {}
    for line in (Path(__file__).parent / "fixtures" / "h200-demo" / "events.jsonl").read_text().splitlines():
        d = json.loads(line)
        ev.setdefault(d["ev"], float(d["t"]))
    for event, plus, name, size in offsets:
        app = replay_app(str(demo_path()), config=Config(), name="demo")
        async with app.run_test(size=size) as pilot:
            app.replay.paused = True
            await pilot.pause()
            app.replay.seek(ev[event] + plus - app.replay.clock.offset)
            await pilot.pause()
            if name.startswith("requests"):
                await pilot.press("r")
                await pilot.pause(0.3)
            app.save_screenshot(str(OUT / name))
        print("wrote", OUT / name)


async def main() -> None:
    await demo([
        ("vllm_launch", 62.0, "demo-h200-startup-cuda-graphs.svg", (120, 40)),
        ("load_b_begin", 6.0, "demo-h200-burst.svg", (120, 40)),
        ("runaway_begin", 150.0, "demo-h200-runaway-alert.svg", (120, 40)),
        ("runaway_begin", 150.0, "demo-h200-runaway-alert-80x24.svg", (80, 24)),
        ("runaway_begin", 150.0, "requests-h200-real-runaway.svg", (120, 40)),
    ])
    await h200(108.5, "h200-replay-burst.svg")
    await h200(185, "h200-replay-runaway.svg")
    await h200(108.5, "h200-replay-burst-80x24.svg", size=(80, 24))


if __name__ == "__main__":
    asyncio.run(main())
