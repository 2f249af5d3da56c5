from __future__ import annotations

import json
from pathlib import Path

from vtop.sources.fake_nvml import simulated
from vtop.sources.nvml import NvmlSource
from vtop.sources.recording.record import Recorder, ReplayGpuSource, gpu_polls, polls_from_sampler, read

FIX = Path(__file__).parent.parent / "fixtures" / "nvml"


def test_round_trip(tmp_path: Path) -> None:
    fake = simulated(2)
    s = NvmlSource(fake)
    polls = [s.poll()]
    fake.inject_xid(1, 79)  # an XID event and the fault fields travel in a recording too
    polls += [s.poll() for _ in range(2)]
    assert [(x.gpu, x.xid) for x in polls[1].xids] == [(1, 79)] and polls[0].gpus[0].remap_pending is False
    f = tmp_path / "r.jsonl"
    rec = Recorder(f)
    for p in polls:
        rec.gpu(p)
    rec.mark(polls[-1].t, "done")
    rec.close()
    lines = [json.loads(x) for x in f.read_text().splitlines()]
    assert lines[0]["kind"] == "header" and lines[0]["schema"] == "vtop-record"
    back = gpu_polls(f)
    assert [p.gpus for p in back] == [p.gpus for p in polls]
    assert [p.xids for p in back] == [p.xids for p in polls]
    assert [r["label"] for r in read(f) if r["kind"] == "mark"] == ["done"]


def test_size_limit_stops_recording(tmp_path: Path) -> None:
    f = tmp_path / "r.jsonl"
    rec = Recorder(f, max_bytes=2000)
    s = NvmlSource(simulated(1))
    for _ in range(50):
        rec.gpu(s.poll())
    rec.close()
    assert f.stat().st_size <= 2000
    assert rec.stopped_reason and "size limit" in rec.stopped_reason


def test_damaged_line_is_skipped(tmp_path: Path) -> None:
    f = tmp_path / "r.jsonl"
    rec = Recorder(f)
    s = NvmlSource(simulated(1))
    rec.gpu(s.poll())
    rec.close()
    with f.open("a") as fh:
        fh.write('{"kind": "gpu", "t": 1, "gpus": [{"ind')  # cut by a crash
    assert len(gpu_polls(f)) == 1


def test_real_h200_sampler_recording_reads_back() -> None:
    polls = polls_from_sampler(FIX / "h200-vllm-0.26.0-startup-load-runaway.jsonl")
    assert len(polls) > 1000  # 5 Hz over 209 s
    assert all(p.gpus[0].name == "NVIDIA H200" for p in polls)
    mem = [p.gpus[0].mem_used / 2**30 for p in polls]  # type: ignore[operator]
    assert min(mem) < 1.0 < 70.0 < max(mem) < 72.0  # 0.6 GiB idle, KV cache takes it to ~71 GiB
    util = [p.gpus[0].util_gpu for p in polls]
    sm = [p.gpus[0].sm_active for p in polls if p.gpus[0].sm_active is not None]
    # the small model never loads the H200: util under 100, SM activity far lower
    assert max(util) <= 100 and max(sm) < 15  # type: ignore[type-var]
    assert polls[0].gpus[0].dram_bw is None  # NaN in the first GPM sample became None
    r = ReplayGpuSource(polls[:2])
    assert r.poll() is polls[0] and r.poll() is polls[1]
    assert r.poll().message == "end of recording"
