"""Item 4 of issue 24 on real recordings: no startup stall raised on a normal start (the H200 demo's
start with its graph capture frames, the H200 live recording, the CPU incident recordings, every
normal trace of the corpus)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vtop.config import Config
from vtop.monitor.player import open_recording
from vtop.sources.recording.trace import truth_of

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "tests" / "corpus" / "traces"
NORMAL = sorted(p.name for p in TRACES.iterdir()
                if p.is_dir() and (p / "truth.json").exists()
                and truth_of(p).get("class") in ("normal", "clean_shutdown", "restart"))
RECORDINGS = ["vtop/data/demo-h200-vllm-0.26.0.jsonl.gz", "tests/fixtures/h200-vtop-live/vtop-record.jsonl",
              *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests/fixtures/cpu-incidents").glob("*.jsonl.gz"))]


def _stalls(path: Path) -> list[str]:
    m = open_recording(str(path), config=Config()).play_to_end()
    return [f"{c.t:.0f}: {a.title}" for c in m.alert_log for a in c.alerts if a.rule == "startup_stall"]


def test_the_demo_start_is_seen_with_its_graph_capture_and_no_stall() -> None:
    m = open_recording(str(ROOT / RECORDINGS[0]), config=Config()).play_to_end()
    assert m.log_view is not None and any(
        p.progress for p in m.log_view.snapshot.phases if p.phase.value == "cuda_graphs"
    ), "the demo no longer holds its start"
    assert not [a for c in m.alert_log for a in c.alerts if a.rule == "startup_stall"]


@pytest.mark.parametrize("rel", RECORDINGS[1:])
def test_no_startup_stall_on_a_real_recording(rel: str) -> None:
    assert _stalls(ROOT / rel) == []


@pytest.mark.parametrize("name", NORMAL)
def test_no_startup_stall_on_a_normal_trace(name: str) -> None:
    assert len(NORMAL) >= 6
    assert _stalls(TRACES / name) == []


def test_the_h200_graph_capture_stall_is_named_from_its_progress_within_90s() -> None:
    # The real H200 trace: the EngineCore SIGSTOPped at graph capture 5/51 for 120 s. No CPU readings:
    # its own progress bar (51 graphs in a few seconds) says it stopped.
    p = TRACES / "h200-startup-stall-graph-capture"
    truth = truth_of(p)
    m = open_recording(str(p), config=Config()).play_to_end()
    hits = [(c.t, a) for c in m.alert_log for a in c.alerts if a.rule == "startup_stall"]
    assert hits, "not named"
    t, a = hits[0]
    assert t - float(truth["began"]) <= 90.0, t - float(truth["began"])
    assert "CUDA graph capture" in a.title and any("progress stopped" in e for e in a.evidence), (a.title, a.evidence)


@pytest.mark.parametrize("name", ["startup-stall-compile", "startup-stall-engine-init", "startup-stall-process-start"])
def test_a_silent_stall_is_named_within_90s_of_its_processes_going_still(name: str) -> None:
    # The real CPU traces: a process of the start SIGSTOPped (in torch.compile: the Worker; in engine init;
    # at process start), the log silent; the process table has each process's CPU seconds.
    p = TRACES / name
    truth = truth_of(p)
    m = open_recording(str(p), config=Config()).play_to_end()
    hits = [(c.t, a) for c in m.alert_log for a in c.alerts if a.rule == "startup_stall"]
    assert hits, "not named"
    t, a = hits[0]
    assert t - float(truth["began"]) <= 90.0, t - float(truth["began"])
    assert a.severity == "warning" and any("CPU" in e for e in a.evidence), (a.title, a.evidence)
    assert "kill -CONT" in a.fix[0], a.fix
    assert not [x for x in m.alert_log[-1].alerts if x.rule == "startup_stall"], "not cleared once it went on"
