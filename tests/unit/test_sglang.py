"""SGLang beside vLLM (issue 42): its /metrics names, its processes, its startup log and its OOM words.

The SGLang fixtures (tests/fixtures/sglang/) are HAND-MADE from SGLang 0.5.17's source (their README names the
files): these tests check vtop's tables against what that source says, not against a real SGLang server, which
has not run beside vtop yet.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from vtop.core.engines import ENGINE_FLAGS, flags_of
from vtop.core.phases.patterns import parse_line
from vtop.core.phases.tracker import PhaseTracker
from vtop.core.phases.types import Phase
from vtop.core.rules.alert import Thresholds
from vtop.core.rules.oom import OomFinding, oom_alert
from vtop.core.rules.startup import failure_words
from vtop.core.server import UNKNOWN, engine_kind
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
    # the token counters are the scheduler's per-step realtime_tokens_total by mode (prefill_compute +
    # prefill_cache, decode), not the finish-time prompt/generation_tokens_total (1500, 6000 in the payload)
    assert (m.prompt_tokens_total, m.generation_tokens_total) == (1900.0, 6400.0)
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
    # num_requests_total, is_streaming "false" + "true": every finished request, no reason (the e2e count)
    assert dict(m.request_success_total) == {metrics_text.FINISH_ANY_REASON: 12.0}


@pytest.mark.parametrize("use_cache", [True, False])
def test_sglang_without_realtime_tokens_has_no_token_counters(use_cache: bool) -> None:
    """A release without ``sglang:realtime_tokens_total`` (0.5.6 and older) serves only the finish-time
    token counters: vtop reads no token counter there (a gap), never those."""
    clear_line_cache()
    text = "\n".join(line for line in (SGL / "metrics-0.5.17-handmade.txt").read_text().splitlines()
                     if "realtime_tokens_total" not in line) + "\n"
    assert "sglang:generation_tokens_total{" in text
    m = parse_vllm_metrics(text, use_cache=use_cache)
    assert m.is_vllm and m.engine_kind == "sglang" and m.running == 3.0
    assert (m.prompt_tokens_total, m.generation_tokens_total) == (None, None)


def test_realtime_tokens_are_summed_over_other_labels_and_unknown_modes_ignored() -> None:
    """Two data-parallel schedulers' realtime counters add up; a mode vtop does not know is not read."""
    clear_line_cache()
    lab = 'engine_type="unified",model_name="tiny",tp_rank="0"'
    text = (f'sglang:num_running_reqs{{{lab},dp_rank="0"}} 1.0\n'
            f'sglang:num_running_reqs{{{lab},dp_rank="1"}} 1.0\n'
            f'sglang:realtime_tokens_total{{{lab},dp_rank="0",mode="decode"}} 10.0\n'
            f'sglang:realtime_tokens_total{{{lab},dp_rank="1",mode="decode"}} 32.0\n'
            f'sglang:realtime_tokens_total{{{lab},dp_rank="0",mode="prefill_compute"}} 5.0\n'
            f'sglang:realtime_tokens_total{{{lab},dp_rank="1",mode="prefill_cache"}} 7.0\n'
            f'sglang:realtime_tokens_total{{{lab},dp_rank="1",mode="speculative"}} 99.0\n')
    m = parse_vllm_metrics(text)
    assert (m.prompt_tokens_total, m.generation_tokens_total) == (12.0, 42.0)


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
    m = SimpleNamespace(engine_kind="sglang")
    assert engine_kind(SimpleNamespace(engine="vllm"), m) == "vllm"  # type: ignore[arg-type]
    assert engine_kind(None, m) == "sglang"  # type: ignore[arg-type]
    assert engine_kind(UNKNOWN, m) == "sglang"  # type: ignore[arg-type]
    assert engine_kind(None, None) is None


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


def _rule_strings() -> list[tuple[str, str]]:
    """Every string of the rule modules that is not a docstring (what an alert may say), as (file:line, text)."""
    out = []
    for p in sorted((ROOT / "vtop" / "core" / "rules").glob("*.py")):
        tree = ast.parse(p.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        out += [(f"{p.name}:{n.lineno}", n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant)
                and isinstance(n.value, str) and id(n) not in docs]
    return out


def test_rule_modules_take_every_engine_flag_from_the_table() -> None:
    """No rule module spells a flag the engines' table holds (vLLM's --max-num-seqs, --enable-log-requests,
    --kv-cache-memory-bytes...): each takes it from vtop/core/engines.py by the server's engine."""
    flags = {w for fl in ENGINE_FLAGS.values() for v in fl.values() for w in re.findall(r"--[a-z][a-z0-9-]+", v)}
    assert {"--max-num-seqs", "--enable-log-requests", "--kv-cache-memory-bytes", "--log-requests"} <= flags
    lit = re.compile(r"(?<![\w-])(" + "|".join(sorted(map(re.escape, flags), key=len, reverse=True)) + r")(?![\w-])")
    assert [f"{where}: {text}" for where, text in _rule_strings() if lit.search(text)] == []


def test_rule_modules_say_no_engines_name() -> None:
    """No rule's words spell an engine's name: "vLLM" or "SGLang" in an alert comes from the engines' table
    (``name``, and the engine-only advice: ``preempt_why``, ``logprobs_runner``, ``wedge_seen``...), so an SGLang
    server's alert never says vLLM. Docstrings and comments may."""
    assert [f"{where}: {text}" for where, text in _rule_strings() if re.search(r"vLLM|SGLang", text)] == []


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


# --------------------------------------------------------------------------- every rule's fix in the engine's words


def _both(make):  # type: ignore[no-untyped-def]
    """The alert's title, evidence and fix as one text, for vLLM's server and SGLang's."""
    out = []
    for engine in ("vllm", "sglang"):
        a = make(engine)
        out.append(" ".join((a.title, *a.evidence, *a.fix)))
    return out


def test_every_rules_fix_names_the_servers_engines_flags() -> None:
    from vtop.core.rules.flags import FlagFinding, risky_flags_alert
    from vtop.core.rules.gpu import SmIdleFinding, sm_idle_alert
    from vtop.core.rules.kv import KvFinding, kv_alert
    from vtop.core.rules.queue import WedgeFinding, wedge_alert
    from vtop.core.rules.runaway import _runaway_fixes

    th = Thresholds()
    u = "http://h:30000"
    cases = {
        "kv": lambda e: kv_alert(KvFinding(u, 0.0, 60.0, 99.0, 8, 30.0, 12.0, 2.0, 5.0, 64, engine=e), th),
        "sm_idle": lambda e: sm_idle_alert(SmIdleFinding(0, 0.0, 60.0, 90.0, 3.0, (), (u,), (u,), (), e), th),
        "wedge": lambda e: wedge_alert(WedgeFinding(u, 0.0, 60.0, 3.0, {}, 1.0, 1.0, 5.0, 200, None, e), th),
        "flags": lambda e: risky_flags_alert(u, [
            FlagFinding("seqs_over_kv", "info", max_num_seqs=256, max_concurrency=4.0, max_concurrency_len=4096,
                        engine=e),
            FlagFinding("mem_util_no_room", "warning", gpu=0, util=0.9, others_bytes=2**36, others=("x",),
                        mem_total=2**37, engine=e)], 0.0),
    }
    for name, make in cases.items():
        vll, sgl = _both(make)
        own = [w for w in ("--max-num-seqs", "--gpu-memory-utilization", "--enforce-eager", "--tensor-parallel-size")
               if w in vll]
        assert own, name
        assert not any(w in sgl for w in own), (name, sgl)
        assert any(w in sgl for w in ("--max-running-requests", "--mem-fraction-static", "--disable-cuda-graph")
                   ) or (name == "wedge" and "num_(running|queue)_reqs" in sgl), (name, sgl)
    sgl = " ".join(_runaway_fixes(32768, True, None, "sglang"))
    vll = " ".join(_runaway_fixes(32768, True, None, "vllm"))
    assert "--enable-log-requests" in vll and "--override-generation-config" in vll
    assert "--log-requests" in sgl and "--enable-log-requests" not in sgl and "--override-generation-config" not in sgl
    assert "SGLang has no server-side cap" in sgl


def test_startup_failure_words_name_the_engines_flags() -> None:
    from vtop.core.phases.types import Failure

    for kind, d in (("gpu_free_at_start", {"free": "38.77", "total": "139.8", "util": "0.5", "req": "69.9"}),
                    ("max_model_len", {"est": "4096", "len": "32768"}), ("model_len_too_long", {"len": "9", "pos": "8"})):
        det = tuple(d.items())
        words = {e: failure_words(Failure(kind, "x", None, None, 0.0, det, engine=e)) for e in ("vllm", "sglang")}
        v, s = (" ".join(words[e]) for e in ("vllm", "sglang"))
        assert "--max-model-len" in v and "--context-length" in s and "--max-model-len" not in s, kind


def test_a_second_sglang_launch_in_the_same_log_is_a_restart() -> None:
    """SGLang prints no version banner: its launch line ``server_args=ServerArgs(...)`` after a start that got
    anywhere (ready here, failed for memory next) begins a new start, the old one kept among the past starts."""
    start = (SGL / "startup-0.5.17-handmade.log").read_text().splitlines(keepends=True)
    oom = (SGL / "oom-0.5.17-handmade.log").read_text().splitlines(keepends=True)
    tr = PhaseTracker(year=2026)
    for i, line in enumerate(start):
        tr.feed(line, 100.0 + i)
    assert tr.snapshot().state == "ready" and tr.snapshot().restarts == 0
    for i, line in enumerate(oom):
        tr.feed(line, 200.0 + i)
    snap = tr.snapshot()
    assert snap.restarts == 1 and snap.state == "failed" and len(tr.past_starts) == 1
    assert tr.past_starts[0].state == "ready" and snap.facts.engine == "sglang"
    for i, line in enumerate(start[:4]):
        tr.feed(line, 300.0 + i)
    snap = tr.snapshot()
    assert snap.restarts == 2 and snap.state == "starting" and snap.failure is None


# --------------------------------------------------------------------------- the requests screen's note


def test_requests_note_names_the_engines_request_log_flag() -> None:
    """The ``r`` screen's note where the log has no request lines: SGLang's ``--log-requests`` for a SGLang
    server, vLLM's ``--enable-log-requests`` (0.10+) for vLLM's or an engine not known, from the engine table."""
    from vtop.model.requests import ServerRequests
    from vtop.ui.screens import RequestsScreen

    def note(engine: str | None) -> str:
        return RequestsScreen.note_text({"http://127.0.0.1:30000": ServerRequests(
            "http://127.0.0.1:30000", 0.0, count=1, request_logging=False, engine=engine)})

    sgl, vll, unknown = note("sglang"), note("vllm"), note(None)
    assert "SGLang logs them with --log-requests" in sgl and "--enable-log-requests" not in sgl
    assert "vLLM 0.10+ logs them with --enable-log-requests" in vll
    assert unknown == vll


def test_the_monitors_requests_answer_carries_the_servers_engine() -> None:
    """The one answer of requests in flight (what the ``r`` screen reads) says whose server it is: SGLang's
    by its /metrics families (``engine_kind``), vLLM's by its."""
    from vtop.clock import FakeClock
    from vtop.config import Config
    from vtop.model.metrics import VllmMetrics
    from vtop.model.server import ServerPoll
    from vtop.monitor.monitor import Monitor

    clock = FakeClock(start=1000.0)
    mon = Monitor(Config(urls=()), clock=clock, find_logs=False)
    urls = {"sglang": "http://127.0.0.1:30000", "vllm": "http://127.0.0.1:8000"}
    for i in range(3):
        for engine, url in urls.items():
            m = VllmMetrics(running=1.0, waiting=0.0, generation_tokens_total=10.0 * i, is_vllm=True,
                            engine_kind=engine)
            mon.apply_server(url, ServerPoll(clock.time(), clock.monotonic(), url, True, None, "", None, 0,
                                             metrics=m))
        mon.tick()
        clock.advance(1.0)
    assert {e: mon.in_flight[u].engine for e, u in urls.items()} == {"sglang": "sglang", "vllm": "vllm"}


# --------------------------------------------------------------------------- the scheduler's stats lines


def test_sglang_stats_lines_of_each_release_are_read() -> None:
    """SGLang's Decode and Prefill batch lines (0.5.17's ``metrics_reporter.py``; 0.5.6's
    ``scheduler_metrics_mixin.py``; older ``Decode batch.``): running, waiting, KV use of the fullest GPU pool,
    generation tok/s, and the prompt tokens a prefill batch took; the data-parallel rank from the prefix."""
    from vtop.core.loghistory import parse_stats

    dec = ("Decode batch, #running-req: 1, #token: 90, token usage: 0.35, cuda graph: True, "
           "gen throughput (token/s): 125.14, #queue-req: 3")
    assert parse_stats(dec, "sglang", "TP0") == ("-", 0.0, 125.14, 1, 3, 35.0, None)
    assert parse_stats(dec, "sglang", "DP1 TP0")[0] == "DP1"  # type: ignore[index]
    old = ("Decode batch. #running-req: 1, #token: 90, token usage: 0.00, cuda graph: True, "
           "gen throughput (token/s): 125.14, #queue-req: 0, ")
    assert parse_stats(old, "sglang", "TP0") == ("-", 0.0, 125.14, 1, 0, 0.0, None)
    pre = ("Prefill batch, #new-seq: 2, #new-token: 8192, #cached-token: 0, token usage: 0.13, #running-req: 1, "
           "#queue-req: 2, #pending-token: 1808, cuda graph: False, input throughput (token/s): 4096.00")
    assert parse_stats(pre, "sglang", "TP0") == ("-", 8192.0, 0.0, 1, 2, 13.0, None)
    pre56 = ("Prefill batch, #new-seq: 1, #new-token: 6, #cached-token: 0, token usage: 0.00, #running-req: 0, "
             "#queue-req: 0, ")
    assert parse_stats(pre56, "sglang", "TP0") == ("-", 6.0, 0.0, 0, 0, 0.0, None)
    # SWA hybrid: the fullest pool; HiSparse: the GPU's pool, not the host's; the forward-iteration tag
    swa = ("Decode batch [120], #running-req: 4, #full token: 9, full token usage: 0.10, #swa token: 4, "
           "swa token usage: 0.52, cuda graph: True, gen throughput (token/s): 1.00, #queue-req: 2")
    assert parse_stats(swa, "sglang", "TP0") == ("-", 0.0, 1.0, 4, 2, 52.0, None)
    hs = ("Decode batch, #running-req: 4, #gpu token: 9, gpu token usage: 0.10, #cpu token: 4, cpu token usage: 0.92, "
          "cuda graph: True, gen throughput (token/s): 1.00, #queue-req: 2")
    assert parse_stats(hs, "sglang", "TP0")[5] == 10.0  # type: ignore[index]
    # each engine's lines only where the line's format is that engine's
    assert parse_stats(dec) is None
    vllm = ("Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, "
            "Running: 3 reqs, Waiting: 1 reqs, GPU KV cache usage: 50.0%")
    assert parse_stats(vllm, "sglang", "TP0") is None and parse_stats(vllm) == ("000", 1.0, 2.0, 3, 1, 50.0, None)


def test_an_sglang_log_read_without_its_start_is_ready_by_its_batch_lines() -> None:
    """The hand-made serving excerpt (no start in it: vtop attached late): its Decode and Prefill batch lines
    say the server serves, as vLLM's stats line does; before, only vLLM's made that inference (and SGLang's
    access lines never do: its warmup sends some), so the start panel stayed "idle" on a serving SGLang."""
    tr = _track("serving-0.5.17-handmade.log")
    snap = tr.snapshot()
    assert (tr.state, snap.ready_source) == ("ready", "inferred")
    # a ready with no timeline: nothing of the start was seen
    assert all(v.start is None for v in snap.phases if v.phase is not Phase.READY)


def test_the_warmups_prefill_batch_is_no_ready_during_an_sglang_start() -> None:
    """SGLang sends itself a warmup request before it is ready: its Prefill batch line (hand-made startup
    excerpt, 03:00:12) comes a second before "The server is fired up and ready to roll!". While the start is
    seen, the ready is that line's, not the warmup's batch line (a warmup that hangs is a startup stall)."""
    lines = (SGL / "startup-0.5.17-handmade.log").read_text().splitlines(keepends=True)
    cut = next(i for i, ln in enumerate(lines) if "fired up" in ln)
    assert any("Prefill batch" in ln for ln in lines[:cut])  # the case: the warmup's batch line before ready
    tr = PhaseTracker(year=2026)
    for i, line in enumerate(lines[:cut]):
        tr.feed(line, 100.0 + i)
    assert tr.state == "starting" and tr.current is not Phase.READY
    tr.feed(lines[cut], 200.0)
    assert (tr.state, tr.snapshot().ready_source) == ("ready", "log")


def test_sglang_batch_lines_never_say_nothing_is_in_flight() -> None:
    """What the request tracker asks of a stats line (``running 0 clears the backlog``), read from each
    engine's table: vLLM's ``Running: 0 reqs, Waiting: 0 reqs`` says its series had nothing in flight; SGLang's
    lines of the hand-made serving excerpt never do: a Prefill batch with ``#running-req: 0, #queue-req: 0``
    has its ``#new-seq`` in flight (its #running-req counts the batch decoding before it), a Decode batch is
    logged for a batch of at least one request."""
    from vtop.core.loghistory import in_flight

    got = []
    for line in (SGL / "serving-0.5.17-handmade.log").read_text().splitlines():
        ev = parse_line(line)
        n = in_flight(ev.message, ev.engine, ev.proc)
        if n is not None:
            got.append((ev.message.split(",")[0], n))
    assert len(got) == 13 and all(series == "-" and busy >= 1 for (_, (series, busy)) in got)
    assert got[0] == ("Prefill batch", ("-", 1))  # #new-seq: 1, #running-req: 0, #queue-req: 0
    assert got[3] == ("Prefill batch", ("-", 5))  # #new-seq: 2, #running-req: 1, #queue-req: 2
    dp = parse_line("[2026-12-05 03:01:00 DP1 TP0] Decode batch, #running-req: 3, #token: 64, token usage: 0.00, "
                    "cuda graph: True, gen throughput (token/s): 38.10, #queue-req: 2")
    assert in_flight(dp.message, dp.engine, dp.proc) == ("DP1", 5)
    idle = ("Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, "
            "Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%")
    assert in_flight(idle) == ("000", 0) and in_flight(idle, "sglang") is None
    assert in_flight(dp.message) is None  # each engine's lines by its own table only


def _sglang_history(lines: list[str], wall: float, read_at: float | None = None) -> Any:
    from vtop.core.loghistory import LogHistory

    h = LogHistory(local_offset=lambda w: 0.0)
    for line in lines:
        h.feed(parse_line(line), wall, read_at)
    return h


def test_sglang_serving_log_goes_into_the_log_history() -> None:
    """The hand-made serving excerpt: one point a second, a second's Decode and Prefill lines combined (the
    prompt tokens of its prefill batches added, the generation rate and counts of its decode lines), and the
    same lines read again (the attach-time tail read, then the forward read) counted once."""
    import calendar

    lines = (SGL / "serving-0.5.17-handmade.log").read_text().splitlines()
    wall = float(calendar.timegm((2026, 12, 5, 3, 1, 10, 0, 0, 0)))
    h = _sglang_history(lines + lines, wall)
    v = h.snapshot(1000.0, wall)
    pts = {int(p.mono - 1000.0 + 10.0): p for p in v.stats}  # seconds after 03:01:00 (a stamp's middle)
    assert sorted(pts) == [0, 1, 2, 3, 4, 5, 6, 7, 8]
    p0, p2, p4 = pts[0], pts[2], pts[4]
    assert (p0.prompt_tps, p0.gen_tps, p0.running, p0.waiting) == (24.0, 38.1, 1, 0)
    # two chunks of a 10,000-token prefill in one second, no decode line in it
    assert (p2.prompt_tps, p2.gen_tps, p2.running, p2.waiting, p2.kv_pct) == (10000.0, 0.0, 1, 2, 15.0)
    # three decode lines in one second: the highest rate of them, the fullest pool
    assert (p4.prompt_tps, p4.gen_tps, p4.running, p4.kv_pct) == (0.0, 1711.9, 5, 17.0)
    assert [pts[s].running for s in (5, 6, 7, 8)] == [5, 4, 1, 1]
    # no request began after the prefill at 03:01:02 (no Prefill line since; decode lines with requests running)
    nn = v.no_new_request_since()
    assert nn is not None and int(nn[0] - 1000.0 + 10.0) == 2
    # SGLang logs nothing while its engine makes no step: the silence after a busy decode line is no
    # "no token since" by the log (that needs a line with zero throughput)
    assert v.quiet_since(1000.0 + 60.0) is None


def test_sglang_stats_lines_are_read_back_at_attach(tmp_path: Path) -> None:
    """The attach-time tail read looks for every engine's stats lines: an SGLang log whose forward read is far
    from its end has its last minute of Decode lines in the history at the first poll."""
    import time

    from vtop.clock import Clock
    from vtop.monitor.logwatch import LogWatch
    from vtop.sources.logtail import LogTailer

    now = time.time()

    def stamp(t: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))

    lines = [f"[{stamp(now - 600)}] server_args=ServerArgs(model_path='/tmp/tiny', port=30000)"]
    for i in range(3000):  # ~0.5 MB of access lines, then the stats of the last minute
        lines.append(f'[{stamp(now - 590 + i * 0.15)}] INFO:     127.0.0.1:{40000 + i % 999} - '
                     f'"POST /v1/chat/completions HTTP/1.1" 200 OK {"x" * 100}')
    for k in range(6):
        lines.append(f"[{stamp(now - 55 + 10 * k)} TP0] Decode batch, #running-req: 2, #token: 90, "
                     f"token usage: 0.{10 + k}, cuda graph: True, gen throughput (token/s): 50.00, #queue-req: 0")
    path = tmp_path / "sglang.log"
    path.write_text("\n".join(lines) + "\n")

    class Wall(Clock):
        def monotonic(self) -> float:
            return 1000.0

        def time(self) -> float:
            return now

    lw = LogWatch(LogTailer(path, max_read=64 * 1024), clock=Wall())
    v = lw.poll()
    assert v.tail.behind > 0  # the forward read is far from the end
    assert v.history is not None and [p.kv_pct for p in v.history.stats] == [10, 11, 12, 13, 14, 15]
    for _ in range(40):
        v = lw.poll()
    assert v.tail.behind == 0 and v.history is not None and len(v.history.stats) == 6  # read twice, kept once


def _sglang_scrapes(n: int, decode_per_s: float, running: int = 1) -> list[str]:
    """``n`` one-second scrapes of the hand-made SGLang payload with ``running`` requests running and none queued:
    the scheduler's ``realtime_tokens_total{mode="decode"}`` grows by ``decode_per_s`` a scrape, the finish-time
    ``prompt/generation_tokens_total`` stay where they are (no request finishes)."""
    base = (SGL / "metrics-0.5.17-handmade.txt").read_text()
    out = []
    for i in range(n):
        lines = []
        for line in base.splitlines():
            head, _, v = line.rpartition(" ")
            if line.startswith("sglang:num_running_reqs{"):
                line = f"{head} {running}.0"
            elif line.startswith("sglang:num_queue_reqs{"):
                line = f"{head} 0.0"
            elif line.startswith("sglang:realtime_tokens_total{") and 'mode="decode"' in line:
                line = f"{head} {float(v) + decode_per_s * i}"
            lines.append(line)
        out.append("\n".join(lines) + "\n")
    return out


@pytest.mark.parametrize("decode_per_s, stalls", [(25.0, False), (0.0, True)])
def test_a_long_sglang_request_is_no_engine_stall_but_flat_realtime_tokens_are(decode_per_s: float,
                                                                                 stalls: bool) -> None:
    """Issue 42: SGLang's prompt/generation_tokens_total grow only when a request finishes, so one request longer
    than the stall window left them flat while the engine decoded: read as vLLM's per-step counters, a false engine
    stall. Its per-step ``realtime_tokens_total`` rising is an engine making tokens (no stall, through the monitor);
    flat while a request runs is a stall."""
    from vtop.clock import FakeClock
    from vtop.config import Config
    from vtop.model.server import ServerPoll
    from vtop.monitor.monitor import Monitor

    clock = FakeClock(start=1000.0)
    mon = Monitor(Config(urls=()), clock=clock, find_logs=False)
    url = "http://127.0.0.1:30000"
    rules: set[str] = set()
    for text in _sglang_scrapes(90, decode_per_s):
        m = parse_vllm_metrics(text)
        assert m.engine_kind == "sglang" and m.running == 1.0
        mon.apply_server(url, ServerPoll(clock.time(), clock.monotonic(), url, True, None, "", None, 0, metrics=m))
        rules |= {a.rule for a in mon.tick() if a.target == url}
        clock.advance(1.0)
    assert ("engine_stall" in rules) == stalls, rules


def test_an_sglang_stall_says_to_dump_the_scheduler_and_a_vllm_one_the_enginecore() -> None:
    """The stall's fixes name the engine's own processes (the engine table): SGLang's ``sglang::scheduler`` and its
    TP ranks, no vLLM-only log line; vLLM's EngineCore and the shared-memory broadcast warning, as before."""
    from vtop.clock import FakeClock
    from vtop.config import Config
    from vtop.core.rules.alert import Thresholds
    from vtop.core.rules.stall import StallFinding, stall_alert
    from vtop.model.server import ServerPoll
    from vtop.monitor.monitor import Monitor

    clock = FakeClock(start=1000.0)
    mon = Monitor(Config(urls=()), clock=clock, find_logs=False)
    url = "http://127.0.0.1:30000"
    got = []
    for text in _sglang_scrapes(90, 0.0):  # realtime decode flat with a request running: a stall
        m = parse_vllm_metrics(text)
        mon.apply_server(url, ServerPoll(clock.time(), clock.monotonic(), url, True, None, "", None, 0, metrics=m))
        got += [a for a in mon.tick() if a.target == url and a.rule == "engine_stall"]
        clock.advance(1.0)
    assert got, "no engine stall on a flat SGLang"
    fix = " ".join(got[-1].fix)
    assert "sglang::scheduler" in fix and "every TP rank's scheduler" in fix, fix
    assert "EngineCore" not in fix and "shared memory broadcast" not in fix, fix
    f = StallFinding(url, 0.0, 30.0, False, 1.0, 0.0, 10.0, 10.0, None, 200, None, (), (), "")
    vfix = " ".join(stall_alert(f, Thresholds()).fix)
    assert "the EngineCore (the workers for TP>1)" in vfix and "shared memory broadcast" in vfix, vfix


def _saturated_sglang_scrapes(n: int, finished_per_s: float) -> list[str]:
    """``n`` one-second scrapes of the hand-made SGLang payload held at a cap of 64 running, none queued, decoding
    1,500 tokens a second; ``finished_per_s`` requests finish a second, each after 32 s (64 / 2 a second): counted
    in ``num_requests_total`` and the e2e histogram (its ``+Inf`` bucket, count and sum), as SGLang's
    ``observe_one_finished_request`` grows both."""
    base = (SGL / "metrics-0.5.17-handmade.txt").read_text()
    out = []
    for i in range(n):
        done = finished_per_s * i
        lines = []
        for line in base.splitlines():
            head, _, v = line.rpartition(" ")
            if line.startswith("sglang:num_running_reqs{"):
                line = f"{head} 64.0"
            elif line.startswith("sglang:num_queue_reqs{"):
                line = f"{head} 0.0"
            elif line.startswith("sglang:realtime_tokens_total{") and 'mode="decode"' in line:
                line = f"{head} {float(v) + 1500.0 * i}"
            elif 'is_streaming="false"' in line and (
                    line.startswith(("sglang:num_requests_total{", "sglang:e2e_request_latency_seconds_count{"))
                    or (line.startswith("sglang:e2e_request_latency_seconds_bucket{") and 'le="+Inf"' in line)):
                line = f"{head} {float(v) + done}"
            elif line.startswith("sglang:e2e_request_latency_seconds_sum{") and 'is_streaming="false"' in line:
                line = f"{head} {float(v) + 32.0 * done}"
            lines.append(line)
        out.append("\n".join(lines) + "\n")
    return out


@pytest.mark.parametrize("finished_per_s, runaway", [(2.0, False), (0.0, True)])
def test_a_saturated_sglang_server_whose_requests_finish_is_no_runaway(finished_per_s: float, runaway: bool) -> None:
    """Issue 42, on the box: an SGLang server held at its cap (64 running, none queued, tokens flowing) for 3
    minutes, through the monitor. Its requests finish (``sglang:num_requests_total`` rising): no runaway, and the
    card's finishes count them. They do not (the counter flat): a runaway. On the old code SGLang's finished
    requests were not read, a finish was only ``running`` falling, and the first case was a runaway."""
    from vtop.clock import FakeClock
    from vtop.config import Config
    from vtop.model.server import ServerPoll
    from vtop.monitor.monitor import Monitor

    clock = FakeClock(start=1000.0)
    mon = Monitor(Config(urls=()), clock=clock, find_logs=False)
    url = "http://127.0.0.1:30000"
    said: list[str] = []
    words: list[str] = []
    for text in _saturated_sglang_scrapes(180, finished_per_s):
        m = parse_vllm_metrics(text)
        assert m.engine_kind == "sglang" and m.running == 64.0
        mon.apply_server(url, ServerPoll(clock.time(), clock.monotonic(), url, True, None, "", None, 0, metrics=m))
        got_alerts = [a for a in mon.tick() if a.target == url and a.rule == "runaway"]
        said += [a.title for a in got_alerts]
        words += [w for a in got_alerts for w in (*a.evidence, *a.fix)]
        clock.advance(1.0)
    assert bool(said) == runaway, said
    # SGLang's words for the longest request: its context length, never vLLM's max_model_len
    assert not any("max_model_len" in w for w in words), words
    view = mon.servers[url].last_view
    assert view is not None and view.finished is not None
    got = sum(view.finished.values())
    assert got == pytest.approx(finished_per_s * view.window_s, abs=2 * finished_per_s), view.finished
