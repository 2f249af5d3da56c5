"""The first real unresponsive API server of the corpus (``h100-api-unresponsive-prompt-logprobs``).

Recorded on vLLM 0.26.0 on a lent H100 (the scenario was made to cause a runtime OOM from prompt
logprobs; none came): while vLLM's API server built the prompt logprobs of 16 prompts of 30,000
tokens, its process ran at 100 % of one core for 47 s with the EngineCore idle, and answered neither
``/metrics`` nor ``/health``. What the alert says must be what the recording holds: ``/health`` failing
too (it said "/health last answered 200"), the API server's own CPU (a busy loop, not a wait), and no
"climbing towards full" from vLLM taking its KV cache whole at the end of its start at
``--gpu-memory-utilization 0.97`` (that start's 0.6 % -> 97 % in 84 s was called a climb).
"""

from __future__ import annotations

import json

import pytest

from tests.corpus.score import TRACES

TRACE = TRACES / "h100-api-unresponsive-prompt-logprobs"


@pytest.fixture(scope="module")
def played():
    from vtop.config import Config
    from vtop.monitor.player import open_recording

    if not TRACE.is_dir():
        pytest.skip("no corpus trace")
    m = open_recording(str(TRACE), config=Config()).play_to_end()
    return json.loads((TRACE / "truth.json").read_text()), m.alert_log


def test_the_start_taking_its_kv_cache_is_no_climb_towards_an_oom(played) -> None:
    _truth, log = played
    assert not [(c.t, a.title) for c in log for a in c.alerts if a.rule == "oom_risk"]


def test_the_silent_api_server_is_named_with_its_health_and_its_busy_loop(played) -> None:
    truth, log = played
    api = [(c.t, a) for c in log for a in c.alerts if a.rule == "api_unresponsive"]
    assert api and api[0][0] <= truth["should_alert_by"] + 1.0
    t, crit = next((t, a) for t, a in api if a.severity == "critical")
    assert truth["began"] < t < truth["ended"]
    ev = "\n".join(crit.evidence)
    assert "/health not answered either (timeout for" in ev, ev
    assert "/health last answered" not in ev
    assert "its event loop is busy with work of its own" in ev, ev
    assert crit.fix[0].startswith("py-spy dump --pid ") and "busy (a huge prompt tokenized, prompt logprobs" in crit.fix[0]
    assert not any("idle in epoll" in f for f in crit.fix)
