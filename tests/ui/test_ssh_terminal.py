"""SSH-first: NO_COLOR, 256 colours, and severity that does not depend on colour."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CODE = """
from vtop.config import Config
from vtop.ui.app import VtopApp
app = VtopApp(Config(no_gpu=True))
print(",".join(type(f).__name__ for f in app._filters))
"""


@pytest.mark.parametrize("no_color, mono", [("1", True), (None, False)])
def test_no_color_turns_on_the_monochrome_filter(no_color: str | None, mono: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    if no_color:
        env["NO_COLOR"] = no_color
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert ("Monochrome" in r.stdout) is mono


async def test_severity_is_written_not_only_coloured() -> None:
    from vtop.clock import FakeClock
    from vtop.config import Config
    from vtop.sources.fake_nvml import FakeGpu, FakeNvml
    from vtop.sources.nvml import NvmlSource
    from vtop.ui.app import VtopApp
    from vtop.ui.widgets.gpu_panel import GpuLines

    clock = FakeClock()
    a, b = FakeGpu(), FakeGpu()
    src = NvmlSource(FakeNvml([a, b], clock=clock.monotonic), clock=clock)
    app = VtopApp(Config(), gpu_source=src, autopoll=False, hostname="t")
    async with app.run_test(size=(80, 24)) as pilot:
        await app.poll_gpu_once()
        b.lost = True
        clock.advance(1)
        await app.poll_gpu_once()
        await pilot.press("c")
        await pilot.pause()
        text = app.query_one(GpuLines).render().plain
        assert "LOST" in text.splitlines()[1]  # a word, not only a red colour
