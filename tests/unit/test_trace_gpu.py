"""A trace's optional ``gpu.jsonl.gz`` (NVML once a second, ``tests/corpus/FORMAT.md``) replays as GPU polls."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from vtop.config import Config
from vtop.monitor.player import open_recording
from vtop.sources.recording.trace import load_trace

T0, M0 = 1_796_000_000.0, 1000.0
GIB = 2**30


def _gz(path: Path, rows: list[Any]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")


def _gpu_row(i: int, *, util: float | None = 95, sm: float | None = 0.03, used: int | None = 71 * GIB,
             procs: list[list[Any]] | None = None, names: dict[str, str] | None = None) -> dict[str, Any]:
    return {"t": T0 + i, "mono": M0 + i, "names": names or {},
            "gpus": [{"index": 0, "util": util, "mem_used": used, "mem_total": 140 * GIB, "power_w": 130.5,
                      "power_limit_w": 700.0, "sm_active": sm, "procs": procs if procs is not None else []}]}


def make_trace(root: Path, seconds: int, gpu_rows: list[Any] | None) -> Path:
    """A trace of a refused port (no server answered), the log empty, and ``gpu_rows`` if given."""
    root.mkdir(parents=True)
    truth = {"name": root.name, "class": "normal", "expect_rules": [], "began": None, "detectable_from": None,
             "should_alert_by": None, "ended": None, "expected_phase": None,
             "server": {"url": "http://127.0.0.1:8000", "flags": [], "vllm": "0.26.0", "gpu": "NVIDIA H200"}}
    (root / "truth.json").write_text(json.dumps(truth))
    _gz(root / "metrics.jsonl.gz", [{"t": T0 + i, "mono": M0 + i, "dt": 0.001, "status": None, "error": "refused",
                                     "text": None} for i in range(seconds)])
    _gz(root / "health.jsonl.gz", [{"t": T0 + i, "mono": M0 + i, "status": None, "error": "refused"}
                                   for i in range(seconds)])
    _gz(root / "procs.jsonl.gz", [{"t": T0, "mono": M0, "procs": [
        {"pid": 4242, "ppid": 4200, "name": "VLLM::EngineCor", "cmdline": ["VLLM::EngineCore"], "create_time": T0,
         "cpu": 1.5}]}])
    _gz(root / "log-index.jsonl.gz", [{"t": T0 + i, "mono": M0 + i, "size": 0} for i in range(seconds)])
    with gzip.open(root / "log.bin.gz", "wb") as f:
        f.write(b"")
    if gpu_rows is not None:
        _gz(root / "gpu.jsonl.gz", gpu_rows)
    return root


def test_gpu_rows_become_gpu_polls_with_their_processes_names(tmp_path: Path) -> None:
    rows: list[Any] = [
        _gpu_row(0, sm=None, procs=[[4242, 70 * GIB], [777, 2 * GIB]], names={"777": "python3"}),
        "{not json",
        {"t": T0 + 1, "mono": M0 + 1},  # no "gpus": skipped
        _gpu_row(2, util=None, used=None, sm=0.125, procs=[[4242, None]]),
    ]
    from vtop.sources.recording.trace import gpu_events

    trace = make_trace(tmp_path / "t", 3, rows)
    evs = gpu_events(trace, "NVIDIA H200")
    assert [e.kind for e in evs] == ["gpu", "gpu"]
    first, last = evs[0].data, evs[1].data
    assert (first.t, first.mono, first.status) == (T0, M0, "ok")
    g = first.gpus[0]
    assert (g.index, g.name, g.util_gpu, g.mem_used, g.mem_total) == (0, "NVIDIA H200", 95, 71 * GIB, 140 * GIB)
    assert (g.power_w, g.power_limit_w, g.sm_active) == (130.5, 700.0, None)
    assert [(p.pid, p.used_bytes) for p in g.procs or ()] == [(4242, 70 * GIB), (777, 2 * GIB)]
    # the row's own names first, the recorded process table's titles for the rest
    assert evs[0].extra == {4242: "VLLM::EngineCore", 777: "python3"}
    g2 = last.gpus[0]
    assert g2.util_gpu is None and g2.mem_used is None  # a gap, never a zero
    assert g2.sm_active == 12.5  # a fraction in the trace, a percentage in vtop
    assert [(p.pid, p.used_bytes) for p in g2.procs or ()] == [(4242, None)]


def test_load_trace_merges_the_gpu_polls_in_time_order_and_without_the_file_there_are_none(tmp_path: Path) -> None:
    with_gpu = make_trace(tmp_path / "a", 5, [_gpu_row(i) for i in range(5)])
    _, evs = load_trace(with_gpu)
    kinds = [e.kind for e in evs]
    assert kinds.count("gpu") == 5 and kinds.count("server") == 5
    assert [e.at for e in evs] == sorted(e.at for e in evs)
    _, evs = load_trace(make_trace(tmp_path / "b", 5, None))
    assert not [e for e in evs if e.kind == "gpu"]
    _, evs = load_trace(make_trace(tmp_path / "c", 5, []))  # NVML absent: an empty file
    assert not [e for e in evs if e.kind == "gpu"]


def test_a_replayed_gpu_trace_has_gpu_history_names_and_the_gpu_rules(tmp_path: Path) -> None:
    # GPU-Util 95 % with the SMs 3 % busy for 200 s: the sm_idle rule (120 s by default) must name it
    n = 200
    trace = make_trace(tmp_path / "busy-idle", n, [_gpu_row(i, procs=[[4242, 70 * GIB]]) for i in range(n)])
    player = open_recording(str(trace), config=Config())
    assert player.has_gpu
    m = player.play_to_end()
    tr = m.gpu_history.tracks[0]  # the GPU card and its charts
    assert tr.gpm_seen and tr.last is not None and tr.last.mem_used == 71 * GIB
    assert tr.peak_mem_pct is not None and abs(tr.peak_mem_pct - 100 * 71 / 140) < 0.01
    assert m.proc_names == {4242: "VLLM::EngineCore"}
    fired = [(c.t, a) for c in m.alert_log for a in c.alerts if a.rule == "sm_idle"]
    assert fired, [a.rule for c in m.alert_log for a in c.alerts]
    t, a = fired[0]
    assert t - T0 >= 120 - 2  # not before the rule's 120 s
    assert "SM activity 3.0 %" in a.title
