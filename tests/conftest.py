from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from vtop.clock import FakeClock
from vtop.config import Config
from vtop.sources.fake_nvml import FakeGpu, FakeNvml
from vtop.sources.nvml import NvmlSource

FIXTURES = Path(__file__).parent / "fixtures"

# vtop keeps each start's phase times in $XDG_STATE_HOME/vtop/starts.json (vtop/sources/start_history.py):
# no test reads or writes the history of the user who runs them (the subprocesses inherit this).
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="vtop-test-state-")


def fake_gpus(n: int, clock: FakeClock, **kw: object) -> tuple[NvmlSource, FakeNvml]:
    """``n`` simulated H200s whose readings follow the fake clock (deterministic)."""
    fake = FakeNvml([FakeGpu(phase=i * 0.7) for i in range(n)], clock=clock.monotonic, **kw)  # type: ignore[arg-type]
    return NvmlSource(fake, clock=clock), fake


def make_app(source: object, **cfg: object):  # type: ignore[no-untyped-def]
    from vtop.ui.app import VtopApp

    return VtopApp(Config(**cfg), gpu_source=source, autopoll=False, hostname="testhost")  # type: ignore[arg-type]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
