"""Numbers that misled (issue 26, item 7): "down for" in 5 s steps, ``prompt n/a/s``,
simulated GPUs not said to be simulated, the server charts ending short of the GPU ones.
(The "100 % GPU is expected" line on a box without GPU: tests/ui/test_startup_panel.py.)"""

from __future__ import annotations

import re

from tests.conftest import fake_gpus
from tests.helpers.demo_h200 import EV, seek_wall
from tests.helpers.screen_text import screen_lines
from vtop.clock import FakeClock
from vtop.config import Config
from vtop.faces.demo import demo_path
from vtop.sources.vllm import poll_from_error
from vtop.ui.app import VtopApp
from vtop.ui.replay import replay_app
from vtop.ui.widgets.server_panel import ServerCard

SPARK = re.compile(r"[▁▂▃▄▅▆▇█]+")


async def test_down_for_counts_every_second_between_polls() -> None:
    clock = FakeClock()
    app = VtopApp(Config(no_gpu=True), gpu_source=None, autopoll=False, hostname="t", clock=clock, log_watch=None)
    async with app.run_test(size=(100, 24)) as pilot:
        app.apply_procs([])
        url = next(iter(app.monitor.servers))
        app.apply_server(url, poll_from_error(url, "refused", t=clock.time(), mono=clock.monotonic()))
        seen = []
        for _ in range(4):  # no poll for 4 s (a refusing server is polled every 5 s)
            clock.advance(1.0)
            app.round()
            await pilot.pause()
            m = re.search(r"down for (\d+)s", app.cards[url].render().plain)
            seen.append(int(m.group(1)) if m else None)
        assert seen == [1, 2, 3, 4]


async def test_simulated_gpus_say_so_in_the_status_line() -> None:
    clock = FakeClock()
    src, _ = fake_gpus(2, clock)
    app = VtopApp(Config(simulate_gpus=2), gpu_source=src, autopoll=False, hostname="t", clock=clock, log_watch=None)
    async with app.run_test(size=(120, 24)) as pilot:
        await app.poll_gpu_once()
        await pilot.pause()
        status = screen_lines(app)[0]
        assert "2 × NVIDIA H200 SIMULATED" in status and "driver" not in status


async def test_no_prompt_rate_reads_a_dash_and_server_charts_end_with_the_gpu_ones() -> None:
    app = replay_app(str(demo_path()), config=Config(), name="demo")
    async with app.run_test(size=(120, 40)) as pilot:
        app.replay.paused = True  # type: ignore[union-attr]
        await pilot.pause()
        app.replay.seek(app.replay.end - 1.5)  # type: ignore[union-attr]  # the server stopped: no rates
        await pilot.pause()
        text = app.query_one(ServerCard).render().plain
        assert "n/a/s" not in text and "prompt -" in text
        # one time axis: the server card's right edge is the GPU card's, also between polls
        # and while the server is down (its missing samples are then a gap at the end)
        assert app.query_one(ServerCard).now == app.w_gpu.now
        seek_wall(app, EV["runaway_begin"] + 150)
        await pilot.pause()
        lines = screen_lines(app)
        ends = {ln.split()[1]: max(m.end() for m in SPARK.finditer(ln)) for ln in lines
                if SPARK.search(ln) and ln.startswith(("│", "┃")) and len(ln.split()) > 1}
        assert ends["running"] == ends["util"] == ends["waiting"], ends
