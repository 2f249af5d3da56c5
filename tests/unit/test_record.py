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


def test_a_log_vtop_finds_itself_records_its_servers_launch(tmp_path: Path) -> None:
    """With no --log, vtop follows the log of the server it finds (its stdout) and marks the server's launch on
    the phase tracker: that mark is in the recording. It was marked before the recorder was attached: the real
    two-server run on an H100 (tests/fixtures/h100-two-servers) has no launch mark, so its replay began the
    start at the log's first line, 22 s after the launch ("ready in 1 min 03 s" for a start of 85 s)."""
    import dataclasses
    import subprocess
    import sys
    import time

    from tests.helpers import diag_fixtures as F
    from vtop.config import Config
    from vtop.monitor import Monitor

    log = tmp_path / "serve.log"
    with open(log, "wb") as out:  # a process whose stdout is a file: the log vtop finds for it
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=out,
                                 stderr=subprocess.STDOUT)
    try:
        sp = dataclasses.replace(F.cpu_process(), pid=child.pid, create_time=round(time.time() - 22.0, 2))
        f = tmp_path / "rec.jsonl"
        rec = Recorder(f)
        m = Monitor(Config(urls=(sp.url,), no_gpu=True), recorder=rec)
        m.add_cli_urls()
        m.apply_procs([sp])
        assert m.log_watch is not None, m.log_message
        rec.close()
    finally:
        child.kill()
        child.wait()
    launch = [r for r in read(f) if r["kind"] == "logmark" and r["what"] == "launch"]
    assert [r["epoch"] for r in launch] == [sp.create_time], launch
