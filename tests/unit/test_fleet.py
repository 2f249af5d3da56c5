"""The fleet from Prometheus (issue 27), over answers recorded from a real Prometheus 2.42
(tools/record_fleet_fixture.py: 4 replayed vLLM instances, 2 SGLang targets served from the payload
HAND-MADE from SGLang 0.5.17's source (issue 42: no real SGLang scraped yet) and 3 dcgm-exporter replays) and a
local server that fails the ways a Prometheus fails. No wall-clock assertions: the clock is the
recording's."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from tests.helpers.prom_replay import PromReplay, clock_at, load
from vtop.config import Config, ConfigError, build
from vtop.faces.headless_fleet import SCHEMA, exit_code, format_text, report_json
from vtop.monitor.fleet import Fleet
from vtop.sources import fleet as q
from vtop.sources.metrics_text import FINISH_ANY_REASON
from vtop.sources.prometheus import PromClient, PromError, check_prometheus_url

FLEET_SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "vtop" / "schema" / "fleet-v1.schema.json")
                          .read_text())
REC = load()


def answer(name: str) -> list[tuple[dict[str, str], float | None]]:
    res = REC["answers"][name]["answer"]["data"]["result"]
    return [(s["metric"], None if s["value"][1] == "NaN" else float(s["value"][1])) for s in res]


def test_the_recorded_answers_are_the_queries_vtop_sends_now() -> None:
    # a query changed in the code without re-recording would get "no recorded answer"
    assert REC["answers"]["vllm"]["query"] == q.vllm_query()
    assert REC["answers"]["rates"]["query"] == q.rates_query()
    assert REC["answers"]["up"]["query"] == q.up_query()
    assert REC["answers"]["gpu"]["query"] == q.gpu_query()
    assert REC["answers"]["vtop"]["query"] == q.vtop_query()


def test_one_row_per_instance_from_the_aggregated_answer() -> None:
    inst = q.parse_vllm(answer("vllm"))
    # gpu-c, gpu-e never answered; gpu-f and gpu-g serve SGLang's names
    assert sorted(k[1] for k in inst) == ["gpu-a:8000", "gpu-b:8000", "gpu-d:8000", "gpu-f:30000", "gpu-g:30000"]
    assert {k[1]: i.engine for k, i in inst.items()} == {"gpu-a:8000": "vllm", "gpu-b:8000": "vllm",
                                                         "gpu-d:8000": "vllm", "gpu-f:30000": "sglang",
                                                         "gpu-g:30000": "sglang"}
    a = inst[("vllm", "gpu-a:8000")]
    assert a.running == 1 and a.gen is not None and a.gen > 300_000  # the H200 runaway's counters
    assert a.finished.get("length") == 1700  # zero reasons are left out by the query
    b = inst[("vllm", "gpu-b:8000")]
    assert b.running == 8 and b.kv is not None and 0 < b.kv < 0.01
    up = q.parse_up(answer("up"))
    assert up[("vllm", "gpu-c:8000")] == 0 and up[("vllm", "gpu-a:8000")] == 1


def test_gpus_are_joined_by_host_with_the_dcgm_names() -> None:
    hosts = q.parse_gpus(answer("gpu"))
    assert hosts["gpu-a"].n == 8 and hosts["gpu-b"].n == 1
    assert hosts["gpu-d"].xid == {"5": 79.0}
    assert hosts["gpu-d"].sm == pytest.approx(45.0)  # DCGM_FI_PROF_SM_ACTIVE 0.45 as percent
    assert hosts["gpu-b"].mem_pct == pytest.approx(100 * 20_000 / 23_034, abs=0.1)
    assert "gpu-c" not in hosts
    assert q.host_of("gpu-a:8000") == "gpu-a" and q.host_of("[::1]:8000") == "::1"


async def _slow_answered(f: Fleet) -> None:
    """Wait for the slower part the last refresh sent (the next refresh collects its answer)."""
    task = f._slow_task
    if task is not None:
        await asyncio.gather(task[1], return_exceptions=True)


async def _fleet(pr: PromReplay, **cfg: object) -> Fleet:
    f = Fleet(Config(**cfg), PromClient(pr.url), clock=clock_at(REC))  # type: ignore[arg-type]
    await f.start()
    return f


async def test_the_same_rules_name_each_incident_on_its_row() -> None:
    with PromReplay() as pr:
        f = await _fleet(pr)
        await f.aclose()
        rows = {r.instance: r for r in f.rows.values()}
        assert f.error is None and f.backfilled
        # whatever the fleet's size: the first refresh asks everything (scrape times, vLLM in two halves,
        # up, vtop on the boxes, TTFT p50, p99, the GPUs in three parts)
        assert f.last_queries == 10
        assert [a.rule for a in rows["gpu-a:8000"].alerts] == ["runaway"]  # 2m10s with nothing finished
        assert rows["gpu-a:8000"].box == "ssh gpu-a vtop"
        assert [a.rule for a in rows["gpu-b:8000"].alerts] == ["engine_stall"]
        assert rows["gpu-c:8000"].state == "down" and [a.rule for a in rows["gpu-c:8000"].alerts] == ["server_down"]
        assert [a.rule for a in rows["gpu-d:8000"].alerts] == ["gpu_xid"]
        assert rows["gpu-d:8000"].state == "up" and rows["gpu-d:8000"].box is None
        # refused too, but vtop on that box exports its start: STARTING, in its phase, not DOWN
        e = rows["gpu-e:8000"]
        assert e.state == "starting" and not e.alerts, (e.state, e.alerts)
        assert e.on_box is not None and e.on_box.phase == "CUDA graph capture" and e.on_box.phase_s == 42
        assert "CUDA graph capture for 42s" in e.message
        assert e.on_box.alerts == [("startup_stall", "warning")]
        # worst first: the criticals, then the runaway's warning
        assert [a.severity for a in f.alerts] == ["critical", "critical", "critical", "critical", "warning"]
        assert [r.instance for r in f.sorted_rows()][-3:] == ["gpu-a:8000", "gpu-e:8000", "gpu-f:30000"]
        # SGLang's instances (issue 42), scraped by the same Prometheus: rows of engine sglang, judged by the
        # same rules. The busy one: its TTFT p50 worked out by Prometheus from SGLang's buckets (3 first tokens
        # a scrape, 2 within 0.1 s: 0.075 s), its tok/s by the tracker (1,800 generated a 2 s scrape), no
        # alert, its finishes SGLang's count without a reason (num_requests_total, 4 a 2 s scrape: 120 in the
        # last minute), read from the history too. The frozen one: an engine stall, none finished, and the
        # box's fix line names SGLang's log, not vLLM's.
        sf, sg = rows["gpu-f:30000"], rows["gpu-g:30000"]
        assert (sf.engine, sf.model, sf.kv_pct) == ("sglang", "tiny", 25.0) and not sf.alerts
        assert sf.ttft_p50 == pytest.approx(0.075)
        assert sf.finished is not None and set(sf.finished) == {FINISH_ANY_REASON}, sf.finished
        assert 110 <= sf.finished[FINISH_ANY_REASON] <= 130, sf.finished
        assert sg.finished == {}
        assert sf.gen_tps is not None and 800 < sf.gen_tps < 1000
        assert sg.engine == "sglang" and [a.rule for a in sg.alerts] == ["engine_stall"]
        assert sg.box == "ssh gpu-g vtop" and any("no SGLang log" in line for line in sg.alerts[0].fix)
        assert rows["gpu-b:8000"].engine == "vllm" and any("no vLLM log" in line for line in rows["gpu-b:8000"].alerts[0].fix)
        # the rates come from the trackers' windows over the counters
        assert rows["gpu-a:8000"].gen_tps is not None and 150 < rows["gpu-a:8000"].gen_tps < 600
        assert rows["gpu-b:8000"].gen_tps == 0
        # what only the box knows is said on the runaway
        run = next(a for a in f.alerts if a.rule == "runaway")
        assert any("ssh gpu-a vtop" in line for line in run.fix)


async def test_without_history_the_runaway_is_not_named_from_one_look() -> None:
    """The history is what makes the rule fire at once: a fleet that could not read it judges
    from now on (the same rule needs its 2 minutes)."""
    with PromReplay() as pr:
        f = Fleet(Config(), PromClient(pr.url), clock=clock_at(REC))
        await f.refresh()
        f.backfilled = True  # as if query_range had failed
        await f.refresh()
        await f.aclose()
    assert "runaway" not in {a.rule for a in f.alerts}
    assert "server_down" in {a.rule for a in f.alerts}  # up == 0 needs no history


async def test_json_report_follows_its_schema_and_exit_code() -> None:
    with PromReplay() as pr:
        f = await _fleet(pr)
        await f.aclose()
    rep = report_json(f)
    jsonschema.validate(rep, FLEET_SCHEMA)
    assert rep["schema"] == SCHEMA == "vtop.fleet/1"
    assert rep["exit_code"] == exit_code(f) == 2
    by = {r["instance"]: r for r in rep["instances"]}
    assert by["gpu-c:8000"]["running"] is None  # a gap, not a zero
    assert by["gpu-d:8000"]["gpus"]["xid"] == {"5": 79.0}
    text = format_text(f, doctor=True)
    assert "Runaway decode on gpu-a:8000" in text and "ssh gpu-a vtop" in text
    assert "What Prometheus cannot tell" in text


async def test_drill_in_has_the_trackers_history_and_the_hosts_gpus() -> None:
    with PromReplay() as pr:
        f = await _fleet(pr)
        d = await f.drill("vllm/gpu-a:8000")
        await f.aclose()
    assert d.error is None and d.view is not None
    assert len(d.view.series["gen_tps"]) >= 20  # the sparkline is full at once (27 steps of 5 s)
    assert sorted(d.gpus.tracks) == list(range(8))
    g0 = d.gpus.tracks[0].last
    assert g0 is not None and g0.util_gpu == 23 and g0.name == "NVIDIA H200" and g0.sm_active == pytest.approx(2.0)


@pytest.mark.parametrize("mode, kind, words", [
    ("down", "http", "TSDB not ready"),
    ("html", "garbage", "not the Prometheus API"),
])
async def test_a_failing_prometheus_is_said_in_words_and_rows_go_stale(mode: str, kind: str, words: str) -> None:
    with PromReplay() as pr:
        f = await _fleet(pr)
        assert f.rows["vllm/gpu-a:8000"].state == "up"
        pr.mode = mode
        clock = f.clock.base
        for _ in range(4):  # 20 s of failed refreshes
            clock.advance(5.0)  # type: ignore[attr-defined]
            await f.refresh()
        await f.aclose()
    assert f.error is not None and words in f.error and "Prometheus at 127.0.0.1" in f.error
    assert f.rows["vllm/gpu-a:8000"].state == "stale"  # old numbers kept, marked
    assert f.rows["vllm/gpu-a:8000"].running == 1
    assert exit_code(f) == 3


async def test_a_hung_prometheus_is_cut_by_the_deadline() -> None:
    with PromReplay(mode="hang") as pr:
        c = PromClient(pr.url, timeout_s=0.3)
        with pytest.raises(PromError) as e:
            await c.query("up")
        await c.aclose()
    assert e.value.kind == "timeout" and "did not answer within 0.3 s" in e.value.message


async def test_bearer_token_is_sent_and_refusal_explained() -> None:
    with PromReplay(token="s3cret") as pr:
        ok = PromClient(pr.url, token="s3cret")
        await ok.query(q.up_query())
        await ok.aclose()
        bad = PromClient(pr.url, token="wrong")
        with pytest.raises(PromError) as e:
            await bad.query(q.up_query())
        await bad.aclose()
        basic = PromClient(pr.url, user="me", password="pw")
        with pytest.raises(PromError):
            await basic.query(q.up_query())
        await basic.aclose()
    assert pr.auth_seen[0] == "Bearer s3cret"
    assert pr.auth_seen[-1] == "Basic bWU6cHc="  # me:pw
    assert e.value.kind == "auth" and "VTOP_PROMETHEUS_TOKEN" in e.value.message
    assert "s3cret" not in repr(ok) and "wrong" not in e.value.message


async def test_a_bad_query_gets_prometheus_own_words() -> None:
    with PromReplay() as pr:
        c = PromClient(pr.url)
        with pytest.raises(PromError) as e:
            await c.query("sum(")
        await c.aclose()
    assert e.value.kind == "query" and "bad_data" in e.value.message


def test_vtop_export_joins_by_host_and_port() -> None:
    vec = [({"vtop_m": "phase", "instance": "gpu-7:9464", "server": "http://127.0.0.1:8001", "phase": "weights"}, 1.0),
           ({"vtop_m": "oldest", "instance": "gpu-7:9464", "server": "http://localhost:8001"}, 130.0),
           ({"vtop_m": "alert", "instance": "gpu-7:9464", "subject": "gpu0", "rule": "sm_idle", "severity": "warning"},
            1.0)]
    got = q.parse_vtop(vec)
    assert got[("gpu-7", "8001")].phase == "weights" and got[("gpu-7", "8001")].oldest_s == 130
    assert got[("gpu-7", "*")].alerts == [("sm_idle", "warning")]


def test_credentials_come_from_config_or_env_never_the_url() -> None:
    with pytest.raises(ValueError, match="visible to every user"):
        check_prometheus_url("http://me:pw@prom:9090")
    assert check_prometheus_url("prom:9090/") == "http://prom:9090"
    cfg = build({}, env={"VTOP_PROMETHEUS_URL": "https://prom.example:9090", "VTOP_PROMETHEUS_TOKEN": "t0k"},
                config_file=None)
    assert cfg.prometheus_url == "https://prom.example:9090" and cfg.prometheus_token == "t0k"
    assert "t0k" not in repr(cfg)
    with pytest.raises(ConfigError):
        build({}, env={"VTOP_FLEET_INTERVAL": "0.2"})


async def test_tls_is_verified_by_default() -> None:
    """An https:// Prometheus with a certificate nobody signed is refused, in words."""
    import shutil
    import ssl
    import tempfile
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    if shutil.which("openssl") is None:
        pytest.skip("needs openssl to make a self-signed certificate")
    with tempfile.TemporaryDirectory() as d:
        cf, kf = Path(d) / "c.pem", Path(d) / "k.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(kf), "-out",
                        str(cf), "-days", "1", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)

        class H(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.send_response(200)
                self.end_headers()

            def log_message(self, *a: object) -> None:
                pass

        srv = HTTPServer(("127.0.0.1", 0), H)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cf, kf)
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        try:
            c = PromClient(f"https://127.0.0.1:{srv.server_address[1]}", timeout_s=3)
            with pytest.raises(PromError) as e:
                await c.query("up")
            await c.aclose()
        finally:
            srv.shutdown()
    assert "TLS" in e.value.message and "CERTIFICATE_VERIFY_FAILED" in e.value.message


def test_fleet_headless_never_imports_textual() -> None:
    code = ("import sys, vtop.faces.headless_fleet, vtop.monitor.fleet; "
            "sys.exit(1 if [m for m in sys.modules if m.startswith(('textual', 'rich'))] else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_once_json_over_a_recorded_prometheus_end_to_end() -> None:
    """``vtop --once --json --prometheus URL`` as a script runs it (the answers' samples are old for
    the wall clock: every row reads stale, which is what a Prometheus that stopped scraping shows)."""
    with PromReplay() as pr:
        r = subprocess.run([sys.executable, "-m", "vtop", "--once", "--json", "--prometheus", pr.url],
                           capture_output=True, text=True, timeout=120)
    rep = json.loads(r.stdout)
    jsonschema.validate(rep, FLEET_SCHEMA)
    assert r.returncode == rep["exit_code"] == 2
    assert {i["instance"]: i["engine"] for i in rep["instances"]} == {
        "gpu-a:8000": "vllm", "gpu-b:8000": "vllm", "gpu-c:8000": None, "gpu-d:8000": "vllm", "gpu-e:8000": None,
        "gpu-f:30000": "sglang", "gpu-g:30000": "sglang"}
    assert rep["queries_per_refresh"] == 10


def test_prometheus_flag_with_bad_url_is_one_line() -> None:
    r = subprocess.run([sys.executable, "-m", "vtop", "--once", "--prometheus", "ftp://x"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 3 and "only http:// and https://" in r.stderr and "Traceback" not in r.stderr


if __name__ == "__main__":  # pragma: no cover
    asyncio.run(test_the_same_rules_name_each_incident_on_its_row())


def test_counters_going_back_read_restarted_and_a_flat_scrape_is_no_stall() -> None:
    """Fed straight (no HTTP): an instance whose counters go back is RESTARTED (the tracker's rule,
    as on the box); the same sample answered again between two scrapes is not fed twice, so a busy
    server scraped every 30 s and refreshed every 5 s never looks stalled."""
    from vtop.clock import FakeClock

    clock = FakeClock(1000.0, 1_796_000_000.0)
    f = Fleet(Config(), PromClient("http://prom.invalid:9090"), clock=clock)
    f.backfilled = True
    key = ("vllm", "h1:8000")
    up = {key: 1.0}
    gen, ts = 0.0, clock.time()
    seen: set[str] = set()
    for i in range(40):  # 200 s at a 5 s refresh, a scrape every 30 s
        clock.advance(5.0)
        if i % 6 == 0:
            gen += 30 * 300.0
            ts = clock.time() - 1.0
        inst = q.Instance("vllm", "h1:8000", "m", running=4.0, waiting=0.0, kv=0.2, gen=gen, prompt=gen,
                          preempt=0.0, finished={"stop": float(i // 6)}, ts=ts)
        f._feed(clock.time(), clock.monotonic(), {key: inst}, up)
        f._rows(clock.time(), {key: inst}, {}, up)
        f._judge(clock.monotonic())
        seen |= {a.rule for a in f.rows["vllm/h1:8000"].alerts}
    row = f.rows["vllm/h1:8000"]
    assert row.state == "up" and not seen, seen
    assert row.gen_tps is not None and 250 < row.gen_tps < 350
    clock.advance(5.0)
    inst = q.Instance("vllm", "h1:8000", "m", running=0.0, waiting=0.0, kv=0.0, gen=10.0, prompt=10.0, preempt=0.0,
                      finished={}, ts=clock.time() - 0.5)
    f._feed(clock.time(), clock.monotonic(), {key: inst}, up)
    f._rows(clock.time(), {key: inst}, {}, up)
    f._judge(clock.monotonic())
    assert f.rows["vllm/h1:8000"].state == "restarted"



def test_the_fleets_sglang_names_come_from_the_one_names_table() -> None:
    """Every query the fleet sends asks for SGLang's names beside vLLM's, taken from the one table
    (``SGLANG_BESIDE_VLLM``): the fleet's module spells no ``sglang:`` name of its own."""
    import ast

    from vtop.sources.metrics_text import SGLANG_BESIDE_VLLM

    tree = ast.parse(Path(q.__file__).read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    spelled = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
               and id(n) not in docs and "sglang:" in n.value]
    assert not spelled, spelled
    beside = {sg for sg, v in SGLANG_BESIDE_VLLM.items() if v in q.VLLM_NAMES}
    assert {"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"} <= beside
    # the token counters: the per-step realtime_tokens_total by mode, never the finish-time ones (issue 42)
    assert not {"sglang:generation_tokens_total", "sglang:prompt_tokens_total"} & set(SGLANG_BESIDE_VLLM)
    half = q.vllm_queries()[0]
    assert 'sglang:realtime_tokens_total{mode="decode"}' in half
    assert 'sglang:realtime_tokens_total{mode=~"prefill_cache|prefill_compute"}' in half
    assert "sglang:generation_tokens_total" not in q.vllm_query()
    sent = " ".join((q.vllm_query(), q.ts_query(), q.up_query()))
    assert all(sg in sent for sg in beside), [sg for sg in beside if sg not in sent]
    assert "sglang:num_running_reqs" in q.ts_query() and "sglang:num_running_reqs" in q.up_query()
    assert "sglang:time_to_first_token_seconds_bucket" in q.rates_query()
    assert {q.ENGINE_OF[sg] for sg in beside} == {"sglang"}
    # SGLang's finished requests (no reason): num_requests_total, beside vLLM's request_success_total
    assert SGLANG_BESIDE_VLLM["sglang:num_requests_total"] == "vllm:request_success_total"
    assert "sglang:num_requests_total" in q.vllm_queries()[1] and q.FINISH_ENGINES == {"vllm", "sglang"}


def test_an_sglang_instance_is_a_row_with_its_engine() -> None:
    """SGLang's series in the aggregated answer make an instance of engine sglang (its ``__name__``
    says so), with running, queued, KV use and counters read as vLLM's are; its finished requests (no reason)
    under one key."""
    vec: list[tuple[dict[str, str], float | None]] = [
        ({"__name__": "sglang:num_running_reqs", "job": "llm", "instance": "g:30000", "model_name": "tiny"}, 3.0),
        ({"__name__": "sglang:num_queue_reqs", "job": "llm", "instance": "g:30000"}, 7.0),
        ({"job": "llm", "instance": "g:30000", "vtop_m": "gen"}, 6400.0),  # realtime_tokens_total{mode="decode"}
        ({"job": "llm", "instance": "g:30000", "vtop_m": "prompt"}, 1900.0),
        # the finish-time counter (were it answered) is not read
        ({"__name__": "sglang:generation_tokens_total", "job": "llm", "instance": "g:30000"}, 6000.0),
        ({"__name__": "sglang:num_retracted_requests_total", "job": "llm", "instance": "g:30000"}, 2.0),
        ({"__name__": "sglang:token_usage", "job": "llm", "instance": "g:30000", "vtop_m": "kv"}, 0.25),
        ({"__name__": "sglang:num_requests_total", "job": "llm", "instance": "g:30000"}, 12.0),
        ({"job": "llm", "instance": "g:30000", "vtop_m": "ts"}, 1_796_000_000.0),
        ({"__name__": "vllm:num_requests_running", "job": "llm", "instance": "v:8000", "model_name": "m"}, 1.0),
    ]
    inst = q.parse_vllm(vec)
    g, v = inst[("llm", "g:30000")], inst[("llm", "v:8000")]
    assert (g.engine, g.model_name, g.running, g.waiting, g.kv, g.gen, g.prompt, g.preempt) == \
        ("sglang", "tiny", 3.0, 7.0, 0.25, 6400.0, 1900.0, 2.0)
    assert g.finished == {FINISH_ANY_REASON: 12.0} and g.ts == 1_796_000_000.0
    assert v.engine == "vllm"


def test_the_same_rules_judge_an_sglang_instance_and_its_row_says_its_engine() -> None:
    """Fed straight (no HTTP), as the vLLM rows are: an SGLang instance whose counters stop with requests
    running is an engine stall on its row, the row and ``--json`` say engine sglang; no finish counted (SGLang's
    ``num_requests_total`` has no series before its first finish) is none finished, as on a vLLM row; a vLLM
    instance beside it keeps its own."""
    from vtop.clock import FakeClock

    clock = FakeClock(1000.0, 1_796_000_000.0)
    f = Fleet(Config(), PromClient("http://prom.invalid:9090"), clock=clock)
    f.backfilled = True
    ks, kv = ("llm", "g:30000"), ("llm", "v:8000")
    up = {ks: 1.0, kv: 1.0}
    for i in range(24):  # 120 s at a 5 s refresh, a scrape every 5 s; SGLang's counters stop after 30 s
        clock.advance(5.0)
        ts = clock.time() - 1.0
        sgen = 1000.0 * min(i, 6)
        insts = {ks: q.Instance("llm", "g:30000", "tiny", "sglang", running=3.0, waiting=7.0, kv=0.25, gen=sgen,
                                prompt=sgen / 4, preempt=0.0, ts=ts),
                 kv: q.Instance("llm", "v:8000", "m", "vllm", running=0.0, waiting=0.0, kv=0.0, gen=10.0, prompt=10.0,
                                preempt=0.0, finished={}, ts=ts)}
        f._feed(clock.time(), clock.monotonic(), insts, up)
        f._rows(clock.time(), insts, {}, up)
        f._judge(clock.monotonic())
    rows = {r.instance: r for r in f.rows.values()}
    g, v = rows["g:30000"], rows["v:8000"]
    assert g.engine == "sglang" and [a.rule for a in g.alerts] == ["engine_stall"]
    assert g.finished == {} and v.finished == {}  # none finished on either
    assert v.engine == "vllm" and not v.alerts
    view = f.monitor.servers[g.url].last_view
    assert view is not None and view.metrics is not None and view.metrics.engine_kind == "sglang"
    by = {r["instance"]: r for r in report_json(f)["instances"]}
    assert by["g:30000"]["engine"] == "sglang" and by["v:8000"]["engine"] == "vllm"
    assert by["g:30000"]["finished_last_min"] == {}
    jsonschema.validate(report_json(f), FLEET_SCHEMA)
    line = next(ln for ln in format_text(f).splitlines() if ln.startswith("g:30000"))
    assert line.split()[1:3] == ["UP", "SGLang"], line


@pytest.mark.parametrize("decode_per_scrape, stalls", [(125.0, False), (0.0, True)])
def test_a_long_sglang_request_is_no_engine_stall_on_its_row(decode_per_scrape: float, stalls: bool) -> None:
    """Issue 42: one SGLang request running for 2 minutes, its finish-time generation_tokens_total flat (no
    request finished) and its per-step realtime_tokens_total{mode="decode"} rising, as Prometheus answers the
    fleet's query: no engine stall on its row. The realtime counter flat while it runs: an engine stall."""
    from vtop.clock import FakeClock

    clock = FakeClock(1000.0, 1_796_000_000.0)
    f = Fleet(Config(), PromClient("http://prom.invalid:9090"), clock=clock)
    f.backfilled = True
    k = ("llm", "g:30000")
    for i in range(24):  # 120 s at a 5 s refresh, a scrape every 5 s
        clock.advance(5.0)
        lab = {"job": "llm", "instance": "g:30000"}
        # what Prometheus answers to the query vtop sends: each series only where the query asks for it
        sent = q.vllm_query()
        series: list[tuple[str, dict[str, str], float]] = [
            ("sglang:num_running_reqs", {"__name__": "sglang:num_running_reqs", **lab, "model_name": "tiny"}, 1.0),
            ("sglang:num_queue_reqs", {"__name__": "sglang:num_queue_reqs", **lab}, 0.0),
            ("sglang:generation_tokens_total", {"__name__": "sglang:generation_tokens_total", **lab}, 6000.0),
            ("sglang:prompt_tokens_total", {"__name__": "sglang:prompt_tokens_total", **lab}, 1500.0),
            ('sglang:realtime_tokens_total{mode="decode"}', {**lab, "vtop_m": "gen"}, 6400.0 + decode_per_scrape * i),
            ('sglang:realtime_tokens_total{mode=~"prefill', {**lab, "vtop_m": "prompt"}, 1900.0),
            ("sglang:num_running_reqs", {**lab, "vtop_m": "ts"}, clock.time() - 1.0),
        ]
        vec: list[tuple[dict[str, str], float | None]] = [(labels, v) for asked, labels, v in series if asked in sent]
        insts = q.parse_vllm(vec)
        up = {k: 1.0}
        f._feed(clock.time(), clock.monotonic(), insts, up)
        f._rows(clock.time(), insts, {}, up)
        f._judge(clock.monotonic())
    g = next(r for r in f.rows.values() if r.instance == "g:30000")
    assert g.engine == "sglang"
    assert ("engine_stall" in {a.rule for a in g.alerts}) == stalls, g.alerts


async def test_a_refresh_without_a_new_scrape_reuses_the_vllm_answer_and_asks_one_slow_part() -> None:
    """Prometheus answers the same samples until the next scrape: the whole vLLM query is asked only
    when an instance's newest scrape time moved; TTFT and the GPUs one part per refresh in turn. The
    table and the alerts stay what the full queries say (fails on the old code: 5 queries, vLLM each time)."""
    with PromReplay() as pr:
        f = await _fleet(pr)
        full = {k: (r.state, r.running, r.kv_pct, r.ttft_p50, r.ttft_p99, r.gpus) for k, r in f.rows.items()}
        alerts = [a.rule for a in f.alerts]
        asked = f.vllm_asked
        seen = []
        for _ in range(len(f.SLOW_PARTS)):
            n0 = len(pr.requests)
            await f.refresh()
            await _slow_answered(f)  # the part it sent reaches the server, maybe after the refresh
            seen.append({qq for _, qq in pr.requests[n0:]})
            assert f.last_queries == 4 and f.error is None and not f.partial
        assert f.vllm_asked == asked  # no new scrape in the recording: its last answer stands
        assert all(h not in s for s in seen for h in q.vllm_queries())
        # each slow part once, in turn
        slow = [f._slow_query(*p) for p in f.SLOW_PARTS]
        assert [next(x for x in s if x in slow) for s in seen] == slow
        assert {k: (r.state, r.running, r.kv_pct, r.ttft_p50, r.ttft_p99, r.gpus) for k, r in f.rows.items()} == full
        assert [a.rule for a in f.alerts] == alerts
        # an instance with a scrape vtop has not read: the whole vLLM query again
        k = next(iter(f._vllm_cache or {}))
        f._vllm_cache[k].ts = (f._vllm_cache[k].ts or 0) - 15  # type: ignore[index]
        n0 = len(pr.requests)
        await f.refresh()
        await f.aclose()
        assert set(q.vllm_queries()) <= {qq for _, qq in pr.requests[n0:]} and f.vllm_asked == asked + 1


async def test_a_slow_part_prometheus_is_still_on_holds_up_no_refresh() -> None:
    """The slower part (TTFT, a share of the GPUs) is sent once the vLLM answer is in and collected by
    the next refresh: a Prometheus still working on it delays neither the rows nor the rules (on the
    old code a refresh awaited it, and this test hangs until its deadline)."""
    with PromReplay() as pr:
        f = await _fleet(pr)
        part = f._slow_query(*f.SLOW_PARTS[f._slot % len(f.SLOW_PARTS)])
        pr.hold = {part}
        n1 = len(pr.requests)
        await asyncio.wait_for(f.refresh(), 10)  # sends the held part and returns
        assert f._slow_task is not None and not f._slow_task[1].done()
        for _ in range(1000):  # until it reaches the server (an event, not a duration)
            if part in {qq for _, qq in pr.requests[n1:]}:
                break
            await asyncio.sleep(0.01)
        assert part in {qq for _, qq in pr.requests[n1:]}
        n0 = len(pr.requests)
        await asyncio.wait_for(f.refresh(), 10)  # still held: not asked again, not awaited
        assert part not in {qq for _, qq in pr.requests[n0:]} and f.error is None
        pr.release.set()
        await _slow_answered(f)
        slot = f._slot
        await f.refresh()
        assert f._slot == slot + 1  # its answer was taken: the next part is asked
        await f.aclose()


async def test_a_due_scrape_skips_the_sample_time_check() -> None:
    """Once each instance's scrape interval is known, a refresh at or after the next scrape's time
    asks the vLLM halves straight away (the sample times come with them); before it, the cheap
    check first. An instance that is already overdue (down, slow) does not make every refresh ask."""
    with PromReplay() as pr:
        f = await _fleet(pr)
        cache = f._vllm_cache or {}
        old = {k: dataclasses.replace(v, ts=(v.ts or 0) - 10) for k, v in cache.items()}
        now = f.clock.base.time()
        f._note_scrapes(old, cache, now)
        assert f._due_at == min((v.ts or 0) + 10 for v in cache.values() if (v.ts or 0) + 10 > now)
        n0 = len(pr.requests)
        await f.refresh()  # before the next scrape is due: the check, and no vLLM query
        sent = {qq for _, qq in pr.requests[n0:]}
        assert q.ts_query() in sent and not set(q.vllm_queries()) & sent
        # past every instance's next scrape (the recording has none newer)
        f.clock.base.advance(max(v.ts or 0 for v in cache.values()) + 10 + f.INGEST_SLACK_S - now)  # type: ignore[attr-defined]
        n0 = len(pr.requests)
        await f.refresh()
        sent = {qq for _, qq in pr.requests[n0:]}
        assert set(q.vllm_queries()) <= sent and q.ts_query() not in sent
        # the recording has no newer scrape: every instance is overdue now, none is due
        assert f._due_at is None
        await f.aclose()


async def test_the_history_tells_each_instance_s_scrape_interval() -> None:
    """The history read at start gives each instance's scrape interval (the step between sample times
    it saw: Prometheus scraped every 2 s, read at 5 s steps, 4 or 6 s), so the first refresh already
    knows when the next scrape is due (on the old code both were known only after two live scrapes)."""
    with PromReplay() as pr:
        f = await _fleet(pr)
        await f.aclose()
    cache = f._vllm_cache or {}
    live = {k for k, v in cache.items() if v.ts is not None}
    assert live and set(f._scrape_gap) == live
    assert all(round(g, 3) in (4.0, 6.0) for g in f._scrape_gap.values()), f._scrape_gap
    now = f.clock.base.time()
    nxt = [(cache[k].ts or 0) + g for k, g in f._scrape_gap.items() if (cache[k].ts or 0) + g > now]
    assert f._due_at == (min(nxt) if nxt else None)


async def test_a_scrape_due_but_maybe_not_in_sends_the_halves_with_the_check() -> None:
    """Within ``INGEST_SLACK_S`` after a scrape is due, the halves go out with the sample-time check:
    a scrape in is read a round trip sooner (the halves once, not asked again after the check);
    none in, their answers are dropped (on the old code the halves wait for the check's answer: held
    here, they never reach Prometheus, and the wait for them fails)."""
    with PromReplay() as pr:
        f = await _fleet(pr)
        cache = f._vllm_cache or {}
        now = f.clock.base.time()
        f._due_at = now - f.INGEST_SLACK_S / 2
        asked, rows = f.vllm_asked, {k: (r.state, r.running) for k, r in f.rows.items()}
        n0 = len(pr.requests)
        await f.refresh()  # the recording has no newer scrape: the check says so, the halves are dropped
        sent = [qq for _, qq in pr.requests[n0:]]
        assert q.ts_query() in sent and f.vllm_asked == asked and f.error is None
        assert {k: (r.state, r.running) for k, r in f.rows.items()} == rows
        k = next(iter(cache))
        cache[k].ts = (cache[k].ts or 0) - 15  # an instance with a scrape vtop has not read
        f._due_at = now - f.INGEST_SLACK_S / 2
        # this round asks at its own time: the first round's dropped halves may still reach a handler
        # thread of the replay after this point (a busy box), and they are not this round's
        f.clock.base.advance(0.25)  # type: ignore[attr-defined]
        at = f"{round(f.clock.base.time(), 3):.3f}"

        def this_round() -> list[str]:
            return [qq for (_, qq), t in zip(list(pr.requests), list(pr.times)) if t == at]

        pr.hold = {q.ts_query()}
        task = asyncio.ensure_future(f.refresh())
        halves = q.vllm_queries(ts=False)  # the sample times come from the check, asked at the same moment
        for _ in range(1000):  # the halves reach Prometheus while the check's answer is held (an event)
            if set(halves) <= set(this_round()):
                break
            await asyncio.sleep(0.01)
        held = set(halves) <= set(this_round())
        pr.release.set()
        await asyncio.wait_for(task, 10)
        sent = this_round()
        await f.aclose()
        assert held and q.ts_query() in sent and all(sent.count(h) == 1 for h in halves)
        assert q.vllm_queries()[1] not in sent  # no half asked again after the check
        assert f.vllm_asked == asked + 1 and f.error is None
        got = f._vllm_cache or {}
        assert got.keys() == cache.keys() and all(v.ts is not None for v in got.values())
        assert {k: v.ts for k, v in got.items()} == q.parse_ts(answer("vllm"))


async def test_the_screen_process_keeps_the_collector_off_only_during_a_refresh() -> None:
    import gc

    with PromReplay() as pr:
        f = Fleet(Config(), PromClient(pr.url), clock=clock_at(REC), freeze_gc=True)
        seen: list[bool] = []
        real = f._feed_live

        async def spy(*a: object) -> None:
            seen.append(gc.isenabled())
            await real(*a)  # type: ignore[arg-type]

        f._feed_live = spy  # type: ignore[method-assign]
        try:
            await f.start()
            assert gc.get_freeze_count() > 0  # the history read is out of the collector's passes
            f._vllm_cache = None  # ask the vLLM answer again: it is fed
            await f.refresh()
            assert seen == [False] and gc.isenabled()
        finally:
            gc.unfreeze()
            await f.aclose()


@pytest.mark.parametrize("finished_per_scrape, runaway", [(45.0, False), (0.0, True)])
def test_a_saturated_sglang_row_whose_requests_finish_is_no_runaway(finished_per_scrape: float,
                                                                    runaway: bool) -> None:
    """Issue 42 (the fleet bench named one SGLang row a runaway in every mixed run): an SGLang server held at its
    cap (64 running, none queued, tokens flowing) for 4 minutes, scraped every 30 s, as Prometheus answers the
    fleet's query. Its requests finish (``sglang:num_requests_total`` rising, SGLang's count of finished requests
    without a reason): no runaway, its finishes on its row. They do not (the counter flat): a runaway, nothing
    finished for 2 min. A vLLM server beside it, saturated and finishing, is judged as before. On the old code the
    query asked no finish count of SGLang, a finish was only ``running`` falling, and the first case was a runaway."""
    from vtop.clock import FakeClock

    clock = FakeClock(1000.0, 1_796_000_000.0)
    f = Fleet(Config(), PromClient("http://prom.invalid:9090"), clock=clock)
    f.backfilled = True
    ks, kv = ("sglang", "g:30000"), ("vllm", "v:8000")
    up = {ks: 1.0, kv: 1.0}
    sent = q.vllm_query()
    scrape = -1
    for i in range(48):  # 240 s at a 5 s refresh, a scrape every 30 s
        clock.advance(5.0)
        if i % 6 == 0:
            scrape += 1
            ts = clock.time() - 1.0
        sg = {"job": "sglang", "instance": "g:30000"}
        vl = {"job": "vllm", "instance": "v:8000"}
        # what Prometheus answers to the query vtop sends: each series only where the query asks for it
        series: list[tuple[str, dict[str, str], float]] = [
            ("sglang:num_running_reqs", {"__name__": "sglang:num_running_reqs", **sg, "model_name": "tiny"}, 64.0),
            ("sglang:num_queue_reqs", {"__name__": "sglang:num_queue_reqs", **sg}, 0.0),
            ('sglang:realtime_tokens_total{mode="decode"}', {**sg, "vtop_m": "gen"}, 45_000.0 * (scrape + 1)),
            ('sglang:realtime_tokens_total{mode=~"prefill', {**sg, "vtop_m": "prompt"}, 9_000.0 * (scrape + 1)),
            ("sglang:num_requests_total", {"__name__": "sglang:num_requests_total", **sg},
             500.0 + finished_per_scrape * scrape),
            ("sglang:num_running_reqs", {**sg, "vtop_m": "ts"}, ts),
            ("vllm:num_requests_running", {"__name__": "vllm:num_requests_running", **vl, "model_name": "m"}, 64.0),
            ("vllm:num_requests_waiting", {"__name__": "vllm:num_requests_waiting", **vl}, 0.0),
            ("vllm:generation_tokens_total", {"__name__": "vllm:generation_tokens_total", **vl}, 45_000.0 * (scrape + 1)),
            ("vllm:prompt_tokens_total", {"__name__": "vllm:prompt_tokens_total", **vl}, 9_000.0 * (scrape + 1)),
            ("vllm:request_success_total", {"__name__": "vllm:request_success_total", **vl, "finished_reason": "stop"},
             500.0 + 45.0 * scrape),
            ("vllm:num_requests_running", {**vl, "vtop_m": "ts"}, ts),
        ]
        vec: list[tuple[dict[str, str], float | None]] = [(labels, v) for asked, labels, v in series if asked in sent]
        insts = q.parse_vllm(vec)
        f._feed(clock.time(), clock.monotonic(), insts, up)
        f._rows(clock.time(), insts, {}, up)
        f._judge(clock.monotonic())
    rows = {r.instance: r for r in f.rows.values()}
    g, v = rows["g:30000"], rows["v:8000"]
    assert g.engine == "sglang" and g.running == 64 and g.gen_tps is not None and g.gen_tps > 1000
    said = [a.title for a in g.alerts if a.rule == "runaway"]
    assert bool(said) == runaway, g.alerts
    if runaway:
        assert "nothing finished for" in said[0], said
        assert g.finished == {}  # counted, none in the last minute: "none", not a gap
    else:
        assert g.finished is not None and set(g.finished) == {FINISH_ANY_REASON} and g.finished[FINISH_ANY_REASON] > 0
    assert v.engine == "vllm" and not v.alerts and v.finished is not None and set(v.finished) == {"stop"}
    by = {r["instance"]: r for r in report_json(f)["instances"]}
    assert by["g:30000"]["finished_last_min"] == g.finished
    jsonschema.validate(report_json(f), FLEET_SCHEMA)
