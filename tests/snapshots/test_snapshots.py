"""SVG snapshots (pytest-textual-snapshot). Regenerate deliberately with
``pytest tests/snapshots --snapshot-update`` after a visual change, and look at them."""

from __future__ import annotations

import pynvml

from tests.conftest import FIXTURES, fake_gpus, make_app
from vtop.clock import FakeClock
from vtop.sources.fake_nvml import FakeNvml
from vtop.sources.nvml import NvmlSource
from vtop.sources.recording.record import ReplayGpuSource, polls_from_sampler


def _fed(app, clock: FakeClock | None, n: int):  # type: ignore[no-untyped-def]
    async def run_before(pilot) -> None:  # type: ignore[no-untyped-def]
        for _ in range(n):
            await app.poll_gpu_once()
            if clock is not None:
                clock.advance(1.0)
        await pilot.pause()

    return run_before


def test_eight_gpus_80x24(snap_compare) -> None:  # type: ignore[no-untyped-def]
    clock = FakeClock()
    src, _ = fake_gpus(8, clock)
    app = make_app(src)
    assert snap_compare(app, terminal_size=(80, 24), run_before=_fed(app, clock, 60))


def test_eight_gpus_200x60(snap_compare) -> None:  # type: ignore[no-untyped-def]
    clock = FakeClock()
    src, _ = fake_gpus(8, clock)
    app = make_app(src)
    assert snap_compare(app, terminal_size=(200, 60), run_before=_fed(app, clock, 120))


def test_real_h200_vllm_startup_120x30(snap_compare) -> None:  # type: ignore[no-untyped-def]
    polls = polls_from_sampler(FIXTURES / "nvml" / "h200-vllm-0.26.0-startup-load-runaway.jsonl")
    app = make_app(ReplayGpuSource(polls[::5][:200]), history=240)
    assert snap_compare(app, terminal_size=(120, 30), run_before=_fed(app, None, 200))


def test_no_gpu_80x24(snap_compare) -> None:  # type: ignore[no-untyped-def]
    src = NvmlSource(FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)))
    app = make_app(src)
    assert snap_compare(app, terminal_size=(80, 24), run_before=_fed(app, None, 1))
