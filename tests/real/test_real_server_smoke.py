"""Smoke tests of a real vLLM server (CPU build, tiny random Llama) and of the fixture itself.

Everything here talks to a real ``vllm serve`` on loopback through the
``real_vllm`` fixture (tests/real/conftest.py). Ordered so that the tests that
restart the server come last.
"""

from __future__ import annotations

import os
import time

import httpx
import psutil
import pytest

from vtop.sources.metrics_text import parse_vllm_metrics

pytestmark = pytest.mark.real


def _gone(pid: int | None) -> bool:
    if pid is None:
        return True
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _metrics(srv):  # type: ignore[no-untyped-def]
    return parse_vllm_metrics(srv.get("/metrics", timeout=30).text)


def test_real_vllm_answers_a_restricted_scrape_and_vtop_uses_it(real_vllm) -> None:  # type: ignore[no-untyped-def]
    """The real server restricts ``/metrics/`` (the prometheus_client app vLLM mounts; its
    ``/metrics`` handler ignores queries) to the names vtop asks (``?name[]=``): a fraction
    of the bytes, the same readings; vtop's scraper moves to it after a full scrape."""
    import asyncio

    from vtop.clock import SystemClock
    from vtop.sources.http11 import HttpPool
    from vtop.sources.vllm import FAST_METRICS_PATH, RESTRICTED_METRICS_PATH, VllmScraper, coverage

    full = real_vllm.get("/metrics").text
    assert len(real_vllm.get("/metrics?name[]=vllm:num_requests_running").text) > len(full) / 2  # ignored there
    part = real_vllm.get(RESTRICTED_METRICS_PATH).text
    assert "vllm:num_requests_running" in part and "vllm:time_to_first_token_seconds_bucket" in part
    # (the queue-time histogram is read since issue 29: a family vtop does not read stays out)
    from vtop.sources.vllm import RESTRICTED_NAMES

    assert not any(n.startswith("vllm:request_prefill_time_seconds") for n in RESTRICTED_NAMES)
    assert "vllm:request_prefill_time_seconds" in full and "vllm:request_prefill_time_seconds" not in part
    assert "python_gc" not in part  # read by nobody here
    assert len(part) < len(full) / 2
    assert coverage(parse_vllm_metrics(part)) == coverage(parse_vllm_metrics(full))
    # Between two reads of the histograms (every HIST_EVERY_S) a poll asks for the rest only.
    fast = real_vllm.get(FAST_METRICS_PATH).text
    assert "vllm:num_requests_running" in fast and "_bucket" not in fast and len(fast) < len(part) / 2
    assert (coverage(parse_vllm_metrics(fast), histograms=False)
            == coverage(parse_vllm_metrics(full), histograms=False) != frozenset())

    async def polls() -> tuple[list, VllmScraper]:  # type: ignore[type-arg]
        pool = HttpPool()
        sc = VllmScraper(real_vllm.url, client=pool, clock=SystemClock())
        try:
            return [await sc.poll() for _ in range(3)], sc
        finally:
            await pool.aclose()

    ps, sc = asyncio.run(polls())
    assert all(p.ok for p in ps), [p.message for p in ps]
    assert sc.restricted_ok is True and sc.restricted_polls == 2, [p.body_bytes for p in ps]
    assert ps[1].body_bytes < ps[0].body_bytes / 2
    assert ps[1].metrics is not None and ps[1].metrics.kv_cache_usage is not None
    # polls 2 and 3 came within HIST_EVERY_S of the full one: its histograms, carried over with their age
    assert ps[0].metrics is not None and ps[0].metrics.time_to_first_token_seconds is not None
    assert ps[2].metrics is not None and 0 < ps[2].metrics.histograms_age_s < sc.HIST_EVERY_S
    assert ps[2].metrics.time_to_first_token_seconds == ps[0].metrics.time_to_first_token_seconds


def test_health_is_200(real_vllm) -> None:  # type: ignore[no-untyped-def]
    r = real_vllm.get("/health")
    assert r.status_code == 200
    assert real_vllm.url == f"http://127.0.0.1:{real_vllm.port}"


def test_models_reports_the_model_and_its_context(real_vllm) -> None:  # type: ignore[no-untyped-def]
    data = real_vllm.get("/v1/models").json()["data"]
    assert len(data) == 1
    assert data[0]["id"] == str(real_vllm.model_dir) == real_vllm.model
    assert data[0]["owned_by"] == "vllm"
    assert data[0]["max_model_len"] == 2048 == real_vllm.max_model_len


def test_metrics_idle_has_vllm_families_and_vtop_reads_them(real_vllm) -> None:  # type: ignore[no-untyped-def]
    text = real_vllm.get("/metrics").text
    families = {ln.split()[2] for ln in text.splitlines() if ln.startswith("# HELP vllm:")}
    assert {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"} <= families
    assert len(families) > 30  # 72 on 0.32.0
    # Idle (a previous test's requests may still be settling in the gauges: allow a few scrapes).
    deadline = time.monotonic() + 20
    while True:
        m = parse_vllm_metrics(text)
        if (m.running, m.waiting) == (0, 0) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
        text = real_vllm.get("/metrics").text
    assert m.is_vllm
    assert m.problems == ()
    assert (m.running, m.waiting) == (0, 0)
    assert m.model_names == (real_vllm.model,)


def test_completion_max_tokens_8_finishes_on_length(real_vllm) -> None:  # type: ignore[no-untyped-def]
    # Greedy (temperature 0), so deterministic; the random model doesn't hit eos in 8 tokens.
    r = real_vllm.post(
        "/v1/completions",
        json={"model": real_vllm.model, "prompt": "Hello world, tell me about tokens", "max_tokens": 8,
              "temperature": 0},
    )
    assert r.status_code == 200, r.text
    js = r.json()
    assert js["choices"][0]["finish_reason"] == "length"
    assert js["usage"]["completion_tokens"] == 8
    assert js["usage"]["prompt_tokens"] > 0


def test_engine_core_is_a_child_of_the_api_server(real_vllm) -> None:  # type: ignore[no-untyped-def]
    engine = real_vllm.engine_pid()
    assert engine is not None
    p = psutil.Process(engine)
    assert p.ppid() == real_vllm.pid
    assert p.cmdline()[0].startswith("VLLM::EngineCore")
    workers = real_vllm.worker_pids()
    assert workers and all(psutil.Process(w).ppid() == engine for w in workers)
    # its own process group, the caller's session (see the recipe's NOTE)
    assert os.getpgid(real_vllm.pid) == real_vllm.pid
    assert os.getsid(real_vllm.pid) == os.getsid(0)


def test_load_helper_and_running_gauge_under_load(real_vllm) -> None:  # type: ignore[no-untyped-def]
    res = real_vllm.load(n=6, concurrency=3, max_tokens=8)
    assert (res.sent, res.ok, res.failed, res.not_sent) == (6, 6, 0, 0), res.errors
    assert res.finish_reasons == {"length": 6}
    assert res.completion_tokens == 48

    sres = real_vllm.load(n=3, concurrency=3, max_tokens=8, stream=True)
    assert (sres.ok, sres.finish_reasons["length"], sres.completion_tokens) == (3, 3, 24), sres.errors
    assert len(sres.ttft_s) == 3

    # vtop's parser sees requests running while a real load is on.
    fut = real_vllm.start_load(n=16, concurrency=8, max_tokens=512, time_limit_s=60)
    seen = 0.0
    deadline = time.monotonic() + 60
    while not fut.done() and time.monotonic() < deadline:
        m = _metrics(real_vllm)
        seen = max(seen, m.running or 0)
        if seen >= 1:
            break
        time.sleep(0.2)
    big = fut.result(timeout=120)
    assert big.ok == 16, big.errors
    assert seen >= 1
    after = _metrics(real_vllm)
    assert after.request_success_total.get("length", 0) >= 6 + 3 + 16


def test_sigstop_and_sigcont_engine(real_vllm) -> None:  # type: ignore[no-untyped-def]
    pids = real_vllm.sigstop_engine()
    try:
        assert pids == [real_vllm.engine_pid()]
        # a signal is delivered asynchronously: the state turns T when the kernel gets to it
        deadline = time.monotonic() + 10  # a hang guard, not a time bound
        while psutil.Process(pids[0]).status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
            time.sleep(0.05)
        assert psutil.Process(pids[0]).status() == psutil.STATUS_STOPPED
    finally:
        real_vllm.sigcont_engine()
    deadline = time.monotonic() + 10
    while psutil.Process(pids[0]).status() == psutil.STATUS_STOPPED and time.monotonic() < deadline:
        time.sleep(0.05)
    assert psutil.Process(pids[0]).status() != psutil.STATUS_STOPPED
    assert real_vllm.load(n=1, max_tokens=4).ok == 1


def test_stop_then_start_gives_a_new_server(real_vllm) -> None:  # type: ignore[no-untyped-def]
    old_pid, old_engine, old_log = real_vllm.pid, real_vllm.engine_pid(), real_vllm.log_path
    real_vllm.stop()
    assert not real_vllm.is_running()
    assert _gone(old_pid) and _gone(old_engine)
    with pytest.raises(httpx.ConnectError):
        real_vllm.get("/health", timeout=2)

    real_vllm.start()
    assert real_vllm.pid != old_pid
    assert real_vllm.log_path != old_log
    assert real_vllm.get("/health").status_code == 200
    engine = real_vllm.engine_pid()
    assert engine not in (None, old_engine)
    assert psutil.Process(engine).ppid() == real_vllm.pid


def test_fresh_start_can_be_watched_from_the_beginning(real_vllm_fresh_start) -> None:  # type: ignore[no-untyped-def]
    srv = real_vllm_fresh_start
    cur = srv.starts[-1]
    assert cur.pid == srv.pid
    if len(srv.starts) > 1:  # a server ran before (not when this test is the run's first start)
        prev = srv.starts[-2]
        assert cur.pid != prev.pid
        assert _gone(prev.pid)
    # Right after the launch nothing answers yet, and the log has barely begun.
    with pytest.raises(httpx.ConnectError):
        srv.get("/health", timeout=2)
    assert "Starting vLLM server" not in srv.log_text()
    took = srv.wait_health()
    assert 3 < took < 600
    log = srv.log_text()
    assert f"Starting vLLM server on http://127.0.0.1:{srv.port}" in log
    assert "(EngineCore pid=" in log
    assert srv.engine_pid() is not None
