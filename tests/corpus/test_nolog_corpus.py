"""The corpus played without its log (issue 49): vLLM's stdout on a pipe vtop cannot follow. Every
recorded stall, of the engine or of a start, is still named in time, from what else keeps time (the
connections, the processes' CPU seconds and state, /metrics); the normal starts and loads raise no
stall. ``python -m tests.corpus.score --no-log`` prints the same for the whole corpus."""

from __future__ import annotations

import pytest

from tests.corpus.score import TRACES, score_trace

STALLS = ["engine-stall-enginecore", "engine-stall-worker-only", "engine-stall-enginecore-worker-streaming",
          "h200-engine-stall-load", "startup-stall-compile", "startup-stall-engine-init",
          "startup-stall-process-start", "h200-startup-stall-graph-capture"]
#: normal traces from the launch on (a start with a silent torch.compile, graph capture on the H200, loads)
NORMAL = ["normal-steady-mixed", "normal-long-prompts", "normal-bursts-waiting-queue", "h200-normal-streams",
          "h200-normal-burst-queue", "restart-idle"]


@pytest.mark.parametrize("name", STALLS)
def test_a_stall_without_its_log_is_named_in_time(name: str) -> None:
    s = score_trace(TRACES / name, with_log=False)
    assert s.named and s.in_time, s
    assert not s.false_alarms, s.false_alarms
    if s.cls == "startup_stall":
        assert s.first_title is not None and "no log" in s.first_title, s.first_title


@pytest.mark.parametrize("name", NORMAL)
def test_a_normal_start_and_load_without_its_log_raise_no_stall(name: str) -> None:
    s = score_trace(TRACES / name, with_log=False)
    stalls = [f for f in s.false_alarms if "startup_stall" in f or "engine_stall" in f]
    assert not stalls, stalls
