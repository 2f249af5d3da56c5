"""vtop's own recording of a real H200 (tools/device/h200_nvml_session.py ran it on the
GPU machine): idle, a bf16 8192^2 matmul loop, a tiny-kernel loop, idle.

"GPU-Util 100 %" only says a kernel was running; SM activity (GPM) says how
busy the SMs were. The tiny-kernel loop is the case that tells them apart.
"""

from __future__ import annotations

import re
import statistics

from tests.conftest import make_app
from tests.helpers.h200_session import phases
from vtop.model.gpu import GpuPoll
from vtop.sources.recording.record import ReplayGpuSource
from vtop.ui.widgets.gpu_panel import GpuCard


def med(polls: list[GpuPoll], key: str) -> float:
    return statistics.median(getattr(p.gpus[0], key) for p in polls if getattr(p.gpus[0], key) is not None)


def test_recorded_phases_tell_util_from_sm_activity() -> None:
    ph = phases()
    assert list(ph)[:4] == ["idle", "heavy", "tiny", "idle-after"]
    heavy, tiny = ph["heavy"], ph["tiny"]
    assert len(heavy) >= 15 and len(tiny) >= 15  # 1 Hz for 20 s each
    assert med(heavy, "util_gpu") >= 95 and med(heavy, "sm_active") >= 90
    assert 10 <= med(tiny, "util_gpu") <= 35 and med(tiny, "sm_active") < 1
    assert med(heavy, "power_w") > 600 > 200 > med(tiny, "power_w")
    assert med(ph["idle"], "util_gpu") == 0
    # the load process is in NVML's process list with its GPU memory
    assert any(p.gpus[0].procs for p in heavy)


async def test_replay_shows_the_real_numbers_at_the_end_of_each_phase() -> None:
    ph = phases()
    polls = [p for name in ("idle", "heavy", "tiny") for p in ph[name]]
    app = make_app(ReplayGpuSource(polls), history=60)
    async with app.run_test(size=(120, 30)) as pilot:
        for i, p in enumerate(polls):
            await app.poll_gpu_once()
            if i == len(ph["idle"]) + len(ph["heavy"]) - 1:
                await pilot.pause()
                (card,) = app.query(GpuCard)
                text = card.render().plain
                g = p.gpus[0]
                assert re.search(rf"util\s+{g.util_gpu:.0f}% ", text) and re.search(rf"SM act\s+{g.sm_active:.0f}% ", text)
                assert g.util_gpu >= 95 and g.sm_active >= 90  # type: ignore[operator]
        await pilot.pause()
        (card,) = app.query(GpuCard)
        text = card.render().plain
        g = polls[-1].gpus[0]
        assert re.search(rf"SM act\s+{g.sm_active:.0f}% ", text) and g.sm_active < 5  # type: ignore[operator]
        # the heavy phase is still on the 60 s chart: full blocks in the SM row
        sm_row = text.splitlines()[1]
        assert "█" in sm_row
