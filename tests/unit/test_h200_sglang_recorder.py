"""tools/device/h200_sglang.py without a GPU or SGLang: what its engine table makes of SGLang's command line, the
sampler keeping SGLang's families and asking /server_info for the version SGLang's missing /version does not give,
the queue gauge, the truth's engine words, and which traces an earlier call already recorded."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from types import SimpleNamespace

import httpx

from tests.conftest import FIXTURES
from tools.corpus import record as R
from tools.device import h200_sglang as S

#: the command line sglang_serve.sh writes into serve.json (its CMD, with the recorder's flags after it)
SGL_CMD = ["/opt/torch/.venv/bin/python3", "-m", "sglang.launch_server", "--model-path", "/tmp/tiny", "--host",
           "127.0.0.1", "--port", "30000", "--enable-metrics", "--attention-backend", "triton", "--sampling-backend",
           "pytorch", "--mem-fraction-static", "0.5", "--context-length", "32768", "--log-requests",
           "--log-requests-level", "1", "--max-running-requests", "64"]


def test_sglangs_flags_and_model_from_its_command_line() -> None:
    eng = S.engines()["sglang"]
    assert S.model_of(SGL_CMD, eng) == "/tmp/tiny"
    flags = S.flags_of(SGL_CMD, eng)
    assert flags[:2] == ["--model-path", "/tmp/tiny"] and flags[-5:] == list(eng.flags)
    assert S.model_of(["python3", "-m", "sglang.launch_server", "--model-path=/m"], eng) == "/m"
    cpu = S.engines()["vllm-cpu"]
    cmd = ["/tmp/vllmcpu/bin/vllm", "serve", "/tmp/tinyllama", "--port", "18431", "--max-num-seqs", "8"]
    assert S.model_of(cmd, cpu) == "/tmp/tinyllama"
    assert S.flags_of(cmd, cpu) == ["--port", "18431", "--max-num-seqs", "8"]


def test_the_scenarios_flags_are_sglangs_own() -> None:
    """--log-requests-level 1 logs the sampling parameters (vtop's SGLang request log reads max_new_tokens from
    them) and no prompt; the burst's 600 exceed --max-running-requests 64."""
    eng = S.engines()["sglang"]
    f = " ".join(eng.flags)
    assert "--log-requests --log-requests-level 1" in f and "--max-running-requests 64" in f
    assert S.GPU_PARAMS["burst_n"] > 64 * 5
    assert S.SMALL_PARAMS["burst_n"] > 8  # the stand-in's --max-num-seqs 8
    assert set(S.SCENARIOS) == {"h200-sglang-launch-burst-runaway", "h200-sglang-scheduler-stall",
                                "h200-sglang-normal-load"}
    assert [S.SCENARIOS[n].sc.cls for n in sorted(S.SCENARIOS)] == ["runaway", "normal", "engine_stall"]


def test_the_trace_keeps_sglangs_families_and_drops_their_created_gauges() -> None:
    body = (FIXTURES / "sglang" / "metrics-0.5.17-handmade.txt").read_text()
    body += "# TYPE sglang:num_requests_created gauge\nsglang:num_requests_created 1.7e9\n"
    kept, dropped = R.filter_metrics(body)
    assert "sglang:num_running_reqs" in kept and "sglang:num_queue_reqs" in kept
    assert "sglang:num_requests_created" in dropped and "sglang:num_requests_created" not in kept


def test_the_queue_gauge_sums_its_label_sets() -> None:
    text = ('# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{engine_type="unified",tp_rank="0"} 300.0\n'
            'sglang:num_queue_reqs{engine_type="unified",tp_rank="1"} 236.0\nsglang:num_running_reqs 64.0\n')
    assert S.gauge(text, "sglang:num_queue_reqs") == 536.0
    assert S.gauge(text, "sglang:num_queue") is None  # a prefix of a name is not the name
    assert S.gauge("", "sglang:num_queue_reqs") is None


def test_sglangs_version_comes_from_server_info_once(tmp_path: Path) -> None:
    """SGLang serves no /version (404): the sampler's info row takes /server_info's, asked once per process."""
    asked: list[str] = []

    def answer(req: httpx.Request) -> httpx.Response:
        asked.append(req.url.path)
        if req.url.path == "/version":
            return httpx.Response(404, json={"detail": "Not Found"})
        if req.url.path == "/server_info":
            return httpx.Response(200, json={"version": "0.5.17", "max_running_requests": 64})
        return httpx.Response(200, json={"object": "list", "data": [{"id": "/tmp/tiny", "max_model_len": 32768}]})

    srv = SimpleNamespace(url="http://127.0.0.1:30000", pid=4242, log_path=None)
    smp = R.Sampler(tmp_path, srv)  # type: ignore[arg-type]
    with httpx.Client(transport=httpx.MockTransport(answer)) as c:
        smp._info(c)
        smp._info(c)
    for f in smp.files.values():
        f.close()
    rows = [json.loads(x) for x in gzip.open(tmp_path / "info.jsonl.gz", "rt")]
    assert rows and rows[0]["version"] == "0.5.17", rows
    assert asked.count("/server_info") == 1, asked


def test_the_truth_says_the_engine_and_its_version_under_its_name(tmp_path: Path) -> None:
    ctx = SimpleNamespace(eng=S.engines()["sglang"], vtop_dir=tmp_path / "A.vtop", out=tmp_path / "A" / "x")
    truth = {"engine": "sglang", "server": {"url": "http://127.0.0.1:30000", "vllm": "0.5.17", "flags": []}}
    S.finish_truth(ctx, truth)  # type: ignore[arg-type]
    assert truth["server"] == {"url": "http://127.0.0.1:30000", "vllm": None, "sglang": "0.5.17", "flags": [],
                               "engine": "sglang"}
    assert "engine" not in truth and truth["recorder"] == "tools/device/h200_sglang.py"
    assert truth["vtop_recording"] == "A.vtop/x/rec.jsonl.gz"


def test_a_later_call_records_only_what_an_earlier_one_did_not(tmp_path: Path) -> None:
    name = "h200-sglang-scheduler-stall"
    assert S.recorded(tmp_path, name) is None
    bad = tmp_path / "A" / name
    bad.mkdir(parents=True)
    (bad / "truth.json").write_text(json.dumps({"notes": "... scenario error: ServerFailed: not healthy"}))
    assert S.recorded(tmp_path, name) is None  # failed: record it again
    good = tmp_path / "B" / name
    good.mkdir(parents=True)
    (good / "truth.json").write_text(json.dumps({"notes": "H200, SGLang 0.5.17 ..."}))
    assert S.recorded(tmp_path, name) == good


def test_the_capture_pattern_reads_sglangs_progress_frames() -> None:
    """0.5.17's capture bar (decode_cuda_graph_runner.py's tqdm, as the handmade startup log has it): k/n."""
    import re

    log = (FIXTURES / "sglang" / "startup-0.5.17-handmade.log").read_bytes()
    frames = [(int(m.group(1)), int(m.group(2))) for m in re.finditer(S.engines()["sglang"].capture_re, log)]
    assert frames == [(1, 4), (4, 4)], frames
