"""vtop's own NVML recording of a real H200 (tools/device/h200_nvml_session.py): its GPU polls
by phase (idle, a matmul loop, a tiny-kernel loop, idle)."""

from __future__ import annotations

from tests.conftest import FIXTURES
from vtop.model.gpu import GpuPoll
from vtop.sources.recording.record import read

REC = FIXTURES / "nvml" / "h200-vtop-session-matmul-tiny.jsonl"


def phases() -> dict[str, list[GpuPoll]]:
    out: dict[str, list[GpuPoll]] = {}
    phase = None
    for r in read(REC):
        if r["kind"] == "mark":
            phase = r["label"]
        elif r["kind"] == "gpu" and phase:
            out.setdefault(phase, []).append(GpuPoll.from_json(r))
    return out
