"""Issue 40, a CUDA OOM at run time named by its stage, on the real thing (``tests/corpus/traces/
h100-runtime-oom-prompt-logprobs``): recorded on a lent H100 80GB (vLLM 0.26.0, 2026-12-05, call I of
``tools/device/h200_corpus.sh``). The tiny model served with a 151,936-token vocabulary on the V1 model runner,
--gpu-memory-utilization 0.97 --max-num-batched-tokens 32768; 30 s after ready two requests of 30,000 prompt
tokens asked for prompt_logprobs=5. The engine died in the first step: "torch.OutOfMemoryError: CUDA out of
memory. Tried to allocate 8.49 GiB. GPU 0 has a total capacity of 79.18 GiB of which 3.71 GiB is free"
(the step's bf16 logits, 29,999 x 151,936 x 2 B), EngineDeadError, both answered HTTP 500, the API server gone
2 s later. The log line reached vtop in the same second as the process's exit.

What the replay must say, as the screen does: the prompt-logprobs stage (its traceback's frame), with the step
budget this server ran with (from its command line, kept after its process was gone), no memory "spike" (the
card sat at 97.9 % from the end of the start: the KV cache, allocated whole), and fixes that would have
worked (--max-num-batched-tokens, the V2 runner), not --max-logprobs as a cap on memory (it only refuses a
request asking for more than it). ``vtop doctor`` reading the same log with no server says the same."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.trace_files import first_alert
from vtop.sources.recording.trace import truth_of

TRACE = Path(__file__).parent / "traces" / "h100-runtime-oom-prompt-logprobs"


def _alert() -> tuple[Any, Any]:
    p, a = first_alert(TRACE, "oom_transient")
    assert a is not None, [x.rule for x in p.monitor.alerts]
    return p, a


def test_the_real_oom_is_named_by_its_stage_in_time() -> None:
    from tests.corpus.score import score_trace

    p, a = _alert()
    assert a.severity == "critical"
    assert a.title == "CUDA out of memory on :8000 computing prompt logprobs: tried to allocate 8.49 GiB"
    score = score_trace(TRACE)  # the scoreboard's own measure against the truth's should_alert_by
    assert score.in_time and score.alert_after_s is not None and score.alert_after_s <= score.budget_s, score
    assert truth_of(TRACE)["expected_phase"] == "failed" and score.phase_ok, score  # the engine died after ready
    text = " ".join(a.evidence)
    assert "GPU 0 had 3.71 GiB free of 79.18 GiB" in text
    assert "_get_prompt_logprobs_dict" in text
    # the card was at 97.9 % from the end of the start (--gpu-memory-utilization 0.97): no spike before the OOM
    assert "jumped" not in text, a.evidence
    rules = {x.rule for x in p.monitor.alerts}
    assert "engine_died" not in rules and "oom_steady" not in rules, rules


def test_its_fixes_bound_the_step_and_name_the_budget_the_server_ran_with() -> None:
    _, a = _alert()
    first = a.fix[0]
    assert first.startswith("Bound a step's work: a lower --max-num-batched-tokens"), a.fix
    # its command line said 32768: a whole 30,000-token prompt in one step (the process was gone by then)
    assert "this server runs with --max-num-batched-tokens 32768" in first, first
    joined = " ".join(a.fix)
    assert "VLLM_USE_V2_MODEL_RUNNER=1" in joined and "1,024 prompt tokens at a time" in joined
    # --max-logprobs is said for what it is, never offered as the memory's cap
    assert "--max-logprobs only refuses a request that asks for more than it" in joined
    assert "Cap what a request may ask with --max-logprobs" not in joined


def test_the_truth_is_what_the_log_says() -> None:
    log = gzip.decompress((TRACE / "log.bin.gz").read_bytes()).decode()
    assert "Tried to allocate 8.49 GiB" in log and "EngineDeadError" in log
    assert "'max_num_batched_tokens': 32768" in log
    events = [json.loads(ln) for ln in (TRACE / "events.jsonl").read_text().splitlines() if ln.strip()]
    burst = next(e for e in events if e["what"] == "oom_burst_answered")
    assert burst["answers"] == ["HTTP 500", "HTTP 500"]


def test_doctor_reading_the_log_alone_says_the_same(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``vtop doctor --log`` with no server and no GPU: the stage, the title and the fixes from the log alone
    (the step budget from the API server's non-default args)."""
    from vtop.cli import main

    _, live = _alert()
    log = tmp_path / "vllm.log"
    log.write_bytes(gzip.decompress((TRACE / "log.bin.gz").read_bytes()))
    monkeypatch.setenv("XDG_CONFIG_HOME", "/nonexistent")
    import socket

    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc = main(["doctor", f"http://127.0.0.1:{port}", "--log", str(log), "--no-gpu", "--window", "1", "--json"])
    rep = json.loads(capsys.readouterr().out)
    got = [x for x in rep["alerts"] if x["rule"].startswith("oom_")]
    assert rc == 2 and [x["rule"] for x in got] == ["oom_transient"], rep["alerts"]
    assert got[0]["title"] == live.title.replace(":8000", f":{port}")
    assert tuple(got[0]["fix"]) == live.fix
