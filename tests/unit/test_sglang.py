"""SGLang beside vLLM (issue 42): its /metrics names, its processes, its startup log and its OOM words.

The SGLang fixtures (tests/fixtures/sglang/) are HAND-MADE from SGLang 0.5.17's source (their README names the
files): these tests check vtop's tables against what that source says, not against a real SGLang server, which
has not run beside vtop yet.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from vtop.core.engines import ENGINE_FLAGS, flags_of
from vtop.core.phases.patterns import parse_line
from vtop.core.phases.tracker import PhaseTracker
from vtop.core.phases.types import Phase
from vtop.core.rules.alert import Thresholds
from vtop.core.rules.oom import OomFinding, oom_alert
from vtop.core.rules.startup import failure_words
from vtop.faces.headless import server_engine
from vtop.sources import metrics_text
from vtop.sources.discovery import discover
from vtop.sources.metrics_text import SGLANG_BESIDE_VLLM, WANTED_SAMPLE_NAMES, clear_line_cache, parse_vllm_metrics

ROOT = Path(__file__).resolve().parent.parent.parent
SGL = ROOT / "tests" / "fixtures" / "sglang"
VLLM = ROOT / "tests" / "fixtures" / "vllm"

# --------------------------------------------------------------------------- /metrics


@pytest.mark.parametrize("use_cache", [True, False])
def test_sglang_payload_reads_into_the_same_fields(use_cache: bool) -> None:
    clear_line_cache()
    m = parse_vllm_metrics((SGL / "metrics-0.5.17-handmade.txt").read_text(), use_cache=use_cache)
    assert m.is_vllm and m.engine_kind == "sglang"
    assert m.problems == ()
    assert (m.running, m.waiting, m.kv_cache_usage) == (3.0, 7.0, 0.25)
    # the tokenizer's counters are split by is_streaming: summed
    assert (m.prompt_tokens_total, m.generation_tokens_total) == (1500.0, 6000.0)
    assert m.preemptions_total == 2.0  # num_retracted_requests_total
    assert m.model_name == "tiny"
    assert m.kv_cache_metric == "sglang:token_usage"
    assert m.inter_token_metric == "sglang:inter_token_latency_seconds"
    ttft = m.time_to_first_token_seconds
    assert ttft is not None
    # is_streaming="false" and "true" summed, a bucket bound at a time
    assert ttft.buckets == ((0.1, 5.0), (1.0, 11.0), (float("inf"), 12.0))
    assert (ttft.sum, ttft.count) == (2.0, 12.0)
    assert m.e2e_request_latency_seconds is not None and m.e2e_request_latency_seconds.count == 12.0
    assert m.request_queue_time_seconds is not None and m.request_queue_time_seconds.count == 12.0
    assert m.inter_token_latency_seconds is not None and m.inter_token_latency_seconds.count == 5988.0
    assert len(m.engines) == 1 and m.engines[0].engine is None


def test_cold_and_warm_parses_agree_on_sglang() -> None:
    text = (SGL / "metrics-0.5.17-handmade.txt").read_text()
    clear_line_cache()
    cold = parse_vllm_metrics(text)
    warm = parse_vllm_metrics(text)
    assert cold == warm == parse_vllm_metrics(text, use_cache=False)


def test_token_usage_is_averaged_over_schedulers_not_summed() -> None:
    """Two DP groups each report their own KV pool fraction: the server's is their mean; counts add up."""
    lab = 'engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
    text = "".join(
        f'sglang:token_usage{{dp_rank="{d}",{lab}}} {u}\nsglang:num_running_reqs{{dp_rank="{d}",{lab}}} {r}\n'
        f'sglang:num_queue_reqs{{dp_rank="{d}",{lab}}} 0.0\n'
        for d, u, r in ((0, 0.2, 5.0), (1, 0.6, 7.0))
    )
    m = parse_vllm_metrics(text)
    assert m.kv_cache_usage == pytest.approx(0.4)
    assert m.running == 12.0
    assert m.problems == ()


def test_older_sglang_time_per_output_token_is_read_as_inter_token_latency() -> None:
    text = (
        'sglang:num_running_reqs{model_name="m"} 1.0\nsglang:num_queue_reqs{model_name="m"} 0.0\n'
        'sglang:token_usage{model_name="m"} 0.1\n'
        'sglang:time_per_output_token_seconds_bucket{le="0.1",model_name="m"} 3.0\n'
        'sglang:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 4.0\n'
        'sglang:time_per_output_token_seconds_sum{model_name="m"} 0.5\n'
        'sglang:time_per_output_token_seconds_count{model_name="m"} 4.0\n'
    )
    m = parse_vllm_metrics(text)
    assert m.inter_token_metric == "sglang:time_per_output_token_seconds"
    assert m.inter_token_latency_seconds is not None and m.inter_token_latency_seconds.count == 4.0


def test_sglang_without_its_core_families_says_which() -> None:
    m = parse_vllm_metrics('sglang:num_running_reqs{model_name="m"} 1.0\n')
    assert m.engine_kind == "sglang"
    assert "sglang:num_queue_reqs missing" in m.problems
    assert not any("vllm:" in p for p in m.problems)


def test_vllm_payload_is_still_vllm() -> None:
    m = parse_vllm_metrics((VLLM / "h200-0.26.0-metrics-idle.txt").read_text())
    assert m.engine_kind == "vllm"
    assert m.kv_cache_metric == "vllm:kv_cache_usage_perc"


def test_the_name_table_pairs_sglang_names_with_vllm_names_vtop_reads() -> None:
    assert {"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
            "sglang:time_to_first_token_seconds", "sglang:e2e_request_latency_seconds"} <= set(SGLANG_BESIDE_VLLM)
    wanted = set(WANTED_SAMPLE_NAMES)
    hist = set(metrics_text.HISTOGRAM_FAMILIES)
    for sgl, vllm in SGLANG_BESIDE_VLLM.items():
        assert sgl in wanted or sgl in hist, sgl
        assert vllm in wanted or vllm in hist, vllm


# --------------------------------------------------------------------------- processes


def _p(pid: int, ppid: int, cmd: str, name: str = "python3") -> dict[str, object]:
    return {"pid": pid, "ppid": ppid, "name": name, "cmdline": cmd.split(), "create_time": 1000.0 + pid}


def test_sglang_launch_server_and_its_schedulers_are_found() -> None:
    procs = [
        _p(100, 1, "/opt/torch/.venv/bin/python3 -m sglang.launch_server --model-path /tmp/tiny --port 30001 "
                   "--tp-size 2 --context-length 4096 --max-running-requests 64 --mem-fraction-static 0.5"),
        # setproctitle'd children (one string with spaces padded, split by discovery)
        _p(101, 100, "sglang::scheduler_TP0", name="sglang::schedul"),
        _p(102, 100, "sglang::scheduler_TP1", name="sglang::schedul"),
        _p(103, 100, "sglang::detokenizer", name="sglang::detoken"),
        _p(200, 1, "python3 -m vllm.entrypoints.openai.api_server --model m --port 8001"),
    ]
    d = discover(procs)
    sgl = next(s for s in d.servers if s.pid == 100)
    assert sgl.engine == "sglang" and sgl.form == "sglang"
    assert (sgl.port, sgl.model, sgl.tensor_parallel_size) == (30001, "/tmp/tiny", 2)
    assert (sgl.max_model_len, sgl.max_num_seqs) == (4096, 64)
    assert sgl.gpu_memory_utilization is None  # --mem-fraction-static is another budget
    assert sgl.gpu_pids == (101, 102) and not sgl.gpu_pids_guessed
    roles = {c.pid: (c.role, c.rank) for c in sgl.children}
    assert roles == {101: ("worker", 0), 102: ("worker", 1), 103: ("other", None)}
    v = next(s for s in d.servers if s.pid == 200)
    assert v.engine == "vllm" and v.port == 8001


def test_sglang_serve_console_script_defaults_to_port_30000() -> None:
    d = discover([_p(300, 1, "/tmp/sglsite/bin/sglang serve --model-path Qwen/Qwen3-0.6B --host 0.0.0.0",
                     name="sglang")])
    (s,) = d.servers
    assert (s.engine, s.form, s.port, s.model) == ("sglang", "sglang_serve", 30000, "Qwen/Qwen3-0.6B")


def test_a_leaked_sglang_scheduler_is_an_orphan() -> None:
    d = discover([_p(400, 1, "sglang::scheduler_DP1_TP3", name="sglang::schedul")])
    assert d.servers == ()
    (o,) = d.orphans
    assert (o.role, o.rank, dict(o.ranks)) == ("worker", 3, {"dp": 1, "tp": 3})


def test_engine_field_from_process_else_metrics() -> None:
    v = SimpleNamespace(metrics=SimpleNamespace(engine_kind="sglang"))
    assert server_engine(v, SimpleNamespace(engine="vllm")) == "vllm"  # type: ignore[arg-type]
    assert server_engine(v, None) == "sglang"  # type: ignore[arg-type]
    assert server_engine(SimpleNamespace(metrics=None), None) is None  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the startup log


def _track(name: str) -> PhaseTracker:
    tr = PhaseTracker(year=2026)
    for i, line in enumerate((SGL / name).read_text().splitlines(keepends=True)):
        tr.feed(line, 100.0 + i)
    return tr


def test_sglang_record_format_is_parsed() -> None:
    ev = parse_line("[2026-12-05 03:00:06 DP1 TP0] Memory pool end. avail mem=69.40 GB")
    assert (ev.kind, ev.proc, ev.stamp, ev.engine) == ("record", "DP1 TP0", (12, 5, 3, 0, 6), "sglang")
    assert ev.message == "Memory pool end. avail mem=69.40 GB"
    ev = parse_line('[2026-12-05 03:00:13] INFO:     127.0.0.1:1 - "POST /generate HTTP/1.1" 200 OK')
    assert (ev.kind, ev.level, ev.engine) == ("uvicorn", "INFO", "sglang")
    # vLLM's own lines are not taken for SGLang's
    assert parse_line("[W1130 02:00:00.1 socket.cpp:207] [c10d] x").engine is None
    assert parse_line("INFO 12-05 03:00:06 [core.py:1] x").engine is None


def test_sglang_start_goes_through_the_phases_to_ready_at_fired_up() -> None:
    tr = _track("startup-0.5.17-handmade.log")
    snap = tr.snapshot()
    assert tr.state == "ready"
    views = {v.phase: v for v in snap.phases}
    for p in (Phase.ENGINE_INIT, Phase.WEIGHTS, Phase.KV_CACHE, Phase.CUDA_GRAPHS, Phase.API_SERVER, Phase.READY):
        assert p in views, p
    # ready at "The server is fired up and ready to roll!" (03:00:13), not at uvicorn's "Application startup
    # complete." (03:00:11) nor the warmup's access lines (03:00:12)
    assert views[Phase.READY].start - views[Phase.ENGINE_INIT].start == 13.0
    assert views[Phase.CUDA_GRAPHS].end - views[Phase.ENGINE_INIT].start == 10.0
    assert [(p.label, p.n, p.total) for p in views[Phase.CUDA_GRAPHS].progress] == [("batches", 4, 4)]
    f = snap.facts
    assert (f.engine, f.model, f.tensor_parallel_size, f.enforce_eager) == ("sglang", "/tmp/tiny", 1, False)
    assert (f.kv_cache_tokens, f.kv_cache_gib, f.max_model_len) == (2097152, 64.0, 32768)
    assert (f.weights_load_s, f.model_memory_gib) == (0.31, 0.09)
    assert (f.graph_capture_s, f.graph_memory_gib) == (2.51, 0.12)
    assert f.url == "http://127.0.0.1:30000"


def test_sglang_oom_at_start_is_a_memory_failure_with_sglang_flags() -> None:
    tr = _track("oom-0.5.17-handmade.log")
    assert tr.state == "failed"
    f = tr.snapshot().failure
    assert f is not None and f.kind == "kv_no_memory" and f.engine == "sglang" and f.get("frac") == "0.01"
    words = failure_words(f)
    assert "--mem-fraction-static (now 0.01)" in words.fix and "--tp-size" in words.fix
    assert "--gpu-memory-utilization" not in words.fix


def test_vllm_failure_keeps_vllm_flags() -> None:
    tr = PhaseTracker(year=2026)
    tr.feed("INFO 12-05 03:00:00 [core.py:1] Initializing a V1 LLM engine (v0.26.0) with config: model='m'\n", 1.0)
    tr.feed("ERROR 12-05 03:00:05 [core.py:2] ValueError: No available memory for the cache blocks. x\n", 2.0)
    f = tr.snapshot().failure
    assert f is not None and f.kind == "kv_no_memory" and f.engine is None
    assert "--gpu-memory-utilization" in failure_words(f).fix


def test_sglang_lines_do_not_move_a_vllm_start() -> None:
    """SGLang's rows read only SGLang's log: a vLLM log quoting "Load weight begin" stays where it is."""
    tr = PhaseTracker(year=2026)
    tr.feed("INFO 12-05 03:00:00 [core.py:1] Initializing a V1 LLM engine (v0.26.0) with config: model='m'\n", 1.0)
    tr.feed("INFO 12-05 03:00:01 [x.py:1] Load weight begin. avail mem=1.00 GB\n", 2.0)
    assert tr.current is Phase.ENGINE_INIT


# --------------------------------------------------------------------------- OOM words and the rules


def test_runtime_and_startup_oom_fixes_name_the_engines_flags() -> None:
    th = Thresholds()
    for cls in ("spike", "serving", "fragmentation", "kv_pressure"):
        sgl = oom_alert(OomFinding(cls, "http://h:30000", 0.0, "CUDA out of memory", engine="sglang"), th)
        vll = oom_alert(OomFinding(cls, "http://h:8000", 0.0, "CUDA out of memory"), th)
        assert "--mem-fraction-static" in " ".join(sgl.fix) and "--gpu-memory-utilization" not in " ".join(sgl.fix)
        assert "--gpu-memory-utilization" in " ".join(vll.fix)
    st = oom_alert(OomFinding("startup", "http://h:30000", 0.0, "x", phase=Phase.CUDA_GRAPHS, engine="sglang"), th)
    text = " ".join(st.fix)
    assert "--disable-cuda-graph" in text and "--context-length" in text and "--enforce-eager" not in text


def test_every_engine_names_every_role() -> None:
    roles = set(ENGINE_FLAGS["vllm"])
    assert all(set(fl) == roles for fl in ENGINE_FLAGS.values())
    assert flags_of(None) == flags_of("vllm") == flags_of("unknown-engine")


def test_rule_modules_name_no_sglang() -> None:
    """SGLang's names live in tables (vtop/core/engines.py, the phase patterns, discovery, metrics_text)."""
    words = re.compile(r"sglang|mem-fraction-static|max-running-requests|chunked-prefill-size|disable-cuda-graph",
                       re.IGNORECASE)
    hits = [f"{p.name}:{i}" for p in sorted((ROOT / "vtop" / "core" / "rules").glob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if words.search(line)]
    assert hits == []


def test_a_stalled_sglang_capture_is_hinted_in_sglangs_flags() -> None:
    tr = PhaseTracker(year=2026)
    lines = (SGL / "startup-0.5.17-handmade.log").read_text().splitlines(keepends=True)
    upto = next(i for i, ln in enumerate(lines) if "Capturing batches" in ln)  # the first frame, 1/4
    for i, line in enumerate(lines[: upto + 1]):
        tr.feed(line, 100.0 + i)
    st = tr.stalled(100.0 + upto + 700.0)
    assert st is not None and st.phase is Phase.CUDA_GRAPHS
    assert "--disable-cuda-graph" in st.hint and "--enforce-eager" not in st.hint
    q = tr.quiet(100.0 + upto + 30.0)
    assert q is not None and q.progressing and "--disable-cuda-graph" in q.hint


# --------------------------------------------------------------------------- --once --json


def test_once_json_says_the_engine_and_reads_sglangs_numbers(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A stand-in HTTP server (tests/helpers/metrics_server.py) answering /metrics with the hand-made SGLang
    payload: the report's server says engine sglang, with running, waiting and KV from SGLang's families."""
    import json

    import jsonschema

    from tests.helpers.metrics_server import MetricsServer
    from vtop.cli import main

    monkeypatch.setenv("HOME", "/nonexistent")
    monkeypatch.setenv("XDG_CONFIG_HOME", "/nonexistent")
    for k in ("VTOP_INTERVAL", "VTOP_NO_GPU", "VTOP_SIMULATE_GPUS", "VTOP_URLS", "VTOP_LOG"):
        monkeypatch.delenv(k, raising=False)
    schema = json.loads((ROOT / "vtop" / "schema" / "report-v2.schema.json").read_text())
    with MetricsServer([(SGL / "metrics-0.5.17-handmade.txt").read_text()], model="tiny") as srv:
        rc = main(["--once", "--json", "--interval", "30", "--simulate-gpus", "1", srv.url])
    out = capsys.readouterr().out
    rep = json.loads(out)
    jsonschema.validate(rep, schema)
    (s,) = rep["servers"]
    assert s["engine"] == "sglang"
    assert (s["running"], s["waiting"], s["kv_cache_pct"]) == (3, 7, 25.0)
    assert rc == rep["exit_code"]


def test_version_of_a_server_without_version_comes_from_server_info() -> None:
    """SGLang 0.5.17 serves no /version (404); its /server_info has "version" (entrypoints/http_server.py)."""
    import asyncio
    import json

    from vtop.clock import SystemClock
    from vtop.sources.http11 import HttpPool
    from vtop.sources.vllm import VllmScraper

    seen: list[str] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = (await reader.readline()).decode()
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        path = line.split()[1]
        seen.append(path)
        if path == "/server_info":
            code, body = 200, json.dumps({"version": "0.5.17", "tp_size": 1}).encode()
        elif path == "/health":
            code, body = 200, b""
        elif path.startswith("/metrics"):
            code, body = 200, (SGL / "metrics-0.5.17-handmade.txt").read_bytes()
        elif path == "/v1/models":
            code, body = 200, json.dumps({"data": [{"id": "tiny", "root": "/tmp/tiny"}]}).encode()
        else:
            code, body = 404, b'{"detail":"Not Found"}'
        writer.write(f"HTTP/1.1 {code} X\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        await writer.drain()
        writer.close()

    async def run() -> object:
        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        async with srv:
            pool = HttpPool()
            try:
                return await VllmScraper(f"http://127.0.0.1:{port}", client=pool, clock=SystemClock()).poll()
            finally:
                await pool.aclose()

    p = asyncio.run(run())
    assert getattr(p, "version", None) == "0.5.17"
    assert "/version" in seen and "/server_info" in seen
