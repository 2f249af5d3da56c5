"""The corpus played without its log (issue 49): vLLM's stdout on a pipe vtop cannot follow. Every
recorded stall, of the engine or of a start, is still named in time, from what else keeps time (the
connections, the processes' CPU seconds and state, /metrics); the normal starts and loads raise no
stall. ``python -m tests.corpus.score --no-log`` prints the same for the whole corpus."""

from __future__ import annotations

import re

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


#: every start failure of the corpus: the real CPU build's (a bad max-model-len, a KV cache too large or too
#: small, a missing package) and the H100's and H200's (max-model-len, CUDA OOM)
START_FAILURES = ["startup-failure-bad-max-model-len", "startup-failure-kv-too-large", "startup-failure-kv-too-small",
                  "startup-failure-missing-module", "h100-startup-failure-max-model-len",
                  "h100-startup-failure-max-model-len-2", "h200-startup-failure-cuda-oom"]
#: servers that answered, then went (a SIGTERM, a restart, an engine death), and starts that succeed:
#: a start failure is no answer for any of them
ANSWERED = NORMAL + ["clean-sigterm-idle", "clean-sigterm-shutdown", "restart-counter-reset",
                     "h100-starts-history-budget", "engine-death-worker-load", "engine-death-enginecore-idle",
                     "normal-start-load-nolog"]


@pytest.mark.parametrize("name", START_FAILURES)
def test_a_start_that_failed_without_its_log_is_named_by_its_processes(name: str) -> None:
    """No log: the first sign is the start's processes gone before its port ever answered (the scoreboard
    gives it until the server's exit and one process scan)."""
    s = score_trace(TRACES / name, with_log=False)
    assert s.named and s.in_time, s
    assert not s.false_alarms, s.false_alarms
    assert s.first_title is not None and "exited while starting" in s.first_title and "no log" in s.first_title, \
        s.first_title


@pytest.mark.parametrize("name", ANSWERED)
def test_a_server_that_answered_is_no_start_failure_without_its_log(name: str) -> None:
    s = score_trace(TRACES / name, with_log=False)
    assert not [f for f in s.false_alarms if "startup_failure" in f], s.false_alarms
    if s.expect:
        assert "startup_failure" not in (s.first_title or ""), s.first_title


SGLANG = ["h100-sglang-launch-burst-runaway", "h100-sglang-launch-burst-runaway-2", "h100-sglang-normal-load",
          "h100-sglang-scheduler-stall", "h100-sglang-scheduler-stall-2"]


@pytest.mark.parametrize("name", SGLANG)
def test_sglang_answering_health_503_is_no_engine_death_without_its_log(name: str) -> None:
    """SGLang's /health answers 503 while it is not ready to serve (its warm-up, a busy scheduler): four of
    these five real traces do; none of them is an engine death."""
    s = score_trace(TRACES / name, with_log=False)
    assert not [f for f in s.false_alarms if "engine_died" in f], s.false_alarms


STREAMS = TRACES / "engine-stall-streaming-nolog"


@pytest.mark.skipif(not STREAMS.is_dir(), reason="trace not recorded")
def test_doctor_30_and_60_s_after_the_stop_names_the_stall_dated_by_the_connections() -> None:
    """The real CPU server with no log for vtop, 3 streams waiting on a SIGSTOPped EngineCore: doctor
    --window 15 started 30 s and 60 s after the stop (replayed: tests/corpus/window.py) names the stall,
    dated from before it started by the connections' silence (main: no alert, exit 0)."""
    from tests.corpus.window import doctor_at
    from vtop.sources.recording.trace import truth_of

    truth = truth_of(STREAMS)
    assert truth.get("log_for_vtop") is False
    for after in truth["doctor_after_s"]:
        code, alerts = doctor_at(STREAMS, float(truth["began"]) + float(after))
        got = [a for a in alerts if a.rule == "engine_stall"]
        assert got and code == 2, (after, code, [a.title for a in alerts])
        ev = "\n".join(got[0].evidence)
        assert "dated by the connections" in ev and "3 answers in flight on its connections got no byte" in ev, ev
        # dated from the stop, before the window began: "no token for" reaches back past its start
        m = re.search(r"no token for (?:(\d+)m )?(\d+)s", got[0].title)
        assert m, got[0].title
        secs = int(m.group(1) or 0) * 60 + int(m.group(2))
        assert secs >= float(after) + 15 - 3, (after, got[0].title)


@pytest.mark.parametrize("name", ["engine-death-enginecore-idle", "engine-death-worker-idle",
                                  "engine-death-enginecore-load", "engine-death-worker-load"])
def test_with_its_log_an_engine_death_is_named_by_the_log_with_its_cause(name: str) -> None:
    """/health's 503 is the rule's evidence only without the log: with it, the log's line names the death."""
    s = score_trace(TRACES / name)
    assert s.named and s.in_time, s
    assert s.first_title is not None and "no log" not in s.first_title, s.first_title
